// chunk_size: where the large arena grows under one block, the pool creates
// chunks (one handle over several pages, mapped whole) and single pages for
// the rest. Chunks never move: the pool gives a chunk lying wholly in free
// memory back when it must move memory, and keeps a chunk that a live block
// still touches. Host page device (real mmap'd pages).
#include <gtest/gtest.h>

#include <cstring>
#include <initializer_list>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "forwarding_device.hpp"
#include "vramkit/error.hpp"
#include "vramkit/mr/pool_resource.hpp"
#include "vramkit/platform/host_page_device.hpp"

using namespace vramkit;

namespace {
constexpr std::size_t MiB = std::size_t{1} << 20, GiB = std::size_t{1} << 30, PG = 2 * MiB;

pool_options chunks(std::size_t bytes, double slack = 0.02) {
  pool_options o;
  o.chunk_size = bytes;
  o.growth_slack = slack;
  return o;
}

// Counts chunk calls; fails the k-th map_chunk or create_chunk when asked;
// makes no chunks at all with `none`.
class chunk_device final : public test::forwarding_device {
 public:
  explicit chunk_device(std::shared_ptr<page_device> in) : forwarding_device(std::move(in)) {}
  page_handle create_chunk(std::size_t n) override {
    if (none) return 0;
    if (fail_create_at && ++creates == fail_create_at) throw cuda_error("injected create_chunk failure", 1);
    return in_->create_chunk(n);
  }
  void map_chunk(std::uintptr_t va, page_handle h, std::size_t n) override {
    if (fail_map_at && ++maps == fail_map_at) throw cuda_error("injected map_chunk failure", 1);
    in_->map_chunk(va, h, n);
  }
  bool map_replaces() const noexcept override { return in_->map_replaces(); }
  std::string name() const override { return "chunks"; }
  bool none = false;
  int fail_create_at = 0, fail_map_at = 0, creates = 0, maps = 0;
};

// What the pool holds equals what the device holds, and the invariants hold.
void consistent(const pool_resource& pool, const page_device& dev) {
  pool.check_invariants();
  EXPECT_EQ(pool.state().reserved_bytes, dev.created_bytes());
}

// After a failure the pool goes on: a request of `bytes` gets its memory,
// then that and `keep` are freed and everything goes back to the device.
void goes_on(pool_resource& pool, const page_device& dev, std::size_t bytes, void* keep, std::size_t keep_bytes) {
  void* p = pool.allocate(bytes, 0);
  std::memset(p, 7, bytes);
  consistent(pool, dev);
  pool.deallocate(p, bytes, 0);
  pool.deallocate(keep, keep_bytes, 0);
  pool.release_cached();
  consistent(pool, dev);
  EXPECT_EQ(dev.created_bytes(), 0u);
}
// Frees the given blocks and releases the cache: everything goes back to the device.
void frees_all(pool_resource& pool, const page_device& dev, std::initializer_list<std::pair<void*, std::size_t>> held) {
  for (auto [p, n] : held) pool.deallocate(p, n, 0);
  pool.release_cached();
  consistent(pool, dev);
  EXPECT_EQ(dev.created_bytes(), 0u);
}
}  // namespace

TEST(pool_chunks, bulk_growth_comes_in_chunks_and_single_pages_for_the_rest) {
  auto dev = std::make_shared<host_page_device>(4 * GiB);
  pool_resource pool(dev, nullptr, chunks(8 * MiB));
  // 70 MiB at the large arena's start: pages 0..34, chunks of 4 pages over
  // 0..31, single pages for 32..34.
  void* a = pool.allocate(70 * MiB, 0);
  auto c = pool.counters();
  EXPECT_EQ(c.chunks_created, 8u);
  EXPECT_EQ(c.pages_created, 35u);
  EXPECT_EQ(pool.usage().in_chunks, 32u);
  consistent(pool, *dev);
  // The device's calls were timed (mmap for the maps; bookkeeping for the creates).
  EXPECT_GT(pool.counters().page_map_ns, 0u);
  EXPECT_GT(pool.counters().page_create_ns, 0u);
  EXPECT_EQ(pool.counters().page_unmap_ns + pool.counters().page_destroy_ns, 0u);
  std::memset(a, 0x5a, 70 * MiB);  // all of it is memory
  // Freed and asked for again: the same place, nothing created or mapped.
  pool.deallocate(a, 70 * MiB, 0);
  void* b = pool.allocate(70 * MiB, 0);
  EXPECT_EQ(b, a);
  EXPECT_EQ(pool.counters().pages_created, 35u);
  EXPECT_EQ(pool.counters().pages_mapped, c.pages_mapped);
  pool.deallocate(b, 70 * MiB, 0);
  consistent(pool, *dev);
  pool.release_cached();
  EXPECT_GT(pool.counters().page_unmap_ns, 0u);
  EXPECT_GT(pool.counters().page_destroy_ns, 0u);
}

