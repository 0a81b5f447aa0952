// plan_steps: a program marks where each step begins; the pool records one
// step's large requests, lays them out at fixed offsets, and places later
// steps' requests there. Host page device (real mmap'd pages: every block is
// written and read back, so an overlap would show).
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "vramkit/mr/pool_resource.hpp"
#include "vramkit/platform/host_page_device.hpp"

using namespace vramkit;

namespace {
constexpr std::size_t MiB = std::size_t{1} << 20, GiB = std::size_t{1} << 30;

struct held {
  void* p;
  std::size_t n;
  std::uint8_t tag;
};

// One byte a 4 KiB page and the last: enough to see a block written over another.
void fill(held& h) {
  auto* b = static_cast<std::uint8_t*>(h.p);
  for (std::size_t i = 0; i < h.n; i += 4096) b[i] = h.tag;
  b[h.n - 1] = h.tag;
}
void check_fill(const held& h) {
  const auto* b = static_cast<const std::uint8_t*>(h.p);
  for (std::size_t i = 0; i < h.n; i += 4096) ASSERT_EQ(b[i], h.tag) << "block at " << h.p << " overwritten";
  ASSERT_EQ(b[h.n - 1], h.tag);
}

// A training-like step: activations allocated in the forward order and freed
// in reverse while gradients of other sizes come and go; the loss of a step
// lives into the next one. `scale` changes the activations' sizes.
struct program {
  pool_resource& pool;
  stream_t stream = 0;
  std::vector<held> weights;
  held carried{nullptr, 0, 0};  // lives across the step boundary
  bool keep_output = false;     // each step's output lives until the next step has made its own
  held output{nullptr, 0, 0};
  std::uint8_t tag = 1;
  std::vector<void*> addresses;  // this step's large requests, in order

  held take(std::size_t n) {
    held h{pool.allocate(n, stream), n, tag++};
    if (tag == 0) tag = 1;
    fill(h);
    if (n > pool.options().small_threshold) addresses.push_back(h.p);
    return h;
  }
  void give(held& h) {
    check_fill(h);
    pool.deallocate_checked(h.p, h.n, stream);
  }
  void setup() {
    for (std::size_t n : {24 * MiB, 40 * MiB, 8 * MiB}) weights.push_back(take(n));
  }
  // Gives back the weights and the block carried over: nothing of the program stays live.
  void finish() {
    for (auto& w : weights) give(w);
    weights.clear();
    if (carried.p) give(carried);
    carried.p = nullptr;
    if (output.p) give(output);
    output.p = nullptr;
  }
  void step(double scale = 1.0) {
    addresses.clear();
    if (carried.p) give(carried);
    std::vector<held> acts;
    const std::size_t sizes[] = {12, 20, 6, 33, 3, 17, 9, 26};
    for (std::size_t s : sizes) acts.push_back(take(static_cast<std::size_t>(static_cast<double>(s * MiB) * scale)));
    if (keep_output) {  // as logits: made at the forward's end, the last step's given back only then
      held out = take(30 * MiB);
      if (output.p) give(output);
      output = out;
    }
    held small = take(64 * 1024);  // small requests are not planned
    std::vector<held> grads;
    for (std::size_t i = acts.size(); i-- > 0;) {
      grads.push_back(take(weights[i % weights.size()].n / 4 + MiB));
      give(acts[i]);
      if (grads.size() > 2) {
        give(grads.front());
        grads.erase(grads.begin());
      }
    }
    for (auto& g : grads) give(g);
    give(small);
    carried = take(5 * MiB);
  }
};

// The plan made as soon as it is laid out (plan_needs_moves:false): the host
// program's steps settle without a plan, so under the default the tests of the
// plan itself would never see one (the plan_needs_moves tests below set it).
pool_options planned() {
  pool_options o;
  o.plan_steps = true;
  o.plan_needs_moves = false;
  return o;
}

// A pool with plan_steps (and options o) on a 4 GiB host device, and the program with its weights.
struct planned_program {
  std::shared_ptr<host_page_device> dev = std::make_shared<host_page_device>(4 * GiB);
  pool_resource pool;
  program prog{pool};
  explicit planned_program(const pool_options& o = planned()) : pool{dev, nullptr, o} { prog.setup(); }
};

// n marked steps of the program.
void run_steps(pool_resource& pool, program& prog, int n, double scale = 1.0) {
  for (int s = 0; s < n; ++s) {
    pool.mark_step();
    prog.step(scale);
  }
}
}  // namespace

TEST(plan_steps, a_repeating_step_moves_no_page_once_planned) {
  planned_program t;
  auto& pool = t.pool;
  auto& prog = t.prog;
  std::vector<void*> first_planned;
  std::size_t peak_live = 0;
  for (int s = 0; s < 10; ++s) {
    pool.mark_step();
    auto c0 = pool.counters();
    prog.step();
    auto c1 = pool.counters();
    peak_live = std::max(peak_live, pool.state().peak_live_bytes);
    pool.check_invariants();
    if (s >= 3) {  // warming, recording, following, then the plan
      EXPECT_EQ(c1.plan_missed, c0.plan_missed) << "step " << s;
      EXPECT_EQ(c1.plan_placed - c0.plan_placed, prog.addresses.size()) << "step " << s;
    }
    if (s == 3) first_planned = prog.addresses;
    if (s >= 4) {
      EXPECT_EQ(c1.pages_mapped, c0.pages_mapped) << "step " << s << " mapped pages";
      EXPECT_EQ(c1.pages_unmapped, c0.pages_unmapped) << "step " << s << " unmapped pages";
      EXPECT_EQ(c1.pages_created, c0.pages_created) << "step " << s << " created pages";
      EXPECT_EQ(prog.addresses, first_planned) << "step " << s << ": a request left its planned place";
    }
  }
  auto c = pool.counters();
  EXPECT_EQ(c.plans_made, 1u);
  EXPECT_EQ(c.plans_dropped, 0u);
  EXPECT_GT(c.plan_bytes, 0u);
  prog.finish();
  pool.check_invariants();
  EXPECT_EQ(pool.state().live_bytes, 0u);
}

