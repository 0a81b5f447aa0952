// Whether page calls made on a helper thread hold up the thread that
// launches work. The driver runs its page calls one at a time (page_cost
// --threads shows no gain from more threads), so a helper cannot make more
// pages per second; it only helps if the launching thread keeps going while
// the helper waits on the driver. This measures the launching thread's host
// time per launch (small async memsets on one stream, with an event query
// every 16) alone, and while a second thread creates, maps and grants access
// to 2 MiB pages and then unmaps and releases them, as fast as it can.
//
//   vramkit_vmm_overlap [--launches N] [--pages P] [--repeat R]
//
// Prints per-launch host time (median, p99, max, mean), the launching
// thread's wall time, and the helper's pages per millisecond.
#include <cuda.h>

#include "vmm_common.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace {
using clk = std::chrono::steady_clock;

struct result {
  double p50 = 0, p99 = 0, max = 0, mean = 0, wall_ms = 0, helper_pages_per_ms = 0;
};
}  // namespace

int main(int argc, char** argv) {
  std::size_t launches = 20000, pages = 64, repeat = 3;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--launches" && i + 1 < argc) launches = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--pages" && i + 1 < argc) pages = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--repeat" && i + 1 < argc) repeat = std::strtoull(argv[++i], nullptr, 10);
    else {
      std::fprintf(stderr, "usage: vramkit_vmm_overlap [--launches N] [--pages P] [--repeat R]\n");
      return 2;
    }
  }
  if (launches == 0 || pages == 0 || repeat == 0) {
    std::fprintf(stderr, "vramkit_vmm_overlap: --launches, --pages and --repeat must be at least 1\n");
    return 2;
  }
  vmm_bench::device0 d;
  const CUdevice dev = d.dev;
  const CUcontext ctx = d.ctx;
  const CUmemAllocationProp prop = d.prop;
  const CUmemAccessDesc acc = d.acc;
  const std::size_t g = d.g;
  CUdeviceptr va = 0;
  CK(cuMemAddressReserve(&va, pages * g, g, 0, 0));

  CUstream stream;
  CK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  CUdeviceptr buf;
  CK(cuMemAlloc(&buf, 1 << 20));
  CUevent ev;
  CK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));

  // The helper thread's work: create, map and grant access to `pages` pages
  // one by one (each counted as made), then unmap and release them; again
  // until told to stop.
  auto churn = [&](std::atomic<bool>& stop, std::atomic<std::size_t>& made) {
    CK(cuCtxSetCurrent(ctx));
    std::vector<CUmemGenericAllocationHandle> h(pages);
    while (!stop.load(std::memory_order_relaxed)) {
      std::size_t k = 0;
      for (; k < pages && !stop.load(std::memory_order_relaxed); ++k) {
        CK(cuMemCreate(&h[k], g, &prop, 0));
        CK(cuMemMap(va + k * g, g, 0, h[k], 0));
        CK(cuMemSetAccess(va + k * g, g, &acc, 1));
        ++made;
      }
      for (std::size_t j = 0; j < k; ++j) {
        CK(cuMemUnmap(va + j * g, g));
        CK(cuMemRelease(h[j]));
      }
    }
  };

  auto measure = [&](int helper_kind) {
    // helper_kind 0: none; 1: create + map + access, then unmap + release.
    std::atomic<bool> stop{false};
    std::atomic<std::size_t> done_pages{0};
    std::thread helper;
    if (helper_kind) {
      helper = std::thread(churn, std::ref(stop), std::ref(done_pages));
      while (done_pages.load() < 8) std::this_thread::yield();  // the helper is in full swing
    }
    std::vector<double> t(launches);
    auto w0 = clk::now();
    const std::size_t p0 = done_pages.load();
    for (std::size_t i = 0; i < launches; ++i) {
      auto t0 = clk::now();
      CK(cuMemsetD8Async(buf + (i & 255) * 4096, static_cast<unsigned char>(i), 4096, stream));
      if ((i & 15) == 15) {
        CK(cuEventRecord(ev, stream));
        CUresult q = cuEventQuery(ev);
        if (q != CUDA_SUCCESS && q != CUDA_ERROR_NOT_READY) vmm_bench::check(q, "cuEventQuery");
      }
      t[i] = std::chrono::duration<double, std::micro>(clk::now() - t0).count();
    }
    CK(cuStreamSynchronize(stream));
    result r;
    r.wall_ms = std::chrono::duration<double, std::milli>(clk::now() - w0).count();
    r.helper_pages_per_ms = static_cast<double>(done_pages.load() - p0) / r.wall_ms;
    stop = true;
    if (helper.joinable()) helper.join();
    for (double x : t) r.mean += x;
    r.mean /= static_cast<double>(launches);
    std::sort(t.begin(), t.end());
    r.p50 = t[launches / 2];
    r.p99 = t[std::min(launches - 1, launches * 99 / 100)];
    r.max = t.back();
    return r;
  };

  std::printf(
      "launching thread: %zu async memsets of 4 KiB, an event query every 16; helper: %zu pages of %zu MiB "
      "at a time; best of %zu by mean\n",
      launches, pages, g >> 20, repeat);
  std::printf(
      "| helper thread | us/launch median | p99 | max | mean | wall ms | helper pages/ms |\n"
      "|---|---|---|---|---|---|---|\n");
  const char* names[2] = {"none", "create+map+access, unmap+release"};
  for (int kind = 0; kind < 2; ++kind) {
    result best;
    best.mean = 1e300;
    for (std::size_t r = 0; r < repeat; ++r) {
      result x = measure(kind);
      if (x.mean < best.mean) best = x;
    }
    std::printf("| %s | %.2f | %.2f | %.1f | %.2f | %.1f | %.2f |\n", names[kind], best.p50, best.p99, best.max,
                best.mean, best.wall_ms, best.helper_pages_per_ms);
  }

  // Whether page calls wait for queued GPU work: the same calls on this thread,
  // on an idle GPU and with about `busy_ms` of large memsets queued ahead.
  CUdeviceptr big;
  const std::size_t big_bytes = std::size_t{1} << 30;
  CK(cuMemAlloc(&big, big_bytes));
  auto page_calls = [&](bool busy, double& queued_ms) {
    queued_ms = 0;
    if (busy) {
      CUevent e0, e1;
      CK(cuEventCreate(&e0, CU_EVENT_DEFAULT));
      CK(cuEventCreate(&e1, CU_EVENT_DEFAULT));
      CK(cuEventRecord(e0, stream));
      for (int i = 0; i < 200; ++i) CK(cuMemsetD8Async(big, static_cast<unsigned char>(i), big_bytes, stream));
      CK(cuEventRecord(e1, stream));
      auto t0 = clk::now();
      std::vector<CUmemGenericAllocationHandle> h(pages);
      for (std::size_t k = 0; k < pages; ++k) {
        CK(cuMemCreate(&h[k], g, &prop, 0));
        CK(cuMemMap(va + k * g, g, 0, h[k], 0));
        CK(cuMemSetAccess(va + k * g, g, &acc, 1));
      }
      double us = std::chrono::duration<double, std::micro>(clk::now() - t0).count();
      CUresult q = cuEventQuery(e1);
      if (q != CUDA_SUCCESS && q != CUDA_ERROR_NOT_READY) vmm_bench::check(q, "cuEventQuery");
      bool still_busy = q == CUDA_ERROR_NOT_READY;
      for (std::size_t k = 0; k < pages; ++k) {
        CK(cuMemUnmap(va + k * g, g));
        CK(cuMemRelease(h[k]));
      }
      CK(cuEventSynchronize(e1));
      float ms = 0;
      CK(cuEventElapsedTime(&ms, e0, e1));
      queued_ms = still_busy ? ms : -ms;  // negative: the GPU had finished before the calls returned
      CK(cuEventDestroy(e0));
      CK(cuEventDestroy(e1));
      return us / static_cast<double>(pages);
    }
    std::vector<CUmemGenericAllocationHandle> h(pages);
    auto t0 = clk::now();
    for (std::size_t k = 0; k < pages; ++k) {
      CK(cuMemCreate(&h[k], g, &prop, 0));
      CK(cuMemMap(va + k * g, g, 0, h[k], 0));
      CK(cuMemSetAccess(va + k * g, g, &acc, 1));
    }
    double us = std::chrono::duration<double, std::micro>(clk::now() - t0).count();
    for (std::size_t k = 0; k < pages; ++k) {
      CK(cuMemUnmap(va + k * g, g));
      CK(cuMemRelease(h[k]));
    }
    return us / static_cast<double>(pages);
  };
  double q = 0, idle = page_calls(false, q), busy = page_calls(true, q);

  // Whether page calls slow the GPU's work: 400 memsets of 256 MiB (GPU
  // bound), timed by events, alone and while a helper thread creates, maps
  // and grants access to pages, then unmaps and releases them.
  auto gpu_ms = [&](bool helper_on, double& pages_per_ms) {
    std::atomic<bool> stop{false};
    std::atomic<std::size_t> done_pages{0};
    std::thread helper;
    if (helper_on) helper = std::thread(churn, std::ref(stop), std::ref(done_pages));
    if (helper_on)
      while (done_pages.load() < 8) std::this_thread::yield();  // the helper is in full swing
    const std::size_t p0 = done_pages.load();
    CUevent e0, e1;
    CK(cuEventCreate(&e0, CU_EVENT_DEFAULT));
    CK(cuEventCreate(&e1, CU_EVENT_DEFAULT));
    auto w0 = clk::now();
    CK(cuEventRecord(e0, stream));
    for (int i = 0; i < 400; ++i)
      CK(cuMemsetD8Async(big, static_cast<unsigned char>(i), std::size_t{256} << 20, stream));
    CK(cuEventRecord(e1, stream));
    CK(cuEventSynchronize(e1));
    double wall = std::chrono::duration<double, std::milli>(clk::now() - w0).count();
    pages_per_ms = static_cast<double>(done_pages.load() - p0) / wall;
    stop = true;
    if (helper.joinable()) helper.join();
    float ms = 0;
    CK(cuEventElapsedTime(&ms, e0, e1));
    CK(cuEventDestroy(e0));
    CK(cuEventDestroy(e1));
    return static_cast<double>(ms);
  };
  double rate = 0, best_alone = 1e30, best_with = 1e30, with_rate = 0;
  for (std::size_t r = 0; r < repeat; ++r) {
    best_alone = std::min(best_alone, gpu_ms(false, rate));
    double m = gpu_ms(true, rate);
    if (m < best_with) {
      best_with = m;
      with_rate = rate;
    }
  }
  std::printf(
      "GPU time of 400 memsets of 256 MiB: %.2f ms alone, %.2f ms while a helper thread makes and drops "
      "pages (%.1f pages/ms), best of %zu\n",
      best_alone, best_with, with_rate, repeat);
  std::printf(
      "\ncreate+map+access on this thread: %.2f us/page on an idle GPU, %.2f us/page with %.1f ms of "
      "memsets queued (%s when the calls returned)\n",
      idle, busy, q < 0 ? -q : q, q < 0 ? "finished" : "still running");

  // Whether new pages cost the GPU on first use: a memset over pages just
  // created and mapped, then the same memset again.
  {
    std::vector<CUmemGenericAllocationHandle> h(pages);
    for (std::size_t k = 0; k < pages; ++k) {
      CK(cuMemCreate(&h[k], g, &prop, 0));
      CK(cuMemMap(va + k * g, g, 0, h[k], 0));
    }
    CK(cuMemSetAccess(va, pages * g, &acc, 1));
    CUevent e[3];
    for (auto& x : e) CK(cuEventCreate(&x, CU_EVENT_DEFAULT));
    CK(cuEventRecord(e[0], stream));
    CK(cuMemsetD8Async(va, 1, pages * g, stream));
    CK(cuEventRecord(e[1], stream));
    CK(cuMemsetD8Async(va, 2, pages * g, stream));
    CK(cuEventRecord(e[2], stream));
    CK(cuEventSynchronize(e[2]));
    float first = 0, second = 0;
    CK(cuEventElapsedTime(&first, e[0], e[1]));
    CK(cuEventElapsedTime(&second, e[1], e[2]));
    std::printf("memset of %zu MiB on pages just mapped: %.3f ms the first time, %.3f ms the second\n", pages * g >> 20,
                first, second);
    for (auto& x : e) CK(cuEventDestroy(x));
    CK(cuMemUnmap(va, pages * g));
    for (auto x : h) CK(cuMemRelease(x));
  }
  CK(cuMemFree(big));
  CK(cuEventDestroy(ev));
  CK(cuMemFree(buf));
  CK(cuStreamDestroy(stream));
  CK(cuMemAddressFree(va, pages * g));
  CK(cuDevicePrimaryCtxRelease(dev));
  return 0;
}
