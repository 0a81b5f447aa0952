// vramkit._vramkit.monitor: the NVML monitor for the Python tools
// (vramkit smi / top / exporter / Sampler). Driver calls run without the GIL so
// a sampling thread never stalls the user's Python code.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>

#include "vramkit/monitor/nvml.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using namespace vramkit::monitor;

namespace {

template <class T>
nb::object opt(const std::optional<T>& v) {
  return v ? nb::cast(*v) : nb::none();
}

nb::dict device_dict(const device_sample& s) {
  nb::dict d;
  d["index"] = s.index;
  d["name"] = s.name;
  d["uuid"] = s.uuid;
  d["pci_bus_id"] = s.pci_bus_id;
  d["total_bytes"] = s.total_bytes;
  d["used_bytes"] = s.used_bytes;
  d["free_bytes"] = s.free_bytes;
  d["reserved_bytes"] = opt(s.reserved_bytes);
  d["utilization_gpu"] = opt(s.utilization_gpu);
  d["utilization_memory"] = opt(s.utilization_memory);
  d["temperature_c"] = opt(s.temperature_c);
  d["power_w"] = opt(s.power_w);
  return d;
}

nb::dict process_dict(const process_sample& p) {
  nb::dict d;
  d["pid"] = p.pid;
  d["used_bytes"] = opt(p.used_bytes);
  d["name"] = p.name;
  return d;
}

}  // namespace

void bind_monitor(nb::module_& m) {
  nb::module_ mm = m.def_submodule("monitor", "GPU devices and processes as the driver (NVML) reports them.");
  nb::exception<nvml_unavailable>(mm, "NvmlUnavailableError", PyExc_RuntimeError);

  nb::class_<gpu_monitor>(mm, "Monitor", "NVML; safe to use from several threads.")
      .def("backend_name", &gpu_monitor::backend_name, "\"nvml\" or \"fake\".")
      .def("driver_version", &gpu_monitor::driver_version, nb::call_guard<nb::gil_scoped_release>())
      .def("device_count", &gpu_monitor::device_count, nb::call_guard<nb::gil_scoped_release>())
      .def(
          "devices",
          [](gpu_monitor& g) {
            std::vector<device_sample> v;
            {
              nb::gil_scoped_release release;
              v = g.devices();
            }
            nb::list out;
            for (auto& s : v) out.append(device_dict(s));
            return out;
          },
          "One dict per device: index, name, uuid, pci_bus_id, total/used/free/reserved_bytes,\n"
          "utilization_gpu, utilization_memory (%), temperature_c, power_w (None where not reported).")
      .def(
          "device",
          [](gpu_monitor& g, unsigned index) {
            device_sample s;
            {
              nb::gil_scoped_release release;
              s = g.device(index);
            }
            return device_dict(s);
          },
          "index"_a)
      .def(
          "processes",
          [](gpu_monitor& g, unsigned index) {
            std::vector<process_sample> v;
            {
              nb::gil_scoped_release release;
              v = g.processes(index);
            }
            nb::list out;
            for (auto& p : v) out.append(process_dict(p));
            return out;
          },
          "index"_a, "Compute processes on the device, largest first: dicts with pid, used_bytes, name\n"
                     "(name is \"\" unless the backend knows it).")
      .def("__repr__", [](gpu_monitor& g) { return "<vramkit.monitor.Monitor " + g.backend_name() + ">"; });

  mm.def(
      "open",
      [] {
        nb::gil_scoped_release release;
        return open_monitor();
      },
      "NVML (the fake driver of the tests is vramkit.monitor.fake, in Python).\n"
      "Raises NvmlUnavailableError without a driver.");
}
