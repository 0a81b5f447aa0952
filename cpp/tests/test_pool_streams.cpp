// The pool's stream safety under a model of a GPU: every stream is a queue
// whose completed position the test advances at random (also while the pool
// queries an event), upstream calls fail now and then, and a fake page device
// records every address each physical page is mapped at. After every operation
// the pool's invariants must hold, and at all times:
//  - no block handed to stream s overlaps bytes that another stream's pending
//    work uses, through its own address or through any other address of the
//    same physical page;
//  - no address is unmapped while pending work uses it, and none is mapped twice;
//  - no page is destroyed while still mapped; every event is released;
//  - a chunk (one handle over several pages) is mapped and unmapped whole.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "vramkit/mr/pool_resource.hpp"

using namespace vramkit;

namespace {

constexpr std::size_t PG = std::size_t{2} << 20, MiB = std::size_t{1} << 20;

struct world {
  std::mt19937_64 rng;
  int nstreams = 3, progress = 0, fault_every = 0;
  // Event calls that fail: every event_faults-th record, query or wait throws.
  // A wait that fails is a device that failed: the pool may then take its
  // work for done (it will never run), and so does the model.
  int event_faults = 0;
  long event_calls = 0, event_failures = 0;
  bool event_fails() {
    if (!event_faults || ++event_calls % event_faults) return false;
    ++event_failures;
    return true;
  }
  std::size_t queued[8] = {}, completed[8] = {};
  long calls = 0, events_out = 0;
  // What went wrong.
  long va_races = 0, byte_races = 0, unmap_races = 0, map_over = 0, bad_unmaps = 0, destroyed_mapped = 0;
  // Chunks (chunk_size): the device makes them when `chunks` is set; a chunk
  // must be unmapped whole and never passed to map().
  bool chunks = false;
  long chunk_cuts = 0, chunk_misuse = 0;

  struct use {
    std::uintptr_t lo, hi;  // addresses, or byte offsets inside one physical page
    stream_t s;
    std::size_t pos;
  };
  std::vector<use> uses;
  std::unordered_map<page_handle, std::vector<use>> page_uses;
  std::map<std::uintptr_t, page_handle> at;  // address of a page -> physical page
  std::unordered_map<page_handle, std::set<std::uintptr_t>> where;

  bool pending(const use& u) const { return completed[u.s] < u.pos; }
  std::size_t rnd(std::size_t n) { return static_cast<std::size_t>(rng() % n); }
  void advance(stream_t s) { completed[s] = std::max(completed[s], queued[s] - std::min(queued[s], rnd(6))); }

