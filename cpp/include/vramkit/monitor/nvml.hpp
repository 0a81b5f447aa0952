// Device and process memory as the driver sees it: NVML behind a small
// interface (the Python tools' simulated driver, vramkit.monitor.fake, has the
// same methods).
//
// NVML is loaded at run time (dlopen "libnvidia-ml.so.1"): nothing links
// against it, so the library still loads where no driver is installed, and
// only constructing an nvml_monitor fails there (nvml_unavailable).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "vramkit/error.hpp"

namespace vramkit::monitor {

// One device at one moment. Optional fields are empty where the device or
// driver does not report them (MIG, iGPUs, old drivers, no permission).
struct device_sample {
  unsigned index = 0;            // NVML index: may differ from the CUDA ordinal
  std::string name;              // "NVIDIA H200"
  std::string uuid;              // "GPU-..."
  std::string pci_bus_id;        // "00000000:19:00.0"
  std::uint64_t total_bytes = 0;
  std::uint64_t used_bytes = 0;  // allocated by contexts; excludes reserved when reserved is known
  std::uint64_t free_bytes = 0;
  std::optional<std::uint64_t> reserved_bytes;  // driver/firmware reserve (NVML memory info v2)
  std::optional<unsigned> utilization_gpu;      // % of time a kernel ran in the last sample period
  std::optional<unsigned> utilization_memory;   // % of time memory was read or written (not capacity)
  std::optional<unsigned> temperature_c;
  std::optional<double> power_w;
};

struct process_sample {
  unsigned pid = 0;                          // host PID (NVML knows no PID namespaces)
  std::optional<std::uint64_t> used_bytes;   // empty where NVML cannot say (WDDM, MIG without privileges)
  std::string name;                          // empty: unknown (callers may read /proc/PID/comm)
};

// Thrown when NVML cannot be used at all: no library, missing entry points,
// or nvmlInit failing (driver not loaded, no permission).
class nvml_unavailable : public error {
 public:
  using error::error;
};

// What a monitor offers. Implementations are safe to call from several threads.
class gpu_monitor {
 public:
  virtual ~gpu_monitor() = default;
  virtual std::string backend_name() const = 0;  // "nvml"
  virtual std::string driver_version() = 0;
  virtual unsigned device_count() = 0;
  // Throws invalid_argument for an index >= device_count().
  virtual device_sample device(unsigned index) = 0;
  // Processes with a compute context on the device, largest first.
  virtual std::vector<process_sample> processes(unsigned index) = 0;
  // Every device, in index order.
  virtual std::vector<device_sample> devices();
};

namespace detail {
struct nvml_api;
}

class nvml_monitor final : public gpu_monitor {
 public:
  // Loads libnvidia-ml.so.1 (once per process) and initializes NVML; the
  // NVML library is shared by all monitors and shut down with the last one.
  nvml_monitor();
  // Tests: take NVML's entry points from `lookup` (name -> function or null)
  // instead of dlopen; this instance initializes and shuts NVML down itself.
  using symbol_lookup = std::function<void*(const char* name)>;
  explicit nvml_monitor(symbol_lookup lookup);
  ~nvml_monitor() override;
  nvml_monitor(const nvml_monitor&) = delete;
  nvml_monitor& operator=(const nvml_monitor&) = delete;

  std::string backend_name() const override { return "nvml"; }
  std::string driver_version() override;
  unsigned device_count() override;
  device_sample device(unsigned index) override;
  std::vector<process_sample> processes(unsigned index) override;

  // Which process-list entry point this driver ended up with, for diagnostics:
  // "detail_list", "v2", "v1" or "" before the first call.
  std::string process_api(unsigned index);
  // Whether device() got the reserved split (memory info v2) on this device.
  bool has_memory_v2(unsigned index);

 private:
  struct device_state;
  void init_devices();
  device_state& state(unsigned index);

  std::shared_ptr<detail::nvml_api> api_;
  std::mutex mu_;
  std::vector<std::unique_ptr<device_state>> devices_;
};

// NVML (throws nvml_unavailable without a driver). The tools' simulated driver
// for tests is Python (vramkit.monitor.fake), not part of this library.
std::unique_ptr<gpu_monitor> open_monitor();

}  // namespace vramkit::monitor
