// Diagnostics: the invariants tests check after every step, the reports
// (state, segments, page usage) and the out-of-memory message.
#include <algorithm>
#include <bit>
#include <string>
#include <vector>

#include "pool_impl.hpp"

namespace vramkit {

void pool_resource::impl::throw_oom(std::size_t bytes, const char* why) {
  std::size_t largest = slots.largest_backed();
  std::size_t cached = reserved > live_bytes ? reserved - live_bytes : 0;
  double frag = live_bytes ? static_cast<double>(reserved) / static_cast<double>(live_bytes) : 0.0;
  std::string m = "vramkit: out of memory on device " + std::to_string(dev) + " (" +
                  (upstream ? upstream->name() : pages->name()) + "): " + why + (why[0] ? "limit; " : "") +
                  "requested " + format_bytes(bytes) + "; live " + format_bytes(live_bytes) + ", cached " +
                  format_bytes(cached) + ", reserved " + format_bytes(reserved) + ", largest free range " +
                  format_bytes(largest) + ", limit " + format_bytes(limit) + ", device capacity " +
                  format_bytes(capacity) + ", fragmentation " + format_fixed(frag, 3) + " (reserved/live)";
  throw out_of_memory(m, bytes);
}

memory_state pool_resource::impl::state() const {
  std::lock_guard<std::mutex> lk(mu);
  memory_state s = st;
  s.live_bytes = live_bytes;
  s.live_count = live.size();
  s.reserved_bytes = reserved;
  s.cached_bytes = reserved > live_bytes ? reserved - live_bytes : 0;
  s.pending_free_bytes = pending_bytes;
  s.largest_free_bytes = std::max(s.largest_free_bytes, slots.largest_backed());
  s.largest_free_bytes = std::min(s.largest_free_bytes, s.cached_bytes);
  s.capacity_bytes = limit;
  s.peak_live_bytes = peak_live;
  s.peak_reserved_bytes = peak_reserved;
  return s;
}

void pool_resource::impl::check() const {
  std::lock_guard<std::mutex> lk(mu);
  auto fail = [](const std::string& what) { throw error("pool invariant broken: " + what); };
  std::size_t live_sum = 0, live_n = 0, mapped_pages = 0, stale_pages = 0, ahead_count = 0, chunk_count = 0;
  std::vector<page_handle> in_use(spare_handles.begin(), spare_handles.end()), kept;
  for (auto* a : arenas) {
    std::uintptr_t at = a->base;
    const block* prev = nullptr;
    for (const block* b = a->first; b; prev = b, b = b->next) {
      if (b->addr != at) fail("blocks do not tile the arena at " + std::to_string(b->addr));
      if (b->prev != prev) fail("broken back link");
      if (b->ar != a) fail("block in the wrong arena");
      if (b->addr % opt.alignment) fail("misaligned block");
      at += b->size;
      if (b->state == block::live_state) {
        live_sum += b->size;
        ++live_n;
        auto* f = live.find(b->addr);
        if (!f || *f != b) fail("live block missing from the live table");
        if (b->requested > b->size) fail("block smaller than its request");
      }
      if (b->state == block::free_state && prev && prev->state == block::free_state &&
          prev->slot == b->slot)
        fail("two adjacent free blocks of one stream left unmerged");
      if (a->paged) {
        std::size_t p0 = (b->addr - a->base) / page, p1 = (b->addr + b->size - 1 - a->base) / page;
        if (b->state != block::free_state) {
          for (std::size_t p = p0; p <= p1; ++p)
            if (!a->mapped(p)) fail("live block over an unmapped page");
        } else {
          std::size_t lo = round_up(b->addr - a->base, page) / page;
          std::size_t hi = (b->addr + b->size - a->base) / page;
          std::size_t un = 0;
          for (std::size_t p = lo; p < hi; ++p) un += !a->mapped(p);
          if (un != b->unmapped) fail("free block's unmapped count is stale");
          if (b->hollow != (un > 0)) fail("free block in the wrong index");
          if (b->in_steal != (hi > lo && hi - lo > un)) fail("stealable list out of date");
          // Pages partly inside a free block must be mapped.
          if (p0 < lo && !a->mapped(p0)) fail("unmapped page at a free block's edge");
          if (p1 >= hi && !a->mapped(p1)) fail("unmapped page at a free block's edge");
        }
      }
    }
    if (at != a->base + a->size) fail("blocks do not cover the arena");
    if (a->paged) {
      // Above the highest page ever mapped everything must be empty (checked
      // a word or a vector run at a time: tests call this after every step).
      auto zero = [](const auto& v, std::size_t from) {
        return std::all_of(v.begin() + static_cast<std::ptrdiff_t>(from), v.end(), [](auto x) { return x == 0; });
      };
      const std::size_t wtop = (a->top + 63) / 64;
      if (!zero(a->handles, a->top) || !zero(a->phys, a->top) || !zero(a->mapped_bits, wtop) ||
          !zero(a->ahead_bits, wtop) || (!a->chunk_bits.empty() && !zero(a->chunk_bits, wtop)))
        fail("a page in use or mapped above the arena's top");
      for (std::size_t p = a->top; p < std::min(wtop * 64, a->handles.size()); ++p)
        if (a->mapped(p) || a->ahead(p)) fail("a page in use or mapped above the arena's top");
    }
    if (a->paged)
      for (std::size_t p = 0; p < a->top; ++p) {
        if (a->ahead(p)) {
          if (a->mapped(p) || a->handles[p] || !a->phys[p] || a->small)
            fail("a page made ahead is in use, not mapped or in the small arena");
          in_use.push_back(a->phys[p]);
          ++ahead_count;
          continue;
        }
        if (a->in_chunk(p)) {
          // A chunk: mapped whole, one handle, at a multiple of its size.
          const auto [c, n] = chunk_span(a, p);
          if (n < chunk_min || n > chunk || chunk % n || !std::has_single_bit(chunk / n) || c % n)
            fail("a chunk is not a power-of-two part of chunk_size at a multiple of its size");
          if (c + n > a->top || !a->mapped(p) || a->handles[p] != a->handles[c] || a->phys[p] != a->handles[p] ||
              !a->handles[p])
            fail("a chunk is not mapped whole under one handle");
          if (p == c) {
            for (std::size_t q = c; q < c + n; ++q)
              if (!a->in_chunk(q)) fail("a chunk is not mapped whole under one handle");
            in_use.push_back(a->handles[p]);
          }
          ++chunk_count;
          ++mapped_pages;
          continue;
        }
        if (a->mapped(p) != (a->handles[p] != 0)) fail("page map and handles disagree");
        if (a->mapped(p) && a->phys[p] != a->handles[p]) fail("the device maps another page than the pool uses");
        if (a->mapped(p)) in_use.push_back(a->handles[p]);
        if (a->phys[p] && !a->mapped(p)) kept.push_back(a->phys[p]);
        stale_pages += a->phys[p] && !a->mapped(p);
        mapped_pages += a->mapped(p);
      }
  }
  if (live_sum != live_bytes) fail("live bytes do not add up");
  if (live_n != live.size()) fail("live table has stale entries");
  std::size_t pend = 0;
  for (auto* b : pending) {
    pend += b->size;
    if (b->state != block::pending_state || b->events.size() != b->extra_streams.size())
      fail("a pending free without one event (or its place) per stream that used it");
  }
  if (pend != pending_bytes) fail("pending bytes do not add up");
  if (stale_pages != stale) fail("the count of kept mappings is stale");
  if (!opt.keep_mappings && stale_pages) fail("a mapping kept with keep_mappings off");
  std::sort(in_use.begin(), in_use.end());
  if (std::adjacent_find(in_use.begin(), in_use.end()) != in_use.end()) fail("one page in use at two places");
  for (page_handle h : kept)
    if (!std::binary_search(in_use.begin(), in_use.end(), h)) fail("a mapping kept of a page given back");
  // remap_own: early marks only at kept mappings, each mark's count of pages
  // right, open marks not done, idle ones done and carried by no page.
  {
    std::vector<std::size_t> carried(early.size(), 0);
    std::size_t marked = 0;
    for (auto* a : arenas)
      for (std::size_t p = 0; p < a->early.size(); ++p)
        if (const std::uint32_t m = a->early[p]) {
          if (m >= early.size()) fail("an early mark out of range");
          if (!a->phys[p] || a->mapped(p) || a->ahead(p)) fail("an early mark where no kept mapping is");
          ++carried[m];
          ++marked;
        }
    if (marked != early_pages) fail("the count of early-marked pages is stale");
    for (std::size_t m = 1; m < early.size(); ++m)
      if (carried[m] != early[m].pages) fail("an early mark's count of pages is stale");
    for (std::uint32_t m : early_open)
      if (early[m].done || !early[m].pages) fail("an open early mark is done or carried by no page");
    for (std::uint32_t m : early_idle)
      if (!early[m].done || early[m].pages) fail("an idle early mark is open or still carried");
    for (std::size_t m = 1; m < early.size(); ++m)
      if (!early[m].done && std::find(early_open.begin(), early_open.end(), m) == early_open.end())
        fail("an early mark with an event held is not open");
  }
  if (ahead_count != ahead_pages) fail("the count of pages made ahead is stale");
  if (chunk_count != chunk_pages) fail("the count of pages in chunks is stale");
  if (!upstream && (mapped_pages + spare_handles.size()) * page + held_ahead_bytes() != reserved)
    fail("reserved != mapped + spare + ahead pages");
}

std::vector<segment_info> pool_resource::impl::segments() const {
  std::lock_guard<std::mutex> lk(mu);
  std::vector<segment_info> out;
  for (auto* a : arenas) {
    if (!a->paged) {
      segment_info s;
      s.base = a->base;
      s.size = a->size;
      s.mapped_bytes = a->size;
      s.small = a->small;
      for (const block* b = a->first; b; b = b->next)
        s.blocks.push_back({b->addr, b->size, b->requested, b->state == block::live_state,
                            b->state == block::pending_state, b->stream});
      out.push_back(std::move(s));
      continue;
    }
    // A paged arena is reported as its runs of mapped pages.
    std::size_t np = a->handles.size();
    for (std::size_t p = 0; p < np;) {
      if (!a->mapped(p)) {
        ++p;
        continue;
      }
      std::size_t q = p;
      while (q < np && a->mapped(q)) ++q;
      segment_info s;
      s.base = a->base + p * page;
      s.size = (q - p) * page;
      s.mapped_bytes = s.size;
      s.small = a->small;
      std::uintptr_t lo = s.base, hi = s.base + s.size;
      for (const block* b = a->first; b; b = b->next) {
        std::uintptr_t bl = std::max(b->addr, lo), bh = std::min(b->addr + b->size, hi);
        if (bl >= bh) continue;
        s.blocks.push_back({bl, bh - bl, b->state == block::live_state ? b->requested : 0,
                            b->state == block::live_state, b->state == block::pending_state, b->stream});
      }
      out.push_back(std::move(s));
      p = q;
    }
  }
  return out;
}


pool_resource::page_usage pool_resource::impl::usage() const {
  std::lock_guard<std::mutex> lk(mu);
  page_usage u;
  for (auto* a : arenas) {
    if (!a->paged) continue;
    for (const detail::block* b = a->first; b; b = b->next) {
      if (b->state == detail::block::free_state) {
        u.free_interior_mapped[a->small] += interior_pages(b) - b->unmapped;
        continue;
      }
    }
    std::size_t np = a->handles.size();
    std::vector<char> live(np, 0);
    for (const detail::block* b = a->first; b; b = b->next)
      if (b->state != detail::block::free_state)
        for (std::size_t p = first_page(b); p <= last_page(b); ++p) live[p] = 1;
    for (std::size_t p = 0; p < np; ++p) {
      u.mapped[a->small] += a->mapped(p);
      u.live_overlap[a->small] += live[p];
    }
    if (chunk >= 2 && !a->chunk_bits.empty())
      for (std::size_t c = 0; c < np;) {
        if (!a->in_chunk(c)) {
          ++c;
          continue;
        }
        const std::size_t n = chunk_span(a, c).second;
        std::size_t n_live = 0;
        for (std::size_t p = c; p < c + n; ++p) n_live += live[p];
        if (n_live && n_live < n) u.chunk_free_held += n - n_live;
        c += n;
      }
  }
  u.spare = spare_handles.size();
  u.ahead = held_ahead_bytes() / page;
  u.in_chunks = chunk_pages;
  return u;
}

}  // namespace vramkit
