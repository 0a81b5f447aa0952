// Page mapping: maps supplied pages under a placed block (pages coming back
// to an address that still maps them cost no call: keep_mappings).
#include <algorithm>
#include <vector>

#include "pool_impl.hpp"

namespace vramkit {

// Maps every unmapped page overlapping [b->addr, b->addr+size) of b's arena
// (b: the block being placed, not free while it is).
bool pool_resource::impl::back(block* b, std::size_t size, std::size_t need_live, std::uint32_t slot,
                               std::size_t& newly) {
  detail::arena* a = b->ar;
  const std::uintptr_t addr = b->addr;
  std::size_t p0 = (addr - a->base) / page, p1 = (addr + size - 1 - a->base) / page;
  std::size_t n = 0;
  for (std::size_t p = p0; p <= p1; ++p) n += !a->mapped(p);
  newly = n;
  if (n == 0) return true;
  // map_ahead: pages made ready here are taken as they are; the helper then
  // makes more if the pool grew.
  std::size_t used = 0;
  if (opt.map_ahead && !a->small) {
    used = use_ahead(a, p0, p1);
    n -= used;
  }
  struct wake_after {  // however back() ends
    impl* self;
    bool on;
    std::size_t made0, used;
    ~wake_after() {
      if (on) self->after_backing(self->ctr.pages_created - self->ctr.pages_made_ahead - made0, used);
    }
  } wake{this, opt.map_ahead && !a->small, ctr.pages_created - ctr.pages_made_ahead, used};
  // Unless the block ends up backed, the pages made ahead that it took are
  // made ahead again (acquire fails, or anything below throws): it goes back
  // free with the unmapped count it had.
  struct give_back_ahead {
    impl* self;
    detail::arena* a;
    bool armed;
    ~give_back_ahead() {
      if (armed) self->unuse_ahead(a);
    }
  } undo{this, a, used > 0};
  // chunk_size: bulk growth in chunks over the block's interior, single
  // pages for the rest (spares first: they are memory the pool holds
  // already). Unless the block ends up backed, the chunks go back.
  thread_local std::vector<std::size_t> chunks_made;
  chunks_made.clear();
  struct give_back_chunks {
    impl* self;
    block* b;
    bool armed, growth;
    ~give_back_chunks() {
      if (!armed) return;
      self->undo_chunks(b->ar, chunks_made);
      if (!growth) return;
      if (b->prev && b->prev->state == block::free_state) self->recount_free(b->prev);
      if (b->next && b->next->state == block::free_state) self->recount_free(b->next);
    }
  } undo_chunks_guard{this, b, false, false};
  if (chunk && !a->small && n >= chunk_min && n > spare_handles.size()) {
    undo_chunks_guard.armed = true;
    n -= make_chunks(a, addr, size, need_live, n - spare_handles.size(), chunks_made);
  }
  // growth_chunks: the places at the block's ends in chunks reaching past it
  // into free neighbours (spares first: they are memory the pool holds already).
  if (opt.growth_chunks && chunk && !a->small && n > spare_handles.size()) {
    undo_chunks_guard.armed = true;
    const std::size_t k = make_growth_chunk(b, size, need_live, chunks_made);
    undo_chunks_guard.growth = k > 0;
    n -= k;
  }
  if (n == 0) {
    undo.armed = false;
    undo_chunks_guard.armed = false;
    return true;
  }
  // Pages the block shares with its neighbours (partly covered) take the
  // first pages supplied and are not moved home (return_home): a fixed order,
  // so that a trace replays to the same addresses and counters every time.
  auto inside = [&](std::size_t p) {
    return a->base + p * page >= addr && a->base + (p + 1) * page <= addr + size;
  };
  const bool edge0 = !inside(p0) && !a->mapped(p0);
  const bool edge1 = p1 != p0 && !inside(p1) && !a->mapped(p1);
  const std::size_t edges = std::size_t{edge0} + std::size_t{edge1};
  thread_local std::vector<page_handle> got, hs;
  if (!acquire(n, need_live, slot, got, edges)) return false;
  // remap_own: a page taken early may still be used by its old block's work
  // on the requester's stream; an edge page's other part may go to another
  // stream, so the edges take pages that were not taken early, or wait.
  if (acquire_mark && edges) settle_edges(got, edges);
  // In page order: the first ones at the edges, the rest in between.
  hs.clear();
  {
    std::size_t c = 0, r = edges;
    for (std::size_t p = p0; p <= p1; ++p)
      if (!a->mapped(p)) hs.push_back(((p == p0 && edge0) || (p == p1 && edge1)) ? got[c++] : got[r++]);
  }
  if (stale) return_home(a, p0, p1, edge0, edge1, hs);
  std::size_t k = 0;  // pages of hs placed so far
  std::size_t p = p0;
  try {
    while (p <= p1) {
      if (a->mapped(p)) {
        ++p;
        continue;
      }
      // A page coming back where it is still mapped costs nothing; the
      // others replace what stale mapping is there.
      std::size_t run = p;
      while (run <= p1 && !a->mapped(run) && (a->phys[run] == hs[k + (run - p)]) == (a->phys[p] == hs[k]))
        ++run;
      for (std::size_t q = p; q < run; ++q) a->handles[q] = hs[k + (q - p)];
      if (a->phys[p] == hs[k]) {
        forget_early(a, p, run);
        stale -= run - p;
        ctr.mappings_reused += run - p;
      } else {
        settle_early(a, p, run);  // remap_own: old work on these addresses must be done
        const bool replaces = pages->map_replaces();
        for (std::size_t q = p; q < run;) {
          if (!a->phys[q]) {
            ++q;
            continue;
          }
          std::size_t e = q;
          while (e < run && a->phys[e]) a->phys[e++] = 0;
          if (!replaces) pages->unmap(a->base + q * page, e - q);  // else the map below replaces them
          stale -= e - q;
          ctr.pages_unmapped += e - q;
          q = e;
        }
        pages->map(a->base + p * page, &hs[k], run - p);
        for (std::size_t q = p; q < run; ++q) a->phys[q] = hs[k + (q - p)];
        a->top = std::max(a->top, run);
        ctr.pages_mapped += run - p;
        ++ctr.map_calls;
      }
      for (std::size_t q = p; q < run; ++q) a->set_mapped(q, true);
      k += run - p;
      p = run;
    }
  } catch (...) {
    // Undo this call: the pages placed so far keep their new mappings as
    // stale ones and go back to the spares with the rest; the pool stays
    // as it was, then rethrow.
    for (std::size_t q = p0; q < p; ++q)
      if (a->mapped(q) && std::find(hs.begin(), hs.begin() + k, a->handles[q]) != hs.begin() + k) {
        a->set_mapped(q, false);
        if (opt.keep_mappings) {
          ++stale;
        } else {
          pages->unmap(a->base + q * page, 1);
          a->phys[q] = 0;
        }
      }
    for (std::size_t q = p0; q <= p1; ++q)
      if (!a->mapped(q)) a->handles[q] = 0;
    spares_from_acquire(hs);
    throw;
  }
  undo.armed = false;
  undo_chunks_guard.armed = false;
  return true;
}

// Puts each page of hs (placed in page order over the unmapped pages of
// [p0, p1]) where it is still mapped, if that is one of those pages.
// The pages at the edges stay where they are.
void pool_resource::impl::return_home(const detail::arena* a, std::size_t p0, std::size_t p1, bool edge0, bool edge1,
                                      std::vector<page_handle>& hs) {
  thread_local std::vector<std::pair<page_handle, std::size_t>> where;  // page -> index in hs
  thread_local std::vector<std::size_t> slot_of;                        // index in hs -> page of the arena
  where.clear();
  slot_of.clear();
  for (std::size_t p = p0; p <= p1; ++p)
    if (!a->mapped(p)) slot_of.push_back(p);
  const std::size_t lo = edge0 ? 1 : 0, hi = hs.size() - (edge1 && hs.size() > lo ? 1 : 0);
  for (std::size_t i = lo; i < hi; ++i) where.emplace_back(hs[i], i);
  std::sort(where.begin(), where.end());
  for (std::size_t i = lo; i < hi; ++i) {
    page_handle want = a->phys[slot_of[i]];
    if (!want || want == hs[i]) continue;
    auto it = std::lower_bound(where.begin(), where.end(), std::make_pair(want, std::size_t{0}));
    if (it == where.end() || it->first != want) continue;
    std::size_t j = it->second;
    if (a->phys[slot_of[j]] == want) continue;  // already home there
    // hs[j] goes home to i; what was at i moves to j.
    auto jt = std::lower_bound(where.begin(), where.end(), std::make_pair(hs[i], std::size_t{0}));
    jt->second = j;
    it->second = i;
    std::swap(hs[i], hs[j]);
  }
}

// Puts pages that were not taken early first in got (the first `edges` go
// to the block's edge pages), or, when too few of them are, waits for the
// early pages' old work (finish_early).
void pool_resource::impl::settle_edges(std::vector<page_handle>& got, std::size_t edges) noexcept {
  std::sort(early_got.begin(), early_got.end());
  auto early_page = [&](page_handle h) { return std::binary_search(early_got.begin(), early_got.end(), h); };
  std::size_t j = edges;
  for (std::size_t i = 0; i < edges; ++i) {
    if (!early_page(got[i])) continue;
    while (j < got.size() && early_page(got[j])) ++j;
    if (j == got.size()) {
      finish_early(acquire_mark);
      return;
    }
    std::swap(got[i], got[j++]);
  }
}

}  // namespace vramkit
