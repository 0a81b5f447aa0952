// The pool against a reference model, under injected faults, across streams
// and threads.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <chrono>
#include <thread>

#include "forwarding_device.hpp"
#include "vramkit/mr/page_resource.hpp"
#include "vramkit/mr/pool_resource.hpp"
#include "vramkit/mr/statistics_adaptor.hpp"
#include "vramkit/platform/host_page_device.hpp"

using namespace vramkit;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;

// A page device that fails every k-th create or map (alternating kinds).
class faulty_device final : public test::forwarding_device {
 public:
  faulty_device(std::shared_ptr<page_device> inner, int every) : forwarding_device(std::move(inner)), every_(every) {}
  page_handle create() override {
    if (++calls_ % every_ == 0) {
      ++faults;
      if (calls_ % (2 * every_) == 0) return 0;  // "device full"
      throw cuda_error("injected create failure", 2);
    }
    return in_->create();
  }
  void map(std::uintptr_t va, const page_handle* h, std::size_t n) override {
    if (++calls_ % every_ == 0) {
      ++faults;
      throw cuda_error("injected map failure", 3);
    }
    in_->map(va, h, n);
  }
  std::string name() const override { return "faulty"; }
  int faults = 0;

 private:
  int every_;
  long calls_ = 0;
};

// Records which physical page sits behind every mapped address (a page may
// be mapped at several), and counts pages destroyed while still mapped.
class mapping_recorder final : public test::forwarding_device {
 public:
  explicit mapping_recorder(std::shared_ptr<page_device> inner) : forwarding_device(std::move(inner)) {}
  void destroy(page_handle h) noexcept override {
    if (mapped_at.count(h) && !mapped_at[h].empty()) ++destroyed_while_mapped;
    mapped_at.erase(h);
    in_->destroy(h);
  }
  void map(std::uintptr_t va, const page_handle* h, std::size_t n) override {
    in_->map(va, h, n);
    const std::size_t g = granularity();
    for (std::size_t i = 0; i < n; ++i) {
      if (at.count(va + i * g)) ++mapped_over;
      at[va + i * g] = h[i];
      mapped_at[h[i]].push_back(va + i * g);
    }
  }
  void unmap(std::uintptr_t va, std::size_t n) noexcept override {
    const std::size_t g = granularity();
    for (std::size_t i = 0; i < n; ++i) {
      auto it = at.find(va + i * g);
      if (it == at.end()) continue;
      auto& v = mapped_at[it->second];
      v.erase(std::find(v.begin(), v.end(), va + i * g));
      at.erase(it);
    }
    in_->unmap(va, n);
  }
  std::string name() const override { return "recorder"; }
  std::map<std::uintptr_t, page_handle> at;
  std::map<page_handle, std::vector<std::uintptr_t>> mapped_at;
  long destroyed_while_mapped = 0, mapped_over = 0;
};

struct live_block {
  std::size_t size;
  stream_t stream;
};

// Checks the model against the pool: no overlap, alignment, stats add up.
void check_model(const pool_resource& pool, const std::map<std::uintptr_t, live_block>& live, std::size_t align) {
  std::uintptr_t end = 0;
  std::size_t sum = 0;
  for (auto& [a, b] : live) {
    ASSERT_EQ(a % align, 0u);
    ASSERT_GE(a, end) << "live blocks overlap";
    end = a + b.size;
    sum += b.size;
    ASSERT_EQ(pool.allocation_size(reinterpret_cast<void*>(a)), b.size);
  }
  memory_state s = pool.state();
  ASSERT_EQ(s.live_count, live.size());
  ASSERT_GE(s.live_bytes, sum);
  ASSERT_EQ(s.live_bytes + s.cached_bytes, s.reserved_bytes) << "live + cached != reserved";
}

std::size_t random_size(std::mt19937_64& rng, std::size_t lo, std::size_t hi) {
  std::uniform_real_distribution<double> lg(std::log2(double(lo)), std::log2(double(hi)));
  return std::max<std::size_t>(lo, static_cast<std::size_t>(std::exp2(lg(rng))));
}

TEST(pool_property, hundred_thousand_random_ops_against_a_model) {
  auto dev = std::make_shared<host_page_device>(64 * GiB);
  pool_options o;
  pool_resource pool(dev, nullptr, o);
  std::mt19937_64 rng(20261202);
  std::map<std::uintptr_t, live_block> live;
  std::vector<std::uintptr_t> order;
  const stream_t streams[3] = {0, 0x1000, 0x2000};
  std::size_t live_bytes = 0;
  for (int step = 0; step < 100000; ++step) {
    bool do_alloc = live.empty() || (live.size() < 400 && rng() % 2 == 0 && live_bytes < 40 * GiB);
    if (do_alloc) {
      std::size_t n = random_size(rng, 1, 256 * MiB);
      stream_t s = streams[rng() % 3];
      void* p = pool.allocate(n, s);
      auto a = reinterpret_cast<std::uintptr_t>(p);
      ASSERT_TRUE(live.emplace(a, live_block{n, s}).second) << "address handed out twice";
      order.push_back(a);
      live_bytes += n;
    } else {
      std::size_t k = rng() % order.size();  // frees in random order
      std::uintptr_t a = order[k];
      order[k] = order.back();
      order.pop_back();
      auto it = live.find(a);
      stream_t s = it->second.stream;
      live_bytes -= it->second.size;
      ASSERT_EQ(pool.try_deallocate(reinterpret_cast<void*>(a), it->second.size, s), free_status::ok);
      live.erase(it);
    }
    // Cheap checks every step; the full structural walk every 997 steps.
    memory_state st = pool.state();
    ASSERT_EQ(st.live_count, live.size());
    ASSERT_EQ(st.live_bytes + st.cached_bytes, st.reserved_bytes);
    if (step % 997 == 0) {
      check_model(pool, live, o.alignment);
      pool.check_invariants();
    }
  }
  for (auto& [a, b] : live) pool.deallocate_checked(reinterpret_cast<void*>(a), b.size, b.stream);
  pool.check_invariants();
  pool.release_cached();
  EXPECT_EQ(pool.state().reserved_bytes, 0u);
  EXPECT_EQ(dev->created_bytes(), 0u);
}

