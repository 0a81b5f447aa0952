// Every CUDA runtime and driver call of vramkit. The driver API (cuMem*) is
// reached through cudaGetDriverEntryPoint, so nothing links libcuda and the
// library loads on machines without a driver.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>
#include <algorithm>
#include <atomic>

#include "vramkit/platform/cuda.hpp"

namespace vramkit::cuda {

namespace {

[[noreturn]] void fail(cudaError_t e, const char* what) {
  cudaGetLastError();  // clear a sticky-free error so the next call starts clean
  throw cuda_error(std::string("vramkit: ") + what + " failed: " + cudaGetErrorName(e) + " (" +
                       cudaGetErrorString(e) + ")",
                   static_cast<int>(e));
}

#define VK_CUDA(call)                       \
  do {                                      \
    cudaError_t e_ = (call);                \
    if (e_ != cudaSuccess) fail(e_, #call); \
  } while (0)

// Runs f with `device` current, restoring the caller's device after.
class device_guard {
 public:
  explicit device_guard(int device) {
    cudaGetDevice(&old_);
    if (old_ != device) VK_CUDA(cudaSetDevice(device));
    changed_ = old_ != device;
  }
  ~device_guard() {
    if (changed_) cudaSetDevice(old_);
  }

 private:
  int old_ = 0;
  bool changed_ = false;
};

// ---- driver entry points -----------------------------------------------------
struct driver_api {
  decltype(&::cuMemCreate) create = nullptr;
  decltype(&::cuMemRelease) release = nullptr;
  decltype(&::cuMemMap) map = nullptr;
  decltype(&::cuMemUnmap) unmap = nullptr;
  decltype(&::cuMemSetAccess) set_access = nullptr;
  decltype(&::cuMemAddressReserve) reserve = nullptr;
  decltype(&::cuMemAddressFree) address_free = nullptr;
  decltype(&::cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&::cuGetErrorName) error_name = nullptr;
};

template <class F>
void load(const char* name, F& fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q{};
  cudaError_t e = cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q);
  if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !p)
    throw cuda_error(std::string("vramkit: the CUDA driver has no entry point ") + name, static_cast<int>(e));
  fn = reinterpret_cast<F>(p);
}

const driver_api& driver() {
  static driver_api api = [] {
    driver_api a;
    VK_CUDA(cudaFree(nullptr));  // initializes the runtime and the driver
    load("cuMemCreate", a.create);
    load("cuMemRelease", a.release);
    load("cuMemMap", a.map);
    load("cuMemUnmap", a.unmap);
    load("cuMemSetAccess", a.set_access);
    load("cuMemAddressReserve", a.reserve);
    load("cuMemAddressFree", a.address_free);
    load("cuMemGetAllocationGranularity", a.granularity);
    load("cuGetErrorName", a.error_name);
    return a;
  }();
  return api;
}

[[noreturn]] void fail_drv(CUresult r, const char* what) {
  const char* n = "unknown";
  if (driver().error_name) driver().error_name(r, &n);
  throw cuda_error(std::string("vramkit: ") + what + " failed: " + n, static_cast<int>(r));
}

#define VK_DRV(call)                               \
  do {                                             \
    CUresult r_ = (call);                          \
    if (r_ != CUDA_SUCCESS) fail_drv(r_, #call);   \
  } while (0)

// ---- peers -------------------------------------------------------------------
// The device itself, then the peers VRAMKIT_PEER_ACCESS lets reach its memory:
// "auto" (default) every device that can access it, "off" none.
std::vector<int> access_devices(int device) {
  std::vector<int> out{device};
  for (int peer : peer_devices(device)) out.push_back(peer);
  return out;
}

// ---- vmm ---------------------------------------------------------------------
class vmm_device final : public page_device {
 public:
  vmm_device(int device, std::size_t page_size) : device_(device) {
    check_device(device);
    prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop_.location.id = device;
    std::size_t g = 0;
    VK_DRV(driver().granularity(&g, &prop_, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    if (page_size % g != 0)
      throw invalid_argument("page_size " + std::to_string(page_size) + " is not a multiple of the device's " +
                             "granularity " + std::to_string(g));
    granularity_ = page_size ? page_size : g;
    std::size_t fr = 0, tot = 0;
    mem_get_info(device, fr, tot);
    capacity_ = tot / granularity_ * granularity_;
    // Read/write access for this device and every peer that may reach it, so
    // that NCCL's peer paths and cudaMemcpyPeer work on the pool's memory. On
    // one GPU the list is this device alone (nothing changes).
    for (int d : access_devices(device)) {
      CUmemAccessDesc a{};
      a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      a.location.id = d;
      a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      access_.push_back(a);
    }
  }
  std::size_t granularity() const noexcept override { return granularity_; }
  std::size_t capacity() const noexcept override { return capacity_; }
  std::size_t created_bytes() const noexcept override { return created_ * granularity_; }
  std::size_t available() const noexcept override {
    std::size_t fr = 0, tot = 0;
    int was = -1;  // (device_guard throws; this cannot)
    if (cudaGetDevice(&was) != cudaSuccess || (was != device_ && cudaSetDevice(device_) != cudaSuccess)) {
      cudaGetLastError();
      return 0;
    }
    const cudaError_t r = cudaMemGetInfo(&fr, &tot);
    if (was != device_) cudaSetDevice(was);
    if (r != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return fr;
  }
  std::uintptr_t reserve(std::size_t bytes) override {
    CUdeviceptr p = 0;
    VK_DRV(driver().reserve(&p, bytes, granularity_, 0, 0));
    return static_cast<std::uintptr_t>(p);
  }
  void unreserve(std::uintptr_t va, std::size_t bytes) noexcept override {
    driver().address_free(static_cast<CUdeviceptr>(va), bytes);
  }
  page_handle create() override {
    CUmemGenericAllocationHandle h = 0;
    CUresult r;
    {
      page_call_clock::scope t(clock_.create);
      r = driver().create(&h, granularity_, &prop_, 0);
    }
    if (r == CUDA_ERROR_OUT_OF_MEMORY) return 0;
    if (r != CUDA_SUCCESS) fail_drv(r, "cuMemCreate");
    ++created_;
    return static_cast<page_handle>(h);
  }
  void destroy(page_handle h) noexcept override {
    std::size_t n = 1;
    if (chunks_live_.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> lk(chunks_mu_);
      auto it = chunks_.find(h);
      if (it != chunks_.end()) {
        n = it->second;
        chunks_.erase(it);
        chunks_live_.fetch_sub(1, std::memory_order_release);
      }
    }
    {
      page_call_clock::scope t(clock_.destroy);
      driver().release(static_cast<CUmemGenericAllocationHandle>(h));
    }
    created_ -= n;
  }
  page_handle create_chunk(std::size_t pages) override {
    if (pages == 0) throw invalid_argument("vmm: a chunk of 0 pages");
    CUmemGenericAllocationHandle h = 0;
    CUresult r;
    {
      page_call_clock::scope t(clock_.create);
      r = driver().create(&h, pages * granularity_, &prop_, 0);
    }
    if (r == CUDA_ERROR_OUT_OF_MEMORY) return 0;
    if (r != CUDA_SUCCESS) fail_drv(r, "cuMemCreate");
    {
      std::lock_guard<std::mutex> lk(chunks_mu_);
      chunks_.emplace(static_cast<page_handle>(h), pages);
      chunks_live_.fetch_add(1, std::memory_order_release);
    }
    created_ += pages;
    return static_cast<page_handle>(h);
  }
  void map_chunk(std::uintptr_t va, page_handle h, std::size_t pages) override {
    const std::size_t bytes = pages * granularity_;
    page_call_clock::scope t(clock_.map);
    VK_DRV(driver().map(static_cast<CUdeviceptr>(va), bytes, 0, static_cast<CUmemGenericAllocationHandle>(h), 0));
    CUresult r = driver().set_access(static_cast<CUdeviceptr>(va), bytes, access_.data(), access_.size());
    if (r != CUDA_SUCCESS) {
      driver().unmap(static_cast<CUdeviceptr>(va), bytes);
      fail_drv(r, "cuMemSetAccess");
    }
  }
  void map(std::uintptr_t va, const page_handle* handles, std::size_t count) override {
    page_call_clock::scope t(clock_.map);
    std::size_t done = 0;
    try {
      for (; done < count; ++done)
        VK_DRV(driver().map(static_cast<CUdeviceptr>(va + done * granularity_), granularity_, 0,
                            static_cast<CUmemGenericAllocationHandle>(handles[done]), 0));
      VK_DRV(driver().set_access(static_cast<CUdeviceptr>(va), count * granularity_, access_.data(), access_.size()));
    } catch (...) {
      if (done) driver().unmap(static_cast<CUdeviceptr>(va), done * granularity_);
      throw;
    }
  }
  void unmap(std::uintptr_t va, std::size_t count) noexcept override {
    page_call_clock::scope t(clock_.unmap);
    driver().unmap(static_cast<CUdeviceptr>(va), count * granularity_);
  }
  // The helper thread's calls are the pool's own, never part of a graph: in
  // relaxed capture mode they stay allowed while another thread captures in
  // global mode (the default), as the allocating thread's are (torch_shim).
  void attach_thread() override {
    VK_CUDA(cudaSetDevice(device_));
    relax_capture_mode();
  }
  void synchronize() override { synchronize_device(device_); }
  bool copies() const noexcept override { return true; }
  void copy(std::uintptr_t dst, std::uintptr_t src, std::size_t bytes) override {
    device_guard g(device_);
    VK_CUDA(cudaMemcpy(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes,
                       cudaMemcpyDeviceToDevice));
    VK_CUDA(cudaDeviceSynchronize());  // a device-to-device copy may return before it is done
  }
  int device() const noexcept override { return device_; }
  std::string name() const override { return "vmm"; }
  device_properties properties() const override { return cuda::properties(device_); }
  page_call_times call_times() const noexcept override { return clock_.read(); }

 private:
  page_call_clock clock_;
  int device_;
  std::size_t granularity_ = 0, capacity_ = 0;
  std::atomic<std::size_t> created_{0};  // pages; create/destroy may run on several threads
  std::mutex chunks_mu_;
  std::unordered_map<page_handle, std::size_t> chunks_;  // chunk handle -> its pages
  std::atomic<std::size_t> chunks_live_{0};  // chunks_.size(): page destroys skip the lock while 0
  CUmemAllocationProp prop_{};
  std::vector<CUmemAccessDesc> access_;
};

// ---- plain resources -----------------------------------------------------------
// Live pointers of a plain resource: for bad-free checks and its state().
class live_table {
 public:
  void add(void* p, std::size_t n) {
    std::lock_guard<std::mutex> lk(mu_);
    live_[p] = n;
    bytes_ += n;
    peak_ = std::max(peak_, bytes_);
    ++allocs_;
  }
  // Returns the size, or 0 if p is not live.
  std::size_t take(void* p, std::size_t n, free_status& st) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = live_.find(p);
    if (it == live_.end()) {
      st = free_status::not_owned;
      return 0;
    }
    if (n != 0 && n != it->second) {
      st = free_status::wrong_size;
      return 0;
    }
    std::size_t s = it->second;
    bytes_ -= s;
    live_.erase(it);
    ++frees_;
    st = free_status::ok;
    return s;
  }
  std::size_t size_of(const void* p) const {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = live_.find(const_cast<void*>(p));
    return it == live_.end() ? 0 : it->second;
  }
  void fill(memory_state& s) const {
    std::lock_guard<std::mutex> lk(mu_);
    s.live_bytes = bytes_;
    s.live_count = live_.size();
    s.upstream_allocs = allocs_;
    s.upstream_frees = frees_;
    s.peak_live_bytes = peak_;
  }
  void reset_peak() {
    std::lock_guard<std::mutex> lk(mu_);
    peak_ = bytes_;
  }

 private:
  mutable std::mutex mu_;
  std::unordered_map<void*, std::size_t> live_;
  std::size_t bytes_ = 0, peak_ = 0, allocs_ = 0, frees_ = 0;
};

[[noreturn]] void throw_oom(const char* who, int device, std::size_t bytes) {
  std::size_t fr = 0, tot = 0;
  cudaMemGetInfo(&fr, &tot);
  cudaGetLastError();
  throw out_of_memory("vramkit: out of memory on device " + std::to_string(device) + " (" + who +
                          "): requested " + format_bytes(bytes) + "; device free " + format_bytes(fr) + " of " +
                          format_bytes(tot),
                      bytes);
}

class cuda_malloc_resource final : public device_resource {
 public:
  explicit cuda_malloc_resource(int device) : device_(device) { check_device(device); }
  free_status try_deallocate(void* p, std::size_t bytes, stream_t) noexcept override {
    if (!p) return free_status::ok;
    free_status st;
    if (!live_.take(p, bytes, st)) return st;
    int old = 0;
    cudaGetDevice(&old);
    if (old != device_) cudaSetDevice(device_);
    cudaFree(p);
    if (old != device_) cudaSetDevice(old);
    return free_status::ok;
  }
  memory_state state() const override {
    memory_state s;
    live_.fill(s);
    s.reserved_bytes = s.live_bytes;
    s.peak_reserved_bytes = s.peak_live_bytes;
    std::size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) == cudaSuccess) s.capacity_bytes = tot;
    cudaGetLastError();
    return s;
  }
  void reset_peaks() override { live_.reset_peak(); }
  int device() const noexcept override { return device_; }
  std::string name() const override { return "cuda"; }
  std::size_t allocation_size(const void* p) const noexcept override { return live_.size_of(p); }

 protected:
  void* do_allocate(std::size_t bytes, stream_t) override {
    if (bytes == 0) return nullptr;
    device_guard g(device_);
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) throw_oom("cudaMalloc", device_, bytes);
    if (e != cudaSuccess) fail(e, "cudaMalloc");
    live_.add(p, bytes);
    return p;
  }

 private:
  int device_;
  live_table live_;
};

class cuda_async_resource final : public device_resource {
 public:
  cuda_async_resource(int device, std::size_t release_threshold) : device_(device) {
    check_device(device);
    device_guard g(device);
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    VK_CUDA(cudaMemPoolCreate(&pool_, &props));
    std::uint64_t thr = release_threshold;
    VK_CUDA(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &thr));
  }
  ~cuda_async_resource() override {
    cudaDeviceSynchronize();
    cudaMemPoolDestroy(pool_);
  }
  free_status try_deallocate(void* p, std::size_t bytes, stream_t s) noexcept override {
    if (!p) return free_status::ok;
    free_status st;
    if (!live_.take(p, bytes, st)) return st;
    cudaFreeAsync(p, reinterpret_cast<cudaStream_t>(s));
    return free_status::ok;
  }
  void release_cached() override {
    device_guard g(device_);
    VK_CUDA(cudaDeviceSynchronize());
    VK_CUDA(cudaMemPoolTrimTo(pool_, 0));
  }
  memory_state state() const override {
    memory_state s;
    live_.fill(s);
    std::uint64_t v = 0;
    cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &v);
    s.reserved_bytes = v;
    cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemHigh, &v);
    s.peak_reserved_bytes = v;
    s.cached_bytes = s.reserved_bytes > s.live_bytes ? s.reserved_bytes - s.live_bytes : 0;
    std::size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) == cudaSuccess) s.capacity_bytes = tot;
    cudaGetLastError();
    return s;
  }
  void reset_peaks() override {
    live_.reset_peak();
    std::uint64_t zero = 0;
    cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReservedMemHigh, &zero);
    cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrUsedMemHigh, &zero);
  }
  int device() const noexcept override { return device_; }
  std::string name() const override { return "cuda_async"; }
  std::size_t allocation_size(const void* p) const noexcept override { return live_.size_of(p); }

 protected:
  void* do_allocate(std::size_t bytes, stream_t s) override {
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    cudaError_t e = cudaMallocFromPoolAsync(&p, bytes, pool_, reinterpret_cast<cudaStream_t>(s));
    if (e == cudaErrorMemoryAllocation) throw_oom("cudaMallocAsync", device_, bytes);
    if (e != cudaSuccess) fail(e, "cudaMallocFromPoolAsync");
    live_.add(p, bytes);
    return p;
  }

 private:
  int device_;
  cudaMemPool_t pool_ = nullptr;
  live_table live_;
};

