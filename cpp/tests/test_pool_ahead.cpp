// map_ahead: a helper thread creates and maps pages above the large arena's
// top while the pool grows; blocks placed there take them with no call.
// Host page device (real mmap'd pages, thread safe); the invariants include
// the pages made ahead and the batch being made.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <dirent.h>
#include <fstream>
#include <string>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "forwarding_device.hpp"
#include "vramkit/error.hpp"
#include "vramkit/mr/pool_resource.hpp"
#include "vramkit/platform/host_page_device.hpp"

using namespace vramkit;

namespace {
constexpr std::size_t MiB = std::size_t{1} << 20, GiB = std::size_t{1} << 30, PG = 2 * MiB;

// Polls until pred() holds (the helper works on its own thread), at most 10 s.
template <class F>
bool eventually(F pred) {
  for (int i = 0; i < 2000; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

pool_options ahead(std::size_t bytes) {
  pool_options o;
  o.map_ahead = bytes;
  return o;
}

// Counts the calls each thread makes; fails every k-th create or map when asked.
class counting_device final : public test::forwarding_device {
 public:
  explicit counting_device(std::shared_ptr<page_device> in, int fail_every = 0)
      : forwarding_device(std::move(in)), every_(fail_every) {}
  page_handle create() override {
    count();
    if (every_ && ++calls_ % every_ == 0) throw cuda_error("injected create failure", 1);
    if (fail_main_creates && std::this_thread::get_id() != helper_.load())
      throw cuda_error("injected create failure on the allocating thread", 1);
    return in_->create();
  }
  void map(std::uintptr_t va, const page_handle* h, std::size_t n) override {
    count();
    if (every_ && ++calls_ % every_ == 0) throw cuda_error("injected map failure", 1);
    in_->map(va, h, n);
  }
  bool map_replaces() const noexcept override { return in_->map_replaces(); }
  void attach_thread() override { helper_ = std::this_thread::get_id(); }
  std::string name() const override { return "counting"; }

  std::atomic<long> main_calls{0}, helper_calls{0};
  std::atomic<bool> fail_main_creates{false};

 private:
  void count() {
    if (std::this_thread::get_id() == helper_.load()) ++helper_calls;
    else ++main_calls;
  }
  int every_;
  std::atomic<long> calls_{0};
  std::atomic<std::thread::id> helper_{};
};

// The signal mask ("SigBlk", hex) of the task of this process named `comm`,
// or of the calling thread with comm "self"; "" when there is none.
std::string sigblk_of(const std::string& comm) {
  const std::string dir = "/proc/self/task/";
  std::string out;
  auto read_mask = [](const std::string& status) {
    std::ifstream f(status);
    for (std::string line; std::getline(f, line);)
      if (line.rfind("SigBlk:", 0) == 0) return line.substr(line.find_first_not_of(" \t", 7));
    return std::string();
  };
  if (comm == "self") return read_mask("/proc/thread-self/status");
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream c(dir + e->d_name + "/comm");
      std::string name;
      std::getline(c, name);
      if (name == comm) out = read_mask(dir + e->d_name + "/status");
    }
    closedir(d);
  }
  return out;
}
bool has_signal(const std::string& hexmask, int sig) {
  const unsigned long long m = std::stoull(hexmask, nullptr, 16);
  return (m >> (sig - 1)) & 1;
}
}  // namespace

// The helper takes no asynchronous signal (SIGTERM, SIGINT and the like go to
// a thread that handles them: Python's main thread), faults stay unblocked, and
// the allocating thread's own mask is as it was.
TEST(pool_ahead, the_helper_thread_leaves_signals_to_the_other_threads) {
  const std::string before = sigblk_of("self");
  ASSERT_FALSE(before.empty()) << "no /proc/thread-self/status";
  auto dev = std::make_shared<host_page_device>(8 * GiB);
  pool_resource pool(dev, nullptr, ahead(16 * MiB));
  void* a = pool.allocate(8 * MiB, 0);  // the pool grows: the helper starts
  // Once it has made pages it runs its own code (a new thread starts with
  // every signal blocked until the C library sets the mask it inherits).
  ASSERT_TRUE(eventually([&] { return pool.counters().pages_made_ahead >= 4; }));
  ASSERT_FALSE(sigblk_of("vramkit-ahead").empty()) << "no thread named vramkit-ahead";
  const std::string helper = sigblk_of("vramkit-ahead");
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGCHLD})
    EXPECT_TRUE(has_signal(helper, sig)) << "signal " << sig << " not blocked in the helper: " << helper;
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT})
    EXPECT_FALSE(has_signal(helper, sig)) << "fault " << sig << " blocked in the helper: " << helper;
  EXPECT_EQ(sigblk_of("self"), before) << "the allocating thread's mask changed";
  pool.deallocate(a, 8 * MiB, 0);
}