TEST(pool_chunks, release_gives_back_chunks_wholly_free_and_keeps_those_a_live_block_touches) {
  auto dev = std::make_shared<host_page_device>(4 * GiB);
  pool_resource pool(dev, nullptr, chunks(8 * MiB));
  void* a = pool.allocate(64 * MiB, 0);
  ASSERT_EQ(pool.counters().chunks_created, 8u);
  pool.deallocate(a, 64 * MiB, 0);
  void* b = pool.allocate(10 * MiB, 0);  // over the first chunks, in place
  EXPECT_EQ(b, a);
  // Pages 5..7 of chunk 1 are in no live block but cannot move: b holds page 4.
  EXPECT_EQ(pool.usage().chunk_free_held, 3u);
  pool.release_cached();
  consistent(pool, *dev);
  // 10 MiB touch pages 0..4: chunks 0 and 1 stay, the six others went back.
  EXPECT_EQ(pool.counters().chunks_released, 6u);
  EXPECT_EQ(pool.usage().in_chunks, 8u);
  EXPECT_EQ(pool.state().reserved_bytes, 16 * MiB);
  std::memset(b, 1, 10 * MiB);
  pool.deallocate(b, 10 * MiB, 0);
  EXPECT_EQ(pool.usage().chunk_free_held, 0u);  // no chunk touched by a live block
  pool.release_cached();
  consistent(pool, *dev);
  EXPECT_EQ(pool.state().reserved_bytes, 0u);
  EXPECT_EQ(dev->created_bytes(), 0u);
  EXPECT_EQ(pool.counters().chunks_released, 8u);
}

TEST(pool_chunks, memory_that_must_move_comes_from_a_chunk_given_back) {
  auto dev = std::make_shared<host_page_device>(4 * GiB);
  pool_resource pool(dev, nullptr, chunks(8 * MiB, 0.0));
  void* a = pool.allocate(64 * MiB, 0);     // chunks over pages 0..31
  void* keep = pool.allocate(2 * MiB, 0);   // page 32: A's place cannot grow
  pool.deallocate(a, 64 * MiB, 0);
  // 100 MiB do not fit in A's place; with no growth slack the pool moves
  // memory rather than grow past the peak: A's chunks are given back and
  // single pages made where the block goes.
  void* b = pool.allocate(100 * MiB, 0);
  auto c = pool.counters();
  EXPECT_GT(c.chunks_released, 0u);
  consistent(pool, *dev);
  EXPECT_LE(pool.state().reserved_bytes, 102 * MiB + 8 * MiB);
  std::memset(b, 3, 100 * MiB);
  frees_all(pool, *dev, {{b, 100 * MiB}, {keep, 2 * MiB}});
}

TEST(pool_chunks, a_device_without_chunks_gets_single_pages) {
  auto inner = std::make_shared<host_page_device>(4 * GiB);
  auto dev = std::make_shared<chunk_device>(inner);
  dev->none = true;
  pool_resource pool(dev, nullptr, chunks(8 * MiB));
  void* a = pool.allocate(64 * MiB, 0);
  EXPECT_EQ(pool.counters().chunks_created, 0u);
  EXPECT_EQ(pool.counters().pages_created, 32u);
  consistent(pool, *dev);
  pool.deallocate(a, 64 * MiB, 0);
}

TEST(pool_chunks, a_failing_chunk_call_loses_nothing) {
  for (int which : {0, 1}) {
    for (int at : {1, 3}) {
      auto inner = std::make_shared<host_page_device>(4 * GiB);
      auto dev = std::make_shared<chunk_device>(inner);
      (which ? dev->fail_map_at : dev->fail_create_at) = at;
      pool_resource pool(dev, nullptr, chunks(8 * MiB));
      void* keep = pool.allocate(4 * MiB, 0);
      EXPECT_THROW(pool.allocate(64 * MiB, 0), cuda_error);
      consistent(pool, *dev);
      EXPECT_EQ(pool.usage().in_chunks, 0u);  // the chunks made before the failure went back
      goes_on(pool, *dev, 64 * MiB, keep, 4 * MiB);
    }
  }
}