// The plan's first step moves the step's pages to their new places. The steps
// before it held their live peak in the pages the pool has, so that step takes
// free pages rather than grow (what it grows would stay for good); with
// plan_moves_grow it may grow within the slack, as other steps do.
TEST(plan_steps, the_step_moving_pages_to_a_new_plan_takes_free_pages_before_growing) {
  for (bool grow : {false, true}) {
    SCOPED_TRACE(grow ? "plan_moves_grow:true" : "plan_moves_grow:false");
    auto dev = std::make_shared<host_page_device>(4 * GiB);
    pool_options o = planned();
    o.parse(grow ? "growth_slack:0.5,plan_moves_grow:true" : "growth_slack:0.5");  // room to grow: the pool's choice
    ASSERT_EQ(o.plan_moves_grow, grow);
    ASSERT_NE(o.to_string().find(grow ? "plan_moves_grow:true" : "plan_moves_grow:false"), std::string::npos);
    pool_resource pool{dev, nullptr, o};
    program prog{pool};
    prog.setup();
    run_steps(pool, prog, 3);  // warming, recording, following
    const std::size_t before = pool.state().reserved_bytes;
    pool.mark_step();  // the plan is made here
    const auto c0 = pool.counters();
    prog.step();
    const auto c1 = pool.counters();
    pool.check_invariants();
    ASSERT_EQ(c1.plans_made, 1u);
    ASSERT_GT(c1.pages_mapped - c0.pages_mapped, 0u) << "the plan's first step moved no page";
    if (grow)
      EXPECT_GT(pool.state().reserved_bytes, before) << "the plan's step grew nothing within a slack of 0.5";
    else
      EXPECT_EQ(pool.state().reserved_bytes, before) << "the plan's step grew with free pages to take";
    run_steps(pool, prog, 3);
    const auto c2 = pool.counters();
    EXPECT_EQ(c2.pages_mapped, c1.pages_mapped) << "the steps after the plan's first moved pages";
    EXPECT_EQ(c2.plan_missed, c1.plan_missed);
    EXPECT_EQ(c2.plans_dropped, 0u);
    prog.finish();
    pool.check_invariants();
    EXPECT_EQ(pool.state().live_bytes, 0u);
  }
}

TEST(plan_steps, the_plan_needs_no_more_than_the_steps_peak) {
  // The plan's address space is at most the step's peak of live large bytes
  // (a layout made knowing the lifetimes), within a page per block of rounding.
  planned_program t;
  auto& pool = t.pool;
  auto& prog = t.prog;
  std::size_t weights = 0;
  for (auto& w : prog.weights) weights += w.n;
  std::size_t step_peak = 0;
  for (int s = 0; s < 6; ++s) {
    pool.mark_step();
    pool.reset_peaks();
    prog.step();
    step_peak = std::max(step_peak, pool.state().peak_live_bytes - weights);
  }
  const auto c = pool.counters();
  ASSERT_EQ(c.plans_made, 1u);
  EXPECT_LE(c.plan_bytes, step_peak + 2 * MiB) << "plan " << c.plan_bytes << " step peak " << step_peak;
  prog.finish();
}

TEST(plan_steps, an_output_kept_into_the_next_step_takes_two_places_in_turn) {
  // Each step's output lives until the next step has made its own (logits
  // kept for the loss): the next step's request of it comes while it lives.
  // The plan lays the steps out in pairs, the output at two places taken in
  // turn: every request placed, no page moved, and within the peak of two
  // steps' live large bytes.
  planned_program t;
  auto& pool = t.pool;
  auto& prog = t.prog;
  prog.keep_output = true;
  std::size_t weights = 0;
  for (auto& w : prog.weights) weights += w.n;
  std::vector<std::vector<void*>> seen;
  std::size_t step_peak = 0;
  for (int s = 0; s < 12; ++s) {
    pool.mark_step();
    auto c0 = pool.counters();
    pool.reset_peaks();
    prog.step();
    auto c1 = pool.counters();
    pool.check_invariants();
    step_peak = std::max(step_peak, pool.state().peak_live_bytes - weights);
    seen.push_back(prog.addresses);
    if (s >= 3) {
      EXPECT_EQ(c1.plan_missed, c0.plan_missed) << "step " << s;
      EXPECT_EQ(c1.plan_placed - c0.plan_placed, prog.addresses.size()) << "step " << s;
    }
    if (s >= 5) {
      EXPECT_EQ(c1.pages_mapped, c0.pages_mapped) << "step " << s << " mapped pages";
      EXPECT_EQ(c1.pages_unmapped, c0.pages_unmapped) << "step " << s << " unmapped pages";
      EXPECT_EQ(c1.pages_created, c0.pages_created) << "step " << s << " created pages";
      EXPECT_EQ(seen[s], seen[s - 2]) << "step " << s << ": a request left its planned place";
    }
  }
  // The two steps of a pair place the output (the large request after the 8
  // activations) apart: it lives while the next step's is made.
  ASSERT_GT(seen[10].size(), 8u);
  EXPECT_NE(seen[10][8], seen[9][8]) << "the output kept one place in both steps of a pair";
  auto c = pool.counters();
  EXPECT_EQ(c.plans_made, 1u);
  EXPECT_EQ(c.plans_dropped, 0u);
  EXPECT_LE(c.plan_bytes, step_peak + 2 * MiB)
      << "plan " << c.plan_bytes << " step peak " << step_peak;
  prog.finish();
  pool.check_invariants();
  EXPECT_EQ(pool.state().live_bytes, 0u);
}

