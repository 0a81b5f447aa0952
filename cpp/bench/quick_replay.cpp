// Development driver: replays "op id size stream" lines from stdin through the
// host pool and prints fragmentation and ns/op.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "vramkit/mr/pool_resource.hpp"
#include "vramkit/platform/host_page_device.hpp"
#include "vramkit/trace/replay.hpp"

// (diagnostic) VKLAG=L: a GPU L operations behind the host; an event recorded
// at operation i completes at operation i + L (or when waited for). VKJITTER=S:
// each event's lag drawn from [L/2, 3L/2] (seed S), as a GPU's pace varies.
// VKSYNC=F,P: the host waits for the GPU before operation F and every P
// operations after it (a training loop's synchronize at each step's end).
// VKSTEP=F,P: mark_step before operation F and every P after it (plan_steps).
// VKWATCH=F,P: the same step lines, without marking (plan_steps finding the steps itself).
// VKSEG=N: the large arena's blocks (A live, P pending, f free: MiB@offset) as step N begins.
// VKPAGEOPS=1: each operation of the last pass that mapped or unmapped pages.
// VKGROW=1: each growth of the last pass (VKGROWALL: of every pass), with
// where the mapped pages lie (chunk pages a live block holds among them).
struct lag_streams : vramkit::stream_ops {
  std::size_t now = 0, lag = 0, caught_up = 0, waits = 0;
  std::vector<std::size_t> at{0}, lag_of{0};
  std::mt19937_64 rng;
  bool jitter = false;
  vramkit::event_id record(vramkit::stream_t) override {
    at.push_back(now);
    lag_of.push_back(jitter && lag > 1 ? lag / 2 + rng() % (lag + 1) : lag);
    return at.size() - 1;
  }
  bool done(vramkit::event_id e) override { return at[e] + lag_of[e] <= now || at[e] <= caught_up; }
  void wait(vramkit::event_id e) override { if (!done(e)) { ++waits; caught_up = now; } }
  void release(vramkit::event_id) noexcept override {}
};

// (diagnostic) VKNULL=1: a page device that makes no call at all, so that
// ns/op is the pool's own work; VKSLOW=N prints the N slowest operations of
// the first pass.
struct null_pages : vramkit::page_device {
  std::size_t g = std::size_t{2} << 20, made = 0;
  std::uintptr_t next_va = std::uintptr_t{1} << 44;
  vramkit::page_handle next = 1;
  std::size_t granularity() const noexcept override { return g; }
  std::size_t capacity() const noexcept override { return std::size_t{80} << 30; }
  std::size_t created_bytes() const noexcept override { return made * g; }
  std::uintptr_t reserve(std::size_t b) override { auto v = next_va; next_va += (b + g - 1) / g * g + g; return v; }
  void unreserve(std::uintptr_t, std::size_t) noexcept override {}
  vramkit::page_handle create() override { ++made; return next++; }
  void destroy(vramkit::page_handle) noexcept override { --made; }
  void map(std::uintptr_t, const vramkit::page_handle*, std::size_t) override {}
  void unmap(std::uintptr_t, std::size_t) noexcept override {}
  bool map_replaces() const noexcept override { return true; }
  int device() const noexcept override { return 0; }
  std::string name() const override { return "null"; }
  vramkit::device_properties properties() const override { return {}; }
};