TEST(pool_faults, every_kth_upstream_call_fails_without_leak_or_corruption) {
  for (int every : {3, 7, 50}) {
    // Small enough that requests also fail for want of memory.
    auto inner = std::make_shared<host_page_device>(512 * MiB);
    auto dev = std::make_shared<faulty_device>(inner, every);
    // Two streams whose events are found done only on some queries, so frees
    // change hands between them at any point of a request.
    struct sometimes_done : stream_ops {
      unsigned queries = 0;
      event_id record(stream_t) override { return 1; }
      bool done(event_id) override { return ++queries % 3 == 0; }
      void wait(event_id) override {}
      void release(event_id) noexcept override {}
    };
    pool_resource pool(dev, std::make_shared<sometimes_done>());
    std::mt19937_64 rng(every);
    const stream_t streams[2] = {0x10, 0x20};
    std::map<std::uintptr_t, live_block> live;
    int errors = 0;
    for (int step = 0; step < 3000; ++step) {
      if (live.empty() || rng() % 2) {
        std::size_t n = random_size(rng, 256, 64 * MiB);
        try {
          stream_t st = streams[rng() % 2];
          void* p = pool.allocate(n, st);
          std::memset(p, 0x3c, std::min<std::size_t>(n, 64));
          live.emplace(reinterpret_cast<std::uintptr_t>(p), live_block{n, st});
        } catch (const out_of_memory& e) {
          ++errors;
          EXPECT_NE(std::string(e.what()).find("requested"), std::string::npos);
          pool.check_invariants();  // a failed request leaves the pool as it was
        } catch (const cuda_error& e) {
          ++errors;
          EXPECT_NE(std::string(e.what()).find("injected"), std::string::npos);
          pool.check_invariants();
        }
      } else {
        auto it = live.begin();
        std::advance(it, rng() % live.size());
        ASSERT_EQ(static_cast<unsigned char*>(reinterpret_cast<void*>(it->first))[0], 0x3c) << "data corrupted";
        pool.deallocate_checked(reinterpret_cast<void*>(it->first), it->second.size, it->second.stream);
        live.erase(it);
      }
      if (step % 101 == 0) {
        check_model(pool, live, 256);
        pool.check_invariants();
      }
    }
    EXPECT_GT(dev->faults, 0);
    EXPECT_GT(errors, 0);
    for (auto& [a, b] : live) pool.deallocate_checked(reinterpret_cast<void*>(a), b.size, b.stream);
    pool.check_invariants();
    pool.release_cached();
    EXPECT_EQ(inner->created_bytes(), 0u) << "physical pages leaked with every=" << every;
  }
}

TEST(pool, out_of_memory_message_and_recovery) {
  auto dev = std::make_shared<host_page_device>(256 * MiB);
  pool_resource pool(dev, nullptr);
  std::vector<void*> keep;
  for (int i = 0; i < 12; ++i) keep.push_back(pool.allocate(20 * MiB));
  try {
    pool.allocate(100 * MiB);
    FAIL() << "expected out_of_memory";
  } catch (const out_of_memory& e) {
    std::string m = e.what();
    for (const char* want : {"requested", "live", "cached", "largest free range", "device capacity", "fragmentation"})
      EXPECT_NE(m.find(want), std::string::npos) << want << " missing from: " << m;
    EXPECT_EQ(e.requested(), 100 * MiB);
  }
  pool.check_invariants();
  EXPECT_EQ(pool.state().oom_count, 1u);
  for (int i = 0; i < 6; ++i) pool.deallocate_checked(keep[i], 20 * MiB);
  void* p = pool.allocate(100 * MiB);  // fits after frees: freed pages are remapped
  EXPECT_NE(p, nullptr);
  pool.check_invariants();
  pool.deallocate_checked(p, 0);
  for (int i = 6; i < 12; ++i) pool.deallocate_checked(keep[i], 0);
}

// keep_mappings: a page moved away keeps its old mapping; moved back, it
// needs no map call, and it is never given back while still mapped.
TEST(pool, a_page_moved_back_where_it_is_still_mapped_costs_no_map_call) {
  for (bool keep : {true, false}) {
    SCOPED_TRACE(keep ? "keep_mappings on" : "keep_mappings off");
    auto inner = std::make_shared<host_page_device>(GiB);
    auto rec = std::make_shared<mapping_recorder>(inner);
    pool_options o;
    o.keep_mappings = keep;
    o.remap_own = keep;  // remap_own rests on kept mappings
    o.growth_slack = 0;
    o.reserve_limit = 2 * inner->granularity();  // two pages in all
    pool_resource pool(rec, nullptr, o);
    void* l = pool.allocate(4 * MiB);  // two pages of the large arena
    pool.deallocate_checked(l, 0);
    void* small = pool.allocate(512 << 10);  // the small arena takes one of them
    const std::size_t mapped_addresses = rec->at.size();
    pool.deallocate_checked(small, 0);
    void* l2 = pool.allocate(4 * MiB);  // it comes back
    EXPECT_EQ(l2, l);
    pool.check_invariants();
    pool_counters c = pool.counters();
    EXPECT_EQ(c.pages_created, 2u);
    EXPECT_EQ(c.pages_remapped, 2u);
    if (keep) {
      EXPECT_EQ(c.mappings_reused, 1u);
      EXPECT_EQ(c.pages_mapped, 3u);  // two at first, one in the small arena, none on the way back
      EXPECT_EQ(c.pages_unmapped, 0u);
      EXPECT_EQ(rec->at.size(), mapped_addresses);  // the small arena's mapping is kept too
    } else {
      EXPECT_EQ(c.mappings_reused, 0u);
      EXPECT_EQ(c.pages_mapped, 4u);
      EXPECT_EQ(c.pages_unmapped, 2u);
    }
    // Written through the returned address, read back: the mapping is live.
    std::memset(l2, 0x5a, 4 * MiB);
    EXPECT_EQ(static_cast<unsigned char*>(l2)[4 * MiB - 1], 0x5a);
    pool.deallocate_checked(l2, 0);
    pool.release_cached();
    pool.check_invariants();
    EXPECT_EQ(pool.state().reserved_bytes, 0u);
    EXPECT_TRUE(rec->at.empty()) << "mappings left after every page was given back";
    EXPECT_EQ(rec->destroyed_while_mapped, 0);
    EXPECT_EQ(rec->mapped_over, 0);
  }
}

TEST(pool, remaps_free_pages_instead_of_growing) {
  auto dev = std::make_shared<host_page_device>(64 * GiB);
  pool_resource pool(dev, nullptr);
  // A hole pattern that a non-remapping cache could not reuse for a big block.
  std::vector<void*> v;
  for (int i = 0; i < 64; ++i) v.push_back(pool.allocate(8 * MiB));
  for (int i = 0; i < 64; i += 2) pool.deallocate_checked(v[i], 0);
  std::size_t before = pool.state().reserved_bytes;
  void* big = pool.allocate(200 * MiB);
  // Growth is allowed only up to (1 + growth_slack) x the peak of live bytes (512 MiB).
  EXPECT_LE(pool.state().reserved_bytes, std::max<std::size_t>(before, 512 * MiB * 102 / 100 + 2 * MiB))
      << "grew instead of remapping free pages";
  EXPECT_GT(pool.counters().pages_remapped, 0u);
  std::memset(big, 1, 200 * MiB);  // every page of it is really mapped
  pool.check_invariants();
  pool.deallocate_checked(big, 0);
  for (int i = 1; i < 64; i += 2) pool.deallocate_checked(v[i], 0);
}

