// What the CUDA driver charges for mapping physical memory, by how the memory
// is cut: one 2 MiB handle per page, or 2 MiB slices of larger handles
// (cuMemMap with an offset into the handle). The pool moves memory a page at a
// time; if the driver's cost is per handle rather than per mapping, slices of
// large handles would move at a fraction of the price.
//
//   vramkit_vmm_slices [--pages N] [--handle-mib M] [--repeat R]
//
// Prints microseconds per 2 MiB page for each call, best of R runs.
#include <cuda.h>

#include "vmm_common.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {
using clk = std::chrono::steady_clock;

double us(clk::time_point t0, std::size_t n) {
  return std::chrono::duration<double, std::micro>(clk::now() - t0).count() / static_cast<double>(n);
}

struct result {
  double map = 1e30, access = 1e30, unmap = 1e30;
};
}  // namespace

int main(int argc, char** argv) {
  std::size_t pages = 256, handle_mib = 64, repeat = 5;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--pages" && i + 1 < argc) pages = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--handle-mib" && i + 1 < argc) handle_mib = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--repeat" && i + 1 < argc) repeat = std::strtoull(argv[++i], nullptr, 10);
    else {
      std::fprintf(stderr, "usage: vramkit_vmm_slices [--pages N] [--handle-mib M] [--repeat R]\n");
      return 2;
    }
  }
  vmm_bench::device0 d;
  const CUmemAllocationProp prop = d.prop;
  const std::size_t page = d.g;  // 2 MiB on current GPUs
  const std::size_t big = handle_mib << 20;
  const std::size_t per_big = big / page;
  pages = (pages + per_big - 1) / per_big * per_big;
  const CUmemAccessDesc acc = d.acc;

  // Pages land at every other page-sized slot of a reserved range, as a pool's
  // scattered free pages would: no two neighbours share a mapping call.
  CUdeviceptr va = 0;
  CK(cuMemAddressReserve(&va, 2 * pages * page, page, 0, 0));
  auto slot = [&](std::size_t i) { return va + 2 * i * page; };

  std::vector<CUmemGenericAllocationHandle> small(pages), large(pages / per_big);
  for (auto& h : small) CK(cuMemCreate(&h, page, &prop, 0));
  for (auto& h : large) CK(cuMemCreate(&h, big, &prop, 0));

  auto run = [&](bool slices) {
    result r;
    for (std::size_t k = 0; k < repeat; ++k) {
      auto t0 = clk::now();
      for (std::size_t i = 0; i < pages; ++i) {
        if (slices) CK(cuMemMap(slot(i), page, (i % per_big) * page, large[i / per_big], 0));
        else CK(cuMemMap(slot(i), page, 0, small[i], 0));
      }
      r.map = std::min(r.map, us(t0, pages));
      t0 = clk::now();
      for (std::size_t i = 0; i < pages; ++i) CK(cuMemSetAccess(slot(i), page, &acc, 1));
      r.access = std::min(r.access, us(t0, pages));
      t0 = clk::now();
      for (std::size_t i = 0; i < pages; ++i) CK(cuMemUnmap(slot(i), page));
      r.unmap = std::min(r.unmap, us(t0, pages));
    }
    return r;
  };
  // Contiguous: each large handle mapped whole at once, access set once per handle.
  auto run_whole = [&]() {
    result r;
    for (std::size_t k = 0; k < repeat; ++k) {
      auto t0 = clk::now();
      for (std::size_t j = 0; j < large.size(); ++j) CK(cuMemMap(va + j * big, big, 0, large[j], 0));
      r.map = std::min(r.map, us(t0, pages));
      t0 = clk::now();
      for (std::size_t j = 0; j < large.size(); ++j) CK(cuMemSetAccess(va + j * big, big, &acc, 1));
      r.access = std::min(r.access, us(t0, pages));
      t0 = clk::now();
      for (std::size_t j = 0; j < large.size(); ++j) CK(cuMemUnmap(va + j * big, big));
      r.unmap = std::min(r.unmap, us(t0, pages));
    }
    return r;
  };
  result a = run(false), b = run(true), c = run_whole();
  std::printf("vmm mapping cost, us per %zu MiB page, %zu pages, best of %zu\n", page >> 20, pages, repeat);
  std::printf("%-44s %8s %10s %8s %8s\n", "how", "map", "set-access", "unmap", "total");
  std::printf("%-44s %8.2f %10.2f %8.2f %8.2f\n", "2 MiB handles, one page a call", a.map, a.access, a.unmap,
              a.map + a.access + a.unmap);
  char label[96];
  std::snprintf(label, sizeof label, "2 MiB slices of %zu MiB handles, one a call", handle_mib);
  std::printf("%-44s %8.2f %10.2f %8.2f %8.2f\n", label, b.map, b.access, b.unmap, b.map + b.access + b.unmap);
  std::snprintf(label, sizeof label, "%zu MiB handles mapped whole", handle_mib);
  std::printf("%-44s %8.2f %10.2f %8.2f %8.2f\n", label, c.map, c.access, c.unmap, c.map + c.access + c.unmap);
  for (auto h : small) CK(cuMemRelease(h));
  for (auto h : large) CK(cuMemRelease(h));
  CK(cuMemAddressFree(va, 2 * pages * page));
  return 0;
}