// (diagnostic) VKHAZARD=L1,L2,...: replays with the GPU in step (every event done) and counts,
// for each lag L, the pages unmapped (or mapped over) while a block freed fewer than L operations
// before still covered them: the unmaps a pool taking pages without waiting for the GPU would
// have to delay or wait for, were the GPU L operations behind. A wrapper around the page device
// tracks which addresses are mapped; the replay loop stamps each freed block's pages.
// Under VKLAG the same wrapper checks the pool: `unsafe` counts the pages it unmapped (or mapped
// over) while the lagging GPU was not yet past the last free over them (no jitter: an event's lag is L).
struct hazard_pages : vramkit::page_device {
  std::shared_ptr<vramkit::page_device> in;
  std::vector<std::size_t> lags, hits;
  std::unordered_map<std::uintptr_t, std::size_t> last_free;  // page address -> op of the last free over it
  std::unordered_set<std::uintptr_t> mapped;
  std::size_t now = 0, unmaps = 0, unsafe = 0;
  const lag_streams* model = nullptr;
  void touch(std::uintptr_t va) {
    ++unmaps;
    auto it = last_free.find(va);
    if (it == last_free.end()) return;
    for (std::size_t i = 0; i < lags.size(); ++i) hits[i] += now - it->second < lags[i];
    if (model && model->now < it->second + model->lag && model->caught_up < it->second) ++unsafe;
  }
  void freed(std::uintptr_t addr, std::size_t bytes) {
    const std::size_t g = in->granularity();
    for (std::uintptr_t v = addr / g * g; v < addr + bytes; v += g) last_free[v] = now;
  }
  std::size_t granularity() const noexcept override { return in->granularity(); }
  std::size_t capacity() const noexcept override { return in->capacity(); }
  std::size_t created_bytes() const noexcept override { return in->created_bytes(); }
  std::uintptr_t reserve(std::size_t b) override { return in->reserve(b); }
  void unreserve(std::uintptr_t va, std::size_t b) noexcept override { in->unreserve(va, b); }
  vramkit::page_handle create() override { return in->create(); }
  void destroy(vramkit::page_handle h) noexcept override { in->destroy(h); }
  vramkit::page_handle create_chunk(std::size_t pages) override { return in->create_chunk(pages); }
  bool copies() const noexcept override { return in->copies(); }
  void copy(std::uintptr_t dst, std::uintptr_t src, std::size_t n) override { in->copy(dst, src, n); }
  void map_chunk(std::uintptr_t va, vramkit::page_handle h, std::size_t pages) override {
    in->map_chunk(va, h, pages);
    for (std::size_t i = 0; i < pages; ++i) mapped.insert(va + i * granularity());
  }
  void map(std::uintptr_t va, const vramkit::page_handle* h, std::size_t n) override {
    in->map(va, h, n);
    for (std::size_t i = 0; i < n; ++i)
      if (!mapped.insert(va + i * granularity()).second) touch(va + i * granularity());  // mapped over
  }
  void unmap(std::uintptr_t va, std::size_t n) noexcept override {
    in->unmap(va, n);
    for (std::size_t i = 0; i < n; ++i)
      if (mapped.erase(va + i * granularity())) touch(va + i * granularity());
  }
  bool map_replaces() const noexcept override { return in->map_replaces(); }
  int device() const noexcept override { return in->device(); }
  std::string name() const override { return "hazard"; }
  vramkit::device_properties properties() const override { return in->properties(); }
};

