// Block bookkeeping and the two-level segregated-fit index of free blocks:
// finding a fitting block is O(1) (two bitmap scans) plus a bounded look at
// the exact-size bin for a tighter fit.
#pragma once
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "vramkit/platform/stream_ops.hpp"

namespace vramkit::detail {

struct arena;

struct block {
  enum : std::uint8_t { live_state, free_state, pending_state };
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  std::size_t requested = 0;
  block* prev = nullptr;  // address order within the arena
  block* next = nullptr;
  block* fprev = nullptr;  // bin list
  block* fnext = nullptr;
  block* sprev = nullptr;  // stealable list
  block* snext = nullptr;
  arena* ar = nullptr;
  stream_t stream = 0;        // live: allocation stream
  std::size_t unmapped = 0;   // free: pages wholly inside that are unmapped
  std::uint64_t seq = 0;      // free: when it was freed (for stream events)
  std::uint32_t slot = 0;     // free: stream slot
  std::uint16_t bin = 0;
  std::uint8_t state = free_state;
  bool hollow = false;
  bool in_steal = false;
  std::vector<stream_t> extra_streams;  // record_stream (rare)
  std::vector<event_id> events;         // pending frees: one per extra stream, 0 while not recorded
};

// Recycles block records so the hot path never calls the heap.
class block_pool {
 public:
  block* make() {
    if (!free_) grow();
    block* b = free_;
    free_ = b->next;
    *b = block{};
    return b;
  }
  void recycle(block* b) noexcept {
    b->ar = nullptr;  // a record no arena lists (step plans keep hints to blocks that may be recycled)
    b->extra_streams.clear();
    b->events.clear();
    b->next = free_;
    free_ = b;
  }

 private:
  void grow() {
    auto chunk = std::make_unique<block[]>(256);
    for (int i = 0; i < 256; ++i) {
      chunk[i].next = free_;
      free_ = &chunk[i];
    }
    chunks_.push_back(std::move(chunk));
  }
  block* free_ = nullptr;
  std::vector<std::unique_ptr<block[]>> chunks_;
};

class free_index {
 public:
  static constexpr int sl_bits = 4;
  static constexpr int sl_count = 1 << sl_bits;
  static constexpr int min_fl = 8;  // 256 B, the smallest alignment
  static constexpr int fl_count = 64 - min_fl;
  static constexpr int scan_limit = 64;

  static unsigned bin_of(std::size_t size) noexcept {
    int fl = 63 - std::countl_zero(size | 256);
    unsigned sl = static_cast<unsigned>(size >> (fl - sl_bits)) & (sl_count - 1);
    return static_cast<unsigned>(fl - min_fl) * sl_count + sl;
  }

  void insert(block* b) noexcept {
    unsigned i = bin_of(b->size);
    b->bin = static_cast<std::uint16_t>(i);
    b->fprev = nullptr;
    b->fnext = heads_[i];
    if (heads_[i]) heads_[i]->fprev = b;
    heads_[i] = b;
    fl_map_ |= std::uint64_t{1} << (i / sl_count);
    sl_map_[i / sl_count] |= static_cast<std::uint16_t>(1u << (i % sl_count));
  }

  void remove(block* b) noexcept {
    unsigned i = b->bin;
    if (b->fprev)
      b->fprev->fnext = b->fnext;
    else
      heads_[i] = b->fnext;
    if (b->fnext) b->fnext->fprev = b->fprev;
    b->fprev = b->fnext = nullptr;
    if (!heads_[i]) {
      sl_map_[i / sl_count] &= static_cast<std::uint16_t>(~(1u << (i % sl_count)));
      if (!sl_map_[i / sl_count]) fl_map_ &= ~(std::uint64_t{1} << (i / sl_count));
    }
  }

