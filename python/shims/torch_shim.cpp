// The C symbols PyTorch's CUDAPluggableAllocator loads, and the ones the
// optional hooks library (torch_hooks.cpp, built against libtorch) calls for
// CUDA graphs, scoped pools, record_stream and empty_cache.
//
// Every device gets one capture_router over its current resource (the same
// resource the Python module uses: both link the one shared core library), so
// allocations made while a graph is captured come from the graph's private
// pool. The router follows the current resource while that is a tracking
// adaptor over the router's own (leak tracking puts one there and takes it
// off again; see follow()). Routers live until the process ends: PyTorch frees
// tensors as late as its own static destructors, after which nothing here may
// be gone.
#include <algorithm>
#include <array>
#include <cstdio>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <stdexcept>

#include "vramkit/mr/capture_router.hpp"
#include "vramkit/mr/pool_resource.hpp"
#include "vramkit/platform/cuda.hpp"
#include "vramkit/runtime.hpp"

namespace {
using namespace vramkit;

constexpr int max_devices = 64;
std::array<std::atomic<capture_router*>, max_devices> g_routers{};
std::mutex g_make_mu;
// Set once the interpreter is exiting: PyTorch then frees tensors after
// vramkit's own state may be gone, and CUDA may be torn down. Those frees are
// dropped (the process returns all its memory anyway).
std::atomic<bool> g_exiting{false};
// Set by the hooks library: is the calling thread's current stream capturing?
std::atomic<int (*)(int)> g_thread_capturing{nullptr};

std::shared_ptr<device_resource> make_private_pool(int device, capture_router* r) {
  pool_resource* main_pool = find_pool(r->main().get());
  pool_options o = main_pool ? main_pool->options() : pool_options::from_env();
  // A graph holds the addresses it captured: its pool never moves or unmaps
  // a page while it lives.
  o.remap = false;
  // No helper thread making pages for it (map_ahead): a capture in global
  // mode forbids mapping calls from every thread.
  o.map_ahead = 0;
  // No step plans: marks reach the main pool only, and a graph's pool keeps its chunks.
  o.plan_steps = false;
  o.release_threshold = static_cast<std::size_t>(-1);
  o.reserve_limit = 0;
  o.page_size = 0;  // the device's own pages: the main pool's may come from a device of their own
  auto events = std::make_shared<capture_aware_events>(
      default_stream_ops(device), [](stream_t s) { return cuda::stream_is_capturing(s); },
      [r] { return r->routing(); });
  if (!main_pool || main_pool->paged())
    return std::make_shared<pool_resource>(default_page_device(device), events, o);
  // The main pool takes segments from cudaMalloc/cudaMallocAsync: a graph's
  // pool takes them from cudaMalloc (an async allocation would be captured).
  return std::make_shared<pool_resource>(cuda::make_cuda_resource(device), events, o);
}

// The router's main resource follows the device's current one while that is
// the router's own base or tracking adaptors over it (leak_check and watch put
// one there and take it off). Anything else (another pool, a guard adaptor, no
// resource after reset_runtime) would strand the memory PyTorch holds: the
// router keeps its base then. One atomic load tells that nothing changed.
capture_router& follow(capture_router& r, int device) {
  std::uint64_t g = current_resource_generation();
  if (r.main_generation() >= g) return r;
  auto cur = current_resource_if_set(device);
  if (cur && beneath_trackers(cur.get()) == r.base().get()) r.set_main(std::move(cur), g);
  else r.set_main(r.base(), g);
  return r;
}

capture_router& router(int device) {
  if (device < 0 || device >= max_devices) throw invalid_argument("vramkit: device index " + std::to_string(device));
  capture_router* r = g_routers[device].load(std::memory_order_acquire);
  if (r) return follow(*r, device);
  std::lock_guard<std::mutex> lk(g_make_mu);
  r = g_routers[device].load(std::memory_order_acquire);
  if (r) return follow(*r, device);
  std::uint64_t generation = current_resource_generation();
  auto main = current_resource(device);
  // The private-pool factory needs the router's own address.
  auto* holder = new capture_router*(nullptr);
  auto* made = new capture_router(
      main, [device, holder]() { return make_private_pool(device, *holder); },
      [](stream_t s) { return cuda::stream_is_capturing(s); },
      [device] {
        auto q = g_thread_capturing.load(std::memory_order_acquire);
        return q ? q(device) != 0 : false;
      },
      [device] { cuda::synchronize_device(device); });
  *holder = made;
  made->set_main(main, generation);
  g_routers[device].store(made, std::memory_order_release);
  return follow(*made, device);
}

// Runs f with the thread's capture mode relaxed while a capture may be under
// way: mapping memory and cudaMalloc are refused in "global" capture mode.
template <class F>
auto relaxed(capture_router& r, F&& f) {
  if (!r.routing()) return f();
  struct restore {
    int mode;
    ~restore() { cuda::restore_capture_mode(mode); }
  } g{cuda::relax_capture_mode()};
  return f();
}
}  // namespace