TEST(plan_steps, a_step_that_differs_drops_the_plan_and_records_again) {
  planned_program t;
  auto& pool = t.pool;
  auto& prog = t.prog;
  run_steps(pool, prog, 5);
  ASSERT_EQ(pool.counters().plans_made, 1u);
  // New shapes: every activation misses its place (they have other sizes).
  // The plan is dropped after the first of these steps; four steps of rest,
  // then one recorded, one compared, and a new plan.
  for (int s = 0; s < 9; ++s) {
    run_steps(pool, prog, 1, 1.5);
    pool.check_invariants();
  }
  auto c = pool.counters();
  EXPECT_EQ(c.plans_dropped, 1u);
  EXPECT_EQ(c.plans_made, 2u) << "a new plan for the new shapes";
  auto c0 = pool.counters();
  pool.mark_step();
  prog.step(1.5);
  auto c1 = pool.counters();
  EXPECT_EQ(c1.plan_missed, c0.plan_missed);
  EXPECT_EQ(c1.pages_mapped, c0.pages_mapped);
  prog.finish();
  pool.check_invariants();
}

TEST(plan_steps, plans_that_keep_being_dropped_rest_longer_each_time) {
  // Every fifth step differs: each plan is dropped soon after it is made. A
  // plan made moves the step's pages once, so the pool rests 4, 8, 16, ...
  // steps after each drop instead of planning again at once.
  planned_program t;
  auto& pool = t.pool;
  auto& prog = t.prog;
  for (int s = 0; s < 100; ++s) run_steps(pool, prog, 1, s % 5 == 4 ? 1.5 : 1.0);
  const auto c = pool.counters();
  // Without rest: a plan every five steps or so (about 20). With it: after
  // drops at the first chances, rests of 4, 8, 16 and 32 steps.
  EXPECT_GE(c.plans_dropped, 2u);
  EXPECT_LE(c.plans_made, 5u) << c.plans_made << " plans, " << c.plans_dropped << " dropped";
  prog.finish();
  pool.check_invariants();
}

TEST(plan_steps, steps_that_do_not_repeat_get_no_plan) {
  // Shapes that change every step (dynamic batches): the step after the
  // recorded one never makes the same requests, so no plan is laid out and
  // no page moves to a plan's address space.
  planned_program t;
  auto& pool = t.pool;
  auto& prog = t.prog;
  for (int s = 0; s < 12; ++s) {
    pool.mark_step();
    prog.step(s % 2 ? 1.5 : 1.0);
  }
  auto c = pool.counters();
  EXPECT_EQ(c.plans_made, 0u);
  EXPECT_EQ(c.plan_placed + c.plan_missed, 0u);
  EXPECT_EQ(c.plan_bytes, 0u);
  prog.finish();
  pool.check_invariants();
}

TEST(plan_steps, a_place_still_taken_falls_back_without_overlap) {
  planned_program t;
  auto& pool = t.pool;
  auto& prog = t.prog;
  run_steps(pool, prog, 5);
  // Keep this step's first activation past its free: the next step's first
  // request of that size finds its place taken.
  pool.mark_step();
  prog.addresses.clear();
  held kept = prog.take(12 * MiB);
  auto c0 = pool.counters();
  prog.step();  // its first request (12 MiB) is the second of that size this step
  auto c1 = pool.counters();
  EXPECT_GT(c1.plan_missed, c0.plan_missed);
  pool.check_invariants();
  prog.give(kept);
  for (int s = 0; s < 3; ++s) {
    pool.mark_step();
    prog.step();
    pool.check_invariants();
  }
  prog.finish();
  EXPECT_EQ(pool.state().live_bytes, 0u);
  pool.check_invariants();
}

namespace {
// A plan recorded on one stream (0x10), then a step on another (0x20) whose
// places lie in the first stream's free blocks; `done` says whether the
// first stream's work is known done. The counters before and after that step.
std::pair<pool_counters, pool_counters> step_on_another_stream(bool done) {
  struct events : stream_ops {
    bool all_done = false;
    event_id record(stream_t) override { return 1; }
    bool done(event_id) override { return all_done; }
    void wait(event_id) override {}
    void release(event_id) noexcept override {}
  };
  auto ev = std::make_shared<events>();
  ev->all_done = done;
  auto dev = std::make_shared<host_page_device>(4 * GiB);
  pool_options o = planned();
  o.remap_own = false;
  pool_resource pool(dev, ev, o);
  program prog{pool};
  prog.stream = 0x10;
  prog.setup();
  run_steps(pool, prog, 5);
  EXPECT_EQ(pool.counters().plans_made, 1u);
  prog.give(prog.carried);
  prog.carried.p = nullptr;
  prog.stream = 0x20;
  auto c0 = pool.counters();
  pool.mark_step();
  prog.step();
  auto c1 = pool.counters();
  pool.check_invariants();
  prog.give(prog.carried);  // on the stream that took it
  prog.carried.p = nullptr;
  prog.stream = 0x10;
  prog.finish();
  pool.check_invariants();
  return {c0, c1};
}
}  // namespace

TEST(plan_steps, another_stream_does_not_take_a_streams_places) {
  // The first stream's work is never known done: its free blocks are not the
  // other stream's to take, every request is placed as usual, and the pool
  // stays whole.
  auto [c0, c1] = step_on_another_stream(false);
  EXPECT_EQ(c1.plan_placed, c0.plan_placed);
  EXPECT_GT(c1.plan_missed, c0.plan_missed);
}

TEST(plan_steps, another_stream_takes_a_streams_places_once_its_work_there_is_done) {
  // The first stream's work is known done: its free blocks at the places
  // become everyone's as the other stream's requests come, and every request
  // of the step lands in its planned place.
  auto [c0, c1] = step_on_another_stream(true);
  EXPECT_EQ(c1.plan_missed, c0.plan_missed);
  EXPECT_GT(c1.plan_placed, c0.plan_placed);
  EXPECT_GT(c1.stream_reclaims, c0.stream_reclaims);
  EXPECT_EQ(c1.pages_mapped, c0.pages_mapped) << "pages moved although every place was free";
}

