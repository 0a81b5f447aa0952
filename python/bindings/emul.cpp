// Bindings of the PyTorch allocator emulation and of the one-pass trace
// profile that `vramkit advise` and the report read (peak, first OOM, the
// memory curve, and the segments at the peak), all in C++ so that a trace of
// ten million ops never becomes ten million Python objects.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <vector>

#include "bindings.hpp"
#include "vramkit/emul/torch_caching.hpp"
#include "vramkit/mr/pool_resource.hpp"
#include "vramkit/runtime.hpp"
#include "vramkit/trace/torch_csv.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using namespace vramkit;

namespace {

using ops_array = nb::ndarray<const std::int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

struct profile {
  std::size_t ops = 0, peak_reserved = 0, peak_op = 0, peak_live = 0, ooms = 0;
  std::size_t allocated_at_peak = 0, requested_at_peak = 0;  // rounded and requested live bytes there
  std::int64_t first_oom_op = -1;
  std::size_t first_oom_size = 0, final_reserved = 0;
  std::string first_oom_message;
  // curve: per bucket of ops, the op where reserved was highest and its values
  std::vector<std::int64_t> t_op;
  std::vector<std::int64_t> t_reserved, t_live;
};

// One pass over ops through r; stops after op `stop` (inclusive) when stop >= 0.
struct at_stop {
  std::vector<emul::torch_segment_info> torch;
  std::vector<segment_info> pool;
  bool have_torch = false, have_pool = false;
};

// marks: op indices (ascending) before which a step begins (pool_resource::mark_step, for
// plan_steps; nothing for other resources).
profile run(const ops_array& a, device_resource& r, std::size_t points, std::int64_t stop, const nb::object& progress,
            at_stop* seen, const std::vector<std::int64_t>& marks = {}) {
  if (a.shape(1) < 3) throw invalid_argument("ops must have columns action, id, size[, stream]");
  const std::size_t n = a.shape(0), w = a.shape(1);
  const std::int64_t* d = a.data();
  std::int64_t max_id = -1;
  for (std::size_t i = 0; i < n; ++i) max_id = std::max(max_id, d[i * w + 1]);
  std::vector<void*> ptr(static_cast<std::size_t>(max_id + 1), nullptr);
  std::vector<std::uint64_t> size(ptr.size(), 0);
  std::vector<std::uint8_t> live(ptr.size(), 0);  // 1 live, 2 refused by an OOM
  auto* torch = dynamic_cast<emul::torch_caching_emulator*>(&r);
  profile p;
  p.ops = n;
  const std::size_t bucket = points ? std::max<std::size_t>(1, (n + points - 1) / points) : 0;
  std::size_t live_req = 0, held_req = 0, b_best = 0;  // held: requested bytes actually allocated
  std::int64_t b_op = -1, b_live = 0;
  const std::size_t every = std::max<std::size_t>(n / 100, 1 << 16);
  const std::size_t end = stop >= 0 ? std::min<std::size_t>(n, static_cast<std::size_t>(stop) + 1) : n;
  for (std::size_t k = 1; k < marks.size(); ++k)
    if (marks[k] <= marks[k - 1]) throw invalid_argument("marks must be op indices in ascending order");
  pool_resource* marked = marks.empty() ? nullptr : find_pool(&r);
  std::size_t next_mark = 0;
  while (next_mark < marks.size() && marks[next_mark] < 0) ++next_mark;
  for (std::size_t i = 0; i < end; ++i) {
    const std::int64_t* row = d + i * w;
    for (; next_mark < marks.size() && static_cast<std::size_t>(marks[next_mark]) == i; ++next_mark)
      if (marked) marked->mark_step();
    if (row[1] < 0 || row[2] < 0 || (row[0] != 0 && row[0] != 1))
      throw invalid_argument("op " + std::to_string(i) + ": bad row (action 0/1, id and size >= 0)");
    auto id = static_cast<std::size_t>(row[1]);
    stream_t s = w > 3 ? static_cast<stream_t>(row[3]) : 0;
    if (row[0] == 0) {
      if (live[id]) throw invalid_argument("op " + std::to_string(i) + ": allocation id " + std::to_string(id) + " is already live");
      size[id] = static_cast<std::uint64_t>(row[2]);
      live_req += size[id];
      try {
        ptr[id] = r.allocate(size[id], s);
        live[id] = 1;
        held_req += size[id];
      } catch (const out_of_memory& e) {
        live[id] = 2;
        if (p.ooms++ == 0) {
          p.first_oom_op = static_cast<std::int64_t>(i);
          p.first_oom_size = size[id];
          p.first_oom_message = e.what();
        }
      }
    } else {
      if (!live[id]) throw invalid_argument("op " + std::to_string(i) + ": free of id " + std::to_string(id) + " which is not live");
      if (live[id] == 1) held_req -= size[id];
      if (live[id] == 1 && ptr[id]) r.deallocate(ptr[id], size[id], s);
      live_req -= size[id];
      live[id] = 0;
      ptr[id] = nullptr;
    }
    std::size_t res = torch ? torch->reserved_bytes() : r.state().reserved_bytes;
    p.peak_live = std::max(p.peak_live, live_req);
    if (res > p.peak_reserved || i == 0) {
      p.peak_reserved = res, p.peak_op = i, p.requested_at_peak = held_req;
      p.allocated_at_peak = torch ? torch->allocated_bytes() : r.state().live_bytes;
    }
    if (bucket) {
      if (b_op < 0 || res > b_best) b_best = res, b_op = static_cast<std::int64_t>(i), b_live = static_cast<std::int64_t>(live_req);
      if ((i + 1) % bucket == 0 || i + 1 == end) {
        p.t_op.push_back(b_op);
        p.t_reserved.push_back(static_cast<std::int64_t>(b_best));
        p.t_live.push_back(b_live);
        b_op = -1;
      }
    }
    if (!progress.is_none() && (i + 1) % every == 0) {
      nb::gil_scoped_acquire g;
      progress(i + 1, n);
    }
  }
  p.final_reserved = torch ? torch->reserved_bytes() : r.state().reserved_bytes;
  if (seen && torch) seen->torch = torch->segments(), seen->have_torch = true;
  if (seen && !torch)
    if (auto* pool = find_pool(&r)) seen->pool = pool->segments(), seen->have_pool = true;
  // leave the resource empty, as replay() does
  for (std::size_t id = 0; id < ptr.size(); ++id)
    if (live[id] == 1 && ptr[id]) r.deallocate(ptr[id], size[id], 0);
  return p;
}

// Hands a vector to NumPy without a copy.
template <class T>
nb::object as_array(std::vector<T>&& v) {
  auto* heap = new std::vector<T>(std::move(v));
  nb::capsule owner(heap, [](void* q) noexcept { delete static_cast<std::vector<T>*>(q); });
  return nb::cast(nb::ndarray<nb::numpy, T, nb::ndim<1>>(heap->data(), {heap->size()}, owner));
}

// Segments as dicts; blocks as (addr, size, requested, allocated) tuples.
nb::list torch_segments(const std::vector<emul::torch_segment_info>& segs) {
  nb::list out;
  for (auto& s : segs) {
    nb::dict d;
    d["addr"] = s.addr;
    d["size"] = s.size;
    d["stream"] = s.stream;
    d["small"] = s.small_pool;
    d["expandable"] = s.expandable;
    nb::list bl;
    for (auto& b : s.blocks) bl.append(nb::make_tuple(b.addr, b.size, b.requested, b.allocated));
    d["blocks"] = bl;
    out.append(d);
  }
  return out;
}

nb::list pool_segments(const std::vector<segment_info>& segs) {
  nb::list out;
  for (auto& s : segs) {
    nb::dict d;
    d["addr"] = s.base;
    d["size"] = s.mapped_bytes;
    d["stream"] = s.stream;
    d["small"] = s.small;
    d["expandable"] = true;
    nb::list bl;
    for (auto& b : s.blocks) bl.append(nb::make_tuple(b.addr, b.size, b.requested, b.allocated));
    d["blocks"] = bl;
    out.append(d);
  }
  return out;
}

}  // namespace

