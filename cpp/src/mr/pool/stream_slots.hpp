// Stream slots: the free blocks of each stream, indexed by size, and the
// event that hands them to every stream once that stream's work is done.
// Words used here are defined in glossary.hpp.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "../../detail/free_index.hpp"
#include "page_map.hpp"
#include "vramkit/platform/stream_ops.hpp"

namespace vramkit::detail {

// Free blocks of one stream (slot 0: free blocks any stream may take).
struct stream_slot {
  stream_t stream = 0;
  // [0] large arena, [1] small arena.
  free_index backed[2];  // every page behind the block is mapped
  free_index hollow[2];  // some pages inside are unmapped
  block* steal_head = nullptr;  // free blocks with mapped pages wholly inside them
  block* steal_tail = nullptr;
  bool event_pending = false;
  event_id event = 0;
  std::uint64_t event_seq = 0;  // blocks freed before this are covered by `event`
  // The progress event: recorded at a free, at most one in flight and one per
  // progress_every frees. Once it is that old, the free path asks every
  // progress_query_every frees whether it is done; if so, done_seq moves to
  // it and a new one is recorded. Blocks of this slot freed up to done_seq
  // are known done on the GPU, so page supply may hand them to slot 0 while
  // the event it records itself is not done yet.
  bool progress_pending = false;
  event_id progress = 0;
  std::uint64_t progress_seq = 0;    // free_seq when it was recorded
  std::uint64_t progress_tried = 0;  // free_seq of the last record or query
  std::uint64_t done_seq = 0;
  std::uint64_t reclaimed_seq = 0;  // blocks up to here were handed to slot 0 (or looked at)
  std::size_t free_blocks = 0;

  // The steal list: free blocks of this slot with mapped pages wholly inside
  // them, oldest first (page supply takes pages from its head).
  void steal_link(block* b) {
    b->in_steal = true;
    b->sprev = steal_tail;
    b->snext = nullptr;
    if (steal_tail)
      steal_tail->snext = b;
    else
      steal_head = b;
    steal_tail = b;
  }
  void steal_unlink(block* b) {
    if (!b->in_steal) return;
    if (b->sprev)
      b->sprev->snext = b->snext;
    else
      steal_head = b->snext;
    if (b->snext)
      b->snext->sprev = b->sprev;
    else
      steal_tail = b->sprev;
    b->in_steal = false;
    b->sprev = b->snext = nullptr;
  }
};

// Pages lying wholly inside block b (pages of `page` bytes; none in a
// segment, which has no pages).
inline std::size_t interior_pages(const block* b, std::size_t page) {
  if (!b->ar->paged) return 0;
  std::size_t lo = round_up(b->addr - b->ar->base, page) / page;
  std::size_t hi = (b->addr + b->size - b->ar->base) / page;
  return hi > lo ? hi - lo : 0;
}

// Every stream's slot, [0] the shared one. It keeps the free index's
// invariants: a free block is in exactly one index of its slot (backed or
// hollow by its unmapped count, by its arena), on its slot's steal list iff
// stealable, and never next to a free block of the same slot (they merge).
// Everything here runs on the hot path and is inline.
class slot_table {
 public:
  slot_table() { slots_.emplace_back(); }  // slot 0: shared
  void set_page(std::size_t page) { page_ = page; }

  std::uint32_t size() const { return static_cast<std::uint32_t>(slots_.size()); }
  stream_slot& operator[](std::uint32_t i) { return slots_[i]; }
  const stream_slot& operator[](std::uint32_t i) const { return slots_[i]; }
  auto begin() { return slots_.begin(); }
  auto end() { return slots_.end(); }
  auto begin() const { return slots_.begin(); }
  auto end() const { return slots_.end(); }

  // The slot of stream s, added on its first use.
  std::uint32_t slot_for(stream_t s) {
    for (std::uint32_t i = 1; i < slots_.size(); ++i)
      if (slots_[i].stream == s) return i;
    slots_.emplace_back();
    slots_.back().stream = s;
    return static_cast<std::uint32_t>(slots_.size() - 1);
  }

