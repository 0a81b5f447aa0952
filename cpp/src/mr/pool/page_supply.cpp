// Page supply: the physical pages a placement needs, from (in order) the
// spares, new pages within the growth slack, pages made ahead (map_ahead),
// free pages stolen from shared free blocks, other streams' finished frees,
// new pages up to the reserve limit, and the requester's own free blocks
// after waiting for its stream (with wait_to_remap, before new pages). Also
// destroys pages given back.
#include <algorithm>
#include <vector>

#include "pool_impl.hpp"

namespace vramkit {

// Whether the pool may grow by `bytes` before any free page is moved: within
// the reserve limit and, when remapping, with `counted` of them within
// growth_slack of the live peak (a block about to hold need_live bytes
// counts), so the pool reuses its own free pages rather than grow with every
// new shape of request. A new page counts whole; a growth chunk not at all
// (growth_chunks: the pool, within its slack, runs at most a chunk ahead).
bool pool_resource::impl::may_grow_by(std::size_t bytes, std::size_t counted, std::size_t need_live) const {
  if (reserved + bytes > limit) return false;
  if (!opt.remap) return true;
  // Pages made ahead (map_ahead) are a bounded extra, not growth.
  return static_cast<double>(reserved - held_ahead_bytes() + counted) <=
         (1.0 + opt.growth_slack) * static_cast<double>(std::max(need_live, peak_live));
}

// A new physical page from the device (0 when it has none left), counted.
page_handle pool_resource::impl::create_page() {
  page_handle h = pages->create();
  if (h) {
    reserved += page;
    peak_reserved = std::max(peak_reserved, reserved);
    ++ctr.pages_created;
    ++st.upstream_allocs;
    st.upstream_alloc_bytes += page;
  }
  return h;
}

// Takes up to `want` mapped pages wholly inside a stealable free
// block of `slot` (one contiguous run, from its high end; unmapped in one
// call, or kept mapped there with keep_mappings) and
// appends their physical pages to out. Returns how many pages it took or,
// where the highest page it may take is a chunk's (chunk_size), gives that
// chunk back instead and returns its page count (out unchanged: the room it
// frees lets the caller create pages).
std::size_t pool_resource::impl::steal(std::uint32_t slot, std::size_t want, std::vector<page_handle>& out) {
  auto& s = slots[slot];
  block* b = s.steal_head;
  if (!b || want == 0) return 0;
  // The highest page of a free block that may move: mapped, and not in a
  // chunk that reaches outside the block (lo when none is; the caller checks).
  auto movable_top = [&](const block* x, std::size_t lo, std::size_t hi) {
    const detail::arena* xa = x->ar;
    if (xa->chunk_bits.empty() || !chunk_pages) return last_mapped_page(xa, lo, hi - 1);
    const std::size_t clo = round_up(lo, chunk), chi = hi / chunk * chunk;  // chunks wholly inside
    return detail::last_page_where(lo, hi - 1, [&](std::size_t w) {
      return xa->mapped_bits[w] & ~(xa->chunk_bits[w] & ~detail::word_range(w, clo, chi));
    });
  };
  auto movable = [&](const detail::arena* xa, std::size_t p, std::size_t lo, std::size_t hi) {
    if (!xa->mapped(p)) return false;
    if (!xa->in_chunk(p)) return true;
    std::size_t c = p / chunk * chunk;
    return c >= lo && c + chunk <= hi;
  };
  std::size_t lo = 0, hi = 0, p = 0;
  auto try_block = [&](const block* x) {
    lo = round_up(x->addr - x->ar->base, page) / page;
    hi = (x->addr + x->size - x->ar->base) / page;
    if (hi <= lo) return false;
    p = movable_top(x, lo, hi);
    return p >= lo && p < hi && movable(x->ar, p, lo, hi);
  };
  // From the free block with the fewest mapped pages inside among the
  // oldest `steal_scan` (the oldest of equals): small scattered pieces go
  // first, long mapped runs stay whole for the large blocks that need them.
  if (!chunk_pages) {
    std::size_t least = interior_pages(b) - b->unmapped;
    int looked = 0;
    for (block* c = b->snext; c && least > 1 && ++looked < steal_scan; c = c->snext) {
      std::size_t m = interior_pages(c) - c->unmapped;
      if (m < least) {
        least = m;
        b = c;
      }
    }
    if (!try_block(b)) return 0;  // cannot happen while invariants hold
  } else {
    // With chunks, a free block whose mapped pages all belong to chunks
    // reaching outside it has nothing to give: only blocks that have are
    // ranked, and all the others are passed over, however many, so that trims
    // and requests at the limit find the chunks that can go back (free blocks
    // holding parts of chunks under live blocks come by the hundred with
    // growth_chunks, and may come so with any placement).
    b = nullptr;
    std::size_t least = 0, blo = 0, bhi = 0, bp = 0;
    int ranked = 0;
    for (block* c = s.steal_head; c && ranked < steal_scan; c = c->snext) {
      if (!try_block(c)) continue;
      ++ranked;
      std::size_t m = interior_pages(c) - c->unmapped;
      if (!b || m < least) {
        b = c;
        least = m;
        blo = lo, bhi = hi, bp = p;
        if (least <= 1) break;
      }
    }
    if (!b) return 0;
    lo = blo, hi = bhi, p = bp;
  }
  detail::arena* a = b->ar;
  if (a->in_chunk(p)) {
    give_back_chunk(a, p / chunk * chunk);
    slots.pages_taken(b, chunk);
    return chunk;
  }
  std::size_t first = p;
  while (first > lo && a->mapped(first - 1) && !a->in_chunk(first - 1) && p + 1 - first < want) --first;
  std::size_t k = p + 1 - first;
  if (opt.keep_mappings) {
    stale += k;  // still mapped there, no longer in use there
  } else {
    pages->unmap(a->base + first * page, k);
    for (std::size_t q = first; q <= p; ++q) a->phys[q] = 0;
    ctr.pages_unmapped += k;
  }
  for (std::size_t q = first; q <= p; ++q) {
    out.push_back(a->handles[q]);
    a->handles[q] = 0;
    a->set_mapped(q, false);
  }
  ctr.pages_remapped += k;
  slots.pages_taken(b, k);
  return k;
}

// Destroys pages given back to the device, unmapping first the stale
// mappings they keep (a page's memory is freed only once it is mapped
// nowhere).
void pool_resource::impl::drop_pages(const std::vector<page_handle>& hs) noexcept {
  if (hs.empty()) return;
  if (stale) {
    thread_local std::vector<page_handle> sorted;
    sorted.assign(hs.begin(), hs.end());
    std::sort(sorted.begin(), sorted.end());
    auto kept = [&](const detail::arena* a, std::size_t p) {
      return a->phys[p] && !a->mapped(p) && std::binary_search(sorted.begin(), sorted.end(), a->phys[p]);
    };
    for (auto* a : arenas) {
      if (!a->paged) continue;
      for (std::size_t p = 0; p < a->top;) {
        if (!kept(a, p)) {
          ++p;
          continue;
        }
        std::size_t e = p;
        while (e < a->top && kept(a, e)) ++e;
        pages->unmap(a->base + p * page, e - p);
        for (std::size_t q = p; q < e; ++q) a->phys[q] = 0;
        stale -= e - p;
        ctr.pages_unmapped += e - p;
        p = e;
      }
    }
  }
  for (auto h : hs) pages->destroy(h);
}

// Gets n physical pages for a block that will hold `need_live` live bytes.
// Only pages of blocks whose stream work is known complete (the shared
// slot) are remapped without waiting; the requester's own stream is waited
// for only when the device is otherwise full (or, with wait_to_remap,
// before growing past the slack).
bool pool_resource::impl::acquire(std::size_t n, std::size_t need_live, std::uint32_t slot,
                                  std::vector<page_handle>& out) {
  out.clear();
  try {
    if (acquire_some(n, need_live, slot, out)) return true;
  } catch (...) {
    // Pages taken so far stay with the pool as spares: nothing leaks.
    spare_handles.insert(spare_handles.end(), out.begin(), out.end());
    out.clear();
    throw;
  }
  spare_handles.insert(spare_handles.end(), out.begin(), out.end());
  out.clear();
  return false;
}

bool pool_resource::impl::acquire_some(std::size_t n, std::size_t need_live, std::uint32_t slot,
                                       std::vector<page_handle>& out) {
  bool reclaimed = false, waited = false;
  // Pages' worth of room a chunk given back by a steal left (chunk_size):
  // memory the pool held a moment ago, so new pages fill it past the slack.
  std::size_t room = 0;
  auto steal_from = [&](std::uint32_t from) {
    const std::size_t had = out.size();
    const std::size_t k = steal(from, n - out.size(), out);
    room += k - (out.size() - had);
    return k > 0;
  };
  // Pages of the requester's own free blocks, once its stream's queued work is done.
  auto wait_and_steal_own = [&] {
    if (!opt.remap || slot == 0 || !slots[slot].steal_head) return false;
    if (!waited) {
      streams->wait_for_stream(slots[slot].stream);
      waited = true;
    }
    return steal_from(slot);
  };
  while (out.size() < n) {
    if (!spare_handles.empty()) {
      out.push_back(spare_handles.back());
      spare_handles.pop_back();
      continue;
    }
    if (may_grow_by(page, page, need_live) || (room && reserved + page <= limit)) {
      if (page_handle h = create_page()) {
        if (room) --room;
        out.push_back(h);
        continue;
      }
    }
    // Pages made ahead (map_ahead), before free pages of blocks are moved; a
    // batch still being made counts as reserved already, so wait for it.
    if (!ahead_pages && inflight.active) wait_ahead();
    if (ahead_pages && take_ahead(n - out.size(), out)) continue;
    if (opt.remap) {
      if (steal_from(0)) continue;
      if (!reclaimed) {
        reclaimed = true;
        if (reclaim_streams(false)) continue;
      }
    }
    if (opt.wait_to_remap && wait_and_steal_own()) continue;  // rather than grow
    if (reserved + page <= limit) {
      if (page_handle h = create_page()) {
        out.push_back(h);
        continue;
      }
    }
    if (wait_and_steal_own()) continue;  // the device is full otherwise
    return false;  // acquire() puts what was taken back
  }
  return true;
}

}  // namespace vramkit
