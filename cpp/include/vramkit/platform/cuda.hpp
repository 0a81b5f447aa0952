// The CUDA runtime and driver behind one small seam. Every CUDA call of the
// library lives in cpp/src/platform/cuda/; a build without the toolkit gets
// versions that report "no CUDA" so everything else still works on the host.
#pragma once
#include <cstddef>
#include <memory>
#include <vector>

#include "vramkit/platform/device_properties.hpp"
#include "vramkit/platform/page_device.hpp"
#include "vramkit/platform/stream_ops.hpp"
#include "vramkit/resource.hpp"

namespace vramkit::cuda {

bool built_with_cuda() noexcept;
// Number of usable devices; 0 without a driver or device (never throws).
int device_count() noexcept;
// Why device_count() is 0, or "" when devices exist.
std::string unavailable_reason();
void check_device(int device);  // throws invalid_argument for an unknown device
device_properties properties(int device);
void mem_get_info(int device, std::size_t& free, std::size_t& total);
void set_device(int device);
int current_device();
stream_t create_stream(int device);
void destroy_stream(stream_t s) noexcept;
void synchronize_stream(stream_t s);
void synchronize_device(int device);
// Whether work queued on `s` is being captured into a CUDA graph (legal to
// ask during a capture; never throws: an error reads as "not capturing").
bool stream_is_capturing(stream_t s) noexcept;
// Devices whose kernels may read and write `device`'s memory from vramkit's
// pool: every peer that cudaDeviceCanAccessPeer allows, unless
// VRAMKIT_PEER_ACCESS=off. Empty on one GPU. Throws invalid_argument for
// another value of the variable.
std::vector<int> peer_devices(int device);
// Sets the calling thread's stream-capture mode to relaxed (so that calls a
// graph capture in "global" mode forbids, such as mapping memory, are
// allowed from this thread); returns the mode to restore.
int relax_capture_mode() noexcept;
void restore_capture_mode(int mode) noexcept;
void copy_to_device(void* dst, const void* src, std::size_t bytes);
void copy_to_host(void* dst, const void* src, std::size_t bytes);
void memset_async(void* dst, int value, std::size_t bytes, stream_t s);

std::shared_ptr<stream_ops> make_stream_ops(int device);
// Page-granular physical memory through cuMemCreate / cuMemMap, in pages of
// page_size bytes (0: the driver's minimum granularity, 2 MiB). Each page is
// one handle: the driver charges per handle mapped, so larger pages move
// more memory per call. Throws invalid_argument when page_size is not a
// multiple of the minimum granularity.
std::shared_ptr<page_device> make_vmm_device(int device, std::size_t page_size = 0);
// cudaMalloc / cudaFree.
std::shared_ptr<device_resource> make_cuda_resource(int device);
// cudaMallocAsync on a memory pool of its own; cached bytes above
// release_threshold go back to the driver at each synchronization.
std::shared_ptr<device_resource> make_cuda_async_resource(int device, std::size_t release_threshold);

}  // namespace vramkit::cuda
