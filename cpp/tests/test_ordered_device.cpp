// async_map: page calls made on a worker thread in order, with streams made to
// wait for them (ordered_page_device), on the host device. The waits a CUDA
// stream makes are checked on the GPU (docs/GPU-TESTS.md).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "forwarding_device.hpp"
#include "vramkit/mr/pool_resource.hpp"
#include "vramkit/platform/host_page_device.hpp"
#include "vramkit/platform/ordered_page_device.hpp"

using namespace vramkit;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

// Records every call with the thread that made it, holds map/unmap/destroy
// until opened, and lets streams "wait" on a word (recording the waits).
class gated_device : public test::forwarding_device {
 public:
  struct entry {
    std::string what;
    std::uintptr_t va;
    std::size_t n;
    std::thread::id by;
  };
  gated_device(std::shared_ptr<page_device> in, bool streams_wait, bool open = true)
      : forwarding_device(std::move(in)), streams_wait_(streams_wait), open_(open) {}
  std::uint32_t* make_wait_word() override { return streams_wait_ ? &word_ : nullptr; }
  bool queue_wait(stream_t s, std::uint32_t* w, std::uint32_t v) override {
    std::lock_guard<std::mutex> l(m_);
    EXPECT_EQ(w, &word_);
    waits.push_back({s, v});
    return true;
  }
  page_handle create() override {  // never held; recorded apart from the other calls
    {
      std::lock_guard<std::mutex> l(m_);
      creators.push_back(std::this_thread::get_id());
    }
    return in_->create();
  }
  void map(std::uintptr_t va, const page_handle* h, std::size_t n) override {
    hold();
    if (fail_maps) throw cuda_error("injected map failure", 1);
    log("map", va, n);
    in_->map(va, h, n);
  }
  void unmap(std::uintptr_t va, std::size_t n) noexcept override {
    hold();
    log("unmap", va, n);
    in_->unmap(va, n);
  }
  void destroy(page_handle h) noexcept override {
    hold();
    log("destroy", 0, 1);
    in_->destroy(h);
  }
  std::size_t available() const noexcept override { return avail; }
  std::string name() const override { return "gated"; }
  void close() {
    std::lock_guard<std::mutex> l(m_);
    open_ = false;
  }
  void open() {
    {
      std::lock_guard<std::mutex> l(m_);
      open_ = true;
    }
    cv_.notify_all();
  }
  std::vector<entry> entries() {
    std::lock_guard<std::mutex> l(m_);
    return log_;
  }
  std::uint32_t word() { return std::atomic_ref<std::uint32_t>(word_).load(); }
  std::vector<std::pair<stream_t, std::uint32_t>> waits;
  std::vector<std::thread::id> creators;  // read once the calls are made
  bool fail_maps = false;
  std::size_t avail = std::size_t{1} << 40;

 private:
  void hold() {
    std::unique_lock<std::mutex> l(m_);
    cv_.wait(l, [&] { return open_; });
  }
  void log(const char* w, std::uintptr_t va, std::size_t n) {
    std::lock_guard<std::mutex> l(m_);
    log_.push_back({w, va, n, std::this_thread::get_id()});
  }
  bool streams_wait_;
  bool open_;
  std::uint32_t word_ = 0;
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<entry> log_;
};

class capturing_streams : public stream_ops {
 public:
  event_id record(stream_t) override { return 1; }
  bool done(event_id) override { return true; }
  void wait(event_id) override {}
  void release(event_id) noexcept override {}
  bool capturing(stream_t s) noexcept override { return s == 9; }
};

std::shared_ptr<host_page_device> host(std::size_t pages = 64) {
  return std::make_shared<host_page_device>(pages * 2 * MiB);
}

}  // namespace

