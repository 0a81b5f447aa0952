// Remembers every live allocation made through it (pointer -> size, stream,
// time, call site, sequence number) and keeps a bounded history of alloc and
// free events: the leak oracle a caching pool cannot be for itself (its blocks
// stay reserved, so memcheck-style tools see nothing).
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "vramkit/resource.hpp"

namespace vramkit {

namespace detail {
template <class V>
class ptr_map;
}

// Returns the id of the caller's site (0 = unknown). Called on every
// allocation, on the allocating thread, before the adaptor takes its lock; it
// must be cheap and must not allocate through this adaptor.
using site_hook = std::uint32_t (*)();

struct tracked_allocation {
  std::uintptr_t ptr = 0;
  std::size_t size = 0;  // requested bytes
  stream_t stream = 0;
  std::int64_t time_ns = 0;  // steady clock
  std::uint32_t site = 0;
  std::uint64_t seq = 0;  // 1, 2, 3... in allocation order, per adaptor
};

struct tracking_event {
  enum kind : std::uint8_t { alloc = 0, free = 1 };
  kind action = alloc;
  std::uint32_t site = 0;  // of the allocation (also for its free)
  std::uintptr_t ptr = 0;
  std::size_t size = 0;
  stream_t stream = 0;
  std::int64_t time_ns = 0;
};

struct tracking_counts {
  std::size_t live_count = 0;
  std::size_t live_bytes = 0;
  std::uint64_t allocs = 0;           // tracked allocations since construction or reset
  std::uint64_t frees = 0;            // frees of tracked pointers
  std::uint64_t untracked_frees = 0;  // frees of pointers allocated before tracking (passed on)
  std::uint64_t events_dropped = 0;   // history entries overwritten by the ring buffer
};

class tracking_adaptor final : public device_resource {
 public:
  static constexpr std::size_t default_max_events = 100000;

  explicit tracking_adaptor(std::shared_ptr<device_resource> upstream, site_hook hook = nullptr,
                            std::size_t max_events = default_max_events);
  ~tracking_adaptor() override;

  free_status try_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept override;
  void record_stream(void* ptr, stream_t stream) override { upstream_->record_stream(ptr, stream); }
  void release_cached() override { upstream_->release_cached(); }
  memory_state state() const override { return upstream_->state(); }
  void reset_peaks() override { upstream_->reset_peaks(); }
  int device() const noexcept override { return upstream_->device(); }
  std::string name() const override { return "tracking(" + upstream_->name() + ")"; }
  bool backs_memory() const noexcept override { return upstream_->backs_memory(); }
  std::size_t allocation_size(const void* p) const noexcept override { return upstream_->allocation_size(p); }

  // Live allocations in allocation order (oldest first).
  std::vector<tracked_allocation> live() const;
  // Only those with seq > after (allocations made after a mark).
  std::vector<tracked_allocation> live_since(std::uint64_t after) const;
  // The record of one live pointer; false if it is not tracked.
  bool find(const void* ptr, tracked_allocation& out) const;
  // History, oldest first (at most max_events entries).
  std::vector<tracking_event> events() const;
  tracking_counts counts() const;
  // The last sequence number handed out: a mark for live_since().
  std::uint64_t mark() const;
  // Forgets the live table, the history and the counts. Allocations still
  // live become untracked: their frees are passed on and counted as untracked.
  void reset();

  void set_site_hook(site_hook h) noexcept;
  site_hook hook() const noexcept;
  std::size_t max_events() const noexcept { return max_events_; }
  const std::shared_ptr<device_resource>& upstream() const noexcept { return upstream_; }

 protected:
  void* do_allocate(std::size_t bytes, stream_t stream) override;

 private:
  struct entry {
    std::size_t size;
    stream_t stream;
    std::int64_t time_ns;
    std::uint32_t site;
    std::uint64_t seq;
  };
  void push_event(const tracking_event& e);  // caller holds mu_

  std::shared_ptr<device_resource> upstream_;
  std::atomic<site_hook> hook_;
  std::size_t max_events_;
  mutable std::mutex mu_;
  std::unique_ptr<detail::ptr_map<entry>> live_;
  std::vector<tracking_event> ring_;
  std::size_t ring_next_ = 0;  // where the next event goes
  std::uint64_t seq_ = 0;
  tracking_counts counts_;
};

}  // namespace vramkit
