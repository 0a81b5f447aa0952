#include "vramkit/mr/capture_router.hpp"

#include <utility>

namespace vramkit {

namespace {
struct set_aside {
  void* ptr;
  std::size_t bytes;
  stream_t stream;
};
}  // namespace

struct capture_router::private_pool {
  std::shared_ptr<device_resource> res;
  int users = 0;
  int windows = 0;
  bool captured = false;
  std::size_t live = 0;
  std::vector<set_aside> aside;
  std::size_t aside_bytes = 0;
};

capture_router::capture_router(std::shared_ptr<device_resource> main, make_pool_fn make_pool,
                               stream_query stream_capturing, thread_query thread_capturing,
                               std::function<void()> synchronize)
    : base_(main),
      main_(std::move(main)),
      make_pool_(std::move(make_pool)),
      stream_capturing_(std::move(stream_capturing)),
      thread_capturing_(std::move(thread_capturing)),
      synchronize_(std::move(synchronize)) {
  if (!main_.load()) throw invalid_argument("capture_router: no main resource");
  if (!make_pool_) throw invalid_argument("capture_router: no way to make private pools");
}

capture_router::~capture_router() {
  // Blocks set aside belong to the main resource: give them back. Private
  // pools go with their memory (their owner is gone too).
  bool any = !pools_.empty();
  if (any && synchronize_) {
    try {
      synchronize_();
    } catch (...) {
    }
  }
  auto m = main();
  for (auto& [id, p] : pools_)
    for (auto& a : p->aside) m->try_deallocate(a.ptr, a.bytes, a.stream);
}

void capture_router::set_main(std::shared_ptr<device_resource> m, std::uint64_t generation) {
  if (!m) throw invalid_argument("capture_router: no main resource");
  std::shared_ptr<device_resource> old;  // released after the lock: its deleter may take the GIL
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (generation < main_generation_.load(std::memory_order_relaxed)) return;
    old = main_.exchange(std::move(m), std::memory_order_acq_rel);
    main_generation_.store(generation, std::memory_order_release);
  }
}

capture_router::private_pool* capture_router::pool_for_(graph_pool_id id) {
  auto it = pools_.find(id);
  if (it != pools_.end()) return it->second.get();
  auto p = std::make_unique<private_pool>();
  p->res = make_pool_();
  if (!p->res) throw error("capture_router: the private pool could not be made");
  return pools_.emplace(id, std::move(p)).first->second.get();
}

void* capture_router::allocate(std::size_t bytes, stream_t stream) {
  if (routing()) {
    std::unique_lock<std::mutex> lk(mu_);
    for (auto it = open_.rbegin(); it != open_.rend(); ++it) {
      if (it->filter && !it->filter(stream)) continue;
      private_pool* p = pool_for_(it->id);
      void* ptr = p->res->allocate(bytes, stream);
      if (!ptr) return ptr;
      owners_.emplace(reinterpret_cast<std::uintptr_t>(ptr), it->id);
      ++p->live;
      private_live_.fetch_add(1, std::memory_order_relaxed);
      if (stream_capturing_ && stream_capturing_(stream)) p->captured = true;
      return ptr;
    }
  }
  return main()->allocate(bytes, stream);
}

free_status capture_router::deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept {
  if (!ptr) return free_status::ok;
  if (private_live_.load(std::memory_order_acquire) == 0 && !routing())
    return main()->try_deallocate(ptr, bytes, stream);
  std::unique_lock<std::mutex> lk(mu_);
  auto it = owners_.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it != owners_.end()) {
    graph_pool_id id = it->second;
    private_pool* p = pools_.at(id).get();
    free_status st = p->res->try_deallocate(ptr, bytes, stream);
    if (st != free_status::ok) return st;
    owners_.erase(it);
    --p->live;
    private_live_.fetch_sub(1, std::memory_order_relaxed);
    settle_(id, lk);
    return free_status::ok;
  }
  if (!open_.empty()) {
    bool capturing = false;
    try {
      capturing = (thread_capturing_ && thread_capturing_()) || (stream_capturing_ && stream_capturing_(stream));
    } catch (...) {
      capturing = true;  // cannot tell: keep the block away from reuse
    }
    // Only a block the main resource really holds is set aside; anything
    // else gets the main resource's verdict (double free, foreign pointer).
    auto m = main();
    if (capturing && m->allocation_size(ptr) != 0) {
      private_pool* p = pools_.at(open_.back().id).get();
      try {
        p->aside.push_back({ptr, bytes, stream});
      } catch (...) {
        return m->try_deallocate(ptr, bytes, stream);
      }
      p->aside_bytes += bytes;
      p->captured = true;
      return free_status::ok;
    }
  }
  lk.unlock();
  return main()->try_deallocate(ptr, bytes, stream);
}

