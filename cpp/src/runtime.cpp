#include "vramkit/runtime.hpp"

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>

#include "vramkit/emul/torch_caching.hpp"
#include "vramkit/mr/page_resource.hpp"
#include "vramkit/mr/tracking_adaptor.hpp"
#include "vramkit/platform/cuda.hpp"
#include "vramkit/platform/host_page_device.hpp"

namespace vramkit {

namespace {
std::mutex g_mu;
std::map<int, std::shared_ptr<device_resource>> g_current;
std::atomic<std::uint64_t> g_generation{1};
std::map<int, std::shared_ptr<page_device>> g_pages;
std::map<int, std::shared_ptr<stream_ops>> g_streams;

std::size_t host_capacity() {
  if (const char* c = std::getenv("VRAMKIT_HOST_CAPACITY")) {
    try {
      return parse_size(c);
    } catch (const invalid_argument& e) {
      throw invalid_argument(std::string("VRAMKIT_HOST_CAPACITY: ") + e.what());
    }
  }
  return host_page_device::default_capacity;
}
}  // namespace

const char* to_string(backend b) noexcept { return b == backend::host ? "host" : "cuda"; }

backend current_backend() {
  const char* e = std::getenv("VRAMKIT_BACKEND");
  std::string v = e ? e : "";
  if (v == "host") return backend::host;
  if (v == "cuda") {
    if (cuda::device_count() == 0)
      throw error("VRAMKIT_BACKEND=cuda but " + cuda::unavailable_reason());
    return backend::cuda;
  }
  if (!v.empty() && v != "auto")
    throw invalid_argument("VRAMKIT_BACKEND='" + v + "' is not one of host, cuda, auto");
  return cuda::device_count() > 0 ? backend::cuda : backend::host;
}

int device_count() { return current_backend() == backend::cuda ? cuda::device_count() : 1; }

void check_device(int device) {
  int n = device_count();
  if (device < 0 || device >= n)
    throw invalid_argument("unknown device " + std::to_string(device) + " (the " +
                           to_string(current_backend()) + " backend has " + std::to_string(n) + " device(s))");
}

std::shared_ptr<page_device> default_page_device(int device) {
  check_device(device);
  std::lock_guard<std::mutex> lk(g_mu);
  auto& p = g_pages[device];
  if (!p) {
    // The pool's pages are the device's pages: one size for both.
    std::size_t page = pool_options::from_env().page_size;
    if (current_backend() == backend::cuda)
      p = cuda::make_vmm_device(device, page);
    else
      p = std::make_shared<host_page_device>(host_capacity(), page ? page : std::size_t{2} << 20, device);
  }
  return p;
}

std::shared_ptr<stream_ops> default_stream_ops(int device) {
  check_device(device);
  std::lock_guard<std::mutex> lk(g_mu);
  auto& s = g_streams[device];
  if (!s) {
    if (current_backend() == backend::cuda)
      s = cuda::make_stream_ops(device);
    else
      s = std::make_shared<host_stream_ops>();
  }
  return s;
}

device_properties get_device_properties(int device) {
  check_device(device);
  if (current_backend() == backend::cuda) return cuda::properties(device);
  return default_page_device(device)->properties();
}

void device_mem_info(int device, std::size_t& fr, std::size_t& total) {
  check_device(device);
  if (current_backend() == backend::cuda) return cuda::mem_get_info(device, fr, total);
  auto p = default_page_device(device);
  total = p->capacity();
  fr = p->available();
}

std::shared_ptr<device_resource> current_resource_if_set(int device) {
  check_device(device);
  std::lock_guard<std::mutex> lk(g_mu);
  auto it = g_current.find(device);
  return it == g_current.end() ? nullptr : it->second;
}

std::shared_ptr<device_resource> current_resource(int device) {
  if (auto r = current_resource_if_set(device)) return r;
  auto pool = std::make_shared<pool_resource>(default_page_device(device), default_stream_ops(device),
                                              pool_options::from_env());
  auto r = std::make_shared<statistics_adaptor>(pool);
  std::lock_guard<std::mutex> lk(g_mu);
  auto& slot = g_current[device];
  if (!slot) slot = r;
  return slot;
}

void set_current_resource(std::shared_ptr<device_resource> r, int device) {
  check_device(device);
  if (!r) throw invalid_argument("set_current_resource: no resource given");
  if (!r->backs_memory())
    throw invalid_argument("set_current_resource: " + r->name() +
                           " emulates an allocator for replays; its addresses hold no memory");
  if (r->device() != device)
    throw invalid_argument("set_current_resource: the resource serves device " + std::to_string(r->device()) +
                           ", not device " + std::to_string(device));
  std::lock_guard<std::mutex> lk(g_mu);
  g_current[device] = std::move(r);
  g_generation.fetch_add(1, std::memory_order_acq_rel);
}

std::uint64_t current_resource_generation() noexcept { return g_generation.load(std::memory_order_acquire); }

device_resource* beneath_trackers(device_resource* r) {
  while (auto* t = dynamic_cast<tracking_adaptor*>(r)) r = t->upstream().get();
  return r;
}

statistics_adaptor* find_statistics(device_resource* r) { return dynamic_cast<statistics_adaptor*>(beneath_trackers(r)); }

pool_resource* find_pool(device_resource* r) {
  while ((r = beneath_trackers(r))) {
    if (auto* p = dynamic_cast<pool_resource*>(r)) return p;
    auto* s = dynamic_cast<statistics_adaptor*>(r);
    if (!s) return nullptr;
    r = s->upstream().get();
  }
  return nullptr;
}

void reset_runtime() {
  std::lock_guard<std::mutex> lk(g_mu);
  g_current.clear();
  g_generation.fetch_add(1, std::memory_order_acq_rel);
}

std::shared_ptr<device_resource> make_resource(const std::string& spec, int device) {
  check_device(device);
  auto colon = spec.find(':');
  std::string kind = spec.substr(0, colon);
  std::string conf = colon == std::string::npos ? "" : spec.substr(colon + 1);
  if (kind == "host") {
    if (!conf.empty()) throw invalid_argument("allocator 'host' takes no options");
    return std::make_shared<page_resource>(std::make_shared<host_page_device>(host_capacity(), 2 << 20, device));
  }
  if (kind == "vmm") return std::make_shared<page_resource>(cuda::make_vmm_device(device));
  if (kind == "cuda") return cuda::make_cuda_resource(device);
  if (kind == "cuda_async") {
    std::size_t thr = static_cast<std::size_t>(-1);
    if (!conf.empty()) {
      if (conf.rfind("release_threshold=", 0) != 0)
        throw invalid_argument("allocator 'cuda_async' takes release_threshold=SIZE, not '" + conf + "'");
      thr = parse_size(conf.substr(18));
    }
    return cuda::make_cuda_async_resource(device, thr);
  }
  if (kind == "pool" || kind == "vramkit") {
    pool_options o = pool_options::from_env();
    std::string rest = conf;
    std::string upstream = current_backend() == backend::cuda ? "vmm" : "host";
    // pool:upstream=cuda,growth_slack:0.05 ...
    if (rest.rfind("upstream=", 0) == 0) {
      auto comma = rest.find(',');
      upstream = rest.substr(9, comma == std::string::npos ? std::string::npos : comma - 9);
      rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
    }
    o.parse(rest);
    if (upstream == "host")
      return std::make_shared<pool_resource>(
          std::make_shared<host_page_device>(host_capacity(), o.page_size ? o.page_size : 2 << 20, device),
          std::make_shared<host_stream_ops>(), o);
    if (upstream == "vmm")
      return std::make_shared<pool_resource>(cuda::make_vmm_device(device, o.page_size), cuda::make_stream_ops(device), o);
    if (upstream == "cuda")
      return std::make_shared<pool_resource>(cuda::make_cuda_resource(device), cuda::make_stream_ops(device), o);
    if (upstream == "cuda_async")
      return std::make_shared<pool_resource>(cuda::make_cuda_async_resource(device, static_cast<std::size_t>(-1)),
                                             cuda::make_stream_ops(device), o);
    throw invalid_argument("pool upstream '" + upstream + "' is not one of host, vmm, cuda, cuda_async");
  }
  if (emul::is_torch_spec(spec)) return emul::make_torch_emulator(spec, 0);
  throw invalid_argument("unknown allocator '" + kind +
                         "' (known: vramkit, pool, host, vmm, cuda, cuda_async, torch-default, torch-expandable, torch:OPTIONS)");
}

}  // namespace vramkit