// ---- events ------------------------------------------------------------------
class cuda_events final : public stream_ops {
 public:
  explicit cuda_events(int device) : device_(device) {}
  ~cuda_events() override {
    for (auto e : free_) cudaEventDestroy(e);
  }
  event_id record(stream_t s) override {
    cudaEvent_t e;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!free_.empty()) {
        e = free_.back();
        free_.pop_back();
      } else {
        device_guard g(device_);
        VK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      }
    }
    const cudaError_t r = cudaEventRecord(e, reinterpret_cast<cudaStream_t>(s));
    if (r != cudaSuccess) {
      release(reinterpret_cast<event_id>(e));  // the event stays the pool's, not leaked
      fail(r, "cudaEventRecord");
    }
    return reinterpret_cast<event_id>(e);
  }
  bool done(event_id id) override {
    cudaError_t r = cudaEventQuery(reinterpret_cast<cudaEvent_t>(id));
    if (r == cudaSuccess) return true;
    if (r == cudaErrorNotReady) {
      cudaGetLastError();
      return false;
    }
    fail(r, "cudaEventQuery");
  }
  void wait(event_id id) override { VK_CUDA(cudaEventSynchronize(reinterpret_cast<cudaEvent_t>(id))); }
  void release(event_id id) noexcept override {
    std::lock_guard<std::mutex> lk(mu_);
    free_.push_back(reinterpret_cast<cudaEvent_t>(id));
  }
  bool capturing(stream_t s) noexcept override {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(reinterpret_cast<cudaStream_t>(s), &st) != cudaSuccess) {
      cudaGetLastError();
      return true;  // cannot tell (the legacy stream while another is captured): leave it alone
    }
    return st != cudaStreamCaptureStatusNone;
  }

 private:
  int device_;
  std::mutex mu_;
  std::vector<cudaEvent_t> free_;
};

}  // namespace

