// NVML through dlopen. (The simulated driver of the tests is Python: vramkit.monitor.fake.)
// The NVML declarations below
// are our own, typed from the layouts NVML documents (nvml.h, R580/13.x);
// sizes are pinned with static_asserts because a wrong layout does not fail,
// it returns shuffled numbers (the R535 process-info break).
#include "vramkit/monitor/nvml.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string_view>

namespace vramkit::monitor {

std::vector<device_sample> gpu_monitor::devices() {
  std::vector<device_sample> out;
  unsigned n = device_count();
  out.reserve(n);
  for (unsigned i = 0; i < n; ++i) out.push_back(device(i));
  return out;
}

namespace {

// ---- NVML ABI (x86-64 / aarch64 Linux) -------------------------------------
using nvml_return = int;
using nvml_device = struct nvml_device_st*;
constexpr nvml_return k_success = 0;
constexpr nvml_return k_invalid_argument = 2;
constexpr nvml_return k_not_supported = 3;
constexpr nvml_return k_no_permission = 4;
constexpr nvml_return k_insufficient_size = 7;
constexpr nvml_return k_function_not_found = 13;
constexpr nvml_return k_argument_version_mismatch = 25;
constexpr unsigned long long k_value_not_available = ~0ull;

struct nvml_memory_v1 {
  unsigned long long total, free, used;  // used = reserved + allocated
};
struct nvml_memory_v2 {
  unsigned int version;
  unsigned long long total, reserved, free, used;  // used = allocated only
};
struct nvml_process_info_v1 {
  unsigned int pid;
  unsigned long long used_gpu_memory;
};
struct nvml_process_info_v2 {
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id, compute_instance_id;
};
struct nvml_process_detail_v1 {
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id, compute_instance_id;
  unsigned long long used_gpu_cc_protected_memory;
};
struct nvml_process_detail_list_v1 {
  unsigned int version;
  unsigned int mode;  // 0 compute, 1 graphics, 2 MPS
  unsigned int num_proc_array_entries;
  nvml_process_detail_v1* proc_array;
};
struct nvml_utilization {
  unsigned int gpu, memory;
};
struct nvml_pci_info {
  char bus_id_legacy[16];
  unsigned int domain, bus, device, pci_device_id, pci_sub_system_id;
  char bus_id[32];
};
struct nvml_temperature_v1 {
  unsigned int version;
  int sensor_type;
  int temperature;
};
static_assert(sizeof(nvml_memory_v2) == 40 && sizeof(nvml_memory_v1) == 24);
static_assert(sizeof(nvml_process_info_v1) == 16 && sizeof(nvml_process_info_v2) == 24);
static_assert(sizeof(nvml_process_detail_v1) == 32 && sizeof(nvml_process_detail_list_v1) == 24);
static_assert(sizeof(nvml_pci_info) == 68 && sizeof(nvml_temperature_v1) == 12);

// NVML_STRUCT_VERSION(data, ver) = sizeof(struct) | ver << 24.
constexpr unsigned k_memory_v2 = sizeof(nvml_memory_v2) | (2u << 24);                        // 0x02000028
constexpr unsigned k_detail_list_v1 = sizeof(nvml_process_detail_list_v1) | (1u << 24);      // 0x01000018
constexpr unsigned k_temperature_v1 = sizeof(nvml_temperature_v1) | (1u << 24);              // 0x0100000C
static_assert(k_memory_v2 == 0x02000028 && k_detail_list_v1 == 0x01000018 && k_temperature_v1 == 0x0100000C);

const char* return_name(nvml_return r) {
  switch (r) {
    case 0: return "NVML_SUCCESS";
    case 1: return "NVML_ERROR_UNINITIALIZED";
    case 2: return "NVML_ERROR_INVALID_ARGUMENT";
    case 3: return "NVML_ERROR_NOT_SUPPORTED";
    case 4: return "NVML_ERROR_NO_PERMISSION";
    case 6: return "NVML_ERROR_NOT_FOUND";
    case 7: return "NVML_ERROR_INSUFFICIENT_SIZE";
    case 9: return "NVML_ERROR_DRIVER_NOT_LOADED";
    case 10: return "NVML_ERROR_TIMEOUT";
    case 12: return "NVML_ERROR_LIBRARY_NOT_FOUND";
    case 13: return "NVML_ERROR_FUNCTION_NOT_FOUND";
    case 15: return "NVML_ERROR_GPU_IS_LOST";
    case 17: return "NVML_ERROR_OPERATING_SYSTEM";
    case 18: return "NVML_ERROR_LIB_RM_VERSION_MISMATCH";
    case 25: return "NVML_ERROR_ARGUMENT_VERSION_MISMATCH";
    case 28: return "NVML_ERROR_GPU_NOT_FOUND";
    default: return "NVML_ERROR";
  }
}

// Codes after which an older entry point is worth trying.
bool try_older(nvml_return r) {
  return r == k_not_supported || r == k_function_not_found || r == k_argument_version_mismatch ||
         r == k_invalid_argument;
}

template <class F>
void resolve(const nvml_monitor::symbol_lookup& lookup, F& fn, const char* name) {
  fn = reinterpret_cast<F>(lookup(name));
}

}  // namespace

namespace detail {

// The entry points of one loaded NVML, initialized once; NVML is shut down
// when the last monitor sharing it goes (nvmlInit/nvmlShutdown pair up).
struct nvml_api {
  nvml_return (*init)() = nullptr;
  nvml_return (*shutdown)() = nullptr;
  const char* (*error_string)(nvml_return) = nullptr;
  nvml_return (*driver_version)(char*, unsigned) = nullptr;
  nvml_return (*count)(unsigned*) = nullptr;
  nvml_return (*handle_by_index)(unsigned, nvml_device*) = nullptr;
  nvml_return (*name)(nvml_device, char*, unsigned) = nullptr;
  nvml_return (*uuid)(nvml_device, char*, unsigned) = nullptr;
  nvml_return (*pci_info_v3)(nvml_device, nvml_pci_info*) = nullptr;
  nvml_return (*memory_v1)(nvml_device, nvml_memory_v1*) = nullptr;
  nvml_return (*memory_v2)(nvml_device, nvml_memory_v2*) = nullptr;
  nvml_return (*utilization)(nvml_device, nvml_utilization*) = nullptr;
  nvml_return (*temperature)(nvml_device, int, unsigned*) = nullptr;
  nvml_return (*temperature_v)(nvml_device, nvml_temperature_v1*) = nullptr;
  nvml_return (*power_usage)(nvml_device, unsigned*) = nullptr;
  nvml_return (*process_detail_list)(nvml_device, nvml_process_detail_list_v1*) = nullptr;
  nvml_return (*compute_processes_v2)(nvml_device, unsigned*, nvml_process_info_v2*) = nullptr;
  nvml_return (*compute_processes_v1)(nvml_device, unsigned*, nvml_process_info_v1*) = nullptr;
  bool initialized = false;

