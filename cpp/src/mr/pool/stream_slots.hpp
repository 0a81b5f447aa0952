// Stream slots: the free blocks of each stream, indexed by size, and the
// event that hands them to every stream once that stream's work is done.
// Words used here are defined in glossary.hpp.
#pragma once
#include <cstddef>
#include <cstdint>

#include "../../detail/free_index.hpp"
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

}  // namespace vramkit::detail
