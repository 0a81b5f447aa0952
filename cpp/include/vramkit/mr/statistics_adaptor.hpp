// Counts what passes through a resource: current, peak and total bytes and
// counts, with the upstream's reserved and cached bytes alongside.
#pragma once
#include <atomic>
#include <memory>

#include "vramkit/resource.hpp"

namespace vramkit {

// One statistic as torch.cuda.memory_stats() reports it.
struct stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;  // total ever added
  std::int64_t freed = 0;      // total ever removed
};

struct statistics {
  stat allocated_bytes;   // requested bytes of live allocations
  stat allocation_count;  // live allocations
  stat reserved_bytes;    // from the upstream (peak from the upstream's own peak)
  stat active_bytes;      // allocated + freed-but-pending on other streams
  stat cached_bytes;      // reserved - live
  std::size_t num_alloc_calls = 0;
  std::size_t num_free_calls = 0;
  std::size_t num_ooms = 0;
  std::size_t num_bad_frees = 0;
  std::size_t num_upstream_allocs = 0;
  std::size_t num_upstream_frees = 0;
  std::size_t num_alloc_retries = 0;
  std::size_t largest_free_bytes = 0;
  std::size_t capacity_bytes = 0;
  double fragmentation = 0;       // reserved / live bytes now (0 when nothing is live)
  double peak_fragmentation = 0;  // peak reserved / peak allocated
};

class statistics_adaptor final : public device_resource {
 public:
  explicit statistics_adaptor(std::shared_ptr<device_resource> upstream);

  free_status try_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept override;
  void record_stream(void* ptr, stream_t stream) override { upstream_->record_stream(ptr, stream); }
  void release_cached() override { upstream_->release_cached(); }
  memory_state state() const override { return upstream_->state(); }
  void reset_peaks() override;
  int device() const noexcept override { return upstream_->device(); }
  std::string name() const override { return "statistics(" + upstream_->name() + ")"; }
  bool backs_memory() const noexcept override { return upstream_->backs_memory(); }
  std::size_t allocation_size(const void* p) const noexcept override { return upstream_->allocation_size(p); }

  statistics stats() const;
  const std::shared_ptr<device_resource>& upstream() const noexcept { return upstream_; }

 protected:
  void* do_allocate(std::size_t bytes, stream_t stream) override;

 private:
  struct counter {
    std::atomic<std::int64_t> current{0}, peak{0}, allocated{0}, freed{0};
    void add(std::int64_t n) noexcept;
    void sub(std::int64_t n) noexcept;
    stat get() const noexcept { return {current.load(), peak.load(), allocated.load(), freed.load()}; }
  };
  std::shared_ptr<device_resource> upstream_;
  counter bytes_, count_;
  std::atomic<std::size_t> alloc_calls_{0}, free_calls_{0}, ooms_{0}, bad_frees_{0};
  std::atomic<std::size_t> reserved_total_{0}, reserved_freed_{0};
};

// Refuses allocations that would take the bytes allocated through it over a limit.
class limiting_adaptor final : public device_resource {
 public:
  limiting_adaptor(std::shared_ptr<device_resource> upstream, std::size_t limit_bytes);
  // A fraction (0, 1] of the device capacity the upstream reports.
  static std::shared_ptr<limiting_adaptor> from_fraction(std::shared_ptr<device_resource> upstream, double fraction);

  free_status try_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept override;
  void record_stream(void* ptr, stream_t stream) override { upstream_->record_stream(ptr, stream); }
  void release_cached() override { upstream_->release_cached(); }
  memory_state state() const override;
  void reset_peaks() override { upstream_->reset_peaks(); }
  int device() const noexcept override { return upstream_->device(); }
  std::string name() const override { return "limiting(" + upstream_->name() + ")"; }
  bool backs_memory() const noexcept override { return upstream_->backs_memory(); }
  std::size_t allocation_size(const void* p) const noexcept override { return upstream_->allocation_size(p); }
  std::size_t limit() const noexcept { return limit_; }
  std::size_t used() const noexcept { return used_.load(); }

 protected:
  void* do_allocate(std::size_t bytes, stream_t stream) override;

 private:
  std::shared_ptr<device_resource> upstream_;
  std::size_t limit_;
  std::atomic<std::size_t> used_{0};
};

}  // namespace vramkit
