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
//                   calls of libraries); the chunks made before it that lie
//                   in free memory go back, and no more are made
//   warming -> recording: each large request's size and tick (a count of
//                   large requests and frees), and the tick of its free
//   recording -> following: no more requests recorded; the recorded blocks'
//                   frees are still followed into this step (blocks living
//                   across the step boundary)
//   following -> planned: when this step made the recorded step's requests
//                   again (by size and count, 95 % of its bytes), plan_build
//                   lays the recorded blocks out, the step
//                   being a circle of `length` ticks; a block never freed by
//                   now is left out (weights, optimizer state: they stay where
//                   they are)
//   planned: each step's misses are counted; more than 5 % of its bytes and
//                   the plan is dropped: after 4, 8, 16, ... 256 steps of rest
//                   (longer after each drop), recording starts again
#include <algorithm>
#include <vector>

#include "pool_impl.hpp"

namespace vramkit {

void pool_resource::impl::mark_step() {
  if (!opt.plan_steps || upstream) return;
  auto& P = plan;
  // The chunks go back at the first mark; when the pool could not wait for
  // the GPU then, at the next marks until it could.
  if (P.ph == step_plan::phase::off) P.chunks_to_give_back = true;
  if (P.chunks_to_give_back) P.chunks_to_give_back = !plan_give_back_chunks();
  switch (P.ph) {
    case step_plan::phase::off:
      P.ph = step_plan::phase::warming;  // from here on no chunk is made (chunks.cpp)
      break;
    case step_plan::phase::warming:
      if (P.rest > 0) {  // resting after a dropped plan
        --P.rest;
        break;
      }
      plan_record_start();
      break;
    case step_plan::phase::recording:
      P.length = P.tick;
      P.ph = step_plan::phase::following;
      break;
    case step_plan::phase::following:
      if (!plan_build()) {
        ++P.unplanned;
        plan_record_start();
      }
      break;
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
        P.seen.clear();
        P.step_bytes = P.missed_bytes = 0;
      }
      break;
  }
}

// At the first mark: the chunks lying wholly in free memory go back. Chunks
// are made only before it (the program's start and, when the optimizer marks
// the steps, its first step: single pages would cost that step about three
// times the driver's time), and one left there would pin memory where later
// steps' blocks, and the plan, do not want it: blocks placed over part of a
// chunk keep the rest of it from moving (docs/BENCHMARKS.md section 1h). So
// the driver's time for those pages moves to the next step, where single
// pages are made. Only memory the GPU is done with goes: the pool waits for
// the streams' work freed so far (not while one of its streams is being
// captured, when it takes what is known done). True when it could wait (the
// chunks left are under live blocks); false to try again at the next mark.
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
    for (std::size_t c = round_up(lo, chunk); c + chunk <= hi; c += chunk)
      if (a->in_chunk(c)) {
        give_back_chunk(a, c);
        slots.pages_taken(b, chunk);
      }
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

