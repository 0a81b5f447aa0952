// The two C symbols torch.cuda.memory.CUDAPluggableAllocator loads. They
// allocate from vramkit's current resource of the device, the same one the
// Python module uses (both link the one shared core library).
#include <cstddef>
#include <cstdio>
#include <stdexcept>

#include "vramkit/runtime.hpp"

extern "C" {

__attribute__((visibility("default"))) void* vramkit_torch_alloc(std::size_t size, int device, void* stream) {
  try {
    return vramkit::current_resource(device)->allocate(size, reinterpret_cast<vramkit::stream_t>(stream));
  } catch (const std::exception& e) {
    // PyTorch does not check the returned pointer: a null would become a tensor
    // at address 0. Throwing reaches Python as a RuntimeError with this message.
    throw std::runtime_error(e.what());
  }
}

__attribute__((visibility("default"))) void vramkit_torch_free(void* ptr, std::size_t size, int device, void* stream) {
  try {
    vramkit::current_resource(device)->deallocate(ptr, size, reinterpret_cast<vramkit::stream_t>(stream));
  } catch (...) {
  }
}

// record_stream from Python reaches the pool through vramkit.torch (tensor
// storage pointers are looked up there).
__attribute__((visibility("default"))) int vramkit_torch_record_stream(void* ptr, int device, void* stream) {
  try {
    vramkit::current_resource(device)->record_stream(ptr, reinterpret_cast<vramkit::stream_t>(stream));
    return 0;
  } catch (...) {
    return -1;
  }
}
}