  bool stealable(const block* b) const { return b->ar->paged && interior_pages(b, page_) > b->unmapped; }

  void insert(block* b, std::uint32_t slot) {
    auto& s = slots_[slot];
    b->state = block::free_state;
    b->slot = slot;
    b->hollow = b->unmapped > 0;
    (b->hollow ? s.hollow : s.backed)[b->ar->small].insert(b);
    if (stealable(b)) s.steal_link(b);
    ++s.free_blocks;
  }
  void remove(block* b) {
    auto& s = slots_[b->slot];
    (b->hollow ? s.hollow : s.backed)[b->ar->small].remove(b);
    s.steal_unlink(b);
    --s.free_blocks;
  }

  // Frees b into `slot`, merging with free neighbours of the same slot (their
  // records go back to `blocks`).
  void free_into(block* b, std::uint32_t slot, std::uint64_t seq, block_pool& blocks) {
    b->requested = 0;
    b->seq = seq;
    if (block* p = b->prev; p && p->state == block::free_state && p->slot == slot) {
      remove(p);
      absorb(p, b, blocks);
      b = p;
    }
    if (block* n = b->next; n && n->state == block::free_state && n->slot == slot) {
      remove(n);
      absorb(b, n, blocks);
    }
    insert(b, slot);
  }

  // Block r, out of every index, becomes part of its left neighbour l (both free, one slot).
  static void absorb(block* l, block* r, block_pool& blocks) {
    l->size += r->size;
    l->unmapped += r->unmapped;
    l->seq = std::max(l->seq, r->seq);
    l->next = r->next;
    if (r->next) r->next->prev = l;
    blocks.recycle(r);
  }

  // k more interior pages of free block b were taken away (stolen): it is
  // hollow now, and off the steal list once nothing mapped is left inside.
  void pages_taken(block* b, std::size_t k) {
    auto& s = slots_[b->slot];
    (b->hollow ? s.hollow : s.backed)[b->ar->small].remove(b);
    b->unmapped += k;
    b->hollow = true;
    s.hollow[b->ar->small].insert(b);
    if (!stealable(b)) s.steal_unlink(b);
  }

  block* find_fit(std::size_t size, bool small, std::uint32_t slot, bool hollow, bool by_address = false) {
    const std::uint32_t order[2] = {slot, 0};
    const int n = slot == 0 ? 1 : 2;
    if (by_address) {  // fit:address: an exact fit of either slot, else the lower address
      block* best = nullptr;
      for (int i = 0; i < n; ++i) {
        auto& s = slots_[order[i]];
        block* b = (hollow ? s.hollow : s.backed)[small].find_lowest(size);
        if (!b) continue;
        const bool exact = b->size == size, best_exact = best && best->size == size;
        if (!best || (exact && !best_exact) || (exact == best_exact && b->addr < best->addr)) best = b;
      }
      return best;
    }
    // The tighter of the stream's own fit and the shared one (lower address on ties).
    block* best = nullptr;
    for (int i = 0; i < n; ++i) {
      auto& s = slots_[order[i]];
      auto& idx = (hollow ? s.hollow : s.backed)[small];
      if (block* b = idx.find(size)) {
        if (!best || b->size < best->size || (b->size == best->size && b->addr < best->addr)) best = b;
        if (best->size == size) break;
      }
    }
    return best;
  }

  block* find_fit_exhaustive(std::size_t size, bool small, std::uint32_t slot) {
    const std::uint32_t order[2] = {slot, 0};
    const int n = slot == 0 ? 1 : 2;
    for (int i = 0; i < n; ++i)
      if (block* b = slots_[order[i]].backed[small].find_in_bin(size)) return b;
    return nullptr;
  }

  // The largest backed free block of any slot.
  std::size_t largest_backed() const {
    std::size_t largest = 0;
    for (auto& s : slots_) largest = std::max({largest, s.backed[0].largest(), s.backed[1].largest()});
    return largest;
  }

 private:
  std::vector<stream_slot> slots_;
  std::size_t page_ = 0;
};

}  // namespace vramkit::detail
