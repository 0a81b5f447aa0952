// Placement: where a request of `size` bytes goes. In order: a backed free
// block that fits (the stream's own or a shared one; the tightest, or with
// fit:address an exact fit else the lowest-addressed), other streams'
// finished frees, every block of the request's bin, then hollow space where
// the fewest pages must be mapped (inside one free block, or reaching over a
// run of free blocks the requester may use). The block found is split, and
// the pages it still lacks are mapped by page_mapping.cpp.
#include <algorithm>
#include <vector>

#include "pool_impl.hpp"

namespace vramkit {

// The free block with unmapped pages, and the place inside it, where a block
// of `size` needs the fewest new pages (a rare path: every hollow candidate
// of the two slots is looked at).
block* pool_resource::impl::best_hollow(std::size_t size, bool small, std::uint32_t slot, std::uintptr_t& at,
                                        std::size_t& best_cost) {
  block* best = nullptr;
  best_cost = ~std::size_t{0};
  const std::uint32_t order[2] = {slot, 0};
  const int n = slot == 0 ? 1 : 2;
  for (int i = 0; i < n; ++i) {
    slots[order[i]].hollow[small].for_each([&](block* b) {
      if (b->size < size || best_cost == 0) return;
      const detail::arena* a = b->ar;
      auto pages_of = [&](std::uintptr_t x, std::size_t& p0, std::size_t& p1) {
        p0 = (x - a->base) / page;
        p1 = (x + size - 1 - a->base) / page;
      };
      auto consider = [&](std::uintptr_t x, std::size_t cost) {
        if (cost < best_cost || (cost == best_cost && best && b->size < best->size)) {
          best = b;
          best_cost = cost;
          at = x;
        }
      };
      // At the block's start.
      std::size_t p0, p1;
      pages_of(b->addr, p0, p1);
      std::size_t c = 0;
      for (std::size_t p = p0; p <= p1; ++p) c += page_cost(a, p);
      consider(b->addr, c);
      // Against the block that follows (the gap's far end), when that needs
      // fewer new pages: the block then shares that neighbour's partly used
      // page instead of leaving a gap in it.
      if (b->next && b->size > size) {
        std::uintptr_t e = b->addr + b->size - size;
        std::size_t q0, q1, ce = 0;
        pages_of(e, q0, q1);
        for (std::size_t p = q0; p <= q1; ++p) ce += page_cost(a, p);
        if (ce < best_cost) {
          best = b;
          best_cost = ce;
          at = e;
        }
      }
      // At each page boundary inside, sliding the window one page at a time,
      // up to the last mapped page (past it every place costs the whole window).
      std::uintptr_t last_start = b->addr + b->size - size;
      std::uintptr_t x = (b->addr - a->base + page - 1) / page * page + a->base;
      if (x == b->addr) x += page;
      if (x > last_start) return;
      std::size_t hi_page = (b->addr + b->size - 1 - a->base) / page;
      std::size_t last_mapped = opt.map_ahead ? last_backed_page(a, p0, hi_page) : last_mapped_page(a, p0, hi_page);
      pages_of(x, p0, p1);
      c = 0;
      for (std::size_t p = p0; p <= p1; ++p) c += page_cost(a, p);
      while (true) {
        consider(x, c);
        if (best_cost == 0 || x + page > last_start || p0 > last_mapped) break;
        c -= page_cost(a, p0);
        x += page;
        std::size_t q0, q1;
        pages_of(x, q0, q1);
        for (std::size_t p = p1 + 1; p <= q1; ++p) c += page_cost(a, p);
        p0 = q0;
        p1 = q1;
      }
    });
  }
  return best;
}

// When every place inside one free block needs new pages: places reaching
// from a hollow block into the free blocks next to it that the requester
// may also use (its own stream's and shared ones, see runs_with), at the
// start and at the end of such a run. A block at the edge of mapped memory
// then takes the free pages below the edge instead of only fresh ones past
// it. Returns a block of the run, with `at`, when cheaper than `best_cost`.
block* pool_resource::impl::best_run(std::size_t size, bool small, std::uint32_t slot, std::uintptr_t& at,
                                     std::size_t best_cost) {
  block* best = nullptr;
  if (slot == 0) return nullptr;
  const std::uint32_t order[2] = {slot, 0};
  for (std::uint32_t sl : order) {
    slots[sl].hollow[small].for_each([&](block* b) {
      if (best_cost == 0) return;
      const bool before = runs_with(b->prev, slot), past = runs_with(b->next, slot);
      if (!before && !past) return;
      std::uintptr_t lo = b->addr, hi = b->addr + b->size;
      for (const block* x = b->prev; runs_with(x, slot); x = x->prev) lo = x->addr;
      const block* after = b->next;
      while (runs_with(after, slot)) {
        hi = after->addr + after->size;
        after = after->next;
      }
      if (hi - lo < size) return;
      const detail::arena* a = b->ar;
      auto cost_at = [&](std::uintptr_t x) {
        std::size_t c = 0;
        for (std::size_t p = (x - a->base) / page, e = (x + size - 1 - a->base) / page; p <= e; ++p)
          c += page_cost(a, p);
        return c;
      };
      for (std::uintptr_t x : {lo, hi - size}) {
        std::size_t c = cost_at(x);
        if (c < best_cost) {
          best = b;
          best_cost = c;
          at = x;
        }
      }
    });
  }
  return best;
}

// Joins the neighbouring blocks first..last (out of every free index) into
// first; its unmapped count is left for the caller to set.
block* pool_resource::impl::join(block* first, block* last) {
  while (first != last) {
    block* nx = first->next;
    first->size += nx->size;
    first->seq = std::max(first->seq, nx->seq);
    first->next = nx->next;
    if (nx->next) nx->next->prev = first;
    if (nx == last) last = first;
    blocks.recycle(nx);
  }
  return first;
}

// Cuts [at, at+size) out of the run of free blocks around b that the
// requester of `slot` may take (see runs_with), for a place best_run found
// reaching past b: the pieces inside become one free block of `slot`, the
// parts outside stay free where they were (their slots unchanged).
block* pool_resource::impl::carve_run(block* b, std::uintptr_t at, std::size_t size, std::uint32_t slot) {
  block* f = b;  // the block holding `at`: before b, in b or after it
  while (f->addr > at) f = f->prev;
  while (f->addr + f->size <= at) f = f->next;
  block* l = f;
  while (l->addr + l->size < at + size) l = l->next;
  for (block* x = f;; x = x->next) {
    slots.remove(x);
    if (x == l) break;
  }
  detail::arena* a = b->ar;
  auto cut = [&](block* x, std::uintptr_t c) {  // x keeps [addr, c); returns [c, end)
    block* r = blocks.make();
    r->addr = c;
    r->size = x->addr + x->size - c;
    r->ar = a;
    r->prev = x;
    r->next = x->next;
    if (x->next) x->next->prev = r;
    x->next = r;
    x->size = c - x->addr;
    r->seq = x->seq;
    r->slot = x->slot;
    r->state = block::free_state;
    return r;
  };
  block* left = nullptr;
  block* right = nullptr;
  if (f->addr < at) {
    left = f;
    f = cut(f, at);
    if (l == left) l = f;
  }
  if (l->addr + l->size > at + size) right = cut(l, at + size);
  block* m = join(f, l);
  for (block* x : {left, right, m}) {
    if (!x) continue;
    x->unmapped = unmapped_inside(a, x->addr, x->size);
    slots.insert(x, x == m ? slot : x->slot);
  }
  return m;
}

// A carved place could not be backed: it and the run around it become one
// free block of the requester (edges that shared an unmapped page with it
// are inside again).
void pool_resource::impl::uncarve(block* b, std::uint32_t slot) {
  block* first = b;
  while (runs_with(first->prev, slot)) first = first->prev;
  block* last = b;
  while (runs_with(last->next, slot)) last = last->next;
  for (block* x = first;; x = x->next) {
    if (x != b) slots.remove(x);
    if (x == last) break;
  }
  block* m = join(first, last);
  m->unmapped = unmapped_inside(m->ar, m->addr, m->size);
  slots.insert(m, slot);
}

block* pool_resource::impl::try_place(std::size_t size, bool small, std::uint32_t slot, stream_t stream) {
  // fit:address (large requests), below the peak: where the request takes live bytes to within a
  // 16th of the peak live so far (the pool growing, or at its peak), the tightest fit packs best.
  const bool by_address = opt.fit_address && !small && live_bytes + size <= peak_live - peak_live / 16;
  block* b = slots.find_fit(size, small, slot, false, by_address);
  // Before taking fresh pages, let other streams' finished frees serve.
  if (!b && slots.size() > 2 && reclaim_streams(false, false)) b = slots.find_fit(size, small, slot, false, by_address);
  // Every block of the request's own bin, before mapping anything new.
  if (!b) b = slots.find_fit_exhaustive(size, small, slot);
  // Hollow space: where the fewest pages must be mapped.
  std::uintptr_t at = 0;
  if (!b && upstream) b = slots.find_fit(size, small, slot, true, by_address);
  if (!b && !upstream) {
    std::size_t cost = 0;
    b = best_hollow(size, small, slot, at, cost);  // cost: all ones when none fits
    if (cost > 0)
      if (block* r = best_run(size, small, slot, at, cost)) b = r;
  }
  if (!b && upstream) {
    if (!grow_segment(size, small, stream)) return nullptr;
    b = slots.find_fit(size, small, slot, false, by_address);
  }
  if (!b) return nullptr;
  return place(b, at, size, slot);
}

// Places a block of `size` at `at` (0: at b's start) in free block b, or in
// the run of free blocks around b the requester of `slot` may take when the
// place reaches past b (carve_run), and maps the pages it lacks. Returns the
// block, or nullptr with everything free again as it was when no pages could
// be had.
block* pool_resource::impl::place(block* b, std::uintptr_t at, std::size_t size, std::uint32_t slot) {
  const bool carved = at && (at < b->addr || at + size > b->addr + b->size);
  if (carved) {
    b = carve_run(b, at, size, slot);
    at = b->addr;
  }
  std::uint32_t from = b->slot;
  slots.remove(b);
  detail::arena* a = b->ar;
  const bool split_left = at > b->addr;
  if (split_left) {
    // Placed inside the free block: the part before it stays free.
    block* l = blocks.make();
    l->addr = b->addr;
    l->size = at - b->addr;
    l->ar = a;
    l->prev = b->prev;
    l->next = b;
    if (b->prev) b->prev->next = l; else a->first = l;
    b->prev = l;
    l->seq = b->seq;
    l->unmapped = unmapped_inside(a, l->addr, l->size);
    b->unmapped -= l->unmapped;
    b->size -= l->size;
    b->addr = at;
    slots.insert(l, from);
  }
  // Not free while being placed: a merge triggered below must not absorb it.
  b->state = block::live_state;
  std::size_t un_l = 0;  // unmapped pages under the part handed out
  if (a->paged) {
    std::size_t p0 = (b->addr - a->base) / page, p1 = (b->addr + size - 1 - a->base) / page;
    for (std::size_t p = p0; p <= p1; ++p) un_l += !a->mapped(p);
  }
  // Split first, so the remainder's mapped pages can be remapped under the
  // new block instead of growing. The remainder keeps b's slot.
  const bool split = b->size - size >= opt.alignment;
  if (split) {
    block* r = blocks.make();
    r->addr = b->addr + size;
    r->size = b->size - size;
    r->ar = a;
    r->prev = b;
    r->next = b->next;
    if (b->next) b->next->prev = r;
    b->next = r;
    r->unmapped = b->unmapped - un_l;
    r->seq = b->seq;
    b->size = size;
    slots.insert(r, from);
  }
  if (un_l) {
    // On failure b is free again, where it came from. While pages were
    // being found, a part cut off above (after it, or before it when the
    // two share a page) may have been handed to the shared slot (its
    // stream's work was done; b was freed at the same time): then b goes
    // there too, so the page they share is inside one free block again.
    auto put_back = [&] {
      if (carved) {
        b->state = block::free_state;
        uncarve(b, from);
        return;
      }
      b->unmapped = un_l;
      std::uint32_t to = from;
      if (split && b->next && b->next->state == block::free_state && b->next->slot != from)
        to = b->next->slot;
      else if (split_left && b->prev && b->prev->state == block::free_state && b->prev->slot != from)
        to = b->prev->slot;  // (only one side can share a page: see best_hollow)
      slots.free_into(b, to, b->seq, blocks);
    };
    bool ok = false;
    std::size_t newly = 0;
    try {
      ok = back(b, size, live_bytes + size, slot, newly);
    } catch (...) {
      put_back();
      throw;
    }
    if (!ok) {
      put_back();
      return nullptr;
    }
  }
  b->unmapped = 0;
  return b;
}

}  // namespace vramkit
