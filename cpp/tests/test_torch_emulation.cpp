// The PyTorch allocator emulation under random operation sequences: its
// books must balance after every step in every mode (and, under ASan/UBSan,
// block splitting, merging and unmapping must never touch a dead block).
// The rule-by-rule answers are checked in python/tests/test_torch_emulation.py.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "vramkit/emul/torch_caching.hpp"
#include "vramkit/mr/guard_adaptor.hpp"
#include "vramkit/mr/statistics_adaptor.hpp"
#include "vramkit/runtime.hpp"

using namespace vramkit;
using emul::make_torch_emulator;

namespace {

void check_books(const emul::torch_caching_emulator& e) {
  std::size_t mapped = 0, allocated = 0;
  for (auto& s : e.segments()) {
    std::size_t sum = 0;
    std::uintptr_t at = s.addr;
    for (auto& b : s.blocks) {
      ASSERT_EQ(b.addr, at) << "blocks of a segment must tile it";
      at += b.size;
      sum += b.size;
      if (b.allocated) {
        allocated += b.size;
        ASSERT_LE(b.requested, b.size);
      }
    }
    ASSERT_EQ(sum, s.size);
    mapped += s.size;
  }
  ASSERT_EQ(mapped, e.reserved_bytes());
  ASSERT_EQ(allocated, e.allocated_bytes());
}

void random_run(const std::string& spec, std::size_t capacity, unsigned seed) {
  auto e = make_torch_emulator(spec, capacity);
  std::mt19937_64 rng(seed);
  std::vector<std::pair<void*, std::size_t>> live;
  std::size_t ooms = 0;
  for (int step = 0; step < 4000; ++step) {
    bool alloc = live.empty() || rng() % 100 < 55;
    if (alloc) {
      // sizes from 1 byte to 256 MiB, log-uniform, on one of three streams
      double lg = std::uniform_real_distribution<double>(0, 28)(rng);
      auto n = static_cast<std::size_t>(std::exp2(lg));
      stream_t s = rng() % 3;
      try {
        void* p = e->allocate(n, s);
        ASSERT_NE(p, nullptr);
        ASSERT_GE(e->allocation_size(p), e->round_size(n));
        live.emplace_back(p, n);
      } catch (const out_of_memory&) {
        ++ooms;
      }
    } else {
      std::size_t k = rng() % live.size();
      EXPECT_EQ(e->try_deallocate(live[k].first, live[k].second, 0), free_status::ok);
      live[k] = live.back();
      live.pop_back();
    }
    if (step % 97 == 0) e->release_cached();
    if (step % 50 == 0) check_books(*e);
    if (capacity) {
      ASSERT_LE(e->reserved_bytes(), capacity);
    }
  }
  check_books(*e);
  for (auto& [p, n] : live) EXPECT_EQ(e->try_deallocate(p, n, 0), free_status::ok);
  e->release_cached();
  EXPECT_EQ(e->reserved_bytes(), 0u) << spec << ": empty_cache with nothing live must return everything";
  EXPECT_EQ(e->allocated_bytes(), 0u);
  if (capacity) EXPECT_GT(ooms, 0u) << spec << ": the capacity was meant to be reached";
}

}  // namespace

TEST(TorchEmulation, RandomSequencesKeepTheBooks) {
  const char* specs[] = {"torch-default", "torch-expandable", "torch:max_split_size_mb=64",
                         "torch:roundup_power2_divisions=4", "torch-expandable:max_split_size_mb=64",
                         "torch:garbage_collection_threshold=0.5,per_process_memory_fraction=0.9"};
  unsigned seed = 1;
  for (const char* spec : specs) {
    random_run(spec, std::size_t{3} << 30, seed++);
    if (std::string(spec).find("fraction") == std::string::npos) random_run(spec, 0, seed++);
  }
}

TEST(TorchEmulation, BadFreeIsRefusedAndChangesNothing) {
  auto e = make_torch_emulator("torch-default", 0);
  void* p = e->allocate(1000, 0);
  int x = 0;
  EXPECT_EQ(e->try_deallocate(&x, 4, 0), free_status::not_owned);
  EXPECT_EQ(e->reserved_bytes(), std::size_t{2} << 20);
  EXPECT_EQ(e->try_deallocate(p, 1, 0), free_status::wrong_size);  // refused: still live
  EXPECT_EQ(e->allocated_bytes(), e->round_size(1000));
  EXPECT_EQ(e->try_deallocate(p, 1000, 0), free_status::ok);
  EXPECT_EQ(e->try_deallocate(p, 1000, 0), free_status::not_owned);
  void* q = e->allocate(1000, 0);
  EXPECT_EQ(e->try_deallocate(q, e->round_size(1000), 0), free_status::ok);  // the rounded size, as traces keep it
}

TEST(TorchEmulation, MakeResourceKnowsTheNames) {
  EXPECT_THROW(make_torch_emulator("torch:nope=1", 0), invalid_argument);
  EXPECT_THROW(make_torch_emulator("torch:max_split_size_mb=", 0), invalid_argument);
  EXPECT_THROW(make_torch_emulator("torch:max_split_size_mb", 0), invalid_argument);
  EXPECT_THROW(make_torch_emulator("torch:max_split_size_mb=128:64", 0), invalid_argument);
  auto e = make_torch_emulator("torch-expandable:roundup_power2_divisions=[1:2,>:8]", 0);
  EXPECT_EQ(e->options().conf_line(),
            "expandable_segments:True,roundup_power2_divisions:[1:2,2:8,4:8,8:8,16:8,32:8,64:8,128:8,256:8,512:8,"
            "1024:8,2048:8,4096:8,8192:8,16384:8,32768:8]");
}