int main(int argc, char** argv) {
  std::vector<vramkit::trace_op> ops;
  unsigned long long op, id, size, st;
  while (std::scanf("%llu %llu %llu %llu", &op, &id, &size, &st) == 4) {
    vramkit::trace_op t;
    t.action = static_cast<std::uint8_t>(op);
    t.id = id;
    t.size = size;
    t.stream = static_cast<std::uint16_t>(st);
    ops.push_back(t);
  }
  vramkit::pool_options o;
  if (argc > 1) o.parse(argv[1]);
  std::shared_ptr<vramkit::page_device> dev;
  if (std::getenv("VKNULL")) {
    auto n = std::make_shared<null_pages>();
    if (o.page_size) n->g = o.page_size;
    dev = n;
  } else {
    dev = std::make_shared<vramkit::host_page_device>(vramkit::host_page_device::default_capacity,
                                                      o.page_size ? o.page_size : std::size_t{2} << 20);
  }
  std::shared_ptr<hazard_pages> hz;
  if (const char* h = std::getenv("VKHAZARD")) {
    hz = std::make_shared<hazard_pages>();
    hz->in = dev;
    for (const char* q = h; *q;) {
      char* end = nullptr;
      hz->lags.push_back(std::strtoull(q, &end, 10));
      q = *end ? end + 1 : end;
    }
    hz->hits.assign(hz->lags.size(), 0);
    dev = hz;
  }
  auto lag = std::make_shared<lag_streams>();
  lag->lag = std::getenv("VKLAG") ? std::strtoull(std::getenv("VKLAG"), nullptr, 10) : 0;
  std::shared_ptr<hazard_pages> check;  // VKLAG without jitter: no unmap under work the GPU has not done
  if (std::getenv("VKLAG") && !std::getenv("VKJITTER") && !hz) {
    check = std::make_shared<hazard_pages>();
    check->in = dev;
    check->model = lag.get();
    dev = check;
  }
  if (const char* j = std::getenv("VKJITTER")) {
    lag->jitter = true;
    lag->rng.seed(std::strtoull(j, nullptr, 10));
  }
  vramkit::pool_resource pool(dev, lag, o);
  if (std::getenv("VKLAG")) {
    std::vector<void*> ptr(ops.size(), nullptr);
    int passes = std::getenv("VKPASSES") ? std::atoi(std::getenv("VKPASSES")) : 4;
    std::size_t live = 0, peak_live = 0, sync_first = 0, sync_period = 0;
    const bool grow_lines = std::getenv("VKGROW") != nullptr, grow_all = std::getenv("VKGROWALL") != nullptr;
    const bool page_op_lines = std::getenv("VKPAGEOPS") != nullptr;  // each op of the last pass that maps or unmaps
    if (const char* sy = std::getenv("VKSYNC")) {
      char* end = nullptr;
      sync_first = std::strtoull(sy, &end, 10);
      if (*end == ',') sync_period = std::strtoull(end + 1, nullptr, 10);
    }
    // VKSTEP=first,period: a step begins there (pool_resource::mark_step, for plan_steps), with a
    // line per step: pages mapped and unmapped in the step, reserved at its end, plan counters.
    std::size_t step_first = 0, step_period = 0, step_no = 0;
    // VKWATCH=first,period: the same lines without marking (steps the pool finds itself).
    const bool watch_only = std::getenv("VKWATCH") != nullptr;
    if (const char* sp = std::getenv(watch_only ? "VKWATCH" : "VKSTEP")) {
      char* end = nullptr;
      step_first = std::strtoull(sp, &end, 10);
      if (*end == ',') step_period = std::strtoull(end + 1, nullptr, 10);
    }
    // Driver time as an H100 charged it per handle (create 8.7 us, map 1.05 + set access 28.2,
    // unmap 19.3, release 13.1), taken as the same for any handle size: a model, not a timing.
    // A chunk, whatever its size (chunk_size, chunk_min_size), is one handle for all its pages.
    auto driver_ms = [](const vramkit::pool_counters& c0, const vramkit::pool_counters& c1) {
      const std::size_t cc = c1.chunks_created - c0.chunks_created, cr = c1.chunks_released - c0.chunks_released;
      const std::size_t pc = c1.chunk_pages_created - c0.chunk_pages_created,
                        pr = c1.chunk_pages_released - c0.chunk_pages_released;
      const double h_created = static_cast<double>(c1.pages_created - c0.pages_created - pc + cc),
                   h_mapped = static_cast<double>(c1.pages_mapped - c0.pages_mapped - pc + cc),
                   h_unmapped = static_cast<double>(c1.pages_unmapped - c0.pages_unmapped - pr + cr),
                   h_destroyed = static_cast<double>(c1.pages_destroyed - c0.pages_destroyed - pr + cr);
      return (8.7 * h_created + 29.25 * h_mapped + 19.3 * h_unmapped + 13.1 * h_destroyed) / 1000.0;
    };
    auto sc = pool.counters();
    const long seg_step = std::getenv("VKSEG") ? std::atol(std::getenv("VKSEG")) : -1;
    auto step_line = [&] {
      if (static_cast<long>(step_no) == seg_step) {  // VKSEG=N: the large arena's blocks as step N begins
        auto u = pool.usage();
        std::printf("usage: mapped %zu/%zu live_overlap %zu/%zu free_interior %zu/%zu chunks %zu chunk_free_held %zu spare %zu\n",
                    u.mapped[0], u.mapped[1], u.live_overlap[0], u.live_overlap[1], u.free_interior_mapped[0],
                    u.free_interior_mapped[1], u.in_chunks, u.chunk_free_held, u.spare);
      }
      if (static_cast<long>(step_no) == seg_step)
        for (const auto& sg : pool.segments()) {
          if (sg.small) continue;
          std::printf("segment %zu MiB, %zu MiB mapped:", sg.size >> 20, sg.mapped_bytes >> 20);
          for (const auto& b : sg.blocks)
            std::printf(" %s%.1f@%.1f", b.allocated ? "A" : b.pending ? "P" : "f", b.size / 1048576.0,
                        (b.addr - sg.base) / 1048576.0);
          std::printf("\n");
        }
      auto c = pool.counters();
      std::printf("step %zu: mapped %zu unmapped %zu reserved %zu MiB peak_reserved %zu MiB plan placed %zu missed %zu made %zu dropped %zu plan %zu MiB driver_ms %.1f\n",
                  step_no++, c.pages_mapped - sc.pages_mapped, c.pages_unmapped - sc.pages_unmapped,
                  pool.state().reserved_bytes >> 20, pool.state().peak_reserved_bytes >> 20,
                  c.plan_placed - sc.plan_placed, c.plan_missed - sc.plan_missed, c.plans_made, c.plans_dropped,
                  c.plan_bytes >> 20, driver_ms(sc, c));
      sc = c;
    };
    for (int pass = 0; pass < passes; ++pass) {
      auto c0 = pool.counters();
      const std::size_t waits0 = lag->waits;
      for (auto& t : ops) {
        ++lag->now;
        if (sync_period) {  // VKSYNC=first,period: the host waits for the GPU there (a step's end)
          const std::size_t i = static_cast<std::size_t>(&t - ops.data());
          if (i >= sync_first && (i - sync_first) % sync_period == 0) lag->caught_up = lag->now;
        }
        if (step_period) {
          const std::size_t i = static_cast<std::size_t>(&t - ops.data());
          if (i >= step_first && (i - step_first) % step_period == 0) {
            step_line();
            if (!watch_only) pool.mark_step();
          }
        }
        const bool op_lines = page_op_lines && pass == passes - 1;
        const auto oc = op_lines ? pool.counters() : vramkit::pool_counters{};
        if (t.action == 0) {
          const bool show = grow_lines && (pass == passes - 1 || grow_all);
          const std::size_t r0 = show ? pool.state().reserved_bytes : 0;
          ptr[t.id] = pool.allocate(t.size, t.stream);
          live += t.size;
          peak_live = std::max(peak_live, live);
          if (show && pool.state().reserved_bytes > r0) {
            auto u = pool.usage();
            std::printf("grow op %zu size %.2fM stream %u +%zu MiB reserved %zu live %zu | mapped %zu liveov %zu freeint %zu chunks %zu held %zu spare %zu\n",
                        static_cast<std::size_t>(&t - ops.data()), t.size / 1048576.0, (unsigned)t.stream,
                        (pool.state().reserved_bytes - r0) >> 20, pool.state().reserved_bytes >> 20, live >> 20,
                        u.mapped[0], u.live_overlap[0], u.free_interior_mapped[0], u.in_chunks, u.chunk_free_held, u.spare);
          }
        } else {
          live -= pool.allocation_size(ptr[t.id]);
          if (check) check->freed(reinterpret_cast<std::uintptr_t>(ptr[t.id]), pool.allocation_size(ptr[t.id]));
          pool.deallocate(ptr[t.id], 0, t.stream);
        }
        if (op_lines) {
          auto nc = pool.counters();
          if (nc.pages_mapped != oc.pages_mapped || nc.pages_unmapped != oc.pages_unmapped)
            std::printf("op %zu %s size %.2fM stream %u at %llx: mapped %zu unmapped %zu\n",
                        static_cast<std::size_t>(&t - ops.data()), t.action ? "free" : "alloc", t.size / 1048576.0,
                        (unsigned)t.stream, (unsigned long long)reinterpret_cast<std::uintptr_t>(ptr[t.id]),
                        nc.pages_mapped - oc.pages_mapped, nc.pages_unmapped - oc.pages_unmapped);
        }
      }
      auto c1 = pool.counters();
      const std::size_t created = c1.pages_created - c0.pages_created, mapped = c1.pages_mapped - c0.pages_mapped,
                        unmapped = c1.pages_unmapped - c0.pages_unmapped,
                        destroyed = c1.pages_destroyed - c0.pages_destroyed;
      const std::size_t cc = c1.chunks_created - c0.chunks_created, cr = c1.chunks_released - c0.chunks_released;
      std::printf("pass %d: created %zu mapped %zu unmapped %zu remapped %zu reused %zu destroyed %zu reserved %zu MiB "
                  "waits %zu chunks %zu/%zu early %zu/%zu driver_ms %.1f\n", pass,
                  created, mapped, unmapped, c1.pages_remapped - c0.pages_remapped,
                  c1.mappings_reused - c0.mappings_reused, destroyed, pool.state().reserved_bytes >> 20,
                  lag->waits - waits0, cc, cr, c1.pages_taken_early - c0.pages_taken_early,
                  c1.early_waits - c0.early_waits, driver_ms(c0, c1));
    }
    auto c = pool.counters();
    std::printf("lag %zu: peak_reserved/peak_live %.4f waits %zu remapped %zu reclaims %zu past_slack %zu%s\n",
                lag->lag, double(pool.state().peak_reserved_bytes) / double(peak_live), lag->waits, c.pages_remapped,
                c.stream_reclaims, c.pages_past_slack, check ? (" unsafe_unmaps " + std::to_string(check->unsafe)).c_str() : "");
    if (pool.options().plan_steps)
      std::printf("plans made %zu dropped %zu placed %zu missed %zu; steps found %zu, period %zu large requests\n",
                  c.plans_made, c.plans_dropped, c.plan_placed, c.plan_missed, c.steps_found, c.step_period);
    pool.check_invariants();
    return 0;
  }
  if (hz) {
    std::vector<void*> ptr(ops.size(), nullptr);
    int passes = std::getenv("VKPASSES") ? std::atoi(std::getenv("VKPASSES")) : 4;
    for (int pass = 0; pass < passes; ++pass) {
      const std::size_t unmaps0 = hz->unmaps;
      const std::vector<std::size_t> hits0 = hz->hits;
      for (auto& t : ops) {
        ++hz->now;
        if (t.action == 0) {
          ptr[t.id] = pool.allocate(t.size, t.stream);
        } else {
          hz->freed(reinterpret_cast<std::uintptr_t>(ptr[t.id]), pool.allocation_size(ptr[t.id]));
          pool.deallocate(ptr[t.id], 0, t.stream);
        }
      }
      std::printf("pass %d: pages unmapped or mapped over %zu; within L ops of a free over them:", pass,
                  hz->unmaps - unmaps0);
      for (std::size_t i = 0; i < hz->lags.size(); ++i) std::printf(" L=%zu %zu", hz->lags[i], hz->hits[i] - hits0[i]);
      std::printf("\n");
    }
    pool.check_invariants();
    return 0;
  }
  if (std::getenv("VKSLOW")) {
    std::vector<void*> ptr(ops.size(), nullptr);
    std::vector<std::pair<double, std::size_t>> t_op;
    double total = 0, alloc_total = 0;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      auto& t = ops[i];
      auto t0 = std::chrono::steady_clock::now();
      if (t.action == 0) ptr[t.id] = pool.allocate(t.size, t.stream);
      else pool.deallocate(ptr[t.id], 0, t.stream);
      double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      total += us;
      if (t.action == 0) alloc_total += us;
      t_op.emplace_back(us, i);
    }
    std::sort(t_op.rbegin(), t_op.rend());
    std::printf("first pass: %zu ops, %.1f ms (allocations %.1f ms)\n", ops.size(), total / 1e3, alloc_total / 1e3);
    std::size_t n = std::strtoull(std::getenv("VKSLOW"), nullptr, 10);
    double top = 0;
    for (std::size_t k = 0; k < t_op.size() && k < n; ++k) top += t_op[k].first;
    std::printf("slowest %zu ops: %.1f ms\n", n, top / 1e3);
    for (std::size_t k = 0; k < t_op.size() && k < 10; ++k) {
      auto& t = ops[t_op[k].second];
      std::printf("  op %zu %s %.2f MiB: %.1f us\n", t_op[k].second, t.action ? "free" : "alloc", t.size / 1048576.0,
                  t_op[k].first);
    }
    return 0;
  }
  if (std::getenv("VKOPS")) {  // (diagnostic) per-op remaps in pass VKOPS (1: the second)
    std::vector<void*> ptr(ops.size(), nullptr);
    const int show = std::atoi(std::getenv("VKOPS")) > 0 ? std::atoi(std::getenv("VKOPS")) : 1;
    for (int pass = 0; pass <= show; ++pass)
      for (std::size_t i = 0; i < ops.size(); ++i) {
        auto& t = ops[i];
        auto before = pool.counters();
        if (t.action == 0) ptr[t.id] = pool.allocate(t.size, t.stream);
        else pool.deallocate(ptr[t.id], 0, t.stream);
        auto after = pool.counters();
        if (pass == show && std::getenv("VKADDR") && t.size >= std::strtoull(std::getenv("VKADDR"), nullptr, 10) << 20)
          std::printf("op %zu %s id %llu size %.2fM at %llx\n", i, t.action ? "free" : "alloc", (unsigned long long)t.id,
                      t.size / 1048576.0, (unsigned long long)reinterpret_cast<std::uintptr_t>(ptr[t.id]));
        if (pass == show && after.pages_remapped != before.pages_remapped)
          std::printf("op %zu %s id %llu size %.2fM stream %u remapped %zu reclaims %zu\n", i, t.action ? "free" : "alloc",
                      (unsigned long long)t.id, t.size / 1048576.0, (unsigned)t.stream,
                      after.pages_remapped - before.pages_remapped, after.stream_reclaims - before.stream_reclaims);
      }
    return 0;
  }
  if (std::getenv("VKDIAG")) {
    std::vector<void*> ptr(ops.size(), nullptr);
    std::size_t peak = 0, live = 0;
    for (auto& t : ops) {
      if (t.action == 0) { ptr[t.id] = pool.allocate(t.size, t.stream); live += t.size; }
      else { live -= pool.allocation_size(ptr[t.id]); pool.deallocate(ptr[t.id], 0, t.stream); }
      if (std::getenv("VKCHECK")) pool.check_invariants();
      auto s = pool.state();
      if (s.reserved_bytes > peak + (std::getenv("VKSTEP") ? std::strtoull(std::getenv("VKSTEP"), nullptr, 10) : (64ull << 20))) {
        peak = s.reserved_bytes;
        auto u = pool.usage();
        std::printf("reserved %zu MiB live %zu MiB | large mapped %zu liveov %zu freeint %zu | small mapped %zu liveov %zu freeint %zu | spare %zu\n",
                    peak >> 20, live >> 20, u.mapped[0], u.live_overlap[0], u.free_interior_mapped[0], u.mapped[1], u.live_overlap[1], u.free_interior_mapped[1], u.spare);
      }
    }
    return 0;
  }
  vramkit::replay_options ro;
  ro.passes = std::getenv("VKPASSES") ? std::atoi(std::getenv("VKPASSES")) : 4;
  auto r = vramkit::replay(ops, pool, ro);
  auto c = pool.counters();
  std::printf("ops %zu peak_live %zu peak_reserved %zu frag %.4f cold %.1f warm %.1f ooms %zu created %zu remapped %zu mapcalls %zu reused %zu mapped %zu unmapped %zu chunks %zu/%zu\n",
              r.ops, r.peak_live_bytes, r.peak_reserved_bytes, r.fragmentation, r.cold_ns_per_op, r.warm_ns_per_op,
              r.ooms, c.pages_created, c.pages_remapped, c.map_calls, c.mappings_reused, c.pages_mapped, c.pages_unmapped,
              c.chunks_created, c.chunks_released);
  pool.check_invariants();
}
// (diagnostic) VKDIAG=1: print page usage whenever reserved grows past its peak.