TEST(plan_steps, without_the_option_marks_change_nothing) {
  std::vector<std::vector<void*>> runs;
  for (int marks = 0; marks < 2; ++marks) {
    auto dev = std::make_shared<host_page_device>(4 * GiB);
    pool_options o;
    o.plan_steps = false;
    pool_resource pool(dev, nullptr, o);
    program prog{pool};
    prog.setup();
    std::vector<void*> all;
    for (int s = 0; s < 6; ++s) {
      if (marks) pool.mark_step();
      prog.step();
      all.insert(all.end(), prog.addresses.begin(), prog.addresses.end());
    }
    auto c = pool.counters();
    EXPECT_EQ(c.plans_made + c.plan_placed + c.plan_missed, 0u);
    runs.push_back(all);
    prog.finish();
  }
  EXPECT_EQ(runs[0], runs[1]);
}

TEST(plan_steps, random_programs_keep_the_pool_whole) {
  // Steps of random sizes and lifetimes, repeated a few times each, then
  // changed: plans are made, followed, missed and dropped; no block overlaps
  // another and the invariants hold throughout.
  auto dev = std::make_shared<host_page_device>(8 * GiB);
  pool_resource pool(dev, nullptr, planned());
  std::mt19937_64 rng(7);
  std::vector<held> live;
  std::uint8_t tag = 1;
  for (int phase = 0; phase < 6; ++phase) {
    std::vector<std::size_t> sizes(40);
    for (auto& s : sizes) s = (1 + rng() % 12) * MiB + (rng() % 4) * 4096;
    std::vector<int> frees(sizes.size());  // when each is freed: after request k (or carried over)
    for (std::size_t i = 0; i < sizes.size(); ++i) frees[i] = static_cast<int>(i + 1 + rng() % 12);
    const int repeats = 3 + static_cast<int>(rng() % 4);
    for (int r = 0; r < repeats; ++r) {
      pool.mark_step();
      std::vector<std::pair<int, held>> mine;
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        held h{pool.allocate(sizes[i], 0), sizes[i], tag++};
        if (!tag) tag = 1;
        fill(h);
        mine.emplace_back(frees[i], h);
        for (auto it = mine.begin(); it != mine.end();) {
          if (it->first <= static_cast<int>(i)) {
            check_fill(it->second);
            pool.deallocate_checked(it->second.p, it->second.n, 0);
            it = mine.erase(it);
          } else {
            ++it;
          }
        }
        if (rng() % 32 == 0) pool.check_invariants();
      }
      for (auto& h : live) {  // last step's carried blocks
        check_fill(h);
        pool.deallocate_checked(h.p, h.n, 0);
      }
      live.clear();
      for (auto& m : mine) live.push_back(m.second);
      pool.check_invariants();
    }
  }
  for (auto& h : live) {
    check_fill(h);
    pool.deallocate_checked(h.p, h.n, 0);
  }
  pool.check_invariants();
  EXPECT_GE(pool.counters().plans_made, 2u);
  EXPECT_EQ(pool.state().live_bytes, 0u);
}

TEST(plan_steps, blocks_left_out_of_the_plan_keep_the_ranks_of_the_others) {
  // Each step's first 8 MiB request lives two steps (a double buffer), its
  // second 8 MiB request a moment; a third request is freed on another
  // stream. The first and third are left out of the plan and placed as usual;
  // the second still gets its own place (rank 2 of its size, not rank 1),
  // and no step misses.
  auto dev = std::make_shared<host_page_device>(4 * GiB);
  pool_resource pool(dev, nullptr, planned());
  std::vector<held> older;  // the double buffers of the last two steps
  std::vector<void*> seconds;
  std::uint8_t tag = 1;
  auto take = [&](std::size_t n, stream_t s) {
    held h{pool.allocate(n, s), n, tag++};
    fill(h);
    return h;
  };
  for (int s = 0; s < 10; ++s) {
    pool.mark_step();
    auto c0 = pool.counters();
    held buffer = take(8 * MiB, 0);
    held brief = take(8 * MiB, 0);
    seconds.push_back(brief.p);
    held shared = take(6 * MiB, 0);
    held work = take(20 * MiB, 0);
    check_fill(brief);
    pool.deallocate_checked(brief.p, brief.n, 0);
    check_fill(shared);
    pool.deallocate_checked(shared.p, shared.n, 0x30);  // freed on another stream: pending for a while
    check_fill(work);
    pool.deallocate_checked(work.p, work.n, 0);
    older.push_back(buffer);
    if (older.size() > 2) {
      check_fill(older.front());
      pool.deallocate_checked(older.front().p, older.front().n, 0);
      older.erase(older.begin());
    }
    auto c1 = pool.counters();
    if (s >= 3) {
      EXPECT_EQ(c1.plan_missed, c0.plan_missed) << "step " << s;
      EXPECT_EQ(c1.plan_placed - c0.plan_placed, 2u) << "step " << s << ": the brief block and the work block";
    }
    pool.check_invariants();
  }
  EXPECT_EQ(pool.counters().plans_made, 1u);
  EXPECT_EQ(seconds[4], seconds[9]);
  for (auto& h : older) pool.deallocate_checked(h.p, h.n, 0);
  pool.check_invariants();
}

TEST(plan_steps, a_step_of_too_many_large_requests_gets_no_plan) {
  // Laying a plan out takes time that grows with the square of its blocks:
  // past 8,192 large requests a step the pool does not try.
  auto dev = std::make_shared<host_page_device>(64 * GiB);
  for (std::size_t n : {8192u, 8193u}) {
    pool_resource p2(dev, nullptr, planned());
    for (int s = 0; s < 5; ++s) {
      p2.mark_step();
      std::vector<void*> v;
      for (std::size_t i = 0; i < n; ++i) v.push_back(p2.allocate(MiB + 4096 * (i % 7 + 1), 0));
      for (void* p : v) p2.deallocate_checked(p, 0, 0);
    }
    EXPECT_EQ(p2.counters().plans_made, n <= 8192 ? 1u : 0u) << n << " requests a step";
    p2.check_invariants();
  }
}