// When what is free lies only in pages that live blocks share, nothing whole
// can move: the pool grows past its slack and counts those pages. With whole
// free pages in the holes it moves them instead and counts none.
TEST(pool, pages_created_past_the_slack_are_counted) {
  for (std::size_t hole : {std::size_t{3} * MiB / 2, std::size_t{4} * MiB}) {
    SCOPED_TRACE(hole == 4 * MiB ? "holes of two whole pages" : "holes inside shared pages");
    auto dev = std::make_shared<host_page_device>(4 * GiB);
    pool_resource pool(dev, nullptr);
    std::vector<void*> live, holes;
    for (int i = 0; i < 64; ++i) {
      live.push_back(pool.allocate(4 * MiB));
      holes.push_back(pool.allocate(hole));
    }
    live.push_back(pool.allocate(4 * MiB));  // the last block at the top is live
    for (void* h : holes) pool.deallocate_checked(h, 0);
    const pool_counters c0 = pool.counters();
    void* big = pool.allocate(16 * MiB);  // fits no hole: placed at the top, 8 pages to back
    const pool_counters c1 = pool.counters();
    const std::size_t created = c1.pages_created - c0.pages_created;
    const std::size_t past = c1.pages_past_slack - c0.pages_past_slack;
    if (hole == 4 * MiB) {
      EXPECT_EQ(past, 0u);
      EXPECT_GT(c1.pages_remapped, c0.pages_remapped) << "the holes' whole pages should have moved";
    } else {
      EXPECT_EQ(c1.pages_remapped, c0.pages_remapped) << "no hole holds a whole page";
      EXPECT_EQ(created, 8u);
      EXPECT_GT(past, 0u);
      EXPECT_LT(past, created) << "the pages within the slack are not past it";
      const double peak = static_cast<double>(pool.state().peak_live_bytes);
      EXPECT_GT(static_cast<double>(pool.state().reserved_bytes), 1.03 * peak);
    }
    std::memset(big, 7, 16 * MiB);
    pool.check_invariants();
    pool.deallocate_checked(big, 0);
    for (void* p : live) pool.deallocate_checked(p, 0);
    pool.check_invariants();
  }
}

TEST(pool, reserve_limit_and_release_threshold) {
  auto dev = std::make_shared<host_page_device>(4 * GiB);
  pool_options o;
  o.release_threshold = 0;
  pool_resource pool(dev, nullptr, o);
  void* p = pool.allocate(64 * MiB);
  pool.deallocate_checked(p, 0);
  EXPECT_EQ(pool.state().reserved_bytes, 0u) << "release_threshold 0 keeps nothing cached";
  pool.set_reserve_limit(32 * MiB);
  EXPECT_THROW(pool.allocate(40 * MiB), out_of_memory);
  void* q = pool.allocate(30 * MiB);
  pool.deallocate_checked(q, 0);
  EXPECT_THROW(pool.set_reserve_limit(8 * GiB), invalid_argument);
  pool.check_invariants();
}

TEST(pool, streams_do_not_share_blocks_until_their_work_is_done) {
  // Events that complete only when told to.
  struct manual_events : stream_ops {
    bool complete = false;
    event_id record(stream_t) override { return 1; }
    bool done(event_id) override { return complete; }
    void wait(event_id) override { complete = true; }
    void release(event_id) noexcept override {}
  };
  auto ev = std::make_shared<manual_events>();
  auto dev = std::make_shared<host_page_device>(GiB);
  pool_resource pool(dev, ev);
  const stream_t a = 0x10, b = 0x20;
  void* p = pool.allocate(4 * MiB, a);
  pool.deallocate_checked(p, 0, a);
  void* same = pool.allocate(4 * MiB, a);
  EXPECT_EQ(same, p) << "a block freed on a stream is reusable at once on that stream";
  pool.deallocate_checked(same, 0, a);
  void* other = pool.allocate(4 * MiB, b);
  EXPECT_NE(other, p) << "another stream must not reuse it before the event completes";
  pool.deallocate_checked(other, 0, b);
  ev->complete = true;
  pool.check_invariants();
  // record_stream: a block used on b is held until b's event completes.
  ev->complete = false;
  void* r = pool.allocate(2 * MiB, a);
  pool.record_stream(r, b);
  pool.deallocate_checked(r, 0, a);
  EXPECT_EQ(pool.state().pending_free_bytes, 2 * MiB);
  void* r2 = pool.allocate(2 * MiB, a);
  EXPECT_NE(r2, r) << "memory still used on another stream was handed out";
  ev->complete = true;
  pool.deallocate_checked(r2, 0, a);
  void* r3 = pool.allocate(1 * MiB, a);  // processes the pending free
  EXPECT_EQ(pool.state().pending_free_bytes, 0u);
  pool.deallocate_checked(r3, 0, a);
  pool.check_invariants();
}

// page_resource waits for the device before unmapping a freed allocation; a
// device that fails there (its work will never run) does not end the process
// or keep the pages.
TEST(page_resource, a_failing_device_synchronize_still_gives_the_pages_back) {
  struct failing_sync final : test::forwarding_device {
    using forwarding_device::forwarding_device;
    void synchronize() override { throw cuda_error("injected cudaDeviceSynchronize failure", 700); }
    std::string name() const override { return "failing_sync"; }
  };
  auto host = std::make_shared<host_page_device>(GiB);
  page_resource r(std::make_shared<failing_sync>(host));
  void* p = r.allocate(6 * MiB);
  EXPECT_EQ(host->created_bytes(), 6 * MiB);
  r.deallocate(p, 0);
  EXPECT_EQ(host->created_bytes(), 0u);
  EXPECT_EQ(r.state().live_bytes, 0u);
  void* q = r.allocate(2 * MiB);  // and it goes on
  r.deallocate_checked(q, 0);
}

