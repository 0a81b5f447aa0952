// vramkit as a full PyTorch CUDA allocator: a subclass of PyTorch's pluggable
// allocator that also answers what the two-function interface cannot (CUDA
// graph pools, MemPool, record_stream, memory_stats, cacheInfo, empty_cache,
// the per-process memory fraction). Built only where PyTorch's headers are
// present at build time, against that PyTorch: the class layout must match.
// Everything it does goes through the C functions of libvramkit_torch.so.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <cstdint>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

extern "C" {
void* vramkit_torch_alloc(std::size_t size, int device, void* stream);
void vramkit_torch_free(void* ptr, std::size_t size, int device, void* stream);
int vramkit_torch_record_stream_any(void* ptr, void* stream);
typedef int (*vramkit_stream_filter)(void* ctx, void* stream);
typedef void (*vramkit_filter_drop)(void* ctx);
int vramkit_torch_begin_allocate_to_pool(int device, std::uint64_t first, std::uint64_t second,
                                         vramkit_stream_filter filter, vramkit_filter_drop drop, void* ctx);
void vramkit_torch_end_allocate_to_pool(int device, std::uint64_t first, std::uint64_t second);
void vramkit_torch_release_pool(int device, std::uint64_t first, std::uint64_t second);
void vramkit_torch_set_capture_query(int (*fn)(int device));
int vramkit_torch_stream_capturing(void* stream);
std::size_t vramkit_torch_free_device_bytes(int device);
void vramkit_torch_empty_cache();
struct vramkit_torch_figures {
  std::int64_t allocated_current, allocated_peak, allocated_total, freed_total;
  std::int64_t count_current, count_peak, count_total, count_freed;
  std::int64_t reserved_current, reserved_peak, reserved_total, reserved_freed;
  std::int64_t ooms, retries, device_allocs, device_frees, largest_free;
};
int vramkit_torch_stats(int device, vramkit_torch_figures* out);
void vramkit_torch_reset_peaks(int device);
void vramkit_torch_incref_pool(int device, std::uint64_t first, std::uint64_t second);
int vramkit_torch_pool_users(int device, std::uint64_t first, std::uint64_t second);
long vramkit_torch_pool_live(int device, std::uint64_t first, std::uint64_t second, void** ptrs, long n);
int vramkit_torch_set_fraction(int device, double fraction);
}

namespace {
namespace ca = c10::cuda::CUDACachingAllocator;
using pluggable = torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;
using filter_fn = std::function<bool(cudaStream_t)>;

int call_filter(void* ctx, void* stream) {
  return (*static_cast<filter_fn*>(ctx))(static_cast<cudaStream_t>(stream)) ? 1 : 0;
}
void drop_filter(void* ctx) { delete static_cast<filter_fn*>(ctx); }

// CUDA calls go through vramkit's own runtime, not a second copy here.
int thread_capturing(int device) {
  return vramkit_torch_stream_capturing(c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream());
}

void set_stat(c10::CachingAllocator::Stat& s, std::int64_t current, std::int64_t peak, std::int64_t allocated, std::int64_t freed) {
  s.current = current;
  s.peak = peak;
  s.allocated = allocated;
  s.freed = freed;
}

class vramkit_allocator final : public pluggable {
 public:
  vramkit_allocator()
      : pluggable([](std::size_t n, int d, cudaStream_t s) { return vramkit_torch_alloc(n, d, s); },
                  [](void* p, std::size_t n, int d, cudaStream_t s) { vramkit_torch_free(p, n, d, s); }) {
    set_record_stream_fn([](void* ptr, cudaStream_t s) {
      TORCH_CHECK(vramkit_torch_record_stream_any(ptr, s) == 0, "vramkit: record_stream failed for ", ptr);
    });
  }

  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    vramkit_torch_figures v{};
    TORCH_CHECK(vramkit_torch_stats(device, &v) == 0, "vramkit: no statistics for device ", int(device));
    c10::CachingDeviceAllocator::DeviceStats out;
    // vramkit does not split its figures into PyTorch's small and large pools:
    // every figure is the aggregate.
    auto agg = static_cast<std::size_t>(c10::CachingDeviceAllocator::StatType::AGGREGATE);
    set_stat(out.allocated_bytes[agg], v.allocated_current, v.allocated_peak, v.allocated_total, v.freed_total);
    set_stat(out.requested_bytes[agg], v.allocated_current, v.allocated_peak, v.allocated_total, v.freed_total);
    set_stat(out.active_bytes[agg], v.allocated_current, v.allocated_peak, v.allocated_total, v.freed_total);
    set_stat(out.allocation[agg], v.count_current, v.count_peak, v.count_total, v.count_freed);
    set_stat(out.active[agg], v.count_current, v.count_peak, v.count_total, v.count_freed);
    set_stat(out.reserved_bytes[agg], v.reserved_current, v.reserved_peak, v.reserved_total, v.reserved_freed);
    out.num_ooms = v.ooms;
    out.num_alloc_retries = v.retries;
    out.num_device_alloc = v.device_allocs;
    out.num_device_free = v.device_frees;
    return out;
  }
  void resetAccumulatedStats(c10::DeviceIndex) override {}
  void resetPeakStats(c10::DeviceIndex device) override { vramkit_torch_reset_peaks(device); }

