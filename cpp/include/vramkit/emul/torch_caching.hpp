// An offline emulation of PyTorch's CUDA caching allocator (the "native"
// backend, as of PyTorch 2.11) over a simulated device: no memory is touched,
// addresses are made up, and what is tracked is what PyTorch would reserve.
// It answers "how much would this trace reserve under PyTorch, and with which
// PYTORCH_CUDA_ALLOC_CONF would it fit on a card of N bytes?".
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "vramkit/resource.hpp"

namespace vramkit::emul {

// The allocator settings PyTorch reads from PYTORCH_CUDA_ALLOC_CONF that change
// where memory goes, plus the two facts of the device the emulation needs.
struct torch_options {
  static constexpr std::size_t no_limit = static_cast<std::size_t>(-1);
  static constexpr std::size_t intervals = 16;  // power-of-two intervals 1 MiB .. 64 GiB

  bool expandable_segments = false;
  std::size_t max_split_size = no_limit;                 // bytes; no_limit = never refuse a split
  std::size_t max_non_split_rounding = 20u << 20;        // slack an oversize block may have
  double garbage_collection_threshold = 0;               // 0 = off; acts only with a fraction
  std::array<std::size_t, intervals> divisions{};        // roundup_power2_divisions per interval
  double memory_fraction = 0;                            // set_per_process_memory_fraction; 0 = not set
  std::size_t capacity = 0;                              // device memory the process may use; 0 = unlimited

  // Reads "key:value,key:value" (PyTorch's syntax; '=' is accepted for ':'
  // outside brackets). Throws invalid_argument naming the key for an unknown
  // key or a bad value, as PyTorch refuses them.
  static torch_options parse(const std::string& conf);
  // The PYTORCH_CUDA_ALLOC_CONF value that selects these settings ("" for the
  // defaults). The fraction and capacity are not part of it.
  std::string conf_line() const;
};

// One block of a segment as PyTorch's snapshot would show it.
struct torch_block_info {
  std::uintptr_t addr = 0;
  std::size_t size = 0;       // rounded size the block occupies
  std::size_t requested = 0;  // bytes the program asked for (0 when free)
  bool allocated = false;
};

struct torch_segment_info {
  std::uintptr_t addr = 0;
  std::size_t size = 0;  // mapped bytes (for expandable segments: one contiguous mapped range)
  stream_t stream = 0;
  bool small_pool = false;
  bool expandable = false;
  std::vector<torch_block_info> blocks;
};

// PyTorch's memory_stats() counters the validation compares.
struct torch_counters {
  std::size_t num_device_alloc = 0;  // cudaMalloc calls, or page-range maps (expandable)
  std::size_t num_device_free = 0;
  std::size_t segment_current = 0;   // cudaMalloc'd segments held (not counted for expandable)
  std::size_t segment_peak = 0;
  std::size_t num_alloc_retries = 0;
  std::size_t num_ooms = 0;
  std::size_t allocated_bytes = 0;   // rounded bytes handed out
  std::size_t given_addresses_used = 0;  // segments placed at an address from set_segment_addresses
};

class torch_caching_emulator final : public device_resource {
 public:
  torch_caching_emulator(torch_options o, std::string name);
  ~torch_caching_emulator() override;
  torch_caching_emulator(const torch_caching_emulator&) = delete;
  torch_caching_emulator& operator=(const torch_caching_emulator&) = delete;

  free_status try_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept override;
  // The trace format has no event timing: a recorded stream is accepted and
  // ignored (frees in traces are already placed where PyTorch completed them).
  void record_stream(void* ptr, stream_t stream) override;
  // torch.cuda.empty_cache(): frees every cached segment that holds no live block,
  // and unmaps the free pages of expandable segments.
  void release_cached() override;
  memory_state state() const override;
  void reset_peaks() override;
  int device() const noexcept override { return 0; }
  std::string name() const override { return name_; }
  bool backs_memory() const noexcept override { return false; }  // made-up segment addresses
  std::size_t allocation_size(const void* ptr) const noexcept override;