  void mark_use(std::uintptr_t p, std::size_t n, stream_t s) {
    std::size_t pos = ++queued[s];
    uses.push_back({p, p + n, s, pos});
    for (std::uintptr_t v = p / PG * PG; v < p + n; v += PG)
      page_uses[at.at(v)].push_back({std::max(p, v) - v, std::min(p + n, v + PG) - v, s, pos});
  }
  void check_block(std::uintptr_t a, std::size_t n, stream_t s) {
    for (auto& u : uses)
      if (u.s != s && pending(u) && u.lo < a + n && a < u.hi) ++va_races;
    for (std::uintptr_t v = a / PG * PG; v < a + n; v += PG) {
      std::size_t lo = std::max(a, v) - v, hi = std::min(a + n, v + PG) - v;
      for (auto& u : page_uses[at.at(v)])
        if (u.s != s && pending(u) && u.lo < hi && lo < u.hi) ++byte_races;
    }
  }
  void prune() {
    if (uses.size() < 4096) return;
    auto keep = [&](std::vector<use>& v) { v.erase(std::remove_if(v.begin(), v.end(), [&](const use& u) { return !pending(u); }), v.end()); };
    keep(uses);
    for (auto& [h, v] : page_uses) keep(v);
  }
};

class model_device final : public page_device {
 public:
  explicit model_device(world& w, std::size_t cap) : w_(w), cap_(cap) {}
  std::size_t granularity() const noexcept override { return PG; }
  std::size_t capacity() const noexcept override { return cap_; }
  std::size_t created_bytes() const noexcept override { return created_ * PG; }
  std::uintptr_t reserve(std::size_t b) override {
    std::uintptr_t v = next_va_;
    next_va_ += b + 64 * PG;
    return v;
  }
  void unreserve(std::uintptr_t, std::size_t) noexcept override {}
  page_handle create() override {
    if (w_.fault_every && ++w_.calls % w_.fault_every == 0) {
      if (w_.calls % 2) throw cuda_error("injected create failure", 2);
      return 0;
    }
    if ((created_ + 1) * PG > cap_) return 0;
    ++created_;
    return next_handle_++;
  }
  // A chunk's handle has chunk_bit set and its low 20 bits zero; the model
  // tracks each of its pages as handle + i.
  static constexpr page_handle chunk_bit = page_handle{1} << 62;
  page_handle create_chunk(std::size_t pages) override {
    if (!w_.chunks) return 0;
    if (w_.fault_every && ++w_.calls % w_.fault_every == 0) {
      if (w_.calls % 2) throw cuda_error("injected chunk create failure", 2);
      return 0;
    }
    if ((created_ + pages) * PG > cap_) return 0;
    created_ += pages;
    const page_handle h = chunk_bit | (next_chunk_++ << 20);
    chunk_pages_[h] = pages;
    return h;
  }
  void map_chunk(std::uintptr_t va, page_handle h, std::size_t pages) override {
    if (w_.fault_every && ++w_.calls % w_.fault_every == 0) throw cuda_error("injected chunk map failure", 3);
    auto it = chunk_pages_.find(h);
    if (it == chunk_pages_.end() || it->second != pages) {
      ++w_.chunk_misuse;
      return;
    }
    for (std::size_t i = 0; i < pages; ++i) {
      std::uintptr_t v = va + i * PG;
      if (w_.at.count(v)) ++w_.map_over;
      w_.at[v] = h + i;
      w_.where[h + i].insert(v);
    }
  }
  void destroy(page_handle h) noexcept override {
    if (h & chunk_bit) {
      auto it = chunk_pages_.find(h);
      if (it == chunk_pages_.end()) {
        ++w_.chunk_misuse;
        return;
      }
      for (std::size_t i = 0; i < it->second; ++i) {
        if (!w_.where[h + i].empty()) ++w_.destroyed_mapped;
        w_.page_uses.erase(h + i);
      }
      created_ -= it->second;
      chunk_pages_.erase(it);
      return;
    }
    if (!w_.where[h].empty()) ++w_.destroyed_mapped;
    --created_;
    w_.page_uses.erase(h);
  }
  void map(std::uintptr_t va, const page_handle* hs, std::size_t n) override {
    if (w_.fault_every && ++w_.calls % w_.fault_every == 0) throw cuda_error("injected map failure", 3);
    for (std::size_t i = 0; i < n; ++i)
      if (hs[i] & chunk_bit) ++w_.chunk_misuse;  // a chunk is mapped only whole, by map_chunk
    for (std::size_t i = 0; i < n; ++i) {
      std::uintptr_t v = va + i * PG;
      if (w_.at.count(v)) ++w_.map_over;
      w_.at[v] = hs[i];
      w_.where[hs[i]].insert(v);
    }
  }
  void unmap(std::uintptr_t va, std::size_t n) noexcept override {
    for (std::size_t i = 0; i < n; ++i) {
      std::uintptr_t v = va + i * PG;
      auto it = w_.at.find(v);
      if (it == w_.at.end()) {
        ++w_.bad_unmaps;
        continue;
      }
      if (it->second & chunk_bit) {  // the call must cover the whole chunk
        const page_handle base = it->second & ~((page_handle{1} << 20) - 1);
        const std::uintptr_t start = v - (it->second - base) * PG;
        const auto c = chunk_pages_.find(base);
        if (c == chunk_pages_.end() || start < va || start + c->second * PG > va + n * PG) ++w_.chunk_cuts;
      }
      for (auto& u : w_.uses)
        if (w_.pending(u) && u.lo < v + PG && v < u.hi) {
          ++w_.unmap_races;
          break;
        }
      w_.where[it->second].erase(v);
      w_.at.erase(it);
    }
  }
  int device() const noexcept override { return 0; }
  std::string name() const override { return "model"; }
  device_properties properties() const override { return {}; }
  std::size_t created() const { return created_; }