bool built_with_cuda() noexcept { return true; }

int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::string unavailable_reason() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess && n > 0) return "";
  cudaGetLastError();
  if (e == cudaSuccess) return "no CUDA device found";
  return std::string("no usable CUDA device: ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

void check_device(int device) {
  int n = device_count();
  if (device < 0 || device >= n)
    throw invalid_argument("vramkit: unknown device " + std::to_string(device) + " (" + std::to_string(n) +
                           " CUDA device(s) present)");
}

device_properties properties(int device) {
  check_device(device);
  cudaDeviceProp p{};
  VK_CUDA(cudaGetDeviceProperties(&p, device));
  device_properties d;
  d.name = p.name;
  d.device = device;
  d.global_memory_bytes = p.totalGlobalMem;
  d.constant_memory_bytes = p.totalConstMem;
  d.shared_memory_per_block_bytes = p.sharedMemPerBlock;
  d.shared_memory_per_sm_bytes = p.sharedMemPerMultiprocessor;
  d.l2_cache_bytes = static_cast<std::size_t>(p.l2CacheSize);
  d.sm_count = p.multiProcessorCount;
  d.memory_bus_width_bits = p.memoryBusWidth;
  int clock = 0;
  cudaDeviceGetAttribute(&clock, cudaDevAttrMemoryClockRate, device);
  cudaGetLastError();
  d.memory_clock_khz = clock;
  d.compute_capability_major = p.major;
  d.compute_capability_minor = p.minor;
  try {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    std::size_t g = 0;
    if (driver().granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS)
      d.allocation_granularity = g;
  } catch (const error&) {
  }
  return d;
}

void mem_get_info(int device, std::size_t& fr, std::size_t& total) {
  check_device(device);
  device_guard g(device);
  VK_CUDA(cudaMemGetInfo(&fr, &total));
}

void set_device(int device) {
  check_device(device);
  VK_CUDA(cudaSetDevice(device));
}
int current_device() {
  int d = 0;
  VK_CUDA(cudaGetDevice(&d));
  return d;
}
stream_t create_stream(int device) {
  device_guard g(device);
  cudaStream_t s;
  VK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return reinterpret_cast<stream_t>(s);
}
void destroy_stream(stream_t s) noexcept { cudaStreamDestroy(reinterpret_cast<cudaStream_t>(s)); }
void synchronize_stream(stream_t s) { VK_CUDA(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(s))); }
void synchronize_device(int device) {
  device_guard g(device);
  VK_CUDA(cudaDeviceSynchronize());
}
std::vector<int> peer_devices(int device) {
  const char* e = std::getenv("VRAMKIT_PEER_ACCESS");
  std::string mode = e ? e : "auto";
  if (mode == "off" || mode == "0" || mode == "false") return {};
  if (mode != "auto" && mode != "on" && mode != "1" && mode != "true")
    throw invalid_argument("VRAMKIT_PEER_ACCESS='" + mode + "' is not one of auto, off");
  std::vector<int> out;
  int n = device_count();
  for (int peer = 0; peer < n; ++peer) {
    if (peer == device) continue;
    int can = 0;
    if (cudaDeviceCanAccessPeer(&can, peer, device) != cudaSuccess) {
      cudaGetLastError();
      continue;
    }
    if (can) out.push_back(peer);
  }
  return out;
}

