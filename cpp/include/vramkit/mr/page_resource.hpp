// Plain allocation straight from a page device, as cudaMalloc does for large
// requests: every allocation gets its own address range and fresh pages,
// rounded up to whole pages, and gives them back when freed. The `host`
// and `vmm` upstreams are this resource over their page devices.
#pragma once
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "vramkit/platform/page_device.hpp"
#include "vramkit/resource.hpp"

namespace vramkit {

class page_resource final : public device_resource {
 public:
  explicit page_resource(std::shared_ptr<page_device> pages);
  ~page_resource() override;
  free_status try_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept override;
  memory_state state() const override;
  void reset_peaks() override;
  int device() const noexcept override { return pages_->device(); }
  std::string name() const override { return pages_->name(); }
  std::size_t allocation_size(const void* ptr) const noexcept override;
  const std::shared_ptr<page_device>& pages() const noexcept { return pages_; }

 protected:
  void* do_allocate(std::size_t bytes, stream_t stream) override;

 private:
  struct allocation {
    std::size_t requested;
    std::vector<page_handle> handles;
  };
  std::shared_ptr<page_device> pages_;
  mutable std::mutex mu_;
  std::unordered_map<std::uintptr_t, allocation> live_;
  std::size_t live_bytes_ = 0, reserved_ = 0, peak_live_ = 0, peak_reserved_ = 0;
  std::size_t allocs_ = 0, frees_ = 0, ooms_ = 0;
};

}  // namespace vramkit