void capture_router::record_stream(void* ptr, stream_t stream) {
  std::shared_ptr<device_resource> target = main();
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = owners_.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it != owners_.end()) target = pools_.at(it->second)->res;
  }
  target->record_stream(ptr, stream);
}

void capture_router::begin_allocate_to_pool(graph_pool_id id, stream_filter filter) {
  std::lock_guard<std::mutex> lk(mu_);
  private_pool* p = pool_for_(id);
  open_.push_back({id, std::move(filter)});
  ++p->users;
  ++p->windows;
  windows_.fetch_add(1, std::memory_order_release);
}

void capture_router::incref_pool(graph_pool_id id) {
  std::lock_guard<std::mutex> lk(mu_);
  ++pool_for_(id)->users;
}

void capture_router::end_allocate_to_pool(graph_pool_id id) {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto it = open_.rbegin(); it != open_.rend(); ++it) {
    if (it->id != id) continue;
    open_.erase(std::next(it).base());
    windows_.fetch_sub(1, std::memory_order_release);
    auto p = pools_.find(id);
    if (p != pools_.end() && p->second->windows > 0) --p->second->windows;
    return;
  }
}

void capture_router::release_pool(graph_pool_id id) {
  std::unique_lock<std::mutex> lk(mu_);
  auto it = pools_.find(id);
  if (it == pools_.end()) return;
  if (it->second->users > 0) --it->second->users;
  settle_(id, lk);
}

void capture_router::settle_(graph_pool_id id, std::unique_lock<std::mutex>& lk) noexcept {
  auto it = pools_.find(id);
  if (it == pools_.end() || it->second->users > 0 || it->second->windows > 0) {
    lk.unlock();
    return;
  }
  private_pool* p = it->second.get();
  std::vector<set_aside> aside;
  aside.swap(p->aside);
  p->aside_bytes = 0;
  std::shared_ptr<device_resource> gone;
  if (p->live == 0) {
    gone = std::move(p->res);
    pools_.erase(it);
  }
  lk.unlock();
  if (aside.empty() && !gone) return;
  // Replays of the graph may still be queued on any stream: let them finish
  // before its memory serves anything else.
  if (synchronize_) {
    try {
      synchronize_();
    } catch (...) {
    }
  }
  auto m = main();
  for (auto& a : aside) m->try_deallocate(a.ptr, a.bytes, a.stream);
  gone.reset();
}

std::vector<graph_pool_info> capture_router::pools() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<graph_pool_info> out;
  for (auto& [id, p] : pools_) {
    graph_pool_info i;
    i.id = id;
    i.users = p->users;
    i.windows = p->windows;
    i.captured = p->captured;
    i.set_aside_count = p->aside.size();
    i.set_aside_bytes = p->aside_bytes;
    i.state = p->res->state();
    out.push_back(i);
  }
  return out;
}

bool capture_router::owner(const void* ptr, graph_pool_id& id) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = owners_.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == owners_.end()) return false;
  id = it->second;
  return true;
}

std::vector<void*> capture_router::live_pointers(graph_pool_id id) const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<void*> out;
  for (auto& [p, owner] : owners_)
    if (owner == id) out.push_back(reinterpret_cast<void*>(p));
  return out;
}

// ---- capture-aware events -----------------------------------------------------
capture_aware_events::capture_aware_events(std::shared_ptr<stream_ops> inner,
                                           capture_router::stream_query stream_capturing,
                                           std::function<bool()> capture_under_way)
    : inner_(std::move(inner)),
      stream_capturing_(std::move(stream_capturing)),
      capture_under_way_(std::move(capture_under_way)) {}

event_id capture_aware_events::record(stream_t s) {
  if (stream_capturing_ && stream_capturing_(s))
    return marker_bit | next_marker_.fetch_add(1, std::memory_order_relaxed);
  return inner_->record(s);
}

bool capture_aware_events::done(event_id e) {
  if (e & marker_bit) return !capture_under_way_();
  return inner_->done(e);
}

void capture_aware_events::wait(event_id e) {
  if (e & marker_bit) {
    if (capture_under_way_())
      throw error("cannot wait for work on a stream that is being captured into a CUDA graph");
    return;
  }
  inner_->wait(e);
}

void capture_aware_events::release(event_id e) noexcept {
  if (!(e & marker_bit)) inner_->release(e);
}

bool capture_aware_events::capturing(stream_t s) noexcept {
  try {
    return stream_capturing_ && stream_capturing_(s);
  } catch (...) {
    return true;  // cannot tell: leave the stream alone
  }
}

}  // namespace vramkit