// Lays the recorded blocks out: largest first (then earliest), each at the
// lowest offset where it overlaps no block placed before it that is alive at
// some same point of the step. A block freed in the next step lives over the
// step's end into its beginning (the circle). Then the plan's address space:
// past every live or pending block of the large arena.
bool pool_resource::impl::plan_build() {
  auto& P = plan;
  const std::uint64_t T = P.length;
  if (P.items.size() > step_plan::max_items) return false;  // the layout's time grows as the square
  // Only steps that repeat: the step after the recorded one must have made the
  // same requests (by size and count) for at least 95 % of its bytes.
  {
    std::unordered_map<std::size_t, std::uint32_t> recorded;
    for (const auto& it : P.items) ++recorded[it.size];
    std::size_t same = 0;
    for (auto [size, n] : P.seen) {
      auto r = recorded.find(size);
      if (r != recorded.end()) same += static_cast<std::size_t>(std::min(n, r->second)) * size;
    }
    if (P.step_bytes == 0 || same * 20 < P.step_bytes * 19) return false;
  }
  std::vector<std::uint32_t> order;
  for (std::uint32_t k = 0; k < P.items.size(); ++k) {
    auto& it = P.items[k];
    // Kept out: never freed yet (long-lived), living more than a step, or
    // freed while another stream still used it.
    it.planned = it.t1 != 0 && (it.t1 <= T || it.t1 - T <= it.t0) && !it.pending;
    if (it.planned) order.push_back(k);
  }
  if (order.empty() || T == 0) return false;
  std::sort(order.begin(), order.end(), [&](std::uint32_t x, std::uint32_t y) {
    const auto &a = P.items[x], &b = P.items[y];
    return a.size != b.size ? a.size > b.size : a.t0 < b.t0;
  });
  // An item's life as up to two intervals of [0, T).
  auto overlap = [T](const step_plan::item& a, const step_plan::item& b) {
    auto parts = [T](const step_plan::item& x, std::uint64_t (&lo)[2], std::uint64_t (&hi)[2]) {
      lo[0] = x.t0;
      hi[0] = std::min(x.t1, T);
      if (x.t1 > T) {
        lo[1] = 0;
        hi[1] = x.t1 - T;
        return 2;
      }
      return 1;
    };
    std::uint64_t al[2], ah[2], bl[2], bh[2];
    const int na = parts(a, al, ah), nb = parts(b, bl, bh);
    for (int i = 0; i < na; ++i)
      for (int j = 0; j < nb; ++j)
        if (al[i] < bh[j] && bl[j] < ah[i]) return true;
    return false;
  };
  // The placed blocks in offset order: a walk up from offset 0 skips those
  // living at other times and stops at the first gap wide enough (every
  // block after it lies higher still).
  std::vector<std::uint32_t> by_off;
  by_off.reserve(order.size());
  std::size_t top = 0;
  for (std::uint32_t k : order) {
    auto& it = P.items[k];
    std::size_t at = 0;
    for (std::uint32_t j : by_off) {
      const auto& o = P.items[j];
      if (o.off >= at + it.size) break;
      if (overlap(it, o)) at = std::max(at, o.off + o.size);
    }
    it.off = at;
    top = std::max(top, at + it.size);
    auto pos = std::upper_bound(by_off.begin(), by_off.end(), at,
                                [&](std::size_t off, std::uint32_t j) { return off < P.items[j].off; });
    by_off.insert(pos, k);
  }
  // The plan's address space: from the first page past every live or pending
  // block of the large arena (the free pages above them, mapped or not, are
  // the plan's to use; a dropped plan's room is used again).
  detail::arena* a = arenas[1];
  std::size_t start = 0;
  for (const block* x = a->first; x; x = x->next)
    if (x->state != block::free_state) start = x->addr + x->size - a->base;
  start = round_up(start, page);
  if (start > a->size || a->size - start < top) return false;
  P.base = a->base + start;
  // Every recorded request of a size, in request order: the n-th request of
  // that size in a later step is the n-th recorded one, planned or not.
  P.by_size.clear();
  for (std::uint32_t k = 0; k < P.items.size(); ++k) P.by_size[P.items[k].size].push_back(k);
  P.open.clear();
  P.seen.clear();
  P.cursor = nullptr;
  P.step_bytes = P.missed_bytes = 0;
  P.ph = step_plan::phase::planned;
  ++ctr.plans_made;
  ctr.plan_bytes = top;
  return true;
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
  const std::uintptr_t at = P.base + item.off;
  // The free block holding `at`: where the last block placed there went, else
  // a walk (by address) from it or from the block the plan placed last.
  auto holds = [&](const block* x) { return x && x->ar == a && x->addr <= at && at < x->addr + x->size; };
  block* f = item.hint;
  if (!holds(f)) {
    f = f && f->ar == a ? f : P.cursor && P.cursor->ar == a ? P.cursor : a->first;
    while (f->addr > at) f = f->prev;
    while (f->addr + f->size <= at) f = f->next;
  }
  for (block* x = f;; x = x->next) {
    if (!x || !runs_with(x, slot)) return miss();
    if (x->addr + x->size >= at + size) break;
  }
  block* b = place(f, at, size, slot);
  if (!b) return miss();
  item.hint = P.cursor = b;
  ++ctr.plan_placed;
  return b;
}

}  // namespace vramkit