namespace {

// Equal free blocks of one stream go by address, and with a real run's
// cudaMalloc addresses given the emulation follows them (worked out in
// python/tests/test_torch_emulation.py: test_equal_free_blocks_go_by_segment_address).
TEST(TorchEmulation, GivenSegmentAddressesBreakBestFitTies) {
  constexpr std::size_t MiB = std::size_t{1} << 20;
  const std::uintptr_t hi = std::uintptr_t{1} << 36, lo = std::uintptr_t{1} << 34;
  for (bool given : {false, true}) {
    auto e = make_torch_emulator("torch-default", 0);
    if (given) e->set_segment_addresses({hi, lo});
    void* b = e->allocate(12 * MiB, 0);  // segment B
    void* a0 = e->allocate(8 * MiB, 0);  // segment A, 20 MiB: [a0 | 12 MiB free]
    e->deallocate(b, 12 * MiB, 0);
    void* a2 = e->allocate(12 * MiB, 0);  // B or A's tail: the lower address
    EXPECT_EQ(a2, given ? static_cast<char*>(a0) + 8 * MiB : b);
    e->deallocate(a0, 8 * MiB, 0);
    void* a3 = e->allocate(20 * MiB, 0);
    EXPECT_EQ(e->state().peak_reserved_bytes, (given ? 52 : 32) * MiB);
    EXPECT_EQ(e->counters().given_addresses_used, given ? 2u : 0u);
    check_books(*e);
    e->deallocate(a2, 12 * MiB, 0);
    e->deallocate(a3, 20 * MiB, 0);
  }
  auto e = make_torch_emulator("torch-default", 0);
  EXPECT_THROW(e->set_segment_addresses({hi, 0}), invalid_argument);
  e->allocate(1000, 0);
  EXPECT_THROW(e->set_segment_addresses({hi}), invalid_argument);
}

// Without a capacity, requests past the emulated address space are out of
// memory: no segment wraps around, no expandable segment is too small.
TEST(TorchEmulation, HugeRequestsWithoutCapacityAreOutOfMemory) {
  for (const char* spec : {"torch-default", "torch-expandable"}) {
    SCOPED_TRACE(spec);
    auto e = make_torch_emulator(spec, 0);
    void* keep = e->allocate(4096, 0);
    if (std::string(spec) == "torch-expandable")  // over a segment's room (9/8 of 1 TiB)
      EXPECT_THROW(e->allocate(std::size_t{1} << 41, 0), out_of_memory);
    EXPECT_THROW(e->allocate(~std::size_t{0}, 0), out_of_memory);       // rounding would wrap
    std::size_t ooms = 0;
    for (int i = 0; i < 4; ++i) {  // 2^63, 2^63, 2^63 - 1, 2^62: none fits (they wrapped the addresses)
      const std::size_t n = i < 2 ? std::size_t{1} << 63 : i == 2 ? (std::size_t{1} << 63) - 1 : std::size_t{1} << 62;
      try {
        e->allocate(n, 0);
      } catch (const out_of_memory&) {
        ++ooms;
      }
    }
    EXPECT_EQ(ooms, 4u);
    check_books(*e);
    EXPECT_EQ(e->allocated_bytes(), e->allocation_size(keep));
    e->deallocate(keep, 4096, 0);
    e->release_cached();
    EXPECT_EQ(e->reserved_bytes(), 0u);
  }
  // Many large requests still get distinct segments, up to the address space.
  auto e = make_torch_emulator("torch-default", 0);
  std::vector<void*> got;
  for (int i = 0; i < 8; ++i) got.push_back(e->allocate(std::size_t{1} << 54, 0));
  for (std::size_t i = 1; i < got.size(); ++i)  // segments one after another, none overlapping
    EXPECT_GE(reinterpret_cast<std::uintptr_t>(got[i]), reinterpret_cast<std::uintptr_t>(got[i - 1]) + (std::uintptr_t{1} << 54));
  EXPECT_THROW(e->allocate(std::size_t{1} << 57, 0), out_of_memory);
  for (void* p : got) e->deallocate(p, 0, 0);
  check_books(*e);
}

// An emulator's addresses hold no memory: it cannot become the current
// resource (vramkit.alloc would hand out buffers to copy into), wrapped or not,
// nor sit under a guard adaptor (which writes its guard bytes).
TEST(TorchEmulation, EmulatorsAreNotMemory) {
  auto e = make_torch_emulator("torch-expandable", 0);
  EXPECT_FALSE(e->backs_memory());
  EXPECT_THROW(set_current_resource(e, 0), invalid_argument);
  auto wrapped = std::make_shared<statistics_adaptor>(e);
  EXPECT_FALSE(wrapped->backs_memory());
  EXPECT_THROW(set_current_resource(wrapped, 0), invalid_argument);
  EXPECT_THROW({ guard_adaptor g(e); }, invalid_argument);
  EXPECT_TRUE(current_resource(0)->backs_memory());  // the current resource stayed what it was
}

TEST(TorchEmulation, FractionOfOneSetsNoLimitAndNoCollection) {
  constexpr std::size_t MiB = std::size_t{1} << 20;
  auto e = make_torch_emulator("torch:garbage_collection_threshold=0.5,per_process_memory_fraction=1", 100 * MiB);
  e->deallocate(e->allocate(40 * MiB, 1), 40 * MiB, 1);
  e->allocate(30 * MiB, 0);
  e->allocate(20 * MiB, 2);  // 70 MiB > 50 MiB, but nothing collects: no limit was set
  EXPECT_EQ(e->reserved_bytes(), 90 * MiB);
  EXPECT_EQ(e->state().capacity_bytes, 100 * MiB);
}

}  // namespace
