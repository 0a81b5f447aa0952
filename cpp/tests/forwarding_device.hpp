// A page device that passes every call to another one. Tests derive from it
// and override the calls they count, record or make fail. map_replaces() and
// attach_thread() keep page_device's defaults unless a test overrides them.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "vramkit/error.hpp"
#include "vramkit/platform/page_device.hpp"

namespace vramkit::test {

class forwarding_device : public page_device {
 public:
  explicit forwarding_device(std::shared_ptr<page_device> inner) : in_(std::move(inner)) {}
  std::size_t granularity() const noexcept override { return in_->granularity(); }
  std::size_t capacity() const noexcept override { return in_->capacity(); }
  std::size_t created_bytes() const noexcept override { return in_->created_bytes(); }
  std::uintptr_t reserve(std::size_t b) override { return in_->reserve(b); }
  void unreserve(std::uintptr_t va, std::size_t b) noexcept override { in_->unreserve(va, b); }
  page_handle create() override { return in_->create(); }
  void destroy(page_handle h) noexcept override { in_->destroy(h); }
  void map(std::uintptr_t va, const page_handle* h, std::size_t n) override { in_->map(va, h, n); }
  void unmap(std::uintptr_t va, std::size_t n) noexcept override { in_->unmap(va, n); }
  page_handle create_chunk(std::size_t n) override { return in_->create_chunk(n); }
  void map_chunk(std::uintptr_t va, page_handle h, std::size_t n) override { in_->map_chunk(va, h, n); }
  void synchronize() override { in_->synchronize(); }
  bool copies() const noexcept override { return in_->copies(); }
  void copy(std::uintptr_t dst, std::uintptr_t src, std::size_t n) override { in_->copy(dst, src, n); }
  int device() const noexcept override { return 0; }
  device_properties properties() const override { return in_->properties(); }
  page_call_times call_times() const noexcept override { return in_->call_times(); }

 protected:
  std::shared_ptr<page_device> in_;
};

// Fails, when armed, the k-th create() (as a device with no room: 0), copy()
// or map() (throwing cuda_error) counted from the last reset of the counts.
class failing_device : public forwarding_device {
 public:
  using forwarding_device::forwarding_device;
  page_handle create() override {
    if (fail_create_at && ++creates == fail_create_at) return 0;
    return in_->create();
  }
  void copy(std::uintptr_t dst, std::uintptr_t src, std::size_t n) override {
    if (fail_copy_at && ++copies_ == fail_copy_at) throw cuda_error("injected copy failure", 1);
    in_->copy(dst, src, n);
  }
  void map(std::uintptr_t va, const page_handle* h, std::size_t n) override {
    maybe_fail_map();
    in_->map(va, h, n);
  }
  void reset_counts() { creates = copies_ = maps = 0; }
  void disarm() { fail_create_at = fail_copy_at = fail_map_at = 0; }
  int fail_create_at = 0, fail_copy_at = 0, fail_map_at = 0, creates = 0, copies_ = 0, maps = 0;

 protected:
  void maybe_fail_map() {
    if (fail_map_at && ++maps == fail_map_at) throw cuda_error("injected map failure", 1);
  }
};

}  // namespace vramkit::test
