// vramkit._vramkit: replaying allocation traces (int64 op arrays from vramkit.trace) through
// a resource, and the pool's segments at a point of a trace.
#include <memory>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "bindings.hpp"
#include "vramkit/mr/pool_resource.hpp"
#include "vramkit/runtime.hpp"
#include "vramkit/trace/replay.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using namespace vramkit;
using namespace vramkit::py;

namespace {

std::vector<trace_op> to_ops(const nb::ndarray<const std::int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>& a) {
  if (a.shape(1) < 3) throw invalid_argument("ops must have columns action, id, size[, stream[, site]]");
  std::size_t n = a.shape(0), w = a.shape(1);
  const std::int64_t* d = a.data();
  std::vector<trace_op> ops(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t* r = d + i * w;
    if (r[0] != 0 && r[0] != 1) throw invalid_argument("op " + std::to_string(i) + ": action must be 0 or 1");
    if (r[1] < 0 || r[2] < 0) throw invalid_argument("op " + std::to_string(i) + ": negative id or size");
    ops[i].action = static_cast<std::uint8_t>(r[0]);
    ops[i].id = static_cast<std::uint64_t>(r[1]);
    ops[i].size = static_cast<std::uint64_t>(r[2]);
    if (w > 3) {
      if (r[3] < 0 || r[3] > 65535) throw invalid_argument("op " + std::to_string(i) + ": stream index out of range");
      ops[i].stream = static_cast<std::uint16_t>(r[3]);
    }
    if (w > 4) ops[i].site = static_cast<std::uint32_t>(r[4]);
  }
  return ops;
}

}  // namespace

void bind_trace(nb::module_& m) {
  m.def("replay", [](nb::ndarray<const std::int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu> a,
                     std::shared_ptr<device_resource> r, int passes, std::size_t sample_every,
                     nb::object progress, std::vector<stream_t> streams) {
    std::vector<trace_op> ops = to_ops(a);
    validate_trace(ops);
    replay_options o;
    o.passes = passes;
    o.streams = streams;
    std::vector<std::tuple<std::size_t, std::size_t, std::size_t>> timeline;
    if (sample_every) {
      o.sample_every = sample_every;
      o.sample = [&](std::size_t i, const memory_state& s) { timeline.emplace_back(i, s.live_bytes, s.reserved_bytes); };
    }
    if (!progress.is_none()) {
      o.progress_every = std::max<std::size_t>(ops.size() / 50, 1);
      o.progress = [&](std::size_t done, std::size_t total) {
        nb::gil_scoped_acquire g;
        progress(done, total);
      };
    }
    // Ctrl-C: the signal handler only runs when Python code does, so the replay asks for it.
    std::unique_ptr<nb::python_error> pending;
    o.interrupted = [&] {
      nb::gil_scoped_acquire g;
      if (PyErr_CheckSignals() == 0) return false;
      pending = std::make_unique<nb::python_error>();  // KeyboardInterrupt, or what the handler raised
      return true;
    };
    replay_result res;
    try {
      nb::gil_scoped_release rel;
      res = replay(ops, *r, o);
    } catch (const replay_interrupted&) {
      if (pending) throw nb::python_error(*pending);
      throw;
    }
    nb::dict d;
    d["ops"] = res.ops;
    d["allocs"] = res.allocs;
    d["peak_live_bytes"] = res.peak_live_bytes;
    d["peak_reserved_bytes"] = res.peak_reserved_bytes;
    d["fragmentation"] = res.fragmentation;
    d["peak_reserved_all_passes_bytes"] = res.peak_reserved_all_passes_bytes;
    d["fragmentation_all_passes"] = res.fragmentation_all_passes;
    d["upstream_allocs"] = res.upstream_allocs;
    d["ooms"] = res.ooms;
    d["cold_ns_per_op"] = res.cold_ns_per_op;
    d["warm_ns_per_op"] = res.warm_ns_per_op;
    d["timeline"] = timeline;
    return d;
  }, "ops"_a, "resource"_a, "passes"_a = 3, "sample_every"_a = 0, "progress"_a.none() = nb::none(),
        "streams"_a = std::vector<stream_t>{},
        "Replays ops (int64 rows action,id,size[,stream[,site]]) through a fresh resource.");
  m.def("segments_at", [](nb::ndarray<const std::int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu> a,
                          std::shared_ptr<device_resource> r, std::size_t stop) {
    std::vector<trace_op> ops = to_ops(a);
    validate_trace(ops);
    std::uint64_t max_id = 0;
    for (auto& o : ops) max_id = std::max(max_id, o.id);
    std::vector<void*> ptr(ops.empty() ? 0 : max_id + 1, nullptr);
    stop = std::min(stop, ops.size());
    for (std::size_t i = 0; i < stop; ++i) {
      auto& op = ops[i];
      if (op.action == trace_op::alloc) {
        try {
          ptr[op.id] = r->allocate(op.size, op.stream);
        } catch (const out_of_memory&) {
        }
      } else if (ptr[op.id]) {
        r->deallocate(ptr[op.id], 0, op.stream);
        ptr[op.id] = nullptr;
      }
    }
    pool_resource* p = find_pool(r.get());
    nb::list segs = p ? segments_list(p->segments()) : nb::list();
    for (auto& q : ptr)
      if (q) r->deallocate(q, 0, 0);
    return segs;
  }, "ops"_a, "resource"_a, "stop"_a, "Replays the first `stop` ops and returns the pool's segments at that point.");
  m.def("trace_peak_live", [](nb::ndarray<const std::int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu> a) {
    return trace_peak_live(to_ops(a));
  });
}
