// Chunks (chunk_size): where the large arena grows under one block, physical
// memory comes in handles of `chunk` pages, each mapped whole at a
// chunk-aligned place inside the block. The driver charges per handle, so a
// chunk of 16 pages costs about the calls of one page; and kernels streaming
// over large handles run faster than over 2 MiB ones. A chunk cannot be cut
// (the driver maps a handle only whole), so it never moves: the pool steals
// single pages only, and when it must move memory that a chunk holds, it
// gives back a chunk lying wholly inside free memory and makes pages instead
// (steal, page_supply.cpp). With plan_steps chunks are made only until the
// second mark, where the chunks left under live blocks are split into single
// pages holding their bytes (split_chunks, below). Words used here are
// defined in glossary.hpp.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "pool_impl.hpp"

namespace vramkit {

// Whether the place of n pages at page c of arena a holds nothing: no page
// mapped, kept mapped, made ahead, or being made ahead by the helper thread.
bool pool_resource::impl::empty_chunk_place(const detail::arena* a, std::size_t c, std::size_t n) const {
  if (inflight.active && inflight.a == a && c < inflight.first + inflight.count && inflight.first < c + n)
    return false;
  for (std::size_t p = c; p < c + n; ++p)
    if (a->mapped(p) || a->ahead(p) || a->phys[p]) return false;
  return true;
}

// The chunk holding page p: the run of chunk pages under p's handle. It lies
// inside the chunk_size-aligned place around p (every size divides chunk_size
// and a chunk sits at a multiple of its own size).
std::pair<std::size_t, std::size_t> pool_resource::impl::chunk_span(const detail::arena* a,
                                                                    std::size_t p) const noexcept {
  if (chunk_min == chunk) return {p / chunk * chunk, chunk};
  const std::size_t w = p / chunk * chunk;
  const page_handle h = a->handles[p];
  std::size_t lo = p, hi = p + 1;
  while (lo > w && a->in_chunk(lo - 1) && a->handles[lo - 1] == h) --lo;
  while (hi < w + chunk && a->in_chunk(hi) && a->handles[hi] == h) ++hi;
  return {lo, hi - lo};
}

std::pair<std::size_t, std::size_t> pool_resource::impl::chunks_inside(const detail::arena* a, std::size_t lo,
                                                                       std::size_t hi) const noexcept {
  if (chunk_min == chunk) return {round_up(lo, chunk), hi / chunk * chunk};
  std::size_t clo = lo, chi = hi;
  if (lo < hi && a->in_chunk(lo)) {
    const auto [c, n] = chunk_span(a, lo);
    if (c < lo) clo = c + n;
  }
  if (lo < hi && a->in_chunk(hi - 1)) {
    const auto [c, n] = chunk_span(a, hi - 1);
    if (c + n > hi) chi = c;
  }
  return {clo, std::max(clo, chi)};
}

// Creates a chunk of n pages and maps it whole at page c of arena a (an empty
// place); false when the device has no room for one (or makes none).
bool pool_resource::impl::make_chunk_at(detail::arena* a, std::size_t c, std::size_t n) {
  page_handle h = pages->create_chunk(n);
  if (!h) return false;
  try {
    pages->map_chunk(a->base + c * page, h, n);
  } catch (...) {
    pages->destroy(h);
    throw;
  }
  for (std::size_t p = c; p < c + n; ++p) {
    a->handles[p] = h;
    a->phys[p] = h;
    a->set_mapped(p, true);
    a->set_in_chunk(p, true);
  }
  const std::size_t bytes = n * page;
  a->top = std::max(a->top, c + n);
  reserved += bytes;
  peak_reserved = std::max(peak_reserved, reserved);
  chunk_pages += n;
  ctr.pages_created += n;
  ctr.pages_mapped += n;
  ++ctr.map_calls;
  ++ctr.chunks_created;
  ctr.chunk_pages_created += n;
  ++st.upstream_allocs;
  st.upstream_alloc_bytes += bytes;
  return true;
}

// Creates and maps chunks over the unmapped chunk-aligned places lying wholly
// inside [addr, addr+size) of arena a, covering at most `want` pages, while the
// pool may grow by a whole chunk for a block holding need_live live bytes.
// Appends the first page of each chunk made to `made`; returns the pages covered.
std::size_t pool_resource::impl::make_chunks(detail::arena* a, std::uintptr_t addr, std::size_t size,
                                             std::size_t need_live, std::size_t want,
                                             std::vector<std::size_t>& made) {
  if (chunk < 2 || a->chunk_bits.empty() || want < chunk_min || !chunks_now()) return 0;
  const std::size_t lo = round_up(addr - a->base, page) / page;
  const std::size_t hi = (addr + size - a->base) / page;
  made.reserve(made.size() + want / chunk_min + 1);  // no allocation once a chunk is made
  std::size_t covered = 0;
  // Each place takes the largest chunk that sits at a multiple of its size,
  // fits inside, is empty and is still wanted (chunk_min_size: halves down to it).
  for (std::size_t c = round_up(lo, chunk_min); c + chunk_min <= hi && covered + chunk_min <= want;) {
    std::size_t n = chunk;
    while (n >= chunk_min && (c % n || c + n > hi || covered + n > want || !empty_chunk_place(a, c, n))) n /= 2;
    if (n < chunk_min || n < 2) {
      c += chunk_min;
      continue;
    }
    if (!may_grow_by(n * page, n * page, need_live)) break;
    if (!make_chunk_at(a, c, n)) break;  // no room for a whole chunk (or none made): single pages do the rest
    made.push_back(c);
    covered += n;
    c += n;
  }
  return covered;
}

// growth_chunks: the chunk-aligned places holding block b's first and last
// pages, when empty and reaching past b only into the free blocks right before
// and after it: a chunk in each, of the smallest size (chunk_min_size; else
// chunk_size), so that little of it lies outside b. The chunk's pages outside b stay in those
// free blocks, mapped (their counts of unmapped pages are recounted). Returns
// the pages of b the chunks cover (0: none made).
std::size_t pool_resource::impl::make_growth_chunk(block* b, std::size_t size, std::size_t need_live,
                                                   std::vector<std::size_t>& made) {
  detail::arena* a = b->ar;
  if (chunk < 2 || a->chunk_bits.empty() || a->small || !chunks_now()) return 0;
  const std::size_t first = (b->addr - a->base) / page, last = (b->addr + size - 1 - a->base) / page;
  const std::size_t g = chunk_min;  // the smallest chunk at a block's ends
  std::size_t covered = 0;
  bool before = false, after = false;
  for (std::size_t c : {first / g * g, last / g * g}) {
    if (covered && c == first / g * g) continue;  // one place holds both ends
    const std::uintptr_t lo = a->base + c * page, hi = a->base + (c + g) * page;
    const bool out_before = lo < b->addr, out_after = hi > b->addr + size;
    if (!out_before && !out_after) continue;  // wholly inside: make_chunks' place
    block* p = b->prev;
    block* n = b->next;
    if (out_before && !(p && p->state == block::free_state && p->addr <= lo)) continue;
    if (out_after && !(n && n->state == block::free_state && n->addr + n->size >= hi)) continue;
    if (!empty_chunk_place(a, c, g) || !may_grow_by(g * page, 0, need_live)) continue;
    made.reserve(made.size() + 1);
    if (!make_chunk_at(a, c, g)) break;
    made.push_back(c);
    before |= out_before;
    after |= out_after;
    covered += std::min(c + g - 1, last) - std::max(c, first) + 1;
    ++ctr.growth_chunks;
  }
  if (before) recount_free(b->prev);
  if (after) recount_free(b->next);
  return covered;
}

// A free block's count of unmapped interior pages, recounted (and the block
// filed again as backed or hollow, stealable or not).
void pool_resource::impl::recount_free(block* f) noexcept {
  const std::uint32_t s = f->slot;
  slots.remove(f);
  f->unmapped = unmapped_inside(f->ar, f->addr, f->size);
  slots.insert(f, s);
}

// Unmaps and destroys the chunk starting at page c of arena a (its pages
// become unmapped; the free block around them is the caller's to update).
// Returns its pages.
std::size_t pool_resource::impl::give_back_chunk(detail::arena* a, std::size_t c) noexcept {
  const std::size_t n = chunk_span(a, c).second;
  const page_handle h = a->handles[c];
  pages->unmap(a->base + c * page, n);
  pages->destroy(h);
  for (std::size_t p = c; p < c + n; ++p) {
    a->handles[p] = 0;
    a->phys[p] = 0;
    a->set_mapped(p, false);
    a->set_in_chunk(p, false);
  }
  reserved -= n * page;
  chunk_pages -= n;
  ctr.pages_unmapped += n;
  ctr.pages_destroyed += n;
  ++ctr.chunks_released;
  ctr.chunk_pages_released += n;
  ++st.upstream_frees;
  st.upstream_free_bytes += n * page;
  return n;
}

// split_chunks, at the second mark: every chunk left (each lies under a live
// block: the free ones have just gone back) becomes single pages, so that no
// chunk stays past the first steps. The device's work is all waited for
// first (the blocks over a chunk may be in use on any stream). A chunk's
// bytes pass through scratch pages mapped once at a spare address (one
// chunk's worth, held while the chunks are split). Stops at the first chunk
// that cannot be split (no room for its pages, a failing call): the chunks
// left stay as they are. Returns the chunks split.
std::size_t pool_resource::impl::split_chunks() noexcept {
  if (!chunk_pages || !opt.split_chunks || !pages->copies()) return 0;
  // Each chunk left (arena, first page, pages) to f, in address order, while f returns true.
  auto each_chunk = [this](auto&& f) {
    for (detail::arena* a : arenas) {
      if (!a->paged || a->small || a->chunk_bits.empty()) continue;
      for (std::size_t p = 0; chunk_pages && p < a->top;) {
        if (!a->in_chunk(p)) {
          ++p;
          continue;
        }
        const std::pair<std::size_t, std::size_t> span = chunk_span(a, p);
        if (!f(a, span.first, span.second)) return;
        p = span.first + span.second;
      }
    }
  };
  std::size_t largest = 0;  // pages of the largest chunk left
  each_chunk([&](detail::arena*, std::size_t, std::size_t n) {
    largest = std::max(largest, n);
    return true;
  });
  if (!largest || reserved + largest * page > limit) return 0;
  std::vector<page_handle> scratch, hs;
  std::uintptr_t spare = 0;
  bool mapped = false;
  auto release = [&] {
    if (mapped) pages->unmap(spare, largest);
    if (spare) pages->unreserve(spare, largest * page);
    for (page_handle h : scratch) pages->destroy(h);
  };
  try {
    scratch.reserve(largest);
    hs.reserve(largest);
    {
      gpu_wait w{ctr};
      pages->synchronize();
    }
    spare = pages->reserve(largest * page);
    for (std::size_t i = 0; i < largest; ++i) {
      const page_handle h = pages->create();
      if (!h) {
        peak_reserved = std::max(peak_reserved, reserved + scratch.size() * page);  // held for a moment
        release();
        return 0;
      }
      scratch.push_back(h);
    }
    pages->map(spare, scratch.data(), largest);
    mapped = true;
  } catch (...) {
    release();
    return 0;
  }
  reserved += largest * page;  // the scratch pages, counted while they are held
  peak_reserved = std::max(peak_reserved, reserved);
  std::size_t split = 0;
  each_chunk([&](detail::arena* a, std::size_t c, std::size_t n) {
    if (!split_chunk(a, c, n, spare, hs)) return false;  // the chunks left stay as they are
    ++split;
    return true;
  });
  release();
  reserved -= largest * page;
  ctr.pages_created += largest;
  ctr.pages_mapped += largest;
  ctr.pages_unmapped += largest;
  ctr.pages_destroyed += largest;
  ++ctr.map_calls;
  st.upstream_allocs += largest;
  st.upstream_alloc_bytes += largest * page;
  st.upstream_frees += largest;
  st.upstream_free_bytes += largest * page;
  return split;
}

// Splits the chunk of n pages at page c of arena a into n new single pages
// holding its bytes: they are created, the chunk's bytes copied to the
// scratch pages at `spare`, the chunk unmapped, the pages mapped in its place
// and the bytes copied back, and the chunk goes. If the pages cannot be
// mapped there or take the bytes, the chunk is mapped back and the bytes
// copied back into it from the scratch pages.
bool pool_resource::impl::split_chunk(detail::arena* a, std::size_t c, std::size_t n, std::uintptr_t spare,
                                      std::vector<page_handle>& hs) noexcept {
  const std::uintptr_t at = a->base + c * page;
  const std::size_t bytes = n * page;
  const page_handle chunk_h = a->handles[c];
  hs.clear();
  auto drop = [&] {
    for (page_handle h : hs) pages->destroy(h);
    hs.clear();
  };
  if (reserved + bytes > limit) return false;
  for (std::size_t i = 0; i < n; ++i) {
    page_handle h = 0;
    try {
      h = pages->create();
    } catch (...) {
    }
    if (!h) {
      peak_reserved = std::max(peak_reserved, reserved + hs.size() * page);
      drop();
      return false;
    }
    hs.push_back(h);
  }
  try {
    gpu_wait w{ctr};  // the device's copies return once the bytes are there
    pages->copy(spare, at, bytes);
  } catch (...) {
    peak_reserved = std::max(peak_reserved, reserved + bytes);
    drop();
    return false;
  }
  pages->unmap(at, n);
  bool placed = false;
  try {
    pages->map(at, hs.data(), n);
    placed = true;
    gpu_wait w{ctr};
    pages->copy(at, spare, bytes);
  } catch (...) {
    // Back as it was: the chunk mapped in its place, its bytes copied back
    // from the scratch pages (a device may not keep a handle's bytes over an
    // unmap; the host simulation does not).
    if (placed) pages->unmap(at, n);  // (a failed map leaves nothing mapped there)
    try {
      pages->map_chunk(at, chunk_h, n);
      gpu_wait w{ctr};
      pages->copy(at, spare, bytes);
    } catch (...) {
      // Live blocks lie there and the device maps neither their chunk nor
      // pages holding their bytes: nothing the pool can hand out is sound.
      std::fprintf(stderr, "vramkit: the device could map neither a chunk nor its new pages at %#zx "
                           "(%zu bytes under live blocks); stopping\n", static_cast<std::size_t>(at), bytes);
      std::abort();
    }
    peak_reserved = std::max(peak_reserved, reserved + bytes);  // the chunk's pages were held for a moment
    drop();
    return false;
  }
  pages->destroy(chunk_h);
  for (std::size_t i = 0; i < n; ++i) {
    a->handles[c + i] = hs[i];
    a->phys[c + i] = hs[i];
    a->set_in_chunk(c + i, false);
  }
  hs.clear();
  chunk_pages -= n;
  peak_reserved = std::max(peak_reserved, reserved + bytes);  // the chunk and its pages were held at once
  ctr.pages_created += n;
  ctr.pages_mapped += n;
  ctr.pages_unmapped += n;
  ctr.pages_destroyed += n;
  ++ctr.map_calls;
  ++ctr.chunks_released;
  ctr.chunk_pages_released += n;
  ++ctr.chunks_split;
  st.upstream_allocs += n;
  st.upstream_alloc_bytes += bytes;
  ++st.upstream_frees;
  st.upstream_free_bytes += bytes;
  return true;
}

// Gives back the chunks a backing that did not complete made.
void pool_resource::impl::undo_chunks(detail::arena* a, const std::vector<std::size_t>& made) noexcept {
  for (std::size_t c : made) give_back_chunk(a, c);
}

}  // namespace vramkit