// Event calls that fail (a device error, no event left): a free that cannot
// record its event neither throws nor hands the memory out; the event is
// recorded at a later look, and every event recorded goes back.
TEST(pool, a_free_whose_event_cannot_be_recorded_stays_pending_until_one_is) {
  struct failing_events : stream_ops {
    int record_failures = 0, query_failures = 0, wait_failures = 0, recorded = 0, released = 0;
    bool complete = false, capturing_b = false;
    bool capturing(stream_t s) noexcept override { return capturing_b && s == 0x20; }
    event_id record(stream_t) override {
      if (record_failures > 0 && record_failures--) throw cuda_error("injected cudaEventRecord failure", 700);
      return static_cast<event_id>(++recorded);
    }
    bool done(event_id) override {
      if (query_failures > 0 && query_failures--) throw cuda_error("injected cudaEventQuery failure", 700);
      return complete;
    }
    void wait(event_id) override {
      if (wait_failures > 0 && wait_failures--) throw cuda_error("injected cudaEventSynchronize failure", 700);
      complete = true;
    }
    void release(event_id e) noexcept override {
      EXPECT_NE(e, 0u) << "an event never recorded was released";
      ++released;
    }
  };
  auto ev = std::make_shared<failing_events>();
  auto dev = std::make_shared<host_page_device>(GiB);
  {
    pool_resource pool(dev, ev);
    const stream_t a = 0x10, b = 0x20;
    // A block of stream a used on b too, freed on a with the next `failures` records failing.
    auto free_used_on_b = [&](std::size_t bytes, int failures) {
      void* p = pool.allocate(bytes, a);
      pool.record_stream(p, b);
      ev->record_failures = failures;
      EXPECT_NO_THROW(pool.deallocate_checked(p, 0, a));
      return p;
    };
    void* r = free_used_on_b(2 * MiB, 2);  // failing at the free, and at the next look
    EXPECT_EQ(pool.state().pending_free_bytes, 2 * MiB);
    pool.check_invariants();
    void* r2 = pool.allocate(2 * MiB, a);  // looks at the pending free: the record fails again
    EXPECT_NE(r2, r) << "memory another stream may still use was handed out";
    EXPECT_EQ(ev->recorded, 0);
    void* r3 = pool.allocate(2 * MiB, a);  // recorded now; not done yet
    EXPECT_NE(r3, r);
    EXPECT_EQ(ev->recorded, 1);
    EXPECT_EQ(pool.state().pending_free_bytes, 2 * MiB);
    ev->query_failures = 1;  // a failing query: still pending, no error for the request
    void* r4 = nullptr;
    EXPECT_NO_THROW(r4 = pool.allocate(2 * MiB, a));
    EXPECT_NE(r4, r);
    EXPECT_EQ(pool.state().pending_free_bytes, 2 * MiB);
    ev->complete = true;
    void* r5 = pool.allocate(1 * MiB, a);  // done: the free goes through
    EXPECT_EQ(pool.state().pending_free_bytes, 0u);
    for (void* q : {r2, r3, r4, r5}) pool.deallocate_checked(q, 0, a);
    pool.check_invariants();
    // A free pending when release_cached waits, its record failing there:
    // the error reaches the caller, and the free stays pending, whole.
    ev->complete = false;
    free_used_on_b(4 * MiB, 2);
    EXPECT_THROW(pool.release_cached(), cuda_error);
    EXPECT_EQ(pool.state().pending_free_bytes, 4 * MiB);
    pool.check_invariants();
    pool.release_cached();  // recorded and waited for now
    EXPECT_EQ(pool.state().pending_free_bytes, 0u);
    EXPECT_EQ(pool.state().reserved_bytes, 0u);
    pool.check_invariants();
    // While the other stream is being captured, a later look does not record its event (it would
    // join the graph): the free stays pending until the capture ends.
    ev->complete = true;
    void* c1 = free_used_on_b(2 * MiB, 1);
    ev->capturing_b = true;
    const int rec0 = ev->recorded;
    void* c2 = pool.allocate(2 * MiB, a);
    EXPECT_NE(c2, c1);
    EXPECT_EQ(ev->recorded, rec0);
    EXPECT_EQ(pool.state().pending_free_bytes, 2 * MiB);
    ev->capturing_b = false;
    void* c3 = pool.allocate(1 * MiB, a);  // recorded now, and done
    EXPECT_EQ(ev->recorded, rec0 + 1);
    EXPECT_EQ(pool.state().pending_free_bytes, 0u);
    pool.deallocate_checked(c2, 0, a);
    pool.deallocate_checked(c3, 0, a);
    // A pending free whose event was never recorded, left at the pool's end.
    free_used_on_b(2 * MiB, 1);
  }
  EXPECT_EQ(ev->released, ev->recorded) << "events recorded and never released";
  EXPECT_EQ(dev->created_bytes(), 0u);
  // wait_for_stream gives its event back when the wait fails.
  ev->wait_failures = 1;
  const int before = ev->recorded;
  EXPECT_THROW(ev->wait_for_stream(0x10), cuda_error);
  EXPECT_EQ(ev->recorded, before + 1);
  EXPECT_EQ(ev->released, ev->recorded);
}

// A stream whose work never finishes unless someone waits for it (a GPU far
// behind the host): with wait_to_remap the pool waits and remaps the pages
// that stream freed; without it, it grows.
TEST(pool, wait_to_remap_waits_for_the_stream_instead_of_growing) {
  struct lagging_stream : stream_ops {
    bool complete = false;
    int waits = 0;
    event_id record(stream_t) override { return 1; }
    bool done(event_id) override { return complete; }
    void wait(event_id) override {
      complete = true;
      ++waits;
    }
    void release(event_id) noexcept override {}
  };
  for (bool wait : {false, true}) {
    auto ev = std::make_shared<lagging_stream>();
    auto dev = std::make_shared<host_page_device>(64 * GiB);
    pool_options o;
    o.wait_to_remap = wait;
    o.remap_own = false;  // wait_to_remap alone
    pool_resource pool(dev, ev, o);
    const stream_t s = 0x10;
    std::vector<void*> v;
    for (int i = 0; i < 32; ++i) v.push_back(pool.allocate(8 * MiB, s));
    for (int i = 0; i < 32; i += 2) pool.deallocate_checked(v[i], 0, s);  // 128 MiB in 8 MiB holes
    std::size_t before = pool.state().reserved_bytes;
    void* big = pool.allocate(120 * MiB, s);  // fits no hole
    std::size_t grown = pool.state().reserved_bytes - before;
    if (wait) {
      EXPECT_GE(ev->waits, 1);
      EXPECT_LE(grown, 10 * MiB) << "waited, yet grew by " << grown;
      EXPECT_GT(pool.counters().pages_remapped, 0u);
    } else {
      EXPECT_EQ(ev->waits, 0) << "waited for the stream without wait_to_remap";
      EXPECT_GE(grown, 100 * MiB) << "remapped pages of a stream whose work is not known complete";
    }
    pool.check_invariants();
    ev->complete = true;
    pool.deallocate_checked(big, 0, s);
    for (int i = 1; i < 32; i += 2) pool.deallocate_checked(v[i], 0, s);
    pool.check_invariants();
  }
}