TEST(plan_steps, a_pool_over_segments_ignores_marks) {
  auto dev = std::make_shared<host_page_device>(1 * GiB);
  auto pages = std::make_shared<pool_resource>(dev, nullptr, pool_options{});
  pool_resource pool(std::static_pointer_cast<device_resource>(pages), nullptr, planned());
  for (int s = 0; s < 5; ++s) {
    pool.mark_step();
    void* p = pool.allocate(8 * MiB, 0);
    pool.deallocate_checked(p, 8 * MiB, 0);
  }
  EXPECT_EQ(pool.counters().plans_made, 0u);
  pool.check_invariants();
}

TEST(plan_steps, chunks_only_before_the_second_mark_and_the_free_ones_go_back_there) {
  // The program's first step runs in chunks (16 MiB handles: fewer driver
  // calls) whether the program marks at the top of its steps (a mark before
  // the first step) or the optimizer marks their ends (the first step runs
  // before any mark, the warming step after it). At the second mark the
  // chunks lying in free memory go back; no chunk is made after it; the plan
  // then works as without chunks, in as little memory.
  auto run = [](std::size_t chunk_size, bool top_marks, std::vector<void*>* planned_addresses) {
    auto dev = std::make_shared<host_page_device>(4 * GiB);
    pool_options o = planned();
    o.chunk_size = chunk_size;
    pool_resource pool(dev, nullptr, o);
    program prog{pool};
    prog.setup();
    if (top_marks) pool.mark_step();  // the first mark, at the top of the first step
    prog.step();                       // the cold step
    const auto cold = pool.counters();
    if (!top_marks) {
      pool.mark_step();  // the first mark, at the end of the first step
      const auto w0 = pool.counters();
      void* big = pool.allocate(256 * MiB, 0);  // growth in the warming step: still chunks
      EXPECT_GT(pool.counters().pages_created, w0.pages_created) << "the pool did not grow";
      if (chunk_size)
        EXPECT_GT(pool.counters().chunks_created, w0.chunks_created) << "no chunk made between the first and the second mark";
      pool.deallocate_checked(big, 256 * MiB, 0);
      prog.step();
    }
    const auto before = pool.counters();
    pool.mark_step();  // the second mark
    const auto marked = pool.counters();
    pool.check_invariants();
    for (int s = 0; s < 8; ++s) {
      auto c0 = pool.counters();
      prog.step();
      auto c1 = pool.counters();
      pool.check_invariants();
      EXPECT_EQ(c1.chunks_created, marked.chunks_created) << "step " << s << ": a chunk made after the second mark";
      if (s >= 4) {
        EXPECT_EQ(c1.pages_mapped, c0.pages_mapped) << "step " << s;
        EXPECT_EQ(c1.pages_unmapped, c0.pages_unmapped) << "step " << s;
      }
      pool.mark_step();
    }
    *planned_addresses = prog.addresses;
    {  // growth after the second mark: single pages
      const auto g0 = pool.counters();
      void* big = pool.allocate(640 * MiB, 0);  // more than the warming step's growth left free
      EXPECT_GT(pool.counters().pages_created, g0.pages_created) << "the pool did not grow";
      EXPECT_EQ(pool.counters().chunks_created, g0.chunks_created) << "a chunk made after the second mark";
      pool.deallocate_checked(big, 640 * MiB, 0);
    }
    const auto c = pool.counters();
    EXPECT_EQ(c.plans_made, 1u);
    EXPECT_EQ(c.plans_dropped, 0u);
    prog.finish();
    pool.check_invariants();
    // The driver charges per handle: a chunk is one for all its pages.
    const std::size_t per_chunk = chunk_size / pool.page_size();
    const std::size_t cold_handles =
        cold.pages_created - cold.chunks_created * (per_chunk ? per_chunk - 1 : 0);
    return std::tuple{cold, before, marked, pool.state().peak_reserved_bytes, cold_handles};
  };
  for (bool top_marks : {true, false}) {
    SCOPED_TRACE(top_marks ? "marks at the top of the steps" : "marks at the ends of the steps");
    std::vector<void*> with_chunks, without;
    auto [cold, before, marked, peak, handles] = run(16 * MiB, top_marks, &with_chunks);
    auto [cold0, before0, marked0, peak0, handles0] = run(0, top_marks, &without);
    EXPECT_GT(cold.chunks_created, 0u) << "the cold step made no chunk";
    EXPECT_EQ(cold0.chunks_created, 0u);
    EXPECT_EQ(before.chunks_released, cold.chunks_released) << "a chunk went back before the second mark";
    EXPECT_GT(marked.chunks_released, before.chunks_released) << "no free chunk went back at the second mark";
    EXPECT_LT(handles, handles0) << "chunks did not make the cold step's handles fewer";
    // Blocks of the cold step living on (the step's last block) may keep a
    // chunk's free part: at most one chunk more at the peak.
    EXPECT_LE(peak, peak0 + 16 * MiB) << "the chunks left more memory reserved than single pages";
  }
}

TEST(plan_steps, a_pool_never_marked_is_the_pool_without_the_option_until_steps_are_found) {
  // plan_steps waits for the first mark: until then (a program that never
  // marks, such as a server's loop) the pool is the pool without it, chunks
  // included, until it finds the program's steps itself (not before 8,192
  // large requests; here 6 steps of 17).
  auto run = [](bool plan, std::vector<void*>* addresses) {
    auto dev = std::make_shared<host_page_device>(4 * GiB);
    pool_options o;
    o.plan_steps = plan;
    o.chunk_size = std::size_t{16} << 20;  // chunks, as a pool may be set to make them
    pool_resource pool(dev, nullptr, o);
    program prog{pool};
    prog.setup();
    for (int s = 0; s < 6; ++s) {
      prog.step(s % 2 ? 1.25 : 1.0);
      addresses->insert(addresses->end(), prog.addresses.begin(), prog.addresses.end());
    }
    prog.finish();
    pool.check_invariants();
    return pool.counters();
  };
  std::vector<void*> a, b;
  const auto on = run(true, &a), off = run(false, &b);
  EXPECT_EQ(a, b);
  EXPECT_EQ(on.chunks_created, off.chunks_created);
  EXPECT_GT(on.chunks_created, 0u);
  EXPECT_EQ(on.pages_mapped, off.pages_mapped);
  EXPECT_EQ(on.pages_unmapped, off.pages_unmapped);
  EXPECT_EQ(on.map_calls, off.map_calls);
  EXPECT_EQ(on.plans_made, 0u);
}