extern "C" {

__attribute__((visibility("default"))) void* vramkit_torch_alloc(std::size_t size, int device, void* stream) {
  try {
    capture_router& r = router(device);
    return relaxed(r, [&] { return r.allocate(size, reinterpret_cast<stream_t>(stream)); });
  } catch (const std::exception& e) {
    // PyTorch does not check the returned pointer: a null would become a tensor
    // at address 0. Throwing reaches Python as a RuntimeError with this message.
    throw std::runtime_error(e.what());
  }
}

__attribute__((visibility("default"))) void vramkit_torch_free(void* ptr, std::size_t size, int device, void* stream) {
  if (g_exiting.load(std::memory_order_acquire)) return;
  try {
    capture_router& r = router(device);
    free_status s = relaxed(r, [&] { return r.deallocate(ptr, size, reinterpret_cast<stream_t>(stream)); });
    if (s != free_status::ok) report_bad_free(*r.main(), ptr, size, s);
  } catch (...) {
  }
}

// record_stream from Python (vramkit.torch.record_stream) or from PyTorch's
// Tensor.record_stream through the hooks library.
__attribute__((visibility("default"))) int vramkit_torch_record_stream(void* ptr, int device, void* stream) {
  try {
    router(device).record_stream(ptr, reinterpret_cast<stream_t>(stream));
    return 0;
  } catch (...) {
    return -1;
  }
}

// The same, for a pointer whose device the caller does not know.
__attribute__((visibility("default"))) int vramkit_torch_record_stream_any(void* ptr, void* stream) {
  for (int d = 0; d < max_devices; ++d) {
    capture_router* r = g_routers[d].load(std::memory_order_acquire);
    if (!r) continue;
    graph_pool_id id;
    if (r->owner(ptr, id) || r->main()->allocation_size(ptr) != 0) return vramkit_torch_record_stream(ptr, d, stream);
  }
  return -1;
}

// A C filter: PyTorch's std::function, carried by the hooks library.
typedef int (*vramkit_stream_filter)(void* ctx, void* stream);
typedef void (*vramkit_filter_drop)(void* ctx);

__attribute__((visibility("default"))) int vramkit_torch_begin_allocate_to_pool(int device, std::uint64_t first,
                                                                                std::uint64_t second,
                                                                                vramkit_stream_filter filter,
                                                                                vramkit_filter_drop drop, void* ctx) {
  try {
    std::shared_ptr<void> owned(ctx, [drop](void* c) {
      if (drop) drop(c);
    });
    capture_router::stream_filter f;
    if (filter) f = [filter, owned](stream_t s) { return filter(owned.get(), reinterpret_cast<void*>(s)) != 0; };
    router(device).begin_allocate_to_pool({first, second}, std::move(f));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "vramkit: cannot route allocations to pool (%llu, %llu): %s\n",
                 static_cast<unsigned long long>(first), static_cast<unsigned long long>(second), e.what());
    return -1;
  }
}

