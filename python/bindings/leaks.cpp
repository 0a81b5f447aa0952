// Leak tools: the tracking adaptor and the hook that names the Python line
// that made each allocation.
//
// The hook runs on every tracked allocation, so it stays cheap: it walks the
// frames of the allocating thread past vramkit's and the frameworks' own
// files, and looks up (code object, instruction offset) in a hash map. The
// strings ("file:line (function)") are built once per new site.
//
// Allocations often arrive without the GIL: PyTorch's op bindings release it
// before dispatching, so a tensor made on a Python line reaches vramkit (through
// the allocator shim) on that thread with the GIL released. Such a thread still
// has its Python thread state and frames; the hook takes the GIL for the walk,
// as PyTorch's own memory-history recorder does. Threads that never ran Python
// (no thread state) or run none now (no frame: PyTorch's autograd workers) get
// no site and never wait for the GIL.
#include <Python.h>
#include <frameobject.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "bindings.hpp"
#include "vramkit/mr/guard_adaptor.hpp"
#include "vramkit/mr/tracking_adaptor.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using namespace vramkit;

namespace {

struct site_frame {
  std::string filename;
  int line = 0;
  std::string name;
  std::string text;  // "file:line (function)"
};

struct code_key {
  const void* code;
  int offset;
  bool operator==(const code_key& o) const noexcept { return code == o.code && offset == o.offset; }
};
struct code_key_hash {
  std::size_t operator()(const code_key& k) const noexcept {
    return std::hash<const void*>()(k.code) ^ (static_cast<std::size_t>(k.offset) * 0x9E3779B97F4A7C15ull);
  }
};

// Process-wide site registry. Reads and writes of the maps happen with the GIL
// held (the hook takes it when its thread has none); the mutex guards the
// strings, which C++ callers may read without it.
struct site_registry {
  std::mutex mu;
  std::vector<site_frame> sites{site_frame{}};  // id 0: no site
  std::unordered_map<std::string, std::uint32_t> by_text;
  // (code, offset) -> site; the code objects are kept alive (one reference
  // each) so that an address is never reused for another code object.
  std::unordered_map<code_key, std::uint32_t, code_key_hash> by_code;
  std::unordered_map<const void*, bool> skip;  // code object -> framework file?
  std::vector<std::string> skip_prefixes;
  std::uint64_t calls = 0;
};

site_registry& registry() {
  static auto* r = new site_registry();  // never destroyed: hooks may run during teardown
  return *r;
}

bool is_framework_code(site_registry& r, PyCodeObject* code) {
  auto it = r.skip.find(code);
  if (it != r.skip.end()) return it->second;
  bool skip = false;
  const char* fn = PyUnicode_AsUTF8(code->co_filename);
  if (!fn) {
    PyErr_Clear();
  } else {
    std::string f(fn);
    for (auto& p : r.skip_prefixes)
      if (f.compare(0, p.size(), p) == 0) {
        skip = true;
        break;
      }
  }
  Py_INCREF(code);
  r.skip.emplace(code, skip);
  return skip;
}

std::uint32_t intern_site(site_registry& r, PyFrameObject* frame, PyCodeObject* code, const code_key& key) {
  site_frame s;
  const char* fn = PyUnicode_AsUTF8(code->co_filename);
  if (!fn) PyErr_Clear();
  const char* nm = PyUnicode_AsUTF8(code->co_name);
  if (!nm) PyErr_Clear();
  s.filename = fn ? fn : "?";
  s.name = nm ? nm : "?";
  s.line = PyFrame_GetLineNumber(frame);
  s.text = s.filename + ":" + std::to_string(s.line) + " (" + s.name + ")";
  std::uint32_t id;
  {
    std::lock_guard<std::mutex> lk(r.mu);
    auto it = r.by_text.find(s.text);
    if (it != r.by_text.end()) {
      id = it->second;
    } else {
      id = static_cast<std::uint32_t>(r.sites.size());
      r.by_text.emplace(s.text, id);
      r.sites.push_back(std::move(s));
    }
  }
  Py_INCREF(code);
  r.by_code.emplace(key, id);
  return id;
}

int frame_offset(PyFrameObject* f) {
#if PY_VERSION_HEX >= 0x030B0000
  return PyFrame_GetLasti(f);
#else
  return PyFrame_GetLineNumber(f);
#endif
}

// The frame walk; the caller holds the GIL.
std::uint32_t walk_frames() {
  site_registry& r = registry();
  ++r.calls;
  PyFrameObject* f = PyEval_GetFrame();  // borrowed
  if (!f) return 0;
  Py_INCREF(f);
  PyFrameObject* leaf = nullptr;  // fallback when every frame is a framework's
  std::uint32_t id = 0;
  for (int depth = 0; f && depth < 64; ++depth) {
    PyCodeObject* code = PyFrame_GetCode(f);  // new reference
    bool skip = is_framework_code(r, code);
    if (!skip || !leaf) {
      code_key key{code, frame_offset(f)};
      auto it = r.by_code.find(key);
      std::uint32_t s = it != r.by_code.end() ? it->second : intern_site(r, f, code, key);
      if (!skip) {
        id = s;
        Py_DECREF(code);
        break;
      }
      id = s;  // the leaf, kept unless a user frame shows up
      leaf = f;
    }
    Py_DECREF(code);
    PyFrameObject* back = PyFrame_GetBack(f);  // new reference
    Py_DECREF(f);
    f = back;
  }
  Py_XDECREF(f);
  return id;
}

bool interpreter_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

// Whether the calling thread, which does not hold the GIL, is inside Python
// code: its own thread state's current frame, read without the GIL. Only this
// thread changes its frame stack, and it runs no Python while it is here, so
// the pointer cannot change under the read; it is compared with null, never
// followed. Versions whose layout is not known here answer yes (the GIL is
// taken and PyEval_GetFrame decides).
bool has_python_frame(PyThreadState* ts) {
#if defined(Py_GIL_DISABLED) || PY_VERSION_HEX >= 0x030F0000
  (void)ts;
  return true;
#elif PY_VERSION_HEX >= 0x030D0000
  return ts->current_frame != nullptr;
#elif PY_VERSION_HEX >= 0x030B0000
  return ts->cframe != nullptr && ts->cframe->current_frame != nullptr;
#else
  return ts->frame != nullptr;
#endif
}

std::uint32_t python_site_hook() {
  if (!Py_IsInitialized()) return 0;
  if (PyGILState_Check()) return walk_frames();  // the fast path: Python called vramkit
  // No GIL. A thread with no Python thread state never ran Python: no site,
  // and no waiting for the GIL. Nor while the interpreter shuts down, when
  // taking the GIL can block the thread for good.
  PyThreadState* ts = PyGILState_GetThisThreadState();
  if (!ts || !has_python_frame(ts) || interpreter_finalizing()) return 0;
  PyGILState_STATE g = PyGILState_Ensure();
  std::uint32_t id = walk_frames();
  PyGILState_Release(g);
  return id;
}

// Frames of vramkit's own files and of the frameworks' are never named as a
// site. Where those packages live is found on the Python side; it must be set
// before the first allocation is named, also for adaptors made straight from
// this module.
void ensure_skip_prefixes() { nb::module_::import_("vramkit.leaks._tracking").attr("_ensure_prefixes")(); }

tracking_adaptor& as_tracking(device_resource& r, const char* fn) {
  auto* t = dynamic_cast<tracking_adaptor*>(&r);
  if (!t) throw invalid_argument(std::string(fn) + ": resource '" + r.name() + "' is not a tracking adaptor");
  return *t;
}

}  // namespace

