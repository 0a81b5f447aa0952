// The Python module vramkit._vramkit: a thin layer over the C++ core. This file holds the
// argument converters the binding files share and the module itself; each topic binds its
// own functions (resource, device, trace, buffer, monitor, leaks .cpp).
#include <nanobind/nanobind.h>

#include <cstring>
#include <nanobind/stl/string.h>

#include "bindings.hpp"
#include "vramkit/platform/cuda.hpp"
#include "vramkit/runtime.hpp"

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

void copy_host_to_device(void* dst, const void* src, std::size_t bytes) {
  if (current_backend() == backend::cuda)
    cuda::copy_to_device(dst, src, bytes);
  else
    std::memcpy(dst, src, bytes);
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

NB_MODULE(_vramkit, m) {
  m.doc() = "vramkit core (C++)";
  // Resources and buffers held by module-level state (each device's current
  // resource, the frameworks' allocators) are alive when the interpreter
  // exits; the process gives their memory back. nanobind would list each one.
  nb::set_leak_warnings(false);
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

  bind_resource(m);
  bind_device(m);
  bind_trace(m);
  bind_buffer(m);
  bind_monitor(m);
  bind_leaks(m);
  bind_emul(m);
}
