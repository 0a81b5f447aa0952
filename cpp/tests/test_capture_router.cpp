// CUDA graph capture and scoped pools, with a simulated capturing stream: what
// the capture router routes where, what it holds back, and when it lets go.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <set>

#include "vramkit/mr/capture_router.hpp"
#include "vramkit/mr/pool_resource.hpp"
#include "vramkit/mr/statistics_adaptor.hpp"
#include "vramkit/mr/tracking_adaptor.hpp"
#include "vramkit/platform/host_page_device.hpp"

using namespace vramkit;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

// Events of a modelled GPU: each event completes only when the test says so.
class manual_events final : public stream_ops {
 public:
  event_id record(stream_t) override { return ++next_; }
  bool done(event_id e) override { return e <= completed; }
  void wait(event_id e) override { completed = std::max(completed, e); }
  void release(event_id) noexcept override {}
  event_id completed = 0;
  int queries = 0;

 private:
  event_id next_ = 0;
};

struct fixture {
  std::shared_ptr<host_page_device> dev = std::make_shared<host_page_device>(std::size_t{4} << 30);
  std::shared_ptr<manual_events> events = std::make_shared<manual_events>();
  std::shared_ptr<device_resource> main =
      std::make_shared<statistics_adaptor>(std::make_shared<pool_resource>(dev, events, pool_options{}));
  std::set<stream_t> capturing;  // streams "being captured"
  bool thread_capturing = false;
  int syncs = 0;
  int pools_made = 0;
  std::unique_ptr<capture_router> router;

  fixture() {
    auto is_capturing = [this](stream_t s) { return capturing.count(s) != 0; };
    router = std::make_unique<capture_router>(
        main,
        [this, is_capturing]() -> std::shared_ptr<device_resource> {
          ++pools_made;
          pool_options o;
          o.remap = false;
          auto ev = std::make_shared<capture_aware_events>(events, is_capturing,
                                                           [this] { return router->routing(); });
          return std::make_shared<pool_resource>(dev, ev, o);
        },
        is_capturing, [this] { return thread_capturing; }, [this] { ++syncs; });
  }
  // What torch.cuda.graph does: route the capture stream's allocations.
  void begin_capture(graph_pool_id id, stream_t s) {
    router->begin_allocate_to_pool(id, [this, s](stream_t x) { return x == s && capturing.count(x); });
    capturing.insert(s);
    thread_capturing = true;
  }
  void end_capture(graph_pool_id id, stream_t s) {
    capturing.erase(s);
    thread_capturing = false;
    router->end_allocate_to_pool(id);
  }
  graph_pool_info info(graph_pool_id id) {
    for (auto& p : router->pools())
      if (p.id == id) return p;
    ADD_FAILURE() << "no pool (" << id.first << ", " << id.second << ")";
    return {};
  }
  bool has_pool(graph_pool_id id) {
    for (auto& p : router->pools())
      if (p.id == id) return true;
    return false;
  }
};

constexpr stream_t capture_stream = 7;
const graph_pool_id g1{1, 0};
const graph_pool_id g2{0, 2};

}  // namespace

TEST(capture_router, without_a_window_everything_is_the_main_resources) {
  fixture f;
  void* p = f.router->allocate(3 * MiB, 0);
  EXPECT_EQ(f.main->allocation_size(p), 3 * MiB);
  EXPECT_EQ(f.router->deallocate(p, 3 * MiB, 0), free_status::ok);
  EXPECT_EQ(f.main->allocation_size(p), 0u);
  EXPECT_EQ(f.pools_made, 0);
  EXPECT_EQ(f.router->deallocate(p, 3 * MiB, 0), free_status::not_owned);  // a double free is still one
}

TEST(capture_router, a_capture_allocates_from_its_private_pool_and_others_do_not) {
  fixture f;
  f.begin_capture(g1, capture_stream);
  void* in_graph = f.router->allocate(5 * MiB, capture_stream);
  void* outside = f.router->allocate(5 * MiB, 0);  // another stream, not captured
  graph_pool_id id;
  ASSERT_TRUE(f.router->owner(in_graph, id));
  EXPECT_EQ(id, g1);
  EXPECT_FALSE(f.router->owner(outside, id));
  EXPECT_EQ(f.main->allocation_size(in_graph), 0u);
  EXPECT_EQ(f.main->allocation_size(outside), 5 * MiB);
  EXPECT_TRUE(f.info(g1).captured);
  f.end_capture(g1, capture_stream);
  // After the capture the stream allocates from the main resource again.
  void* after = f.router->allocate(MiB, capture_stream);
  EXPECT_FALSE(f.router->owner(after, id));
  f.router->deallocate(after, MiB, capture_stream);
  f.router->deallocate(outside, 5 * MiB, 0);
  f.router->deallocate(in_graph, 5 * MiB, capture_stream);
  f.router->release_pool(g1);
  EXPECT_FALSE(f.has_pool(g1));
}

