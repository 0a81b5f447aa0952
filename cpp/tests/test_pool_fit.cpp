// fit:address against fit:best: which backed free block a large request
// takes when several fit.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "vramkit/mr/pool_resource.hpp"
#include "vramkit/platform/host_page_device.hpp"
#include "vramkit/pool_options.hpp"

using namespace vramkit;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

// Two free blocks with every page inside them mapped: 8 MiB at the arena's
// start and 3 MiB above it, each kept apart from other free memory by live
// blocks.
struct two_holes {
  std::shared_ptr<pool_resource> pool;
  void* low = nullptr;
  void* high = nullptr;
  void* spacers[2] = {};
};

two_holes make(bool by_address) {
  pool_options o;
  o.fit_address = by_address;
  two_holes t;
  t.pool = std::make_shared<pool_resource>(std::make_shared<host_page_device>(std::size_t{1} << 30), nullptr, o);
  t.low = t.pool->allocate(8 * MiB);
  t.spacers[0] = t.pool->allocate(2 * MiB);
  t.high = t.pool->allocate(3 * MiB);
  t.spacers[1] = t.pool->allocate(2 * MiB);
  EXPECT_LT(t.low, t.high);
  t.pool->deallocate(t.low, 8 * MiB);
  t.pool->deallocate(t.high, 3 * MiB);
  return t;
}

}  // namespace

TEST(pool_fit, best_takes_the_tightest_block) {
  auto t = make(false);
  const auto mapped = t.pool->counters().pages_mapped;
  void* p = t.pool->allocate(2 * MiB + 512 * 1024);
  EXPECT_EQ(p, t.high);
  EXPECT_EQ(t.pool->counters().pages_mapped, mapped);
  t.pool->check_invariants();
}

TEST(pool_fit, address_takes_the_lowest_block_that_fits) {
  auto t = make(true);
  const auto mapped = t.pool->counters().pages_mapped;
  void* p = t.pool->allocate(2 * MiB + 512 * 1024);
  EXPECT_EQ(p, t.low);
  // The rest of the low block serves the next one, still below the high block.
  void* q = t.pool->allocate(2 * MiB + 512 * 1024);
  EXPECT_EQ(static_cast<char*>(q), static_cast<char*>(t.low) + 2 * MiB + 512 * 1024);
  EXPECT_EQ(t.pool->counters().pages_mapped, mapped) << "both were placed over mapped pages";
  t.pool->check_invariants();
}

TEST(pool_fit, address_takes_an_exact_fit_before_a_lower_block) {
  auto t = make(true);
  void* p = t.pool->allocate(3 * MiB);
  EXPECT_EQ(p, t.high);
  t.pool->check_invariants();
}

TEST(pool_fit, address_near_the_peak_takes_the_tightest_block) {
  // With the live peak reset to what is live now (reset_peaks), a request
  // takes live bytes past 15/16 of the peak: there the tightest fit packs
  // best, and fit:address takes it as fit:best does.
  auto t = make(true);
  t.pool->reset_peaks();
  void* p = t.pool->allocate(2 * MiB + 512 * 1024);
  EXPECT_EQ(p, t.high);
  // Far enough below the peak again (its blocks freed), the lowest block that fits.
  t.pool->deallocate(p, 2 * MiB + 512 * 1024);
  t.pool->deallocate(t.spacers[1], 2 * MiB);
  t.spacers[1] = nullptr;
  void* q = t.pool->allocate(2 * MiB + 512 * 1024);
  EXPECT_EQ(q, t.low);
  t.pool->check_invariants();
}

TEST(pool_fit, small_requests_keep_the_best_fit) {
  // Requests at or under small_threshold live in their own arena, where the
  // option changes nothing: the same addresses under both settings.
  for (bool by_address : {false, true}) {
    pool_options o;
    o.fit_address = by_address;
    pool_resource pool(std::make_shared<host_page_device>(std::size_t{1} << 30), nullptr, o);
    void* a = pool.allocate(256 * 1024);
    void* s = pool.allocate(64 * 1024);
    void* b = pool.allocate(96 * 1024);
    void* s2 = pool.allocate(64 * 1024);
    pool.deallocate(a, 256 * 1024);
    pool.deallocate(b, 96 * 1024);
    EXPECT_EQ(pool.allocate(80 * 1024), b) << "fit_address " << by_address;
    pool.deallocate(s, 64 * 1024);
    pool.deallocate(s2, 64 * 1024);
    pool.check_invariants();
  }
}

TEST(pool_fit, parsed_and_printed) {
  pool_options o;
  EXPECT_FALSE(o.fit_address);
  o.parse("fit:address");
  EXPECT_TRUE(o.fit_address);
  EXPECT_NE(o.to_string().find(",fit:address,"), std::string::npos);
  o.parse("fit:best");
  EXPECT_FALSE(o.fit_address);
  o.parse(" fit : Address ");  // spaces and case, as for the other keys
  EXPECT_TRUE(o.fit_address);
  o.parse("fit:best");
  EXPECT_NE(o.to_string().find(",fit:best,"), std::string::npos);
  pool_options back;
  back.parse(o.to_string());
  EXPECT_EQ(back.to_string(), o.to_string());
  try {
    o.parse("fit:first");
    FAIL() << "fit:first was taken";
  } catch (const invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("fit takes best or address, not 'first'"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(o.fit_address) << "a refused string changes nothing";
}

TEST(pool_fit, address_looks_past_a_full_bin_of_inexact_fits) {
  // 64 free blocks in the request's own size class, none of its exact size,
  // the lowest-addressed the largest: the walk for the lowest address still
  // looks at them all after the search for an exact fit has.
  pool_options o;
  o.fit_address = true;
  pool_resource pool(std::make_shared<host_page_device>(std::size_t{1} << 30), nullptr, o);
  const std::size_t request = 2 * MiB + 64 * 1024;
  std::vector<void*> holes, spacers;
  for (std::size_t k = 0; k < 64; ++k) {
    holes.push_back(pool.allocate(request + 512 * (64 - k)));
    spacers.push_back(pool.allocate(MiB + MiB / 2));
  }
  for (std::size_t k = 0; k < 64; ++k) pool.deallocate(holes[k], request + 512 * (64 - k));
  EXPECT_EQ(pool.allocate(request), holes[0]);
  for (void* s : spacers) pool.deallocate(s, MiB + MiB / 2);
  pool.check_invariants();
}
