#include "vramkit/mr/guard_adaptor.hpp"

#include <cstring>

#include "vramkit/platform/cuda.hpp"
#include "vramkit/runtime.hpp"

namespace vramkit {

namespace {
constexpr std::size_t k_align = 256;
std::size_t round_up(std::size_t n) { return (n + k_align - 1) / k_align * k_align; }
}  // namespace

std::string guard_violation::describe() const {
  std::string w = where == before ? "before the start (red zone underrun)"
                  : where == after ? "after the end (red zone overrun)"
                                   : "after free (use after free)";
  std::string at = where == before ? "-" + std::to_string(static_cast<std::size_t>(0) - offset)
                                   : "+" + std::to_string(offset);
  return "memory written " + w + " of block 0x" + [&] {
    static const char* hx = "0123456789abcdef";
    std::string s;
    for (int i = (int)sizeof(ptr) * 2 - 1; i >= 0; --i) s += hx[(ptr >> (4 * i)) & 0xF];
    auto nz = s.find_first_not_of('0');
    return nz == std::string::npos ? std::string("0") : s.substr(nz);
  }() + " (" + format_bytes(size) + "), first damaged byte at ptr" + at + ", site " + std::to_string(site);
}

guard_adaptor::guard_adaptor(std::shared_ptr<device_resource> upstream, std::size_t redzone, std::size_t quarantine,
                             site_hook hook)
    : upstream_(std::move(upstream)), redzone_(redzone), quarantine_cap_(quarantine), hook_(hook) {
  if (!upstream_) throw invalid_argument("guard_adaptor: no upstream resource given");
  if (!upstream_->backs_memory())
    throw invalid_argument("guard_adaptor: " + upstream_->name() +
                           " emulates an allocator for replays; its addresses hold no memory to guard");
  if (redzone_ == 0 || redzone_ % k_align)
    throw invalid_argument("guard_adaptor: redzone must be a positive multiple of 256 bytes (got " +
                           std::to_string(redzone) + ")");
  device_memory_ = current_backend() == backend::cuda;
}

guard_adaptor::~guard_adaptor() {
  for (auto& q : quarantine_) upstream_->deallocate(reinterpret_cast<void*>(q.first - redzone_), 0, q.second.stream);
}

void guard_adaptor::fill(std::uintptr_t at, unsigned char v, std::size_t n) {
  if (!n) return;
  if (!device_memory_) {
    std::memset(reinterpret_cast<void*>(at), v, n);
    return;
  }
  std::vector<unsigned char> buf(n, v);
  cuda::copy_to_device(reinterpret_cast<void*>(at), buf.data(), n);
}

std::size_t guard_adaptor::scan(std::uintptr_t at, unsigned char v, std::size_t n) {
  const unsigned char* p = reinterpret_cast<const unsigned char*>(at);
  std::vector<unsigned char> buf;
  if (device_memory_) {
    buf.resize(n);
    cuda::copy_to_host(buf.data(), reinterpret_cast<const void*>(at), n);
    p = buf.data();
  }
  for (std::size_t i = 0; i < n; ++i)
    if (p[i] != v) return i;
  return n;
}

void* guard_adaptor::do_allocate(std::size_t bytes, stream_t stream) {
  if (bytes == 0) return nullptr;
  std::uint32_t site = hook_ ? hook_() : 0;
  std::size_t span = round_up(bytes);
  auto base = reinterpret_cast<std::uintptr_t>(upstream_->allocate(span + 2 * redzone_, stream));
  std::uintptr_t p = base + redzone_;
  try {
    fill(base, guard_byte, redzone_);
    fill(p + bytes, guard_byte, span - bytes + redzone_);
    std::lock_guard<std::mutex> lk(mu_);
    live_[p] = {bytes, span, stream, site};
  } catch (...) {  // the guard bytes could not be written: the memory goes back
    upstream_->deallocate(reinterpret_cast<void*>(base), 0, stream);
    throw;
  }
  return reinterpret_cast<void*>(p);
}

void guard_adaptor::check_live(std::uintptr_t p, const block& b) {
  std::size_t i = scan(p - redzone_, guard_byte, redzone_);
  if (i < redzone_) found_.push_back({guard_violation::before, p, b.size, static_cast<std::size_t>(0) - (redzone_ - i), b.site});
  std::size_t tail = b.span - b.size + redzone_;
  std::size_t j = scan(p + b.size, guard_byte, tail);
  if (j < tail) found_.push_back({guard_violation::after, p, b.size, b.size + j, b.site});
  // Re-arm, so that one overrun is reported once.
  if (i < redzone_) fill(p - redzone_, guard_byte, redzone_);
  if (j < tail) fill(p + b.size, guard_byte, tail);
}

void guard_adaptor::check_freed(std::uintptr_t p, const block& b) {
  std::size_t n = b.span + 2 * redzone_;
  std::size_t i = scan(p - redzone_, poison_byte, n);
  if (i < n) {
    std::size_t off = i - redzone_;  // wraps for bytes before p, like check_live
    found_.push_back({guard_violation::use_after_free, p, b.size, off, b.site});
    fill(p - redzone_, poison_byte, n);
  }
}

// Checks a block leaving the quarantine and gives it back upstream; a check
// that cannot be made (a device copy failed) does not keep the memory.
void guard_adaptor::drop(std::uintptr_t p, const block& b) noexcept {
  try {
    check_freed(p, b);
  } catch (...) {
  }
  upstream_->deallocate(reinterpret_cast<void*>(p - redzone_), 0, b.stream);
}

free_status guard_adaptor::try_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept {
  if (!ptr) return free_status::ok;
  (void)bytes;
  auto p = reinterpret_cast<std::uintptr_t>(ptr);
  try {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = live_.find(p);
    if (it == live_.end()) return free_status::not_owned;
    block b = it->second;
    live_.erase(it);
    b.stream = stream;
    try {
      check_live(p, b);
      fill(p - redzone_, poison_byte, b.span + 2 * redzone_);
      quarantine_.emplace_back(p, b);
    } catch (...) {
      // Not checked or not poisoned (a device copy failed): no quarantine,
      // the memory goes back upstream at once.
      upstream_->deallocate(reinterpret_cast<void*>(p - redzone_), 0, stream);
      return free_status::ok;
    }
    while (quarantine_.size() > quarantine_cap_) {
      auto q = quarantine_.front();
      quarantine_.pop_front();
      drop(q.first, q.second);
    }
  } catch (...) {
    return free_status::ok;  // a failed check must not turn a free into a throw
  }
  return free_status::ok;
}

void guard_adaptor::release_cached() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    while (!quarantine_.empty()) {
      auto q = quarantine_.front();
      quarantine_.pop_front();
      drop(q.first, q.second);
    }
  }
  upstream_->release_cached();
}

std::size_t guard_adaptor::allocation_size(const void* ptr) const noexcept {
  auto* self = const_cast<guard_adaptor*>(this);
  std::lock_guard<std::mutex> lk(self->mu_);
  auto it = live_.find(reinterpret_cast<std::uintptr_t>(ptr));
  return it == live_.end() ? 0 : it->second.size;
}

std::vector<guard_violation> guard_adaptor::check_guards() {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& kv : live_) check_live(kv.first, kv.second);
  for (auto& q : quarantine_) check_freed(q.first, q.second);
  std::vector<guard_violation> out;
  out.swap(found_);
  return out;
}

}  // namespace vramkit