TEST(pool_chunks, reserve_limit_and_out_of_memory) {
  auto dev = std::make_shared<host_page_device>(4 * GiB);
  pool_options o = chunks(16 * MiB);
  o.reserve_limit = 100 * MiB;
  pool_resource pool(dev, nullptr, o);
  void* a = pool.allocate(90 * MiB, 0);
  EXPECT_LE(pool.state().reserved_bytes, 100 * MiB);
  EXPECT_THROW(pool.allocate(20 * MiB, 0), out_of_memory);
  consistent(pool, *dev);
  pool.deallocate(a, 90 * MiB, 0);
  // Everything free: a request of the whole limit elsewhere gets the chunks' memory back.
  void* keep = pool.allocate(2 * MiB, 0);
  void* b = pool.allocate(96 * MiB, 0);
  consistent(pool, *dev);
  EXPECT_LE(pool.state().reserved_bytes, 100 * MiB);
  pool.deallocate(b, 96 * MiB, 0);
  pool.deallocate(keep, 2 * MiB, 0);
}

TEST(pool_chunks, trim_to_release_threshold_gives_chunks_back) {
  auto dev = std::make_shared<host_page_device>(4 * GiB);
  pool_options o = chunks(8 * MiB);
  o.release_threshold = 0;
  pool_resource pool(dev, nullptr, o);
  void* a = pool.allocate(64 * MiB, 0);
  pool.deallocate(a, 64 * MiB, 0);
  consistent(pool, *dev);
  EXPECT_EQ(pool.state().reserved_bytes, 0u);
  EXPECT_EQ(pool.counters().chunks_released, pool.counters().chunks_created);
}

// 4000 random requests and frees (some on a second stream, releases now and
// then) with the invariants checked along the way; everything goes back at
// the end. Calls each_op with the counters after every operation.
template <class F>
void random_work(const pool_options& o, unsigned seed, F each_op) {
  auto dev = std::make_shared<host_page_device>(8 * GiB);
  pool_resource pool(dev, nullptr, o);
  std::mt19937_64 rng(seed);
  std::vector<std::pair<void*, std::size_t>> live;
  for (int i = 0; i < 4000; ++i) {
    if (live.empty() || rng() % 100 < 55) {
      std::size_t n = rng() % 4 == 0 ? (1 + rng() % 200) * MiB : 1 + rng() % (4 * MiB);
      try {
        void* p = pool.allocate(n, rng() % 3 == 0 ? 7 : 0);
        static_cast<char*>(p)[n - 1] = 1;
        live.emplace_back(p, n);
      } catch (const out_of_memory&) {
      }
    } else {
      std::size_t k = rng() % live.size();
      pool.deallocate(live[k].first, live[k].second, 0);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
    }
    each_op(pool.counters());
    if (i % 97 == 0) pool.check_invariants();
    if (i % 1000 == 999) pool.release_cached();
  }
  consistent(pool, *dev);
  for (auto& [p, n] : live) pool.deallocate(p, n, 0);
  pool.release_cached();
  consistent(pool, *dev);
  EXPECT_EQ(dev->created_bytes(), 0u) << o.to_string();
  EXPECT_GT(pool.counters().chunks_created, 0u);
  EXPECT_EQ(pool.counters().chunk_pages_released, pool.counters().chunk_pages_created);
}

TEST(pool_chunks, random_work_keeps_the_invariants) {
  for (int growth : {0, 1})
    for (std::size_t chunk : {4 * MiB, 16 * MiB, 20 * MiB}) {
      pool_options o = chunks(chunk);
      o.reserve_limit = 3 * GiB;
      o.growth_chunks = growth != 0;
      random_work(o, static_cast<unsigned>(chunk >> 20), [](const pool_counters&) {});
    }
}

TEST(pool_chunks, growth_chunks_reach_past_a_small_block_into_the_free_memory_after_it) {
  auto dev = std::make_shared<host_page_device>(4 * GiB);
  pool_options o = chunks(8 * MiB);
  o.growth_chunks = true;
  pool_resource pool(dev, nullptr, o);
  // 3 MiB at the large arena's start: pages 0..1, inside the chunk place 0..3,
  // which reaches into the free memory after the block: one chunk there.
  void* a = pool.allocate(3 * MiB, 0);
  auto c = pool.counters();
  EXPECT_EQ(c.chunks_created, 1u);
  EXPECT_EQ(c.growth_chunks, 1u);
  EXPECT_EQ(c.pages_created, 4u);
  consistent(pool, *dev);
  // The next blocks take the chunk's free part (pages 2..3 hold 5 MiB from
  // 3 MiB on): nothing made. The one after goes past it: the next chunk.
  void* b = pool.allocate(4 * MiB, 0);
  EXPECT_EQ(pool.counters().pages_created, 4u);
  void* d = pool.allocate(3 * MiB, 0);
  EXPECT_EQ(pool.counters().chunks_created, 2u);
  EXPECT_EQ(pool.counters().pages_created, 8u);
  consistent(pool, *dev);
  std::memset(a, 1, 3 * MiB);
  std::memset(b, 2, 4 * MiB);
  std::memset(d, 3, 3 * MiB);
  // Without growth_chunks: single pages for blocks smaller than a chunk.
  auto dev2 = std::make_shared<host_page_device>(4 * GiB);
  pool_resource plain(dev2, nullptr, chunks(8 * MiB));
  void* e = plain.allocate(3 * MiB, 0);
  EXPECT_EQ(plain.counters().chunks_created, 0u);
  EXPECT_EQ(plain.counters().pages_created, 2u);
  plain.deallocate(e, 3 * MiB, 0);
  frees_all(pool, *dev, {{a, 3 * MiB}, {b, 4 * MiB}, {d, 3 * MiB}});
}