TEST(pool_ahead, growth_finds_its_pages_made_ahead) {
  auto dev = std::make_shared<counting_device>(std::make_shared<host_page_device>(4 * GiB));
  pool_resource pool(dev, nullptr, ahead(16 * MiB));
  void* a = pool.allocate(8 * MiB, 0);  // grows: the helper makes 4 pages (the least) above it
  ASSERT_TRUE(eventually([&] { return pool.counters().pages_made_ahead >= 4; }));
  pool.check_invariants();
  EXPECT_EQ(pool.state().reserved_bytes, 16 * MiB);
  EXPECT_EQ(pool.usage().ahead, 4u);
  const long main_before = dev->main_calls.load();
  void* b = pool.allocate(8 * MiB, 0);  // placed over the pages made ahead: no call here
  EXPECT_EQ(dev->main_calls.load(), main_before) << "the allocating thread called the device";
  EXPECT_EQ(pool.counters().pages_ahead_used, 4u);
  std::memset(b, 0x5a, 8 * MiB);  // the pages are really there
  pool.check_invariants();
  // Used pages are made again, up to the target.
  ASSERT_TRUE(eventually([&] { return pool.counters().pages_made_ahead >= 8; }));
  pool.check_invariants();
  EXPECT_EQ(pool.state().reserved_bytes, 24 * MiB);
  EXPECT_EQ(pool.state().live_bytes, 16 * MiB);
  pool.deallocate(a, 8 * MiB, 0);
  pool.deallocate(b, 8 * MiB, 0);
}

TEST(pool_ahead, a_block_that_fails_to_be_backed_gives_the_pages_made_ahead_back) {
  auto dev = std::make_shared<counting_device>(std::make_shared<host_page_device>(4 * GiB));
  pool_resource pool(dev, nullptr, ahead(16 * MiB));
  void* a = pool.allocate(8 * MiB, 0);
  ASSERT_TRUE(eventually([&] { return pool.counters().pages_made_ahead >= 4; }));
  // 16 MiB: 4 pages made ahead and 4 more to create here, which fails.
  dev->fail_main_creates = true;
  EXPECT_THROW(pool.allocate(16 * MiB, 0), cuda_error);
  pool.check_invariants();
  EXPECT_EQ(pool.counters().pages_ahead_used, 0u);
  dev->fail_main_creates = false;
  void* b = pool.allocate(16 * MiB, 0);
  std::memset(b, 3, 16 * MiB);
  pool.check_invariants();
  EXPECT_GE(pool.counters().pages_ahead_used, 4u);
  pool.deallocate(a, 8 * MiB, 0);
  pool.deallocate(b, 16 * MiB, 0);
}

TEST(pool_ahead, after_a_trim_the_lead_is_made_where_the_next_blocks_go) {
  auto host = std::make_shared<host_page_device>(4 * GiB);
  pool_resource pool(host, nullptr, ahead(64 * MiB));
  void* big = pool.allocate(256 * MiB, 0);
  pool.deallocate(big, 256 * MiB, 0);
  pool.release_cached();  // every page goes; the highest page ever mapped stays high
  const std::size_t made = pool.counters().pages_made_ahead;
  std::vector<void*> ps{pool.allocate(8 * MiB, 0)};
  ASSERT_TRUE(eventually([&] { return pool.counters().pages_made_ahead > made; }));
  for (int i = 0; i < 20; ++i) ps.push_back(pool.allocate(8 * MiB, 0));  // the first takes the lead
  pool.check_invariants();
  EXPECT_GE(pool.counters().pages_ahead_used, 4u);
  for (void* p : ps) pool.deallocate(p, 8 * MiB, 0);
}