namespace {
// Events completed in the order they were recorded, up to `completed`, which
// the test moves (a GPU behind the host); a wait completes the event and is
// counted.
struct ordered_events : stream_ops {
  event_id recorded = 0, completed = 0;
  int waits = 0;
  event_id record(stream_t) override { return ++recorded; }
  bool done(event_id e) override { return e <= completed; }
  void wait(event_id e) override {
    completed = std::max(completed, e);
    ++waits;
  }
  void release(event_id) noexcept override {}
};
// The remap_own tests' pool: single pages (no chunks) over the host device,
// with `remap_own` on or off.
std::unique_ptr<pool_resource> single_page_pool(std::shared_ptr<stream_ops> events, bool own,
                                                double growth_slack = pool_options{}.growth_slack,
                                                double own_slack = 0.0) {
  pool_options o;
  o.chunk_size = 0;
  o.remap_own = own;
  o.growth_slack = growth_slack;
  o.remap_own_slack = own_slack;
  return std::make_unique<pool_resource>(std::make_shared<host_page_device>(64 * GiB), std::move(events), o);
}
}  // namespace

// remap_own, with a GPU that never finishes anything unless waited for: a
// request past the slack takes the pages its own stream freed without
// waiting, and their old addresses stay mapped. Another stream cannot have
// them. When blocks go back over those old addresses while the work there
// may still run, the pool waits for it first, once.
TEST(pool, remap_own_takes_its_streams_frees_at_once_and_waits_only_to_unmap_their_old_addresses) {
  for (bool own : {false, true}) {
    SCOPED_TRACE(own ? "remap_own" : "default");
    auto ev = std::make_shared<ordered_events>();
    auto owned = single_page_pool(ev, own);
    pool_resource& pool = *owned;
    const stream_t s = 0x10, other = 0x20;
    std::vector<void*> v;
    for (int i = 0; i < 32; ++i) v.push_back(pool.allocate(8 * MiB, s));
    for (int i = 0; i < 32; i += 2) pool.deallocate_checked(v[i], 0, s);  // 128 MiB in 8 MiB holes
    const std::size_t before = pool.state().reserved_bytes;
    void* big = pool.allocate(120 * MiB, s);  // fits no hole
    const std::size_t grown = pool.state().reserved_bytes - before;
    EXPECT_EQ(ev->waits, 0) << "waited for the stream";
    const pool_counters k = pool.counters();
    if (own) {
      EXPECT_LE(grown, 8 * MiB) << "the stream's own frees were there, yet the pool grew by " << grown;
      EXPECT_GE(k.pages_taken_early, 56u);
      EXPECT_EQ(k.pages_unmapped, 0u) << "an address was unmapped under work that may still run";
    } else {
      EXPECT_GE(grown, 100 * MiB);
      EXPECT_EQ(k.pages_taken_early, 0u);
    }
    pool.check_invariants();
    // Another stream: none of those pages, no wait.
    const std::size_t before_other = pool.state().reserved_bytes;
    void* theirs = pool.allocate(64 * MiB, other);
    EXPECT_GE(pool.state().reserved_bytes - before_other, 64 * MiB);
    EXPECT_EQ(pool.counters().pages_taken_early, k.pages_taken_early);
    EXPECT_EQ(ev->waits, 0);
    pool.check_invariants();
    // Blocks of the stream back into the holes: their old mappings go only
    // once the work that freed them is done (waited for once, here).
    std::vector<void*> again;
    for (int i = 0; i < 16; ++i) again.push_back(pool.allocate(8 * MiB, s));
    pool.check_invariants();
    if (own) {
      EXPECT_EQ(pool.counters().early_waits, 1u);
      EXPECT_EQ(ev->waits, 1);
    } else {
      EXPECT_EQ(pool.counters().early_waits, 0u);
    }
    ev->completed = ev->recorded;
    for (void* p : again) pool.deallocate_checked(p, 0, s);
    pool.deallocate_checked(theirs, 0, other);
    pool.deallocate_checked(big, 0, s);
    for (int i = 1; i < 32; i += 2) pool.deallocate_checked(v[i], 0, s);
    pool.check_invariants();
    pool.release_cached();
    EXPECT_EQ(pool.state().reserved_bytes, 0u);
    pool.check_invariants();
  }
}

// remap_own_slack: with the GPU behind, the pool grows up to that bound
// before it takes its own stream's frees early, and takes them past it.
TEST(pool, remap_own_slack_grows_first_up_to_its_bound) {
  for (double bound : {0.0, 0.5}) {
    SCOPED_TRACE(bound);
    auto ev = std::make_shared<ordered_events>();
    auto owned = single_page_pool(ev, true, pool_options{}.growth_slack, bound);
    pool_resource& pool = *owned;
    const stream_t s = 0x10;
    std::vector<void*> v;
    for (int i = 0; i < 32; ++i) v.push_back(pool.allocate(8 * MiB, s));  // 256 MiB
    for (int i = 0; i < 24; ++i) pool.deallocate_checked(v[i], 0, s);    // 64 MiB live, 192 MiB free
    const std::size_t before = pool.state().reserved_bytes;
    void* big = pool.allocate(200 * MiB, s);  // fits no free block; 264 MiB live
    const std::size_t grown = pool.state().reserved_bytes - before;
    const std::size_t early = pool.counters().pages_taken_early;
    if (bound == 0.0) {
      EXPECT_LE(grown, 16 * MiB) << "grew although the stream's own frees were there";
    } else {  // growth up to 1.5 x 264 MiB = 396 MiB reserved, then the frees
      EXPECT_GE(grown, 120 * MiB);
      EXPECT_LE(pool.state().reserved_bytes, 396 * MiB + 4 * MiB);
    }
    EXPECT_GT(early, 0u) << "nothing taken early past the bound";
    EXPECT_EQ(ev->waits, 0);
    pool.check_invariants();
    ev->completed = ev->recorded;
    pool.deallocate_checked(big, 0, s);
    for (int i = 24; i < 32; ++i) pool.deallocate_checked(v[i], 0, s);
    pool.check_invariants();
  }
}

// remap_own: once a reclaim event of the stream has shown the old blocks'
// work done, a block of another stream placed over their old addresses does
// not wait for the later, unrelated work that the early mark's event covers.
TEST(pool, remap_own_does_not_wait_for_work_a_reclaim_showed_done) {
  struct queues : stream_ops {
    std::size_t queued[4] = {}, completed[4] = {};
    int waits = 0;
    event_id record(stream_t s) override { return (static_cast<event_id>(s) << 40) | ++queued[s]; }
    bool done(event_id e) override { return completed[e >> 40] >= (e & ((event_id{1} << 40) - 1)); }
    void wait(event_id e) override {
      ++waits;
      completed[e >> 40] = std::max<std::size_t>(completed[e >> 40], e & ((event_id{1} << 40) - 1));
    }
    void release(event_id) noexcept override {}
  };
  auto g = std::make_shared<queues>();
  auto owned = single_page_pool(g, true, 0.0);
  pool_resource& pool = *owned;
  const stream_t S = 1, T = 2;
  void* a1 = pool.allocate(8 * MiB, S);
  void* a2 = pool.allocate(8 * MiB, S);
  ++g->queued[S];                       // a kernel on a1
  pool.deallocate_checked(a1, 0, S);
  void* u = pool.allocate(4 * MiB, T);  // no fit: a reclaim event on S, after a1's work
  const std::size_t after_a1 = g->queued[S];
  g->queued[S] += 100;                  // long unrelated work on S
  void* y = pool.allocate(12 * MiB, S); // past the slack: a1's pages taken early
  ASSERT_GT(pool.counters().pages_taken_early, 0u);
  g->completed[S] = after_a1;           // the GPU is past a1's work, not past the rest
  void* t = pool.allocate(8 * MiB, T);
  EXPECT_EQ(pool.counters().early_waits, 0u);
  EXPECT_EQ(g->waits, 0) << "stream T's request waited for stream S's unrelated work";
  pool.check_invariants();
  for (auto& c : g->completed) c = std::size_t{1} << 30;
  pool.deallocate_checked(t, 0, T);
  pool.deallocate_checked(y, 0, S);
  pool.deallocate_checked(a2, 0, S);
  pool.deallocate_checked(u, 0, T);
  pool.check_invariants();
}