  // A free block of at least `size` bytes, or nullptr: the first exact fit or
  // else the tightest fit among the first `scan_limit` blocks of size's own bin, else the lowest-addressed
  // of the first `scan_limit` blocks of the next non-empty bin (every block
  // there fits). Ties go to the lowest address: blocks then gather at the low
  // end of the arena and free space coalesces at the high end, which is what
  // keeps pages whole on random lifetimes.
  block* find(std::size_t size) const noexcept {
    unsigned i = bin_of(size);
    block* best = nullptr;
    int seen = 0;
    for (block* b = heads_[i]; b && seen < scan_limit; b = b->fnext, ++seen)
      if (b->size >= size && (!best || b->size < best->size || (b->size == best->size && b->addr < best->addr))) {
        best = b;
        if (b->size == size) break;  // an exact fit: nothing is tighter
      }
    if (best) return best;
    unsigned fl = i / sl_count, sl = i % sl_count;
    unsigned next;
    std::uint32_t sl_rest = sl + 1 < sl_count ? (sl_map_[fl] & ~((2u << sl) - 1)) : 0;
    if (sl_rest) {
      next = fl * sl_count + static_cast<unsigned>(std::countr_zero(sl_rest));
    } else {
      std::uint64_t fl_rest = fl + 1 < fl_count ? (fl_map_ & ~((std::uint64_t{2} << fl) - 1)) : 0;
      if (!fl_rest) return nullptr;
      unsigned f = static_cast<unsigned>(std::countr_zero(fl_rest));
      next = f * sl_count + static_cast<unsigned>(std::countr_zero(static_cast<unsigned>(sl_map_[f])));
    }
    seen = 0;
    for (block* b = heads_[next]; b && seen < scan_limit; b = b->fnext, ++seen)
      if (!best || b->addr < best->addr) best = b;
    return best;
  }

  // A free block of at least `size` bytes for fit:address, or nullptr: the
  // first exact fit among the first `scan_limit` blocks of size's own bin
  // (a step that repeats its sizes keeps its places), else the lowest-addressed
  // block that fits among the first `scan_limit` blocks met going up the
  // non-empty bins from size's own (the own bin's are looked at once, for both).
  // Blocks then gather at the low end of the arena even where the request is
  // much smaller than the free block it is cut from.
  block* find_lowest(std::size_t size) const noexcept {
    const unsigned i = bin_of(size);
    block* best = nullptr;
    int seen = 0;
    for (block* b = heads_[i]; b && seen < scan_limit; b = b->fnext, ++seen) {
      if (b->size == size) return b;
      if (b->size > size && (!best || b->addr < best->addr)) best = b;
    }
    for (unsigned k = next_bin(i + 1); k < bin_count && seen < scan_limit; k = next_bin(k + 1))
      for (block* b = heads_[k]; b && seen < scan_limit; b = b->fnext, ++seen)  // every block here fits
        if (!best || b->addr < best->addr) best = b;
    return best;
  }

  // The tightest fit in size's own bin, looking at every block there (for
  // when find() came back empty: before the pool maps a new page).
  block* find_in_bin(std::size_t size) const noexcept {
    block* best = nullptr;
    for (block* b = heads_[bin_of(size)]; b; b = b->fnext)
      if (b->size >= size && (!best || b->size < best->size)) {
        best = b;
        if (b->size == size) break;
      }
    return best;
  }

  // Size of the largest block (scans the top bin).
  std::size_t largest() const noexcept {
    if (!fl_map_) return 0;
    unsigned f = 63 - static_cast<unsigned>(std::countl_zero(fl_map_));
    unsigned s = 31 - static_cast<unsigned>(std::countl_zero(static_cast<unsigned>(sl_map_[f])));
    std::size_t m = 0;
    for (block* b = heads_[f * sl_count + s]; b; b = b->fnext) m = b->size > m ? b->size : m;
    return m;
  }

  bool empty() const noexcept { return fl_map_ == 0; }

  template <class F>
  void for_each(F&& f) const {
    std::uint64_t fm = fl_map_;
    while (fm) {
      unsigned fl = static_cast<unsigned>(std::countr_zero(fm));
      fm &= fm - 1;
      unsigned sm = sl_map_[fl];
      while (sm) {
        unsigned sl = static_cast<unsigned>(std::countr_zero(sm));
        sm &= sm - 1;
        for (block* b = heads_[fl * sl_count + sl]; b; b = b->fnext) f(b);
      }
    }
  }

 private:
  static constexpr unsigned bin_count = fl_count * sl_count;
  // The first non-empty bin at or above k (bin_count when none is).
  unsigned next_bin(unsigned k) const noexcept {
    if (k >= bin_count) return bin_count;
    const unsigned fl = k / sl_count, sl = k % sl_count;
    const unsigned rest = static_cast<unsigned>(sl_map_[fl]) & ~((1u << sl) - 1);
    if (rest) return fl * sl_count + static_cast<unsigned>(std::countr_zero(rest));
    const std::uint64_t up = fl + 1 < fl_count ? (fl_map_ & ~((std::uint64_t{2} << fl) - 1)) : 0;
    if (!up) return bin_count;
    const unsigned f = static_cast<unsigned>(std::countr_zero(up));
    return f * sl_count + static_cast<unsigned>(std::countr_zero(static_cast<unsigned>(sl_map_[f])));
  }

  std::uint64_t fl_map_ = 0;
  std::uint16_t sl_map_[fl_count] = {};
  block* heads_[fl_count * sl_count] = {};
};

}  // namespace vramkit::detail