bool stream_is_capturing(stream_t s) noexcept {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(reinterpret_cast<cudaStream_t>(s), &st) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return st != cudaStreamCaptureStatusNone;
}
int relax_capture_mode() noexcept {
  cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
  if (cudaThreadExchangeStreamCaptureMode(&m) != cudaSuccess) cudaGetLastError();
  return static_cast<int>(m);
}
void restore_capture_mode(int mode) noexcept {
  cudaStreamCaptureMode m = static_cast<cudaStreamCaptureMode>(mode);
  if (cudaThreadExchangeStreamCaptureMode(&m) != cudaSuccess) cudaGetLastError();
}
void copy_to_device(void* dst, const void* src, std::size_t bytes) {
  VK_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}
void copy_to_host(void* dst, const void* src, std::size_t bytes) {
  VK_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}
void memset_async(void* dst, int value, std::size_t bytes, stream_t s) {
  VK_CUDA(cudaMemsetAsync(dst, value, bytes, reinterpret_cast<cudaStream_t>(s)));
}

std::shared_ptr<stream_ops> make_stream_ops(int device) {
  check_device(device);
  return std::make_shared<cuda_events>(device);
}
std::shared_ptr<page_device> make_vmm_device(int device, std::size_t page_size) {
  return std::make_shared<vmm_device>(device, page_size);
}
std::shared_ptr<device_resource> make_cuda_resource(int device) {
  return std::make_shared<cuda_malloc_resource>(device);
}
std::shared_ptr<device_resource> make_cuda_async_resource(int device, std::size_t release_threshold) {
  return std::make_shared<cuda_async_resource>(device, release_threshold);
}

}  // namespace vramkit::cuda
