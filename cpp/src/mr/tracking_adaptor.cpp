#include "vramkit/mr/tracking_adaptor.hpp"

#include <algorithm>
#include <chrono>

#include "../detail/flat_map.hpp"

namespace vramkit {

namespace {
std::int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

tracking_adaptor::tracking_adaptor(std::shared_ptr<device_resource> upstream, site_hook hook, std::size_t max_events)
    : upstream_(std::move(upstream)), hook_(hook), max_events_(max_events),
      live_(std::make_unique<detail::ptr_map<entry>>()) {
  if (!upstream_) throw invalid_argument("tracking_adaptor: no upstream resource given");
}

tracking_adaptor::~tracking_adaptor() = default;

void tracking_adaptor::set_site_hook(site_hook h) noexcept { hook_.store(h, std::memory_order_relaxed); }
site_hook tracking_adaptor::hook() const noexcept { return hook_.load(std::memory_order_relaxed); }

void tracking_adaptor::push_event(const tracking_event& e) {
  if (max_events_ == 0) return;
  if (ring_.size() < max_events_) {
    ring_.push_back(e);
    return;
  }
  ring_[ring_next_] = e;
  ring_next_ = (ring_next_ + 1) % max_events_;
  ++counts_.events_dropped;
}

void* tracking_adaptor::do_allocate(std::size_t bytes, stream_t stream) {
  // The hook runs outside the lock: it may take the GIL's state or its own lock.
  site_hook h = hook_.load(std::memory_order_relaxed);
  std::uint32_t site = h ? h() : 0;
  void* p = upstream_->allocate(bytes, stream);
  if (!p) return p;
  auto key = reinterpret_cast<std::uintptr_t>(p);
  std::int64_t t = now_ns();
  std::lock_guard<std::mutex> lk(mu_);
  entry e{bytes, stream, t, site, ++seq_};
  if (entry* old = live_->find(key)) {
    // Freed behind our back (straight through the upstream): the old record is stale.
    counts_.live_bytes -= old->size;
    --counts_.live_count;
    *old = e;
  } else {
    live_->insert(key, e);
  }
  ++counts_.live_count;
  counts_.live_bytes += bytes;
  ++counts_.allocs;
  push_event({tracking_event::alloc, site, key, bytes, stream, t});
  return p;
}

free_status tracking_adaptor::try_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept {
  if (!ptr) return free_status::ok;
  auto key = reinterpret_cast<std::uintptr_t>(ptr);
  // Take the record out before the upstream frees: once it has, another thread
  // may be handed the same pointer and insert its own record.
  entry e{};
  bool had = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (entry* f = live_->find(key)) {
      e = *f;
      had = true;
      live_->erase(key);
    }
  }
  free_status s = upstream_->try_deallocate(ptr, bytes, stream);
  std::int64_t t = now_ns();
  std::lock_guard<std::mutex> lk(mu_);
  if (!had) {
    if (s == free_status::ok) ++counts_.untracked_frees;
    return s;
  }
  if (s != free_status::ok) {
    // Refused: nothing changed upstream, so put the record back (unless the
    // pointer was re-tracked meanwhile, which a refused free makes impossible).
    if (!live_->find(key)) live_->insert(key, e);
    return s;
  }
  --counts_.live_count;
  counts_.live_bytes -= e.size;
  ++counts_.frees;
  push_event({tracking_event::free, e.site, key, e.size, e.stream, t});
  return s;
}

std::vector<tracked_allocation> tracking_adaptor::live_since(std::uint64_t after) const {
  std::vector<tracked_allocation> out;
  {
    std::lock_guard<std::mutex> lk(mu_);
    out.reserve(live_->size());
    live_->for_each([&](std::uintptr_t k, const entry& e) {
      if (e.seq > after) out.push_back({k, e.size, e.stream, e.time_ns, e.site, e.seq});
    });
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.seq < b.seq; });
  return out;
}

std::vector<tracked_allocation> tracking_adaptor::live() const { return live_since(0); }

bool tracking_adaptor::find(const void* ptr, tracked_allocation& out) const {
  auto key = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard<std::mutex> lk(mu_);
  const entry* e = live_->find(key);
  if (!e) return false;
  out = {key, e->size, e->stream, e->time_ns, e->site, e->seq};
  return true;
}

std::vector<tracking_event> tracking_adaptor::events() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<tracking_event> out;
  out.reserve(ring_.size());
  out.insert(out.end(), ring_.begin() + static_cast<std::ptrdiff_t>(ring_next_), ring_.end());
  out.insert(out.end(), ring_.begin(), ring_.begin() + static_cast<std::ptrdiff_t>(ring_next_));
  return out;
}

tracking_counts tracking_adaptor::counts() const {
  std::lock_guard<std::mutex> lk(mu_);
  return counts_;
}

std::uint64_t tracking_adaptor::mark() const {
  std::lock_guard<std::mutex> lk(mu_);
  return seq_;
}

void tracking_adaptor::reset() {
  auto fresh = std::make_unique<detail::ptr_map<entry>>();
  std::lock_guard<std::mutex> lk(mu_);
  live_.swap(fresh);
  ring_.clear();
  ring_next_ = 0;
  counts_ = {};
  // seq_ keeps counting so that marks taken before stay meaningful.
}

}  // namespace vramkit
