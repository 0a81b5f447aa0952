// What the page device's calls cost: create, map (one page, or a run of
// pages in one call), unmap (one page, or a run), destroy. On the GPU these
// are cuMemCreate / cuMemMap + cuMemSetAccess / cuMemUnmap / cuMemRelease, and
// they set the price of every page the pool remaps.
//
// --sizes 2,4,8,16,20,64 (MiB) also prints, for handles of each size, what
// making memory costs per handle and per GiB: create + map with access
// (one handle, mapped whole) against cudaMalloc of the same size, and giving
// it back (unmap + release against cudaFree), over --total MiB (vmm only).
// It says how large the handles must be for a first step that maps every
// byte to cost what cudaMalloc's would.
//
// --threads 1,2,4 also splits the pages over that many threads, each making
// its own calls (one page a call), and prints the wall time per page of each
// phase: whether the driver's calls run side by side, which decides whether
// pages made ahead on a helper thread could keep up with a step's growth.
//
//   page_cost [--device host|vmm] [--pages N] [--repeat R] [--threads T,...] [--sizes MiB,...] [--total MiB]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "vramkit/platform/cuda.hpp"
#include "vramkit/platform/host_page_device.hpp"

using clk = std::chrono::steady_clock;

static double us_since(clk::time_point t0, std::size_t n) {
  return std::chrono::duration<double, std::micro>(clk::now() - t0).count() / static_cast<double>(n);
}

