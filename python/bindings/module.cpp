// The Python module vramkit._vramkit: a thin layer over the C++ core.
#include <memory>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "bindings.hpp"
#include "vramkit/mr/page_resource.hpp"
#include "vramkit/platform/cuda.hpp"
#include "vramkit/platform/host_page_device.hpp"
#include "vramkit/runtime.hpp"
#include "vramkit/trace/replay.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using namespace vramkit;

namespace vramkit::py {

std::uint64_t to_u64(nb::handle h, const char* what) {
  // Checked here rather than by a std::size_t argument: nanobind answers a negative
  // or too large int with its whole signature list, and a failed cast with bad_cast.
  if (PyBool_Check(h.ptr())) throw invalid_argument(std::string(what) + " must be an integer, not bool");
  PyObject* i = PyNumber_Index(h.ptr());
  if (!i) {
    PyErr_Clear();
    throw invalid_argument(std::string(what) + " must be an integer, not " +
                           nb::cast<std::string>(nb::type_name(h.type())));
  }
  nb::object owned = nb::steal(i);
  int overflow = 0;
  long long v = PyLong_AsLongLongAndOverflow(i, &overflow);
  if (overflow < 0 || (!overflow && v < 0))
    throw invalid_argument(std::string(what) + " must not be negative (got " +
                           nb::cast<std::string>(nb::str(owned)) + ")");
  if (!overflow) return static_cast<std::uint64_t>(v);
  unsigned long long u = PyLong_AsUnsignedLongLong(i);
  if (PyErr_Occurred()) {
    PyErr_Clear();
    throw invalid_argument(std::string(what) + " " + nb::cast<std::string>(nb::str(owned)) + " is over 2**64-1");
  }
  return u;
}

stream_t to_stream(nb::handle h) {
  if (h.is_none()) return 0;
  if (PyIndex_Check(h.ptr())) return static_cast<stream_t>(to_u64(h, "stream"));
  if (nb::hasattr(h, "cuda_stream")) return static_cast<stream_t>(to_u64(h.attr("cuda_stream"), "stream"));  // torch
  if (nb::hasattr(h, "ptr")) return static_cast<stream_t>(to_u64(h.attr("ptr"), "stream"));                  // cupy
  if (nb::hasattr(h, "handle")) return to_stream(h.attr("handle"));                                          // numba
  throw invalid_argument("stream must be an int (cudaStream_t), a torch/cupy/numba stream, or None");
}

int to_device(nb::handle h) {
  if (h.is_none()) return current_backend() == backend::cuda ? cuda::current_device() : 0;
  if (PyIndex_Check(h.ptr())) {
    std::uint64_t d = to_u64(h, "device");
    if (d > 1 << 20) throw invalid_argument("unknown device " + std::to_string(d));
    return static_cast<int>(d);
  }
  if (nb::hasattr(h, "index")) {  // torch.device
    nb::object i = h.attr("index");
    if (i.is_none()) return to_device(nb::none());
    return to_device(i);
  }
  if (nb::hasattr(h, "id")) return to_device(h.attr("id"));  // cupy Device
  throw invalid_argument("device must be an int, a torch.device, a cupy Device, or None");
}

nb::dict state_dict(const memory_state& s) {
  nb::dict d;
  d["live_bytes"] = s.live_bytes;
  d["live_count"] = s.live_count;
  d["reserved_bytes"] = s.reserved_bytes;
  d["cached_bytes"] = s.cached_bytes;
  d["pending_free_bytes"] = s.pending_free_bytes;
  d["largest_free_bytes"] = s.largest_free_bytes;
  d["capacity_bytes"] = s.capacity_bytes;
  d["upstream_allocs"] = s.upstream_allocs;
  d["upstream_frees"] = s.upstream_frees;
  d["oom_count"] = s.oom_count;
  d["retries"] = s.retries;
  d["peak_live_bytes"] = s.peak_live_bytes;
  d["peak_reserved_bytes"] = s.peak_reserved_bytes;
  return d;
}

}  // namespace vramkit::py

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

nb::list segments_list(const std::vector<segment_info>& segs) {
  nb::list out;
  for (auto& s : segs) {
    nb::dict d;
    d["base"] = s.base;
    d["size"] = s.size;
    d["mapped_bytes"] = s.mapped_bytes;
    d["small"] = s.small;
    nb::list bl;
    for (auto& b : s.blocks) {
      nb::dict x;
      x["addr"] = b.addr;
      x["size"] = b.size;
      x["requested"] = b.requested;
      x["allocated"] = b.allocated;
      x["pending"] = b.pending;
      x["stream"] = b.stream;
      bl.append(x);
    }
    d["blocks"] = bl;
    out.append(d);
  }
  return out;
}

}  // namespace