  ~nvml_api() {
    if (initialized && shutdown) shutdown();
  }

  std::string describe(nvml_return r) const {
    std::string s = error_string ? error_string(r) : "";
    std::string n = return_name(r);
    return (s.empty() ? n : s + " (" + n + ")") + ", code " + std::to_string(r);
  }

  [[noreturn]] void fail(const char* call, unsigned index, nvml_return r) const {
    throw error(std::string(call) + " failed on device " + std::to_string(index) + ": " + describe(r));
  }
};

}  // namespace detail

namespace {

std::shared_ptr<detail::nvml_api> make_api(const nvml_monitor::symbol_lookup& lookup, const std::string& origin) {
  auto api = std::make_shared<detail::nvml_api>();
  auto& a = *api;
  // Versioned names first; the unversioned symbols are the oldest ABIs of the same calls.
  resolve(lookup, a.init, "nvmlInit_v2");
  if (!a.init) resolve(lookup, a.init, "nvmlInit");
  resolve(lookup, a.shutdown, "nvmlShutdown");
  resolve(lookup, a.error_string, "nvmlErrorString");
  resolve(lookup, a.driver_version, "nvmlSystemGetDriverVersion");
  resolve(lookup, a.count, "nvmlDeviceGetCount_v2");
  if (!a.count) resolve(lookup, a.count, "nvmlDeviceGetCount");
  resolve(lookup, a.handle_by_index, "nvmlDeviceGetHandleByIndex_v2");
  if (!a.handle_by_index) resolve(lookup, a.handle_by_index, "nvmlDeviceGetHandleByIndex");
  resolve(lookup, a.name, "nvmlDeviceGetName");
  resolve(lookup, a.uuid, "nvmlDeviceGetUUID");
  resolve(lookup, a.pci_info_v3, "nvmlDeviceGetPciInfo_v3");
  resolve(lookup, a.memory_v1, "nvmlDeviceGetMemoryInfo");
  resolve(lookup, a.memory_v2, "nvmlDeviceGetMemoryInfo_v2");
  resolve(lookup, a.utilization, "nvmlDeviceGetUtilizationRates");
  resolve(lookup, a.temperature, "nvmlDeviceGetTemperature");
  resolve(lookup, a.temperature_v, "nvmlDeviceGetTemperatureV");
  resolve(lookup, a.power_usage, "nvmlDeviceGetPowerUsage");
  resolve(lookup, a.process_detail_list, "nvmlDeviceGetRunningProcessDetailList");
  // _v3 is left out on purpose: R535.43-535.98 changed its struct to 32 bytes
  // without a version bump, so its layout cannot be known from the symbol alone.
  // The _v2 symbol has kept its 24-byte struct on every driver that exports it.
  resolve(lookup, a.compute_processes_v2, "nvmlDeviceGetComputeRunningProcesses_v2");
  resolve(lookup, a.compute_processes_v1, "nvmlDeviceGetComputeRunningProcesses");

  const char* missing = !a.init              ? "nvmlInit_v2"
                        : !a.shutdown        ? "nvmlShutdown"
                        : !a.count           ? "nvmlDeviceGetCount_v2"
                        : !a.handle_by_index ? "nvmlDeviceGetHandleByIndex_v2"
                        : (!a.memory_v1 && !a.memory_v2) ? "nvmlDeviceGetMemoryInfo"
                                                          : nullptr;
  if (missing)
    throw nvml_unavailable("NVML is not available: " + origin + " has no " + missing +
                           " (driver too old or not NVIDIA's library)");
  nvml_return r = a.init();
  if (r != k_success)
    throw nvml_unavailable("NVML is not available: nvmlInit failed: " + a.describe(r) +
                           " (is the NVIDIA kernel driver loaded and /dev/nvidia* accessible?)");
  a.initialized = true;
  return api;
}

// One dlopen per process; the handle is never closed (NVML may keep threads).
std::shared_ptr<detail::nvml_api> shared_api() {
  static std::mutex mu;
  static std::weak_ptr<detail::nvml_api> current;
  static void* handle = nullptr;
  std::lock_guard<std::mutex> lk(mu);
  if (auto p = current.lock()) return p;
  if (!handle) {
    dlerror();
    handle = dlopen("libnvidia-ml.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!handle) {
      const char* why = dlerror();
      throw nvml_unavailable(std::string("NVML is not available: libnvidia-ml.so.1 not found (is the NVIDIA "
                                         "driver installed?): ") +
                             (why ? why : "dlopen failed"));
    }
  }
  void* h = handle;
  auto p = make_api([h](const char* n) { return dlsym(h, n); }, "libnvidia-ml.so.1");
  current = p;
  return p;
}

std::string c_string(const char* buf, std::size_t cap) {
  return std::string(buf, strnlen(buf, cap));
}

}  // namespace

// ---- nvml_monitor ------------------------------------------------------------

enum class process_method { unknown, detail_list, v2, v1, none };

struct nvml_monitor::device_state {
  nvml_device handle = nullptr;
  bool identity_known = false;
  std::string name, uuid, pci_bus_id;
  std::uint64_t total = 0;
  bool memory_v2 = true;  // until the driver says otherwise
  bool temperature_v = true;
  bool utilization = true, temperature = true, power = true;  // false once NOT_SUPPORTED
  process_method processes = process_method::unknown;
};

nvml_monitor::nvml_monitor() : api_(shared_api()) { init_devices(); }

nvml_monitor::nvml_monitor(symbol_lookup lookup) : api_(make_api(lookup, "the NVML symbol table")) {
  init_devices();
}

nvml_monitor::~nvml_monitor() = default;

void nvml_monitor::init_devices() {
  unsigned n = 0;
  nvml_return r = api_->count(&n);
  if (r != k_success) throw nvml_unavailable("NVML is not available: nvmlDeviceGetCount failed: " + api_->describe(r));
  devices_.reserve(n);
  for (unsigned i = 0; i < n; ++i) devices_.push_back(std::make_unique<device_state>());
}

nvml_monitor::device_state& nvml_monitor::state(unsigned index) {
  if (index >= devices_.size())
    throw invalid_argument("unknown device " + std::to_string(index) + " (NVML reports " +
                           std::to_string(devices_.size()) + " device(s))");
  device_state& d = *devices_[index];
  if (!d.handle) {
    // Handles are cached: looking them up per sample is what made gpustat -i expensive.
    nvml_return r = api_->handle_by_index(index, &d.handle);
    if (r != k_success) api_->fail("nvmlDeviceGetHandleByIndex", index, r);
  }
  if (!d.identity_known) {
    char buf[96] = {};
    if (api_->name && api_->name(d.handle, buf, sizeof buf) == k_success) d.name = c_string(buf, sizeof buf);
    std::memset(buf, 0, sizeof buf);
    if (api_->uuid && api_->uuid(d.handle, buf, sizeof buf) == k_success) d.uuid = c_string(buf, sizeof buf);
    nvml_pci_info pci{};
    if (api_->pci_info_v3 && api_->pci_info_v3(d.handle, &pci) == k_success)
      d.pci_bus_id = c_string(pci.bus_id, sizeof pci.bus_id);
    d.identity_known = true;
  }
  return d;
}

std::string nvml_monitor::driver_version() {
  char buf[80] = {};
  if (!api_->driver_version || api_->driver_version(buf, sizeof buf) != k_success) return "";
  return c_string(buf, sizeof buf);
}

unsigned nvml_monitor::device_count() { return static_cast<unsigned>(devices_.size()); }

device_sample nvml_monitor::device(unsigned index) {
  std::lock_guard<std::mutex> lk(mu_);
  device_state& d = state(index);
  device_sample s;
  s.index = index;
  s.name = d.name;
  s.uuid = d.uuid;
  s.pci_bus_id = d.pci_bus_id;

  nvml_return r = k_not_supported;
  if (d.memory_v2 && api_->memory_v2) {
    nvml_memory_v2 m{};
    m.version = k_memory_v2;
    r = api_->memory_v2(d.handle, &m);
    if (r == k_success) {
      s.total_bytes = m.total;
      s.reserved_bytes = m.reserved;
      s.free_bytes = m.free;
      s.used_bytes = m.used;
    } else if (try_older(r)) {
      d.memory_v2 = false;  // pre-515 drivers: never ask again
    }
  } else {
    d.memory_v2 = false;
  }
  if (r != k_success && !d.memory_v2) {
    nvml_memory_v1 m{};
    r = api_->memory_v1 ? api_->memory_v1(d.handle, &m) : k_function_not_found;
    if (r == k_success) {
      s.total_bytes = m.total;
      s.free_bytes = m.free;
      s.used_bytes = m.used;  // includes the driver reserve; the split is unknown here
    }
  }
  // iGPUs / unified memory answer NOT_SUPPORTED: report zeros rather than fail.
  if (r != k_success && r != k_not_supported) api_->fail("nvmlDeviceGetMemoryInfo", index, r);
  if (r == k_success) d.total = s.total_bytes;

  if (d.utilization && api_->utilization) {
    nvml_utilization u{};
    r = api_->utilization(d.handle, &u);
    if (r == k_success) {
      s.utilization_gpu = u.gpu;
      s.utilization_memory = u.memory;
    } else if (r == k_not_supported || r == k_function_not_found) {
      d.utilization = false;  // MIG-enabled GPUs
    }
  }
  if (d.temperature) {
    r = k_function_not_found;
    if (d.temperature_v && api_->temperature_v) {
      nvml_temperature_v1 t{};
      t.version = k_temperature_v1;
      t.sensor_type = 0;  // NVML_TEMPERATURE_GPU
      r = api_->temperature_v(d.handle, &t);
      if (r == k_success && t.temperature >= 0) s.temperature_c = static_cast<unsigned>(t.temperature);
      if (try_older(r)) d.temperature_v = false;
    }
    if (r != k_success && api_->temperature) {
      unsigned t = 0;
      r = api_->temperature(d.handle, 0, &t);
      if (r == k_success) s.temperature_c = t;
    }
    if (r == k_not_supported || r == k_function_not_found) d.temperature = false;
  }
  if (d.power && api_->power_usage) {
    unsigned mw = 0;
    r = api_->power_usage(d.handle, &mw);
    if (r == k_success) s.power_w = mw / 1000.0;
    else if (r == k_not_supported || r == k_function_not_found) d.power = false;
  }
  return s;
}

namespace {

// The two-call pattern: ask with room for `count`, grow on INSUFFICIENT_SIZE
// with headroom for processes that start in between, a bounded number of times.
template <class Entry, class Call>
nvml_return list_with_retry(Call call, std::vector<Entry>& out) {
  unsigned capacity = 0;
  for (int attempt = 0; attempt < 8; ++attempt) {
    out.assign(capacity, Entry{});
    unsigned n = capacity;
    nvml_return r = call(&n, out.empty() ? nullptr : out.data());
    if (r == k_success) {
      out.resize(std::min(n, capacity));
      return r;
    }
    if (r != k_insufficient_size) return r;
    capacity = n * 2 + 8;
  }
  return k_insufficient_size;
}

// A layout mismatch shows as pid 0 or usage beyond the device (pid and
// usedGpuMemory swapped, or entries shifted by the struct size).
bool plausible(const std::vector<process_sample>& ps, std::uint64_t total) {
  for (auto& p : ps) {
    if (p.pid == 0 || p.pid > 4194304) return false;  // PID_MAX_LIMIT on 64-bit Linux
    if (total && p.used_bytes && *p.used_bytes > total) return false;
  }
  return true;
}

template <class Entry>
std::vector<process_sample> to_samples(const std::vector<Entry>& in) {
  std::vector<process_sample> out;
  out.reserve(in.size());
  for (auto& e : in) {
    process_sample p;
    p.pid = e.pid;
    if (e.used_gpu_memory != k_value_not_available) p.used_bytes = e.used_gpu_memory;
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace

std::vector<process_sample> nvml_monitor::processes(unsigned index) {
  std::lock_guard<std::mutex> lk(mu_);
  device_state& d = state(index);
  if (!d.total && api_->memory_v1) {
    nvml_memory_v1 m{};
    if (api_->memory_v1(d.handle, &m) == k_success) d.total = m.total;
  }
  std::vector<process_sample> out;
  nvml_return r = k_function_not_found;
  // Newest first; each method that is missing, refused or implausible is dropped for good.
  while (d.processes != process_method::none) {
    process_method m = d.processes == process_method::unknown ? process_method::detail_list : d.processes;
    if (m == process_method::detail_list && api_->process_detail_list) {
      std::vector<nvml_process_detail_v1> buf;
      r = list_with_retry(
          [&](unsigned* n, nvml_process_detail_v1* p) {
            nvml_process_detail_list_v1 l{};
            l.version = k_detail_list_v1;
            l.mode = 0;  // compute
            l.num_proc_array_entries = *n;
            l.proc_array = p;
            nvml_return rr = api_->process_detail_list(d.handle, &l);
            *n = l.num_proc_array_entries;
            return rr;
          },
          buf);
      if (r == k_success) out = to_samples(buf);
    } else if (m == process_method::v2 && api_->compute_processes_v2) {
      std::vector<nvml_process_info_v2> buf;
      r = list_with_retry(
          [&](unsigned* n, nvml_process_info_v2* p) { return api_->compute_processes_v2(d.handle, n, p); }, buf);
      if (r == k_success) out = to_samples(buf);
    } else if (m == process_method::v1 && api_->compute_processes_v1) {
      std::vector<nvml_process_info_v1> buf;
      r = list_with_retry(
          [&](unsigned* n, nvml_process_info_v1* p) { return api_->compute_processes_v1(d.handle, n, p); }, buf);
      if (r == k_success) out = to_samples(buf);
    } else {
      r = k_function_not_found;
    }
    if (r == k_success && plausible(out, d.total)) {
      d.processes = m;
      break;
    }
    if (r != k_success && !try_older(r)) {
      d.processes = m;  // a real error (no permission, GPU lost): keep the method, report below
      break;
    }
    out.clear();
    d.processes = m == process_method::detail_list ? process_method::v2
                  : m == process_method::v2        ? process_method::v1
                                                : process_method::none;
  }
  if (d.processes == process_method::none || r == k_no_permission) return {};
  if (r != k_success) api_->fail("nvmlDeviceGetComputeRunningProcesses", index, r);
  std::stable_sort(out.begin(), out.end(), [](const process_sample& a, const process_sample& b) {
    return a.used_bytes.value_or(0) > b.used_bytes.value_or(0);
  });
  return out;
}

std::string nvml_monitor::process_api(unsigned index) {
  std::lock_guard<std::mutex> lk(mu_);
  switch (state(index).processes) {
    case process_method::detail_list: return "detail_list";
    case process_method::v2: return "v2";
    case process_method::v1: return "v1";
    case process_method::none: return "none";
    default: return "";
  }
}

bool nvml_monitor::has_memory_v2(unsigned index) {
  std::lock_guard<std::mutex> lk(mu_);
  return state(index).memory_v2 && api_->memory_v2;
}

std::unique_ptr<gpu_monitor> open_monitor() { return std::make_unique<nvml_monitor>(); }

}  // namespace vramkit::monitor
