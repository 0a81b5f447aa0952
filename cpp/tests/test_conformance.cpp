// One conformance suite, run against every resource and adaptor: host ones
// here, CUDA ones where a device exists (they skip with the reason otherwise).
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <map>
#include <ostream>
#include <random>

#include "vramkit/mr/page_resource.hpp"
#include "vramkit/mr/pool_resource.hpp"
#include "vramkit/mr/statistics_adaptor.hpp"
#include "vramkit/platform/cuda.hpp"
#include "vramkit/platform/host_page_device.hpp"
#include "forwarding_device.hpp"

using namespace vramkit;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;

struct factory {
  std::string name;
  bool cuda;
  std::function<std::shared_ptr<device_resource>()> make;
};
// How GoogleTest (and so ctest's test list) shows a parameter: its name, not its bytes.
void PrintTo(const factory& f, std::ostream* os) { *os << f.name; }

std::shared_ptr<page_device> host_dev(std::size_t cap = 8 * GiB) { return std::make_shared<host_page_device>(cap); }

std::vector<factory> factories() {
  std::vector<factory> f;
  f.push_back({"host", false, [] { return std::make_shared<page_resource>(host_dev()); }});
  f.push_back({"pool_host", false, [] { return std::make_shared<pool_resource>(host_dev(), nullptr); }});
  f.push_back({"pool_host_noremap", false, [] {
                 pool_options o;
                 o.remap = false;
                 return std::make_shared<pool_resource>(host_dev(), nullptr, o);
               }});
  f.push_back({"pool_host_no_remap_own", false, [] {  // the pool before remap_own was the default
                 pool_options o;
                 o.remap_own = false;
                 return std::make_shared<pool_resource>(host_dev(), nullptr, o);
               }});
  f.push_back({"pool_host_map_ahead", false, [] {
                 pool_options o;
                 o.map_ahead = std::size_t{64} << 20;
                 return std::make_shared<pool_resource>(host_dev(), nullptr, o);
               }});
  f.push_back({"pool_host_chunks", false, [] {
                 pool_options o;
                 o.chunk_size = std::size_t{16} << 20;
                 return std::make_shared<pool_resource>(host_dev(), nullptr, o);
               }});
  f.push_back({"pool_host_growth_chunks", false, [] {
                 pool_options o;
                 o.chunk_size = std::size_t{8} << 20;
                 o.growth_chunks = true;
                 return std::make_shared<pool_resource>(host_dev(), nullptr, o);
               }});
  f.push_back({"pool_host_chunk_min", false, [] {  // chunks of 16, 8 and 4 MiB
                 pool_options o;
                 o.chunk_size = std::size_t{16} << 20;
                 o.chunk_min_size = std::size_t{4} << 20;
                 return std::make_shared<pool_resource>(host_dev(), nullptr, o);
               }});
  f.push_back({"pool_over_host_resource", false, [] {
                 return std::make_shared<pool_resource>(std::make_shared<page_resource>(host_dev()), nullptr);
               }});
  f.push_back({"statistics_pool_host", false, [] {
                 return std::make_shared<statistics_adaptor>(std::make_shared<pool_resource>(host_dev(), nullptr));
               }});
  f.push_back({"limiting_pool_host", false, [] {
                 return std::make_shared<limiting_adaptor>(std::make_shared<pool_resource>(host_dev(), nullptr),
                                                           6 * GiB);
               }});
  f.push_back({"cuda", true, [] { return cuda::make_cuda_resource(0); }});
  f.push_back({"cuda_async", true, [] { return cuda::make_cuda_async_resource(0, ~std::size_t{0}); }});
  f.push_back({"vmm", true, [] { return std::make_shared<page_resource>(cuda::make_vmm_device(0)); }});
  f.push_back({"pool_vmm", true, [] {
                 return std::make_shared<pool_resource>(cuda::make_vmm_device(0), cuda::make_stream_ops(0));
               }});
  f.push_back({"pool_vmm_map_ahead", true, [] {
                 pool_options o;
                 o.map_ahead = std::size_t{64} << 20;
                 return std::make_shared<pool_resource>(cuda::make_vmm_device(0), cuda::make_stream_ops(0), o);
               }});
  f.push_back({"pool_vmm_chunks", true, [] {
                 pool_options o;
                 o.chunk_size = std::size_t{16} << 20;
                 return std::make_shared<pool_resource>(cuda::make_vmm_device(0), cuda::make_stream_ops(0), o);
               }});
  f.push_back({"pool_vmm_growth_chunks", true, [] {
                 pool_options o;
                 o.chunk_size = std::size_t{16} << 20;
                 o.growth_chunks = true;
                 return std::make_shared<pool_resource>(cuda::make_vmm_device(0), cuda::make_stream_ops(0), o);
               }});
  f.push_back({"pool_vmm_chunk_min", true, [] {  // chunks of 16, 8 and 4 MiB
                 pool_options o;
                 o.chunk_size = std::size_t{16} << 20;
                 o.chunk_min_size = std::size_t{4} << 20;
                 return std::make_shared<pool_resource>(cuda::make_vmm_device(0), cuda::make_stream_ops(0), o);
               }});
  f.push_back({"pool_vmm_remap_own", true, [] {  // own frees taken early at once (no allowance)
                 pool_options o;
                 o.remap_own = true;
                 o.remap_own_slack = 0;
                 return std::make_shared<pool_resource>(cuda::make_vmm_device(0), cuda::make_stream_ops(0), o);
               }});
  f.push_back({"pool_vmm_chunks_map_ahead", true, [] {
                 pool_options o;
                 o.chunk_size = std::size_t{16} << 20;
                 o.map_ahead = std::size_t{64} << 20;
                 return std::make_shared<pool_resource>(cuda::make_vmm_device(0), cuda::make_stream_ops(0), o);
               }});
  f.push_back({"pool_cuda", true, [] {
                 return std::make_shared<pool_resource>(cuda::make_cuda_resource(0), cuda::make_stream_ops(0));
               }});
  f.push_back({"pool_cuda_async", true, [] {
                 return std::make_shared<pool_resource>(cuda::make_cuda_async_resource(0, ~std::size_t{0}),
                                                        cuda::make_stream_ops(0));
               }});
  return f;
}