TEST(ordered_device, calls_are_made_in_order_on_a_worker_thread) {
  auto h = host();
  auto g = std::make_shared<gated_device>(h, true, false);  // held: the calls stay queued
  ordered_page_device d(g, nullptr);
  const std::uintptr_t va = d.reserve(8 * 2 * MiB);
  std::vector<page_handle> ps;
  for (int i = 0; i < 4; ++i) ps.push_back(d.create());  // created at once, on this thread
  EXPECT_EQ(h->created_bytes(), 4 * 2 * MiB);
  d.map(va, ps.data(), 4);
  d.unmap(va + 2 * 2 * MiB, 2);
  d.map(va + 4 * 2 * MiB, &ps[2], 2);
  d.unmap(va, 2);
  d.destroy(ps[0]);
  EXPECT_TRUE(g->entries().empty());  // nothing made yet: the caller did not wait
  EXPECT_EQ(d.read().calls_queued, 5u);
  g->open();
  d.drain();
  auto e = g->entries();
  ASSERT_EQ(e.size(), 5u);
  const std::vector<std::string> want{"map", "unmap", "map", "unmap", "destroy"};
  for (std::size_t i = 0; i < e.size(); ++i) {
    EXPECT_EQ(e[i].what, want[i]) << i;
    EXPECT_NE(e[i].by, std::this_thread::get_id()) << i;
  }
  EXPECT_EQ(e[2].va, va + 4 * 2 * MiB);
  EXPECT_EQ(g->word(), 5u);  // the last call's number, for streams to wait on
  EXPECT_EQ(h->created_bytes(), 3 * 2 * MiB);
  // The pages mapped last hold bytes.
  std::memset(reinterpret_cast<void*>(va + 4 * 2 * MiB), 0x5a, 2 * 2 * MiB);
  d.unmap(va + 4 * 2 * MiB, 2);
  for (int i = 1; i < 4; ++i) d.destroy(ps[i]);
  d.unreserve(va, 8 * 2 * MiB);  // waits for the unmaps before the address space goes
  EXPECT_EQ(h->created_bytes(), 0u);
}

TEST(ordered_device, order_queues_a_wait_on_the_stream_for_the_last_call_instead_of_waiting) {
  auto g = std::make_shared<gated_device>(host(), true, false);
  ordered_page_device d(g, nullptr);
  const std::uintptr_t va = d.reserve(4 * 2 * MiB);
  page_handle p = d.create();
  d.order(5);  // nothing queued: no wait of any kind
  EXPECT_TRUE(g->waits.empty());
  d.map(va, &p, 1);
  d.order(5);  // the map is held on the worker: the stream waits, the host does not
  ASSERT_EQ(g->waits.size(), 1u);
  EXPECT_EQ(g->waits[0].first, stream_t{5});
  EXPECT_EQ(g->waits[0].second, 1u);
  EXPECT_EQ(d.read().host_waits, 0u);
  EXPECT_EQ(d.read().stream_waits, 1u);
  g->open();
  d.drain();
  EXPECT_EQ(g->word(), 1u);
  d.order(5);  // made: nothing to wait for
  EXPECT_EQ(g->waits.size(), 1u);
  d.unmap(va, 1);
  d.destroy(p);
  d.unreserve(va, 4 * 2 * MiB);
}

TEST(ordered_device, a_stream_under_capture_and_a_device_without_stream_waits_get_the_host_waiting) {
  {
    auto g = std::make_shared<gated_device>(host(), true);
    ordered_page_device d(g, std::make_shared<capturing_streams>());
    const std::uintptr_t va = d.reserve(4 * 2 * MiB);
    page_handle p = d.create();
    d.map(va, &p, 1);
    d.order(9);  // capturing: a wait would enter the graph
    EXPECT_TRUE(g->waits.empty());
    EXPECT_EQ(g->entries().size(), 1u);  // made before order returned
    d.unmap(va, 1);
    d.destroy(p);
    d.unreserve(va, 4 * 2 * MiB);
  }
  {
    auto g = std::make_shared<gated_device>(host(), false);
    ordered_page_device d(g, nullptr);
    const std::uintptr_t va = d.reserve(4 * 2 * MiB);
    page_handle p = d.create();
    d.map(va, &p, 1);
    d.order(1);
    EXPECT_EQ(g->entries().size(), 1u);
    std::memset(reinterpret_cast<void*>(va), 1, 2 * MiB);  // mapped when order returned
    d.unmap(va, 1);
    d.destroy(p);
    d.unreserve(va, 4 * 2 * MiB);
  }
}

