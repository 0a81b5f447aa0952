// The caching pool's private state and the parts that work on it. Each part
// lives in its own file, named after the design (docs/pool-design.md draws
// how a request flows through them; glossary.hpp defines the words):
//
//   pool_resource.cpp  entry points: setup, allocate, free, teardown, public API
//   placement.cpp      where a request goes: fit, hollow places, runs, splits
//   page_supply.cpp    physical pages for a placement: spares, new pages, steals
//   page_mapping.cpp   mapping pages under a block; kept mappings
//   page_ahead.cpp     map_ahead: pages made ready on a helper thread where the pool grows
//   chunks.cpp         chunk_size: bulk growth in large handles that never move
//   stream_reuse.cpp   frees on other streams: pending blocks, slot reclaims
//   step_plan.cpp      plan_steps: a marked step laid out once, later steps placed there
//   step_finder.cpp    plan_steps without marks: the step's period found in the requests
//   release.cpp        giving memory back: trim, release_cached, segments
//   diagnostics.cpp    invariants, reports, the out-of-memory message
//
// and two headers of state with its own invariants: page_map.hpp (an arena
// and its pages) and stream_slots.hpp (slot_table: the free blocks of every
// stream). The small functions every request passes through (the free index,
// the page arithmetic, finish) are inline there or here, and the .cpp parts
// are compiled as one unit (pool_resource.cpp includes them), so splitting
// the files costs the hot path no call. Each part still compiles on its own.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "../../detail/flat_map.hpp"
#include "../../detail/free_index.hpp"
#include "glossary.hpp"
#include "page_map.hpp"
#include "stream_slots.hpp"
#include "vramkit/mr/pool_resource.hpp"

namespace vramkit {

using detail::block;
using detail::free_index;
using detail::round_up;

struct pool_resource::impl {
  // ---- configuration (set at construction) -------------------------------
  std::shared_ptr<page_device> pages;          // paged pools
  page_call_times calls0;                      // the device's page-call times when the pool began
  std::shared_ptr<device_resource> upstream;   // segmented pools
  std::shared_ptr<stream_ops> streams;
  pool_options opt;
  std::size_t page = 0;      // page size (paged) or segment granularity
  std::size_t chunk = 0;     // chunk_size in pages (0: no chunks)
  std::size_t chunk_min = 0; // chunk_min_size in pages (chunk: chunks of one size)
  std::size_t capacity = 0;  // device capacity
  std::size_t limit = 0;     // reserve limit in force
  int dev = 0;

  mutable std::mutex mu;  // guards everything below
  // Page map: the arenas and the pages behind them (page_map.hpp).
  std::vector<detail::arena*> arenas;  // paged: the small arena first, then the large; else segments
  // Stream slots: every free block is in exactly one slot's index.
  detail::slot_table slots;
  // Live blocks by address; blocks freed while other streams still use them.
  detail::ptr_map<block*> live;
  std::vector<block*> pending;
  // Page supply: created pages in use nowhere, and kept mappings.
  std::vector<page_handle> spare_handles;  // created, in use nowhere (may keep stale mappings)
  std::size_t stale = 0;                   // kept mappings of pages not in use there
  detail::block_pool blocks;
  // Page supply ahead (map_ahead, page_ahead.cpp): pages the helper thread
  // made past the large arena's highest page in use (arena::ahead_bits), and
  // the one batch it is making now. The batch's pages count as reserved from
  // the moment they are claimed; `made` is written by the helper without the
  // lock and read under it once `done` is set.
  struct ahead_batch {
    detail::arena* a = nullptr;
    std::size_t first = 0, count = 0;  // the claimed pages [first, first + count)
    std::vector<page_handle> made;
    std::atomic<bool> done{false};
    bool active = false;
  };
  ahead_batch inflight;
  std::size_t ahead_pages = 0;  // pages with their ahead bit set
  std::vector<std::size_t> ahead_took;  // the pages use_ahead gave the block being backed
  bool ahead_failed = false;    // the device refused a page: no more until memory is given back
  bool ahead_held = false;      // given back (trim, empty_cache): no more until the pool grows again
  std::thread ahead_thread;
  std::mutex ahead_mu;  // guards the two flags below (taken after mu, never before it)
  std::condition_variable ahead_cv;
  bool ahead_wake = false, ahead_stop = false;

