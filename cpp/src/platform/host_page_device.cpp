#include "vramkit/platform/host_page_device.hpp"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

namespace vramkit {

host_page_device::host_page_device(std::size_t capacity, std::size_t granularity, int device)
    : capacity_(capacity), granularity_(granularity), device_(device) {
  if (granularity == 0 || (granularity & (granularity - 1)) || granularity < 4096)
    throw invalid_argument("host device: page size " + std::to_string(granularity) +
                           " must be a power of two of at least 4096 bytes");
  if (capacity < granularity)
    throw invalid_argument("host device: capacity " + format_bytes(capacity) + " is below one page (" +
                           format_bytes(granularity) + ")");
  capacity_ = capacity / granularity * granularity;
}

std::uintptr_t host_page_device::reserve(std::size_t bytes) {
  if (bytes == 0 || bytes % granularity_)
    throw invalid_argument("host device: reservation of " + std::to_string(bytes) +
                           " bytes is not a positive multiple of the page size");
  // Over-reserve by one page so the range can start on a page boundary.
  std::size_t len = bytes + granularity_;
  void* p = ::mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    throw cuda_error("host device: cannot reserve " + format_bytes(bytes) + " of address space: " +
                         std::strerror(errno),
                     errno);
  auto a = reinterpret_cast<std::uintptr_t>(p);
  std::uintptr_t aligned = (a + granularity_ - 1) / granularity_ * granularity_;
  if (aligned > a) ::munmap(p, aligned - a);
  std::uintptr_t end = a + len, want_end = aligned + bytes;
  if (end > want_end) ::munmap(reinterpret_cast<void*>(want_end), end - want_end);
  return aligned;
}

void host_page_device::unreserve(std::uintptr_t va, std::size_t bytes) noexcept {
  ::munmap(reinterpret_cast<void*>(va), bytes);
}

page_handle host_page_device::create() {
  page_call_clock::scope t(clock_.create);
  std::lock_guard<std::mutex> lk(mu_);
  if ((created_.load() + 1) * granularity_ > capacity_) return 0;
  page_handle h;
  if (!free_ids_.empty()) {
    h = free_ids_.back();
    free_ids_.pop_back();
  } else {
    h = next_id_++;
  }
  created_.fetch_add(1);
  return h;
}

void host_page_device::destroy(page_handle h) noexcept {
  page_call_clock::scope t(clock_.destroy);
  std::lock_guard<std::mutex> lk(mu_);
  if (h & chunk_bit) {
    auto it = chunks_.find(h);
    if (it == chunks_.end()) return;
    created_.fetch_sub(it->second);
    chunks_.erase(it);
    return;
  }
  free_ids_.push_back(h);
  created_.fetch_sub(1);
}

page_handle host_page_device::create_chunk(std::size_t pages) {
  if (pages == 0) throw invalid_argument("host device: a chunk of 0 pages");
  page_call_clock::scope t(clock_.create);
  std::lock_guard<std::mutex> lk(mu_);
  if ((created_.load() + pages) * granularity_ > capacity_) return 0;
  page_handle h = next_chunk_++;
  chunks_.emplace(h, pages);
  created_.fetch_add(pages);
  return h;
}

void host_page_device::map_chunk(std::uintptr_t va, page_handle h, std::size_t pages) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = chunks_.find(h);
    if (it == chunks_.end() || it->second != pages)
      throw invalid_argument("host device: map_chunk of " + std::to_string(pages) +
                             " pages names no chunk of that size");
  }
  map(va, &h, pages);
}

void host_page_device::map(std::uintptr_t va, const page_handle*, std::size_t count) {
  // Anonymous pages stand for the physical ones: the pool never relies on a
  // page's contents surviving a move, only on the memory being there.
  page_call_clock::scope t(clock_.map);
  void* p = ::mmap(reinterpret_cast<void*>(va), count * granularity_, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    throw cuda_error(std::string("host device: map failed: ") + std::strerror(errno), errno);
}

void host_page_device::copy(std::uintptr_t dst, std::uintptr_t src, std::size_t bytes) {
  std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes);
}

void host_page_device::unmap(std::uintptr_t va, std::size_t count) noexcept {
  page_call_clock::scope t(clock_.unmap);
  ::mmap(reinterpret_cast<void*>(va), count * granularity_, PROT_NONE,
         MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
}

device_properties host_page_device::properties() const {
  // The simulated device mirrors an H100-class part so reports look familiar.
  device_properties p;
  p.name = "vramkit simulated device (host memory)";
  p.device = device_;
  p.simulated = true;
  p.global_memory_bytes = capacity_;
  p.constant_memory_bytes = 64 << 10;
  p.shared_memory_per_block_bytes = 48 << 10;
  p.shared_memory_per_sm_bytes = 228 << 10;
  p.l2_cache_bytes = 50 << 20;
  p.sm_count = 132;
  p.memory_bus_width_bits = 5120;
  p.memory_clock_khz = 2619000;
  p.compute_capability_major = 0;
  p.compute_capability_minor = 0;
  p.allocation_granularity = granularity_;
  return p;
}

}  // namespace vramkit
