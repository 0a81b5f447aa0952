// PYTORCH_CUDA_ALLOC_CONF parsing for the emulation. PyTorch warns and skips
// keys it does not know; here a typo would silently give the wrong answer to
// "would it fit", so an unknown key is an error.
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "vramkit/emul/torch_caching.hpp"
#include "vramkit/pool_options.hpp"

namespace vramkit::emul {

namespace {

constexpr std::size_t kMB = 1u << 20;

bool is_pow2(std::size_t v) { return v && !(v & (v - 1)); }

// Splits into words and the separators , : [ ] (each its own token), as
// PyTorch's tokenizer does; '=' is read as ':' so that the vramkit form
// key=value works on a command line.
std::vector<std::string> tokenize(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : text) {
    if (c == '=') c = ':';
    if (c == ',' || c == ':' || c == '[' || c == ']') {
      if (!cur.empty()) out.push_back(cur), cur.clear();
      out.emplace_back(1, c);
    } else if (c != ' ') {
      cur.push_back(c);
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

struct reader {
  const std::vector<std::string>& t;
  std::size_t i = 0;
  const std::string& key;

  [[noreturn]] void fail(const std::string& why) const { throw invalid_argument("option " + key + ": " + why); }
  const std::string& next(const char* what) {
    if (i + 1 >= t.size()) fail(std::string("expected ") + what + " at the end");
    return t[++i];
  }
  void expect(const char* sep) {
    if (next(sep) != sep) fail(std::string("expected '") + sep + "', got '" + t[i] + "'");
  }
  std::size_t size_value(const std::string& s) const {
    if (s.empty() || s.size() > 18 || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
      fail("'" + s + "' is not a non-negative integer");
    return static_cast<std::size_t>(std::strtoull(s.c_str(), nullptr, 10));
  }
  double double_value(const std::string& s) const {
    char* end = nullptr;
    double v = std::strtod(s.c_str(), &end);
    if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(v)) fail("'" + s + "' is not a number");
    return v;
  }
  bool bool_value(const std::string& s) const {
    if (s == "True" || s == "true" || s == "1") return true;
    if (s == "False" || s == "false" || s == "0") return false;
    fail("'" + s + "' is not True or False");
  }
};

void parse_divisions(reader& r, torch_options& o) {
  r.expect(":");
  const std::string& first = r.next("a value");
  if (first != "[") {
    std::size_t v = r.size_value(first);
    if (!is_pow2(v)) r.fail("divisions must be a power of 2, not " + first);
    o.divisions.fill(v);
    return;
  }
  // [MB:DIV,MB:DIV,>:DIV]: each MB boundary (a power of 2) sets its interval;
  // the first also sets every interval below it, '>' every interval above the last.
  bool first_value = true;
  std::size_t last = 0;
  for (;;) {
    const std::string& k = r.next("']'");
    if (k == "]") break;
    r.expect(":");
    std::size_t v = r.size_value(r.next("a value"));
    if (v != 0 && !is_pow2(v)) r.fail("divisions must be a power of 2 or 0, not " + std::to_string(v));
    if (k == ">") {
      std::fill(o.divisions.begin() + static_cast<std::ptrdiff_t>(std::min(last + 1, o.divisions.size())),
                o.divisions.end(), v);
    } else {
      std::size_t mb = r.size_value(k);
      if (!is_pow2(mb)) r.fail("interval bounds must be powers of 2 (MB), not " + k);
      std::size_t idx = 0;
      while ((std::size_t{1} << (idx + 1)) <= mb) ++idx;
      idx = std::min(idx, o.divisions.size() - 1);
      if (first_value) {
        std::fill(o.divisions.begin(), o.divisions.begin() + static_cast<std::ptrdiff_t>(idx), v);
        first_value = false;
      }
      o.divisions[idx] = v;
      last = idx;
    }
    const std::string& sep = r.next("']'");
    if (sep == "]") break;
    if (sep != ",") r.fail("expected ',' or ']', got '" + sep + "'");
  }
}

}  // namespace

torch_options torch_options::parse(const std::string& conf) {
  torch_options o;
  auto t = tokenize(conf);
  for (std::size_t i = 0; i < t.size(); ++i) {
    const std::string key = t[i];
    reader r{t, i, key};
    if (key == ",") continue;
    if (key == "max_split_size_mb") {
      r.expect(":");
      std::size_t mb = r.size_value(r.next("a value"));
      if (mb <= 20) r.fail("must be more than 20 (MB), not " + std::to_string(mb));
      o.max_split_size = std::min(mb, no_limit / kMB) * kMB;
    } else if (key == "max_non_split_rounding_mb") {
      r.expect(":");
      std::size_t mb = r.size_value(r.next("a value"));
      if (mb < 20) r.fail("must be at least 20 (MB), not " + std::to_string(mb));
      o.max_non_split_rounding = std::min(mb, no_limit / kMB) * kMB;
    } else if (key == "garbage_collection_threshold") {
      r.expect(":");
      double v = r.double_value(r.next("a value"));
      if (!(v > 0 && v < 1)) r.fail("must be in (0, 1), not " + r.t[r.i]);
      o.garbage_collection_threshold = v;
    } else if (key == "roundup_power2_divisions") {
      parse_divisions(r, o);
    } else if (key == "expandable_segments") {
      r.expect(":");
      o.expandable_segments = r.bool_value(r.next("a value"));
    } else if (key == "per_process_memory_fraction") {
      r.expect(":");
      double v = r.double_value(r.next("a value"));
      if (!(v > 0 && v <= 1)) r.fail("must be in (0, 1], not " + r.t[r.i]);
      o.memory_fraction = v;
    } else if (key == "backend") {
      r.expect(":");
      const std::string& v = r.next("a value");
      if (v == "cudaMallocAsync" || v == "async")
        r.fail("the cudaMallocAsync backend cannot be emulated: its pool's placement is inside the CUDA driver and "
               "not documented");
      if (v != "native") r.fail("'" + v + "' is not native or cudaMallocAsync");
    } else if (key == "release_lock_on_cudamalloc" || key == "release_lock_on_device_malloc" ||
               key == "pinned_use_cuda_host_register" || key == "pinned_use_host_register" ||
               key == "pinned_use_background_threads") {
      // Accepted (a real config line may carry them) but they move no memory.
      r.expect(":");
      r.bool_value(r.next("a value"));
    } else if (key == "pinned_num_register_threads") {
      r.expect(":");
      std::size_t v = r.size_value(r.next("a value"));
      if (!is_pow2(v) || v > 128) r.fail("must be a power of 2 up to 128, not " + std::to_string(v));
    } else {
      throw invalid_argument("unknown option '" + key +
                             "' (known: expandable_segments, max_split_size_mb, max_non_split_rounding_mb, "
                             "roundup_power2_divisions, garbage_collection_threshold, per_process_memory_fraction, "
                             "backend, release_lock_on_cudamalloc, release_lock_on_device_malloc, pinned_*)");
    }
    i = r.i;
    if (i + 1 < t.size() && t[i + 1] != ",")
      throw invalid_argument("option " + key + ": expected ',' after its value, got '" + t[i + 1] + "'");
  }
  return o;
}

std::string torch_options::conf_line() const {
  std::vector<std::string> parts;
  if (expandable_segments) parts.push_back("expandable_segments:True");
  if (max_split_size != no_limit) parts.push_back("max_split_size_mb:" + std::to_string(max_split_size / kMB));
  if (max_non_split_rounding != (20u << 20))
    parts.push_back("max_non_split_rounding_mb:" + std::to_string(max_non_split_rounding / kMB));
  if (std::any_of(divisions.begin(), divisions.end(), [](std::size_t d) { return d != 0; })) {
    if (std::all_of(divisions.begin(), divisions.end(), [&](std::size_t d) { return d == divisions[0]; })) {
      parts.push_back("roundup_power2_divisions:" + std::to_string(divisions[0]));
    } else {
      std::string s = "roundup_power2_divisions:[";
      for (std::size_t k = 0; k < divisions.size(); ++k)
        s += (k ? "," : "") + std::to_string(std::size_t{1} << k) + ":" + std::to_string(divisions[k]);
      parts.push_back(s + "]");
    }
  }
  if (garbage_collection_threshold > 0)
    parts.push_back("garbage_collection_threshold:" + format_fixed(garbage_collection_threshold, 2));
  std::string out;
  for (auto& p : parts) out += (out.empty() ? "" : ",") + p;
  return out;
}

bool is_torch_spec(const std::string& spec) noexcept {
  std::string kind = spec.substr(0, spec.find(':'));
  return kind == "torch" || kind == "torch-default" || kind == "torch-expandable";
}

std::shared_ptr<torch_caching_emulator> make_torch_emulator(const std::string& spec, std::size_t capacity) {
  auto colon = spec.find(':');
  std::string kind = spec.substr(0, colon);
  std::string conf = colon == std::string::npos ? "" : spec.substr(colon + 1);
  if (!is_torch_spec(spec)) throw invalid_argument("'" + spec + "' is not a PyTorch emulation (torch-default, torch-expandable, torch:OPTIONS)");
  if (kind == "torch" && colon == std::string::npos)
    throw invalid_argument("'torch' needs options (torch:max_split_size_mb=128,...); or use torch-default");
  torch_options o = torch_options::parse(conf);
  if (kind == "torch-expandable") {
    if (conf.find("expandable_segments") != std::string::npos && !o.expandable_segments)
      throw invalid_argument("torch-expandable with expandable_segments:False contradicts itself");
    o.expandable_segments = true;
  } else if (kind == "torch-default" && o.expandable_segments) {
    throw invalid_argument("torch-default with expandable_segments:True contradicts itself; use torch-expandable");
  }
  if (o.memory_fraction > 0 && capacity == 0)
    throw invalid_argument("per_process_memory_fraction needs a device capacity (--capacity)");
  o.capacity = capacity;
  return std::make_shared<torch_caching_emulator>(o, spec);
}

}  // namespace vramkit::emul