  // Accounting.
  std::size_t live_bytes = 0;
  std::size_t live_large = 0;  // of live_bytes, in the large arenas (plan_steps' step finder)
  std::size_t pending_bytes = 0;
  std::size_t reserved = 0;
  std::size_t peak_live = 0;
  std::size_t peak_reserved = 0;
  std::uint64_t free_seq = 0;  // orders frees against the events that cover them
  memory_state st;  // counters only (oom_count, retries, upstream_*)
  pool_counters ctr;
  // Adds the wall time of its scope to ctr.gpu_wait_ns: the pool waiting for
  // the GPU (an event, a stream's queued work, the whole device, a copy).
  struct gpu_wait {
    pool_counters& c;
    std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
    ~gpu_wait() {
      c.gpu_wait_ns += static_cast<std::uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
    }
  };

  // ---- entry points (pool_resource.cpp) ----------------------------------
  void init_common();
  void init_paged();
  void init_segmented();
  ~impl();
  void* allocate(std::size_t bytes, stream_t stream);
  free_status deallocate(void* ptr, std::size_t bytes, stream_t stream);

  // ---- placement (placement.cpp) -----------------------------------------
  block* try_place(std::size_t size, bool small, std::uint32_t slot, stream_t stream);
  block* best_hollow(std::size_t size, bool small, std::uint32_t slot, std::uintptr_t& at, std::size_t& best_cost);
  block* best_run(std::size_t size, bool small, std::uint32_t slot, std::uintptr_t& at, std::size_t best_cost);
  block* join(block* first, block* last);
  block* place(block* b, std::uintptr_t at, std::size_t size, std::uint32_t slot);
  block* carve_run(block* b, std::uintptr_t at, std::size_t size, std::uint32_t slot);
  void uncarve(block* b, std::uint32_t slot);

  // ---- page supply (page_supply.cpp) -------------------------------------
  static constexpr int steal_scan = 32;
  // slack: growth_slack, or remap_own_slack before the own stream's frees are taken early.
  bool may_grow_by(std::size_t bytes, std::size_t counted, std::size_t need_live, double slack) const;
  bool may_grow_by(std::size_t bytes, std::size_t counted, std::size_t need_live) const {
    return may_grow_by(bytes, counted, need_live, opt.growth_slack);
  }
  page_handle create_page();
  std::size_t steal(std::uint32_t slot, std::size_t want, std::vector<page_handle>& out, std::uint32_t mark = 0);
  // edges: how many of the n pages back a block's edge pages (remap_own takes none of those early).
  bool acquire(std::size_t n, std::size_t need_live, std::uint32_t slot, std::vector<page_handle>& out,
               std::size_t edges = 0);
  bool acquire_some(std::size_t n, std::size_t need_live, std::uint32_t slot, std::vector<page_handle>& out,
                    std::size_t edges);
  void drop_pages(const std::vector<page_handle>& hs) noexcept;

