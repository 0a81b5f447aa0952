// Stream reuse: a free on a stream other than the allocation's waits
// (pending) until every stream that used the block is done with it; free
// blocks of one stream reach all streams (slot 0) once an event recorded on
// that stream after their free completes.
#include <algorithm>
#include <vector>

#include "pool_impl.hpp"

namespace vramkit {

void pool_resource::impl::process_pending(bool wait) {
  for (std::size_t i = 0; i < pending.size();) {
    block* b = pending[i];
    bool ready = true;
    for (event_id e : b->events) {
      if (wait)
        streams->wait(e);
      else if (!streams->done(e)) {
        ready = false;
        break;
      }
    }
    if (!ready) {
      ++i;
      continue;
    }
    for (event_id e : b->events) streams->release(e);
    b->events.clear();
    b->extra_streams.clear();
    pending_bytes -= b->size;
    pending[i] = pending.back();
    pending.pop_back();
    slots.free_into(b, slots.slot_for(b->stream), ++free_seq, blocks);
  }
}

// Hands free blocks of other streams to all streams once their work is done.
bool pool_resource::impl::reclaim_streams(bool wait) {
  bool moved = false;
  for (std::uint32_t i = 1; i < slots.size(); ++i) {
    auto& s = slots[i];
    // Waiting, a second round covers what was freed after a pending event
    // was recorded: after it the slot holds nothing.
    for (int round = 0; round < (wait ? 2 : 1); ++round) {
      if (s.free_blocks == 0) break;
      if (!s.event_pending) {
        s.event = streams->record(s.stream);
        s.event_seq = free_seq;
        s.event_pending = true;
      }
      if (wait)
        streams->wait(s.event);
      else if (!streams->done(s.event))
        break;
      streams->release(s.event);
      s.event_pending = false;
      std::vector<block*> take;
      for (auto* idx : {&s.backed[0], &s.backed[1], &s.hollow[0], &s.hollow[1]})
        idx->for_each([&](block* b) {
          if (b->seq <= s.event_seq) take.push_back(b);
        });
      for (block* b : take) {
        slots.remove(b);
        slots.free_into(b, 0, b->seq, blocks);
        moved = true;
      }
      ctr.stream_reclaims += take.size();
    }
  }
  return moved;
}

void pool_resource::impl::record_stream(void* ptr, stream_t stream) {
  std::lock_guard<std::mutex> lk(mu);
  block** slot = live.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (!slot) throw invalid_argument("record_stream: pointer " + std::to_string(reinterpret_cast<std::uintptr_t>(ptr)) +
                                    " is not a live allocation of this pool");
  block* b = *slot;
  if (stream == b->stream) return;
  if (std::find(b->extra_streams.begin(), b->extra_streams.end(), stream) == b->extra_streams.end())
    b->extra_streams.push_back(stream);
}

}  // namespace vramkit
