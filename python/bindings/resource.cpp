// vramkit._vramkit: Resource (every allocator and adaptor), building allocators from specs,
// and the size and option parsers.
#include <nanobind/nanobind.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.hpp"
#include "vramkit/mr/pool_resource.hpp"
#include "vramkit/platform/host_page_device.hpp"
#include "vramkit/platform/stream_ops.hpp"
#include "vramkit/runtime.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using namespace vramkit;
using namespace vramkit::py;

namespace vramkit::py {

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

}  // namespace vramkit::py

void bind_resource(nb::module_& m) {
  nb::class_<device_resource>(m, "Resource", "A memory resource: an upstream, the pool, or an adaptor over one.")
      .def_prop_ro("name", &device_resource::name)
      .def_prop_ro("device", &device_resource::device)
      .def("allocate", [](device_resource& r, nb::handle n, nb::handle s) {
            const std::size_t bytes = static_cast<std::size_t>(to_u64(n, "nbytes"));
            const stream_t st = to_stream(s);
            return reinterpret_cast<std::uintptr_t>(r.allocate(bytes, st));
          }, "nbytes"_a, "stream"_a.none() = nb::none(),
          "Allocates nbytes; returns the device pointer as an int. Raises ValueError for a size that is "
          "negative or not an integer.")
      .def("deallocate", [](device_resource& r, nb::handle p, nb::handle n, nb::handle s) {
            const auto ptr = static_cast<std::uintptr_t>(to_u64(p, "ptr"));
            const std::size_t bytes = static_cast<std::size_t>(to_u64(n, "nbytes"));
            r.deallocate_checked(reinterpret_cast<void*>(ptr), bytes, to_stream(s));
          }, "ptr"_a, "nbytes"_a = 0, "stream"_a.none() = nb::none(),
          "Frees ptr. Raises ValueError on a double free, a foreign pointer or a wrong size (nothing changes).")
      .def("record_stream", [](device_resource& r, nb::handle p, nb::handle s) {
            r.record_stream(reinterpret_cast<void*>(static_cast<std::uintptr_t>(to_u64(p, "ptr"))), to_stream(s));
          }, "ptr"_a, "stream"_a)
      .def("release_cached", &device_resource::release_cached, nb::call_guard<nb::gil_scoped_release>())
      .def("state", [](const device_resource& r) { return state_dict(r.state()); })
      .def("reset_peaks", &device_resource::reset_peaks)
      .def("allocation_size", [](const device_resource& r, std::uintptr_t p) {
            return r.allocation_size(reinterpret_cast<void*>(p));
          })
      .def("statistics", [](device_resource& r) -> nb::object {
            auto* s = find_statistics(&r);  // through a tracking adaptor put over it
            if (!s) return nb::none();
            return stats_dict(s->stats());
          })
      .def("segments", [](device_resource& r) {
            pool_resource* p = find_pool(&r);
            if (!p) throw invalid_argument("segments: resource '" + r.name() + "' holds no pool");
            return segments_list(p->segments());
          })
      .def("pool_page_usage", [](device_resource& r) -> nb::object {
            pool_resource* p = find_pool(&r);
            if (!p) return nb::none();
            pool_resource::page_usage u;
            {
              nb::gil_scoped_release g;
              u = p->usage();
            }
            nb::dict d;
            d["mapped_small"] = u.mapped[1];
            d["mapped_large"] = u.mapped[0];
            d["under_live_blocks_small"] = u.live_overlap[1];
            d["under_live_blocks_large"] = u.live_overlap[0];
            d["free_interior_mapped_small"] = u.free_interior_mapped[1];
            d["free_interior_mapped_large"] = u.free_interior_mapped[0];
            d["spare"] = u.spare;
            d["made_ahead"] = u.ahead;
            d["in_chunks"] = u.in_chunks;
            d["chunk_free_held"] = u.chunk_free_held;
            d["page_size"] = p->page_size();
            return d;
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
            d["pages_made_ahead"] = c.pages_made_ahead;
            d["pages_ahead_used"] = c.pages_ahead_used;
            d["chunks_created"] = c.chunks_created;
            d["chunks_released"] = c.chunks_released;
            d["chunks_split"] = c.chunks_split;
            d["growth_chunks"] = c.growth_chunks;
            d["chunk_pages_created"] = c.chunk_pages_created;
            d["chunk_pages_released"] = c.chunk_pages_released;
            d["pages_taken_early"] = c.pages_taken_early;
            d["early_waits"] = c.early_waits;
            d["pages_past_slack"] = c.pages_past_slack;
            d["plans_made"] = c.plans_made;
            d["plans_dropped"] = c.plans_dropped;
            d["plans_skipped"] = c.plans_skipped;
            d["plan_placed"] = c.plan_placed;
            d["plan_missed"] = c.plan_missed;
            d["plan_bytes"] = c.plan_bytes;
            d["steps_found"] = c.steps_found;
            d["step_period"] = c.step_period;
            d["page_create_ns"] = c.page_create_ns;
            d["page_map_ns"] = c.page_map_ns;
            d["page_unmap_ns"] = c.page_unmap_ns;
            d["page_destroy_ns"] = c.page_destroy_ns;
            d["gpu_wait_ns"] = c.gpu_wait_ns;
            d["page_size"] = p->page_size();
            d["paged"] = p->paged();
            d["options"] = p->options().to_string();
            return d;
          })
      .def("set_reserve_limit", [](device_resource& r, std::size_t n) {
            pool_resource* p = find_pool(&r);
            if (!p) throw invalid_argument("set_reserve_limit: resource '" + r.name() + "' holds no pool");
            p->set_reserve_limit(n);
          })
      .def("mark_step", [](device_resource& r) {
            if (pool_resource* p = find_pool(&r)) p->mark_step();
          },
          nb::call_guard<nb::gil_scoped_release>(),  // the first mark may wait for the GPU
          "A step of the program begins: with the pool option plan_steps, the pool records a step and "
          "places later steps' requests where the recorded ones were (nothing otherwise).")
      .def("check_invariants", [](device_resource& r) {
            pool_resource* p = find_pool(&r);
            if (p) p->check_invariants();
          })
      .def("__repr__", [](const device_resource& r) { return "<vramkit.Resource " + r.name() + " on device " + std::to_string(r.device()) + ">"; });

  m.def("make_resource", [](const std::string& spec, nb::handle d) { return make_resource(spec, to_device(d)); },
        "spec"_a, "device"_a = nb::none(),
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
}