namespace {
// A GPU behind the host until the pool waits; streams under capture on demand.
struct lagging_streams final : stream_ops {
  bool behind = true, capture = false;
  event_id record(stream_t) override { return 1; }
  bool done(event_id) override { return !behind; }
  void wait(event_id) override { behind = false; }
  void release(event_id) noexcept override {}
  bool capturing(stream_t) noexcept override { return capture; }
};
}  // namespace

TEST(plan_steps, chunks_wait_for_a_mark_that_can_wait_for_the_gpu) {
  // The first mark comes while the stream is being captured: no wait, so
  // the cold step's chunks, freed but not known done, stay. The next mark
  // can wait, and gives them back.
  auto dev = std::make_shared<host_page_device>(4 * GiB);
  auto streams = std::make_shared<lagging_streams>();
  pool_options o = planned();
  o.chunk_size = std::size_t{16} << 20;
  pool_resource pool(dev, streams, o);
  program prog{pool};
  prog.stream = 7;
  prog.setup();
  prog.step();
  ASSERT_GT(pool.counters().chunks_created, 0u);
  streams->capture = true;
  pool.mark_step();
  EXPECT_EQ(pool.counters().chunks_released, 0u) << "chunks given back without waiting for the GPU";
  pool.check_invariants();
  streams->capture = false;
  pool.mark_step();
  EXPECT_GT(pool.counters().chunks_released, 0u) << "the next mark did not give the chunks back";
  pool.check_invariants();
  const auto released = pool.counters().chunks_released;
  prog.step();
  pool.mark_step();
  EXPECT_EQ(pool.counters().chunks_released, released) << "a later mark gave chunks back again";
  prog.finish();
  pool.check_invariants();
}

namespace {
// A deeper training step for the pool's own search (which waits for 8,192
// large requests): a forward pass over `layers` identical layers keeping
// their activations, a backward pass freeing them with gradients, and the
// optimizer's temporaries; `scale` changes the activations' sizes.
std::vector<void*> deep_step(pool_resource& pool, int layers, double scale = 1.0, double unit = 1.0) {
  std::vector<void*> addresses;
  std::vector<std::pair<void*, std::size_t>> acts;
  for (int l = 0; l < layers; ++l)
    for (std::size_t mib : {3, 6, 2, 4}) {
      const auto n = static_cast<std::size_t>(static_cast<double>(mib * MiB) * scale * unit);
      acts.emplace_back(pool.allocate(n, 0), n);
      addresses.push_back(acts.back().first);
    }
  void* grad = nullptr;
  for (auto it = acts.rbegin(); it != acts.rend(); ++it) {
    void* g = pool.allocate(2 * MiB, 0);
    addresses.push_back(g);
    if (grad) pool.deallocate_checked(grad, 2 * MiB, 0);
    grad = g;
    pool.deallocate_checked(it->first, it->second, 0);
  }
  pool.deallocate_checked(grad, 2 * MiB, 0);
  for (int k = 0; k < 3; ++k) {
    void* t = pool.allocate(5 * MiB, 0);
    addresses.push_back(t);
    pool.deallocate_checked(t, 5 * MiB, 0);
  }
  return addresses;
}
}  // namespace

TEST(plan_steps, a_program_that_never_marks_gets_its_steps_found) {
  auto dev = std::make_shared<host_page_device>(8 * GiB);
  pool_resource pool(dev, nullptr, planned());
  void* weights = pool.allocate(64 * MiB, 0);
  const int layers = 40;  // 40 x 4 + 160 + 3 = 323 large requests a step
  std::vector<std::vector<void*>> seen;
  std::vector<pool_counters> after;
  for (int s = 0; s < 50; ++s) {
    seen.push_back(deep_step(pool, layers));
    after.push_back(pool.counters());
    pool.check_invariants();
  }
  const auto c = pool.counters();
  EXPECT_EQ(c.steps_found, 1u);
  EXPECT_EQ(c.step_period, 323u) << "not the step's period (a layer's is 4)";
  EXPECT_EQ(c.plans_made, 1u);
  EXPECT_EQ(c.plans_dropped, 0u);
  // The last ten steps: every request at its planned place, no page moved.
  for (int s = 40; s < 50; ++s) {
    EXPECT_EQ(after[s].pages_mapped, after[s - 1].pages_mapped) << "step " << s;
    EXPECT_EQ(after[s].pages_unmapped, after[s - 1].pages_unmapped) << "step " << s;
    EXPECT_EQ(after[s].plan_missed, after[s - 1].plan_missed) << "step " << s;
  }
  EXPECT_EQ(seen[48], seen[49]);
  pool.deallocate_checked(weights, 64 * MiB, 0);
  pool.check_invariants();
}

