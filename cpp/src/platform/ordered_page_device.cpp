// Page calls on a worker thread, in stream order: see ordered_page_device.hpp.
#include "vramkit/platform/ordered_page_device.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "../detail/helper_thread.hpp"

namespace vramkit {

ordered_page_device::ordered_page_device(std::shared_ptr<page_device> inner, std::shared_ptr<stream_ops> streams,
                                         std::size_t low_memory, bool async_create)
    : inner_(std::move(inner)), streams_(std::move(streams)), async_create_(async_create) {
  if (!inner_) throw invalid_argument("ordered_page_device: no page device given");
  low_memory_ = low_memory ? low_memory : std::max<std::size_t>(std::size_t{1} << 30, inner_->capacity() / 16);
  word_ = inner_->make_wait_word();  // nullptr: the host waits for the worker
  if (word_) std::atomic_ref<std::uint32_t>(*word_).store(0, std::memory_order_seq_cst);
}

ordered_page_device::~ordered_page_device() {
  {
    std::unique_lock<std::mutex> l(mu_);
    stop_ = true;  // the worker makes what is queued, then ends
  }
  work_cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  // Nothing may be left: calls queued when no worker runs are made here.
  for (call& c : queue_) run(c);
  queue_.clear();
  // A stream may still hold a wait on the word behind work it has not reached:
  // the word is given back only where no wait was ever queued (64 bytes).
  if (word_ && ctr_.stream_waits == 0) inner_->free_wait_word(word_);
}

// A call the worker could not make: memory already handed out would be used
// unmapped (its stream's wait is for this call), so nothing the pool hands out
// is sound any more.
[[noreturn]] void ordered_page_device::fatal(const char* what, const std::string& why) noexcept {
  std::fprintf(stderr,
               "vramkit: async_map: %s failed on the worker thread (%s); memory already handed out depends "
               "on it; stopping (the pool without async_map reports such a failure to the allocation)\n",
               what, why.c_str());
  std::abort();
}

bool ordered_page_device::at_once() const noexcept { return low_ || worker_failed_; }

page_handle ordered_page_device::real(page_handle h) {
  if (!(h & own_bit)) return h;
  std::lock_guard<std::mutex> l(ids_mu_);
  auto it = real_.find(h);
  return it == real_.end() ? 0 : it->second;
}

void ordered_page_device::run(call& c) {
  switch (c.k) {
    case kind::create: {
      const page_handle r = inner_->create();
      if (!r) throw cuda_error("the device had no room for the page", 2);
      if (r & own_bit) throw cuda_error("the driver's handle uses the bit async_create marks its own with", 3);
      std::lock_guard<std::mutex> l(ids_mu_);
      real_[c.h] = r;
      break;
    }
    case kind::map: {
      for (auto& h : c.handles) h = real(h);
      inner_->map(c.va, c.handles.data(), c.count);
      break;
    }
    case kind::map_chunk:
      inner_->map_chunk(c.va, c.h, c.count);
      break;
    case kind::unmap:
      inner_->unmap(c.va, c.count);
      break;
    case kind::destroy: {
      const page_handle r = real(c.h);
      if (c.h & own_bit) {
        std::lock_guard<std::mutex> l(ids_mu_);
        real_.erase(c.h);
      }
      if (r) inner_->destroy(r);
      break;
    }
  }
}

void ordered_page_device::loop() {
  try {
    inner_->attach_thread();
  } catch (const std::exception& e) {
    fatal("making the device current", e.what());
  }
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    work_cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_, nothing left
    call c = std::move(queue_.front());
    queue_.pop_front();
    l.unlock();
    try {
      run(c);  // (unmap and destroy do not throw)
    } catch (const std::exception& e) {
      fatal(c.k == kind::create ? "creating a page" : "mapping pages", e.what());
    }
    // The number goes out after the call returned: a stream that waits for it
    // finds the page mapped.
    if (word_) std::atomic_ref<std::uint32_t>(*word_).store(static_cast<std::uint32_t>(c.seq), std::memory_order_seq_cst);
    l.lock();
    made_ = c.seq;
    if (c.k == kind::create) --creating_;
    done_cv_.notify_all();
  }
}

bool ordered_page_device::ensure_worker() {
  // With mu_ held by the caller.
  if (!worker_.joinable() && !worker_failed_) {
    try {
      worker_ = detail::start_helper("vramkit-map", [this] { loop(); });
    } catch (...) {
      worker_failed_ = true;
    }
  }
  return !worker_failed_;
}

void ordered_page_device::enqueue(call c) {
  // With mu_ held by the caller.
  if (!ensure_worker()) {  // no worker: made here, in order after nothing
    run(c);
    ++ctr_.calls_at_once;
    return;
  }
  const std::uint64_t seq = queued_ + 1;
  const bool needed = c.k == kind::create || c.k == kind::map || c.k == kind::map_chunk;
  c.seq = seq;
  queue_.push_back(std::move(c));  // (may throw: nothing counted yet)
  queued_ = seq;
  if (needed) needed_ = seq;  // what an allocation must wait for; unmaps and destroys need no wait
  ++ctr_.calls_queued;
  work_cv_.notify_one();
}