// gpu_wait_ns: the pool's waits for the GPU, timed. A GPU that takes 3 ms to
// finish what the pool waits for; the remap_own case above waits once.
TEST(pool, gpu_wait_ns_counts_the_time_the_pool_waited_for_the_gpu) {
  struct slow_events : ordered_events {
    void wait(event_id e) override {
      std::this_thread::sleep_for(std::chrono::milliseconds(3));
      ordered_events::wait(e);
    }
  };
  auto ev = std::make_shared<slow_events>();
  auto owned = single_page_pool(ev, true);
  pool_resource& pool = *owned;
  const stream_t s = 0x10;
  std::vector<void*> v;
  for (int i = 0; i < 32; ++i) v.push_back(pool.allocate(8 * MiB, s));
  for (int i = 0; i < 32; i += 2) pool.deallocate_checked(v[i], 0, s);
  void* big = pool.allocate(120 * MiB, s);  // takes the stream's frees early: no wait
  EXPECT_EQ(ev->waits, 0);
  EXPECT_EQ(pool.counters().gpu_wait_ns, 0u);
  std::vector<void*> again;
  for (int i = 0; i < 16; ++i) again.push_back(pool.allocate(8 * MiB, s));  // waits once
  ASSERT_EQ(ev->waits, 1);
  const std::uint64_t w = pool.counters().gpu_wait_ns;
  EXPECT_GE(w, 3'000'000u);
  EXPECT_LT(w, 3'000'000'000u);
  for (void* p : again) pool.deallocate_checked(p, 0, s);
  pool.deallocate_checked(big, 0, s);
  for (int i = 1; i < 32; i += 2) pool.deallocate_checked(v[i], 0, s);
  pool.release_cached();  // waits for the stream's last frees
  ASSERT_GT(ev->waits, 1);
  EXPECT_GE(pool.counters().gpu_wait_ns, w + 3'000'000u * static_cast<std::uint64_t>(ev->waits - 1));
  pool.check_invariants();
}

// A stream being captured into a CUDA graph gets no event and no wait from
// page supply, with remap_own or without: the pool grows instead.
TEST(pool, page_supply_leaves_a_stream_being_captured_alone) {
  struct capture : stream_ops {
    bool on = false;
    int records_while_on = 0, waits = 0;
    event_id record(stream_t) override {
      records_while_on += on;
      return 1;
    }
    bool done(event_id) override { return false; }
    void wait(event_id) override { ++waits; }
    void release(event_id) noexcept override {}
    bool capturing(stream_t) noexcept override { return on; }
  };
  for (bool own : {false, true}) {
    SCOPED_TRACE(own ? "remap_own" : "default");
    auto g = std::make_shared<capture>();
    auto owned = single_page_pool(g, own, 0.0);
    pool_resource& pool = *owned;
    void* a = pool.allocate(8 * MiB, 1);
    void* b = pool.allocate(8 * MiB, 1);
    pool.deallocate_checked(a, 0, 1);
    g->on = true;
    void* y = pool.allocate(12 * MiB, 1);
    EXPECT_EQ(g->records_while_on, 0);
    EXPECT_EQ(g->waits, 0);
    EXPECT_EQ(pool.counters().pages_taken_early, 0u);
    pool.check_invariants();
    g->on = false;
    pool.deallocate_checked(y, 0, 1);
    pool.deallocate_checked(b, 0, 1);
  }
}

// A GPU that runs behind the host but keeps moving: the event a reclaim
// records when pages are needed is not done yet, but the progress events the
// pool recorded at earlier frees are. The pages of blocks freed before the
// last completed one are remapped instead of growing; with a GPU that never
// finishes anything, the pool grows.
TEST(pool, progress_events_let_a_stream_behind_the_host_lend_its_finished_frees) {
  for (bool moving : {true, false}) {
    auto ev = std::make_shared<ordered_events>();
    pool_options o;
    o.remap_own = false;  // progress events alone: remap_own would take the own frees anyway
    pool_resource pool(std::make_shared<host_page_device>(64 * GiB), ev, o);
    const stream_t s = 0x10;
    std::vector<void*> v;
    for (int i = 0; i < 160; ++i) v.push_back(pool.allocate(4 * MiB, s));
    for (int i = 0; i < 160; i += 2) {
      if (moving) ev->completed = ev->recorded;  // all work queued before this free is done
      pool.deallocate_checked(v[i], 0, s);  // 320 MiB in 4 MiB holes
    }
    const std::size_t before = pool.state().reserved_bytes;
    void* big = pool.allocate(120 * MiB, s);  // fits no hole
    const std::size_t grown = pool.state().reserved_bytes - before;
    EXPECT_EQ(ev->waits, 0) << "waited for the stream";
    if (moving) {
      EXPECT_LE(grown, 16 * MiB) << "finished frees were known, yet the pool grew by " << grown;  // slack + edges
      EXPECT_GT(pool.counters().pages_remapped, 0u);
      EXPECT_GT(pool.counters().stream_reclaims, 0u);
    } else {
      EXPECT_GE(grown, 100 * MiB) << "remapped pages of a stream whose work is not known complete";
      EXPECT_EQ(pool.counters().pages_remapped, 0u);
    }
    pool.check_invariants();
    ev->completed = ev->recorded;
    pool.deallocate_checked(big, 0, s);
    for (int i = 1; i < 160; i += 2) pool.deallocate_checked(v[i], 0, s);
    pool.check_invariants();
  }
}

namespace {
// Events in stream order; an event recorded while `capturing` is a captured
// event: querying or waiting on it fails the way cudaEventQuery does with
// cudaErrorCapturedEvent (907) until it is re-recorded (never, here).
struct capture_sim : stream_ops {
  event_id recorded = 0, completed = 0;
  bool capturing = false;
  bool record_fails = false;
  std::set<event_id> captured;
  long records = 0, dones = 0, out = 0;
  event_id record(stream_t) override {
    ++records;
    if (record_fails) throw cuda_error("cudaEventRecord: invalid resource handle (simulated)", 400);
    ++out;
    ++recorded;
    if (capturing) captured.insert(recorded);
    return recorded;
  }
  bool done(event_id e) override {
    ++dones;
    if (captured.count(e)) throw cuda_error("cudaEventQuery: cudaErrorCapturedEvent (simulated)", 907);
    return e <= completed;
  }
  void wait(event_id e) override {
    if (captured.count(e)) throw cuda_error("cudaEventSynchronize: cudaErrorCapturedEvent (simulated)", 907);
    completed = std::max(completed, e);
  }
  void release(event_id e) noexcept override {
    --out;
    captured.erase(e);
  }
};
}  // namespace

// A progress event that cannot be queried (recorded in a capture the pool was
// not told about, or any lasting cudaEventQuery error) is dropped: the
// allocations that need pages grow instead of throwing.
TEST(pool, an_unqueryable_progress_event_is_dropped_and_the_pool_grows) {
  auto ev = std::make_shared<capture_sim>();
  pool_resource pool(std::make_shared<host_page_device>(64 * GiB), ev);
  const stream_t s = 0x10;
  std::vector<void*> v;
  for (int i = 0; i < 160; ++i) v.push_back(pool.allocate(4 * MiB, s));
  ev->capturing = true;  // a capture of s the pool is not told about
  pool.deallocate_checked(v[0], 0, s);  // note_progress records the progress event inside it
  ev->capturing = false;                // the capture ends
  for (int i = 2; i < 160; i += 2) {
    ev->completed = ev->recorded;  // the GPU keeps up
    pool.deallocate_checked(v[i], 0, s);
  }
  // The GPU is a little behind: the event reclaim records now is not done.
  void* big = nullptr;
  EXPECT_NO_THROW(big = pool.allocate(120 * MiB, s)) << "an allocation that could grow threw";
  // And it stays that way: later allocations throw as well.
  void* big2 = nullptr;
  EXPECT_NO_THROW(big2 = pool.allocate(120 * MiB, s));
  ev->completed = ev->recorded;
  pool.deallocate_checked(big, 0, s);
  pool.deallocate_checked(big2, 0, s);
  for (int i = 1; i < 160; i += 2) pool.deallocate_checked(v[i], 0, s);
  pool.check_invariants();
}

// Frees record at most one progress event per 32 frees and query it at most
// every 8th free (a cudaEventQuery under the pool lock), however far behind
// the GPU is.
TEST(pool, frees_query_the_progress_event_at_most_every_eighth_free) {
  auto ev = std::make_shared<capture_sim>();
  pool_resource pool(std::make_shared<host_page_device>(64 * GiB), ev);
  const stream_t s = 0x10;
  std::vector<void*> v;
  for (int i = 0; i < 1000; ++i) v.push_back(pool.allocate(64 * 1024, s));
  const long d0 = ev->dones, r0 = ev->records;
  for (void* p : v) pool.deallocate_checked(p, 0, s);  // GPU never catches up
  EXPECT_LE(ev->dones - d0, 1000 / 8 + 1) << "event queries on the free path";
  EXPECT_LE(ev->records - r0, 1000 / 32 + 1) << "records per free";
}

// A record that fails (for example on a stream of another device) is tried
// again only 8 frees later, not at every free.
TEST(pool, a_failing_progress_record_is_not_retried_at_every_free) {
  auto ev = std::make_shared<capture_sim>();
  pool_resource pool(std::make_shared<host_page_device>(64 * GiB), ev);
  const stream_t s = 0;
  std::vector<void*> v;
  for (int i = 0; i < 1000; ++i) v.push_back(pool.allocate(64 * 1024, s));
  ev->record_fails = true;
  const long r0 = ev->records;
  for (void* p : v) pool.deallocate_checked(p, 0, s);
  EXPECT_LE(ev->records - r0, 1000 / 8 + 1) << "record attempts per free";
}

// A stream being captured into a CUDA graph gets no event from the pool's
// non-blocking paths (an event recorded there joins the graph and cannot be
// queried): neither a free on it (progress events) nor another stream's
// request that looks for its finished frees. Once the capture ends, they are
// reclaimed as before.
TEST(pool, a_stream_being_captured_gets_no_event) {
  struct capture_streams : stream_ops {
    stream_t captured = 0;  // the stream being captured (0: none)
    long records_in_capture = 0, out = 0;
    event_id record(stream_t s) override {
      if (captured && s == captured) ++records_in_capture;
      ++out;
      return 1;
    }
    bool done(event_id) override { return true; }
    void wait(event_id) override {}
    void release(event_id) noexcept override { --out; }
    bool capturing(stream_t s) noexcept override { return captured && s == captured; }
  };
  auto ev = std::make_shared<capture_streams>();
  pool_resource pool(std::make_shared<host_page_device>(64 * GiB), ev);
  const stream_t a = 0x10, b = 0x20;
  std::vector<void*> v;
  for (int i = 0; i < 80; ++i) v.push_back(pool.allocate(4 * MiB, a));
  void* warm = pool.allocate(4 * MiB, b);  // b has a slot (and nothing free in it)
  const std::size_t reclaims = pool.counters().stream_reclaims;
  ev->captured = a;
  for (int i = 0; i < 80; i += 2) pool.deallocate_checked(v[i], 0, a);  // frees on a, during its capture
  void* big = pool.allocate(120 * MiB, b);                                // fits nothing b may take
  EXPECT_EQ(ev->records_in_capture, 0) << "an event was recorded on the stream being captured";
  EXPECT_EQ(pool.counters().stream_reclaims, reclaims) << "frees of the stream being captured were handed on";
  pool.check_invariants();
  ev->captured = 0;  // the capture ends
  void* big2 = pool.allocate(120 * MiB, b);
  EXPECT_GT(pool.counters().stream_reclaims, reclaims) << "a's frees were not handed on after the capture";
  pool.deallocate_checked(big, 0, b);
  pool.deallocate_checked(big2, 0, b);
  pool.deallocate_checked(warm, 0, b);
  for (int i = 1; i < 80; i += 2) pool.deallocate_checked(v[i], 0, a);
  pool.check_invariants();
}

// A block too large for the stream's own free block at the edge of mapped
// memory takes that block's pages and fresh ones past the edge (the address
// space there is shared), without waiting for the stream and without growing
// by its whole size; another stream may not take that block while the first
// stream's work on it may be queued.
TEST(pool, a_block_at_the_edge_of_mapped_memory_takes_the_free_pages_below_it) {
  struct lagging_stream : stream_ops {
    int waits = 0;
    event_id record(stream_t) override { return 1; }
    bool done(event_id) override { return false; }
    void wait(event_id) override { ++waits; }
    void release(event_id) noexcept override {}
  };
  auto ev = std::make_shared<lagging_stream>();
  pool_resource pool(std::make_shared<host_page_device>(GiB), ev);
  const stream_t s = 0x10, other = 0x20;
  void* a = pool.allocate(8 * MiB, s);
  void* t = pool.allocate(40 * MiB, s);
  pool.deallocate_checked(t, 0, s);  // its work may still be queued on s
  std::size_t before = pool.state().reserved_bytes;
  void* big = pool.allocate(48 * MiB, s);
  EXPECT_EQ(big, t) << "placed past the edge instead of over the stream's own free pages";
  EXPECT_EQ(pool.state().reserved_bytes - before, 8 * MiB) << "only the pages past the edge are new";
  EXPECT_EQ(ev->waits, 0);
  EXPECT_EQ(pool.counters().pages_remapped, 0u);
  pool.check_invariants();
  pool.deallocate_checked(big, 0, s);
  before = pool.state().reserved_bytes;
  void* b2 = pool.allocate(56 * MiB, other);
  auto lo = reinterpret_cast<std::uintptr_t>(b2), hi = lo + 56 * MiB;
  auto t0 = reinterpret_cast<std::uintptr_t>(t);
  EXPECT_TRUE(hi <= t0 || lo >= t0 + 48 * MiB) << "another stream got memory the first stream's queued work may use";
  EXPECT_EQ(pool.state().reserved_bytes - before, 56 * MiB);
  EXPECT_EQ(ev->waits, 0);
  pool.check_invariants();
  pool.deallocate_checked(b2, 0, other);
  pool.deallocate_checked(a, 0, s);
  pool.check_invariants();
}

TEST(pool, eight_threads_stress) {
  auto dev = std::make_shared<host_page_device>(32 * GiB);
  auto pool = std::make_shared<pool_resource>(dev, nullptr);
  statistics_adaptor stats(pool);
  std::atomic<int> bad{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 8; ++t)
    ts.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      std::vector<std::pair<void*, std::size_t>> mine;
      for (int i = 0; i < 4000; ++i) {
        if (mine.size() < 32 && (mine.empty() || rng() % 2)) {
          std::size_t n = random_size(rng, 256, 16 * MiB);
          auto* p = static_cast<unsigned char*>(stats.allocate(n, static_cast<stream_t>(t % 3)));
          p[0] = static_cast<unsigned char>(t);
          p[n - 1] = static_cast<unsigned char>(t);
          mine.emplace_back(p, n);
        } else {
          std::size_t k = rng() % mine.size();
          auto [p, n] = mine[k];
          auto* c = static_cast<unsigned char*>(p);
          if (c[0] != t || c[n - 1] != t) ++bad;
          stats.deallocate(p, n, static_cast<stream_t>(t % 3));
          mine[k] = mine.back();
          mine.pop_back();
        }
      }
      for (auto [p, n] : mine) stats.deallocate(p, n, static_cast<stream_t>(t % 3));
    });
  for (auto& th : ts) th.join();
  EXPECT_EQ(bad.load(), 0) << "a block was handed to two threads at once";
  EXPECT_EQ(stats.stats().allocated_bytes.current, 0);
  pool->check_invariants();
}

