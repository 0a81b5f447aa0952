// The memory hierarchy of a device, from cudaGetDeviceProperties on a GPU or
// the simulated values of the host device.
#pragma once
#include <cstddef>
#include <string>

namespace vramkit {

struct device_properties {
  std::string name;
  int device = 0;
  bool simulated = false;
  std::size_t global_memory_bytes = 0;
  std::size_t constant_memory_bytes = 0;
  std::size_t shared_memory_per_block_bytes = 0;
  std::size_t shared_memory_per_sm_bytes = 0;
  std::size_t l2_cache_bytes = 0;
  int sm_count = 0;
  int memory_bus_width_bits = 0;
  int memory_clock_khz = 0;
  int compute_capability_major = 0;
  int compute_capability_minor = 0;
  std::size_t allocation_granularity = 0;
  // 2 (double data rate) * clock * bus width / 8, in bytes per second.
  double theoretical_bandwidth_bytes_per_s() const {
    return 2.0 * memory_clock_khz * 1000.0 * (memory_bus_width_bits / 8.0);
  }
};

}  // namespace vramkit
