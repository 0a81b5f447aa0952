// Page calls made off the allocating thread, in stream order (async_map).
//
// The driver maps a 2 MiB page with its access rights in some 30-45 us, one
// call at a time, and a pool that grows or moves pages pays that on the thread
// that allocates: in a first step, which runs on the host's speed, every new
// page adds its calls to the step. This device puts map, unmap and destroy
// calls in a queue that one worker thread makes in order, each with a number.
// order(s) then queues on stream s a wait for the number of the last call
// queued: the GPU, not the host, waits, and only where the worker is behind
// the kernels that use the pages. Pages are still created on the calling
// thread, so running out of memory is found where it always was.
//
// The host waits for the worker instead where a stream cannot wait: a device
// without stream waits (the host device) and a stream being captured into a
// CUDA graph. Once the device's free memory runs low, the calls are made at
// once again (a mapping can then fail, and a failure must reach the caller
// that made it). A map or a creation that fails on the worker all the same
// ends the process with a message: a block handed out depends on it, and its
// stream's wait is for it. Only maps and creations are waited for: unmaps and
// destroys run later than the pool made them, which nothing needs sooner
// (drain() waits for them: the pool's copies, release_cached, teardown).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "vramkit/platform/page_device.hpp"
#include "vramkit/platform/stream_ops.hpp"

namespace vramkit {

class ordered_page_device final : public page_device {
 public:
  // What the device did, for tests and the pool's counters.
  struct counters {
    std::uint64_t calls_queued = 0;  // calls made on the worker (creations included)
    std::uint64_t creates_queued = 0;  // async_create: pages created on the worker
    std::uint64_t calls_at_once = 0;  // calls made on the caller (low memory, after a failure)
    std::uint64_t stream_waits = 0;  // waits queued on streams by order()
    std::uint64_t host_waits = 0;    // times the host waited for the worker (drain)
    std::uint64_t host_wait_ns = 0;  // and how long, in all
  };

  // inner: the device whose calls the worker makes. streams: tells order() a
  // stream under capture (nullptr: none is). low_memory: below this many free
  // bytes on the device (inner->available(), read every 16 pages created) the
  // calls are made at once; 0 picks max(1 GiB, capacity / 16).
  // async_create: pages are created on the worker too, while the device has
  // room (create() then returns a handle of this device's own, which the
  // worker's calls translate).
  ordered_page_device(std::shared_ptr<page_device> inner, std::shared_ptr<stream_ops> streams,
                      std::size_t low_memory = 0, bool async_create = false);
  ~ordered_page_device() override;
  ordered_page_device(const ordered_page_device&) = delete;
  ordered_page_device& operator=(const ordered_page_device&) = delete;

  std::size_t granularity() const noexcept override { return inner_->granularity(); }
  std::size_t capacity() const noexcept override { return inner_->capacity(); }
  std::size_t created_bytes() const noexcept override { return inner_->created_bytes(); }
  std::size_t available() const noexcept override { return inner_->available(); }
  std::uintptr_t reserve(std::size_t bytes) override { return inner_->reserve(bytes); }
  void unreserve(std::uintptr_t va, std::size_t bytes) noexcept override;
  page_handle create() override;
  void destroy(page_handle h) noexcept override;
  page_handle create_chunk(std::size_t pages) override;
  void map_chunk(std::uintptr_t va, page_handle h, std::size_t pages) override;
  void map(std::uintptr_t va, const page_handle* handles, std::size_t count) override;
  void unmap(std::uintptr_t va, std::size_t count) noexcept override;
  bool map_replaces() const noexcept override { return inner_->map_replaces(); }
  void attach_thread() override { inner_->attach_thread(); }
  void synchronize() override;
  bool copies() const noexcept override { return inner_->copies(); }
  void copy(std::uintptr_t dst, std::uintptr_t src, std::size_t bytes) override;
  page_call_times call_times() const noexcept override { return inner_->call_times(); }
  int device() const noexcept override { return inner_->device(); }
  std::string name() const override { return inner_->name(); }
  device_properties properties() const override { return inner_->properties(); }
  void order(stream_t s) override;

  // Waits until every call queued so far is made.
  void drain();
  counters read() const;
  const page_device& inner() const noexcept { return *inner_; }

 private:
  enum class kind : std::uint8_t { create, map, map_chunk, unmap, destroy };
  static constexpr page_handle own_bit = page_handle{1} << 63;  // handles create() made up (async_create)
  struct call {
    kind k;
    std::uintptr_t va = 0;
    std::size_t count = 0;
    page_handle h = 0;
    std::vector<page_handle> handles;
    std::uint64_t seq = 0;
  };
  bool at_once() const noexcept;  // with mu_
  bool ensure_worker();           // with mu_: false when no thread could be started
  void enqueue(call c);           // throws what the queue's growth throws
  void run(call& c);
  void loop();
  void note_room();
  void wait_for(std::uint64_t seq);  // with mu_ not held: until call seq is made
  [[noreturn]] static void fatal(const char* what, const std::string& why) noexcept;
  page_handle real(page_handle h);  // the inner device's handle for h (0: its creation failed)

  std::shared_ptr<page_device> inner_;
  std::shared_ptr<stream_ops> streams_;
  std::size_t low_memory_;
  std::uint32_t* word_ = nullptr;  // the number of the last call made, for streams to wait on

  mutable std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<call> queue_;
  std::uint64_t queued_ = 0, made_ = 0;  // numbers of the last call queued / made
  std::uint64_t needed_ = 0;  // number of the last map or creation queued: what allocations wait for
  bool stop_ = false, low_ = false;
  std::size_t creates_ = 0;
  bool async_create_ = false;
  page_handle next_own_ = 0;
  std::size_t creating_ = 0;  // creations queued, not yet made
  std::mutex ids_mu_;         // real_: written by the worker, read where calls are made
  std::unordered_map<page_handle, page_handle> real_;
  counters ctr_;
  std::thread worker_;
  bool worker_failed_ = false;  // no thread could be started: calls at once
};

}  // namespace vramkit
