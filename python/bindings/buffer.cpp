// DeviceBuffer: an owning handle to device memory, or a zero-copy view of one.
// Exports __cuda_array_interface__ (v3) and DLPack so frameworks see the same
// memory and keep it alive while they hold it.
#include <nanobind/nanobind.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <atomic>

#include "bindings.hpp"
#include "vramkit/runtime.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using namespace vramkit;
using namespace vramkit::py;

namespace vramkit::py {

nb::dict stats_dict(const statistics& s) {
  nb::dict d;
  auto put = [&](const char* name, const stat& st) {
    std::string base = std::string(name) + ".all.";
    d[(base + "current").c_str()] = st.current;
    d[(base + "peak").c_str()] = st.peak;
    d[(base + "allocated").c_str()] = st.allocated;
    d[(base + "freed").c_str()] = st.freed;
  };
  put("allocated_bytes", s.allocated_bytes);
  put("requested_bytes", s.allocated_bytes);
  put("allocation", s.allocation_count);
  put("reserved_bytes", s.reserved_bytes);
  put("active_bytes", s.active_bytes);
  put("inactive_split_bytes", s.cached_bytes);
  d["num_alloc_calls"] = s.num_alloc_calls;
  d["num_free_calls"] = s.num_free_calls;
  d["num_ooms"] = s.num_ooms;
  d["num_bad_frees"] = s.num_bad_frees;
  d["num_device_alloc"] = s.num_upstream_allocs;
  d["num_device_free"] = s.num_upstream_frees;
  d["num_alloc_retries"] = s.num_alloc_retries;
  d["largest_free_bytes"] = s.largest_free_bytes;
  d["capacity_bytes"] = s.capacity_bytes;
  d["fragmentation"] = s.fragmentation;
  d["peak_fragmentation"] = s.peak_fragmentation;
  return d;
}

}  // namespace vramkit::py

namespace {

// DLPack v0.8 ABI (the struct layout every framework reads).
struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code, bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};

class device_buffer {
 public:
  device_buffer(std::shared_ptr<device_resource> r, std::uintptr_t ptr, std::size_t n, int device, stream_t s)
      : res_(std::move(r)), ptr_(ptr), nbytes_(n), device_(device), stream_(s) {}
  ~device_buffer() {
    if (!owner()) {
      release_parent();
      return;
    }
    if (ptr_ && !freed_) res_->deallocate(reinterpret_cast<void*>(ptr_), nbytes_, stream_);
  }
  void release_parent() noexcept;
  bool owner() const { return parent_.is_none() || !parent_.is_valid(); }

  std::uintptr_t ptr() const {
    check_alive();
    return ptr_;
  }
  void check_alive() const {
    if (freed_) throw invalid_argument("this DeviceBuffer was freed; its memory may now belong to another allocation");
    if (!owner()) nb::cast<device_buffer&>(parent_).check_alive();
  }
  void free() {
    if (freed_) throw invalid_argument("DeviceBuffer.free(): the buffer was already freed");
    if (!owner()) throw invalid_argument("DeviceBuffer.free(): this is a view; free the buffer it was sliced from");
    if (views_.load() > 0)
      throw invalid_argument("DeviceBuffer.free(): " + std::to_string(views_.load()) +
                             " view(s) or exported array(s) still use this memory");
    if (ptr_) res_->deallocate_checked(reinterpret_cast<void*>(ptr_), nbytes_, stream_);
    freed_ = true;
  }
  std::shared_ptr<device_resource> res_;
  std::uintptr_t ptr_;
  std::size_t nbytes_;
  int device_;
  stream_t stream_;
  bool freed_ = false;
  nb::object parent_ = nb::none();  // views keep their parent alive
  std::atomic<int> views_{0};
};

device_buffer& root_of(device_buffer& b) {
  return b.owner() ? b : root_of(nb::cast<device_buffer&>(b.parent_));
}

void device_buffer::release_parent() noexcept {
  try {
    root_of(nb::cast<device_buffer&>(parent_)).views_.fetch_sub(1);
  } catch (...) {
  }
}

