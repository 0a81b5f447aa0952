// Debug adaptor: red zones around every allocation and a quarantine of freed,
// poisoned blocks, to catch buffer overruns and writes after free.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "vramkit/mr/tracking_adaptor.hpp"
#include "vramkit/resource.hpp"

namespace vramkit {

struct guard_violation {
  enum kind : std::uint8_t { before = 0, after = 1, use_after_free = 2 };
  kind where = after;
  std::uintptr_t ptr = 0;   // the user pointer of the block
  std::size_t size = 0;     // its requested size
  std::size_t offset = 0;   // first damaged byte, relative to ptr (may be "negative" for before: size_t wrap)
  std::uint32_t site = 0;
  std::string describe() const;
};

class guard_adaptor final : public device_resource {
 public:
  static constexpr unsigned char guard_byte = 0xFD;
  static constexpr unsigned char poison_byte = 0xDD;

  // redzone: bytes on each side, a multiple of 256 (keeps the user pointer's alignment).
  guard_adaptor(std::shared_ptr<device_resource> upstream, std::size_t redzone = 256, std::size_t quarantine = 64,
                site_hook hook = nullptr);
  ~guard_adaptor() override;

  free_status try_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept override;
  void release_cached() override;
  memory_state state() const override { return upstream_->state(); }
  void reset_peaks() override { upstream_->reset_peaks(); }
  int device() const noexcept override { return upstream_->device(); }
  std::string name() const override { return "guard(" + upstream_->name() + ")"; }
  bool backs_memory() const noexcept override { return upstream_->backs_memory(); }
  std::size_t allocation_size(const void* p) const noexcept override;

  // Checks every live block's red zones and every quarantined block's poison;
  // returns those found now plus those found at frees since the last call.
  std::vector<guard_violation> check_guards();
  std::size_t redzone() const noexcept { return redzone_; }

 protected:
  void* do_allocate(std::size_t bytes, stream_t stream) override;

 private:
  struct block {
    std::size_t size;
    std::size_t span;  // user bytes rounded up to 256
    stream_t stream;
    std::uint32_t site;
  };
  void fill(std::uintptr_t at, unsigned char v, std::size_t n);
  // First offset in [at, at+n) not equal to v, or n.
  std::size_t scan(std::uintptr_t at, unsigned char v, std::size_t n);
  void check_live(std::uintptr_t p, const block& b);
  void check_freed(std::uintptr_t p, const block& b);
  void drop(std::uintptr_t p, const block& b) noexcept;

  std::shared_ptr<device_resource> upstream_;
  std::size_t redzone_, quarantine_cap_;
  site_hook hook_;
  bool device_memory_;
  std::mutex mu_;
  std::unordered_map<std::uintptr_t, block> live_;
  std::deque<std::pair<std::uintptr_t, block>> quarantine_;
  std::vector<guard_violation> found_;
};

}  // namespace vramkit