TEST(ordered_device, only_maps_and_creations_are_waited_for) {
  auto g = std::make_shared<gated_device>(host(), true);
  ordered_page_device d(g, nullptr);
  const std::uintptr_t va = d.reserve(4 * 2 * MiB);
  page_handle p = d.create();
  d.map(va, &p, 1);
  d.drain();
  g->close();
  d.unmap(va, 1);  // held on the worker: no block handed out needs it
  d.destroy(p);
  const auto host_waits = d.read().host_waits;
  d.order(2);
  EXPECT_TRUE(g->waits.empty());
  EXPECT_EQ(d.read().host_waits, host_waits);  // nor did the host wait
  g->open();
  d.drain();
  EXPECT_EQ(g->created_bytes(), 0u);
  d.unreserve(va, 4 * 2 * MiB);
}

// A mapping the worker cannot make ends the process with a message: the block
// it was for has been handed out, and its stream's wait is for it.
TEST(ordered_device_death, a_map_that_fails_on_the_worker_stops_the_process_with_a_message) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        auto g = std::make_shared<gated_device>(host(), true);
        ordered_page_device d(g, nullptr);
        const std::uintptr_t va = d.reserve(4 * 2 * MiB);
        page_handle p = d.create();
        g->fail_maps = true;
        d.map(va, &p, 1);
        d.drain();
      },
      "async_map: mapping pages failed on the worker thread \\(injected map failure\\)");
}

TEST(ordered_device, low_free_memory_makes_the_calls_at_once) {
  auto g = std::make_shared<gated_device>(host(), true);
  g->avail = 100 * MiB;
  ordered_page_device d(g, nullptr, 512 * MiB);
  const std::uintptr_t va = d.reserve(4 * 2 * MiB);
  page_handle p = d.create();  // reads the room: low
  d.map(va, &p, 1);
  EXPECT_EQ(d.read().calls_queued, 0u);
  EXPECT_EQ(d.read().calls_at_once, 1u);
  EXPECT_EQ(g->entries().size(), 1u);
  EXPECT_EQ(g->entries()[0].by, std::this_thread::get_id());
  d.unmap(va, 1);
  d.destroy(p);
  d.unreserve(va, 4 * 2 * MiB);
}

TEST(ordered_device, a_full_device_creates_again_once_the_queued_destroys_are_made) {
  auto g = std::make_shared<gated_device>(host(2), true, false);
  ordered_page_device d(g, nullptr);
  page_handle a = d.create(), b = d.create();
  ASSERT_TRUE(a && b);
  d.destroy(a);  // held on the worker
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    g->open();
  });
  page_handle c = d.create();  // the device is full until the destroy is made
  opener.join();
  EXPECT_NE(c, 0u);
  EXPECT_GE(d.read().host_waits, 1u);
  d.destroy(b);
  d.destroy(c);
  d.drain();
  EXPECT_EQ(g->created_bytes(), 0u);
}

TEST(ordered_device, destruction_makes_every_call_still_queued) {
  auto h = host();
  auto g = std::make_shared<gated_device>(h, true, false);
  std::uintptr_t va = 0;
  std::thread opener;
  {
    ordered_page_device d(g, nullptr);
    va = d.reserve(4 * 2 * MiB);
    page_handle p = d.create();
    d.map(va, &p, 1);
    d.unmap(va, 1);
    d.destroy(p);
    opener = std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      g->open();
    });
  }  // waits for the calls, which wait for the opener
  opener.join();
  EXPECT_EQ(g->entries().size(), 3u);
  EXPECT_EQ(h->created_bytes(), 0u);
  h->unreserve(va, 4 * 2 * MiB);
}

