// vramkit._vramkit: the backend, devices and their properties, the current resource of a
// device, streams and host<->device copies.
#include <cstring>

#include <nanobind/nanobind.h>
#include <nanobind/stl/vector.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>

#include "bindings.hpp"
#include "vramkit/platform/cuda.hpp"
#include "vramkit/platform/device_properties.hpp"
#include "vramkit/runtime.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using namespace vramkit;
using namespace vramkit::py;

void bind_device(nb::module_& m) {
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
  m.def("peer_devices", [](nb::handle d) {
    int dev = to_device(d);
    return current_backend() == backend::cuda ? cuda::peer_devices(dev) : std::vector<int>{};
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
    copy_host_to_device(reinterpret_cast<void*>(dst), src.c_str(), src.size());
  });
  m.def("copy_to_host", [](std::uintptr_t src, std::size_t n) {
    std::string out(n, '\0');
    if (current_backend() == backend::cuda)
      cuda::copy_to_host(out.data(), reinterpret_cast<void*>(src), n);
    else
      std::memcpy(out.data(), reinterpret_cast<void*>(src), n);
    return nb::bytes(out.data(), out.size());
  });
}
