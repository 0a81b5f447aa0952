#include <algorithm>

#include "vramkit/mr/statistics_adaptor.hpp"

namespace vramkit {

void statistics_adaptor::counter::add(std::int64_t n) noexcept {
  std::int64_t now = current.fetch_add(n, std::memory_order_relaxed) + n;
  allocated.fetch_add(n, std::memory_order_relaxed);
  std::int64_t p = peak.load(std::memory_order_relaxed);
  while (now > p && !peak.compare_exchange_weak(p, now, std::memory_order_relaxed)) {
  }
}
void statistics_adaptor::counter::sub(std::int64_t n) noexcept {
  current.fetch_sub(n, std::memory_order_relaxed);
  freed.fetch_add(n, std::memory_order_relaxed);
}

statistics_adaptor::statistics_adaptor(std::shared_ptr<device_resource> upstream) : upstream_(std::move(upstream)) {
  if (!upstream_) throw invalid_argument("statistics_adaptor: no upstream resource given");
}

void* statistics_adaptor::do_allocate(std::size_t bytes, stream_t stream) {
  alloc_calls_.fetch_add(1, std::memory_order_relaxed);
  void* p;
  try {
    p = upstream_->allocate(bytes, stream);
  } catch (const out_of_memory&) {
    ooms_.fetch_add(1, std::memory_order_relaxed);
    throw;
  }
  if (p) {
    bytes_.add(static_cast<std::int64_t>(bytes));
    count_.add(1);
  }
  return p;
}

free_status statistics_adaptor::try_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept {
  if (!ptr) return free_status::ok;
  std::size_t n = upstream_->allocation_size(ptr);
  free_status s = upstream_->try_deallocate(ptr, bytes, stream);
  if (s != free_status::ok) {
    bad_frees_.fetch_add(1, std::memory_order_relaxed);
    return s;
  }
  free_calls_.fetch_add(1, std::memory_order_relaxed);
  if (n == 0) n = bytes;
  bytes_.sub(static_cast<std::int64_t>(n));
  count_.sub(1);
  return s;
}

void statistics_adaptor::reset_peaks() {
  bytes_.peak.store(bytes_.current.load());
  count_.peak.store(count_.current.load());
  upstream_->reset_peaks();
}

statistics statistics_adaptor::stats() const {
  statistics s;
  memory_state u = upstream_->state();
  s.allocated_bytes = bytes_.get();
  s.allocation_count = count_.get();
  s.reserved_bytes.current = static_cast<std::int64_t>(u.reserved_bytes);
  s.reserved_bytes.peak = static_cast<std::int64_t>(std::max(u.peak_reserved_bytes, u.reserved_bytes));
  s.reserved_bytes.allocated = static_cast<std::int64_t>(u.upstream_alloc_bytes);
  s.reserved_bytes.freed = static_cast<std::int64_t>(u.upstream_free_bytes);
  s.active_bytes.current = s.allocated_bytes.current + static_cast<std::int64_t>(u.pending_free_bytes);
  s.active_bytes.peak = std::max(s.active_bytes.current, s.allocated_bytes.peak);
  s.cached_bytes.current = static_cast<std::int64_t>(u.cached_bytes);
  s.cached_bytes.peak = std::max<std::int64_t>(0, s.reserved_bytes.peak - s.allocated_bytes.current);
  s.num_alloc_calls = alloc_calls_.load();
  s.num_free_calls = free_calls_.load();
  s.num_ooms = ooms_.load();
  s.num_bad_frees = bad_frees_.load();
  s.num_upstream_allocs = u.upstream_allocs;
  s.num_upstream_frees = u.upstream_frees;
  s.num_alloc_retries = u.retries;
  s.largest_free_bytes = u.largest_free_bytes;
  s.capacity_bytes = u.capacity_bytes;
  s.fragmentation = s.allocated_bytes.current > 0
                        ? static_cast<double>(s.reserved_bytes.current) / static_cast<double>(s.allocated_bytes.current)
                        : 0.0;
  s.peak_fragmentation = s.allocated_bytes.peak > 0 ? static_cast<double>(s.reserved_bytes.peak) /
                                                          static_cast<double>(s.allocated_bytes.peak)
                                                    : 0.0;
  return s;
}

// ---- limiting -----------------------------------------------------------------
limiting_adaptor::limiting_adaptor(std::shared_ptr<device_resource> upstream, std::size_t limit_bytes)
    : upstream_(std::move(upstream)), limit_(limit_bytes) {
  if (!upstream_) throw invalid_argument("limiting_adaptor: no upstream resource given");
  if (limit_bytes == 0) throw invalid_argument("limiting_adaptor: the limit must be positive");
}

std::shared_ptr<limiting_adaptor> limiting_adaptor::from_fraction(std::shared_ptr<device_resource> upstream,
                                                                  double fraction) {
  if (!(fraction > 0.0 && fraction <= 1.0))
    throw invalid_argument("memory fraction " + format_fixed(fraction, 6) + " must be in (0, 1]");
  if (!upstream) throw invalid_argument("limiting_adaptor: no upstream resource given");
  std::size_t cap = upstream->state().capacity_bytes;
  if (cap == 0) throw invalid_argument("limiting_adaptor: the upstream reports no capacity to take a fraction of");
  return std::make_shared<limiting_adaptor>(upstream, static_cast<std::size_t>(static_cast<double>(cap) * fraction));
}

void* limiting_adaptor::do_allocate(std::size_t bytes, stream_t stream) {
  if (bytes == 0) return nullptr;
  std::size_t cur = used_.load();
  do {
    if (cur + bytes > limit_ || cur + bytes < cur)
      throw out_of_memory("vramkit: out of memory on device " + std::to_string(device()) + ": requested " +
                              format_bytes(bytes) + " would pass the limit of " + format_bytes(limit_) + " (" +
                              format_bytes(cur) + " in use)",
                          bytes);
  } while (!used_.compare_exchange_weak(cur, cur + bytes));
  try {
    return upstream_->allocate(bytes, stream);
  } catch (...) {
    used_.fetch_sub(bytes);
    throw;
  }
}

free_status limiting_adaptor::try_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept {
  if (!ptr) return free_status::ok;
  std::size_t n = upstream_->allocation_size(ptr);
  free_status s = upstream_->try_deallocate(ptr, bytes, stream);
  if (s == free_status::ok) used_.fetch_sub(n ? n : bytes);
  return s;
}

memory_state limiting_adaptor::state() const {
  memory_state s = upstream_->state();
  s.capacity_bytes = std::min(s.capacity_bytes ? s.capacity_bytes : limit_, limit_);
  return s;
}

}  // namespace vramkit
