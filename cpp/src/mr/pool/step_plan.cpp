// Step plans (plan_steps): a program that repeats the same steps and marks
// where each begins gets one step's large requests laid out once, at fixed
// offsets past every live block, and every later request of the same size
// and rank in its step placed at its planned address. Blocks then land on the
// pages the same request had a step before: no page moves in steady steps,
// and the layout, made knowing every block's lifetime, needs little more
// than the step's peak of live bytes (benchmarks/layout_bound.py).
//
// Phases, one per mark_step():
//   off -> warming: the first marked step is not recorded (lazy inits, first
//                   calls of libraries); at its end (the second mark) the
//                   chunks made so far that lie in free memory go back, and
//                   no more are made
//   warming -> recording: each large request's size and tick (a count of
//                   large requests and frees), and the tick of its free
//   recording -> following: no more requests recorded; the recorded blocks'
//                   frees are still followed into this step (blocks living
//                   across the step boundary)
//   following -> recording: with plan_needs_moves, while the steps since
//                   the first recording moved fewer pages than a sixteenth
//                   of what the plan's first step would map (no plan yet:
//                   rent paid before buying)
//   following -> planned: when this step made the recorded step's requests
//                   again (by size and count, 95 % of its bytes), plan_build
//                   lays the recorded blocks out, the step
//                   being a circle of `length` ticks (two steps when a block
//                   lives past its own request in the next step: even and
//                   odd steps then have places of their own); a block never
//                   freed by now is left out (weights, optimizer state: they
//                   stay where they are)
//   planned: each step's misses are counted; more than 5 % of its bytes and
//                   the plan is dropped: after 4, 8, 16, ... 256 steps of rest
//                   (longer after each drop), recording starts again
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "pool_impl.hpp"

