// Routes allocations to private pools while CUDA graphs are captured (and
// while a framework asks for a scoped pool), the way PyTorch's own allocator
// does for `torch.cuda.graph` and `torch.cuda.use_mem_pool`.
//
// Why: a graph replays the addresses it saw at capture. Memory handed out
// during the capture, and memory freed during it, must not be given to
// anything outside the graph while the graph can still be replayed. And no
// event may be queried, nor a stream synchronized, on a capturing stream.
//
// The rules kept here:
// - Between begin_allocate_to_pool(id, filter) and end_allocate_to_pool(id),
//   an allocation on a stream the filter accepts comes from the private pool
//   `id`. Private pools only grow: they never move or unmap a page while they
//   live, so every address a graph holds stays valid.
// - A private pool lives while a user holds it (each begin adds one, each
//   release_pool takes one) or while any of its blocks is live. The last of
//   the two to end destroys it, after a device synchronization (replays may
//   still be queued).
// - A block of the main resource freed while a capture is under way may be
//   used by the graph: it is set aside with that capture's pool and returned
//   to the main resource only when the pool is released.
// - Inside a private pool, a block freed on one stream serves other streams
//   only once no capture is under way (capture-aware events below).
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "vramkit/platform/stream_ops.hpp"
#include "vramkit/resource.hpp"

namespace vramkit {

// PyTorch's MempoolId_t: a pair of integers.
struct graph_pool_id {
  std::uint64_t first = 0;
  std::uint64_t second = 0;
  auto operator<=>(const graph_pool_id&) const = default;
};

struct graph_pool_info {
  graph_pool_id id;
  int users = 0;               // begins not yet matched by a release
  int windows = 0;             // begin..end windows open now
  bool captured = false;       // saw an allocation or free on a capturing stream
  std::size_t set_aside_count = 0;  // main-resource frees held for the graph
  std::size_t set_aside_bytes = 0;
  memory_state state;          // of the private pool
};

class capture_router {
 public:
  using stream_filter = std::function<bool(stream_t)>;
  using make_pool_fn = std::function<std::shared_ptr<device_resource>()>;
  // Whether a stream is being captured (cudaStreamIsCapturing).
  using stream_query = std::function<bool(stream_t)>;
  // Whether the calling thread's current stream is being captured.
  using thread_query = std::function<bool()>;

  capture_router(std::shared_ptr<device_resource> main, make_pool_fn make_pool, stream_query stream_capturing,
                 thread_query thread_capturing, std::function<void()> synchronize);
  ~capture_router();
  capture_router(const capture_router&) = delete;
  capture_router& operator=(const capture_router&) = delete;

  void* allocate(std::size_t bytes, stream_t stream);
  free_status deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept;
  void record_stream(void* ptr, stream_t stream);

  void begin_allocate_to_pool(graph_pool_id id, stream_filter filter);
  void end_allocate_to_pool(graph_pool_id id);
  void release_pool(graph_pool_id id);
  // A user of the pool without a window (PyTorch's MemPool object).
  void incref_pool(graph_pool_id id);

  // True while any begin..end window is open (cheap: one atomic load). Every
  // capture is inside one, so this is also "a capture may be under way".
  bool routing() const noexcept { return windows_.load(std::memory_order_acquire) > 0; }
  // The resource everything outside the private pools goes to. It can be
  // replaced while the router lives (a tracking adaptor put over it, then
  // taken off): allocations made through the old one free through the new
  // one, so the new one must reach the same memory (an adaptor over base()).
  // The resource the router was made with (base()) lives as long as the router.
  std::shared_ptr<device_resource> main() const noexcept { return main_.load(std::memory_order_acquire); }
  const std::shared_ptr<device_resource>& base() const noexcept { return base_; }
  // A generation older than the current one is ignored (two threads that saw
  // the current resource change at different times).
  void set_main(std::shared_ptr<device_resource> main, std::uint64_t generation);
  // The generation given with the last set_main (0 at first).
  std::uint64_t main_generation() const noexcept { return main_generation_.load(std::memory_order_acquire); }
  std::vector<graph_pool_info> pools() const;
  // Owner of a live pointer: the private pool's id, or nothing (main).
  bool owner(const void* ptr, graph_pool_id& id) const;
  std::vector<void*> live_pointers(graph_pool_id id) const;

 private:
  struct private_pool;
  struct window {
    graph_pool_id id;
    stream_filter filter;
  };
  private_pool* pool_for_(graph_pool_id id);
  // Ends what a pool no longer needs once nobody holds it; unlocks lk.
  void settle_(graph_pool_id id, std::unique_lock<std::mutex>& lk) noexcept;

  const std::shared_ptr<device_resource> base_;
  std::atomic<std::shared_ptr<device_resource>> main_;
  std::atomic<std::uint64_t> main_generation_{0};
  make_pool_fn make_pool_;
  stream_query stream_capturing_;
  thread_query thread_capturing_;
  std::function<void()> synchronize_;

  mutable std::mutex mu_;
  std::atomic<int> windows_{0};
  std::atomic<std::size_t> private_live_{0};
  std::vector<window> open_;  // newest last
  std::map<graph_pool_id, std::unique_ptr<private_pool>> pools_;
  std::unordered_map<std::uintptr_t, graph_pool_id> owners_;  // live private blocks
};

// Events for a private pool: an event recorded on a capturing stream is a
// marker, never a CUDA event (querying one is an error during capture). It
// counts as complete once no capture is under way; waiting on it during a
// capture is refused.
class capture_aware_events final : public stream_ops {
 public:
  capture_aware_events(std::shared_ptr<stream_ops> inner, capture_router::stream_query stream_capturing,
                       std::function<bool()> capture_under_way);
  event_id record(stream_t s) override;
  bool done(event_id e) override;
  void wait(event_id e) override;
  void release(event_id e) noexcept override;
  bool capturing(stream_t s) noexcept override;

 private:
  // CUDA events are user-space pointers (below 2^63), host events small numbers.
  static constexpr event_id marker_bit = event_id{1} << 63;
  std::shared_ptr<stream_ops> inner_;
  capture_router::stream_query stream_capturing_;
  std::function<bool()> capture_under_way_;
  std::atomic<event_id> next_marker_{1};
};

}  // namespace vramkit
