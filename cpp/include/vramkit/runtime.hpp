// Process-wide state: which backend serves devices, and the current resource
// of each device (what vramkit.alloc and the framework shims allocate from).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "vramkit/mr/pool_resource.hpp"
#include "vramkit/mr/statistics_adaptor.hpp"
#include "vramkit/platform/page_device.hpp"
#include "vramkit/platform/stream_ops.hpp"
#include "vramkit/resource.hpp"

namespace vramkit {

enum class backend { host, cuda };

// VRAMKIT_BACKEND=host|cuda forces one; otherwise cuda when a device is there.
// Throws invalid_argument for an unknown value, error if cuda is forced and absent.
backend current_backend();
const char* to_string(backend b) noexcept;
int device_count();  // of the current backend (host: 1)
void check_device(int device);
device_properties get_device_properties(int device);
// Free and total bytes of the device (host: capacity minus pages created).
void device_mem_info(int device, std::size_t& free, std::size_t& total);

// The physical-page device behind `device` (host simulation or vmm), shared.
std::shared_ptr<page_device> default_page_device(int device);
std::shared_ptr<stream_ops> default_stream_ops(int device);

// statistics(pool(default page device)), created on first use with
// pool_options::from_env().
std::shared_ptr<device_resource> current_resource(int device);
void set_current_resource(std::shared_ptr<device_resource> r, int device);
// Bumped by every set_current_resource and reset_runtime: holders of a
// device's current resource (the PyTorch shim) see with one load that it changed.
std::uint64_t current_resource_generation() noexcept;
// The device's current resource if one is set (or was made), else null; makes none.
std::shared_ptr<device_resource> current_resource_if_set(int device);
// r with the tracking adaptors over it peeled off (they hand out their
// upstream's pointers unchanged, so frees may go through them or around them).
device_resource* beneath_trackers(device_resource* r);
// The statistics adaptor / pool inside a resource chain (through tracking
// adaptors), or null.
statistics_adaptor* find_statistics(device_resource* r);
pool_resource* find_pool(device_resource* r);
// Drops every device's current resource (tests; frees nothing still live).
void reset_runtime();

// Upstream / allocator by name: "host", "vmm", "cuda", "cuda_async",
// "pool" (over the default page device) - see docs/configuration.md.
std::shared_ptr<device_resource> make_resource(const std::string& spec, int device);

}  // namespace vramkit
