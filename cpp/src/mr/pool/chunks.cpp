// Chunks (chunk_size): where the large arena grows under one block, physical
// memory comes in handles of `chunk` pages, each mapped whole at a
// chunk-aligned place inside the block. The driver charges per handle, so a
// chunk of 16 pages costs about the calls of one page; and kernels streaming
// over large handles run faster than over 2 MiB ones. A chunk cannot be cut
// (the driver maps a handle only whole), so it never moves: the pool steals
// single pages only, and when it must move memory that a chunk holds, it
// gives back a chunk lying wholly inside free memory and makes pages instead
// (steal, page_supply.cpp). Words used here are defined in glossary.hpp.
#include <algorithm>
#include <vector>

#include "pool_impl.hpp"

namespace vramkit {

// Creates and maps chunks over the unmapped chunk-aligned places lying wholly
// inside [addr, addr+size) of arena a, covering at most `want` pages, while the
// pool may grow by a whole chunk for a block holding need_live live bytes.
// Appends the first page of each chunk made to `made`; returns the pages covered.
std::size_t pool_resource::impl::make_chunks(detail::arena* a, std::uintptr_t addr, std::size_t size,
                                             std::size_t need_live, std::size_t want,
                                             std::vector<std::size_t>& made) {
  if (chunk < 2 || a->chunk_bits.empty() || want < chunk) return 0;
  const std::size_t lo = round_up(addr - a->base, page) / page;
  const std::size_t hi = (addr + size - a->base) / page;
  const std::size_t bytes = chunk * page;
  auto may_grow_by_chunk = [&] {
    if (reserved + bytes > limit) return false;
    if (!opt.remap) return true;
    return static_cast<double>(reserved - held_ahead_bytes() + bytes) <=
           (1.0 + opt.growth_slack) * static_cast<double>(std::max(need_live, peak_live));
  };
  auto empty_place = [&](std::size_t c) {
    if (inflight.active && inflight.a == a && c < inflight.first + inflight.count && inflight.first < c + chunk)
      return false;  // the helper thread is making pages there
    for (std::size_t p = c; p < c + chunk; ++p)
      if (a->mapped(p) || a->ahead(p) || a->phys[p]) return false;
    return true;
  };
  made.reserve(made.size() + want / chunk);  // no allocation once a chunk is made
  std::size_t covered = 0;
  for (std::size_t c = round_up(lo, chunk); c + chunk <= hi && covered + chunk <= want; c += chunk) {
    if (!empty_place(c)) continue;
    if (!may_grow_by_chunk()) break;
    page_handle h = pages->create_chunk(chunk);
    if (!h) break;  // no room for a whole chunk (or none made): single pages do the rest
    try {
      pages->map_chunk(a->base + c * page, h, chunk);
    } catch (...) {
      pages->destroy(h);
      throw;
    }
    for (std::size_t p = c; p < c + chunk; ++p) {
      a->handles[p] = h;
      a->phys[p] = h;
      a->set_mapped(p, true);
      a->set_in_chunk(p, true);
    }
    a->top = std::max(a->top, c + chunk);
    reserved += bytes;
    peak_reserved = std::max(peak_reserved, reserved);
    chunk_pages += chunk;
    ctr.pages_created += chunk;
    ctr.pages_mapped += chunk;
    ++ctr.map_calls;
    ++ctr.chunks_created;
    ++st.upstream_allocs;
    st.upstream_alloc_bytes += bytes;
    made.push_back(c);
    covered += chunk;
  }
  return covered;
}

// Unmaps and destroys the chunk at page c of arena a (its pages become
// unmapped; the free block around them is the caller's to update).
void pool_resource::impl::give_back_chunk(detail::arena* a, std::size_t c) noexcept {
  const page_handle h = a->handles[c];
  pages->unmap(a->base + c * page, chunk);
  pages->destroy(h);
  for (std::size_t p = c; p < c + chunk; ++p) {
    a->handles[p] = 0;
    a->phys[p] = 0;
    a->set_mapped(p, false);
    a->set_in_chunk(p, false);
  }
  reserved -= chunk * page;
  chunk_pages -= chunk;
  ctr.pages_unmapped += chunk;
  ctr.pages_destroyed += chunk;
  ++ctr.chunks_released;
  ++st.upstream_frees;
  st.upstream_free_bytes += chunk * page;
}

// Gives back the chunks a backing that did not complete made.
void pool_resource::impl::undo_chunks(detail::arena* a, const std::vector<std::size_t>& made) noexcept {
  for (std::size_t c : made) give_back_chunk(a, c);
}

}  // namespace vramkit