TEST(options, parse_and_validate) {
  pool_options o;
  o.parse("alignment:512, growth_slack:0.1,remap:false,release_threshold:1GiB,page_size:2MiB,wait_to_remap:true");
  EXPECT_EQ(o.alignment, 512u);
  EXPECT_DOUBLE_EQ(o.growth_slack, 0.1);
  EXPECT_FALSE(o.remap);
  EXPECT_TRUE(o.wait_to_remap);
  EXPECT_EQ(o.release_threshold, GiB);
  pool_options keep = o;
  EXPECT_THROW(o.parse("alignment:100"), invalid_argument);
  EXPECT_THROW(o.parse("bogus:1"), invalid_argument);
  EXPECT_THROW(o.parse("growth_slack:abc"), invalid_argument);
  EXPECT_THROW(o.parse("release_threshold:12 parsecs"), invalid_argument);
  EXPECT_THROW(o.parse("alignment"), invalid_argument);
  EXPECT_EQ(o.alignment, keep.alignment) << "a bad option string changes nothing";
  EXPECT_EQ(parse_size("1.5GiB"), std::size_t{3} << 29);
  EXPECT_EQ(parse_size("256MB"), 256000000u);
  EXPECT_THROW(parse_size("-5"), invalid_argument);
  EXPECT_THROW(host_page_device(1000), invalid_argument);
}

