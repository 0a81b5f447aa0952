// A replay can be stopped between ops (Ctrl-C in Python), and leaves nothing allocated.
#include <gtest/gtest.h>

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