TEST(capture_router, memory_freed_inside_the_capture_serves_the_capture_again) {
  fixture f;
  f.begin_capture(g1, capture_stream);
  void* a = f.router->allocate(8 * MiB, capture_stream);
  ASSERT_EQ(f.router->deallocate(a, 8 * MiB, capture_stream), free_status::ok);
  void* b = f.router->allocate(8 * MiB, capture_stream);
  EXPECT_EQ(a, b);  // same stream, same graph: reused at once
  EXPECT_EQ(f.info(g1).state.reserved_bytes, 8 * MiB);
  f.end_capture(g1, capture_stream);
  f.router->deallocate(b, 8 * MiB, capture_stream);
  f.router->release_pool(g1);
}

TEST(capture_router, nothing_freed_during_a_capture_reaches_a_tensor_outside_the_graph) {
  fixture f;
  // A tensor from before the capture, freed inside it (the graph may read it).
  void* before = f.router->allocate(6 * MiB, 0);
  f.begin_capture(g1, capture_stream);
  void* scratch = f.router->allocate(6 * MiB, capture_stream);
  ASSERT_EQ(f.router->deallocate(before, 6 * MiB, 0), free_status::ok);
  ASSERT_EQ(f.router->deallocate(scratch, 6 * MiB, capture_stream), free_status::ok);
  f.end_capture(g1, capture_stream);
  EXPECT_EQ(f.info(g1).set_aside_count, 1u);
  EXPECT_EQ(f.info(g1).set_aside_bytes, 6 * MiB);
  // While the graph lives, new tensors (any stream) never get either address.
  std::set<void*> graph_addresses{before, scratch};
  std::vector<void*> outside;
  for (int i = 0; i < 20; ++i) {
    void* p = f.router->allocate(6 * MiB, i % 2 ? 0 : capture_stream);
    EXPECT_EQ(graph_addresses.count(p), 0u) << "step " << i;
    outside.push_back(p);
  }
  for (void* p : outside) f.router->deallocate(p, 6 * MiB, 0);
  // The graph is destroyed: the device is synchronized, then both go back.
  int syncs = f.syncs;
  f.router->release_pool(g1);
  EXPECT_GT(f.syncs, syncs);
  EXPECT_FALSE(f.has_pool(g1));
  EXPECT_EQ(f.main->allocation_size(before), 0u);
}

TEST(capture_router, a_bad_free_during_a_capture_is_still_refused) {
  fixture f;
  f.begin_capture(g1, capture_stream);
  int x = 0;
  EXPECT_EQ(f.router->deallocate(&x, 64, 0), free_status::not_owned);
  EXPECT_EQ(f.info(g1).set_aside_count, 0u);
  void* p = f.router->allocate(MiB, capture_stream);
  EXPECT_EQ(f.router->deallocate(p, 2 * MiB, capture_stream), free_status::wrong_size);
  EXPECT_EQ(f.router->deallocate(p, MiB, capture_stream), free_status::ok);
  f.end_capture(g1, capture_stream);
  f.router->release_pool(g1);
}

TEST(capture_router, a_graph_pool_lives_while_a_graph_or_a_tensor_holds_it) {
  fixture f;
  f.begin_capture(g1, capture_stream);
  void* out = f.router->allocate(10 * MiB, capture_stream);  // the graph's output, alive after capture
  f.end_capture(g1, capture_stream);
  std::size_t created = f.dev->created_bytes();
  f.router->release_pool(g1);  // graph destroyed, output still alive
  ASSERT_TRUE(f.has_pool(g1));
  EXPECT_EQ(f.info(g1).users, 0);
  EXPECT_EQ(f.dev->created_bytes(), created);
  f.router->deallocate(out, 10 * MiB, capture_stream);  // last tensor: the pool goes, with its pages
  EXPECT_FALSE(f.has_pool(g1));
  EXPECT_LT(f.dev->created_bytes(), created);
}

TEST(capture_router, two_graphs_share_one_pool_until_both_are_gone) {
  fixture f;
  f.begin_capture(g2, capture_stream);
  void* a = f.router->allocate(4 * MiB, capture_stream);
  f.router->deallocate(a, 4 * MiB, capture_stream);
  f.end_capture(g2, capture_stream);
  f.begin_capture(g2, capture_stream);
  void* b = f.router->allocate(4 * MiB, capture_stream);
  EXPECT_EQ(a, b);  // the second graph reuses the first graph's scratch
  f.router->deallocate(b, 4 * MiB, capture_stream);
  f.end_capture(g2, capture_stream);
  EXPECT_EQ(f.pools_made, 1);
  EXPECT_EQ(f.info(g2).users, 2);
  f.router->release_pool(g2);
  EXPECT_TRUE(f.has_pool(g2));
  f.router->release_pool(g2);
  EXPECT_FALSE(f.has_pool(g2));
  f.router->release_pool(g2);  // unknown by now: ignored
}

