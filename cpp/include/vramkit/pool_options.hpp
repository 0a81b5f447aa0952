// Every tunable of the pool in one typed struct. Also parsed from the
// environment variable VRAMKIT_ALLOC_CONF ("key:value,key:value"); see
// docs/configuration.md for the keys.
#pragma once
#include <cstddef>
#include <limits>
#include <string>

namespace vramkit {

struct pool_options {
  // Every block starts at a multiple of this (a power of two, at least 256).
  std::size_t alignment = 256;
  // Page size for page-granular upstreams; 0 takes the device's granularity.
  std::size_t page_size = 0;
  // Requests up to this size are packed in their own pages, apart from large ones.
  std::size_t small_threshold = std::size_t{1} << 20;
  // Segment size asked of non-paged upstreams for small requests.
  std::size_t small_segment = std::size_t{2} << 20;
  // Large requests on non-paged upstreams are rounded up to this.
  std::size_t large_rounding = std::size_t{2} << 20;
  // Reserved bytes are capped here (0 = the device capacity).
  std::size_t reserve_limit = 0;
  // After a free, cached bytes above this are returned to the device.
  std::size_t release_threshold = std::numeric_limits<std::size_t>::max();
  // New physical pages are created only while reserved stays within
  // (1 + growth_slack) x live bytes; past that, free pages elsewhere in the
  // pool are remapped where they are needed instead.
  double growth_slack = 0.02;
  // Remap free pages (page-granular upstreams only). Off: the pool only grows.
  bool remap = true;
  // Before growing past the slack, wait for the requesting stream's queued
  // work so that pages it freed can be remapped (trades a short stall of the
  // host for less reserved memory when the GPU runs behind it).
  bool wait_to_remap = false;
  // A page moved away keeps its old mapping (an alias of memory the pool
  // no longer hands out at that address) until another page must go there
  // or the page is given back. When the page later returns to that address,
  // as it does in every step of a repeating workload, no map call is made.
  bool keep_mappings = true;
  // With keep_mappings: before growing past the slack, take pages from the
  // requesting stream's own free blocks at once, without waiting for its
  // queued work. Work queued later on that stream runs after the work that
  // used them, so their new owner is safe; their old addresses stay mapped
  // (kept mappings) until an event recorded when they were taken completes,
  // and the pool waits for that event only if it must unmap one sooner. When
  // the GPU runs behind the host, the pool then moves pages as it would with
  // the GPU in step, instead of growing. (Parsing keep_mappings:false without
  // naming remap_own turns it off.)
  bool remap_own = true;
  // With remap_own: before taking its own stream's frees early, the pool
  // grows while reserved stays within (1 + remap_own_slack) x the live peak
  // (no effect at or below growth_slack). A larger value moves fewer pages
  // when the GPU runs behind, for memory up to that bound. 0 makes GPT-2
  // training move ~600 pages a step. With plan_steps and no chunks (the
  // defaults), 0.03 held four workloads of the suite at 1.020-1.030 of
  // allocated on an H100, where 0.08 without plans and with chunks (the
  // earlier defaults) held 1.042-1.080 (docs/BENCHMARKS.md section 5,
  // "Chunks against the pair on MoE").
  double remap_own_slack = 0.03;
  // While the pool grows, a helper thread keeps new pages created and mapped
  // just past the large arena's highest page in use, so that the next blocks find
  // their pages ready and the driver's calls run off the allocating thread:
  // a 32nd of the pool's pages (at least 4), at most map_ahead bytes (0: off).
  // They count as reserved; a request elsewhere takes them before stealing.
  std::size_t map_ahead = 0;
  // Bulk growth in chunks: where the large arena grows under one block, the
  // pool creates physical memory in handles of chunk_size bytes (a multiple
  // of the page size, at least two pages), each mapped whole at a
  // chunk-aligned place, with single pages for the rest. Fewer, larger
  // handles cost fewer driver calls, and kernels streaming over them run
  // faster. A chunk never moves: when the pool must move memory, it gives a
  // chunk lying wholly in free memory back and makes pages instead. On an
  // H100, 16 MiB chunks made GPT-2's first step 1.13-1.20x PyTorch
  // default's against 1.65x with single pages, but chunks left in the arena
  // made MoE training (sizes that change with the routing) move up to 1,000
  // pages in a step from step 15 or 19 on, where single pages move none after
  // step 8 (docs/BENCHMARKS.md section 5, "Chunks against the pair on
  // MoE"; that was before split_chunks). 0 (the default), or at most one
  // page: single pages only; 64MiB with chunk_min_size 4MiB (and
  // split_chunks) for a process whose first step matters.
  std::size_t chunk_size = 0;
  // With chunks: the smallest chunk (bytes, 0: chunk_size, chunks of one
  // size). Where a whole chunk_size does not fit inside a block, the pool
  // makes chunks of half, a quarter, ... of it down to chunk_min_size, each
  // at a multiple of its own size, so a block's interior takes a few handles
  // instead of a run of single pages: the driver charges per handle, not per
  // byte. chunk_size must be chunk_min_size times a power of two.
  std::size_t chunk_min_size = 0;
  // With chunks: where a block's first or last pages lie in an empty
  // chunk-aligned place that reaches past it only into the free blocks next
  // to it, that whole chunk is made (the rest of it stays free, mapped), so
  // that growth comes in chunks rather than in single pages for the blocks
  // smaller than a chunk.
  bool growth_chunks = false;
  // With chunks and plan_steps: at the second mark, once the chunks lying
  // wholly in free memory have gone back, the chunks left under live blocks
  // are split into single pages, so that no chunk stays in the pool past the
  // first steps (a chunk cannot move: one left under a long-lived block pins
  // its free part, and the memory around it). The pool waits for all of the
  // device's work, maps one chunk's worth of scratch pages at a spare
  // address, and for each chunk creates its pages, copies its bytes to the
  // scratch pages, unmaps it, maps the new pages in its place and copies the
  // bytes back before the chunk goes: the scratch pages and one chunk's new
  // pages are held beside the pool meanwhile. A chunk whose pages cannot be
  // had or mapped stays as it is, with its bytes (a split that stopped is
  // tried again 4, 8 and 16 marks later). Needs a page device that
  // copies (vmm and host do). Nothing else may use the chunks' memory at
  // those marks (docs/configuration.md).
  bool split_chunks = true;
  // Step plans (paged pools): where a program repeats the same steps (a
  // training loop) and says where each begins (pool_resource::mark_step), the
  // pool records one step's large requests and when each was freed, lays them
  // out once at fixed offsets past every live block (largest first, each at
  // the lowest offset free for its lifetime, the step taken as a circle so
  // that blocks living into the next step fit too), and from then on places
  // each large request at its planned address: the n-th request of a size in
  // a step takes the place of the n-th of that size in the recorded step.
  // Pages stay where they are from step to step, so no page moves once the
  // plan's pages are mapped. A request the plan does not know, or whose place
  // is taken, is placed as usual; a step where more than 5 % of the bytes
  // missed their places drops the plan, and after some steps of rest (4, then
  // 8, 16, ... 256 after later drops) the pool records a new one.
  // With chunks (chunk_size), only until the second mark (the end of the
  // first marked step): there the pool waits for the GPU and gives back the
  // chunks lying wholly in free memory (a chunk cannot move, and would pin
  // the steps' memory where the plan does not want it). On by default with
  // remap_own_slack 0.03 and no chunks: on an H100, four of the suite's
  // workloads held 1.020-1.030 of peak allocated and repeated their peak
  // reserved within 1 % (docs/BENCHMARKS.md section 5, "Chunks against the
  // pair on MoE"). A program that never marks is the pool without it until
  // the pool finds its steps itself.
  bool plan_steps = true;
  // With plan_steps: whether the steps that move a new plan's pages to its
  // places (its first step; the second too in a two-step plan) may grow the
  // pool within growth_slack and remap_own_slack, as other steps do. Off (the
  // default): they take free pages first and grow only when none can be had,
  // because the steps before the plan already held their live peak in what
  // the pool has, and what a plan's step grows stays for good (host model of
  // a ResNet-50 training run recorded on an H100: 1.011 of peak live against
  // 1.020-1.030 with the GPU 0-3,000 operations behind).
  bool plan_moves_grow = false;
  // With plan_steps: a plan only once the steps have paid for it. A plan's
  // first step maps the step's pages at the plan's places; where the steps
  // before it already move none (the pool's own placement has settled), the
  // plan costs that step and saves nothing. On: the plan is laid out as
  // usual, but made only when the pages the steps moved since recording
  // began (pages_remapped + pages_unmapped) reach a sixteenth of the pages
  // its first step would map; until then the steps are recorded again and
  // looked at every other mark (plans_skipped), laid out anew once the moves
  // reach the last price. Steps that move no page then never pay for a plan;
  // steps that keep moving pages pay a sixteenth more than with the plan made
  // at once, and a plan that comes later may cost more (docs/BENCHMARKS.md
  // 1q). On by default since the suite on an H200 (section 5): ResNet-50's
  // settled steps made no plan and spent 6 ms in page calls over steps 2-30
  // against 124-147; GPT-2's plan came at the same step.
  bool plan_needs_moves = true;
  // fit:address (true) or fit:best (false, the default): which backed free
  // block a large request (over small_threshold) takes when several fit. Best
  // takes the tightest; address takes an exact fit, else the lowest-addressed
  // block that fits, cutting small requests from large free blocks at the low
  // end. Live blocks then stay packed low in the arena, and on dynamic shapes
  // (sizes that change from request to request) fewer free gaps lie between
  // them at the peak, each leaving part of a page unused (docs/BENCHMARKS.md
  // section 1j). Only below the peak: a request that takes live bytes to
  // within a 16th of the peak live so far (the pool growing, or at its peak)
  // takes the tightest fit, which packs a first pass best.
  bool fit_address = false;
  // Virtual address space reserved per arena, as a multiple of the capacity.
  double va_factor = 2.0;

  // Throws vramkit::invalid_argument with the offending key and value.
  void validate() const;
  // Applies "key:value,key:value" on top of *this.
  void parse(const std::string& conf);
  static pool_options from_env();  // defaults, then VRAMKIT_ALLOC_CONF
  std::string to_string() const;
};

// "1.5GiB", "256MB", "4096", "2M" -> bytes. Throws invalid_argument.
std::size_t parse_size(const std::string& text);

}  // namespace vramkit