  // remap_own (page_supply.cpp): pages taken from the requester's own free
  // blocks before its stream's work was known done. Their old addresses stay
  // mapped (kept mappings carrying arena::early marks) until the event of
  // their mark, recorded on that stream when they were taken, completes.
  struct early_mark {
    event_id e = 0;
    stream_t stream = 0;
    std::uint32_t slot = 0;
    std::uint64_t seq = 0;  // the latest free of the blocks its pages came from
    std::size_t pages = 0;  // kept mappings carrying this mark
    bool done = false;      // the event completed or is no longer needed (and was released)
  };
  std::vector<early_mark> early{1};       // [0]: no mark
  std::vector<std::uint32_t> early_idle;  // marks no page carries, to reuse
  std::vector<std::uint32_t> early_open;  // marks whose event may not be done, oldest first
  std::size_t early_pages = 0;            // pages carrying a mark
  std::uint32_t acquire_mark = 0;         // the mark of the last acquire's pages (0: none taken early)
  std::vector<page_handle> early_got;     // the pages the last acquire took early
  void spares_from_acquire(std::vector<page_handle>& hs) noexcept;
  void finish_early(std::uint32_t m) noexcept;
  void await_early(std::uint32_t m);
  bool steal_early(std::uint32_t slot, std::size_t want, std::vector<page_handle>& out, std::uint32_t& mark);
  void close_early(std::uint32_t m) noexcept;
  bool early_known_done(std::uint32_t m) const;
  void settle_early(detail::arena* a, std::size_t p, std::size_t e);
  void forget_early(detail::arena* a, std::size_t p, std::size_t e) noexcept;
  void poll_early() noexcept;

  // ---- chunks (chunks.cpp) -----------------------------------------------
  std::size_t chunk_pages = 0;  // pages held in chunks
  std::size_t make_chunks(detail::arena* a, std::uintptr_t addr, std::size_t size, std::size_t need_live,
                          std::size_t want, std::vector<std::size_t>& made);
  void undo_chunks(detail::arena* a, const std::vector<std::size_t>& made) noexcept;
  std::size_t make_growth_chunk(block* b, std::size_t size, std::size_t need_live, std::vector<std::size_t>& made);
  void recount_free(block* f) noexcept;
  bool empty_chunk_place(const detail::arena* a, std::size_t c, std::size_t n) const;
  // The chunk holding page p (in a chunk): its first page and its pages.
  std::pair<std::size_t, std::size_t> chunk_span(const detail::arena* a, std::size_t p) const noexcept;
  // The pages of [lo, hi) that chunks reaching outside it may not hold: [clo, chi)
  // (chunk pages in it lie in chunks wholly inside [lo, hi)).
  std::pair<std::size_t, std::size_t> chunks_inside(const detail::arena* a, std::size_t lo, std::size_t hi) const noexcept;
  // plan_steps: chunks only before the second mark (step_plan.cpp)
  bool chunks_now() const noexcept { return plan.marks < 2; }
  bool make_chunk_at(detail::arena* a, std::size_t c, std::size_t n);
  std::size_t give_back_chunk(detail::arena* a, std::size_t c) noexcept;  // returns its pages
  std::size_t split_chunks() noexcept;  // returns the chunks split
  bool split_chunk(detail::arena* a, std::size_t c, std::size_t n, std::uintptr_t spare,
                   std::vector<page_handle>& hs) noexcept;

  // ---- page mapping (page_mapping.cpp) -----------------------------------
  bool back(block* b, std::size_t size, std::size_t need_live, std::uint32_t slot, std::size_t& newly);
  void settle_edges(std::vector<page_handle>& got, std::size_t edges) noexcept;
  static void return_home(const detail::arena* a, std::size_t p0, std::size_t p1, bool edge0, bool edge1,
                          std::vector<page_handle>& hs);

  // ---- page supply ahead (page_ahead.cpp) --------------------------------
  static constexpr std::size_t ahead_batch_pages = 8;
  std::size_t ahead_target() const;
  void wake_ahead();
  void after_backing(std::size_t created, std::size_t used) noexcept;
  void ahead_loop();
  bool claim_ahead();
  void make_ahead() noexcept;
  void apply_ahead();
  void wait_ahead();
  std::size_t use_ahead(detail::arena* a, std::size_t p0, std::size_t p1);
  void unuse_ahead(detail::arena* a);
  std::size_t take_ahead(std::size_t want, std::vector<page_handle>& out);
  void drop_ahead(bool wait = true);
  void stop_ahead() noexcept;
  std::size_t held_ahead_bytes() const { return (ahead_pages + (inflight.active ? inflight.count : 0)) * page; }

