// What the driver-level page benchmarks share: a failed call ends the
// program with its name, and device 0's primary context, page properties,
// granularity and read/write access, set up once.
#pragma once
#include <cuda.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>

namespace vmm_bench {

inline void check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const char* name = "?";
  cuGetErrorName(r, &name);
  std::fprintf(stderr, "%s failed: %s\n", what, name);
  std::exit(1);
}
#define CK(call) ::vmm_bench::check((call), #call)

struct device0 {
  CUdevice dev{};
  CUcontext ctx{};
  CUmemAllocationProp prop{};
  CUmemAccessDesc acc{};
  std::size_t g = 0;  // the granularity: 2 MiB on current GPUs

  device0() {
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CK(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
};

}  // namespace vmm_bench