TEST(pool_ahead, no_lead_past_the_release_threshold) {
  auto host = std::make_shared<host_page_device>(4 * GiB);
  pool_options o = ahead(64 * MiB);
  o.release_threshold = 0;
  pool_resource pool(host, nullptr, o);
  for (int i = 0; i < 50; ++i) {
    void* p = pool.allocate((4 + i % 7) * MiB, 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    pool.deallocate(p, 0, 0);
    pool.check_invariants();
    EXPECT_EQ(pool.state().reserved_bytes, 0u) << "step " << i;
  }
  EXPECT_EQ(pool.counters().pages_made_ahead, 0u);
}

TEST(pool_ahead, the_lead_is_a_32nd_of_the_pool_within_map_ahead) {
  auto host = std::make_shared<host_page_device>(8 * GiB);
  pool_resource pool(host, nullptr, ahead(16 * MiB));
  void* a = pool.allocate(512 * MiB, 0);  // 256 pages: a 32nd is 8 pages, 16 MiB (the cap too)
  ASSERT_TRUE(eventually([&] { return pool.state().reserved_bytes == 528 * MiB; }));
  pool_resource small(host, nullptr, ahead(GiB));
  void* b = small.allocate(256 * MiB, 0);  // 128 pages: 4 ahead
  ASSERT_TRUE(eventually([&] { return small.state().reserved_bytes == 264 * MiB; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(pool.state().reserved_bytes, 528 * MiB) << "more made than the target";
  EXPECT_EQ(small.state().reserved_bytes, 264 * MiB) << "more made than the target";
  pool.deallocate(a, 512 * MiB, 0);
  small.deallocate(b, 256 * MiB, 0);
}

TEST(pool_ahead, churn_of_new_shapes_stays_within_the_slack_and_one_lead) {
  auto host = std::make_shared<host_page_device>(8 * GiB);
  pool_resource pool(host, nullptr, ahead(64 * MiB));
  // Blocks of 64 and 66 MiB in turn, each followed by a small block that
  // pins the top: the 66 MiB block fits in no hole, so it goes to the top,
  // over the pages made ahead, and the pages of the holes are moved under
  // it. Live stays at about 70 MiB.
  void* prev = nullptr;
  void* pin = nullptr;
  for (std::size_t i = 0; i < 60; ++i) {
    void* x = pool.allocate((i % 2 ? 66 : 64) * MiB, 0);
    void* q = pool.allocate(3 * MiB / 2, 0);
    if (prev) pool.deallocate(prev, 0, 0);
    if (pin) pool.deallocate(pin, 0, 0);
    prev = x;
    pin = q;
    if (i == 0) {  // the next block finds the first lead (later ones race with the helper)
      ASSERT_TRUE(eventually([&] { return pool.counters().pages_made_ahead >= 4; }));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  pool.check_invariants();
  // At most the slack (2 %) and one lead over the peak live bytes.
  const auto s = pool.state();
  EXPECT_LE(s.reserved_bytes,
            static_cast<std::size_t>(static_cast<double>(s.peak_live_bytes) * (1.02 + 1.0 / 32)) + 8 * MiB);
  EXPECT_GT(pool.counters().pages_ahead_used, 0u);
  pool.deallocate(prev, 0, 0);
  pool.deallocate(pin, 0, 0);
}

TEST(pool_ahead, release_cached_gives_the_pages_made_ahead_back) {
  auto host = std::make_shared<host_page_device>(4 * GiB);
  pool_resource pool(host, nullptr, ahead(32 * MiB));
  void* a = pool.allocate(6 * MiB, 0);
  ASSERT_TRUE(eventually([&] { return pool.counters().pages_made_ahead >= 4; }));
  pool.release_cached();
  pool.check_invariants();
  EXPECT_EQ(pool.state().reserved_bytes, 6 * MiB);
  EXPECT_EQ(host->created_bytes(), 6 * MiB);
  pool.deallocate(a, 6 * MiB, 0);
  pool.release_cached();
  EXPECT_EQ(host->created_bytes(), 0u);
}

TEST(pool_ahead, after_release_cached_no_page_is_made_until_the_pool_grows_again) {
  auto host = std::make_shared<host_page_device>(4 * GiB);
  pool_resource pool(host, nullptr, ahead(64 * MiB));
  std::vector<void*> ps;
  for (int i = 0; i < 30; ++i) {
    ps.push_back(pool.allocate(16 * MiB, 0));  // grows: the helper is woken, maybe mid-batch below
    pool.release_cached();
    EXPECT_EQ(pool.state().reserved_bytes, pool.state().live_bytes) << "step " << i;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_EQ(pool.state().reserved_bytes, pool.state().live_bytes) << "made after release_cached, step " << i;
    pool.check_invariants();
  }
  for (void* p : ps) pool.deallocate(p, 16 * MiB, 0);
  pool.release_cached();
  EXPECT_EQ(host->created_bytes(), 0u);
}

TEST(pool_ahead, a_lowered_limit_and_the_out_of_memory_path_take_them_back) {
  auto host = std::make_shared<host_page_device>(GiB);
  pool_options o = ahead(32 * MiB);
  o.reserve_limit = 32 * MiB;
  pool_resource pool(host, nullptr, o);
  void* a = pool.allocate(12 * MiB, 0);  // 6 pages, 4 ahead: reserved 20 MiB
  ASSERT_TRUE(eventually([&] { return pool.state().reserved_bytes == 20 * MiB; }));
  // The freed block and the pages made ahead: 20 MiB in two places, the
  // limit allows 12 MiB more; a 24 MiB block needs 12 new pages: 4 ahead
  // and 8 more created, then a wait to steal a's pages fails and the out-
  // of-memory path gives back what is cached and places it.
  pool.deallocate(a, 12 * MiB, 0);
  void* b = pool.allocate(30 * MiB, 0);
  std::memset(b, 2, 30 * MiB);
  pool.check_invariants();
  EXPECT_LE(pool.state().reserved_bytes, 32 * MiB);
  pool.deallocate(b, 30 * MiB, 0);
  ASSERT_TRUE(eventually([&] { return pool.counters().pages_made_ahead >= 4; }));
  pool.set_reserve_limit(16 * MiB);
  pool.check_invariants();
  EXPECT_LE(pool.state().reserved_bytes, 16 * MiB);
  pool.release_cached();
  EXPECT_EQ(host->created_bytes(), 0u);
}

TEST(pool_ahead, pages_made_ahead_serve_a_block_elsewhere_when_the_pool_may_not_grow) {
  auto host = std::make_shared<host_page_device>(4 * GiB);
  pool_options o = ahead(16 * MiB);
  o.reserve_limit = 32 * MiB;
  pool_resource pool(host, nullptr, o);
  void* a = pool.allocate(24 * MiB, 0);                                              // 12 pages, 4 made ahead
  ASSERT_TRUE(eventually([&] { return pool.state().reserved_bytes == 32 * MiB; }));  // the limit
  // A small request needs a page of the small arena; none may be created:
  // one made ahead in the large arena serves, without the out-of-memory path
  // (which would give every page made ahead back).
  void* s = pool.allocate(512 * 1024, 0);
  std::memset(s, 1, 512 * 1024);
  pool.check_invariants();
  EXPECT_EQ(pool.state().reserved_bytes, 32 * MiB);
  EXPECT_EQ(pool.state().retries, 0u);
  EXPECT_EQ(pool.counters().pages_remapped, 1u);
  pool.deallocate(s, 512 * 1024, 0);
  pool.deallocate(a, 24 * MiB, 0);
  pool.check_invariants();
  pool.release_cached();
  EXPECT_EQ(host->created_bytes(), 0u);
}

TEST(pool_ahead, teardown_while_the_helper_is_busy_leaks_nothing) {
  auto host = std::make_shared<host_page_device>(8 * GiB);
  for (int i = 0; i < 20; ++i) {
    {
      pool_resource pool(host, nullptr, ahead(256 * MiB));
      void* p = pool.allocate(4 * MiB, 0);
      (void)p;  // destroyed with a live block and the helper mid-batch
    }
    EXPECT_EQ(host->created_bytes(), 0u) << "round " << i;
  }
}

TEST(pool_ahead, failing_device_calls_on_the_helper_leave_the_pool_consistent) {
  auto host = std::make_shared<host_page_device>(GiB);
  auto dev = std::make_shared<counting_device>(host, 5);
  pool_resource pool(dev, nullptr, ahead(32 * MiB));
  std::mt19937_64 rng(7);
  std::vector<std::pair<void*, std::size_t>> live;
  int failures = 0;
  for (int step = 0; step < 3000; ++step) {
    if (live.empty() || rng() % 2) {
      std::size_t n = 1 + rng() % (12 * MiB);
      try {
        void* p = pool.allocate(n, 0);
        std::memset(p, 0x11, std::min<std::size_t>(n, 64));
        live.emplace_back(p, n);
      } catch (const cuda_error&) {
        ++failures;
      } catch (const out_of_memory&) {
        ++failures;
      }
    } else {
      std::size_t i = rng() % live.size();
      pool.deallocate(live[i].first, live[i].second, 0);
      live[i] = live.back();
      live.pop_back();
    }
    pool.check_invariants();
    if (step % 500 == 0) pool.release_cached();
  }
  EXPECT_GT(failures, 0);
  EXPECT_GT(dev->helper_calls.load(), 0);
  for (auto& [p, n] : live) pool.deallocate(p, n, 0);
  pool.check_invariants();
  pool.release_cached();
  EXPECT_EQ(host->created_bytes(), 0u);
}

TEST(pool_ahead, threads_allocating_side_by_side_with_the_helper) {
  auto host = std::make_shared<host_page_device>(16 * GiB);
  pool_resource pool(host, nullptr, ahead(64 * MiB));
  std::atomic<bool> bad{false};
  auto worker = [&](unsigned seed) {
    std::mt19937_64 rng(seed);
    std::vector<std::pair<unsigned char*, std::size_t>> live;
    for (int step = 0; step < 4000; ++step) {
      if (live.size() < 40 && (live.empty() || rng() % 3)) {
        std::size_t n = PG * (1 + rng() % (rng() % 4 ? 4 : 12));  // whole pages: reserved stays near live
        auto* p = static_cast<unsigned char*>(pool.allocate(n, 0));
        p[0] = static_cast<unsigned char>(seed);
        p[n - 1] = static_cast<unsigned char>(seed);
        live.emplace_back(p, n);
      } else {
        std::size_t i = rng() % live.size();
        auto [p, n] = live[i];
        if (p[0] != static_cast<unsigned char>(seed) || p[n - 1] != static_cast<unsigned char>(seed)) bad = true;
        pool.deallocate(p, n, 0);
        live[i] = live.back();
        live.pop_back();
      }
      if (step % 400 == 0) pool.check_invariants();
      if (step == 2000 && seed == 1) pool.release_cached();
    }
    for (auto [p, n] : live) pool.deallocate(p, n, 0);
  };
  // The pool grows first and the helper makes its pages; then both threads
  // allocate and free while it works.
  void* first = pool.allocate(64 * MiB, 0);
  ASSERT_TRUE(eventually([&] { return pool.counters().pages_made_ahead > 0; }));
  std::thread t1(worker, 1), t2(worker, 2);
  t1.join();
  t2.join();
  pool.deallocate(first, 64 * MiB, 0);
  EXPECT_FALSE(bad.load()) << "a block's bytes changed under it";
  pool.check_invariants();
  EXPECT_GT(pool.counters().pages_made_ahead, 0u);
  EXPECT_GT(pool.counters().pages_ahead_used, 0u);
  pool.release_cached();
  EXPECT_EQ(host->created_bytes(), 0u);
}

TEST(pool_ahead, option_parses_and_round_trips) {
  pool_options o;
  o.parse("map_ahead:64MiB");
  EXPECT_EQ(o.map_ahead, 64 * MiB);
  pool_options back;
  back.parse(o.to_string());
  EXPECT_EQ(back.map_ahead, 64 * MiB);
  EXPECT_THROW(o.parse("map_ahead:lots"), invalid_argument);
  EXPECT_EQ(o.map_ahead, 64 * MiB) << "a bad value changed the options";
}
