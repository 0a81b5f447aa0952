// Page supply: the physical pages a placement needs, from (in order) the
// spares, new pages within the growth slack, pages made ahead (map_ahead),
// free pages stolen from shared free blocks, other streams' finished frees,
// the requester's own free blocks without waiting (remap_own), new pages up
// to the reserve limit, and the requester's own free blocks after waiting for
// its stream (with wait_to_remap, before new pages). Also destroys pages
// given back.
#include <algorithm>
#include <vector>

#include "pool_impl.hpp"

namespace vramkit {

// Whether the pool may grow by `bytes` before any free page is moved: within
// the reserve limit and, when remapping, with `counted` of them within
// `slack` of the live peak (growth_slack; remap_own_slack before the own
// stream's frees are taken early; a block about to hold need_live bytes
// counts), so the pool reuses its own free pages rather than grow with every
// new shape of request. A new page counts whole; a growth chunk not at all
// (growth_chunks: the pool, within its slack, runs at most a chunk ahead).
bool pool_resource::impl::may_grow_by(std::size_t bytes, std::size_t counted, std::size_t need_live,
                                      double slack) const {
  if (reserved + bytes > limit) return false;
  if (!opt.remap) return true;
  // Pages made ahead (map_ahead) are a bounded extra, not growth.
  return static_cast<double>(reserved - held_ahead_bytes() + counted) <=
         (1.0 + slack) * static_cast<double>(std::max(need_live, peak_live));
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
// frees lets the caller create pages). With an early mark (remap_own: the
// block's work may not be done), it takes single pages only, their kept
// mappings carrying the mark.
std::size_t pool_resource::impl::steal(std::uint32_t slot, std::size_t want, std::vector<page_handle>& out,
                                       std::uint32_t mark) {
  auto& s = slots[slot];
  block* b = s.steal_head;
  if (!b || want == 0) return 0;
  // The highest page of a free block that may move: mapped, and not in a
  // chunk that reaches outside the block (lo when none is; the caller checks).
  // (A chunk cannot be given back under work that may still use it.)
  auto movable_top = [&](const block* x, std::size_t lo, std::size_t hi) {
    const detail::arena* xa = x->ar;
    if (xa->chunk_bits.empty() || !chunk_pages) return last_mapped_page(xa, lo, hi - 1);
    if (xa->top <= lo) return lo;
    const auto inside = chunks_inside(xa, lo, hi);  // chunk pages there: chunks wholly inside
    const std::size_t clo = inside.first, chi = inside.second;
    return detail::last_page_where(lo, detail::below_top(xa, hi - 1), [&](std::size_t w) {
      return xa->mapped_bits[w] & ~(xa->chunk_bits[w] & (mark ? ~std::uint64_t{0} : ~detail::word_range(w, clo, chi)));
    });
  };
  auto movable = [&](const detail::arena* xa, std::size_t p, std::size_t lo, std::size_t hi) {
    if (!xa->mapped(p)) return false;
    if (!xa->in_chunk(p)) return true;
    const auto [c, k] = chunk_span(xa, p);
    return !mark && c >= lo && c + k <= hi;
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
    const std::size_t k = give_back_chunk(a, chunk_span(a, p).first);
    slots.pages_taken(b, k);
    return k;
  }
  std::size_t first = p;
  while (first > lo && a->mapped(first - 1) && !a->in_chunk(first - 1) && p + 1 - first < want) --first;
  std::size_t k = p + 1 - first;
  out.reserve(out.size() + k);  // nothing below may fail once pages start to move
  if (opt.keep_mappings) {
    stale += k;  // still mapped there, no longer in use there
    if (mark) {
      for (std::size_t q = first; q <= p; ++q) {
        a->early[q] = mark;
        early_got.push_back(a->handles[q]);
      }
      early[mark].pages += k;
      early[mark].seq = std::max(early[mark].seq, b->seq);
      early_pages += k;
      ctr.pages_taken_early += k;
    }
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
        try {
          settle_early(a, p, e);
        } catch (...) {  // the device failed: nothing waits on it any more
          forget_early(a, p, e);
        }
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
                                  std::vector<page_handle>& out, std::size_t edges) {
  out.clear();
  acquire_mark = 0;
  early_got.clear();
  try {
    if (acquire_some(n, need_live, slot, out, edges)) return true;
  } catch (...) {
    // Pages taken so far stay with the pool as spares: nothing leaks.
    spares_from_acquire(out);
    throw;
  }
  spares_from_acquire(out);
  return false;
}

// Pages an acquire took that no block will hold become spares, which any
// stream may take: those taken early (remap_own) only once their old
// block's work is done.
void pool_resource::impl::spares_from_acquire(std::vector<page_handle>& hs) noexcept {
  finish_early(acquire_mark);
  spare_handles.insert(spare_handles.end(), hs.begin(), hs.end());
  hs.clear();
}

// Waits, when it is not done yet, for the work that mark m's pages' old
// blocks queued, and closes m. An event call that fails is taken for a
// device that failed (its work will not run): the pages go on without it.
void pool_resource::impl::finish_early(std::uint32_t m) noexcept {
  if (!m) return;
  try {
    await_early(m);
  } catch (...) {
    close_early(m);
  }
}

// Waits for mark m's event unless its work is known done, and closes m.
// A query that fails is not an answer: the wait decides. Throws what the
// wait throws, with m still open.
void pool_resource::impl::await_early(std::uint32_t m) {
  if (early[m].done) return;
  bool done = early_known_done(m);
  if (!done) {
    try {
      done = streams->done(early[m].e);
    } catch (...) {
    }
  }
  if (!done) {
    {
      gpu_wait w{ctr};
      streams->wait(early[m].e);
    }
    ++ctr.early_waits;
  }
  close_early(m);
}

bool pool_resource::impl::acquire_some(std::size_t n, std::size_t need_live, std::uint32_t slot,
                                       std::vector<page_handle>& out, std::size_t edges) {
  bool reclaimed = false, waited = false;
  std::uint32_t& mark = acquire_mark;  // remap_own: the early mark of this call's pages
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
  // (Not a stream being captured: an event there would join the graph.)
  auto wait_and_steal_own = [&] {
    if (!opt.remap || slot == 0 || !slots[slot].steal_head) return false;
    if (!waited) {
      if (streams->capturing(slots[slot].stream)) return false;
      {
        gpu_wait w{ctr};
        streams->wait_for_stream(slots[slot].stream);
      }
      waited = true;
    }
    return steal_from(slot);
  };
  // The steps that move the pages to a new plan's places (its first step, and
  // the second of a two-step plan) take free pages before they grow: the
  // steps before the plan held their live peak within what the pool has, and
  // growth there stays for good (plan_moves_grow: false).
  const bool moving = !opt.plan_moves_grow && plan.ph == step_plan::phase::planned &&
                      plan.planned_marks < (plan.two_steps ? 2u : 1u);
  const double slack = moving ? 0.0 : opt.growth_slack;
  while (out.size() < n) {
    if (!spare_handles.empty()) {
      out.push_back(spare_handles.back());
      spare_handles.pop_back();
      continue;
    }
    if (may_grow_by(page, page, need_live, slack) || (room && reserved + page <= limit)) {
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
    // remap_own: growth up to remap_own_slack before the own stream's frees.
    if (!moving && opt.remap_own && opt.remap_own_slack > opt.growth_slack && slot != 0 &&
        may_grow_by(page, page, need_live, opt.remap_own_slack)) {
      if (page_handle h = create_page()) {
        out.push_back(h);
        continue;
      }
    }
    if (opt.remap_own && opt.remap && slot != 0) {
      // Early pages for the block's interior only: its edge pages, whose
      // other part another stream may get, take other pages (below: the own
      // stream's, after waiting for it, when nothing else is left).
      const std::size_t plain = out.size() - early_got.size();
      const std::size_t edge_short = plain < edges ? edges - plain : 0;
      if (n - out.size() > edge_short && steal_early(slot, n - out.size() - edge_short, out, mark)) continue;
    }
    // Rather than grow: with remap_own, when what the requester's own free
    // blocks hold is in chunks (which cannot move under unfinished work) or
    // only early pages are left for an edge page.
    if ((opt.wait_to_remap || opt.remap_own) && wait_and_steal_own()) continue;
    // Past the slack: nothing whole is left to move (what is free lies in
    // pages that live blocks share, or under work not known done).
    if (reserved + page <= limit) {
      if (page_handle h = create_page()) {
        ++ctr.pages_past_slack;
        out.push_back(h);
        continue;
      }
    }
    if (wait_and_steal_own()) continue;  // the device is full otherwise
    return false;  // acquire() puts what was taken back
  }
  return true;
}

// ---- remap_own: pages taken before their stream's work is known done ----

// Takes up to `want` pages from the requester's own free blocks without
// waiting for its stream (none while the stream is being captured: an event
// there would join the graph). The work queued on that stream later runs
// after the work that used them, so their new owner is safe. Their old
// addresses stay mapped; one event, recorded on the stream by the first such
// steal of an acquire (`mark`), says when those may be unmapped.
bool pool_resource::impl::steal_early(std::uint32_t slot, std::size_t want, std::vector<page_handle>& out,
                                      std::uint32_t& mark) {
  auto& s = slots[slot];
  if (!s.steal_head || streams->capturing(s.stream)) return false;
  early_got.reserve(early_got.size() + want);  // no allocation below once pages are taken
  if (!mark) {
    poll_early();
    early.reserve(early.size() + 1);
    early_idle.reserve(early.size() + 1);
    early_open.reserve(early.size() + 1);
    event_id e = 0;
    try {
      e = streams->record(s.stream);
    } catch (...) {
      return false;  // no event, no early pages: the pool grows instead
    }
    if (early_idle.empty()) {
      early.emplace_back();
      early_idle.push_back(static_cast<std::uint32_t>(early.size() - 1));
    }
    mark = early_idle.back();
    early_idle.pop_back();
    early[mark] = early_mark{e, s.stream, slot, 0, 0, false};
    early_open.push_back(mark);
  }
  if (steal(slot, want, out, mark)) return true;
  if (!early[mark].pages) {  // nothing taken under it: give it back
    close_early(mark);
    early_idle.push_back(mark);
    mark = 0;
  }
  return false;
}

// Whether the work of mark m's old blocks is known done without asking its
// event: an event of the stream that covers their frees completed (progress,
// reclaim, or a wait for the whole stream).
bool pool_resource::impl::early_known_done(std::uint32_t m) const {
  const auto& s = slots[early[m].slot];
  return std::max(s.done_seq, s.reclaimed_seq) >= early[m].seq;
}

// The event of mark m is done (or no longer needed): released, and m off the
// open list.
void pool_resource::impl::close_early(std::uint32_t m) noexcept {
  if (early[m].done) return;
  streams->release(early[m].e);
  early[m].done = true;
  if (auto it = std::find(early_open.begin(), early_open.end(), m); it != early_open.end()) early_open.erase(it);
}

// Closes the open marks known done or whose events are done (at most 8
// events asked, none on a stream being captured).
void pool_resource::impl::poll_early() noexcept {
  int asked = 0;
  for (std::size_t i = 0; i < early_open.size();) {
    const std::uint32_t m = early_open[i];
    bool done = early_known_done(m);
    if (!done && asked < 8 && !streams->capturing(early[m].stream)) {
      ++asked;
      try {
        done = streams->done(early[m].e);
      } catch (...) {
      }
    }
    if (done)
      close_early(m);  // takes it off the list: i now names the next
    else
      ++i;
  }
}

// Before the kept mappings of [p, e) of arena a are unmapped (or mapped
// over): waits for the events of the early marks they carry that are not
// done yet, then clears the marks. Throws what the wait throws, with nothing
// changed.
void pool_resource::impl::settle_early(detail::arena* a, std::size_t p, std::size_t e) {
  if (!early_pages || a->early.empty()) return;
  for (std::size_t q = p; q < e; ++q)
    if (const std::uint32_t m = a->early[q]) await_early(m);
  forget_early(a, p, e);
}

// Clears the early marks of [p, e) of arena a (their mappings are being
// reused, or their work is known done); a mark no page carries any more is
// closed and kept for reuse.
void pool_resource::impl::forget_early(detail::arena* a, std::size_t p, std::size_t e) noexcept {
  if (!early_pages || a->early.empty()) return;
  for (std::size_t q = p; q < e; ++q) {
    const std::uint32_t m = a->early[q];
    if (!m) continue;
    a->early[q] = 0;
    --early_pages;
    if (--early[m].pages == 0) {
      close_early(m);
      early_idle.push_back(m);
    }
  }
}

}  // namespace vramkit