class conformance : public ::testing::TestWithParam<factory> {
 protected:
  void SetUp() override {
    if (GetParam().cuda && cuda::device_count() == 0) GTEST_SKIP() << "needs a CUDA device: " << cuda::unavailable_reason();
    r = GetParam().make();
  }
  // Writes a pattern through the memory and reads it back.
  void touch(void* p, std::size_t n, unsigned char v) {
    std::size_t len = std::min<std::size_t>(n, 4096);
    if (GetParam().cuda) {
      std::vector<unsigned char> h(len, v), back(len, 0);
      cuda::copy_to_device(p, h.data(), len);
      cuda::copy_to_host(back.data(), p, len);
      ASSERT_EQ(std::memcmp(h.data(), back.data(), len), 0);
    } else {
      std::memset(p, v, len);
      std::memset(static_cast<char*>(p) + n - 1, v, 1);
      ASSERT_EQ(static_cast<unsigned char*>(p)[0], v);
    }
  }
  std::shared_ptr<device_resource> r;
};

TEST_P(conformance, allocates_aligned_writable_memory) {
  for (std::size_t n : {std::size_t{1}, std::size_t{255}, std::size_t{256}, std::size_t{4097}, MiB, 3 * MiB + 7}) {
    void* p = r->allocate(n);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 256, 0u) << n;
    touch(p, n, 0x5a);
    EXPECT_EQ(r->allocation_size(p), n);
    r->deallocate_checked(p, n);
  }
}

TEST_P(conformance, size_zero_returns_null_and_takes_nothing) {
  auto before = r->state();
  EXPECT_EQ(r->allocate(0), nullptr);
  EXPECT_EQ(r->state().live_bytes, before.live_bytes);
  r->deallocate_checked(nullptr, 0);  // no-op
}

TEST_P(conformance, live_allocations_do_not_overlap) {
  std::mt19937_64 rng(7);
  std::map<std::uintptr_t, std::size_t> live;
  std::vector<void*> ptrs;
  for (int i = 0; i < 300; ++i) {
    std::size_t n = std::size_t{1} << std::uniform_int_distribution<int>(0, 24)(rng);
    n += rng() % n;
    void* p = r->allocate(n);
    auto a = reinterpret_cast<std::uintptr_t>(p);
    auto it = live.upper_bound(a);
    if (it != live.end()) ASSERT_LE(a + n, it->first);
    if (it != live.begin()) {
      --it;
      ASSERT_LE(it->first + it->second, a);
    }
    live[a] = n;
    ptrs.push_back(p);
    if (rng() % 3 == 0 && !ptrs.empty()) {
      std::size_t k = rng() % ptrs.size();
      auto q = reinterpret_cast<std::uintptr_t>(ptrs[k]);
      r->deallocate_checked(ptrs[k], live[q]);
      live.erase(q);
      ptrs.erase(ptrs.begin() + static_cast<long>(k));
    }
  }
  for (void* p : ptrs) r->deallocate_checked(p, 0);
  EXPECT_EQ(r->state().live_bytes, 0u);
}