__attribute__((visibility("default"))) void vramkit_torch_end_allocate_to_pool(int device, std::uint64_t first,
                                                                              std::uint64_t second) {
  try {
    router(device).end_allocate_to_pool({first, second});
  } catch (...) {
  }
}

__attribute__((visibility("default"))) void vramkit_torch_release_pool(int device, std::uint64_t first,
                                                                      std::uint64_t second) {
  if (g_exiting.load(std::memory_order_acquire)) return;
  try {
    capture_router& r = router(device);
    relaxed(r, [&] {
      r.release_pool({first, second});
      return 0;
    });
  } catch (...) {
  }
}

__attribute__((visibility("default"))) int vramkit_torch_stream_capturing(void* stream) {
  return cuda::stream_is_capturing(reinterpret_cast<stream_t>(stream)) ? 1 : 0;
}

__attribute__((visibility("default"))) std::size_t vramkit_torch_free_device_bytes(int device) {
  try {
    std::size_t fr = 0, total = 0;
    device_mem_info(device, fr, total);
    return fr;
  } catch (...) {
    return 0;
  }
}

__attribute__((visibility("default"))) void vramkit_torch_set_capture_query(int (*fn)(int device)) {
  g_thread_capturing.store(fn, std::memory_order_release);
}

// torch.cuda.empty_cache(): the main pool's cache (graph pools keep theirs).
__attribute__((visibility("default"))) void vramkit_torch_empty_cache() {
  for (int d = 0; d < max_devices; ++d) {
    capture_router* r = g_routers[d].load(std::memory_order_acquire);
    if (!r) continue;
    try {
      r->main()->release_cached();
    } catch (...) {
    }
  }
}

__attribute__((visibility("default"))) void vramkit_torch_exiting() { g_exiting.store(true, std::memory_order_release); }

// One row per private pool of the device, for vramkit.torch.graph_pools().
struct vramkit_graph_pool_row {
  std::uint64_t first, second;
  std::int64_t users, windows, captured;
  std::uint64_t set_aside_count, set_aside_bytes;
  std::uint64_t live_bytes, live_count, reserved_bytes, peak_reserved_bytes;
};

__attribute__((visibility("default"))) int vramkit_torch_graph_pools(int device, vramkit_graph_pool_row* rows, int n) {
  try {
    capture_router* r = (device >= 0 && device < max_devices) ? g_routers[device].load() : nullptr;
    if (!r) return 0;
    auto pools = r->pools();
    int k = 0;
    for (auto& p : pools) {
      if (k >= n) break;
      rows[k] = {p.id.first,
                 p.id.second,
                 p.users,
                 p.windows,
                 p.captured ? 1 : 0,
                 p.set_aside_count,
                 p.set_aside_bytes,
                 p.state.live_bytes,
                 p.state.live_count,
                 p.state.reserved_bytes,
                 p.state.peak_reserved_bytes};
      ++k;
    }
    return static_cast<int>(pools.size());
  } catch (...) {
    return -1;
  }
}
}

