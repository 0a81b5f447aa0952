// The one resource contract every allocator and adaptor meets.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "vramkit/error.hpp"

namespace vramkit {

// A cudaStream_t carried as an integer so that host-only builds need no CUDA
// headers. 0 is the legacy default stream.
using stream_t = std::uintptr_t;

// Why a deallocation was refused. Checked where cheap (a hash lookup the pool
// does anyway); a resource that cannot check returns ok.
enum class free_status { ok, not_owned, wrong_size };

const char* to_string(free_status s) noexcept;

// What a resource holds right now. Fields a resource does not track stay 0.
struct memory_state {
  std::size_t live_bytes = 0;          // bytes handed out: the pool counts its rounded blocks, a page resource the requests
  std::size_t live_count = 0;          // number of live allocations
  std::size_t reserved_bytes = 0;      // bytes taken from the device
  std::size_t cached_bytes = 0;        // reserved but not live
  std::size_t pending_free_bytes = 0;  // freed, waiting on other streams' events
  std::size_t largest_free_bytes = 0;  // largest block servable without growing
  std::size_t capacity_bytes = 0;      // device capacity (or the limit in force)
  std::size_t upstream_allocs = 0;     // calls that took memory from the device
  std::size_t upstream_frees = 0;      // calls that gave memory back
  std::size_t upstream_alloc_bytes = 0;  // bytes ever taken from the device
  std::size_t upstream_free_bytes = 0;   // bytes ever given back
  std::size_t oom_count = 0;
  std::size_t retries = 0;             // allocations that had to release cache first
  std::size_t peak_live_bytes = 0;     // since construction or reset_peaks()
  std::size_t peak_reserved_bytes = 0;
};

class device_resource {
 public:
  virtual ~device_resource() = default;

  // Returns memory aligned to at least 256 bytes. Size 0 returns nullptr and
  // takes nothing; deallocating nullptr is a no-op.
  void* allocate(std::size_t bytes, stream_t stream = 0) { return do_allocate(bytes, stream); }

  // Never throws. A pointer the resource does not own is left alone and
  // reported through the bad-free hook (see set_bad_free_handler).
  void deallocate(void* ptr, std::size_t bytes, stream_t stream = 0) noexcept;

  // Same as deallocate, but throws vramkit::invalid_argument on a bad free
  // and changes nothing.
  void deallocate_checked(void* ptr, std::size_t bytes, stream_t stream = 0);

  // Frees without knowing the size (the Python side's path). Returns the status.
  virtual free_status try_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept = 0;

  // Marks ptr as used on another stream: its memory is not reused until the
  // work queued on `stream` before the free has completed.
  virtual void record_stream(void* ptr, stream_t stream);

  // Returns cached memory to the device. Live memory is untouched.
  virtual void release_cached() {}

  virtual memory_state state() const { return {}; }
  // Restarts the peaks of state() from the current values.
  virtual void reset_peaks() {}
  virtual int device() const noexcept = 0;
  virtual std::string name() const = 0;
  // False for a resource whose addresses are made up (an emulation of another
  // allocator, for replays and what-ifs): no memory lies behind them.
  virtual bool backs_memory() const noexcept { return true; }
  // The size the resource recorded for a live pointer (0 if unknown).
  virtual std::size_t allocation_size(const void* ptr) const noexcept {
    (void)ptr;
    return 0;
  }

 protected:
  virtual void* do_allocate(std::size_t bytes, stream_t stream) = 0;
};

// Called on every refused deallocate(); the default prints one line to stderr.
using bad_free_handler = void (*)(const device_resource&, void*, std::size_t, free_status);
void set_bad_free_handler(bad_free_handler h) noexcept;
std::size_t bad_free_count() noexcept;
// Counts and reports a refused deallocation through the handler (for code
// that frees with try_deallocate on a user's behalf).
void report_bad_free(const device_resource& r, void* ptr, std::size_t bytes, free_status s) noexcept;

}  // namespace vramkit