TEST_P(conformance, double_free_is_refused_and_changes_nothing) {
  void* p = r->allocate(1000);
  void* q = r->allocate(5000);
  r->deallocate_checked(p, 1000);
  auto before = r->state();
  EXPECT_THROW(r->deallocate_checked(p, 1000), invalid_argument);
  auto after = r->state();
  EXPECT_EQ(before.live_bytes, after.live_bytes);
  EXPECT_EQ(before.reserved_bytes, after.reserved_bytes);
  EXPECT_EQ(r->allocation_size(q), 5000u);
  r->deallocate_checked(q, 5000);
}

TEST_P(conformance, foreign_pointer_is_refused) {
  int x = 0;
  void* q = r->allocate(4096);
  EXPECT_THROW(r->deallocate_checked(&x, 4), invalid_argument);
  EXPECT_THROW(r->deallocate_checked(static_cast<char*>(q) + 256, 0), invalid_argument);
  EXPECT_EQ(r->try_deallocate(&x, 4, 0), free_status::not_owned);
  r->deallocate_checked(q, 4096);
}

TEST_P(conformance, wrong_size_is_refused) {
  void* p = r->allocate(10000);
  EXPECT_THROW(r->deallocate_checked(p, 20 * MiB), invalid_argument);
  EXPECT_EQ(r->allocation_size(p), 10000u);
  r->deallocate_checked(p, 10000);
}

TEST_P(conformance, noexcept_deallocate_reports_bad_frees) {
  static std::size_t seen = 0;
  set_bad_free_handler([](const device_resource&, void*, std::size_t, free_status) { ++seen; });
  void* p = r->allocate(512);
  r->deallocate(p, 512);
  std::size_t before = seen;
  r->deallocate(p, 512);  // double free: ignored, reported
  EXPECT_EQ(seen, before + 1);
  set_bad_free_handler(nullptr);
}

TEST_P(conformance, a_bad_free_handler_that_throws_does_not_end_the_process) {
  set_bad_free_handler([](const device_resource&, void*, std::size_t, free_status) {
    throw std::runtime_error("handler failed");
  });
  void* p = r->allocate(512);
  r->deallocate(p, 512);
  const std::size_t before = bad_free_count();
  r->deallocate(p, 512);  // reported to a handler that throws: still ignored
  EXPECT_EQ(bad_free_count(), before + 1);
  set_bad_free_handler(nullptr);
  void* q = r->allocate(512);  // the resource goes on
  r->deallocate_checked(q, 512);
}

TEST_P(conformance, request_over_capacity_is_out_of_memory_and_recoverable) {
  void* keep = r->allocate(MiB);
  auto before = r->state();
  std::size_t huge = std::size_t{1} << 50;
  try {
    r->allocate(huge);
    FAIL() << "no out_of_memory";
  } catch (const out_of_memory& e) {
    EXPECT_EQ(e.requested(), huge);
    EXPECT_NE(std::string(e.what()).find("out of memory"), std::string::npos);
  }
  EXPECT_EQ(r->state().live_bytes, before.live_bytes);
  void* p = r->allocate(2 * MiB);
  EXPECT_NE(p, nullptr);
  r->deallocate_checked(p, 0);
  r->deallocate_checked(keep, 0);
}

TEST_P(conformance, release_cached_keeps_live_memory) {
  std::vector<void*> ps;
  for (int i = 0; i < 20; ++i) ps.push_back(r->allocate((i + 1) * 300 * 1024));
  for (int i = 0; i < 20; i += 2) r->deallocate_checked(ps[i], 0);
  r->release_cached();
  for (int i = 1; i < 20; i += 2) touch(ps[i], (i + 1) * 300 * 1024, 0x11);
  for (int i = 1; i < 20; i += 2) r->deallocate_checked(ps[i], 0);
  r->release_cached();
  EXPECT_EQ(r->state().live_bytes, 0u);
  EXPECT_EQ(r->state().reserved_bytes, 0u) << GetParam().name;
}

INSTANTIATE_TEST_SUITE_P(all, conformance, ::testing::ValuesIn(factories()),
                         [](const auto& info) { return info.param.name; });

}  // namespace

