// tracking_adaptor: the live table, the event ring, site hooks, bad frees and
// concurrent use.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "vramkit/mr/guard_adaptor.hpp"
#include "vramkit/mr/pool_resource.hpp"
#include "vramkit/mr/tracking_adaptor.hpp"
#include "vramkit/platform/host_page_device.hpp"
#include "vramkit/runtime.hpp"

using namespace vramkit;

namespace {

std::shared_ptr<device_resource> host_pool() {
  return std::make_shared<pool_resource>(std::make_shared<host_page_device>(std::size_t{1} << 32), nullptr);
}

std::uint32_t g_site = 0;
std::uint32_t test_hook() { return g_site; }

}  // namespace

TEST(Tracking, LiveTableFollowsAllocAndFree) {
  tracking_adaptor t(host_pool(), &test_hook, 16);
  g_site = 7;
  void* a = t.allocate(1000, 5);
  g_site = 9;
  void* b = t.allocate(3000);
  EXPECT_EQ(t.allocate(0), nullptr);
  auto live = t.live();
  ASSERT_EQ(live.size(), 2u);
  EXPECT_EQ(live[0].ptr, reinterpret_cast<std::uintptr_t>(a));
  EXPECT_EQ(live[0].size, 1000u);
  EXPECT_EQ(live[0].stream, 5u);
  EXPECT_EQ(live[0].site, 7u);
  EXPECT_EQ(live[1].site, 9u);
  EXPECT_LT(live[0].seq, live[1].seq);
  EXPECT_LE(live[0].time_ns, live[1].time_ns);
  auto c = t.counts();
  EXPECT_EQ(c.live_count, 2u);
  EXPECT_EQ(c.live_bytes, 4000u);
  std::uint64_t m = t.mark();
  void* d = t.allocate(10);
  EXPECT_EQ(t.live_since(m).size(), 1u);
  t.deallocate(a, 1000, 5);
  t.deallocate(d, 10);
  live = t.live();
  ASSERT_EQ(live.size(), 1u);
  EXPECT_EQ(live[0].ptr, reinterpret_cast<std::uintptr_t>(b));
  tracked_allocation rec;
  EXPECT_TRUE(t.find(b, rec));
  EXPECT_EQ(rec.size, 3000u);
  EXPECT_FALSE(t.find(a, rec));
  t.deallocate(b, 3000);
  c = t.counts();
  EXPECT_EQ(c.live_count, 0u);
  EXPECT_EQ(c.live_bytes, 0u);
  EXPECT_EQ(c.allocs, 3u);
  EXPECT_EQ(c.frees, 3u);
}

TEST(Tracking, EventRingKeepsTheNewest) {
  tracking_adaptor t(host_pool(), nullptr, 4);
  std::vector<void*> ps;
  for (int i = 0; i < 3; ++i) ps.push_back(t.allocate(256 * (i + 1)));
  for (void* p : ps) t.deallocate(p, 0);
  auto ev = t.events();
  ASSERT_EQ(ev.size(), 4u);
  EXPECT_EQ(ev[0].action, tracking_event::alloc);
  EXPECT_EQ(ev[0].size, 768u);
  EXPECT_EQ(ev[1].action, tracking_event::free);
  EXPECT_EQ(ev[1].ptr, reinterpret_cast<std::uintptr_t>(ps[0]));
  EXPECT_EQ(ev[3].ptr, reinterpret_cast<std::uintptr_t>(ps[2]));
  EXPECT_EQ(ev[3].size, 768u);
  EXPECT_EQ(t.counts().events_dropped, 2u);
  tracking_adaptor off(host_pool(), nullptr, 0);
  off.deallocate(off.allocate(64), 0);
  EXPECT_TRUE(off.events().empty());
}

TEST(Tracking, BadFreeChangesNothingAndUntrackedFreesPassOn) {
  auto pool = host_pool();
  void* before = pool->allocate(512);
  tracking_adaptor t(pool);
  void* a = t.allocate(512);
  int x = 0;
  EXPECT_NE(t.try_deallocate(&x, 4, 0), free_status::ok);
  EXPECT_EQ(t.live().size(), 1u);
  EXPECT_EQ(t.try_deallocate(a, 512, 0), free_status::ok);
  EXPECT_NE(t.try_deallocate(a, 512, 0), free_status::ok);  // double free
  EXPECT_EQ(t.try_deallocate(before, 512, 0), free_status::ok);
  auto c = t.counts();
  EXPECT_EQ(c.frees, 1u);
  EXPECT_EQ(c.untracked_frees, 1u);
  EXPECT_EQ(c.live_count, 0u);
  EXPECT_EQ(t.name(), "tracking(" + pool->name() + ")");
  EXPECT_EQ(t.state().live_bytes, pool->state().live_bytes);
}

TEST(Tracking, ResetForgetsButFreesStillWork) {
  tracking_adaptor t(host_pool());
  void* a = t.allocate(4096);
  std::uint64_t m = t.mark();
  t.reset();
  EXPECT_TRUE(t.live().empty());
  EXPECT_GE(t.mark(), m);
  t.deallocate(a, 4096);
  EXPECT_EQ(t.counts().untracked_frees, 1u);
  EXPECT_THROW(tracking_adaptor(nullptr), invalid_argument);
}

TEST(Tracking, ConcurrentThreadsKeepTheTableExact) {
  auto t = std::make_shared<tracking_adaptor>(host_pool(), nullptr, 1000);
  std::vector<std::thread> th;
  for (int k = 0; k < 4; ++k)
    th.emplace_back([&, k] {
      std::vector<void*> keep;
      for (int i = 0; i < 2000; ++i) {
        void* p = t->allocate(256 + 64 * (i % 7));
        if (i % 10 == k) keep.push_back(p);
        else t->deallocate(p, 0);
      }
      for (std::size_t i = 0; i < keep.size() / 2; ++i) t->deallocate(keep[i], 0);
    });
  for (auto& x : th) x.join();
  auto c = t->counts();
  EXPECT_EQ(c.allocs, 8000u);
  EXPECT_EQ(c.live_count, 4u * 100u);
  EXPECT_EQ(t->live().size(), c.live_count);
  std::size_t bytes = 0;
  for (auto& r : t->live()) bytes += r.size;
  EXPECT_EQ(bytes, c.live_bytes);
  for (auto& r : t->live()) t->deallocate(reinterpret_cast<void*>(r.ptr), 0);
  EXPECT_EQ(t->counts().live_count, 0u);
}

TEST(Guard, RedZonesAndQuarantine) {
  if (current_backend() != backend::host) GTEST_SKIP() << "writes through host pointers";
  guard_adaptor g(host_pool(), 256, 2);
  auto* p = static_cast<unsigned char*>(g.allocate(100));
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 256, 0u);
  EXPECT_EQ(g.allocation_size(p), 100u);
  p[99] = 1;
  EXPECT_TRUE(g.check_guards().empty());
  p[100] = 1;
  p[-1] = 1;
  auto v = g.check_guards();
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].where, guard_violation::before);
  EXPECT_EQ(v[1].where, guard_violation::after);
  EXPECT_EQ(v[1].offset, 100u);
  EXPECT_NE(v[1].describe().find("overrun"), std::string::npos);
  g.deallocate(p, 100);
  p[5] = 3;
  v = g.check_guards();
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].where, guard_violation::use_after_free);
  EXPECT_EQ(v[0].offset, 5u);
  int x = 0;
  EXPECT_EQ(g.try_deallocate(&x, 4, 0), free_status::not_owned);
  EXPECT_THROW(guard_adaptor(host_pool(), 100), invalid_argument);
}