TEST(pool_chunks, a_failure_after_a_growth_chunk_gives_it_back_and_recounts_its_neighbour) {
  for (int at : {1, 2}) {
    auto inner = std::make_shared<host_page_device>(4 * GiB);
    auto dev = std::make_shared<chunk_device>(inner);
    pool_options o = chunks(8 * MiB);
    o.growth_chunks = true;
    pool_resource pool(dev, nullptr, o);
    void* keep = pool.allocate(9 * MiB, 0);  // pages 0..4: a chunk over 0..3, page 4 in the next place's chunk
    consistent(pool, *dev);
    dev->fail_map_at = dev->maps + at;  // a later chunk's map fails
    try {
      void* x = pool.allocate(20 * MiB, 0);
      pool.deallocate(x, 20 * MiB, 0);
    } catch (const cuda_error&) {
    }
    consistent(pool, *dev);
    dev->fail_map_at = 0;
    goes_on(pool, *dev, 20 * MiB, keep, 9 * MiB);
  }
}

// Hundreds of free blocks holding the outer parts of growth chunks (nothing
// they can give) stand before the ones whose chunks can go back: a trim and a
// request at the reserve limit still reach those.
struct straddled {
  std::shared_ptr<host_page_device> dev;
  std::unique_ptr<pool_resource> pool;
  std::vector<void*> small;
  void* big[2] = {nullptr, nullptr};
  explicit straddled(bool growth, std::size_t limit = 0) {
    constexpr std::size_t KiB = 1024;
    dev = std::make_shared<host_page_device>(GiB, 64 * KiB);
    pool_options o;
    o.small_threshold = 4 * KiB;
    o.small_segment = 64 * KiB;
    o.large_rounding = 64 * KiB;
    o.chunk_size = 128 * KiB;
    o.growth_chunks = growth;
    o.growth_slack = 0.5;
    o.reserve_limit = limit;
    pool = std::make_unique<pool_resource>(dev, nullptr, o);
    for (int i = 0; i < 700; ++i) small.push_back(pool->allocate(96 * KiB, 0));
    big[0] = pool->allocate(2 * MiB, 0);
    small.push_back(pool->allocate(96 * KiB, 0));
    big[1] = pool->allocate(2 * MiB, 0);
    small.push_back(pool->allocate(96 * KiB, 0));
    for (int i = 1; i < 700; i += 2) pool->deallocate(small[i], 96 * KiB, 0);
    for (void* p : big) pool->deallocate(p, 2 * MiB, 0);
    pool->check_invariants();
  }
};

TEST(pool_chunks, chunks_behind_hundreds_of_straddled_free_blocks_still_go_back) {
  straddled plain(false), growth(true);
  ASSERT_GT(growth.pool->counters().growth_chunks, 300u);
  plain.pool->release_cached();
  growth.pool->release_cached();
  consistent(*growth.pool, *growth.dev);
  // The two freed 2 MiB blocks' chunks went back (and the other chunks wholly
  // in free memory): no more held than without growth chunks, where the
  // small blocks' single pages go back instead.
  EXPECT_GE(growth.pool->counters().chunks_released, 16u);
  EXPECT_LE(growth.pool->state().reserved_bytes, plain.pool->state().reserved_bytes * 3 / 2);
  // At a reserve limit equal to what it holds, a 3 MiB request gets the
  // chunks of the freed blocks.
  const std::size_t held = straddled(true).pool->state().reserved_bytes;
  straddled limited(true, held);
  void* p = limited.pool->allocate(3 * MiB, 0);
  std::memset(p, 9, 3 * MiB);
  consistent(*limited.pool, *limited.dev);
  limited.pool->deallocate(p, 3 * MiB, 0);
}