int main(int argc, char** argv) {
  std::string kind = "host";
  std::size_t n = 256, repeat = 5;
  std::vector<std::size_t> threads, sizes;
  std::size_t total_mib = 2048;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--device" && i + 1 < argc) kind = argv[++i];
    else if (a == "--pages" && i + 1 < argc) n = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--repeat" && i + 1 < argc) repeat = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--total" && i + 1 < argc) total_mib = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--sizes" && i + 1 < argc) {
      for (char* p = argv[++i]; *p;) {
        char* end = nullptr;
        std::size_t m = std::strtoull(p, &end, 10);
        if (end == p || m == 0) {
          std::fprintf(stderr, "page_cost: --sizes takes sizes in MiB, comma-separated\n");
          return 2;
        }
        sizes.push_back(m);
        p = *end == ',' ? end + 1 : end;
      }
    } else if (a == "--threads" && i + 1 < argc) {
      for (char* p = argv[++i]; *p;) {
        char* end = nullptr;
        std::size_t t = std::strtoull(p, &end, 10);
        if (end == p || t == 0 || t > 64) {
          std::fprintf(stderr, "page_cost: --threads takes numbers from 1 to 64, comma-separated\n");
          return 2;
        }
        threads.push_back(t);
        p = *end == ',' ? end + 1 : end;
      }
    } else {
      std::fprintf(stderr, "usage: page_cost [--device host|vmm] [--pages N] [--repeat R] [--threads T,...] [--sizes MiB,...] [--total MiB]\n");
      return 2;
    }
  }
  if (!sizes.empty() && kind != "vmm") {
    std::fprintf(stderr, "page_cost: --sizes needs --device vmm (it compares with cudaMalloc)\n");
    return 2;
  }
  std::shared_ptr<vramkit::page_device> dev;
  try {
    dev = kind == "vmm" ? vramkit::cuda::make_vmm_device(0) : std::make_shared<vramkit::host_page_device>();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "page_cost: %s\n", e.what());
    return 1;
  }
  const std::size_t g = dev->granularity();
  std::uintptr_t va = dev->reserve(n * g);
  std::vector<vramkit::page_handle> h(n);
  std::printf("device %s, page %zu KiB, %zu pages, best of %zu (us per page)\n", dev->name().c_str(), g >> 10, n,
              repeat);
  double best[6];
  std::fill(best, best + 6, 1e300);
  for (std::size_t r = 0; r < repeat; ++r) {
    auto t0 = clk::now();
    for (auto& x : h) x = dev->create();
    best[0] = std::min(best[0], us_since(t0, n));
    t0 = clk::now();
    for (std::size_t i = 0; i < n; ++i) dev->map(va + i * g, &h[i], 1);
    best[1] = std::min(best[1], us_since(t0, n));
    t0 = clk::now();
    for (std::size_t i = 0; i < n; ++i) dev->unmap(va + i * g, 1);
    best[2] = std::min(best[2], us_since(t0, n));
    t0 = clk::now();
    dev->map(va, h.data(), n);
    best[3] = std::min(best[3], us_since(t0, n));
    t0 = clk::now();
    dev->unmap(va, n);
    best[4] = std::min(best[4], us_since(t0, n));
    t0 = clk::now();
    for (auto x : h) dev->destroy(x);
    best[5] = std::min(best[5], us_since(t0, n));
  }
  const char* names[6] = {"create", "map, one page a call", "unmap, one page a call", "map, whole run in one call",
                          "unmap, whole run in one call", "destroy"};
  std::printf("| call | us per page |\n|---|---|\n");
  for (int i = 0; i < 6; ++i) std::printf("| %s | %.2f |\n", names[i], best[i]);

  if (!threads.empty()) {
    // Each phase: T threads, thread k takes pages k, k+T, ...; wall time per page.
    auto phase = [&](std::size_t t, auto&& body) {
      auto t0 = clk::now();
      std::vector<std::thread> pool;
      for (std::size_t k = 0; k < t; ++k)
        pool.emplace_back([&, k] {
          for (std::size_t i = k; i < n; i += t) body(i);
        });
      for (auto& th : pool) th.join();
      return us_since(t0, n);
    };
    std::printf("\n| threads | create | map + set access | unmap | destroy | create + map, all |\n|---|---|---|---|---|---|\n");
    for (std::size_t t : threads) {
      double b[5];
      std::fill(b, b + 5, 1e300);
      for (std::size_t r = 0; r < repeat; ++r) {
        b[0] = std::min(b[0], phase(t, [&](std::size_t i) { h[i] = dev->create(); }));
        b[1] = std::min(b[1], phase(t, [&](std::size_t i) { dev->map(va + i * g, &h[i], 1); }));
        b[2] = std::min(b[2], phase(t, [&](std::size_t i) { dev->unmap(va + i * g, 1); }));
        b[3] = std::min(b[3], phase(t, [&](std::size_t i) { dev->destroy(h[i]); }));
        b[4] = std::min(b[4], phase(t, [&](std::size_t i) {
          h[i] = dev->create();
          dev->map(va + i * g, &h[i], 1);
        }));
        phase(t, [&](std::size_t i) {
          dev->unmap(va + i * g, 1);
          dev->destroy(h[i]);
        });
      }
      std::printf("| %zu | %.2f | %.2f | %.2f | %.2f | %.2f |\n", t, b[0], b[1], b[2], b[3], b[4]);
    }
  }
  dev->unreserve(va, n * g);
  if (!sizes.empty()) {
    std::shared_ptr<vramkit::device_resource> cm;
    try {
      cm = vramkit::cuda::make_cuda_resource(0);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "page_cost: %s\n", e.what());
      return 1;
    }
    std::printf("\nHandles of each size over %zu MiB, best of %zu: us per handle (per GiB)\n\n", total_mib, repeat);
    std::printf("| handle MiB | handles | create + map + access | cudaMalloc | unmap + release | cudaFree |\n"
                "|---|---|---|---|---|---|\n");
    for (std::size_t mib : sizes) {
      const std::size_t bytes = mib << 20;
      if (bytes % g) {
        std::printf("| %zu | not a multiple of the %zu KiB page |\n", mib, g >> 10);
        continue;
      }
      const std::size_t pages = bytes / g, k = std::max<std::size_t>(1, total_mib / mib);
      std::uintptr_t base = dev->reserve(k * bytes);
      std::vector<vramkit::page_handle> hs(k);
      std::vector<void*> ps(k);
      double b[4];
      std::fill(b, b + 4, 1e300);
      for (std::size_t r = 0; r < repeat; ++r) {
        auto t0 = clk::now();
        for (std::size_t i = 0; i < k; ++i) {
          hs[i] = dev->create_chunk(pages);
          if (!hs[i]) {
            std::fprintf(stderr, "page_cost: no room for %zu handles of %zu MiB\n", k, mib);
            return 1;
          }
          dev->map_chunk(base + i * bytes, hs[i], pages);
        }
        b[0] = std::min(b[0], us_since(t0, k));
        t0 = clk::now();
        for (std::size_t i = 0; i < k; ++i) {
          dev->unmap(base + i * bytes, pages);
          dev->destroy(hs[i]);
        }
        b[2] = std::min(b[2], us_since(t0, k));
        t0 = clk::now();
        for (std::size_t i = 0; i < k; ++i) ps[i] = cm->allocate(bytes, 0);
        b[1] = std::min(b[1], us_since(t0, k));
        t0 = clk::now();
        for (std::size_t i = 0; i < k; ++i) cm->deallocate(ps[i], bytes, 0);
        b[3] = std::min(b[3], us_since(t0, k));
      }
      dev->unreserve(base, k * bytes);
      const double per_gib = 1024.0 / static_cast<double>(mib);
      std::printf("| %zu | %zu | %.1f (%.0f) | %.1f (%.0f) | %.1f (%.0f) | %.1f (%.0f) |\n", mib, k, b[0],
                  b[0] * per_gib, b[1], b[1] * per_gib, b[2], b[2] * per_gib, b[3], b[3] * per_gib);
    }
  }
  return 0;
}
