// The caching pool. Over a page device (host or vmm) it places blocks in a
// large virtual range and backs them with physical pages on demand; free
// pages are remapped where memory is needed instead of growing. Over any
// other resource it carves blocks out of segments it takes from it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "vramkit/platform/page_device.hpp"
#include "vramkit/platform/stream_ops.hpp"
#include "vramkit/pool_options.hpp"
#include "vramkit/resource.hpp"

namespace vramkit {

// Counters of what the pool asked of its upstream.
struct pool_counters {
  std::size_t pages_created = 0;
  std::size_t pages_destroyed = 0;
  std::size_t pages_mapped = 0;
  std::size_t pages_unmapped = 0;
  std::size_t pages_remapped = 0;  // free pages moved to where they were needed
  std::size_t mappings_reused = 0; // keep_mappings: pages moved back to an address still mapping them (no call)
  std::size_t map_calls = 0;
  std::size_t segments_allocated = 0;
  std::size_t segments_freed = 0;
  std::size_t stream_reclaims = 0;  // free blocks handed from one stream to all
  std::size_t pages_made_ahead = 0; // map_ahead: pages the helper thread created and mapped
  std::size_t pages_ahead_used = 0; // map_ahead: of those, pages a block found ready where it was placed
  std::size_t chunks_created = 0;   // chunk_size: chunks made (their pages count in pages_created/mapped)
  std::size_t chunks_released = 0;  // chunk_size: chunks given back (their pages count in pages_destroyed/unmapped)
  std::size_t growth_chunks = 0;    // growth_chunks: chunks made reaching past their block (in chunks_created)
  std::size_t chunk_pages_created = 0;   // chunk_size: pages of the chunks made (chunk_min_size: of any size)
  std::size_t chunk_pages_released = 0;  // chunk_size: pages of the chunks given back
  std::size_t chunks_split = 0;     // split_chunks: chunks split into single pages (in chunks_released; their
                                    // new pages and the scratch pages their bytes passed through count in
                                    // pages_created and pages_mapped)
  std::size_t pages_taken_early = 0; // remap_own: pages moved from the requester's own free blocks before its
                                     // stream's work was known done (in pages_remapped)
  std::size_t early_waits = 0;       // remap_own: waits for the GPU before an old address of such a page was unmapped
  std::size_t pages_past_slack = 0;  // pages created past the slack in force (growth_slack or remap_own_slack;
                                     // none while a step plan's pages move): no whole free page was left to move,
                                     // what was free lying in pages live blocks share or under unfinished work
                                     // (in pages_created)
  std::size_t plans_made = 0;        // plan_steps: step plans laid out
  std::size_t plans_dropped = 0;     // plan_steps: plans given up (a step missed more than 5 % of its bytes)
  std::size_t plans_skipped = 0;     // plan_needs_moves: plans not made: the steps had moved too few pages for one
  std::size_t plan_placed = 0;       // plan_steps: large requests placed at their planned address
  std::size_t plan_missed = 0;       // plan_steps: large requests under a plan placed as usual instead
  std::size_t plan_bytes = 0;        // plan_steps: address space of the plan in force (0: none)
  std::size_t steps_found = 0;       // plan_steps without marks from the program: periods found in the requests
  std::size_t step_period = 0;       // ... the one the pool marks steps by now, in large requests (0: none)
  // Wall time inside the page device's calls (its page_call_times) since the
  // pool began, ns, on every thread (map_ahead's helper too): creating pages
  // and chunks, mapping (with access rights), unmapping, destroying. Zeros
  // over a non-paged upstream. (Another pool on the same device adds its own.)
  std::uint64_t page_create_ns = 0, page_map_ns = 0, page_unmap_ns = 0, page_destroy_ns = 0;
  // Wall time the pool's calls waited for the GPU since it began, ns: for an
  // event before memory freed on one stream served another, for a stream's
  // queued work before its own free pages moved, for the whole device before
  // chunks were split and for the split's copies (split_chunks).
  std::uint64_t gpu_wait_ns = 0;
};

struct block_info {
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  std::size_t requested = 0;  // 0 for free blocks
  bool allocated = false;
  bool pending = false;  // freed, waiting for other streams
  stream_t stream = 0;
};

struct segment_info {
  std::uintptr_t base = 0;
  std::size_t size = 0;         // bytes of address space described
  std::size_t mapped_bytes = 0; // physical bytes behind it
  bool small = false;
  stream_t stream = 0;
  std::vector<block_info> blocks;
};

class pool_resource final : public device_resource {
 public:
  pool_resource(std::shared_ptr<page_device> pages, std::shared_ptr<stream_ops> streams,
                pool_options options = {});
  pool_resource(std::shared_ptr<device_resource> upstream, std::shared_ptr<stream_ops> streams,
                pool_options options = {});
  ~pool_resource() override;
  pool_resource(const pool_resource&) = delete;
  pool_resource& operator=(const pool_resource&) = delete;

  free_status try_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept override;
  void record_stream(void* ptr, stream_t stream) override;
  void release_cached() override;
  memory_state state() const override;
  void reset_peaks() override;
  int device() const noexcept override;
  std::string name() const override;
  bool backs_memory() const noexcept override;
  std::size_t allocation_size(const void* ptr) const noexcept override;

  pool_counters counters() const;
  const pool_options& options() const noexcept;
  bool paged() const noexcept;
  std::size_t page_size() const noexcept;
  // 0 lifts the limit (back to the device capacity).
  void set_reserve_limit(std::size_t bytes);
  // Every segment with its blocks, in address order (a report, not a hot path).
  std::vector<segment_info> segments() const;
  // Throws vramkit::error naming the first broken invariant (tests call it).
  void check_invariants() const;
  // A step of the program begins (plan_steps; nothing otherwise). The first
  // call begins a step that is not recorded (warming up), the second starts
  // recording one, the third ends the recording (the recorded blocks' frees
  // are still followed, and this step's requests compared with them), the
  // fourth lays the plan out when the two steps matched; later calls judge
  // the step that ended and keep the plan or drop it.
  void mark_step();
  // Pages by use, per arena ([0] large, [1] small): for diagnosing fragmentation.
  struct page_usage {
    std::size_t mapped[2] = {0, 0};
    std::size_t live_overlap[2] = {0, 0};
    std::size_t free_interior_mapped[2] = {0, 0};
    std::size_t spare = 0;
    std::size_t ahead = 0;  // map_ahead: pages made ahead, and the batch being made
    std::size_t in_chunks = 0;  // chunk_size: mapped pages that belong to chunks
    // chunk_size: pages of chunks that a live (or pending) block partly
    // holds, in no such block themselves (reusable where they are; they cannot move)
    std::size_t chunk_free_held = 0;
  };
  page_usage usage() const;

 protected:
  void* do_allocate(std::size_t bytes, stream_t stream) override;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace vramkit
