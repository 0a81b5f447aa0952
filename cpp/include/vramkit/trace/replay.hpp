// Runs an allocation trace against any resource and measures it.
#pragma once
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "vramkit/resource.hpp"

namespace vramkit {

struct trace_op {
  enum : std::uint8_t { alloc = 0, free = 1 };
  std::uint8_t action = alloc;
  std::uint16_t stream = 0;  // index into the trace's stream table
  std::uint32_t site = 0;    // call-site id (0 = none)
  std::uint64_t id = 0;      // allocation id, dense from 0
  std::uint64_t size = 0;    // requested bytes (alloc)
};

struct replay_options {
  int passes = 3;                   // 1 cold pass + (passes-1) warm passes
  std::vector<stream_t> streams;    // stream table index -> stream handle (default: index itself)
  bool stop_on_oom = false;         // else an OOM'd alloc is counted and its free skipped
  // Called every `progress_every` ops of the cold pass with (done, total).
  std::function<void(std::size_t, std::size_t)> progress;
  std::size_t progress_every = 1 << 16;
  // Called after each op of an extra measuring pass (timeline sampling); see replay().
  std::function<void(std::size_t op_index, const memory_state&)> sample;
  std::size_t sample_every = 0;     // 0 = no sampling pass
  // Polled every `interrupt_every` ops of every pass: returning true ends the replay with
  // replay_interrupted, after freeing what the replay holds (the binding checks Ctrl-C here).
  std::function<bool()> interrupted;
  std::size_t interrupt_every = 1 << 14;
};

// Thrown by replay() when options.interrupted() returned true.
struct replay_interrupted : std::runtime_error {
  replay_interrupted() : std::runtime_error("replay interrupted") {}
};

struct replay_result {
  std::size_t ops = 0;
  std::size_t allocs = 0;
  std::size_t peak_live_bytes = 0;      // peak of live requested bytes: the floor
  std::size_t peak_reserved_bytes = 0;  // in the cold pass
  double fragmentation = 0;             // peak_reserved / peak_live
  // The peak over every pass, warm ones included: above the cold pass's
  // where the pool keeps growing as the same operations come again.
  std::size_t peak_reserved_all_passes_bytes = 0;
  double fragmentation_all_passes = 0;  // peak_reserved_all_passes / peak_live
  std::size_t upstream_allocs = 0;
  std::size_t ooms = 0;
  double cold_ns_per_op = 0;
  double warm_ns_per_op = 0;  // median over the warm passes
};

// The floor: peak of live requested bytes (validates ids as it goes).
std::size_t trace_peak_live(const std::vector<trace_op>& ops);

// Throws invalid_argument if an alloc reuses a live id or a free names an id
// that is not live (importers drop those before replay).
void validate_trace(const std::vector<trace_op>& ops);

// The resource must be fresh (nothing cached) for the cold pass to mean cold.
replay_result replay(const std::vector<trace_op>& ops, device_resource& resource,
                     const replay_options& options = {});

}  // namespace vramkit
