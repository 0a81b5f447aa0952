// The virtual-memory seam: physical pages and the address ranges they are
// mapped into. The CUDA driver (cuMem*) and the host simulation (mmap) both
// implement it, so the pool's page-granular algorithm runs unchanged on both.
#pragma once
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "vramkit/error.hpp"
#include "vramkit/platform/device_properties.hpp"

namespace vramkit {

using page_handle = std::uint64_t;  // 0 is never a valid handle

// Wall time spent inside a page device's calls, in nanoseconds, on every
// thread that made them: creating pages and chunks, mapping them (with the
// access rights), unmapping, destroying.
struct page_call_times {
  std::uint64_t create_ns = 0, map_ns = 0, unmap_ns = 0, destroy_ns = 0;
};

// The counters a page device keeps for page_call_times, and a scope that adds
// its own duration to one of them.
struct page_call_clock {
  std::atomic<std::uint64_t> create{0}, map{0}, unmap{0}, destroy{0};
  page_call_times read() const noexcept {
    return {create.load(std::memory_order_relaxed), map.load(std::memory_order_relaxed),
            unmap.load(std::memory_order_relaxed), destroy.load(std::memory_order_relaxed)};
  }
  class scope {
   public:
    explicit scope(std::atomic<std::uint64_t>& to) noexcept : to_(to), t0_(std::chrono::steady_clock::now()) {}
    ~scope() {
      const auto d = std::chrono::steady_clock::now() - t0_;
      to_.fetch_add(static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count()),
                    std::memory_order_relaxed);
    }
    scope(const scope&) = delete;
    scope& operator=(const scope&) = delete;

   private:
    std::atomic<std::uint64_t>& to_;
    std::chrono::steady_clock::time_point t0_;
  };
};

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

  // Copies `bytes` from src to dst (both mapped here) and returns when they
  // are there. copies() says whether the device can (the pool then splits
  // chunks into single pages: pool_options::split_chunks).
  virtual bool copies() const noexcept { return false; }
  virtual void copy(std::uintptr_t /*dst*/, std::uintptr_t /*src*/, std::size_t /*bytes*/) {
    throw invalid_argument("this page device copies nothing");
  }

  // Time spent in this device's page calls so far (zeros when it does not
  // measure them).
  virtual page_call_times call_times() const noexcept { return {}; }

  virtual int device() const noexcept = 0;
  virtual std::string name() const = 0;
  virtual device_properties properties() const = 0;
};

}  // namespace vramkit