 private:
  world& w_;
  std::size_t cap_, created_ = 0;
  page_handle next_handle_ = 1;
  page_handle next_chunk_ = 1;
  std::unordered_map<page_handle, std::size_t> chunk_pages_;
  std::uintptr_t next_va_ = std::uintptr_t{1} << 40;
};

class model_streams final : public stream_ops {
 public:
  explicit model_streams(world& w) : w_(w) {}
  static std::size_t pos(event_id e) { return e & ((event_id{1} << 40) - 1); }
  event_id record(stream_t s) override {
    if (w_.event_fails()) throw cuda_error("injected event record failure", 4);
    ++w_.events_out;
    return (static_cast<event_id>(s) << 40) | ++w_.queued[s];
  }
  bool done(event_id e) override {
    if (w_.event_fails()) throw cuda_error("injected event query failure", 4);
    if (w_.progress && w_.rnd(static_cast<std::size_t>(w_.progress)) == 0)
      w_.advance(1 + w_.rnd(static_cast<std::size_t>(w_.nstreams)));  // the GPU moves on between queries
    return w_.completed[e >> 40] >= pos(e);
  }
  void wait(event_id e) override {
    if (w_.event_fails()) {
      std::copy(w_.queued, w_.queued + 8, w_.completed);
      throw cuda_error("injected event wait failure", 4);
    }
    w_.completed[e >> 40] = std::max(w_.completed[e >> 40], pos(e));
  }
  void release(event_id) noexcept override { --w_.events_out; }