TEST(pool_chunks, chunk_size_must_be_pages) {
  auto dev = std::make_shared<host_page_device>(GiB);
  EXPECT_THROW(pool_resource(dev, nullptr, chunks(3 * MiB)), invalid_argument);
  EXPECT_THROW(pool_resource(dev, nullptr, chunks(5 * MiB)), invalid_argument);
  {
    // One page or less: single pages only (page_size raised past the default chunk_size).
    pool_resource one(dev, nullptr, chunks(PG));
    void* p = one.allocate(64 * MiB, 0);
    EXPECT_EQ(one.counters().chunks_created, 0u);
    one.deallocate(p, 64 * MiB, 0);
    pool_options big;
    big.page_size = 32 * MiB;
    auto dev32 = std::make_shared<host_page_device>(GiB, 32 * MiB);
    pool_resource coarse(dev32, nullptr, big);  // default chunk_size (16 MiB) below the page
    void* q = coarse.allocate(100 * MiB, 0);
    EXPECT_EQ(coarse.counters().chunks_created, 0u);
    coarse.deallocate(q, 100 * MiB, 0);
  }
  pool_options o;
  o.parse("chunk_size:16MiB");
  EXPECT_EQ(o.chunk_size, 16 * MiB);
  EXPECT_NE(o.to_string().find("chunk_size:16777216"), std::string::npos);
  EXPECT_THROW(o.parse("chunk_size:lots"), invalid_argument);
}

// chunk_min_size: where a whole chunk does not fit inside a block, halves of
// it, quarters, ... down to chunk_min_size, each at a multiple of its size.
pool_options split_chunks(std::size_t chunk, std::size_t min, double slack = 0.02) {
  pool_options o = chunks(chunk, slack);
  o.chunk_min_size = min;
  return o;
}

TEST(pool_chunks, chunk_min_size_covers_a_block_with_halves_of_chunks) {
  auto dev = std::make_shared<host_page_device>(4 * GiB);
  pool_resource pool(dev, nullptr, split_chunks(16 * MiB, 4 * MiB));
  // 60 MiB at the large arena's start: pages 0..29. Chunks of 8 pages over
  // 0..23, one of 4 over 24..27, one of 2 over 28..29: five handles. With
  // chunks of one size: three chunks and six single pages, nine handles.
  void* a = pool.allocate(60 * MiB, 0);
  auto c = pool.counters();
  EXPECT_EQ(c.chunks_created, 5u);
  EXPECT_EQ(c.chunk_pages_created, 30u);
  EXPECT_EQ(c.pages_created, 30u);
  EXPECT_EQ(pool.usage().in_chunks, 30u);
  consistent(pool, *dev);
  std::memset(a, 0x5a, 60 * MiB);
  // A block starting at an odd page (31): a single page there, then the
  // largest chunk each place takes.
  void* keep = pool.allocate(2 * MiB, 0);   // page 30
  void* b = pool.allocate(24 * MiB, 0);     // pages 31..42: 31 single, 32..39 chunk of 8, 40..41 of 2, 42 single
  EXPECT_EQ(pool.counters().chunks_created, 7u);
  EXPECT_EQ(pool.counters().chunk_pages_created, 40u);
  consistent(pool, *dev);
  std::memset(b, 1, 24 * MiB);
  auto dev1 = std::make_shared<host_page_device>(4 * GiB);
  pool_resource one(dev1, nullptr, chunks(16 * MiB));
  void* o = one.allocate(60 * MiB, 0);
  EXPECT_EQ(one.counters().chunks_created, 3u);
  EXPECT_EQ(one.counters().chunk_pages_created, 24u);
  EXPECT_EQ(one.counters().pages_created, 30u);
  one.deallocate(o, 60 * MiB, 0);
  frees_all(pool, *dev, {{a, 60 * MiB}, {keep, 2 * MiB}, {b, 24 * MiB}});
  EXPECT_EQ(pool.counters().chunks_released, pool.counters().chunks_created);
  EXPECT_EQ(pool.counters().chunk_pages_released, pool.counters().chunk_pages_created);
}