namespace vramkit {

void pool_resource::impl::mark_step() {
  if (!opt.plan_steps || upstream) return;
  auto& P = plan;
  // The chunks go back at the second mark; when the pool could not wait for
  // the GPU then, at the next marks until it could.
  if (P.marks < 2 && ++P.marks == 2) P.chunks_to_give_back = true;  // from here on no chunk is made (chunks.cpp)
  if (P.chunks_to_give_back) {
    P.chunks_to_give_back = !plan_give_back_chunks();
  } else if (P.split_retry_in && --P.split_retry_in == 0) {
    // A split that stopped, tried again (the free chunks go back first).
    P.chunks_to_give_back = !plan_give_back_chunks();
  }
  switch (P.ph) {
    case step_plan::phase::off:
      P.ph = step_plan::phase::warming;
      break;
    case step_plan::phase::warming:
      if (P.rest > 0) {  // resting after a dropped plan
        --P.rest;
        break;
      }
      P.moves_base = page_moves();  // plan_needs_moves: the steps' moves counted from here
      P.buy_at = 0;
      plan_record_start();
      break;
    case step_plan::phase::recording:
      P.length = P.tick;
      P.ph = step_plan::phase::following;
      break;
    case step_plan::phase::following: {
      // plan_needs_moves: while the steps have not yet moved the share of the
      // last layout's price, no layout (a step that did not repeat is still
      // a failure: the step finder counts those).
      using build = step_plan::build;
      const build r = opt.plan_needs_moves && P.buy_at && page_moves() - P.moves_base < P.buy_at
                          ? (plan_repeats() ? build::skipped : build::failed)
                          : plan_build();
      if (r == build::made) break;
      if (r == build::skipped) ++ctr.plans_skipped;
      else ++P.unplanned;
      plan_record_start();
      break;
    }
    case step_plan::phase::planned:
      if (P.missed_bytes * 20 > P.step_bytes) {
        // Each plan made moves the step's pages once: after a drop, rest 4,
        // 8, 16, ... up to 256 steps before recording again, so that steps
        // that keep changing do not pay for a new plan every few steps.
        ++ctr.plans_dropped;
        ctr.plan_bytes = 0;
        P.rest = std::size_t{4} << std::min<std::size_t>(ctr.plans_dropped - 1, 6);
        P.ph = step_plan::phase::warming;
        P.by_size.clear();
        P.seen.clear();
      } else {
        ++P.planned_marks;
        P.seen.clear();
        P.odd = !P.odd;
        P.step_bytes = P.missed_bytes = 0;
      }
      break;
  }
}

// At the second mark: the chunks lying wholly in free memory go back. Chunks
// are made only before it (the program's start and the first step, whether the
// program marks at the top of its steps or the optimizer marks their ends,
// then the warming step: single pages would cost the first step about three
// times the driver's time), and one left there would pin memory where later
// steps' blocks, and the plan, do not want it: blocks placed over part of a
// chunk keep the rest of it from moving (docs/BENCHMARKS.md section 1h). So
// the driver's time for those pages moves to the next step, where single
// pages are made. Only memory the GPU is done with goes: the pool waits for
// the streams' work freed so far (not while one of its streams is being
// captured, when it takes what is known done). The chunks left lie under
// live blocks: with split_chunks they are then split into single pages, after
// all of the device's work is done. True when it could wait; false to try
// again at the next mark.
// (A program that captures its steps in CUDA graphs from another stream
// should not mark while capturing: vramkit.torch's marks skip captures.)
bool pool_resource::impl::plan_give_back_chunks() noexcept {
  if (!chunk_pages) return true;
  bool wait = true;
  for (std::uint32_t i = 1; wait && i < slots.size(); ++i)
    if (streams->capturing(slots[i].stream)) wait = false;
  try {
    reclaim_streams(wait);
  } catch (...) {
    return false;
  }
  std::vector<block*> idle;
  try {
    for (block* b = slots[0].steal_head; b; b = b->snext) idle.push_back(b);
  } catch (...) {
    return false;
  }
  for (block* b : idle) {
    detail::arena* a = b->ar;
    if (a->small || a->chunk_bits.empty()) continue;
    const std::size_t lo = round_up(b->addr - a->base, page) / page, hi = (b->addr + b->size - a->base) / page;
    const auto [clo, chi] = chunks_inside(a, lo, hi);
    for (std::size_t c = round_up(clo, chunk_min); c < chi;)
      if (a->in_chunk(c)) {
        const std::size_t first = chunk_span(a, c).first, k = give_back_chunk(a, first);
        slots.pages_taken(b, k);
        c = first + k;
      } else {
        c += chunk_min;
      }
  }
  // The chunks left lie under live blocks: split into single pages
  // (split_chunks), after the device's work is all done. A split that
  // stopped is tried again 4, 8 and 16 marks later.
  if (wait) {
    split_chunks();
    if (chunk_pages && opt.split_chunks && pages->copies() && plan.split_retries < 3)
      plan.split_retry_in = 4u << plan.split_retries++;
  }
  return wait;
}

void pool_resource::impl::plan_record_start() {
  auto& P = plan;
  P.ph = step_plan::phase::recording;
  P.tick = P.length = 0;
  P.items.clear();
  P.open.clear();
  P.by_size.clear();
  P.seen.clear();
  P.cursor = nullptr;
  P.step_bytes = P.missed_bytes = 0;
}

// After the block is handed out; no host memory for the record: this recording
// is given up (the next marks start another), the allocation stands.
void pool_resource::impl::plan_note_alloc(std::uintptr_t addr, std::size_t size) noexcept {
  auto& P = plan;
  try {
    if (P.ph == step_plan::phase::recording && P.items.size() <= step_plan::max_items) {
      step_plan::item it;
      it.size = size;
      it.t0 = P.tick;
      P.items.push_back(it);
      P.open[addr] = static_cast<std::uint32_t>(P.items.size() - 1);
    }
    if (P.ph == step_plan::phase::following) {  // the next step's requests, to compare (plan_build)
      ++P.seen[size];
      P.step_bytes += size;
    }
  } catch (...) {
    P.ph = step_plan::phase::warming;
    return;
  }
  if (P.ph == step_plan::phase::recording || P.ph == step_plan::phase::following) ++P.tick;
}

// A recorded block freed while another stream may still use it (it goes
// pending) is left out of the plan: its place would not be free again when
// the recorded step's frees say.
void pool_resource::impl::plan_note_free(std::uintptr_t addr, bool pending) noexcept {
  auto& P = plan;
  if (P.ph != step_plan::phase::recording && P.ph != step_plan::phase::following) return;
  auto it = P.open.find(addr);
  if (it != P.open.end()) {
    P.items[it->second].t1 = P.tick;
    P.items[it->second].pending = pending;
    P.open.erase(it);
  }
  ++P.tick;
}

// Only steps that repeat: the step after the recorded one must have made the
// same requests (by size and count) for at least 95 % of its bytes.
bool pool_resource::impl::plan_repeats() const {
  const auto& P = plan;
  std::unordered_map<std::size_t, std::uint32_t> recorded;
  for (const auto& it : P.items) ++recorded[it.size];
  std::size_t same = 0;
  for (auto [size, n] : P.seen) {
    auto r = recorded.find(size);
    if (r != recorded.end()) same += static_cast<std::size_t>(std::min(n, r->second)) * size;
  }
  return P.step_bytes != 0 && same * 20 >= P.step_bytes * 19;
}

// Lays the recorded blocks out on a circle of one step (two when a block is
// carried into the next step): a block freed in the next step lives over the
// step's end into its beginning. Then the plan's address space: past every
// live or pending block of the large arena.
pool_resource::impl::step_plan::build pool_resource::impl::plan_build() {
  auto& P = plan;
  const std::uint64_t T = P.length;
  if (P.items.size() > step_plan::max_items) return step_plan::build::failed;  // the layout's time grows as the square
  if (!plan_repeats()) return step_plan::build::failed;
  // Kept out: never freed yet (long-lived), living two steps or more, or
  // freed while another stream still used it. A block living more than a
  // step (a step's output kept until the next step has made its own, as
  // logits are) is carried: the next step's request of it comes while it
  // lives, so it needs two places, taken in turn by even and odd steps. The
  // layout is then made over two steps, every block with a place in each (a
  // block placed alike in both could use a carried block's room in neither).
  // A step of more than max_items / 2 requests gets no two-step layout (twice
  // the places): its carried blocks are left out.
  const bool two_steps_fit = 2 * P.items.size() <= step_plan::max_items;
  bool any_carried = false;
  for (auto& it : P.items) {
    it.planned = it.t1 != 0 && !it.pending && it.t1 > it.t0;
    if (it.planned && it.t1 > T && it.t1 - T > it.t0) {  // lives past its own request in the next step
      it.planned = two_steps_fit && it.t1 - it.t0 < 2 * T;
      any_carried = any_carried || it.planned;
    }
  }
  P.two_steps = any_carried;
  const std::uint64_t C = any_carried ? 2 * T : T;  // the layout's circle
  // What is laid out: a place per planned block and step of the circle, with
  // the times it is taken on the circle (an interval, in two when it wraps).
  struct place_of {
    std::uint32_t k;
    bool second;
    std::uint8_t n = 0;
    std::uint64_t lo[2], hi[2];
    std::size_t off = 0;
    void add(std::uint64_t a, std::uint64_t b, std::uint64_t c) {  // [a, b) on a circle of c, a < c, b - a <= c
      if (b <= c) {
        lo[n] = a, hi[n++] = b;
      } else {
        lo[n] = a, hi[n++] = c;
        lo[n] = 0, hi[n++] = b - c;
      }
    }
  };
  std::vector<place_of> places;
  for (std::uint32_t k = 0; k < P.items.size(); ++k) {
    const auto& it = P.items[k];
    if (!it.planned) continue;
    for (int copy = 0; copy < (any_carried ? 2 : 1); ++copy) {
      place_of pl{k, copy == 1, 0, {}, {}, 0};
      pl.add(it.t0 + copy * T, it.t1 + copy * T, C);
      places.push_back(pl);
    }
  }
  if (places.empty() || T == 0) return step_plan::build::failed;
  auto overlap = [](const place_of& a, const place_of& b) {
    for (int i = 0; i < a.n; ++i)
      for (int j = 0; j < b.n; ++j)
        if (a.lo[i] < b.hi[j] && b.lo[j] < a.hi[i]) return true;
    return false;
  };
  // In an order, each place at the lowest offset where it overlaps no place
  // laid out before it that is taken at some same time. The places laid out
  // are kept in offset order: a walk up from offset 0 skips those taken at
  // other times and stops at the first gap wide enough (every place after it
  // lies higher still). Returns the top.
  std::vector<std::uint32_t> by_off;
  auto lay_out = [&](const std::vector<std::uint32_t>& order) {
    by_off.clear();
    by_off.reserve(order.size());
    std::size_t top = 0;
    for (std::uint32_t x : order) {
      auto& pl = places[x];
      const std::size_t size = P.items[pl.k].size;
      std::size_t at = 0;
      for (std::uint32_t j : by_off) {
        const auto& o = places[j];
        if (o.off >= at + size) break;
        if (overlap(pl, o)) at = std::max(at, o.off + P.items[o.k].size);
      }
      pl.off = at;
      top = std::max(top, at + size);
      auto pos = std::upper_bound(by_off.begin(), by_off.end(), at,
                                  [&](std::size_t off, std::uint32_t j) { return off < places[j].off; });
      by_off.insert(pos, x);
    }
    return top;
  };
  // The least the layout can take: the most bytes taken at one time.
  std::size_t least = 0;
  {
    std::vector<std::pair<std::uint64_t, std::int64_t>> ev;
    for (const auto& pl : places)
      for (int j = 0; j < pl.n; ++j) {
        ev.emplace_back(pl.lo[j], static_cast<std::int64_t>(P.items[pl.k].size));
        ev.emplace_back(pl.hi[j], -static_cast<std::int64_t>(P.items[pl.k].size));
      }
    std::sort(ev.begin(), ev.end());  // at one time, ends (negative) before starts
    std::int64_t now = 0;
    for (auto [t, d] : ev) least = static_cast<std::size_t>(std::max<std::int64_t>(static_cast<std::int64_t>(least), now += d));
  }
  // Two orders, the better kept: largest first (then earliest), which meets
  // the floor on a GPT-2 step whose blocks all live at once, and, when that
  // does not, most bytes x time first, which came within 4 % of the floor on
  // a GPT-2 training step with carried logits where largest first took 18 %
  // more (docs/BENCHMARKS.md section 1h).
  std::vector<std::uint32_t> order(places.size());
  for (std::uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  auto tie = [&](std::uint32_t x, std::uint32_t y) {
    const auto &a = P.items[places[x].k], &b = P.items[places[y].k];
    if (a.size != b.size) return a.size > b.size;
    if (places[x].lo[0] != places[y].lo[0]) return places[x].lo[0] < places[y].lo[0];
    return places[x].second < places[y].second;
  };
  std::sort(order.begin(), order.end(), tie);
  std::size_t top = lay_out(order);
  if (top > least) {
    std::vector<std::size_t> kept(places.size());
    for (std::uint32_t i = 0; i < places.size(); ++i) kept[i] = places[i].off;
    std::vector<double> area(places.size());
    for (std::uint32_t i = 0; i < places.size(); ++i) {
      std::uint64_t t = 0;
      for (int j = 0; j < places[i].n; ++j) t += places[i].hi[j] - places[i].lo[j];
      area[i] = static_cast<double>(P.items[places[i].k].size) * static_cast<double>(t);
    }
    std::sort(order.begin(), order.end(),
              [&](std::uint32_t x, std::uint32_t y) { return area[x] != area[y] ? area[x] > area[y] : tie(x, y); });
    const std::size_t top2 = lay_out(order);
    if (top2 < top) {
      top = top2;
    } else {
      for (std::uint32_t i = 0; i < places.size(); ++i) places[i].off = kept[i];
    }
  }
  for (const auto& pl : places) (pl.second ? P.items[pl.k].off_odd : P.items[pl.k].off) = pl.off;
  // The plan's address space: from the first page past every live or pending
  // block of the large arena (the free pages above them, mapped or not, are
  // the plan's to use; a dropped plan's room is used again).
  detail::arena* a = arenas[1];
  std::size_t start = 0;
  for (const block* x = a->first; x; x = x->next)
    if (x->state != block::free_state) start = x->addr + x->size - a->base;
  start = round_up(start, page);
  if (start > a->size || a->size - start < top) return step_plan::build::failed;
  if (opt.plan_needs_moves) {
    // The plan's first step maps a page wherever its space has none: made
    // only once the steps without it have moved a share of as many (rent
    // paid before buying; step_plan::plan_rent_share).
    const std::size_t price =
        std::max<std::size_t>(unmapped_inside(a, a->base + start, round_up(top, page)) / step_plan::plan_rent_share, 1);
    if (page_moves() - P.moves_base < price) {
      P.buy_at = price;
      return step_plan::build::skipped;
    }
  }
  P.base = a->base + start;
  // Every recorded request of a size, in request order: the n-th request of
  // that size in a later step is the n-th recorded one, planned or not.
  P.by_size.clear();
  for (std::uint32_t k = 0; k < P.items.size(); ++k) P.by_size[P.items[k].size].push_back(k);
  P.open.clear();
  P.seen.clear();
  P.cursor = nullptr;
  P.odd = false;
  P.step_bytes = P.missed_bytes = 0;
  P.ph = step_plan::phase::planned;
  P.planned_marks = 0;
  ++ctr.plans_made;
  ctr.plan_bytes = top;
  return step_plan::build::made;
}

// The request's planned place, when the plan has one for it and every block
// there is free and the requester's to take; nullptr otherwise (a miss: the
// request is placed as usual).
block* pool_resource::impl::plan_place(std::size_t size, std::uint32_t slot) {
  auto& P = plan;
  P.step_bytes += size;
  auto miss = [&]() -> block* {
    ++ctr.plan_missed;
    P.missed_bytes += size;
    return nullptr;
  };
  auto list = P.by_size.find(size);
  std::uint32_t& n = P.seen[size];
  if (list == P.by_size.end() || n >= list->second.size()) {
    ++n;
    return miss();
  }
  auto& item = P.items[list->second[n++]];
  if (!item.planned) {  // left out of the plan (long-lived, or used by another stream): not a miss
    P.step_bytes -= size;
    return nullptr;
  }
  detail::arena* a = arenas[1];
  const int parity = P.two_steps && P.odd ? 1 : 0;
  const std::uintptr_t at = P.base + (parity ? item.off_odd : item.off);
  // The free block holding `at`: where the last block placed there went, else
  // a walk (by address) from it or from the block the plan placed last.
  auto holds = [&](const block* x) { return x && x->ar == a && x->addr <= at && at < x->addr + x->size; };
  auto find = [&] {
    block* f = item.hint[parity];
    if (!holds(f)) {
      f = f && f->ar == a ? f : P.cursor && P.cursor->ar == a ? P.cursor : a->first;
      while (f->addr > at) f = f->prev;
      while (f->addr + f->size <= at) f = f->next;
    }
    return f;
  };
  // Free blocks there that another stream freed: once its work there is
  // known done they are everyone's (reclaim_streams, not waiting), and the
  // place is looked for again (the reclaim merges blocks).
  block* f = find();
  for (bool reclaimed = false;;) {
    bool fits = false, foreign = false;
    for (block* x = f; x; x = x->next) {
      if (!runs_with(x, slot)) {
        foreign = x->state == block::free_state;
        break;
      }
      if (x->addr + x->size >= at + size) {
        fits = true;
        break;
      }
    }
    if (fits) break;
    if (!foreign || reclaimed || slots.size() <= 2 || !reclaim_streams(false, false)) return miss();
    reclaimed = true;
    f = find();
  }
  block* b = place(f, at, size, slot);
  if (!b) return miss();
  item.hint[parity] = P.cursor = b;
  ++ctr.plan_placed;
  return b;
}

}  // namespace vramkit