  const torch_options& options() const noexcept { return opt_; }
  torch_counters counters() const {
    std::lock_guard<std::mutex> lk(mu_);
    return ctr_;
  }
  // Unlocked reads for the thread that drives the replay (read after every op).
  std::size_t reserved_bytes() const noexcept { return total_reserved_; }
  std::size_t allocated_bytes() const noexcept { return ctr_.allocated_bytes; }
  // Every segment (mapped range) with its blocks, by address.
  std::vector<torch_segment_info> segments() const;

  // Where cudaMalloc puts segments is the driver's choice (it reuses freed
  // ranges, and a process's history moves it), and PyTorch breaks best-fit ties
  // between free blocks of equal stream and size by address, so the choice can
  // change which segment is split, which stays old enough to be collected, and
  // the peak. By default segments are placed at increasing addresses. Given the
  // addresses a real run's cudaMalloc calls returned, in order (its
  // segment_alloc events), segments are placed there instead, until the list
  // runs out or an address would overlap a segment still held (the two runs
  // went different ways), after which addresses count up again. Expandable
  // segments are not affected. Call before the first allocation.
  void set_segment_addresses(std::vector<std::uintptr_t> addresses);

  // The size policy, exposed for tests: PyTorch's round_size and get_allocation_size.
  std::size_t round_size(std::size_t bytes) const noexcept;
  static std::size_t allocation_size_for(std::size_t rounded) noexcept;

 protected:
  void* do_allocate(std::size_t bytes, stream_t stream) override;

 private:
  struct block;
  struct pool;
  struct segment_space;
  struct request;

  bool get_free_block(request& r);
  bool alloc_block(request& r, bool retry);
  bool release_available_cached_blocks(const request& r);
  void release_cached_blocks();
  void release_blocks(pool& p);
  void release_block(block* b);
  void garbage_collect();
  block* alloc_found_block(request& r, std::size_t orig, bool split);
  bool should_split(const block* b, std::size_t size) const noexcept;
  void free_block(block* b);
  std::size_t try_merge(block* dst, block* src, pool& p);
  // expandable segments
  block* find_expandable_block(stream_t s, pool& p, std::size_t size);
  bool map_block(block* b, std::size_t size);
  block* try_allocate_expandable(stream_t s, pool& p, std::size_t size);
  void unmap_block(block* b);
  void release_expandable_segment(block* b);

  std::uintptr_t segment_address(std::size_t size);
  block* new_block();
  void delete_block(block* b) noexcept;
  void add_reserved(std::size_t n) noexcept;

  // One lock for everything: an emulation is replayed by one thread, but nothing
  // stops two Python threads from sharing one, and the books must stay whole.
  mutable std::mutex mu_;
  torch_options opt_;
  std::string name_;
  std::unique_ptr<pool> large_, small_;
  std::unordered_map<std::uintptr_t, block*> live_;
  std::vector<std::unique_ptr<segment_space>> spaces_;
  std::vector<block*> free_list_;  // recycled block objects
  std::vector<std::unique_ptr<block[]>> arenas_;
  std::uintptr_t next_addr_ = std::uintptr_t{1} << 40;
  std::vector<std::uintptr_t> given_addrs_;           // set_segment_addresses, in order
  std::size_t given_next_ = 0;                        // the next one to use; past the end when off
  std::map<std::uintptr_t, std::size_t> held_segments_;  // cudaMalloc'd segments held: address -> size
  std::size_t total_reserved_ = 0;
  std::size_t allowed_max_ = 0;  // fraction * capacity when a fraction is set
  std::size_t peak_reserved_ = 0, peak_allocated_ = 0;
  std::size_t live_requested_ = 0;
  torch_counters ctr_;
};

// "torch-default", "torch-expandable", "torch:KEY:VALUE,..." (or KEY=VALUE),
// "torch-default:..." and "torch-expandable:..." (presets plus options).
// capacity (bytes, 0 = unlimited) is the device memory the process may use; a
// per_process_memory_fraction option limits it further as PyTorch does.
std::shared_ptr<torch_caching_emulator> make_torch_emulator(const std::string& spec, std::size_t capacity);

// True when spec names a PyTorch emulation (torch, torch-default, torch-expandable).
bool is_torch_spec(const std::string& spec) noexcept;

}  // namespace vramkit::emul