  // cuDNN's benchmark mode sizes its workspace from this.
  void cacheInfo(c10::DeviceIndex device, std::size_t* largest) override {
    vramkit_torch_figures v{};
    std::size_t cached = vramkit_torch_stats(device, &v) == 0 ? static_cast<std::size_t>(v.largest_free) : 0;
    *largest = std::max(cached, vramkit_torch_free_device_bytes(device));
  }

  void emptyCache(c10::cuda::MempoolId_t id) override {
    // A graph's pool keeps its memory while the graph lives.
    if (id.first == 0 && id.second == 0) vramkit_torch_empty_cache();
  }
  void setMemoryFraction(double fraction, c10::DeviceIndex device) override {
    TORCH_CHECK(fraction > 0.0 && fraction <= 1.0, "vramkit: memory fraction must be in (0, 1], not ", fraction);
    TORCH_CHECK(vramkit_torch_set_fraction(device, fraction) == 0,
                "vramkit: cannot set the memory fraction of device ", int(device));
  }

  void beginAllocateToPool(c10::DeviceIndex device, c10::cuda::MempoolId_t id, filter_fn filter) override {
    auto* ctx = new filter_fn(std::move(filter));
    TORCH_CHECK(vramkit_torch_begin_allocate_to_pool(device, id.first, id.second, &call_filter, &drop_filter, ctx) == 0,
                "vramkit: cannot route allocations to pool (", id.first, ", ", id.second, ")");
  }
  void endAllocateToPool(c10::DeviceIndex device, c10::cuda::MempoolId_t id) override {
    vramkit_torch_end_allocate_to_pool(device, id.first, id.second);
  }
  void releasePool(c10::DeviceIndex device, c10::cuda::MempoolId_t id) override {
    vramkit_torch_release_pool(device, id.first, id.second);
  }
  void createOrIncrefPool(c10::DeviceIndex device, c10::cuda::MempoolId_t id,
                          std::shared_ptr<ca::CUDAAllocator> allocator) override {
    TORCH_CHECK(!allocator,
                "vramkit: a torch.cuda.MemPool with an allocator of its own cannot be used while vramkit is "
                "PyTorch's allocator (vramkit.torch.use()); make the MemPool without one, or use "
                "vramkit.torch.pool() instead of vramkit.torch.use()");
    vramkit_torch_incref_pool(device, id.first, id.second);
  }
  // A scoped pool is used only inside its with-block: nothing to change.
  void setUseOnOOM(c10::DeviceIndex, c10::cuda::MempoolId_t, bool) override {}
  void setNoSplit(c10::DeviceIndex, c10::cuda::MempoolId_t) override {}
  int getPoolUseCount(c10::DeviceIndex device, c10::cuda::MempoolId_t id) override {
    return vramkit_torch_pool_users(device, id.first, id.second);
  }
  bool checkPoolLiveAllocations(c10::DeviceIndex device, c10::cuda::MempoolId_t id,
                                const std::unordered_set<void*>& expected) override {
    long n = vramkit_torch_pool_live(device, id.first, id.second, nullptr, 0);
    if (n < 0) return false;
    std::vector<void*> live(static_cast<std::size_t>(n));
    n = vramkit_torch_pool_live(device, id.first, id.second, live.data(), n);
    if (n != static_cast<long>(live.size()) || live.size() != expected.size()) return false;
    for (void* p : live)
      if (!expected.count(p)) return false;
    return true;
  }

  ca::ShareableHandle shareIpcHandle(void* ptr) override {
    TORCH_CHECK(false, "vramkit: this tensor's memory (", ptr,
                ") comes from vramkit's pool, which cannot be shared with another process through CUDA IPC "
                "(torch.multiprocessing). Share it from a process that does not call vramkit.torch.use(), route "
                "only chosen allocations through vramkit with vramkit.torch.pool(), or copy the tensor to "
                "shared CPU memory (tensor.cpu().share_memory_())");
  }
};
}  // namespace

extern "C" __attribute__((visibility("default"))) int vramkit_torch_install(char* message, std::size_t size) {
  try {
    auto a = std::make_shared<vramkit_allocator>();
    a->init(static_cast<int>(c10::cuda::device_count()));
    torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(a);
    vramkit_torch_set_capture_query(&thread_capturing);
    return 0;
  } catch (const std::exception& e) {
    std::snprintf(message, size, "%s", e.what());
    return 1;
  }
}
