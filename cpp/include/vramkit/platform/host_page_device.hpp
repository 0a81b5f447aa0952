// A simulated device in host memory: address space reserved with mmap
// (PROT_NONE), pages mapped and unmapped with mmap(MAP_FIXED), a fixed
// capacity counted in pages. Nothing is touched unless the user writes to it.
#pragma once
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "vramkit/platform/page_device.hpp"

namespace vramkit {

class host_page_device final : public page_device {
 public:
  static constexpr std::size_t default_capacity = std::size_t{80} << 30;
  explicit host_page_device(std::size_t capacity = default_capacity,
                            std::size_t granularity = std::size_t{2} << 20, int device = 0);

  std::size_t granularity() const noexcept override { return granularity_; }
  std::size_t capacity() const noexcept override { return capacity_; }
  std::size_t created_bytes() const noexcept override { return created_.load() * granularity_; }
  std::uintptr_t reserve(std::size_t bytes) override;
  void unreserve(std::uintptr_t va, std::size_t bytes) noexcept override;
  page_handle create() override;
  void destroy(page_handle h) noexcept override;
  page_handle create_chunk(std::size_t pages) override;
  void map_chunk(std::uintptr_t va, page_handle h, std::size_t pages) override;
  bool copies() const noexcept override { return true; }
  void copy(std::uintptr_t dst, std::uintptr_t src, std::size_t bytes) override;
  void map(std::uintptr_t va, const page_handle* handles, std::size_t count) override;
  void unmap(std::uintptr_t va, std::size_t count) noexcept override;
  bool map_replaces() const noexcept override { return true; }  // mmap(MAP_FIXED) replaces
  int device() const noexcept override { return device_; }
  std::string name() const override { return "host"; }
  device_properties properties() const override;
  page_call_times call_times() const noexcept override { return clock_.read(); }

 private:
  page_call_clock clock_;
  std::size_t capacity_, granularity_;
  int device_;
  std::atomic<std::size_t> created_{0};
  std::mutex mu_;
  std::vector<page_handle> free_ids_;
  page_handle next_id_ = 1;
  // Chunks: ids from their own range, each with its size in pages.
  static constexpr page_handle chunk_bit = page_handle{1} << 62;
  std::unordered_map<page_handle, std::size_t> chunks_;
  page_handle next_chunk_ = chunk_bit | 1;
};

}  // namespace vramkit
