// The virtual-memory seam: physical pages and the address ranges they are
// mapped into. The CUDA driver (cuMem*) and the host simulation (mmap) both
// implement it, so the pool's page-granular algorithm runs unchanged on both.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "vramkit/error.hpp"
#include "vramkit/platform/device_properties.hpp"

namespace vramkit {

using page_handle = std::uint64_t;  // 0 is never a valid handle

class page_device {
 public:
  virtual ~page_device() = default;
  virtual std::size_t granularity() const noexcept = 0;
  virtual std::size_t capacity() const noexcept = 0;    // physical bytes in all
  virtual std::size_t created_bytes() const noexcept = 0;  // physical bytes held now
  // Free physical bytes on the device (for another process this may be less
  // than capacity - created).
  virtual std::size_t available() const noexcept { return capacity() - created_bytes(); }

  // Reserves `bytes` (a multiple of granularity) of address space, mapped to nothing.
  virtual std::uintptr_t reserve(std::size_t bytes) = 0;
  virtual void unreserve(std::uintptr_t va, std::size_t bytes) noexcept = 0;

  // Creates one page of physical memory. Returns 0 when the device has none
  // left; throws cuda_error on any other failure.
  virtual page_handle create() = 0;
  // Destroys a page or a chunk.
  virtual void destroy(page_handle h) noexcept = 0;

  // Chunks: one physical allocation of `pages` pages, mapped whole (the CUDA
  // driver maps a handle only from its start and only all of it). Fewer,
  // larger handles cost fewer driver calls per byte, and kernels streaming
  // through them see more memory per address translation. A chunk never
  // moves: it is mapped once and given back whole. create_chunk returns 0
  // when the device has no room or makes no chunks (the default).
  virtual page_handle create_chunk(std::size_t /*pages*/) { return 0; }
  // Maps the whole chunk h (of `pages` pages) at va; unmap(va, pages) undoes it.
  virtual void map_chunk(std::uintptr_t /*va*/, page_handle /*h*/, std::size_t /*pages*/) {
    throw invalid_argument("this page device makes no chunks");
  }

  // Maps `count` pages starting at va (page-aligned, inside a reservation).
  virtual void map(std::uintptr_t va, const page_handle* handles, std::size_t count) = 0;
  virtual void unmap(std::uintptr_t va, std::size_t count) noexcept = 0;
  // True when map() may be given addresses that still map other pages and
  // replaces those mappings in the same call (the CUDA driver cannot: an
  // address must be unmapped before it is mapped again).
  virtual bool map_replaces() const noexcept { return false; }

  // Makes the calling thread ready to call the others (a pool's helper
  // thread calls it first: a CUDA device makes its context current there).
  virtual void attach_thread() {}

  // Waits for all work on the device (the host has none).
  virtual void synchronize() {}

  virtual int device() const noexcept = 0;
  virtual std::string name() const = 0;
  virtual device_properties properties() const = 0;
};

}  // namespace vramkit
