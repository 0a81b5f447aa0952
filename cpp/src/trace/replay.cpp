#include "vramkit/trace/replay.hpp"

#include <algorithm>
#include <chrono>
#include <exception>

namespace vramkit {

void validate_trace(const std::vector<trace_op>& ops) {
  std::uint64_t max_id = 0;
  for (auto& o : ops) max_id = std::max(max_id, o.id);
  std::vector<std::uint8_t> live(ops.empty() ? 0 : max_id + 1, 0);
  for (std::size_t i = 0; i < ops.size(); ++i) {
    auto& o = ops[i];
    if (o.action == trace_op::alloc) {
      if (live[o.id]) throw invalid_argument("trace op " + std::to_string(i) + ": allocation id " +
                                             std::to_string(o.id) + " is already live");
      live[o.id] = 1;
    } else if (o.action == trace_op::free) {
      if (!live[o.id]) throw invalid_argument("trace op " + std::to_string(i) + ": free of id " +
                                              std::to_string(o.id) + " which is not live");
      live[o.id] = 0;
    } else {
      throw invalid_argument("trace op " + std::to_string(i) + ": unknown action " + std::to_string(o.action));
    }
  }
}

std::size_t trace_peak_live(const std::vector<trace_op>& ops) {
  std::uint64_t max_id = 0;
  for (auto& o : ops) max_id = std::max(max_id, o.id);
  std::vector<std::uint64_t> size(ops.empty() ? 0 : max_id + 1, 0);
  std::size_t cur = 0, peak = 0;
  for (auto& o : ops) {
    if (o.action == trace_op::alloc) {
      size[o.id] = o.size;
      cur += o.size;
      peak = std::max(peak, cur);
    } else {
      cur -= size[o.id];
      size[o.id] = 0;
    }
  }
  return peak;
}

namespace {

struct pass_result {
  double ns_per_op;
  std::size_t ooms;
};

// Counts ops down to the next interrupt poll: a decrement per op, not a division.
struct interrupt_poll {
  const replay_options& o;
  std::size_t left = o.interrupt_every ? o.interrupt_every : 1;
  void tick() {
    if (--left) return;
    left = o.interrupt_every ? o.interrupt_every : 1;
    if (o.interrupted && o.interrupted()) throw replay_interrupted();
  }
};

// Frees what a pass left allocated when it ends by an exception (an interrupt, stop_on_oom).
struct free_on_throw {
  device_resource& r;
  std::vector<void*>& ptr;
  int unwinding = std::uncaught_exceptions();
  ~free_on_throw() {
    if (std::uncaught_exceptions() <= unwinding) return;
    for (auto& p : ptr)
      if (p) {
        r.deallocate(p, 0, 0);
        p = nullptr;
      }
  }
};

pass_result run_pass(const std::vector<trace_op>& ops, device_resource& r, std::vector<void*>& ptr,
                     const std::vector<stream_t>& streams, const replay_options& o, bool cold) {
  std::size_t ooms = 0;
  interrupt_poll poll{o};
  free_on_throw cleanup{r, ptr};
  auto t0 = std::chrono::steady_clock::now();
  const std::size_t n = ops.size();
  for (std::size_t i = 0; i < n; ++i) {
    const trace_op& op = ops[i];
    stream_t s = streams[op.stream];
    if (op.action == trace_op::alloc) {
      try {
        ptr[op.id] = r.allocate(op.size, s);
      } catch (const out_of_memory&) {
        if (o.stop_on_oom) throw;
        ptr[op.id] = nullptr;
        ++ooms;
      }
    } else {
      if (ptr[op.id]) r.deallocate(ptr[op.id], ops[i].size, s);
      ptr[op.id] = nullptr;
    }
    if (cold && o.progress && (i + 1) % o.progress_every == 0) o.progress(i + 1, n);
    poll.tick();
  }
  auto t1 = std::chrono::steady_clock::now();
  // Anything the trace left live is freed outside the timed region.
  for (std::size_t id = 0; id < ptr.size(); ++id)
    if (ptr[id]) {
      r.deallocate(ptr[id], 0, 0);
      ptr[id] = nullptr;
    }
  return {n ? std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(n) : 0.0, ooms};
}

}  // namespace

replay_result replay(const std::vector<trace_op>& ops, device_resource& r, const replay_options& o) {
  if (o.passes < 1) throw invalid_argument("replay: passes must be at least 1");
  replay_result res;
  res.ops = ops.size();
  std::uint64_t max_id = 0;
  std::uint16_t max_stream = 0;
  for (auto& op : ops) {
    max_id = std::max(max_id, op.id);
    max_stream = std::max(max_stream, op.stream);
    res.allocs += op.action == trace_op::alloc;
  }
  std::vector<stream_t> streams = o.streams;
  if (streams.empty())
    for (std::uint16_t i = 0; i <= max_stream; ++i) streams.push_back(i);
  if (streams.size() <= max_stream)
    throw invalid_argument("replay: the trace uses " + std::to_string(max_stream + 1) + " streams but " +
                           std::to_string(streams.size()) + " were given");
  res.peak_live_bytes = trace_peak_live(ops);
  std::vector<void*> ptr(ops.empty() ? 0 : max_id + 1, nullptr);

  r.reset_peaks();
  memory_state before = r.state();
  pass_result cold = run_pass(ops, r, ptr, streams, o, true);
  memory_state after = r.state();
  res.cold_ns_per_op = cold.ns_per_op;
  res.ooms = cold.ooms;
  res.peak_reserved_bytes = after.peak_reserved_bytes;
  res.upstream_allocs = after.upstream_allocs - before.upstream_allocs;
  res.fragmentation = res.peak_live_bytes
                          ? static_cast<double>(res.peak_reserved_bytes) / static_cast<double>(res.peak_live_bytes)
                          : 0.0;
  std::vector<double> warm;
  for (int p = 1; p < o.passes; ++p) warm.push_back(run_pass(ops, r, ptr, streams, o, false).ns_per_op);
  if (!warm.empty()) {
    std::sort(warm.begin(), warm.end());
    res.warm_ns_per_op = warm[warm.size() / 2];
  }
  res.peak_reserved_all_passes_bytes = std::max(res.peak_reserved_bytes, r.state().peak_reserved_bytes);
  res.fragmentation_all_passes = res.peak_live_bytes ? static_cast<double>(res.peak_reserved_all_passes_bytes) /
                                                           static_cast<double>(res.peak_live_bytes)
                                                     : 0.0;
  if (o.sample && o.sample_every) {
    // A separate, untimed pass that starts from an empty cache, so the
    // timeline shows reserved memory growing as it did in the cold pass.
    r.release_cached();
    interrupt_poll poll{o};
    free_on_throw cleanup{r, ptr};
    for (std::size_t i = 0; i < ops.size(); ++i) {
      poll.tick();
      const trace_op& op = ops[i];
      stream_t s = streams[op.stream];
      if (op.action == trace_op::alloc) {
        try {
          ptr[op.id] = r.allocate(op.size, s);
        } catch (const out_of_memory&) {
          ptr[op.id] = nullptr;
        }
      } else if (ptr[op.id]) {
        r.deallocate(ptr[op.id], 0, s);
        ptr[op.id] = nullptr;
      }
      if (i % o.sample_every == 0 || i + 1 == ops.size()) o.sample(i, r.state());
    }
    for (auto& p : ptr)
      if (p) {
        r.deallocate(p, 0, 0);
        p = nullptr;
      }
  }
  return res;
}

}  // namespace vramkit
