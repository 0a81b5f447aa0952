#include <atomic>
#include <charconv>
#include <cstdio>
#include <string>

#include "vramkit/error.hpp"
#include "vramkit/resource.hpp"

namespace vramkit {

std::string format_bytes(std::size_t bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  if (u == 0) return std::to_string(bytes) + " B";
  return format_fixed(v, 2) + ' ' + units[u] + " (" + std::to_string(bytes) + " bytes)";
}

std::string format_fixed(double v, int precision) {
  // std::to_chars ignores the C locale: "%f" would print 0,0500 under de_DE and
  // break the comma-separated option strings that are parsed back.
  char buf[400];
  auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::fixed, precision);
  if (r.ec != std::errc()) return std::to_string(v);
  return std::string(buf, r.ptr);
}

const char* to_string(free_status s) noexcept {
  switch (s) {
    case free_status::ok: return "ok";
    case free_status::not_owned: return "pointer is not a live allocation of this resource (double free or foreign pointer)";
    case free_status::wrong_size: return "size does not match the allocation";
  }
  return "unknown";
}

namespace {
std::atomic<std::size_t> g_bad_frees{0};
void default_bad_free(const device_resource& r, void* p, std::size_t bytes, free_status s) {
  std::fprintf(stderr, "vramkit: ignored deallocate(%p, %zu) on %s: %s\n", p, bytes, r.name().c_str(),
               to_string(s));
}
std::atomic<bad_free_handler> g_handler{&default_bad_free};
}  // namespace

void set_bad_free_handler(bad_free_handler h) noexcept { g_handler.store(h ? h : &default_bad_free); }
std::size_t bad_free_count() noexcept { return g_bad_frees.load(); }

void report_bad_free(const device_resource& r, void* ptr, std::size_t bytes, free_status s) noexcept {
  g_bad_frees.fetch_add(1);
  try {
    g_handler.load()(r, ptr, bytes, s);
  } catch (...) {  // a handler that throws cannot turn a free into a throw
  }
}

void device_resource::deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept {
  free_status s = try_deallocate(ptr, bytes, stream);
  if (s != free_status::ok) report_bad_free(*this, ptr, bytes, s);
}

void device_resource::deallocate_checked(void* ptr, std::size_t bytes, stream_t stream) {
  free_status s = try_deallocate(ptr, bytes, stream);
  if (s != free_status::ok) {
    char p[32];
    std::snprintf(p, sizeof p, "%p", ptr);
    throw invalid_argument(std::string("vramkit: cannot free ") + p + " (" + std::to_string(bytes) + " bytes) on " +
                           name() + ": " + to_string(s));
  }
}

void device_resource::record_stream(void*, stream_t) {}

}  // namespace vramkit