 private:
  world& w_;
};

struct config {
  int nstreams, progress, fault_every;
  double growth_slack;
  bool keep_mappings = true;
  std::size_t chunk = 0;  // pages per chunk (0: the device makes none)
  bool remap_own = false;
  bool growth_chunks = false;
  int event_faults = 0;
  std::size_t chunk_min = 0;  // chunk_min_size in pages (0: chunks of one size)
  bool fit_address = false;
};

void run(const config& c, std::uint64_t seed, int iters, pool_counters* out = nullptr,
         long* event_failures = nullptr) {
  world w;
  w.rng.seed(seed);
  w.nstreams = c.nstreams;
  w.progress = c.progress;
  w.fault_every = c.fault_every;
  w.event_faults = c.event_faults;
  w.chunks = c.chunk > 0;
  auto dev = std::make_shared<model_device>(w, 384 * MiB);
  pool_options o;
  if (w.rnd(2)) o.release_threshold = 64 * MiB;
  o.wait_to_remap = w.rnd(4) == 0;
  o.growth_slack = c.growth_slack;
  o.keep_mappings = c.keep_mappings;
  o.remap_own = c.remap_own;
  o.growth_chunks = c.growth_chunks;
  if (c.chunk) o.chunk_size = c.chunk * PG;
  o.chunk_min_size = c.chunk_min * PG;
  o.fit_address = c.fit_address;
  struct held {
    std::uintptr_t p;
    std::size_t n;
    stream_t s;
  };
  std::vector<held> live;
  // VRAMKIT_STREAM_DIGEST=1: one line per run with the pool's counters and a
  // hash of every address it handed out, to compare two builds of the pool.
  std::uint64_t digest = 14695981039346656037ull;
  pool_counters final_counters;
  std::size_t final_peak = 0;
  {
    pool_resource pool(dev, std::make_shared<model_streams>(w), o);
    auto stream = [&] { return static_cast<stream_t>(1 + w.rnd(static_cast<std::size_t>(c.nstreams))); };
    for (int it = 0; it < iters; ++it) {
      int op = static_cast<int>(w.rnd(100));
      if (op < 40) {
        stream_t s = stream();
        std::size_t n = w.rnd(3) ? 1 + w.rnd(3 * MiB) : 1 + w.rnd(48 * MiB);
        void* p = nullptr;
        try {
          p = pool.allocate(n, s);
        } catch (const out_of_memory&) {
        } catch (const cuda_error&) {
        }
        if (p) {
          auto a = reinterpret_cast<std::uintptr_t>(p);
          digest = (digest ^ a) * 1099511628211ull;
          w.check_block(a, n, s);
          live.push_back({a, n, s});
          w.mark_use(a, n, s);
        }
      } else if (op < 55 && !live.empty()) {
        auto& b = live[w.rnd(live.size())];
        w.mark_use(b.p, b.n, b.s);
      } else if (op < 60 && !live.empty()) {
        auto& b = live[w.rnd(live.size())];
        stream_t t = stream();
        pool.record_stream(reinterpret_cast<void*>(b.p), t);
        w.mark_use(b.p, b.n, t);
      } else if (op < 90 && !live.empty()) {
        std::size_t i = w.rnd(live.size());
        held b = live[i];
        live[i] = live.back();
        live.pop_back();
        stream_t f = w.rnd(5) == 0 ? stream() : b.s;  // sometimes freed on another stream
        w.mark_use(b.p, b.n, f);
        pool.deallocate_checked(reinterpret_cast<void*>(b.p), 0, f);
      } else if (op < 98) {
        w.advance(stream());
      } else if (op < 99) {
        try {
          pool.release_cached();
        } catch (const cuda_error&) {  // an event call failed (event_faults)
        }
      } else {
        try {
          pool.set_reserve_limit(w.rnd(2) ? 0 : 256 * MiB);
        } catch (const cuda_error&) {
        }
      }
      ASSERT_NO_THROW(pool.check_invariants()) << "step " << it;
      w.prune();
    }
    for (auto& b : live) pool.deallocate_checked(reinterpret_cast<void*>(b.p), 0, b.s);
    final_counters = pool.counters();
    if (out) *out = final_counters;
    final_peak = pool.state().peak_reserved_bytes;
    // A program destroys a pool only after its work is done (the destructor does not wait).
    std::copy(w.queued, w.queued + 8, w.completed);
  }
  if (std::getenv("VRAMKIT_STREAM_DIGEST")) {
    const pool_counters& k = final_counters;
    const std::string chunked = c.chunk ? " chunk " + std::to_string(c.chunk) + " chunks " +
                                              std::to_string(final_counters.chunks_created) + "/" +
                                              std::to_string(final_counters.chunks_released) +
                                              (c.chunk_min ? " min " + std::to_string(c.chunk_min) : "")
                                        : "";
    std::printf("digest streams %d progress %d faults %d slack %.2f keep %d%s%s seed %llu: addrs %016llx "
                "peak_reserved %zu created %zu destroyed %zu mapped %zu unmapped %zu remapped %zu reused %zu "
                "map_calls %zu reclaims %zu\n",
                c.nstreams, c.progress, c.fault_every, c.growth_slack, int{c.keep_mappings}, chunked.c_str(),
                std::string(c.remap_own ? " remap_own" : "").append(c.growth_chunks ? " growth_chunks" : "").c_str(),
                static_cast<unsigned long long>(seed), static_cast<unsigned long long>(digest), final_peak,
                k.pages_created, k.pages_destroyed, k.pages_mapped, k.pages_unmapped, k.pages_remapped,
                k.mappings_reused, k.map_calls, k.stream_reclaims);
  }
  if (event_failures) *event_failures += w.event_failures;
  EXPECT_EQ(w.va_races, 0) << "a block overlapped memory another stream's pending work uses";
  EXPECT_EQ(w.byte_races, 0) << "a block shared physical bytes with another stream's pending work";
  EXPECT_EQ(w.unmap_races, 0) << "an address was unmapped while pending work used it";
  EXPECT_EQ(w.map_over, 0) << "an address was mapped twice";
  EXPECT_EQ(w.bad_unmaps, 0) << "an address was unmapped that was not mapped";
  EXPECT_EQ(w.destroyed_mapped, 0) << "a page was destroyed while still mapped";
  EXPECT_EQ(w.events_out, 0) << "events recorded and never released";
  EXPECT_EQ(w.chunk_cuts, 0) << "part of a chunk was unmapped";
  EXPECT_EQ(w.chunk_misuse, 0) << "a chunk was mapped by pages, at another size, or destroyed twice";
  EXPECT_TRUE(w.at.empty()) << "addresses still mapped after the pool is gone";
  EXPECT_EQ(dev->created(), 0u) << "pages left after the pool is gone";
}

}  // namespace