TEST(plan_steps, a_never_marked_program_keeping_its_output_gets_a_two_step_plan) {
  // The deep step with an output made after the forward and the last step's
  // given back only then (logits kept for the loss): the pool finds the period
  // itself, and its plan gives the output a place for even and one for odd steps.
  auto dev = std::make_shared<host_page_device>(8 * GiB);
  pool_resource pool(dev, nullptr, planned());
  void* weights = pool.allocate(64 * MiB, 0);
  void* output = nullptr;
  std::vector<std::vector<void*>> seen;
  std::vector<pool_counters> after;
  for (int s = 0; s < 75; ++s) {  // 161 large requests a step: the search begins at 8,192
    std::vector<void*> addresses;
    std::vector<void*> acts;
    for (int l = 0; l < 40; ++l)
      for (std::size_t mib : {3, 6, 2, 4}) {
        acts.push_back(pool.allocate(mib * MiB, 0));
        addresses.push_back(acts.back());
      }
    void* out = pool.allocate(24 * MiB, 0);
    addresses.push_back(out);
    if (output) pool.deallocate_checked(output, 24 * MiB, 0);
    output = out;
    for (std::size_t i = acts.size(); i-- > 0;) {
      const std::size_t mib[] = {3, 6, 2, 4};
      pool.deallocate_checked(acts[i], mib[i % 4] * MiB, 0);
    }
    seen.push_back(addresses);
    after.push_back(pool.counters());
    pool.check_invariants();
  }
  const auto c = pool.counters();
  EXPECT_EQ(c.steps_found, 1u);
  EXPECT_EQ(c.step_period, 161u);
  EXPECT_GE(c.plans_made, 1u);
  EXPECT_EQ(c.plans_dropped, 0u);
  for (int s = 62; s < 75; ++s) {
    EXPECT_EQ(after[s].pages_mapped, after[s - 1].pages_mapped) << "step " << s;
    EXPECT_EQ(after[s].pages_unmapped, after[s - 1].pages_unmapped) << "step " << s;
    EXPECT_EQ(after[s].plan_missed, after[s - 1].plan_missed) << "step " << s;
    EXPECT_EQ(after[s].plan_placed - after[s - 1].plan_placed, 161u) << "step " << s;
  }
  EXPECT_EQ(seen[72], seen[74]);
  EXPECT_NE(seen[73][160], seen[74][160]) << "the output kept one place in both steps of a pair";
  pool.deallocate_checked(output, 24 * MiB, 0);
  pool.deallocate_checked(weights, 64 * MiB, 0);
  pool.check_invariants();
}

TEST(plan_steps, a_two_step_plan_dropped_is_made_again) {
  // A step that changes drops the plan; once the steps repeat again, the next
  // plan (again over two steps, for the output kept into the next step) holds.
  planned_program t;
  auto& pool = t.pool;
  auto& prog = t.prog;
  prog.keep_output = true;
  run_steps(pool, prog, 8);
  ASSERT_EQ(pool.counters().plans_made, 1u);
  run_steps(pool, prog, 1, 1.5);
  run_steps(pool, prog, 1);  // the changed step is judged at this mark
  ASSERT_EQ(pool.counters().plans_dropped, 1u);
  run_steps(pool, prog, 12);  // 4 of rest, record, follow, then planned
  auto c0 = pool.counters();
  ASSERT_EQ(c0.plans_made, 2u);
  run_steps(pool, prog, 4);
  auto c1 = pool.counters();
  EXPECT_EQ(c1.plans_dropped, 1u);
  EXPECT_EQ(c1.plan_missed, c0.plan_missed);
  EXPECT_EQ(c1.pages_mapped, c0.pages_mapped);
  EXPECT_EQ(c1.plan_placed - c0.plan_placed, 4 * prog.addresses.size());
  prog.finish();
  pool.check_invariants();
  EXPECT_EQ(pool.state().live_bytes, 0u);
}

TEST(plan_steps, steps_whose_shapes_change_find_no_period) {
  auto dev = std::make_shared<host_page_device>(8 * GiB);
  pool_resource pool(dev, nullptr, planned());
  std::mt19937 rng(3);
  for (int s = 0; s < 60; ++s) deep_step(pool, 40, 0.5 + (rng() % 8) / 8.0);
  EXPECT_EQ(pool.counters().steps_found, 0u);
  EXPECT_EQ(pool.counters().plans_made, 0u);
  pool.check_invariants();
}

TEST(plan_steps, the_programs_first_mark_ends_the_search) {
  auto dev = std::make_shared<host_page_device>(8 * GiB);
  pool_resource pool(dev, nullptr, planned());
  for (int s = 0; s < 40; ++s) deep_step(pool, 40);
  ASSERT_EQ(pool.counters().step_period, 323u);
  ASSERT_EQ(pool.counters().plans_made, 1u);
  // From here on the program marks (at another point of its step than the
  // pool chose): the pool's own plan goes, and one is made on its marks.
  for (int s = 0; s < 8; ++s) {
    pool.mark_step();
    deep_step(pool, 40);
    pool.check_invariants();
  }
  const auto c = pool.counters();
  EXPECT_EQ(c.step_period, 0u);
  EXPECT_EQ(c.plans_made, 2u);
  EXPECT_EQ(c.plans_dropped, 0u);
  const auto c0 = pool.counters();
  pool.mark_step();
  deep_step(pool, 40);
  const auto c1 = pool.counters();
  EXPECT_EQ(c1.pages_mapped, c0.pages_mapped);
  EXPECT_EQ(c1.plan_missed, c0.plan_missed);
  EXPECT_EQ(c1.steps_found, 1u);
}

TEST(plan_steps, a_deep_models_layers_are_not_taken_for_its_steps) {
  // 900 layers: one forward pass, 3,600 requests of the same four sizes, is
  // 44 % of the history at the first search (8,192 large requests). Its
  // layers repeat, but the live bytes grow from one to the next (the
  // activations are kept): not a step. The step (7,203 requests) is found
  // once the history holds four of them.
  auto dev = std::make_shared<host_page_device>(64 * GiB);
  pool_resource pool(dev, nullptr, planned());
  std::vector<std::uint64_t> periods;
  for (int s = 0; s < 6; ++s) {
    deep_step(pool, 900, 1.0, 0.6);
    periods.push_back(pool.counters().step_period);
    pool.check_invariants();
  }
  for (std::size_t k = 0; k < periods.size(); ++k)
    EXPECT_TRUE(periods[k] == 0 || periods[k] == 7203u) << "after step " << k << ": period " << periods[k];
  EXPECT_EQ(periods.back(), 7203u);
  EXPECT_EQ(pool.counters().plans_dropped, 0u);
}

TEST(plan_steps, a_loss_kept_each_step_does_not_hide_the_period) {
  // Small blocks do not count: a program keeping each step's loss (512 B)
  // still gets its steps found.
  auto dev = std::make_shared<host_page_device>(8 * GiB);
  pool_resource pool(dev, nullptr, planned());
  std::vector<void*> losses;
  for (int s = 0; s < 40; ++s) {
    deep_step(pool, 40);
    losses.push_back(pool.allocate(512, 0));
  }
  EXPECT_EQ(pool.counters().step_period, 323u);
  EXPECT_EQ(pool.counters().plans_made, 1u);
  for (void* p : losses) pool.deallocate_checked(p, 512, 0);
  pool.check_invariants();
}