TEST(pool_chunks, a_small_chunk_in_free_memory_goes_back_when_memory_must_move) {
  auto dev = std::make_shared<host_page_device>(4 * GiB);
  pool_resource pool(dev, nullptr, split_chunks(16 * MiB, 4 * MiB, 0.0));
  void* a = pool.allocate(12 * MiB, 0);     // pages 0..5: a chunk of 4 pages, one of 2
  void* keep = pool.allocate(2 * MiB, 0);   // page 6
  ASSERT_EQ(pool.counters().chunks_created, 2u);
  pool.deallocate(a, 12 * MiB, 0);
  // 20 MiB do not fit in a's place; with no slack, memory moves: a's chunks
  // (wholly in free memory) go back and pages are made where b goes.
  void* b = pool.allocate(20 * MiB, 0);
  EXPECT_EQ(pool.counters().chunks_released, 2u);
  EXPECT_EQ(pool.counters().chunk_pages_released, 6u);
  consistent(pool, *dev);
  EXPECT_LE(pool.state().reserved_bytes, 22 * MiB + 4 * MiB);
  std::memset(b, 3, 20 * MiB);
  frees_all(pool, *dev, {{b, 20 * MiB}, {keep, 2 * MiB}});
}

TEST(pool_chunks, growth_chunks_with_chunk_min_size_are_of_the_smallest_size) {
  auto dev = std::make_shared<host_page_device>(4 * GiB);
  pool_options o = split_chunks(16 * MiB, 4 * MiB);
  o.growth_chunks = true;
  pool_resource pool(dev, nullptr, o);
  // 5 MiB at the large arena's start: pages 0..2. Its interior takes a 2-page chunk over 0..1;
  // its last page lies in the 2-page place 2..3, which reaches 3 MiB into the free memory after
  // it: a growth chunk of 4 MiB there (of 16 MiB without chunk_min_size).
  void* a = pool.allocate(5 * MiB, 0);
  auto c = pool.counters();
  EXPECT_EQ(c.chunks_created, 2u);
  EXPECT_EQ(c.growth_chunks, 1u);
  EXPECT_EQ(c.chunk_pages_created, 4u);
  EXPECT_EQ(pool.state().reserved_bytes, 8 * MiB);
  consistent(pool, *dev);
  // The next 3 MiB take the growth chunk's free part: nothing made.
  void* b = pool.allocate(3 * MiB, 0);
  EXPECT_EQ(pool.counters().chunks_created, 2u);
  EXPECT_EQ(pool.counters().pages_created, 4u);
  std::memset(a, 1, 5 * MiB);
  std::memset(b, 2, 3 * MiB);
  frees_all(pool, *dev, {{a, 5 * MiB}, {b, 3 * MiB}});
}

TEST(pool_chunks, chunk_min_size_random_work_keeps_the_invariants) {
  for (int growth : {0, 1})
    for (auto [chunk, min] : {std::pair{16 * MiB, 4 * MiB}, {64 * MiB, 4 * MiB}, {16 * MiB, 8 * MiB}}) {
      pool_options o = split_chunks(chunk, min);
      o.reserve_limit = 3 * GiB;
      o.growth_chunks = growth != 0;
      std::size_t small_chunks = 0;  // operations after which some chunk made was smaller than chunk_size
      random_work(o, static_cast<unsigned>((chunk + min) >> 20), [&](const pool_counters& c) {
        small_chunks += c.chunk_pages_created != c.chunks_created * (chunk / PG);
      });
      EXPECT_GT(small_chunks, 0u) << "no chunk smaller than chunk_size was made";
    }
}

TEST(pool_chunks, chunk_min_size_must_divide_chunk_size_by_a_power_of_two) {
  auto dev = std::make_shared<host_page_device>(GiB);
  EXPECT_THROW(pool_resource(dev, nullptr, split_chunks(16 * MiB, 2 * MiB)), invalid_argument);   // one page
  EXPECT_THROW(pool_resource(dev, nullptr, split_chunks(16 * MiB, 32 * MiB)), invalid_argument);  // over chunk_size
  EXPECT_THROW(pool_resource(dev, nullptr, split_chunks(24 * MiB, 8 * MiB)), invalid_argument);   // 3x
  EXPECT_THROW(pool_resource(dev, nullptr, split_chunks(16 * MiB, 5 * MiB)), invalid_argument);   // not pages
  {
    // Equal to chunk_size: chunks of one size, as without it.
    pool_resource same(dev, nullptr, split_chunks(16 * MiB, 16 * MiB));
    void* p = same.allocate(60 * MiB, 0);
    EXPECT_EQ(same.counters().chunks_created, 3u);
    same.deallocate(p, 60 * MiB, 0);
  }
  pool_options o;
  o.parse("chunk_size:64MiB,chunk_min_size:4MiB");
  EXPECT_EQ(o.chunk_min_size, 4 * MiB);
  EXPECT_NE(o.to_string().find("chunk_min_size:4194304"), std::string::npos);
  pool_options back;
  back.parse(o.to_string());
  EXPECT_EQ(back.chunk_min_size, 4 * MiB);
  EXPECT_THROW(o.parse("chunk_min_size:few"), invalid_argument);
}