TEST(ordered_device, async_create_makes_the_pages_on_the_worker_and_maps_them_by_its_own_handles) {
  auto h = host();
  auto g = std::make_shared<gated_device>(h, true, false);
  ordered_page_device d(g, nullptr, 0, true);
  const std::uintptr_t va = d.reserve(4 * 2 * MiB);
  page_handle ps[2] = {d.create(), d.create()};
  ASSERT_TRUE(ps[0] && ps[1]);
  EXPECT_NE(ps[0], ps[1]);
  d.map(va, ps, 2);
  d.order(4);
  ASSERT_EQ(g->waits.size(), 1u);
  EXPECT_EQ(g->waits[0].second, 3u);  // two creations and the map
  EXPECT_EQ(d.read().creates_queued, 2u);
  g->open();
  d.drain();
  EXPECT_EQ(h->created_bytes(), 2 * 2 * MiB);
  ASSERT_EQ(g->creators.size(), 2u);
  for (const auto& by : g->creators) EXPECT_NE(by, std::this_thread::get_id());  // the caller made no driver call
  std::memset(reinterpret_cast<void*>(va), 3, 2 * 2 * MiB);
  d.unmap(va, 2);
  d.destroy(ps[0]);
  d.destroy(ps[1]);
  d.drain();
  EXPECT_EQ(h->created_bytes(), 0u);
  d.unreserve(va, 4 * 2 * MiB);
}

TEST(ordered_device, async_create_creates_at_once_when_memory_is_low) {
  auto g = std::make_shared<gated_device>(host(), true);
  g->avail = 100 * MiB;
  ordered_page_device d(g, nullptr, 512 * MiB, true);
  page_handle p = d.create();
  EXPECT_EQ(d.read().creates_queued, 0u);
  EXPECT_EQ(g->created_bytes(), 2 * MiB);  // the device's own handle, made here
  d.destroy(p);
  d.drain();
  EXPECT_EQ(g->created_bytes(), 0u);
}

TEST(ordered_device_death, a_creation_that_fails_on_the_worker_stops_the_process_with_a_message) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        auto g = std::make_shared<gated_device>(host(1), true);  // room for one page, though it claims more
        ordered_page_device d(g, nullptr, 1, true);
        d.create();
        d.create();
        d.drain();
      },
      "async_map: creating a page failed on the worker thread \\(the device had no room");
}

TEST(ordered_device, a_pool_with_async_map_keeps_its_blocks_bytes_and_orders_each_allocation) {
  auto g = std::make_shared<gated_device>(host(1024), true);
  pool_options o;
  o.async_map = true;
  pool_resource pool(g, nullptr, o);
  struct live_block {
    unsigned char* p;
    std::size_t n;
    unsigned char v;
  };
  std::vector<live_block> live;
  std::size_t k = 0;
  auto made = [&] {  // what a stream's wait waits for: every call queued made
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (g->word() < pool.counters().async_calls && std::chrono::steady_clock::now() < until)
      std::this_thread::yield();
    ASSERT_EQ(g->word(), pool.counters().async_calls);
  };
  for (int round = 0; round < 6; ++round) {
    const std::size_t waits0 = g->waits.size(), calls0 = pool.counters().async_calls;
    g->close();  // the round's calls stay queued until it is over
    for (int i = 0; i < 12; ++i) {
      const std::size_t n = (1 + (k * 7) % 23) * MiB + (k % 3) * 4096;
      const auto v = static_cast<unsigned char>(++k);
      auto* p = static_cast<unsigned char*>(pool.allocate(n, 3));
      ASSERT_NE(p, nullptr);
      live.push_back({p, n, v});
    }
    // Pages mapped or moved in the round: the stream waits for them, the host did not.
    if (pool.counters().async_calls > calls0) EXPECT_GT(g->waits.size(), waits0) << "round " << round;
    if (round == 0) EXPECT_GT(pool.counters().async_calls, calls0);
    g->open();
    made();
    for (auto& b : live)
      if (b.v > k - 12) {
        std::memset(b.p, b.v, 4096);
        std::memset(b.p + b.n - 4096, b.v, 4096);
      }
    for (auto& b : live) {  // the blocks kept from earlier rounds kept their bytes through the moves
      EXPECT_EQ(b.p[0], b.v);
      EXPECT_EQ(b.p[b.n - 1], b.v);
    }
    std::vector<live_block> keep;  // every other block goes: the next round moves pages
    for (std::size_t i = 0; i < live.size(); ++i) {
      if (i % 2 == 0)
        pool.deallocate(live[i].p, live[i].n, 3);
      else
        keep.push_back(live[i]);
    }
    live.swap(keep);
  }
  const pool_counters c = pool.counters();
  EXPECT_GT(c.async_calls, 0u);
  EXPECT_GT(c.async_stream_waits, 0u);
  EXPECT_EQ(c.async_host_waits, 0u);
  EXPECT_GT(c.pages_remapped + c.pages_unmapped, 0u);
  for (const auto& w : g->waits) EXPECT_EQ(w.first, stream_t{3});
  for (auto& b : live) pool.deallocate(b.p, b.n, 3);
}