  // ---- stream reuse (stream_reuse.cpp) -----------------------------------
  void process_pending(bool wait);
  bool reclaim_streams(bool wait, bool progress = true);
  bool progress_settled(detail::stream_slot& s) noexcept;
  void note_progress(detail::stream_slot& s) noexcept;
  bool reclaim_up_to(detail::stream_slot& s, std::uint64_t seq);
  bool reclaim_done(detail::stream_slot& s);
  // Progress events (stream_slot): one recorded per 32 frees at most; while
  // one is in flight and older than that, one query per 8 frees (in the host
  // lag model, querying every 8th free keeps as little memory as querying
  // every free; every 32nd keeps 1-3 % more).
  static constexpr std::uint64_t progress_every = 32;
  static constexpr std::uint64_t progress_query_every = 8;
  void record_stream(void* ptr, stream_t stream);

  // ---- step plans (step_plan.cpp) ----------------------------------------
  // plan_steps: one step's large requests recorded, laid out at fixed
  // offsets, and later steps' requests placed there (see pool_options).
  struct step_plan {
    enum class phase : std::uint8_t { off, warming, recording, following, planned };
    // plan_build: a plan made; none yet (plan_needs_moves: the steps have
    // moved too few pages for it); none (too many requests, steps that do
    // not repeat, no room).
    enum class build : std::uint8_t { made, skipped, failed };
    // Steps with more large requests get no plan (laying one out takes time
    // that grows with the square of their number when they all live at once,
    // as a training step's activations do: on a 2-core VM 35 ms for 4,096,
    // 0.16 s for 8,192, 0.7 s for 16,384; twice that when a second order is
    // tried). A layout over two steps has two places a block: half as many.
    static constexpr std::size_t max_items = 8192;
    phase ph = phase::off;
    std::uint64_t tick = 0;    // large requests and frees since the recorded step began
    std::uint64_t length = 0;  // ticks of the recorded step
    std::size_t rest = 0;      // marks to wait, after a dropped plan, before recording again
    std::uint32_t marks = 0;   // marks so far, counted up to 2 (chunks are made until the second)
    std::uint32_t planned_marks = 0;  // marks since the plan in force was made
    // plan_needs_moves: page_moves() when the first recording began; the
    // share of the pages the last layout's first step would map that the
    // steps must have moved for a plan (0: not yet laid out).
    std::size_t moves_base = 0, buy_at = 0;
    // plan_needs_moves: the plan is made once the steps have moved a
    // sixteenth of the pages its first step would map (host model of the
    // shared GPT-2 trace as 20-60 training steps with the GPU 3,000
    // operations behind: 462 ms of modelled driver time against 381 for the
    // plan made at once, 397-622 when the moves had to reach the whole
    // price, whose plan came later and dearer; docs/BENCHMARKS.md 1q).
    static constexpr std::size_t plan_rent_share = 16;
    bool chunks_to_give_back = false;  // the second mark's give-back could not wait for the GPU
    // split_chunks stopped with chunks left (no room for a chunk's pages, a
    // failing call): tried again this many marks later (4, 8, 16), then no more.
    std::uint32_t split_retry_in = 0, split_retries = 0;
    struct item {
      std::size_t size = 0;
      std::uint64_t t0 = 0, t1 = 0;  // requested, freed (0: not yet; past length: in the next step)
      std::size_t off = 0;           // planned offset from base
      std::size_t off_odd = 0;       // planned offset in odd steps (two_steps)
      bool planned = false;
      bool pending = false;   // freed while another stream still used it
      block* hint[2] = {nullptr, nullptr};  // the block last placed at off / off_odd (checked before use: it may be gone)
    };
    std::vector<item> items;
    std::unordered_map<std::uintptr_t, std::uint32_t> open;             // recorded blocks not yet freed
    std::unordered_map<std::size_t, std::vector<std::uint32_t>> by_size;  // recorded items of a size, in request order
    std::unordered_map<std::size_t, std::uint32_t> seen;                // this step's requests of each size
    std::uintptr_t base = 0;
    block* cursor = nullptr;  // the block last placed by the plan
    bool two_steps = false;   // laid out over two steps (a block is carried): odd steps take off_odd
    bool odd = false;         // this planned step is odd
    std::size_t step_bytes = 0, missed_bytes = 0;
    // Steps found in the requests, for programs that do not mark them
    // (step_finder.cpp): the sizes of the last large requests, a period found
    // in them, and where the next step begins.
    static constexpr std::size_t history_cap = std::size_t{1} << 16;
    static constexpr std::uint64_t first_search = 8192, search_every = 4096;
    bool marked = false;               // the program marks its steps: nothing is looked for
    std::vector<std::uint64_t> history;  // a ring of the last history_cap large requests' sizes
    std::vector<std::uint64_t> history_live;  // ... and the large arenas' live bytes as each came
    std::uint64_t requests = 0;        // large requests so far
    std::uint64_t next_search = first_search;
    std::uint32_t searches_failed = 0;
    std::uint64_t period = 0;          // 0: none found (yet)
    std::uint64_t next_mark = 0;       // the large request the next found step begins at
    std::size_t drops_at_find = 0;     // plans_dropped when the period was found
    std::size_t unplanned = 0;         // recorded steps that gave no plan (step_plan.cpp)
    std::size_t unplanned_at_find = 0;  // ... when the period was found
  };
  step_plan plan;
  void mark_step();
  void mark_step_from_program();
  void plan_find_steps(std::size_t size) noexcept;
  bool plan_search(std::uint64_t& period, std::uint64_t& first) const;
  void plan_record_start();
  bool plan_give_back_chunks() noexcept;
  step_plan::build plan_build();
  bool plan_repeats() const;
  std::size_t page_moves() const noexcept { return ctr.pages_remapped + ctr.pages_unmapped; }
  void plan_note_alloc(std::uintptr_t addr, std::size_t size) noexcept;
  void plan_note_free(std::uintptr_t addr, bool pending) noexcept;
  block* plan_place(std::size_t size, std::uint32_t slot);