void bind_emul(nb::module_& m) {
  m.def("read_torch_csv_columns", [](const std::string& path, std::uint64_t max_bytes, std::uint64_t max_rows) -> nb::object {
    torch_csv_columns c;
    std::string why;
    bool ok;
    {
      nb::gil_scoped_release rel;
      ok = read_torch_csv_fast(path, c, why, max_bytes, max_rows);
    }
    if (!ok) return nb::make_tuple(nb::none(), why);
    nb::dict d;
    d["action"] = as_array(std::move(c.action));
    d["addr"] = as_array(std::move(c.addr));
    d["size"] = as_array(std::move(c.size));
    d["stream"] = as_array(std::move(c.stream));
    d["t_us"] = c.has_time ? as_array(std::move(c.t_us)) : nb::none();
    nb::dict ev;
    for (auto& [k, v] : c.events) ev[nb::str(k.c_str())] = v;
    d["events"] = ev;
    return nb::make_tuple(d, why);
  }, "path"_a, "max_bytes"_a = ~std::uint64_t{0}, "max_rows"_a = ~std::uint64_t{0}, "Columns of the alloc and free_requested rows of a plain PyTorch trace CSV (gzip or not), or "
               "(None, why) when the file needs the exact Python reader.");
  m.def("torch_emulator", [](const std::string& spec, std::size_t capacity) -> std::shared_ptr<device_resource> {
    return emul::make_torch_emulator(spec, capacity);
  }, "spec"_a, "capacity"_a = 0,
        "An offline emulation of PyTorch's CUDA caching allocator (torch-default, torch-expandable, "
        "torch:KEY=VALUE,...); capacity 0 = unlimited.");
  m.def("is_torch_spec", &emul::is_torch_spec, "spec"_a);
  m.def("torch_conf_line", [](const std::string& spec) {
    return emul::make_torch_emulator(spec, std::size_t{1} << 40)->options().conf_line();  // any capacity: a fraction needs one
  }, "spec"_a, "The PYTORCH_CUDA_ALLOC_CONF value equivalent to an emulation spec.");
  m.def("torch_round_size", [](const std::string& spec, std::size_t n) {
    return emul::make_torch_emulator(spec, 0)->round_size(n);
  }, "spec"_a, "bytes"_a);
  m.def("torch_segment_size", &emul::torch_caching_emulator::allocation_size_for, "rounded"_a);
  m.def("torch_counters", [](std::shared_ptr<device_resource> r) -> nb::object {
    auto* e = dynamic_cast<emul::torch_caching_emulator*>(r.get());
    if (!e) return nb::none();
    auto c = e->counters();
    nb::dict d;
    d["num_device_alloc"] = c.num_device_alloc;
    d["num_device_free"] = c.num_device_free;
    d["segment_current"] = c.segment_current;
    d["segment_peak"] = c.segment_peak;
    d["num_alloc_retries"] = c.num_alloc_retries;
    d["num_ooms"] = c.num_ooms;
    d["allocated_bytes"] = c.allocated_bytes;
    d["reserved_bytes"] = e->reserved_bytes();
    d["given_addresses_used"] = c.given_addresses_used;
    return d;
  }, "resource"_a, "memory_stats()-like counters of a PyTorch emulation (None for other resources).");
  m.def("torch_set_segment_addresses", [](std::shared_ptr<device_resource> r, std::vector<std::uint64_t> addrs) {
    auto* e = dynamic_cast<emul::torch_caching_emulator*>(r.get());
    if (!e) throw invalid_argument("segment addresses apply to a PyTorch emulation only");
    e->set_segment_addresses(std::vector<std::uintptr_t>(addrs.begin(), addrs.end()));
  }, "resource"_a, "addresses"_a,
        "Places the emulation's cudaMalloc segments at these addresses, in order (a real run's segment_alloc "
        "addresses), instead of counting up: PyTorch breaks best-fit ties between equal free blocks by address.");
  m.def("torch_segments", [](std::shared_ptr<device_resource> r) -> nb::object {
    if (auto* e = dynamic_cast<emul::torch_caching_emulator*>(r.get())) return torch_segments(e->segments());
    if (auto* p = find_pool(r.get())) return pool_segments(p->segments());
    return nb::none();
  }, "resource"_a, "Segments of an emulation or a vramkit pool: dicts with blocks (addr, size, requested, allocated).");
  m.def("profile_trace", [](ops_array a, std::shared_ptr<device_resource> r, std::size_t points, std::int64_t stop,
                            nb::object progress, std::vector<std::int64_t> marks) {
    profile p;
    at_stop seen;
    {
      nb::gil_scoped_release rel;
      p = run(a, *r, points, stop, progress, stop >= 0 ? &seen : nullptr, marks);
    }
    nb::dict d;
    d["ops"] = p.ops;
    d["peak_reserved_bytes"] = p.peak_reserved;
    d["peak_op"] = p.peak_op;
    d["peak_live_bytes"] = p.peak_live;
    d["allocated_at_peak"] = p.allocated_at_peak;
    d["requested_at_peak"] = p.requested_at_peak;
    d["ooms"] = p.ooms;
    d["first_oom_op"] = p.first_oom_op;
    d["first_oom_size"] = p.first_oom_size;
    d["first_oom_message"] = p.first_oom_message;
    d["final_reserved_bytes"] = p.final_reserved;
    d["curve_op"] = as_array(std::move(p.t_op));
    d["curve_reserved"] = as_array(std::move(p.t_reserved));
    d["curve_live"] = as_array(std::move(p.t_live));
    if (seen.have_torch) d["segments"] = torch_segments(seen.torch);
    if (seen.have_pool) d["segments"] = pool_segments(seen.pool);
    return d;
  }, "ops"_a, "resource"_a, "points"_a = 0, "stop"_a = -1, "progress"_a.none() = nb::none(),
        "marks"_a = std::vector<std::int64_t>{},
        "One pass of int64 rows (action, id, size[, stream]) through a fresh resource: peak reserved and the op "
        "where it is reached, OOMs and the first one, and a curve of `points` buckets (the highest point of each, "
        "so the peak is exact). With stop >= 0 it ends after that op and adds 'segments': the segments and "
        "blocks at that moment (PyTorch emulations and vramkit pools). marks: op indices, ascending, before "
        "which a step begins (a vramkit pool's mark_step, for plan_steps).");
}
