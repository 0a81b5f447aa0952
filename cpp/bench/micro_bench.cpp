// Alloc/free pairs through the pool on the simulated (host) device and, when
// a GPU is present, on vmm: fixed sizes and random sizes.
#include <benchmark/benchmark.h>

#include <random>

#include "vramkit/mr/pool_resource.hpp"
#include "vramkit/mr/statistics_adaptor.hpp"
#include "vramkit/platform/cuda.hpp"
#include "vramkit/platform/host_page_device.hpp"

using namespace vramkit;

static std::shared_ptr<device_resource> make(bool stats) {
  std::shared_ptr<device_resource> p =
      std::make_shared<pool_resource>(std::make_shared<host_page_device>(), std::make_shared<host_stream_ops>());
  if (stats) p = std::make_shared<statistics_adaptor>(p);
  return p;
}

static void pair_fixed(benchmark::State& st) {
  auto r = make(st.range(1));
  std::size_t n = static_cast<std::size_t>(st.range(0));
  for (auto _ : st) {
    void* p = r->allocate(n);
    benchmark::DoNotOptimize(p);
    r->deallocate(p, n);
  }
  st.SetLabel(st.range(1) ? "pool+statistics" : "pool");
}
BENCHMARK(pair_fixed)->ArgsProduct({{256, 64 << 10, 1 << 20, 16 << 20, 256 << 20}, {0, 1}});

// Random sizes 256 B .. 64 MiB (log-uniform) with up to 256 live blocks.
static void random_sizes(benchmark::State& st) {
  auto r = make(false);
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> lg(8, 26);
  std::vector<std::size_t> sizes(4096);
  for (auto& s : sizes) s = static_cast<std::size_t>(std::exp2(lg(rng)));
  std::vector<void*> live(256, nullptr);
  std::size_t i = 0;
  for (auto _ : st) {
    std::size_t k = i % live.size();
    if (live[k]) r->deallocate(live[k], 0);
    live[k] = r->allocate(sizes[i % sizes.size()]);
    ++i;
  }
  for (void* p : live)
    if (p) r->deallocate(p, 0);
  st.SetLabel("one free + one alloc per iteration");
}
BENCHMARK(random_sizes);

// torch_alloc_cost.py's mix on the paged pool of an 80 GiB device: sizes of
// 256 B, 4 KiB, 64 KiB, 1, 4 or 16 MiB plus up to 256 KiB; the last `hold`
// blocks stay alive (0: each is freed before the next is made). Placements
// that need pages look over the free block at the arena's end, which spans
// most of the reservation.
static void mixed_window(benchmark::State& st) {
  auto r = std::make_shared<pool_resource>(std::make_shared<host_page_device>(std::size_t{80} << 30),
                                           std::make_shared<host_stream_ops>());
  std::mt19937_64 rng(1);
  const std::size_t base[] = {256, 4096, 65536, std::size_t{1} << 20, std::size_t{4} << 20, std::size_t{16} << 20};
  std::vector<std::size_t> sizes(4096);
  for (auto& s : sizes) s = base[rng() % 6] + rng() % 512 * 512;
  const std::size_t hold = static_cast<std::size_t>(st.range(0));
  std::vector<void*> live(hold + 1, nullptr);
  std::size_t i = 0;
  for (auto _ : st) {
    std::size_t k = i % live.size();
    if (live[k]) r->deallocate(live[k], 0);
    live[k] = r->allocate(sizes[i % sizes.size()]);
    if (hold == 0) {
      r->deallocate(live[k], 0);
      live[k] = nullptr;
    }
    ++i;
  }
  for (void* p : live)
    if (p) r->deallocate(p, 0);
  st.SetLabel(hold ? "one free + one alloc per iteration" : "alloc + free per iteration");
}
BENCHMARK(mixed_window)->Arg(0)->Arg(8)->Arg(64);

static void pair_fixed_vmm(benchmark::State& st) {
  if (cuda::device_count() == 0) {
    st.SkipWithError("no CUDA device");
    return;
  }
  auto r = std::make_shared<pool_resource>(cuda::make_vmm_device(0), cuda::make_stream_ops(0));
  std::size_t n = static_cast<std::size_t>(st.range(0));
  for (auto _ : st) {
    void* p = r->allocate(n);
    benchmark::DoNotOptimize(p);
    r->deallocate(p, n);
  }
}
BENCHMARK(pair_fixed_vmm)->Arg(256)->Arg(1 << 20)->Arg(64 << 20);

BENCHMARK_MAIN();