  // ---- release (release.cpp) ---------------------------------------------
  void destroy_spares();
  void trim_to(std::size_t target, bool on_free = false);
  void release_cached();
  bool grow_segment(std::size_t size, bool small, stream_t stream);
  std::size_t release_free_segments();

  // ---- diagnostics (diagnostics.cpp) -------------------------------------
  [[noreturn]] void throw_oom(std::size_t bytes, const char* why);
  memory_state state() const;
  void check() const;
  std::vector<segment_info> segments() const;
  page_usage usage() const;

  // ---- page arithmetic (inline: every placement uses it) -----------------
  std::size_t first_page(const block* b) const { return (b->addr - b->ar->base) / page; }
  std::size_t last_page(const block* b) const { return (b->addr + b->size - 1 - b->ar->base) / page; }
  // Pages lying wholly inside [addr, addr+size).
  std::size_t interior_pages(const block* b) const { return detail::interior_pages(b, page); }
  std::size_t unmapped_inside(const detail::arena* a, std::uintptr_t addr, std::size_t size) const {
    return detail::unmapped_inside(a, page, addr, size);
  }
  // Free blocks the requester of `slot` may take together with its own: its
  // stream's and the shared slot's (adjacent free blocks of one slot are
  // always merged, so a run alternates between the two).
  static bool runs_with(const block* x, std::uint32_t slot) {
    return x && x->state == block::free_state && (x->slot == slot || x->slot == 0);
  }

  // ---- a placed block becomes live (inline: the hot path) ----------------
  void* finish(block* b, std::size_t bytes, stream_t stream) {
    b->state = block::live_state;
    b->requested = bytes;
    b->stream = stream;
    live.insert(b->addr, b);
    live_bytes += b->size;
    if (!b->ar->small) live_large += b->size;
    if (live_bytes > peak_live) peak_live = live_bytes;
    return reinterpret_cast<void*>(b->addr);
  }
};

}  // namespace vramkit
