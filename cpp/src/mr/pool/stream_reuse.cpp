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
    for (std::size_t k = 0; k < b->events.size(); ++k) {
      event_id& e = b->events[k];
      if (!e) {  // not recorded at the free: now, or (not waiting) at a later look
        if (streams->capturing(b->extra_streams[k])) {  // an event there would join the graph
          ready = false;
          break;
        }
        try {
          e = streams->record(b->extra_streams[k]);
        } catch (...) {
          if (wait) throw;
          ready = false;
          break;
        }
      }
      if (wait) {
        {
          gpu_wait w{ctr};
          streams->wait(e);
        }
        continue;
      }
      bool done = false;
      try {
        done = streams->done(e);
      } catch (...) {  // not known done: the block stays pending
      }
      if (!done) {
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

// Settles slot s's progress event: when it is done, done_seq moves to it and
// it is released; one that cannot be queried (a stream being captured, a
// failing device) is dropped. True when none is in flight afterwards.
bool pool_resource::impl::progress_settled(detail::stream_slot& s) noexcept {
  if (!s.progress_pending) return true;
  bool done = true;
  try {
    done = streams->done(s.progress);
  } catch (...) {  // dropped: done_seq stays
    streams->release(s.progress);
    s.progress_pending = false;
    return true;
  }
  if (!done) return false;
  streams->release(s.progress);
  s.progress_pending = false;
  s.done_seq = std::max(s.done_seq, s.progress_seq);
  return true;
}

// After a free on the stream of slot s (see stream_slot): once the progress
// event in flight is progress_every frees old, one query every
// progress_query_every frees (moving done_seq when it is done, and recording
// the next); a record when none is in flight. Only a hint: a failed record
// is tried again progress_query_every frees later.
void pool_resource::impl::note_progress(detail::stream_slot& s) noexcept {
  if (s.progress_pending && free_seq - s.progress_seq < progress_every) return;
  if (s.progress_tried && free_seq - s.progress_tried < progress_query_every) return;
  s.progress_tried = free_seq;
  if (streams->capturing(s.stream)) return;  // an event there would join the graph
  if (!progress_settled(s)) return;
  try {
    s.progress = streams->record(s.stream);
    s.progress_seq = free_seq;
    s.progress_pending = true;
  } catch (...) {
  }
}

// Hands slot s's free blocks freed up to seq to all streams (slot 0).
bool pool_resource::impl::reclaim_up_to(detail::stream_slot& s, std::uint64_t seq) {
  std::vector<block*> take;
  for (auto* idx : {&s.backed[0], &s.backed[1], &s.hollow[0], &s.hollow[1]})
    idx->for_each([&](block* b) {
      if (b->seq <= seq) take.push_back(b);
    });
  for (block* b : take) {
    slots.remove(b);
    slots.free_into(b, 0, b->seq, blocks);
  }
  ctr.stream_reclaims += take.size();
  return !take.empty();
}

// Reclaims what the last completed progress event of slot s covers, when that
// is more than was reclaimed already.
bool pool_resource::impl::reclaim_done(detail::stream_slot& s) {
  progress_settled(s);
  if (s.done_seq <= s.reclaimed_seq) return false;
  s.reclaimed_seq = s.done_seq;
  return reclaim_up_to(s, s.done_seq);
}

// Hands free blocks of other streams to all streams once their work is done.
bool pool_resource::impl::reclaim_streams(bool wait, bool progress) {
  bool moved = false;
  for (std::uint32_t i = 1; i < slots.size(); ++i) {
    auto& s = slots[i];
    // Waiting, a second round covers what was freed after a pending event
    // was recorded: after it the slot holds nothing.
    // Not waiting, a stream being captured gets no event (it would join the
    // graph and could not be asked); its blocks wait for the capture's end.
    if (!wait && s.free_blocks && !s.event_pending && streams->capturing(s.stream)) continue;
    // Not waiting, an event call that fails leaves the slot as it is (its
    // frees are not known done); waiting, the failure reaches the caller.
    for (int round = 0; round < (wait ? 2 : 1); ++round) {
      if (s.free_blocks == 0) break;
      if (!s.event_pending) {
        try {
          s.event = streams->record(s.stream);
        } catch (...) {
          if (wait) throw;
          break;
        }
        s.event_seq = free_seq;
        s.event_pending = true;
      }
      if (wait) {
        gpu_wait w{ctr};
        streams->wait(s.event);
      } else {
        bool done = false;
        try {
          done = streams->done(s.event);
        } catch (...) {
        }
        if (!done) break;
      }
      streams->release(s.event);
      s.event_pending = false;
      s.reclaimed_seq = std::max(s.reclaimed_seq, s.event_seq);
      moved |= reclaim_up_to(s, s.event_seq);
    }
    if (progress && !wait && s.free_blocks) moved |= reclaim_done(s);  // a progress event may cover more
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
