// Built when the CUDA toolkit is absent: every entry point says so.
#include "vramkit/platform/cuda.hpp"

namespace vramkit::cuda {
namespace {
[[noreturn]] void none() { throw error("vramkit was built without CUDA support"); }
}  // namespace
bool built_with_cuda() noexcept { return false; }
int device_count() noexcept { return 0; }
std::string unavailable_reason() { return "vramkit was built without CUDA support"; }
void check_device(int) { none(); }
device_properties properties(int) { none(); }
void mem_get_info(int, std::size_t&, std::size_t&) { none(); }
void set_device(int) { none(); }
int current_device() { none(); }
stream_t create_stream(int) { none(); }
void destroy_stream(stream_t) noexcept {}
void synchronize_stream(stream_t) { none(); }
void synchronize_device(int) { none(); }
bool stream_is_capturing(stream_t) noexcept { return false; }
std::vector<int> peer_devices(int) { return {}; }
int relax_capture_mode() noexcept { return 0; }
void restore_capture_mode(int) noexcept {}
void copy_to_device(void*, const void*, std::size_t) { none(); }
void copy_to_host(void*, const void*, std::size_t) { none(); }
void memset_async(void*, int, std::size_t, stream_t) { none(); }
std::shared_ptr<stream_ops> make_stream_ops(int) { none(); }
std::shared_ptr<page_device> make_vmm_device(int, std::size_t) { none(); }
std::shared_ptr<device_resource> make_cuda_resource(int) { none(); }
std::shared_ptr<device_resource> make_cuda_async_resource(int, std::size_t) { none(); }
}  // namespace vramkit::cuda