void ordered_page_device::wait_for(std::uint64_t want) {
  std::unique_lock<std::mutex> l(mu_);
  if (made_ >= want) return;
  const auto t0 = std::chrono::steady_clock::now();
  done_cv_.wait(l, [&] { return made_ >= want; });
  ++ctr_.host_waits;
  ctr_.host_wait_ns += static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
}

void ordered_page_device::drain() {
  std::uint64_t want;
  {
    std::lock_guard<std::mutex> l(mu_);
    want = queued_;
  }
  wait_for(want);
}

void ordered_page_device::order(stream_t s) {
  std::uint64_t want;
  {
    std::lock_guard<std::mutex> l(mu_);
    want = needed_;
    if (made_ >= want) return;  // the common case: every page handed out is mapped
  }
  // A stream under capture would put the wait into its graph: the host waits.
  if (word_ && !(streams_ && streams_->capturing(s)) &&
      inner_->queue_wait(s, word_, static_cast<std::uint32_t>(want))) {
    std::lock_guard<std::mutex> l(mu_);
    ++ctr_.stream_waits;
    return;
  }
  wait_for(want);
}

page_handle ordered_page_device::create() {
  if (async_create_) {
    note_room();
    std::lock_guard<std::mutex> l(mu_);
    if (!at_once() && ensure_worker()) {
      const page_handle id = own_bit | ++next_own_;
      enqueue(call{kind::create, 0, 0, id, {}, 0});
      ++ctr_.creates_queued;
      ++creating_;
      return id;
    }
  }
  page_handle h = inner_->create();
  if (!h) {  // destroys still queued may free the room
    drain();
    h = inner_->create();
  }
  if (h && async_create_ && (h & own_bit)) {  // it would read as one of this device's own
    inner_->destroy(h);
    throw cuda_error("vramkit: async_create: the driver's page handle uses the bit that marks this device's own", 3);
  }
  if (h && !async_create_) note_room();
  return h;
}

page_handle ordered_page_device::create_chunk(std::size_t pages) {
  page_handle h = inner_->create_chunk(pages);
  if (!h) {
    drain();
    h = inner_->create_chunk(pages);
  }
  if (h) note_room();
  return h;
}

// Every 16 pages created, whether the device is short of memory: then the
// calls are made at once, so that a mapping that fails for want of memory
// fails in the caller's call.
void ordered_page_device::note_room() {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (creates_++ % 16 != 0) return;
  }
  const std::size_t free = inner_->available();
  std::lock_guard<std::mutex> l(mu_);
  // Pages whose creation is queued take room the device does not show yet.
  low_ = free < low_memory_ + creating_ * inner_->granularity();
}

void ordered_page_device::map(std::uintptr_t va, const page_handle* handles, std::size_t count) {
  if (count == 0) return;
  std::unique_lock<std::mutex> l(mu_);
  if (at_once()) {
    l.unlock();
    drain();  // after the calls queued before it
    std::vector<page_handle> hs(handles, handles + count);
    for (auto& h : hs) h = real(h);
    inner_->map(va, hs.data(), count);
    std::lock_guard<std::mutex> g(mu_);
    ++ctr_.calls_at_once;
    return;
  }
  call c{kind::map, va, count, 0, std::vector<page_handle>(handles, handles + count), 0};
  enqueue(std::move(c));
}

void ordered_page_device::map_chunk(std::uintptr_t va, page_handle h, std::size_t pages) {
  std::unique_lock<std::mutex> l(mu_);
  if (at_once()) {
    l.unlock();
    drain();
    inner_->map_chunk(va, h, pages);
    std::lock_guard<std::mutex> g(mu_);
    ++ctr_.calls_at_once;
    return;
  }
  enqueue(call{kind::map_chunk, va, pages, h, {}, 0});
}

void ordered_page_device::unmap(std::uintptr_t va, std::size_t count) noexcept {
  if (count == 0) return;
  try {
    std::lock_guard<std::mutex> l(mu_);
    enqueue(call{kind::unmap, va, count, 0, {}, 0});
    return;
  } catch (...) {
  }
  // The queue could not grow: after what is queued, here.
  try {
    drain();
  } catch (...) {
  }
  inner_->unmap(va, count);
}

void ordered_page_device::destroy(page_handle h) noexcept {
  try {
    std::lock_guard<std::mutex> l(mu_);
    enqueue(call{kind::destroy, 0, 0, h, {}, 0});
    return;
  } catch (...) {
  }
  try {
    drain();
  } catch (...) {
  }
  const page_handle r = real(h);
  if (h & own_bit) {
    std::lock_guard<std::mutex> l(ids_mu_);
    real_.erase(h);
  }
  if (r) inner_->destroy(r);
}

void ordered_page_device::unreserve(std::uintptr_t va, std::size_t bytes) noexcept {
  try {
    drain();  // its unmaps first
  } catch (...) {
  }
  inner_->unreserve(va, bytes);
}

void ordered_page_device::synchronize() {
  drain();
  inner_->synchronize();
}

void ordered_page_device::copy(std::uintptr_t dst, std::uintptr_t src, std::size_t bytes) {
  drain();
  inner_->copy(dst, src, bytes);
}

ordered_page_device::counters ordered_page_device::read() const {
  std::lock_guard<std::mutex> l(mu_);
  return ctr_;
}

}  // namespace vramkit