TEST(pool_streams, lagging_gpu_queues_faults_and_physical_pages) {
  const config configs[] = {
      {3, 0, 0, 0.02}, {1, 0, 23, 0.02}, {3, 2, 7, 0.02},        {2, 0, 7, 0.0},
      {2, 3, 7, 0.0},  {3, 2, 7, 0.02, false}, {2, 3, 7, 0.0, false},
      // Chunks of 4 and 8 pages, with and without faults and kept mappings.
      {3, 2, 0, 0.02, true, 4}, {2, 3, 7, 0.0, true, 4}, {1, 0, 23, 0.02, true, 8}, {3, 2, 7, 0.02, false, 4},
      // remap_own: pages taken from a stream's own frees before its work is done.
      {3, 2, 7, 0.02, true, 0, true}, {2, 0, 0, 0.0, true, 0, true}, {1, 3, 23, 0.0, true, 0, true},
      {3, 2, 7, 0.02, true, 4, true}, {2, 0, 7, 0.0, true, 8, true},
      // Chunks at blocks' ends, with and without remap_own.
      {3, 2, 7, 0.02, true, 4, false, true}, {2, 3, 0, 0.0, true, 4, true, true},
      // Chunks of 8, 4 and 2 pages (chunk_min_size), with remap_own and at blocks' ends.
      {3, 2, 7, 0.02, true, 8, true, false, 0, 2}, {2, 3, 0, 0.0, true, 8, true, true, 0, 2},
      // fit:address, with remap_own, chunks and without kept mappings.
      {3, 2, 7, 0.02, true, 0, true, false, 0, 0, true}, {2, 3, 7, 0.0, true, 4, true, true, 0, 0, true},
      {3, 2, 0, 0.02, false, 4, false, false, 0, 0, true},
  };
  // Seeds 32 and 37 once found a page given back while an old address of it
  // was still mapped.
  std::vector<std::uint64_t> seeds = {1, 2, 3, 4, 5, 6, 32, 37};
#if defined(__SANITIZE_THREAD__)
  seeds = {1, 32};  // one thread: ThreadSanitizer adds only time here (the plain and ASan runs take all)
#endif
  // VRAMKIT_STREAM_SEEDS=N runs seeds 1..N instead (a longer search).
  if (const char* n = std::getenv("VRAMKIT_STREAM_SEEDS")) {
    seeds.clear();
    for (std::uint64_t i = 1; i <= std::strtoull(n, nullptr, 10); ++i) seeds.push_back(i);
  }
  std::size_t early = 0, early_waits = 0;  // remap_own configs must take pages early, and wait
  for (const config& c : configs)
    for (std::uint64_t seed : seeds) {
      SCOPED_TRACE(testing::Message() << "streams " << c.nstreams << ", progress " << c.progress << ", faults every "
                                      << c.fault_every << ", growth_slack "
                                      << c.growth_slack << ", keep_mappings " << c.keep_mappings << ", chunk " << c.chunk
                                      << ", remap_own " << c.remap_own << ", growth_chunks " << c.growth_chunks
                                      << ", chunk_min " << c.chunk_min << ", fit_address " << c.fit_address
                                      << ", seed " << seed);
      pool_counters k;
      run(c, seed, 10000, &k);
      if (HasFatalFailure()) return;
      if (c.remap_own) {
        early += k.pages_taken_early;
        early_waits += k.early_waits;
      } else {
        EXPECT_EQ(k.pages_taken_early + k.early_waits, 0u);
      }
    }
  EXPECT_GT(early, 100u) << "the remap_own runs took (almost) no page early: they test nothing";
  EXPECT_GT(early_waits, 0u) << "no old address of a page taken early was ever needed before its work was done";
}

// Event calls that fail now and then (record, query, wait): the pool stays
// consistent after each, never hands out memory that pending work uses, and
// gives back every event it recorded and every page.
TEST(pool_streams, event_calls_that_fail) {
  const config configs[] = {
      {3, 2, 0, 0.02, true, 0, false, false, 7},  {2, 3, 11, 0.0, true, 0, false, false, 5},
      {3, 2, 0, 0.02, true, 0, true, false, 7},   {2, 0, 7, 0.0, true, 4, true, false, 9},
      {3, 3, 0, 0.02, true, 4, true, true, 13},
  };
  std::vector<std::uint64_t> seeds = {1, 2, 3};
#if defined(__SANITIZE_THREAD__)
  seeds = {1};
#endif
  if (const char* n = std::getenv("VRAMKIT_STREAM_SEEDS")) {
    seeds.clear();
    for (std::uint64_t i = 1; i <= std::strtoull(n, nullptr, 10); ++i) seeds.push_back(i);
  }
  for (const config& c : configs)
    for (std::uint64_t seed : seeds) {
      SCOPED_TRACE(testing::Message() << "streams " << c.nstreams << ", progress " << c.progress << ", faults every "
                                      << c.fault_every << ", event faults every " << c.event_faults << ", chunk "
                                      << c.chunk << ", remap_own " << c.remap_own << ", seed " << seed);
      long failed = 0;
      run(c, seed, 6000, nullptr, &failed);
      if (HasFatalFailure()) return;
      EXPECT_GT(failed, 100) << "few event calls failed: the run tests little";
    }
}