// split_chunks: at the second mark (plan_steps), the chunks left under live
// blocks become single pages holding their bytes; none stays in the pool.
namespace {
// Fails, when armed, the k-th create(), copy() or map() of single pages. Like
// the CUDA driver (and unlike the host simulation) it refuses to map an
// address that is mapped already.
class split_device final : public test::failing_device {
 public:
  explicit split_device(std::shared_ptr<page_device> in) : failing_device(std::move(in)) {}
  void map_chunk(std::uintptr_t va, page_handle h, std::size_t n) override {
    claim(va, n);
    in_->map_chunk(va, h, n);
  }
  void unmap(std::uintptr_t va, std::size_t n) noexcept override {
    for (std::size_t i = 0; i < n; ++i) mapped_.erase(va + i * granularity());
    in_->unmap(va, n);
  }
  void map(std::uintptr_t va, const page_handle* h, std::size_t n) override {
    maybe_fail_map();
    claim(va, n);
    in_->map(va, h, n);
  }
  bool map_replaces() const noexcept override { return false; }
  std::string name() const override { return "split"; }

 private:
  void claim(std::uintptr_t va, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i)
      if (mapped_.count(va + i * granularity())) throw cuda_error("an address mapped already (the driver's rule)", 1);
    for (std::size_t i = 0; i < n; ++i) mapped_.insert(va + i * granularity());
  }
  std::set<std::uintptr_t> mapped_;
};

void fill(void* p, std::size_t n, unsigned seed) {
  auto* b = static_cast<unsigned char*>(p);
  for (std::size_t i = 0; i < n; i += 4096) b[i] = static_cast<unsigned char>(seed + i / 4096);
  b[n - 1] = static_cast<unsigned char>(seed * 7);
}
bool holds(const void* p, std::size_t n, unsigned seed) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; i += 4096)
    if (b[i] != static_cast<unsigned char>(seed + i / 4096)) return false;
  return b[n - 1] == static_cast<unsigned char>(seed * 7);
}

// The first step of a program: weights live on (two blocks, in chunks), a
// temporary in chunks is freed; then the second mark.
struct first_step {
  pool_resource& pool;
  void* w1 = nullptr;
  void* w2 = nullptr;
  static constexpr std::size_t W1 = 100 * MiB, W2 = 70 * MiB, T = 64 * MiB;
  void run() {
    pool.mark_step();  // the program's start
    w1 = pool.allocate(W1, 0);
    void* t = pool.allocate(T, 0);
    w2 = pool.allocate(W2, 0);
    fill(w1, W1, 3);
    fill(w2, W2, 11);
    std::memset(t, 1, T);
    pool.deallocate(t, T, 0);
  }
};
}  // namespace

TEST(pool_chunks, the_second_mark_splits_the_chunks_under_live_blocks_into_pages_holding_their_bytes) {
  for (bool split : {true, false}) {
    SCOPED_TRACE(split ? "split_chunks:true" : "split_chunks:false");
    auto dev = std::make_shared<host_page_device>(4 * GiB);
    pool_options o = chunks(16 * MiB);
    o.split_chunks = split;
    pool_resource pool(dev, nullptr, o);
    first_step s{pool};
    s.run();
    const auto before = pool.counters();
    ASSERT_GT(pool.usage().in_chunks, 0u);
    const std::size_t reserved = pool.state().reserved_bytes;
    pool.mark_step();  // the second: free chunks go back, the others are split
    const auto after = pool.counters();
    EXPECT_GT(after.chunks_released, before.chunks_released) << "the free chunks did not go back";
    if (split) {
      EXPECT_EQ(pool.usage().in_chunks, 0u) << "a chunk stayed past the second mark";
      EXPECT_GT(after.chunks_split, 0u);
      // The split changes what backs the blocks, not how much: the pages of
      // the free chunks went back, the others are there as single pages.
      EXPECT_EQ(pool.state().reserved_bytes,
                reserved - (after.chunk_pages_released - before.chunk_pages_released -
                            (after.pages_created - before.pages_created - 8)) * PG);
    } else {
      EXPECT_GT(pool.usage().in_chunks, 0u);
      EXPECT_EQ(after.chunks_split, 0u);
    }
    EXPECT_TRUE(holds(s.w1, s.W1, 3)) << "the bytes of a block over split chunks changed";
    EXPECT_TRUE(holds(s.w2, s.W2, 11));
    consistent(pool, *dev);
    EXPECT_GE(pool.state().peak_reserved_bytes, pool.state().reserved_bytes);
    // Later marks split nothing more, and the pool goes on as usual.
    pool.mark_step();
    EXPECT_EQ(pool.counters().chunks_split, after.chunks_split);
    frees_all(pool, *dev, {{s.w1, s.W1}, {s.w2, s.W2}});
  }
}

