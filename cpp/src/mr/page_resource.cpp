#include "vramkit/mr/page_resource.hpp"

#include <algorithm>

namespace vramkit {

page_resource::page_resource(std::shared_ptr<page_device> pages) : pages_(std::move(pages)) {
  if (!pages_) throw invalid_argument("page_resource: no page device given");
}

page_resource::~page_resource() {
  for (auto& [va, a] : live_) {
    std::size_t g = pages_->granularity();
    pages_->unmap(va, a.handles.size());
    for (auto h : a.handles) pages_->destroy(h);
    pages_->unreserve(va, a.handles.size() * g);
  }
}

void* page_resource::do_allocate(std::size_t bytes, stream_t) {
  if (bytes == 0) return nullptr;
  std::size_t g = pages_->granularity();
  if (bytes > pages_->capacity())
    throw out_of_memory("vramkit: out of memory on device " + std::to_string(device()) + " (" + name() +
                            "): requested " + format_bytes(bytes) + " is larger than the device capacity " +
                            format_bytes(pages_->capacity()),
                        bytes);
  std::size_t n = (bytes + g - 1) / g;
  std::vector<page_handle> hs;
  hs.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    page_handle h = pages_->create();
    if (!h) {
      for (auto x : hs) pages_->destroy(x);
      std::lock_guard<std::mutex> lk(mu_);
      ++ooms_;
      throw out_of_memory("vramkit: out of memory on device " + std::to_string(device()) + " (" + name() +
                              "): requested " + format_bytes(bytes) + "; live " + format_bytes(live_bytes_) +
                              ", device capacity " + format_bytes(pages_->capacity()),
                          bytes);
    }
    hs.push_back(h);
  }
  std::uintptr_t va = 0;
  try {
    va = pages_->reserve(n * g);
    pages_->map(va, hs.data(), n);
  } catch (...) {
    if (va) pages_->unreserve(va, n * g);
    for (auto x : hs) pages_->destroy(x);
    throw;
  }
  std::lock_guard<std::mutex> lk(mu_);
  live_.emplace(va, allocation{bytes, std::move(hs)});
  live_bytes_ += bytes;
  reserved_ += n * g;
  peak_live_ = std::max(peak_live_, live_bytes_);
  peak_reserved_ = std::max(peak_reserved_, reserved_);
  ++allocs_;
  return reinterpret_cast<void*>(va);
}

free_status page_resource::try_deallocate(void* ptr, std::size_t bytes, stream_t) noexcept {
  if (!ptr) return free_status::ok;
  allocation a;
  auto va = reinterpret_cast<std::uintptr_t>(ptr);
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = live_.find(va);
    if (it == live_.end()) return free_status::not_owned;
    if (bytes != 0 && bytes != it->second.requested) return free_status::wrong_size;
    a = std::move(it->second);
    live_.erase(it);
    live_bytes_ -= a.requested;
    reserved_ -= a.handles.size() * pages_->granularity();
    ++frees_;
  }
  try {
    pages_->synchronize();
  } catch (...) {
    // The device failed: the work queued before this free will not run.
  }
  pages_->unmap(va, a.handles.size());
  for (auto h : a.handles) pages_->destroy(h);
  pages_->unreserve(va, a.handles.size() * pages_->granularity());
  return free_status::ok;
}

memory_state page_resource::state() const {
  std::lock_guard<std::mutex> lk(mu_);
  memory_state s;
  s.live_bytes = live_bytes_;
  s.live_count = live_.size();
  s.reserved_bytes = reserved_;
  s.cached_bytes = 0;
  s.capacity_bytes = pages_->capacity();
  s.upstream_allocs = allocs_;
  s.upstream_frees = frees_;
  s.oom_count = ooms_;
  s.peak_live_bytes = peak_live_;
  s.peak_reserved_bytes = peak_reserved_;
  return s;
}

void page_resource::reset_peaks() {
  std::lock_guard<std::mutex> lk(mu_);
  peak_live_ = live_bytes_;
  peak_reserved_ = reserved_;
}

std::size_t page_resource::allocation_size(const void* ptr) const noexcept {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = live_.find(reinterpret_cast<std::uintptr_t>(ptr));
  return it == live_.end() ? 0 : it->second.requested;
}

}  // namespace vramkit