// ---- on the GPU --------------------------------------------------------------
#include "vramkit/platform/cuda.hpp"

namespace {
// The vmm device with every map held back on the worker: a kernel queued
// right after the allocation reaches its pages before they are mapped unless
// its stream waits for them (an unmapped address would be an illegal access,
// a sticky error that fails the test).
class slow_vmm final : public test::forwarding_device {
 public:
  using forwarding_device::forwarding_device;
  void map(std::uintptr_t va, const page_handle* h, std::size_t n) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    in_->map(va, h, n);
  }
  std::string name() const override { return "slow vmm"; }
  void attach_thread() override { in_->attach_thread(); }
  std::size_t available() const noexcept override { return in_->available(); }
  int delay_ms = 20;
};
}  // namespace

TEST(ordered_device_gpu, a_stream_waits_for_pages_mapped_late_and_the_host_does_not) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "needs a CUDA device: " << cuda::unavailable_reason();
  for (bool create_too : {false, true}) {
    auto slow = std::make_shared<slow_vmm>(cuda::make_vmm_device(0));
    pool_options o;
    o.async_map = true;
    o.async_create = create_too;
    pool_resource pool(slow, cuda::make_stream_ops(0), o);
    // A second pool over the same device (as a graph's pool shares the main pool's): its own
    // worker, its own word; its waits must not stand for the first pool's, nor the other way.
    pool_resource other(slow, cuda::make_stream_ops(0), o);
    const stream_t s = cuda::create_stream(0);
    struct blk {
      void* p;
      std::size_t n;
      int v;
    };
    std::vector<blk> live;
    for (int i = 0; i < 12; ++i) {
      const std::size_t n = (8 + 5 * i) * MiB + 4096 * i;
      void* p = pool.allocate(n, s);
      cuda::memset_async(p, 16 + i, n, s);  // queued behind the wait for its pages
      live.push_back({p, n, 16 + i});
      void* q = other.allocate(n / 2, s);  // more calls on the other worker, between the first's
      cuda::memset_async(q, 1, n / 2, s);
      other.deallocate(q, n / 2, s);
      if (i % 3 == 2) {  // frees on the stream: later blocks move their pages
        pool.deallocate(live.front().p, live.front().n, s);
        live.erase(live.begin());
      }
    }
    cuda::synchronize_stream(s);
    for (const blk& b : live) {
      for (std::size_t off : {std::size_t{0}, b.n / 2, b.n - 1}) {
        unsigned char c = 0;
        cuda::copy_to_host(&c, static_cast<unsigned char*>(b.p) + off, 1);
        EXPECT_EQ(c, b.v) << "async_create " << create_too << ", block of " << b.n << " bytes, offset " << off;
      }
    }
    const pool_counters c = pool.counters();
    EXPECT_GT(c.async_calls, 0u);
    EXPECT_GT(c.async_stream_waits, 0u) << "the driver refused the stream waits";
    EXPECT_EQ(c.async_host_waits, 0u);
    for (const blk& b : live) pool.deallocate(b.p, b.n, s);
    cuda::synchronize_stream(s);
    pool.release_cached();
    other.release_cached();
    EXPECT_EQ(pool.state().reserved_bytes, 0u);
    EXPECT_GT(other.counters().async_stream_waits, 0u);
    cuda::destroy_stream(s);
  }
}