TEST(statistics, counts_and_peaks) {
  auto pool = std::make_shared<pool_resource>(std::make_shared<host_page_device>(GiB), nullptr);
  statistics_adaptor s(pool);
  void* a = s.allocate(1000);
  void* b = s.allocate(3 * MiB);
  auto st = s.stats();
  EXPECT_EQ(st.allocated_bytes.current, 1000 + 3 * MiB);
  EXPECT_EQ(st.allocation_count.current, 2);
  EXPECT_GE(st.reserved_bytes.current, st.allocated_bytes.current);
  s.deallocate(b, 3 * MiB);
  st = s.stats();
  EXPECT_EQ(st.allocated_bytes.current, 1000);
  EXPECT_EQ(st.allocated_bytes.peak, 1000 + 3 * MiB);
  s.reset_peaks();
  EXPECT_EQ(s.stats().allocated_bytes.peak, 1000);
  EXPECT_THROW(s.allocate(std::size_t{1} << 40), out_of_memory);
  EXPECT_EQ(s.stats().num_ooms, 1u);
  s.deallocate(a, 1000);
  EXPECT_THROW(s.deallocate_checked(a, 1000), invalid_argument);
  EXPECT_EQ(s.stats().num_bad_frees, 1u);
}

}  // namespace

TEST(pool, a_page_size_other_than_the_devices_pages_is_refused) {
  auto dev = std::make_shared<host_page_device>(std::size_t{1} << 30, 2 * MiB);
  pool_options o;
  o.page_size = 8 * MiB;  // a multiple, but each device page would back only a quarter of it
  EXPECT_THROW(pool_resource(dev, nullptr, o), invalid_argument);
  o.page_size = 2 * MiB;
  EXPECT_NO_THROW(pool_resource(dev, nullptr, o));
  auto dev8 = std::make_shared<host_page_device>(std::size_t{1} << 30, 8 * MiB);
  o.page_size = 8 * MiB;
  pool_resource p(dev8, nullptr, o);
  void* a = p.allocate(20 * MiB);
  std::memset(a, 1, 20 * MiB);  // every byte backed
  p.deallocate(a, 20 * MiB);
}
