#include "vramkit/pool_options.hpp"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <system_error>
#include <vector>

#include "vramkit/error.hpp"

namespace vramkit {

namespace {
// A whole decimal number ("1", "1.5", ".5"; no sign, exponent, or second dot), read
// with std::from_chars, which ignores the C locale (std::stod would stop at the '.'
// under de_DE.UTF-8 and read "1.5" as 1). Returns false on anything else.
bool parse_decimal(const std::string& t, double& out) {
  if (t.empty() || t.find_first_not_of("0123456789.") != std::string::npos) return false;
  if (t.find('.') != t.rfind('.') || t == ".") return false;
  auto r = std::from_chars(t.data(), t.data() + t.size(), out, std::chars_format::fixed);
  return r.ec == std::errc() && r.ptr == t.data() + t.size();
}
}  // namespace

std::size_t parse_size(const std::string& text) {
  std::string t;
  for (char c : text)
    if (!std::isspace(static_cast<unsigned char>(c))) t += c;
  if (t.empty()) throw invalid_argument("empty size");
  if (t[0] == '-') throw invalid_argument("size '" + text + "' cannot be negative");
  std::size_t i = 0;
  while (i < t.size() && (std::isdigit(static_cast<unsigned char>(t[i])) || t[i] == '.')) ++i;
  if (i == 0) throw invalid_argument("size '" + text + "' does not start with a number");
  double v;
  if (!parse_decimal(t.substr(0, i), v)) throw invalid_argument("size '" + text + "' is not a number");
  std::string u = t.substr(i);
  for (auto& c : u) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double mult = 1;
  if (u.empty() || u == "B") mult = 1;
  else if (u == "K" || u == "KB") mult = 1e3;
  else if (u == "KIB") mult = 1024.0;
  else if (u == "M" || u == "MB") mult = 1e6;
  else if (u == "MIB") mult = 1024.0 * 1024;
  else if (u == "G" || u == "GB") mult = 1e9;
  else if (u == "GIB") mult = 1024.0 * 1024 * 1024;
  else if (u == "T" || u == "TB") mult = 1e12;
  else if (u == "TIB") mult = 1024.0 * 1024 * 1024 * 1024;
  else throw invalid_argument("size '" + text + "' has an unknown unit '" + t.substr(i) + "'");
  double bytes = v * mult;
  if (!std::isfinite(bytes) || bytes < 0 || bytes > 9.0e18)
    throw invalid_argument("size '" + text + "' is out of range");
  return static_cast<std::size_t>(std::llround(bytes));
}

namespace {
bool pow2(std::size_t v) { return v && !(v & (v - 1)); }
double parse_real(const std::string& key, const std::string& v) {
  double d;
  if (!v.empty() && v[0] == '-' && parse_decimal(v.substr(1), d))
    throw invalid_argument(key + " cannot be negative (got " + v + ")");
  if (!parse_decimal(v, d))
    throw invalid_argument(key + " takes a plain decimal number (e.g. 0.05), not '" + v + "'");
  return d;
}
bool parse_bool(const std::string& key, const std::string& v) {
  std::string l = v;
  for (char& c : l) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (l == "1" || l == "true" || l == "on" || l == "yes") return true;
  if (l == "0" || l == "false" || l == "off" || l == "no") return false;
  throw invalid_argument(key + " takes true or false, not '" + v + "'");
}
}  // namespace

void pool_options::validate() const {
  if (!pow2(alignment) || alignment < 256)
    throw invalid_argument("alignment " + std::to_string(alignment) + " must be a power of two of at least 256");
  if (page_size && !pow2(page_size))
    throw invalid_argument("page_size " + std::to_string(page_size) + " must be a power of two (or 0 for the device's)");
  if (small_segment < alignment || large_rounding < alignment)
    throw invalid_argument("small_segment and large_rounding must be at least the alignment");
  if (!(growth_slack >= 0 && growth_slack <= 100))
    throw invalid_argument("growth_slack " + format_fixed(growth_slack, 4) + " must be between 0 and 100");
  if (remap_own && !keep_mappings)
    throw invalid_argument("remap_own needs keep_mappings: a page taken before its stream's work is done keeps "
                           "its old mapping until that work completes");
  if (!(remap_own_slack >= 0 && remap_own_slack <= 100))
    throw invalid_argument("remap_own_slack " + format_fixed(remap_own_slack, 4) + " must be between 0 and 100");
  if (!(va_factor >= 1 && va_factor <= 64))
    throw invalid_argument("va_factor " + format_fixed(va_factor, 2) + " must be between 1 and 64");
}

void pool_options::parse(const std::string& conf) {
  pool_options o = *this;
  std::vector<std::string> items;
  for (std::size_t start = 0;;) {
    std::size_t comma = conf.find(',', start);
    items.push_back(conf.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  bool own_given = false;  // remap_own named in this string
  for (const std::string& item : items) {
    if (item.find_first_not_of(" \t") == std::string::npos) continue;
    auto colon = item.find(':');
    if (colon == std::string::npos)
      throw invalid_argument("'" + item + "' is not key:value");
    std::string k = item.substr(0, colon), v = item.substr(colon + 1);
    auto trim = [](std::string s) {
      s.erase(0, s.find_first_not_of(" \t"));
      s.erase(s.find_last_not_of(" \t") + 1);
      return s;
    };
    k = trim(k);
    v = trim(v);
    auto size = [&] {  // a size's own message names the value; this names the option too
      try {
        return parse_size(v);
      } catch (const invalid_argument& e) {
        throw invalid_argument(k + ": " + e.what());
      }
    };
    try {
      if (k == "alignment") o.alignment = size();
      else if (k == "page_size") o.page_size = size();
      else if (k == "small_threshold") o.small_threshold = size();
      else if (k == "small_segment") o.small_segment = size();
      else if (k == "large_rounding") o.large_rounding = size();
      else if (k == "reserve_limit") o.reserve_limit = size();
      else if (k == "release_threshold") o.release_threshold = v == "max" ? static_cast<std::size_t>(-1) : size();
      else if (k == "growth_slack") o.growth_slack = parse_real(k, v);
      else if (k == "va_factor") o.va_factor = parse_real(k, v);
      else if (k == "map_ahead") o.map_ahead = size();
      else if (k == "chunk_size") o.chunk_size = size();
      else if (k == "chunk_min_size") o.chunk_min_size = size();
      else if (k == "growth_chunks") o.growth_chunks = parse_bool(k, v);
      else if (k == "split_chunks") o.split_chunks = parse_bool(k, v);
      else if (k == "plan_steps") o.plan_steps = parse_bool(k, v);
      else if (k == "plan_moves_grow") o.plan_moves_grow = parse_bool(k, v);
      else if (k == "plan_needs_moves") o.plan_needs_moves = parse_bool(k, v);
      else if (k == "fit") {
        std::string l = v;
        for (char& c : l) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        if (l == "address") o.fit_address = true;
        else if (l == "best") o.fit_address = false;
        else throw invalid_argument("fit takes best or address, not '" + v + "'");
      }
      else if (k == "remap") o.remap = parse_bool(k, v);
      else if (k == "wait_to_remap") o.wait_to_remap = parse_bool(k, v);
      else if (k == "defer_unmap") {
        // Removed: wait_to_remap gives as little memory for less time (docs/configuration.md).
        if (parse_bool(k, v))
          throw invalid_argument(
              "defer_unmap was removed: wait_to_remap:true gives as little "
              "memory at a smaller cost in time");
      } else if (k == "keep_mappings") o.keep_mappings = parse_bool(k, v);
      else if (k == "remap_own") {
        o.remap_own = parse_bool(k, v);
        own_given = true;
      }
      else if (k == "remap_own_slack") o.remap_own_slack = parse_real(k, v);
      else
        throw invalid_argument("unknown key '" + k +
                               "' (known: alignment, page_size, small_threshold, small_segment, large_rounding, "
                               "reserve_limit, release_threshold, growth_slack, remap, wait_to_remap, keep_mappings, remap_own, "
                               "remap_own_slack, "
                               "map_ahead, chunk_size, chunk_min_size, growth_chunks, split_chunks, plan_steps, plan_moves_grow, plan_needs_moves, fit, va_factor)");
    } catch (const invalid_argument&) {
      throw;
    } catch (const std::exception&) {
      throw invalid_argument("bad value '" + v + "' for " + k);
    }
  }
  // remap_own (on by default) rests on kept mappings: turning those off
  // turns it off too, unless the same string asks for both.
  if (!o.keep_mappings && !own_given) o.remap_own = false;
  o.validate();
  *this = o;
}

pool_options pool_options::from_env() {
  pool_options o;
  if (const char* e = std::getenv("VRAMKIT_ALLOC_CONF")) {
    try {
      o.parse(e);
    } catch (const invalid_argument& x) {  // name where the bad setting came from
      throw invalid_argument(std::string("VRAMKIT_ALLOC_CONF: ") + x.what());
    }
  }
  return o;
}

std::string pool_options::to_string() const {
  using std::to_string;
  std::string s = "alignment:" + to_string(alignment) + ",page_size:" + to_string(page_size) +
                  ",small_threshold:" + to_string(small_threshold) + ",small_segment:" + to_string(small_segment) +
                  ",large_rounding:" + to_string(large_rounding) + ",reserve_limit:" + to_string(reserve_limit) +
                  ",release_threshold:";
  s += release_threshold == static_cast<std::size_t>(-1) ? std::string("max") : to_string(release_threshold);
  s += ",growth_slack:" + format_fixed(growth_slack, 4) + ",remap:" + (remap ? "true" : "false") +
       ",wait_to_remap:" + (wait_to_remap ? "true" : "false") + ",keep_mappings:" + (keep_mappings ? "true" : "false") +
       ",remap_own:" + (remap_own ? "true" : "false") + ",remap_own_slack:" + format_fixed(remap_own_slack, 4) +
       ",map_ahead:" + to_string(map_ahead) + ",chunk_size:" + to_string(chunk_size) +
       ",chunk_min_size:" + to_string(chunk_min_size) + ",growth_chunks:" + (growth_chunks ? "true" : "false") +
       ",split_chunks:" + (split_chunks ? "true" : "false") + ",plan_steps:" + (plan_steps ? "true" : "false") +
       ",plan_moves_grow:" + (plan_moves_grow ? "true" : "false") +
       ",plan_needs_moves:" + (plan_needs_moves ? "true" : "false") +
       ",fit:" + (fit_address ? "address" : "best") + ",va_factor:" + format_fixed(va_factor, 2);
  return s;
}

}  // namespace vramkit
