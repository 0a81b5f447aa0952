// A replay can be stopped between ops (Ctrl-C in Python), and leaves nothing allocated.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "vramkit/mr/pool_resource.hpp"
#include "vramkit/platform/host_page_device.hpp"
#include "vramkit/trace/replay.hpp"

using namespace vramkit;

namespace {
// n live-at-once allocations, freed in the second half: stopping in the middle leaves them live.
std::vector<trace_op> ramp(std::size_t n) {
  std::vector<trace_op> ops;
  for (std::size_t i = 0; i < n; ++i) ops.push_back({trace_op::alloc, 0, 0, i, 4096 + 256 * (i % 7)});
  for (std::size_t i = 0; i < n; ++i) ops.push_back({trace_op::free, 0, 0, i, 0});
  return ops;
}
}  // namespace

TEST(ReplayInterrupt, StopsAtAPollAndFreesEverything) {
  auto pool = std::make_shared<pool_resource>(std::make_shared<host_page_device>(std::size_t{1} << 30), nullptr);
  auto ops = ramp(10000);
  replay_options o;
  o.passes = 50;
  o.interrupt_every = 1000;
  int polls = 0;
  o.interrupted = [&] { return ++polls == 7; };  // in the first pass, with 7000 allocations live
  EXPECT_THROW(replay(ops, *pool, o), replay_interrupted);
  EXPECT_EQ(polls, 7);
  EXPECT_EQ(pool->state().live_bytes, 0u);
  pool->check_invariants();
}

TEST(ReplayInterrupt, PolledInWarmAndSamplingPasses) {
  auto pool = std::make_shared<pool_resource>(std::make_shared<host_page_device>(std::size_t{1} << 30), nullptr);
  auto ops = ramp(1000);
  replay_options o;
  o.passes = 3;
  o.interrupt_every = 100;
  o.sample_every = 10;
  o.sample = [](std::size_t, const memory_state&) {};
  int polls = 0;
  o.interrupted = [&] { return ++polls > 1000; };
  replay(ops, *pool, o);
  EXPECT_EQ(polls, 4 * 20);  // 3 timed passes and the sampling pass, 2000 ops each
  int stop_at = 70;  // inside the sampling pass
  polls = 0;
  o.interrupted = [&] { return ++polls == stop_at; };
  EXPECT_THROW(replay(ops, *pool, o), replay_interrupted);
  EXPECT_EQ(pool->state().live_bytes, 0u);
}

namespace {
// Hands out fresh addresses for every request and never reuses one: what it
// reserves grows by the same amount in every pass of a replay.
class never_reuses : public device_resource {
 public:
  free_status try_deallocate(void* ptr, std::size_t, stream_t) noexcept override {
    auto it = live_.find(ptr);
    if (it == live_.end()) return free_status::not_owned;
    s_.live_bytes -= it->second;
    --s_.live_count;
    live_.erase(it);
    return free_status::ok;
  }
  memory_state state() const override { return s_; }
  void reset_peaks() override {
    s_.peak_live_bytes = s_.live_bytes;
    s_.peak_reserved_bytes = s_.reserved_bytes;
  }
  int device() const noexcept override { return 0; }
  std::string name() const override { return "never_reuses"; }
  bool backs_memory() const noexcept override { return false; }

 protected:
  void* do_allocate(std::size_t bytes, stream_t) override {
    void* p = reinterpret_cast<void*>(next_);
    next_ += (bytes + 255) / 256 * 256;
    s_.reserved_bytes += bytes;
    s_.live_bytes += bytes;
    ++s_.live_count;
    s_.peak_live_bytes = std::max(s_.peak_live_bytes, s_.live_bytes);
    s_.peak_reserved_bytes = std::max(s_.peak_reserved_bytes, s_.reserved_bytes);
    live_[p] = bytes;
    return p;
  }

 private:
  std::uintptr_t next_ = std::uintptr_t{1} << 40;
  memory_state s_;
  std::map<void*, std::size_t> live_;
};
}  // namespace

// fragmentation is the first pass's; fragmentation_all_passes counts what
// later passes made the resource reserve on top of it.
TEST(ReplayPeaks, AllPassesCountsGrowthAfterTheFirstPass) {
  never_reuses r;
  auto ops = ramp(100);  // 100 live at once: peak live is the sum of the sizes
  std::size_t sum = 0;
  for (auto& op : ops)
    if (op.action == trace_op::alloc) sum += op.size;
  replay_options o;
  o.passes = 4;
  auto res = replay(ops, r, o);
  EXPECT_EQ(res.peak_live_bytes, sum);
  EXPECT_EQ(res.peak_reserved_bytes, sum);
  EXPECT_DOUBLE_EQ(res.fragmentation, 1.0);
  EXPECT_EQ(res.peak_reserved_all_passes_bytes, 4 * sum);
  EXPECT_DOUBLE_EQ(res.fragmentation_all_passes, 4.0);
  o.passes = 1;
  res = replay(ops, r, o);  // one pass: the two figures are the same
  EXPECT_EQ(res.peak_reserved_all_passes_bytes, res.peak_reserved_bytes);
  EXPECT_DOUBLE_EQ(res.fragmentation_all_passes, res.fragmentation);
}

// The pool on a trace whose passes repeat exactly: never below the first
// pass's peak, and what the pool's own peak says.
TEST(ReplayPeaks, PoolAllPassesIsItsPeakReserved) {
  auto pool = std::make_shared<pool_resource>(std::make_shared<host_page_device>(std::size_t{1} << 30), nullptr);
  auto ops = ramp(2000);
  replay_options o;
  o.passes = 3;
  auto res = replay(ops, *pool, o);
  EXPECT_GE(res.peak_reserved_all_passes_bytes, res.peak_reserved_bytes);
  EXPECT_EQ(res.peak_reserved_all_passes_bytes, pool->state().peak_reserved_bytes);
  EXPECT_GT(res.fragmentation_all_passes, 0.0);
  pool->check_invariants();
}
