// Entry points of the caching pool: construction and teardown, allocate and
// free (the request flow of docs/pool-design.md starts here), and the public
// API, which locks and forwards to the parts (see pool/pool_impl.hpp).
#include "vramkit/mr/pool_resource.hpp"

#include <algorithm>
#include <bit>
#include <vector>

#include "pool/pool_impl.hpp"

// The parts, in this one translation unit: calls between them inline as
// within one file (CMakeLists.txt leaves them out of the source list).
#include "pool/chunks.cpp"
#include "pool/diagnostics.cpp"
#include "pool/page_ahead.cpp"
#include "pool/page_mapping.cpp"
#include "pool/page_supply.cpp"
#include "pool/placement.cpp"
#include "pool/release.cpp"
#include "pool/stream_reuse.cpp"
#include "pool/step_finder.cpp"
#include "pool/step_plan.cpp"

namespace vramkit {

// ---- setup -------------------------------------------------------------
void pool_resource::impl::init_common() {
  opt.validate();
  slots.set_page(page);
  limit = opt.reserve_limit ? std::min(opt.reserve_limit, capacity) : capacity;
}

void pool_resource::impl::init_paged() {
  page = opt.page_size ? opt.page_size : pages->granularity();
  // Each pool page is one device page (one handle, mapped whole): a larger
  // pool page over smaller device pages would leave most of it unmapped.
  if (page != pages->granularity())
    throw invalid_argument("page_size " + std::to_string(page) + " differs from the page device's pages (" +
                           std::to_string(pages->granularity()) +
                           " bytes): give the device the same page size (VRAMKIT_ALLOC_CONF and make_resource do)");
  capacity = pages->capacity();
  dev = pages->device();
  init_common();
  // Chunks of one page or less are single pages: no chunks (page_size may
  // have been raised to or past the default chunk_size). With plan_steps,
  // chunks only until the first mark (step_plan.cpp, plan_give_back_chunks).
  if (opt.chunk_size > page) {
    if (opt.chunk_size % page)
      throw invalid_argument("chunk_size " + std::to_string(opt.chunk_size) + " must be a multiple of the page size (" +
                             std::to_string(page) + " bytes), or at most one page for none");
    chunk = opt.chunk_size / page;
    chunk_min = chunk;
    if (opt.chunk_min_size) {
      const std::size_t m = opt.chunk_min_size;
      if (m % page || m / page < 2 || m > opt.chunk_size || chunk % (m / page) ||
          !std::has_single_bit(chunk / (m / page)))
        throw invalid_argument("chunk_min_size " + std::to_string(m) +
                               " must be at least two pages and divide chunk_size (" +
                               std::to_string(opt.chunk_size) + ") by a power of two, or 0 for chunks of one size");
      chunk_min = m / page;
    }
  }
  std::size_t va = round_up(static_cast<std::size_t>(static_cast<double>(capacity) * opt.va_factor), page);
  va = std::max(va, page * 64);
  for (bool small : {true, false}) {
    auto* a = new detail::arena;
    a->base = pages->reserve(va);
    a->size = va;
    a->paged = true;
    a->small = small;
    std::size_t np = va / page;
    a->handles.assign(np, 0);
    a->mapped_bits.assign((np + 63) / 64, 0);
    a->ahead_bits.assign((np + 63) / 64, 0);
    a->phys.assign(np, 0);
    if (chunk > 1 && !small) a->chunk_bits.assign((np + 63) / 64, 0);
    if (opt.remap_own) a->early.assign(np, 0);
    block* b = blocks.make();
    b->addr = a->base;
    b->size = va;
    b->ar = a;
    b->unmapped = np;
    a->first = b;
    arenas.push_back(a);
    slots.insert(b, 0);
  }
}

void pool_resource::impl::init_segmented() {
  page = opt.large_rounding;
  memory_state us = upstream->state();
  capacity = us.capacity_bytes ? us.capacity_bytes : std::numeric_limits<std::size_t>::max() / 2;
  dev = upstream->device();
  init_common();
}


pool_resource::impl::~impl() {
  stop_ahead();  // the helper thread first: it may be making pages
  // Events still held are given back without waiting (nothing may run on
  // memory of a pool being destroyed).
  for (auto& s : slots) {
    if (s.event_pending) streams->release(s.event);
    if (s.progress_pending) streams->release(s.progress);
  }
  for (block* b : pending)
    for (event_id e : b->events)
      if (e) streams->release(e);
  for (std::size_t m = 1; m < early.size(); ++m)
    if (!early[m].done) streams->release(early[m].e);
  // Every mapping goes before any page is destroyed: a page in use in one
  // arena may keep a stale mapping in the other.
  for (auto* a : arenas)
    if (a->paged)
      for (std::size_t p = 0; p < a->top;) {
        if (!a->phys[p]) {
          ++p;
          continue;
        }
        std::size_t e = p;
        while (e < a->top && a->phys[e]) ++e;
        pages->unmap(a->base + p * page, e - p);
        p = e;
      }
  for (auto* a : arenas) {
    if (a->paged) {
      for (std::size_t p = 0; p < a->top; ++p)
        if (a->in_chunk(p)) {
          if (chunk_span(a, p).first == p) pages->destroy(a->handles[p]);  // one handle for the chunk's pages
        } else if (a->handles[p])
          pages->destroy(a->handles[p]);
        else if (a->ahead(p))
          pages->destroy(a->phys[p]);
      pages->unreserve(a->base, a->size);
    } else {
      upstream->deallocate(reinterpret_cast<void*>(a->base), a->size, 0);
    }
    delete a;
  }
  for (auto h : spare_handles) pages->destroy(h);
}

// ---- allocate / free ------------------------------------------------------
void* pool_resource::impl::allocate(std::size_t bytes, stream_t stream) {
  if (bytes == 0) return nullptr;
  std::lock_guard<std::mutex> lk(mu);
  if (bytes > limit) throw_oom(bytes, "the request is larger than the ");
  std::size_t size = round_up(bytes, opt.alignment);
  bool small = size <= opt.small_threshold;
  std::uint32_t slot = slots.slot_for(stream);
  if (!pending.empty()) process_pending(false);
  if (opt.plan_steps && !small && !plan.marked && !upstream) plan_find_steps(size);  // may begin a step
  const bool planning = plan.ph != step_plan::phase::off && !small;  // plan_steps
  auto placed = [&](block* b) {
    void* p = finish(b, bytes, stream);
    if (planning) plan_note_alloc(b->addr, size);
    return p;
  };
  if (planning && plan.ph == step_plan::phase::planned)
    if (block* b = plan_place(size, slot)) return finish(b, bytes, stream);
  if (block* b = try_place(size, small, slot, stream)) return placed(b);
  // Slow path: take other streams' finished frees, then wait for them,
  // then give back everything cached, before declaring out of memory.
  ++st.retries;
  if (reclaim_streams(false))
    if (block* b = try_place(size, small, slot, stream)) return placed(b);
  if (!pending.empty()) process_pending(true);
  reclaim_streams(true);
  if (!upstream) {
    destroy_spares();
    drop_ahead();
  } else {
    release_free_segments();
  }
  if (block* b = try_place(size, small, 0, stream)) return placed(b);
  ++st.oom_count;
  throw_oom(bytes, "");
}

free_status pool_resource::impl::deallocate(void* ptr, std::size_t bytes, stream_t stream) {
  if (!ptr) return free_status::ok;
  std::lock_guard<std::mutex> lk(mu);
  auto key = reinterpret_cast<std::uintptr_t>(ptr);
  block** slot = live.find(key);
  if (!slot) return free_status::not_owned;
  block* b = *slot;
  if (bytes != 0 && bytes != b->requested && round_up(bytes, opt.alignment) != b->size)
    return free_status::wrong_size;
  live.erase(key);
  live_bytes -= b->size;
  if (!b->ar->small) live_large -= b->size;
  // Freed on another stream than allocated: the memory is in use on both.
  if (stream != b->stream &&
      std::find(b->extra_streams.begin(), b->extra_streams.end(), stream) == b->extra_streams.end())
    b->extra_streams.push_back(stream);
  if (plan.ph != step_plan::phase::off && !b->ar->small) plan_note_free(key, !b->extra_streams.empty());
  if (!b->extra_streams.empty()) {
    // An event that cannot be recorded now (0) is recorded later, when the
    // pending frees are looked at: the block waits for it (a later event
    // covers the work queued before this free too).
    for (stream_t s : b->extra_streams) {
      event_id e = 0;
      try {
        e = streams->record(s);
      } catch (...) {
      }
      b->events.push_back(e);
    }
    b->state = block::pending_state;
    pending_bytes += b->size;
    pending.push_back(b);
    return free_status::ok;
  }
  b->unmapped = 0;
  const std::uint32_t to = slots.slot_for(b->stream);
  const bool paged = b->ar->paged;  // (b may be merged away by free_into)
  slots.free_into(b, to, ++free_seq, blocks);
  if (to != 0 && opt.remap && paged) note_progress(slots[to]);
  if (opt.release_threshold != std::numeric_limits<std::size_t>::max()) {
    try {  // the free is done; giving memory back is only an attempt here
      trim_to(opt.release_threshold, true);
    } catch (...) {
    }
  }
  return free_status::ok;
}

// ---- public surface ---------------------------------------------------------
pool_resource::pool_resource(std::shared_ptr<page_device> pages, std::shared_ptr<stream_ops> streams,
                             pool_options options)
    : impl_(std::make_unique<impl>()) {
  if (!pages) throw invalid_argument("pool_resource: no page device given");
  impl_->pages = std::move(pages);
  impl_->streams = streams ? std::move(streams) : std::make_shared<host_stream_ops>();
  impl_->opt = options;
  impl_->calls0 = impl_->pages->call_times();  // a device may serve pools before this one
  impl_->init_paged();
}

pool_resource::pool_resource(std::shared_ptr<device_resource> upstream, std::shared_ptr<stream_ops> streams,
                             pool_options options)
    : impl_(std::make_unique<impl>()) {
  if (!upstream) throw invalid_argument("pool_resource: no upstream resource given");
  impl_->upstream = std::move(upstream);
  impl_->streams = streams ? std::move(streams) : std::make_shared<host_stream_ops>();
  impl_->opt = options;
  impl_->init_segmented();
}

pool_resource::~pool_resource() = default;

void* pool_resource::do_allocate(std::size_t bytes, stream_t stream) { return impl_->allocate(bytes, stream); }
free_status pool_resource::try_deallocate(void* p, std::size_t bytes, stream_t stream) noexcept {
  return impl_->deallocate(p, bytes, stream);
}
void pool_resource::record_stream(void* p, stream_t s) { impl_->record_stream(p, s); }
void pool_resource::release_cached() { impl_->release_cached(); }
void pool_resource::reset_peaks() {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->peak_live = impl_->live_bytes;
  impl_->peak_reserved = impl_->reserved;
}
memory_state pool_resource::state() const { return impl_->state(); }
int pool_resource::device() const noexcept { return impl_->dev; }
std::string pool_resource::name() const {
  return "pool(" + (impl_->upstream ? impl_->upstream->name() : impl_->pages->name()) + ")";
}
std::size_t pool_resource::allocation_size(const void* p) const noexcept {
  std::lock_guard<std::mutex> lk(impl_->mu);
  auto* b = impl_->live.find(reinterpret_cast<std::uintptr_t>(p));
  return b ? (*b)->requested : 0;
}
bool pool_resource::backs_memory() const noexcept { return !impl_->upstream || impl_->upstream->backs_memory(); }
pool_counters pool_resource::counters() const {
  pool_counters c;
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    c = impl_->ctr;
    c.step_period = impl_->plan.period;
  }
  if (impl_->pages) {
    const page_call_times t = impl_->pages->call_times(), &t0 = impl_->calls0;
    c.page_create_ns = t.create_ns - t0.create_ns;
    c.page_map_ns = t.map_ns - t0.map_ns;
    c.page_unmap_ns = t.unmap_ns - t0.unmap_ns;
    c.page_destroy_ns = t.destroy_ns - t0.destroy_ns;
  }
  return c;
}
const pool_options& pool_resource::options() const noexcept { return impl_->opt; }
bool pool_resource::paged() const noexcept { return !impl_->upstream; }
std::size_t pool_resource::page_size() const noexcept { return impl_->page; }
void pool_resource::set_reserve_limit(std::size_t bytes) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  if (bytes > impl_->capacity)
    throw invalid_argument("reserve limit " + format_bytes(bytes) + " is above the device capacity " +
                           format_bytes(impl_->capacity));
  impl_->limit = bytes ? bytes : impl_->capacity;
  // Cached memory over the new limit goes back now; live memory stays (later
  // growth is refused until usage is under the limit).
  if (impl_->reserved > impl_->limit) impl_->trim_to(impl_->limit > impl_->live_bytes ? impl_->limit - impl_->live_bytes : 0);
}
std::vector<segment_info> pool_resource::segments() const { return impl_->segments(); }
void pool_resource::check_invariants() const { impl_->check(); }
void pool_resource::mark_step() {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->mark_step_from_program();
}
pool_resource::page_usage pool_resource::usage() const { return impl_->usage(); }


}  // namespace vramkit