TEST(pool_chunks, a_split_that_stopped_is_tried_again_four_marks_later) {
  // No room for the second chunk's pages at the second mark: the first chunk
  // is split, the others stay. Four marks later the split is tried again and
  // the rest are split; after three tries that all stop, no more.
  for (bool room_later : {true, false}) {
    SCOPED_TRACE(room_later ? "room later" : "never room");
    auto dev = std::make_shared<split_device>(std::make_shared<host_page_device>(4 * GiB));
    pool_resource pool(dev, nullptr, chunks(16 * MiB));
    first_step s{pool};
    s.run();
    dev->reset_counts();
    dev->fail_create_at = 20;  // the second chunk's pages
    pool.mark_step();          // the second mark
    ASSERT_EQ(pool.counters().chunks_split, 1u);
    ASSERT_GT(pool.usage().in_chunks, 0u);
    if (room_later)
      dev->disarm();
    else
      dev->fail_create_at = 9;  // from now on the first page of a chunk fails (the scratch pages are made)
    for (int m = 0; m < 3; ++m) {
      dev->reset_counts();
      pool.mark_step();
      EXPECT_EQ(pool.counters().chunks_split, 1u) << "tried again before its time, mark " << m + 3;
    }
    dev->reset_counts();
    pool.mark_step();  // four marks after the second
    if (room_later) {
      EXPECT_EQ(pool.usage().in_chunks, 0u) << "the split was not tried again";
      EXPECT_GT(pool.counters().chunks_split, 1u);
    } else {
      EXPECT_EQ(pool.counters().chunks_split, 1u);
      EXPECT_GT(pool.usage().in_chunks, 0u);
      // Tried again 8 and 16 marks after that, then never: a device that
      // never has room is asked three more times in all.
      int tries = 0;
      for (int m = 0; m < 40; ++m) {
        dev->reset_counts();
        pool.mark_step();
        tries += dev->creates > 0;
      }
      EXPECT_EQ(tries, 2);
    }
    EXPECT_TRUE(holds(s.w1, s.W1, 3));
    EXPECT_TRUE(holds(s.w2, s.W2, 11));
    consistent(pool, *dev);
    dev->disarm();
    pool.deallocate(s.w2, s.W2, 0);
    goes_on(pool, *dev, 200 * MiB, s.w1, s.W1);
  }
}

TEST(pool_chunks, a_chunk_that_cannot_be_split_stays_whole_with_its_bytes) {
  // No room for its pages, a failing copy (into the scratch pages, or back
  // into the new pages in its place), pages that cannot be mapped in its
  // place (the chunk goes back in: its bytes come from the scratch pages on a
  // device whose mappings keep none): the chunk stays, the blocks over it
  // keep their bytes, the pool stays consistent and goes on.
  for (int how = 0; how < 6; ++how) {
    SCOPED_TRACE(how);
    auto dev = std::make_shared<split_device>(std::make_shared<host_page_device>(4 * GiB));
    pool_resource pool(dev, nullptr, chunks(16 * MiB));
    first_step s{pool};
    s.run();
    const std::size_t in_chunks = pool.usage().in_chunks;
    ASSERT_GT(in_chunks, 0u);
    dev->reset_counts();
    if (how == 0) dev->fail_create_at = 3;   // the scratch pages
    if (how == 1) dev->fail_create_at = 12;  // the first chunk's pages (8 scratch pages first)
    if (how == 2) dev->fail_copy_at = 1;     // into the scratch pages
    if (how == 3) dev->fail_map_at = 2;      // the first chunk's pages in its place (the scratch pages first)
    if (how == 4) dev->fail_copy_at = 2;     // back from the scratch pages, the chunk's new pages in its place
    if (how == 5) dev->fail_create_at = 20;  // the second chunk's pages: the first is split, the others stay
    pool.mark_step();
    EXPECT_EQ(pool.counters().chunks_split, how == 5 ? 1u : 0u);
    EXPECT_GT(pool.usage().in_chunks, 0u) << "the chunk under a live block went";
    EXPECT_TRUE(holds(s.w1, s.W1, 3)) << "a failed split lost a block's bytes";
    EXPECT_TRUE(holds(s.w2, s.W2, 11));
    consistent(pool, *dev);
    dev->disarm();
    pool.deallocate(s.w2, s.W2, 0);
    goes_on(pool, *dev, 200 * MiB, s.w1, s.W1);
  }
}