// ---- what the hooks library reads for torch.cuda.memory_stats() and friends ----
extern "C" {
struct vramkit_torch_figures {
  std::int64_t allocated_current, allocated_peak, allocated_total, freed_total;
  std::int64_t count_current, count_peak, count_total, count_freed;
  std::int64_t reserved_current, reserved_peak, reserved_total, reserved_freed;
  std::int64_t ooms, retries, device_allocs, device_frees, largest_free;
};

// Graph pools included: PyTorch counts them in the device's figures too.
__attribute__((visibility("default"))) int vramkit_torch_stats(int device, vramkit_torch_figures* out) {
  try {
    capture_router& r = router(device);
    auto main = r.main();
    memory_state m = main->state();
    *out = {};
    out->allocated_current = static_cast<std::int64_t>(m.live_bytes);
    out->allocated_peak = static_cast<std::int64_t>(m.peak_live_bytes);
    out->count_current = static_cast<std::int64_t>(m.live_count);
    out->reserved_current = static_cast<std::int64_t>(m.reserved_bytes);
    out->reserved_peak = static_cast<std::int64_t>(m.peak_reserved_bytes);
    out->reserved_total = static_cast<std::int64_t>(m.upstream_alloc_bytes);
    out->reserved_freed = static_cast<std::int64_t>(m.upstream_free_bytes);
    out->ooms = static_cast<std::int64_t>(m.oom_count);
    out->retries = static_cast<std::int64_t>(m.retries);
    out->device_allocs = static_cast<std::int64_t>(m.upstream_allocs);
    out->device_frees = static_cast<std::int64_t>(m.upstream_frees);
    out->largest_free = static_cast<std::int64_t>(m.largest_free_bytes);
    if (auto* s = find_statistics(main.get())) {
      auto st = s->stats();
      out->allocated_current = st.allocated_bytes.current;
      out->allocated_peak = st.allocated_bytes.peak;
      out->allocated_total = st.allocated_bytes.allocated;
      out->freed_total = st.allocated_bytes.freed;
      out->count_peak = st.allocation_count.peak;
      out->count_total = st.allocation_count.allocated;
      out->count_freed = st.allocation_count.freed;
    }
    for (auto& p : r.pools()) {
      out->allocated_current += static_cast<std::int64_t>(p.state.live_bytes);
      out->count_current += static_cast<std::int64_t>(p.state.live_count);
      out->reserved_current += static_cast<std::int64_t>(p.state.reserved_bytes);
    }
    out->allocated_peak = std::max(out->allocated_peak, out->allocated_current);
    out->reserved_peak = std::max(out->reserved_peak, out->reserved_current);
    return 0;
  } catch (...) {
    return -1;
  }
}

__attribute__((visibility("default"))) void vramkit_torch_reset_peaks(int device) {
  try {
    router(device).main()->reset_peaks();
  } catch (...) {
  }
}

__attribute__((visibility("default"))) void vramkit_torch_incref_pool(int device, std::uint64_t first,
                                                                     std::uint64_t second) {
  try {
    router(device).incref_pool({first, second});
  } catch (const std::exception& e) {
    throw std::runtime_error(e.what());
  }
}

__attribute__((visibility("default"))) int vramkit_torch_pool_users(int device, std::uint64_t first,
                                                                   std::uint64_t second) {
  try {
    for (auto& p : router(device).pools())
      if (p.id.first == first && p.id.second == second) return p.users;
    return 0;
  } catch (...) {
    return -1;
  }
}

// Fills ptrs with up to n live pointers of the pool; returns how many it has.
__attribute__((visibility("default"))) long vramkit_torch_pool_live(int device, std::uint64_t first,
                                                                   std::uint64_t second, void** ptrs, long n) {
  try {
    auto live = router(device).live_pointers({first, second});
    for (long i = 0; i < n && i < static_cast<long>(live.size()); ++i) ptrs[i] = live[i];
    return static_cast<long>(live.size());
  } catch (...) {
    return -1;
  }
}

__attribute__((visibility("default"))) int vramkit_torch_set_fraction(int device, double fraction) {
  try {
    auto main = router(device).main();
    pool_resource* p = find_pool(main.get());
    if (!p) return -1;
    std::size_t fr = 0, total = 0;
    device_mem_info(device, fr, total);
    std::size_t limit = static_cast<std::size_t>(static_cast<double>(total) * fraction);
    if (limit == 0) limit = 1;  // 0 would mean "no limit"
    p->set_reserve_limit(limit);
    return 0;
  } catch (...) {
    return -1;
  }
}
}