// split_chunks on the GPU: the chunks left under live blocks at the second
// mark become single pages (new driver handles) holding the blocks' bytes.
TEST(pool_vmm_split_chunks, the_second_mark_splits_chunks_keeping_the_bytes_of_the_blocks_over_them) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "needs a CUDA device: " << cuda::unavailable_reason();
  pool_options o;
  o.chunk_size = std::size_t{16} << 20;
  o.chunk_min_size = std::size_t{4} << 20;
  pool_resource pool(cuda::make_vmm_device(0), cuda::make_stream_ops(0), o);
  const std::size_t W = 100 * MiB + 12345, T = 64 * MiB;
  pool.mark_step();  // the program's start
  void* w = pool.allocate(W, 0);
  void* t = pool.allocate(T, 0);
  std::vector<unsigned char> h(W), back(W, 0);
  std::mt19937_64 rng(5);
  for (auto& x : h) x = static_cast<unsigned char>(rng());
  cuda::copy_to_device(w, h.data(), W);
  pool.deallocate_checked(t, T, 0);
  ASSERT_GT(pool.usage().in_chunks, 0u);
  pool.mark_step();  // the second: the free chunks go back, the others are split
  EXPECT_EQ(pool.usage().in_chunks, 0u);
  EXPECT_GT(pool.counters().chunks_split, 0u);
  pool.check_invariants();
  cuda::copy_to_host(back.data(), w, W);
  EXPECT_EQ(std::memcmp(h.data(), back.data(), W), 0) << "a block over split chunks lost its bytes";
  pool.deallocate_checked(w, W, 0);
  pool.release_cached();
  EXPECT_EQ(pool.state().reserved_bytes, 0u);
}

// split_chunks' ways back on the driver: a split that fails part way (no page
// to be had, a copy or a mapping refused) leaves the chunk mapped whole where
// it was, with the bytes of the blocks over it, and the pool goes on. The
// failures are injected over the real driver, which itself refuses to map an
// address that is mapped already.
namespace {
class failing_vmm final : public test::failing_device {
 public:
  using failing_device::failing_device;
  int device() const noexcept override { return in_->device(); }
  std::string name() const override { return "failing " + in_->name(); }
};
}  // namespace

TEST(pool_vmm_split_chunks, a_split_that_fails_leaves_the_chunk_whole_with_its_bytes) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "needs a CUDA device: " << cuda::unavailable_reason();
  // Chunks of one size (8 pages), so the k-th page created is known: the
  // scratch pages come first (8), then each chunk's 8 pages.
  for (int how = 0; how < 6; ++how) {
    SCOPED_TRACE(how);
    pool_options o;
    o.chunk_size = std::size_t{16} << 20;
    auto dev = std::make_shared<failing_vmm>(cuda::make_vmm_device(0));
    pool_resource pool(dev, cuda::make_stream_ops(0), o);
    const std::size_t W = 100 * MiB + 12345, T = 64 * MiB;
    pool.mark_step();
    void* w = pool.allocate(W, 0);
    void* t = pool.allocate(T, 0);
    std::vector<unsigned char> h(W), back(W, 0);
    std::mt19937_64 rng(7 + how);
    for (auto& x : h) x = static_cast<unsigned char>(rng());
    cuda::copy_to_device(w, h.data(), W);
    pool.deallocate_checked(t, T, 0);
    ASSERT_GT(pool.usage().in_chunks, 0u);
    dev->reset_counts();
    if (how == 0) dev->fail_create_at = 3;   // the scratch pages
    if (how == 1) dev->fail_create_at = 12;  // the first chunk's pages
    if (how == 2) dev->fail_copy_at = 1;     // into the scratch pages
    if (how == 3) dev->fail_map_at = 2;      // the first chunk's pages in its place
    if (how == 4) dev->fail_copy_at = 2;     // back into the new pages in its place
    if (how == 5) dev->fail_create_at = 20;  // the second chunk's pages: the first is split
    pool.mark_step();
    EXPECT_EQ(pool.counters().chunks_split, how == 5 ? 1u : 0u);
    EXPECT_GT(pool.usage().in_chunks, 0u) << "the chunk under a live block went";
    pool.check_invariants();
    cuda::copy_to_host(back.data(), w, W);
    EXPECT_EQ(std::memcmp(h.data(), back.data(), W), 0) << "a failed split lost a block's bytes";
    dev->disarm();
    // The pool goes on: a new block, written and read back.
    void* n = pool.allocate(T, 0);
    std::vector<unsigned char> z(T, 0x3c), zb(T, 0);
    cuda::copy_to_device(n, z.data(), T);
    cuda::copy_to_host(zb.data(), n, T);
    EXPECT_EQ(zb, z);
    pool.deallocate_checked(n, T, 0);
    pool.deallocate_checked(w, W, 0);
    pool.release_cached();
    pool.check_invariants();
    EXPECT_EQ(pool.state().reserved_bytes, 0u);
  }
}
