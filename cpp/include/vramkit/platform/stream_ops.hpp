// Events on streams, as the pool needs them to hand memory from one stream to
// another. The host device has no asynchronous work: every event is complete.
#pragma once
#include <cstdint>

#include "vramkit/resource.hpp"

namespace vramkit {

using event_id = std::uint64_t;

class stream_ops {
 public:
  virtual ~stream_ops() = default;
  // Records an event after all work queued on `s` so far.
  virtual event_id record(stream_t s) = 0;
  virtual bool done(event_id e) = 0;  // non-blocking
  virtual void wait(event_id e) = 0;  // blocks the host until done
  virtual void release(event_id e) noexcept = 0;
  // True while `s` is being captured into a CUDA graph: an event recorded on it
  // would become part of the graph and could not be queried. The pool's
  // non-blocking event calls leave such a stream alone.
  virtual bool capturing(stream_t /*s*/) noexcept { return false; }
  // Blocks until the work queued on `s` so far is done (the event goes back
  // when the wait fails too).
  void wait_for_stream(stream_t s) {
    event_id e = record(s);
    try {
      wait(e);
    } catch (...) {
      release(e);
      throw;
    }
    release(e);
  }
};

// Events that are always complete (no device work exists).
class host_stream_ops final : public stream_ops {
 public:
  event_id record(stream_t) override { return 1; }
  bool done(event_id) override { return true; }
  void wait(event_id) override {}
  void release(event_id) noexcept override {}
};

}  // namespace vramkit