NB_MODULE(_vramkit, m) {
  m.doc() = "vramkit core (C++)";
  nb::exception<out_of_memory>(m, "OutOfMemoryError", PyExc_MemoryError);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const invalid_argument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const cuda_error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });

  nb::class_<device_resource>(m, "Resource", "A memory resource: an upstream, the pool, or an adaptor over one.")
      .def_prop_ro("name", &device_resource::name)
      .def_prop_ro("device", &device_resource::device)
      .def("allocate", [](device_resource& r, std::size_t n, nb::handle s) {
            return reinterpret_cast<std::uintptr_t>(r.allocate(n, to_stream(s)));
          }, "nbytes"_a, "stream"_a.none() = nb::none(), "Allocates nbytes; returns the device pointer as an int.")
      .def("deallocate", [](device_resource& r, std::uintptr_t p, std::size_t n, nb::handle s) {
            r.deallocate_checked(reinterpret_cast<void*>(p), n, to_stream(s));
          }, "ptr"_a, "nbytes"_a = 0, "stream"_a.none() = nb::none(),
          "Frees ptr. Raises ValueError on a double free, a foreign pointer or a wrong size (nothing changes).")
      .def("record_stream", [](device_resource& r, std::uintptr_t p, nb::handle s) {
            r.record_stream(reinterpret_cast<void*>(p), to_stream(s));
          }, "ptr"_a, "stream"_a)
      .def("release_cached", &device_resource::release_cached, nb::call_guard<nb::gil_scoped_release>())
      .def("state", [](const device_resource& r) { return state_dict(r.state()); })
      .def("reset_peaks", &device_resource::reset_peaks)
      .def("allocation_size", [](const device_resource& r, std::uintptr_t p) {
            return r.allocation_size(reinterpret_cast<void*>(p));
          })
      .def("statistics", [](device_resource& r) -> nb::object {
            auto* s = dynamic_cast<statistics_adaptor*>(&r);
            if (!s) return nb::none();
            return stats_dict(s->stats());
          })
      .def("segments", [](device_resource& r) {
            pool_resource* p = find_pool(&r);
            if (!p) throw invalid_argument("segments: resource '" + r.name() + "' holds no pool");
            return segments_list(p->segments());
          })
      .def("pool_counters", [](device_resource& r) -> nb::object {
            pool_resource* p = find_pool(&r);
            if (!p) return nb::none();
            auto c = p->counters();
            nb::dict d;
            d["pages_created"] = c.pages_created;
            d["pages_destroyed"] = c.pages_destroyed;
            d["pages_mapped"] = c.pages_mapped;
            d["pages_unmapped"] = c.pages_unmapped;
            d["pages_remapped"] = c.pages_remapped;
            d["mappings_reused"] = c.mappings_reused;
            d["map_calls"] = c.map_calls;
            d["segments_allocated"] = c.segments_allocated;
            d["segments_freed"] = c.segments_freed;
            d["stream_reclaims"] = c.stream_reclaims;
            d["pages_deferred"] = c.pages_deferred;
            d["deferred_waits"] = c.deferred_waits;
            d["page_size"] = p->page_size();
            d["options"] = p->options().to_string();
            return d;
          })
      .def("set_reserve_limit", [](device_resource& r, std::size_t n) {
            pool_resource* p = find_pool(&r);
            if (!p) throw invalid_argument("set_reserve_limit: resource '" + r.name() + "' holds no pool");
            p->set_reserve_limit(n);
          })
      .def("check_invariants", [](device_resource& r) {
            pool_resource* p = find_pool(&r);
            if (p) p->check_invariants();
          })
      .def("__repr__", [](const device_resource& r) { return "<vramkit.Resource " + r.name() + " on device " + std::to_string(r.device()) + ">"; });

  m.def("make_resource", &make_resource, "spec"_a, "device"_a = 0,
        "Builds an allocator from a spec: vramkit|pool[:upstream=U,key:value,...], host, vmm, cuda, cuda_async[:release_threshold=SIZE].");
  m.def("statistics_adaptor", [](std::shared_ptr<device_resource> r) -> std::shared_ptr<device_resource> {
    return std::make_shared<statistics_adaptor>(std::move(r));
  });
  m.def("limiting_adaptor", [](std::shared_ptr<device_resource> r, std::size_t limit) -> std::shared_ptr<device_resource> {
    return std::make_shared<limiting_adaptor>(std::move(r), limit);
  }, "resource"_a, "limit_bytes"_a);
  m.def("limiting_adaptor_fraction", [](std::shared_ptr<device_resource> r, double f) -> std::shared_ptr<device_resource> {
    return limiting_adaptor::from_fraction(std::move(r), f);
  }, "resource"_a, "fraction"_a);
  m.def("host_pool", [](std::size_t capacity, const std::string& conf) -> std::shared_ptr<device_resource> {
    pool_options o;
    o.parse(conf);
    return std::make_shared<pool_resource>(
        std::make_shared<host_page_device>(capacity, o.page_size ? o.page_size : std::size_t{2} << 20),
        std::make_shared<host_stream_ops>(), o);
  }, "capacity"_a = host_page_device::default_capacity, "options"_a = "",
        "A pool over a fresh simulated device of the given capacity.");
  m.def("parse_options", [](const std::string& conf) {
    pool_options o;
    o.parse(conf);
    return o.to_string();
  });
  m.def("parse_size", &parse_size);
  m.def("format_bytes", &format_bytes);

  m.def("backend", [] { return std::string(to_string(current_backend())); });
  m.def("device_count", &device_count);
  m.def("cuda_device_count", &cuda::device_count);
  m.def("cuda_unavailable_reason", &cuda::unavailable_reason);
  m.def("built_with_cuda", &cuda::built_with_cuda);
  m.def("current_resource", [](nb::handle d) { return current_resource(to_device(d)); }, "device"_a.none() = nb::none());
  m.def("set_current_resource", [](std::shared_ptr<device_resource> r, nb::handle d) {
    set_current_resource(std::move(r), to_device(d));
  }, "resource"_a, "device"_a.none() = nb::none());
  m.def("reset_runtime", &reset_runtime);
  m.def("to_device", [](nb::handle d) { return to_device(d); }, nb::arg().none());
  m.def("to_stream", [](nb::handle s) { return to_stream(s); }, nb::arg().none());
  m.def("mem_get_info", [](nb::handle d) {
    std::size_t fr = 0, tot = 0;
    device_mem_info(to_device(d), fr, tot);
    return std::make_pair(fr, tot);
  }, "device"_a.none() = nb::none());
  m.def("device_properties", [](nb::handle dh) {
    device_properties p = get_device_properties(to_device(dh));
    nb::dict d;
    d["name"] = p.name;
    d["device"] = p.device;
    d["simulated"] = p.simulated;
    d["global_memory_bytes"] = p.global_memory_bytes;
    d["constant_memory_bytes"] = p.constant_memory_bytes;
    d["shared_memory_per_block_bytes"] = p.shared_memory_per_block_bytes;
    d["shared_memory_per_sm_bytes"] = p.shared_memory_per_sm_bytes;
    d["l2_cache_bytes"] = p.l2_cache_bytes;
    d["sm_count"] = p.sm_count;
    d["memory_bus_width_bits"] = p.memory_bus_width_bits;
    d["memory_clock_khz"] = p.memory_clock_khz;
    d["compute_capability"] = std::make_pair(p.compute_capability_major, p.compute_capability_minor);
    d["allocation_granularity"] = p.allocation_granularity;
    d["theoretical_bandwidth_bytes_per_s"] = p.theoretical_bandwidth_bytes_per_s();
    return d;
  }, "device"_a.none() = nb::none());

  // Streams (CUDA backend only; the host backend takes any integer).
  m.def("create_stream", [](nb::handle d) { return cuda::create_stream(to_device(d)); }, "device"_a.none() = nb::none());
  m.def("destroy_stream", &cuda::destroy_stream);
  m.def("synchronize", [](nb::handle d) {
    if (current_backend() == backend::cuda) cuda::synchronize_device(to_device(d));
  }, "device"_a.none() = nb::none());
  m.def("copy_to_device", [](std::uintptr_t dst, nb::bytes src) {
    if (current_backend() == backend::cuda)
      cuda::copy_to_device(reinterpret_cast<void*>(dst), src.c_str(), src.size());
    else
      std::memcpy(reinterpret_cast<void*>(dst), src.c_str(), src.size());
  });
  m.def("copy_to_host", [](std::uintptr_t src, std::size_t n) {
    std::string out(n, '\0');
    if (current_backend() == backend::cuda)
      cuda::copy_to_host(out.data(), reinterpret_cast<void*>(src), n);
    else
      std::memcpy(out.data(), reinterpret_cast<void*>(src), n);
    return nb::bytes(out.data(), out.size());
  });

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

  bind_buffer(m);
  bind_monitor(m);
  bind_leaks(m);
}