struct dl_ctx {
  nb::object owner;  // the buffer
  int64_t shape[1];
};

void dl_delete(DLManagedTensor* t) {
  auto* c = static_cast<dl_ctx*>(t->manager_ctx);
  {
    nb::gil_scoped_acquire g;
    auto& b = nb::cast<device_buffer&>(c->owner);
    root_of(b).views_.fetch_sub(1);
    delete c;
  }
  delete t;
}

}  // namespace

void bind_buffer(nb::module_& m) {
  nb::class_<device_buffer>(m, "DeviceBuffer",
                            "Device memory from a vramkit resource. Freed by free(), by leaving a `with` block, "
                            "or when the last reference goes. buf[a:b] is a zero-copy view that keeps buf alive.")
      .def_prop_ro("ptr", &device_buffer::ptr)
      .def_prop_ro("nbytes", [](const device_buffer& b) { return b.nbytes_; })
      .def_prop_ro("device", [](const device_buffer& b) { return b.device_; })
      .def_prop_ro("stream", [](const device_buffer& b) { return b.stream_; })
      .def_prop_ro("resource", [](const device_buffer& b) { return b.res_; })
      .def_prop_ro("freed", [](const device_buffer& b) { return b.freed_; })
      .def_prop_ro("is_view", [](const device_buffer& b) { return !b.owner(); })
      .def("free", &device_buffer::free)
      .def("__len__", [](const device_buffer& b) { return b.nbytes_; })
      .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
      .def("__exit__", [](device_buffer& b, nb::handle, nb::handle, nb::handle) {
        if (!b.freed_ && b.owner()) b.free();
      }, nb::arg().none(), nb::arg().none(), nb::arg().none())
      .def("record_stream", [](device_buffer& b, nb::handle s) {
        root_of(b).res_->record_stream(reinterpret_cast<void*>(root_of(b).ptr()), to_stream(s));
      }, "stream"_a, "Marks the memory as used on another stream: it is not reused until that stream's work is done.")
      .def("__getitem__", [](nb::handle self, nb::slice sl) {
        auto& b = nb::cast<device_buffer&>(self);
        b.check_alive();
        auto [start, stop, step, len] = sl.compute(b.nbytes_);
        if (step != 1) throw invalid_argument("DeviceBuffer slices must be contiguous (step 1)");
        auto* v = new device_buffer(b.res_, b.ptr_ + start, len, b.device_, b.stream_);
        v->parent_ = nb::borrow(self);
        root_of(b).views_.fetch_add(1);
        return nb::cast(v, nb::rv_policy::take_ownership);
      })
      .def("copy_from_host", [](device_buffer& b, nb::handle data, nb::handle offset_h) {
        b.check_alive();
        std::uint64_t offset = to_u64(offset_h, "copy_from_host: offset");
        // Any C-contiguous object with the buffer protocol (bytes, bytearray, memoryview, a NumPy array).
        Py_buffer view;
        if (PyObject_GetBuffer(data.ptr(), &view, PyBUF_C_CONTIGUOUS) != 0) {
          PyErr_Clear();
          throw invalid_argument("copy_from_host: data must be bytes or another C-contiguous buffer (bytearray, "
                                 "memoryview, a NumPy array), not " +
                                 nb::cast<std::string>(nb::type_name(data.type())));
        }
        struct release_view {
          Py_buffer* v;
          ~release_view() { PyBuffer_Release(v); }
        } guard{&view};
        const std::size_t n = static_cast<std::size_t>(view.len);
        if (offset > b.nbytes_ || n > b.nbytes_ - offset)
          throw invalid_argument("copy_from_host: " + std::to_string(n) + " bytes at offset " +
                                 std::to_string(offset) + " do not fit in " + std::to_string(b.nbytes_));
        // (with the GIL held: another thread's free() of this buffer waits for the copy)
        copy_host_to_device(reinterpret_cast<void*>(b.ptr_ + offset), view.buf, n);
      }, "data"_a.none(), "offset"_a = 0)
      .def("copy_to_host", [](device_buffer& b) {
        b.check_alive();
        return nb::module_::import_("vramkit._vramkit").attr("copy_to_host")(b.ptr_, b.nbytes_);
      })
      .def_prop_ro("__cuda_array_interface__", [](device_buffer& b) {
        b.check_alive();
        if (current_backend() != backend::cuda)
          throw nb::attribute_error("__cuda_array_interface__: this buffer is on the simulated host device");
        nb::dict d;
        d["shape"] = nb::make_tuple(b.nbytes_);
        d["typestr"] = "|u1";
        d["data"] = nb::make_tuple(b.ptr_, false);
        d["version"] = 3;
        d["strides"] = nb::none();
        // The buffer's work is ordered on its stream; 0 would mean "no sync needed".
        if (b.stream_ != 0) d["stream"] = b.stream_;
        return d;
      })
      .def("__dlpack_device__", [](const device_buffer& b) {
        return nb::make_tuple(current_backend() == backend::cuda ? 2 : 1, current_backend() == backend::cuda ? b.device_ : 0);
      })
      .def("__dlpack__", [](nb::handle self, nb::handle stream, nb::kwargs) {
        auto& b = nb::cast<device_buffer&>(self);
        b.check_alive();
        (void)stream;  // producer and consumer share vramkit's stream order; see docs
        auto* c = new dl_ctx{nb::borrow(self), {static_cast<int64_t>(b.nbytes_)}};
        auto* t = new DLManagedTensor{};
        t->dl_tensor.data = reinterpret_cast<void*>(b.ptr_);
        t->dl_tensor.device = {current_backend() == backend::cuda ? 2 : 1, current_backend() == backend::cuda ? b.device_ : 0};
        t->dl_tensor.ndim = 1;
        t->dl_tensor.dtype = {1, 8, 1};  // uint8
        t->dl_tensor.shape = c->shape;
        t->dl_tensor.strides = nullptr;
        t->dl_tensor.byte_offset = 0;
        t->manager_ctx = c;
        t->deleter = dl_delete;
        root_of(b).views_.fetch_add(1);
        PyObject* cap = PyCapsule_New(t, "dltensor", [](PyObject* o) {
          // Called when the capsule dies; a consumer renames it "used_dltensor" once it owns t.
          if (PyCapsule_IsValid(o, "dltensor")) {
            auto* t = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(o, "dltensor"));
            if (t && t->deleter) t->deleter(t);
          }
        });
        return nb::steal(cap);
      }, "stream"_a.none() = nb::none(), "kwargs"_a)
      .def("__repr__", [](const device_buffer& b) {
        return std::string("<vramkit.DeviceBuffer ") + std::to_string(b.nbytes_) + " bytes at 0x" +
               [&] { char s[32]; std::snprintf(s, sizeof s, "%zx", static_cast<std::size_t>(b.ptr_)); return std::string(s); }() +
               " on device " + std::to_string(b.device_) + (b.freed_ ? " (freed)" : "") + (b.owner() ? "" : " (view)") + ">";
      });

  m.def("alloc", [](nb::handle nbytes_h, nb::handle stream, nb::handle device) {
    std::size_t nbytes = to_u64(nbytes_h, "nbytes");
    int d = to_device(device);
    stream_t s = to_stream(stream);
    auto r = current_resource(d);
    void* p = r->allocate(nbytes, s);
    return new device_buffer(std::move(r), reinterpret_cast<std::uintptr_t>(p), nbytes, d, s);
  }, "nbytes"_a, "stream"_a.none() = nb::none(), "device"_a.none() = nb::none(), nb::rv_policy::take_ownership,
        "Allocates nbytes on device (default: the current one) from its current resource.");
  m.def("alloc_from", [](std::shared_ptr<device_resource> r, nb::handle nbytes_h, nb::handle stream) {
    std::size_t nbytes = to_u64(nbytes_h, "nbytes");
    stream_t s = to_stream(stream);
    void* p = r->allocate(nbytes, s);
    int d = r->device();
    return new device_buffer(std::move(r), reinterpret_cast<std::uintptr_t>(p), nbytes, d, s);
  }, "resource"_a, "nbytes"_a, "stream"_a.none() = nb::none(), nb::rv_policy::take_ownership);
}
