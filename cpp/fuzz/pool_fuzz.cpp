// libFuzzer target: the input is a sequence of pool operations (allocate
// with size and stream, free, record_stream, release, limit). After each one
// the pool's invariants must hold; data written at allocation must survive.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "vramkit/mr/pool_resource.hpp"
#include "vramkit/platform/host_page_device.hpp"

using namespace vramkit;

namespace {
// A GPU `lag` operations behind the host: an event completes that many
// operations after it was recorded, or once waited for.
struct lagging_events final : stream_ops {
  std::uint64_t now = 0, lag = 0, caught_up = 0;
  std::vector<std::uint64_t> at;
  event_id record(stream_t) override {
    at.push_back(now);
    return at.size();
  }
  bool done(event_id e) override { return at[e - 1] + lag <= now || at[e - 1] <= caught_up; }
  void wait(event_id e) override { caught_up = std::max(caught_up, at[e - 1]); }
  void release(event_id) noexcept override {}
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto dev = std::make_shared<host_page_device>(std::size_t{1} << 30);
  pool_options o;
  std::shared_ptr<lagging_events> gpu;
  if (size > 0) o.growth_slack = (data[0] % 8) / 20.0;
  if (size > 0) o.growth_chunks = (data[0] & 8) != 0;
  if (size > 0 && (data[0] & 16)) {  // a GPU behind the host, 0-21 operations
    gpu = std::make_shared<lagging_events>();
    gpu->lag = (data[0] >> 6) * 7;
    o.remap_own = (data[0] & 32) != 0;
  }
  // Step plans from the last byte; plans need marks (op 5) and repeating steps. With them, chunks
  // are made until the second mark, where the free ones go back and the others are split into
  // single pages holding their bytes (split_chunks: the tags at the blocks' ends are checked).
  o.plan_steps = size > 1 && (data[size - 1] & 1);
  // Chunks of 16 MiB from the last byte's fourth bit; of 16, 8 and 4 MiB (chunk_min_size) with its second.
  if (size > 1 && (data[size - 1] & 8)) o.chunk_size = std::size_t{16} << 20;
  if (size > 1 && (data[size - 1] & 2)) {
    o.chunk_size = std::size_t{16} << 20;
    o.chunk_min_size = std::size_t{4} << 20;
  }
  o.split_chunks = !(size > 1 && (data[size - 1] & 16));
  o.fit_address = size > 1 && (data[size - 1] & 4);  // fit:address from its third bit
  o.plan_needs_moves = size > 1 && (data[size - 1] & 32);  // plans only once the steps moved pages
  pool_resource pool(dev, gpu, o);
  struct live { std::uint8_t* p; std::size_t n; stream_t s; std::uint8_t tag; };
  std::vector<live> v;
  std::size_t i = 1;
  auto next = [&](std::size_t k) {
    std::uint64_t x = 0;
    for (std::size_t j = 0; j < k && i < size; ++j) x = x << 8 | data[i++];
    return x;
  };
  while (i < size) {
    if (gpu) ++gpu->now;
    std::uint8_t op = static_cast<std::uint8_t>(next(1)) % 6;
    if (op <= 2) {
      std::size_t n = next(3) << (next(1) % 8);  // up to ~2 GiB: some fail
      stream_t s = next(1) % 3;
      try {
        auto* p = static_cast<std::uint8_t*>(pool.allocate(n, s));
        if (p) {
          std::uint8_t tag = static_cast<std::uint8_t>(v.size());
          p[0] = tag;
          p[n - 1] = tag;
          v.push_back({p, n, s, tag});
        }
      } catch (const out_of_memory&) {
      }
    } else if (op == 3 && !v.empty()) {
      std::size_t k = next(2) % v.size();
      if (v[k].p[0] != v[k].tag || v[k].p[v[k].n - 1] != v[k].tag) __builtin_trap();
      pool.deallocate_checked(v[k].p, v[k].n, v[k].s);
      v[k] = v.back();
      v.pop_back();
    } else if (op == 4 && !v.empty()) {
      pool.record_stream(v[next(2) % v.size()].p, next(1) % 3);
    } else if (op == 5) {
      const auto what = next(1) % 3;
      if (what == 0) pool.release_cached();
      else if (what == 1) try { pool.set_reserve_limit((next(1) % 64 + 1) << 24); } catch (const invalid_argument&) {}
      else pool.mark_step();
    }
    pool.check_invariants();
  }
  for (auto& l : v) pool.deallocate_checked(l.p, l.n, l.s);
  pool.check_invariants();
  return 0;
}