TEST(capture_router, a_scoped_pool_routes_only_what_its_filter_accepts) {
  fixture f;
  f.router->incref_pool(g1);  // the MemPool object
  std::atomic<bool> mine{true};
  f.router->begin_allocate_to_pool(g1, [&](stream_t) { return mine.load(); });  // "this thread"
  void* in = f.router->allocate(MiB, 0);
  mine = false;
  void* out = f.router->allocate(MiB, 0);
  graph_pool_id id;
  EXPECT_TRUE(f.router->owner(in, id));
  EXPECT_FALSE(f.router->owner(out, id));
  // Not a capture: a main block freed inside the scope goes back at once.
  EXPECT_EQ(f.router->deallocate(out, MiB, 0), free_status::ok);
  EXPECT_EQ(f.main->allocation_size(out), 0u);
  f.router->end_allocate_to_pool(g1);
  f.router->release_pool(g1);  // end of the with-block
  EXPECT_EQ(f.info(g1).users, 1);
  auto live = f.router->live_pointers(g1);
  ASSERT_EQ(live.size(), 1u);
  EXPECT_EQ(live[0], in);
  f.router->deallocate(in, MiB, 0);
  f.router->release_pool(g1);  // the MemPool object is gone
  EXPECT_FALSE(f.has_pool(g1));
}

TEST(capture_router, a_private_pool_never_queries_events_recorded_during_a_capture) {
  fixture f;
  const stream_t side = 9;
  f.begin_capture(g1, capture_stream);
  f.capturing.insert(side);  // a stream forked into the capture
  void* a = f.router->allocate(4 * MiB, side);
  f.router->record_stream(a, capture_stream);
  f.router->deallocate(a, 4 * MiB, side);
  // Another stream of the capture may not take it: its events are markers.
  void* b = f.router->allocate(4 * MiB, capture_stream);
  EXPECT_NE(a, b);
  f.capturing.erase(side);
  f.end_capture(g1, capture_stream);
  f.router->deallocate(b, 4 * MiB, capture_stream);
  f.router->release_pool(g1);
}

TEST(capture_aware_events, markers_complete_when_no_capture_is_under_way) {
  auto inner = std::make_shared<manual_events>();
  bool under_way = true;
  std::set<stream_t> capturing{5};
  capture_aware_events ev(inner, [&](stream_t s) { return capturing.count(s) != 0; }, [&] { return under_way; });
  event_id m = ev.record(5);
  event_id e = ev.record(1);
  EXPECT_FALSE(ev.done(m));
  EXPECT_THROW(ev.wait(m), error);
  EXPECT_FALSE(ev.done(e));  // a real event: the inner events decide
  inner->completed = e;
  EXPECT_TRUE(ev.done(e));
  under_way = false;
  EXPECT_TRUE(ev.done(m));
  EXPECT_NO_THROW(ev.wait(m));
  ev.release(m);
  ev.release(e);
}

TEST(capture_router, a_tracker_over_the_main_resource_serves_from_then_on_and_frees_what_either_gave) {
  fixture f;
  EXPECT_EQ(f.router->base().get(), f.main.get());
  void* before = f.router->allocate(2 * MiB, 0);
  // What leak tracking puts over the device's resource, and takes off again.
  auto tracker = std::make_shared<tracking_adaptor>(f.main);
  f.router->set_main(tracker, 5);
  EXPECT_EQ(f.router->main_generation(), 5u);
  EXPECT_EQ(f.router->main().get(), tracker.get());
  void* during = f.router->allocate(3 * MiB, 0);
  EXPECT_EQ(tracker->counts().live_count, 1u);
  EXPECT_EQ(tracker->counts().live_bytes, 3 * MiB);
  EXPECT_EQ(f.router->deallocate(before, 2 * MiB, 0), free_status::ok);  // given before the tracker
  EXPECT_EQ(tracker->counts().untracked_frees, 1u);
  f.router->set_main(f.router->base(), 4);  // an older generation (a slower thread): ignored
  EXPECT_EQ(f.router->main().get(), tracker.get());
  f.router->set_main(f.router->base(), 6);  // taken off
  EXPECT_EQ(f.router->main().get(), f.main.get());
  EXPECT_EQ(f.router->deallocate(during, 3 * MiB, 0), free_status::ok);  // straight to the pool
  EXPECT_EQ(f.main->state().live_bytes, 0u);
  EXPECT_EQ(tracker->counts().live_count, 1u);  // the tracker is off: it no longer sees frees
  EXPECT_THROW(f.router->set_main(nullptr, 7), invalid_argument);
  EXPECT_EQ(f.router->main_generation(), 6u);
}