TEST(plan_steps, a_step_too_long_to_plan_is_not_taken_and_a_later_loop_is) {
  // 16,003 large requests a step: more than a plan takes (8,192), so not a
  // period to mark by. The loop that follows (323 a step) gets its plan.
  auto dev = std::make_shared<host_page_device>(64 * GiB);
  pool_resource pool(dev, nullptr, planned());
  for (int s = 0; s < 6; ++s) {
    deep_step(pool, 2000, 1.0, 0.6);
    EXPECT_NE(pool.counters().step_period, 16003u) << "step " << s;
  }
  for (int s = 0; s < 400 && pool.counters().plans_made == 0; ++s) deep_step(pool, 40);
  EXPECT_EQ(pool.counters().step_period, 323u);
  EXPECT_EQ(pool.counters().plans_made, 1u);
  pool.check_invariants();
}

// plan_needs_moves: where the steps settle without a plan (no page moved once
// the pool has grown to the step's peak), no plan is made and the step that
// would have moved the step's pages to it never comes; where they keep moving
// pages, the plan is made once they have moved a share of what it costs.
TEST(plan_steps, plan_needs_moves_makes_no_plan_for_steps_that_move_no_page) {
  auto run = [](bool needs_moves, double remap_own_slack, int steps) {
    pool_options o = planned();
    o.parse(needs_moves ? "plan_needs_moves:true" : "plan_needs_moves:false");
    EXPECT_NE(o.to_string().find(needs_moves ? "plan_needs_moves:true" : "plan_needs_moves:false"), std::string::npos);
    o.remap_own_slack = remap_own_slack;
    planned_program t(o);
    auto& pool = t.pool;
    auto& prog = t.prog;
    const auto c0 = pool.counters();
    run_steps(pool, prog, steps);
    pool.check_invariants();
    auto c = pool.counters();
    prog.finish();
    pool.check_invariants();
    EXPECT_EQ(pool.state().live_bytes, 0u);
    c.pages_mapped -= c0.pages_mapped;
    return c;
  };
  const auto planned_at_once = run(false, 0.03, 12), settled = run(true, 0.03, 12);
  EXPECT_EQ(planned_at_once.plans_made, 1u);
  EXPECT_EQ(settled.plans_made, 0u);
  EXPECT_GT(settled.plans_skipped, 0u);
  EXPECT_LT(settled.pages_mapped, planned_at_once.pages_mapped) << "no plan, and still as many pages mapped";
  EXPECT_EQ(settled.pages_remapped + settled.pages_unmapped, 0u) << "the steps without a plan moved pages";
  EXPECT_EQ(planned_at_once.plans_skipped, 0u);
}

TEST(plan_steps, plan_needs_moves_makes_the_plan_once_the_steps_have_moved_pages) {
  // No slack to grow (growth_slack and remap_own_slack 0) and an output kept
  // into the next step: the steps before the plan move pages, more than a
  // sixteenth of what the plan's first step maps, so the plan comes at the
  // same mark as without the option, and after it no page moves.
  pool_options o = planned();
  o.plan_needs_moves = true;
  o.growth_slack = 0;
  o.remap_own_slack = 0;
  planned_program t(o);
  auto& pool = t.pool;
  auto& prog = t.prog;
  prog.keep_output = true;
  std::size_t moved_before_plan = 0;
  for (int s = 0; s < 12; ++s) {
    pool.mark_step();
    const auto c0 = pool.counters();
    prog.step();
    const auto c1 = pool.counters();
    const std::size_t moved = (c1.pages_remapped + c1.pages_unmapped) - (c0.pages_remapped + c0.pages_unmapped);
    if (s == 1 || s == 2) moved_before_plan += moved;  // the recorded step and the one after it
    if (s == 2) EXPECT_EQ(c1.plans_made, 0u);
    if (s == 3) EXPECT_EQ(c1.plans_made, 1u) << "the plan did not come after steps that moved pages";
    if (s >= 5) EXPECT_EQ(moved, 0u) << "step " << s;
  }
  EXPECT_GT(moved_before_plan, 0u);
  EXPECT_EQ(pool.counters().plans_skipped, 0u);
  EXPECT_EQ(pool.counters().plans_dropped, 0u);
  prog.finish();
  pool.check_invariants();
}

TEST(plan_steps, plan_needs_moves_buys_the_plan_once_later_steps_move_pages) {
  // Steps that settle get no plan. Trims between the steps then give the free
  // pages back (each counted as moved) and the steps map them again: once the
  // moves reach the price, the plan is made and the steps stop moving.
  pool_options o = planned();
  o.plan_needs_moves = true;
  planned_program t(o);
  auto& pool = t.pool;
  auto& prog = t.prog;
  run_steps(pool, prog, 8);
  const auto settled = pool.counters();
  ASSERT_EQ(settled.plans_made, 0u);
  ASSERT_GT(settled.plans_skipped, 0u);
  int trims = 0;
  while (pool.counters().plans_made == 0 && trims < 40) {
    pool.release_cached();
    ++trims;
    run_steps(pool, prog, 1);
    pool.check_invariants();
  }
  EXPECT_EQ(pool.counters().plans_made, 1u) << "no plan after " << trims << " trims";
  // Planned: the steps place their requests where the plan says and move nothing.
  run_steps(pool, prog, 2);
  const auto c0 = pool.counters();
  run_steps(pool, prog, 3);
  const auto c1 = pool.counters();
  EXPECT_EQ(c1.pages_mapped, c0.pages_mapped);
  EXPECT_EQ(c1.pages_remapped + c1.pages_unmapped, c0.pages_remapped + c0.pages_unmapped);
  EXPECT_GT(c1.plan_placed, c0.plan_placed);
  EXPECT_EQ(c1.plan_missed, c0.plan_missed);
  prog.finish();
  pool.check_invariants();
}
