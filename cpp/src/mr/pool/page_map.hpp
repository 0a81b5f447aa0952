// The page map: one arena (a contiguous address range) and, when it is
// paged, which physical page backs each of its pages and which the device
// still maps there. Words used here are defined in glossary.hpp.
#pragma once
#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "../../detail/free_index.hpp"
#include "vramkit/platform/page_device.hpp"

namespace vramkit::detail {

// One contiguous address range: the whole virtual reservation of a paged
// arena, or one segment taken from a non-paged upstream.
struct arena {
  std::uintptr_t base = 0;
  std::size_t size = 0;
  bool paged = false;
  bool small = false;
  block* first = nullptr;
  // Paged only: the physical page behind each page of the range (0 = none).
  std::vector<page_handle> handles;
  std::vector<std::uint64_t> mapped_bits;
  // Paged only: the page the device maps at each page of the range. Equal
  // to handles[p] where mapped; elsewhere 0 or a kept (stale) mapping of a
  // page now in use at another address or spare (keep_mappings).
  std::vector<page_handle> phys;
  std::size_t top = 0;  // one past the highest page ever mapped
  // map_ahead: pages a helper thread created and mapped before any block
  // needed them (`phys[p]` is the page; not in use: `handles[p]` is 0). A
  // block placed over one takes it as it is, with no call.
  std::vector<std::uint64_t> ahead_bits;
  // chunk_size: pages that belong to a chunk (one handle over `chunk` pages
  // starting at a multiple of `chunk`; `handles[p]` and `phys[p]` name it at
  // each of them). Chunk pages are always mapped and never move.
  std::vector<std::uint64_t> chunk_bits;
  // remap_own: at a kept mapping of a page taken before its old block's work
  // was known done, the early mark (pool_resource::impl::early) whose event
  // says when that address may be unmapped; 0 elsewhere (empty without remap_own).
  std::vector<std::uint32_t> early;

  bool mapped(std::size_t p) const { return mapped_bits[p >> 6] >> (p & 63) & 1; }
  bool ahead(std::size_t p) const { return ahead_bits[p >> 6] >> (p & 63) & 1; }
  bool in_chunk(std::size_t p) const { return !chunk_bits.empty() && (chunk_bits[p >> 6] >> (p & 63) & 1); }
  void set_in_chunk(std::size_t p, bool on) {
    if (on)
      chunk_bits[p >> 6] |= std::uint64_t{1} << (p & 63);
    else
      chunk_bits[p >> 6] &= ~(std::uint64_t{1} << (p & 63));
  }
  void set_ahead(std::size_t p, bool on) {
    if (on)
      ahead_bits[p >> 6] |= std::uint64_t{1} << (p & 63);
    else
      ahead_bits[p >> 6] &= ~(std::uint64_t{1} << (p & 63));
  }
  void set_mapped(std::size_t p, bool on) {
    if (on)
      mapped_bits[p >> 6] |= std::uint64_t{1} << (p & 63);
    else
      mapped_bits[p >> 6] &= ~(std::uint64_t{1} << (p & 63));
  }
};

constexpr std::size_t round_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

// The highest page in [lo, hi] whose bit is set in the words word(w) gives,
// or lo when none is (a word at a time).
template <class Word>
inline std::size_t last_page_where(std::size_t lo, std::size_t hi, Word word) {
  std::size_t p = hi + 1;
  while (p > lo) {
    std::size_t w = (p - 1) >> 6;
    std::uint64_t bits = word(w);
    std::size_t top = (p - 1) & 63;
    bits &= top == 63 ? ~std::uint64_t{0} : ((std::uint64_t{1} << (top + 1)) - 1);
    if (bits) {
      std::size_t q = (w << 6) + 63 - static_cast<std::size_t>(std::countl_zero(bits));
      return q >= lo ? q : lo;
    }
    p = w << 6;
  }
  return lo;
}

// The bits of word w (pages 64w .. 64w+63) for the pages in [from, to).
inline std::uint64_t word_range(std::size_t w, std::size_t from, std::size_t to) {
  const std::size_t b0 = w << 6;
  const std::size_t s = std::max(from, b0), e = std::min(to, b0 + 64);
  if (s >= e) return 0;
  const std::uint64_t below_e = e - b0 == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << (e - b0)) - 1;
  return below_e & (~std::uint64_t{0} << (s - b0));
}

// Nothing is mapped, made ahead or in a chunk at or above an arena's top,
// so the scans for such pages stop there (a free block at the arena's end can
// span the whole reservation): hi, lowered to the top's last page. Callers
// first check that the top lies above lo.
inline std::size_t below_top(const arena* a, std::size_t hi) { return std::min(hi, a->top - 1); }

// The highest mapped page in [lo, hi], or lo when none is.
inline std::size_t last_mapped_page(const arena* a, std::size_t lo, std::size_t hi) {
  if (a->top <= lo) return lo;
  return last_page_where(lo, below_top(a, hi), [a](std::size_t w) { return a->mapped_bits[w]; });
}

// The highest page in [lo, hi] that is mapped or made ahead (map_ahead), or
// lo when none is: where placement stops looking for cheaper places.
inline std::size_t last_backed_page(const arena* a, std::size_t lo, std::size_t hi) {
  if (a->top <= lo) return lo;
  return last_page_where(lo, below_top(a, hi), [a](std::size_t w) { return a->mapped_bits[w] | a->ahead_bits[w]; });
}

// Unmapped pages lying wholly inside [addr, addr+size) of arena a (pages of
// `page` bytes).
inline std::size_t unmapped_inside(const arena* a, std::size_t page, std::uintptr_t addr, std::size_t size) {
  std::size_t lo = round_up(addr - a->base, page) / page;
  std::size_t hi = (addr + size - a->base) / page;
  if (hi <= lo) return 0;
  // Mapped pages counted a word at a time, up to the arena's top (a free
  // block can span the whole arena; nothing is mapped above the top).
  const std::size_t mhi = std::min(hi, a->top);
  if (mhi <= lo) return hi - lo;
  std::size_t mapped = 0;
  for (std::size_t w = lo >> 6; w <= (mhi - 1) >> 6; ++w) {
    std::uint64_t bits = a->mapped_bits[w];
    if (w == lo >> 6) bits &= ~std::uint64_t{0} << (lo & 63);
    if (w == (mhi - 1) >> 6 && ((mhi - 1) & 63) != 63) bits &= (std::uint64_t{1} << (((mhi - 1) & 63) + 1)) - 1;
    mapped += static_cast<std::size_t>(std::popcount(bits));
  }
  return (hi - lo) - mapped;
}

// What mapping page p for a new block costs: nothing if mapped or made
// ahead, one page if not.
inline std::size_t page_cost(const arena* a, std::size_t p) { return a->mapped(p) || a->ahead(p) ? 0 : 1; }

}  // namespace vramkit::detail