void bind_leaks(nb::module_& m) {
  m.def("tracking_adaptor", [](std::shared_ptr<device_resource> r, bool python_stacks, std::size_t max_events)
            -> std::shared_ptr<device_resource> {
    if (python_stacks) ensure_skip_prefixes();
    return std::make_shared<tracking_adaptor>(std::move(r), python_stacks ? &python_site_hook : nullptr, max_events);
  }, "resource"_a, "python_stacks"_a = true, "max_events"_a = tracking_adaptor::default_max_events,
        "Wraps resource in an adaptor that records every live allocation (size, stream, time, Python call site) "
        "and the last max_events alloc/free events.");
  m.def("is_tracking", [](device_resource& r) { return dynamic_cast<tracking_adaptor*>(&r) != nullptr; });
  m.def("tracking_upstream", [](device_resource& r) { return as_tracking(r, "tracking_upstream").upstream(); });
  m.def("tracking_mark", [](device_resource& r) { return as_tracking(r, "tracking_mark").mark(); });
  m.def("tracking_reset", [](device_resource& r) { as_tracking(r, "tracking_reset").reset(); });
  m.def("set_python_stacks", [](device_resource& r, bool on) {
    if (on) ensure_skip_prefixes();
    as_tracking(r, "set_python_stacks").set_site_hook(on ? &python_site_hook : nullptr);
  });
  m.def("tracking_counts", [](device_resource& r) {
    tracking_counts c = as_tracking(r, "tracking_counts").counts();
    nb::dict d;
    d["live_count"] = c.live_count;
    d["live_bytes"] = c.live_bytes;
    d["allocs"] = c.allocs;
    d["frees"] = c.frees;
    d["untracked_frees"] = c.untracked_frees;
    d["events_dropped"] = c.events_dropped;
    return d;
  });
  m.def("tracked_live", [](device_resource& r, std::uint64_t since) {
    std::vector<tracked_allocation> v;
    {
      tracking_adaptor& t = as_tracking(r, "tracked_live");
      nb::gil_scoped_release g;
      v = t.live_since(since);
    }
    nb::list out;
    for (auto& a : v) {
      nb::dict d;
      d["ptr"] = a.ptr;
      d["size"] = a.size;
      d["stream"] = a.stream;
      d["time_ns"] = a.time_ns;
      d["site"] = a.site;
      d["seq"] = a.seq;
      out.append(d);
    }
    return out;
  }, "resource"_a, "since"_a = 0,
        "Live allocations of a tracking adaptor (allocated after mark `since`), oldest first.");
  m.def("tracked_events", [](device_resource& r) {
    std::vector<tracking_event> v;
    {
      tracking_adaptor& t = as_tracking(r, "tracked_events");
      nb::gil_scoped_release g;
      v = t.events();
    }
    nb::list out;
    for (auto& e : v)
      out.append(nb::make_tuple(e.action == tracking_event::alloc ? "alloc" : "free", e.ptr, e.size, e.stream,
                                e.time_ns, e.site));
    return out;
  }, "Event history (action, ptr, size, stream, time_ns, site), oldest first.");
  m.def("site_table", [] {
    site_registry& r = registry();
    std::lock_guard<std::mutex> lk(r.mu);
    std::vector<std::string> out;
    out.reserve(r.sites.size());
    for (auto& s : r.sites) out.push_back(s.text);
    return out;
  }, "Call sites by id: 'file:line (function)'; id 0 is ''.");
  m.def("site_frames", [] {
    site_registry& r = registry();
    std::lock_guard<std::mutex> lk(r.mu);
    std::vector<std::tuple<std::string, int, std::string>> out;
    out.reserve(r.sites.size());
    for (auto& s : r.sites) out.emplace_back(s.filename, s.line, s.name);
    return out;
  }, "(filename, line, function) of each site id.");
  m.def("set_site_skip_prefixes", [](std::vector<std::string> prefixes) {
    site_registry& r = registry();
    r.skip_prefixes = std::move(prefixes);
    for (auto& kv : r.skip) Py_DECREF(static_cast<PyObject*>(const_cast<void*>(kv.first)));
    r.skip.clear();
  }, "File path prefixes whose frames are never named as a call site (vramkit's and the frameworks' own).");
  m.def("guard_adaptor", [](std::shared_ptr<device_resource> r, std::size_t redzone, std::size_t quarantine,
                            bool python_stacks) -> std::shared_ptr<device_resource> {
    if (python_stacks) ensure_skip_prefixes();
    return std::make_shared<guard_adaptor>(std::move(r), redzone, quarantine,
                                           python_stacks ? &python_site_hook : nullptr);
  }, "resource"_a, "redzone"_a = 256, "quarantine"_a = 64, "python_stacks"_a = true,
        "Debug adaptor: red zones of `redzone` bytes around each allocation, freed blocks poisoned and kept "
        "in a quarantine of `quarantine` blocks; check with check_guards().");
  m.def("is_guard", [](device_resource& r) { return dynamic_cast<guard_adaptor*>(&r) != nullptr; });
  m.def("check_guards", [](device_resource& r) {
    auto* g = dynamic_cast<guard_adaptor*>(&r);
    if (!g) throw invalid_argument("check_guards: resource '" + r.name() + "' is not a guard adaptor");
    std::vector<guard_violation> v;
    {
      nb::gil_scoped_release rel;
      v = g->check_guards();
    }
    nb::list out;
    for (auto& x : v) {
      nb::dict d;
      d["ptr"] = x.ptr;
      d["size"] = x.size;
      d["where"] = x.where == guard_violation::before ? "before"
                   : x.where == guard_violation::after ? "after" : "use_after_free";
      d["offset"] = static_cast<std::int64_t>(x.offset);
      d["site"] = x.site;
      d["message"] = x.describe();
      out.append(d);
    }
    return out;
  }, "Violations found now (live red zones, quarantined poison) and at frees since the last call.");
  m.def("site_hook_calls", [] { return registry().calls; });
  m.def("_alloc_without_gil", [](std::shared_ptr<device_resource> r, std::size_t nbytes, bool new_thread) {
    if (!new_thread) {
      nb::gil_scoped_release rel;  // as PyTorch's op bindings do before they allocate
      return reinterpret_cast<std::uintptr_t>(r->allocate(nbytes, 0));
    }
    // A thread that never ran Python, while this one keeps the GIL: a hook that
    // waited for the GIL there would never return, so give up after a while.
    auto task = std::make_shared<std::packaged_task<std::uintptr_t()>>(
        [r, nbytes] { return reinterpret_cast<std::uintptr_t>(r->allocate(nbytes, 0)); });
    std::future<std::uintptr_t> done = task->get_future();
    std::thread th([task] { (*task)(); });
    if (done.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
      th.detach();
      throw std::runtime_error("_alloc_without_gil: the allocation on a thread without a Python thread state "
                               "did not return within 10 s (is the site hook waiting for the GIL?)");
    }
    th.join();
    return done.get();
  }, "resource"_a, "nbytes"_a, "new_thread"_a = false,
        "Test helper: resource.allocate(nbytes) with the GIL released on this thread (new_thread=False), or on "
        "a new C++ thread that never ran Python while this one holds the GIL; returns the pointer (free it "
        "with resource.deallocate).");
}
