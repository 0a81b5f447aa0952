#include "vramkit/trace/torch_csv.hpp"

#include <algorithm>
#include <cstring>

#ifdef VRAMKIT_HAVE_ZLIB
#include <zlib.h>
#endif

namespace vramkit {

namespace {

// Non-negative decimal or a leading '-' for t_us; nothing else (the Python
// reader takes the rest).
bool parse_dec(const char* b, const char* e, std::int64_t& v) {
  while (b < e && *b == ' ') ++b;
  while (e > b && (e[-1] == ' ' || e[-1] == '\r')) --e;
  bool neg = false;
  if (b < e && *b == '-') neg = true, ++b;
  if (b == e || e - b > 19) return false;
  std::uint64_t x = 0;
  for (const char* p = b; p < e; ++p) {
    if (*p < '0' || *p > '9') return false;
    x = x * 10 + static_cast<std::uint64_t>(*p - '0');
  }
  if (x > static_cast<std::uint64_t>(INT64_MAX)) return false;
  v = neg ? -static_cast<std::int64_t>(x) : static_cast<std::int64_t>(x);
  return true;
}

std::string norm(std::string s) {
  s.erase(std::remove_if(s.begin(), s.end(), [](char c) { return c == ' ' || c == '\r' || c == '"'; }), s.end());
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (s.rfind("\xef\xbb\xbf", 0) == 0) s.erase(0, 3);
  return s;
}

}  // namespace

bool read_torch_csv_fast(const std::string& path, torch_csv_columns& out, std::string& why, std::uint64_t max_bytes,
                         std::uint64_t max_rows) {
#ifndef VRAMKIT_HAVE_ZLIB
  (void)path, (void)out, (void)max_bytes, (void)max_rows;
  why = "built without zlib";
  return false;
#else
  gzFile f = gzopen(path.c_str(), "rb");  // reads plain files as they are
  if (!f) {
    why = "cannot open";
    return false;
  }
  gzbuffer(f, 1 << 20);
  std::vector<char> buf(1 << 22);
  std::string carry;
  int i_act = -1, i_addr = -1, i_size = -1, i_t = -1, i_stream = -1, width = 0;
  bool header = false;
  std::vector<std::pair<const char*, const char*>> fields;
  auto line = [&](const char* b, const char* e) -> bool {
    if (b == e || (e - b == 1 && *b == '\r')) return true;
    if (std::memchr(b, '"', static_cast<std::size_t>(e - b))) {
      why = "quoted fields";
      return false;
    }
    fields.clear();
    const char* s = b;
    for (const char* p = b;; ++p) {
      if (p == e || *p == ',') {
        fields.emplace_back(s, p);
        if (p == e) break;
        s = p + 1;
      }
    }
    if (!header) {
      header = true;
      width = static_cast<int>(fields.size());
      for (int k = 0; k < width; ++k) {
        std::string c = norm(std::string(fields[k].first, fields[k].second));
        if (c == "action") i_act = k;
        if (c == "addr") i_addr = k;
        if (c == "size") i_size = k;
        if ((c == "t_us" || c == "time_us") && i_t < 0) i_t = k;
        if (c == "stream") i_stream = k;
      }
      if (i_act < 0 || i_addr < 0 || i_size < 0) {
        why = "header without action, addr and size";
        return false;
      }
      out.has_time = i_t >= 0;
      out.has_stream = i_stream >= 0;
      return true;
    }
    if (static_cast<int>(fields.size()) != width) {
      why = "a row of another width";
      return false;
    }
    std::string act(fields[i_act].first, fields[i_act].second);
    while (!act.empty() && (act.back() == ' ' || act.back() == '\r')) act.pop_back();
    while (!act.empty() && act.front() == ' ') act.erase(0, 1);
    ++out.events[act];
    std::uint8_t code;
    if (act == "alloc")
      code = 0;
    else if (act == "free_requested")
      code = 1;
    else if (act == "free_completed" || act == "segment_alloc" || act == "segment_free" || act == "segment_map" ||
             act == "segment_unmap" || act == "snapshot" || act == "oom") {
      std::int64_t t = 0;
      auto& tf = fields[static_cast<std::size_t>(i_t >= 0 ? i_t : 0)];
      bool blank = std::all_of(tf.first, tf.second, [](char c) { return c == ' ' || c == '\r'; });
      if (i_t >= 0 && !blank && !parse_dec(tf.first, tf.second, t)) {
        why = "a time that is not a plain decimal";
        return false;
      }
      return true;
    }
    else {
      why = "unknown action";
      return false;
    }
    std::int64_t addr = 0, size = 0, t = 0, st = 0;
    if (!parse_dec(fields[i_addr].first, fields[i_addr].second, addr) || addr < 0 ||
        (code == 0 && (!parse_dec(fields[i_size].first, fields[i_size].second, size) || size < 0)) ||
        (i_t >= 0 && !parse_dec(fields[i_t].first, fields[i_t].second, t)) ||
        (code == 0 && i_stream >= 0 && (!parse_dec(fields[i_stream].first, fields[i_stream].second, st) || st < 0))) {
      why = "a field that is not a plain decimal";
      return false;
    }
    if (out.action.size() >= max_rows) {
      why = "rows bound";
      return false;
    }
    out.action.push_back(code);
    out.addr.push_back(static_cast<std::uint64_t>(addr));
    out.size.push_back(size);
    out.stream.push_back(static_cast<std::uint64_t>(st));
    if (i_t >= 0) out.t_us.push_back(t);
    return true;
  };
  bool ok = true;
  std::uint64_t total = 0;
  constexpr std::size_t max_line = 64 << 10;
  for (;;) {
    int n = gzread(f, buf.data(), static_cast<unsigned>(buf.size()));
    if (n < 0) {
      why = "gzip error";
      ok = false;
      break;
    }
    if (n == 0) break;
    total += static_cast<std::uint64_t>(n);
    if (total > max_bytes) {
      why = "bytes bound";
      ok = false;
      break;
    }
    const char* p = buf.data();
    const char* end = p + n;
    if (!carry.empty()) {
      const char* nl = static_cast<const char*>(std::memchr(p, '\n', static_cast<std::size_t>(end - p)));
      if (!nl) {
        carry.append(p, end);
        if (carry.size() > max_line) {
          why = "a line longer than 64 KiB";
          ok = false;
          break;
        }
        continue;
      }
      carry.append(p, nl);
      if (!line(carry.data(), carry.data() + carry.size())) {
        ok = false;
        break;
      }
      carry.clear();
      p = nl + 1;
    }
    while (p < end) {
      const char* nl = static_cast<const char*>(std::memchr(p, '\n', static_cast<std::size_t>(end - p)));
      if (!nl) {
        carry.assign(p, end);
        if (carry.size() > max_line) {
          why = "a line longer than 64 KiB";
          ok = false;
        }
        break;
      }
      if (!line(p, nl)) {
        ok = false;
        break;
      }
      p = nl + 1;
    }
    if (!ok) break;
  }
  if (ok && !carry.empty() && !line(carry.data(), carry.data() + carry.size())) ok = false;
  if (ok) {  // a truncated or damaged gzip stream: leave the wording to the Python reader
    int err = Z_OK;
    gzerror(f, &err);
    if (err != Z_OK) why = "gzip error", ok = false;
  }
  gzclose(f);
  if (ok && !header) why = "empty file", ok = false;
  return ok;
#endif
}

}  // namespace vramkit
