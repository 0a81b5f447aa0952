// The emulation of PyTorch's caching allocator. It follows the published
// rules of c10/cuda/CUDACachingAllocator.cpp step by step (rounding, the two
// pools, segment sizes, best fit by (stream, size, address), split and
// oversize rules, release-and-retry, garbage collection, expandable segments)
// because the answer is only worth having if it is PyTorch's to the byte.
// Written from the rules; see docs/advise.md for what is and is not modelled.
#include <algorithm>
#include <iterator>
#include <limits>
#include <string>

#include "vramkit/emul/torch_caching.hpp"

namespace vramkit::emul {

namespace {
constexpr std::size_t kMinBlock = 512;
constexpr std::size_t kSmallSize = 1u << 20;
constexpr std::size_t kSmallBuffer = 2u << 20;
constexpr std::size_t kMinLargeAlloc = 10u << 20;
constexpr std::size_t kLargeBuffer = 20u << 20;
constexpr std::size_t kRoundLarge = 2u << 20;
constexpr std::size_t kArena = 4096;
// The emulated device's address space (segments get made-up addresses below
// it): no request or segment reaches past it, and nothing wraps around.
constexpr std::uintptr_t kAddressLimit = std::uintptr_t{1} << 58;

std::size_t round_up(std::size_t v, std::size_t m) { return (v + m - 1) / m * m; }
int floor_log2(std::size_t v) { return 63 - __builtin_clzll(v); }
}  // namespace

struct torch_caching_emulator::block {
  stream_t stream = 0;
  std::size_t size = 0;
  std::uintptr_t ptr = 0;
  std::size_t requested = 0;
  pool* owner = nullptr;
  block* prev = nullptr;
  block* next = nullptr;
  segment_space* space = nullptr;  // the expandable segment, or null
  std::int64_t gc_base = 0;
  bool allocated = false;
  bool mapped = true;
  bool split() const { return prev || next; }
};

struct torch_caching_emulator::pool {
  struct by_size {
    bool operator()(const block* a, const block* b) const {
      if (a->stream != b->stream) return a->stream < b->stream;
      if (a->size != b->size) return a->size < b->size;
      return a->ptr < b->ptr;
    }
  };
  struct by_addr {
    bool operator()(const block* a, const block* b) const {
      if (a->stream != b->stream) return a->stream < b->stream;
      return a->ptr < b->ptr;
    }
  };
  std::set<block*, by_size> blocks;
  std::set<block*, by_addr> unmapped;
  bool small = false;
  std::int64_t get_free_calls = 0;
  void insert(block* b) {
    b->gc_base = get_free_calls;
    blocks.insert(b);
  }
};

// A reserved virtual range of an expandable segment, mapped page by page.
struct torch_caching_emulator::segment_space {
  std::uintptr_t base = 0;
  std::size_t page = 0;
  std::size_t max_pages = 0;
  std::vector<bool> mapped;
  std::size_t bytes() const { return page * max_pages; }
};

struct torch_caching_emulator::request {
  stream_t stream;
  std::size_t size;        // rounded
  std::size_t alloc_size;  // segment size if a new one is needed
  pool* p;
  block* found = nullptr;
};

torch_caching_emulator::torch_caching_emulator(torch_options o, std::string name)
    : opt_(o), name_(std::move(name)), large_(new pool), small_(new pool) {
  small_->small = true;
  // setMemoryFraction sets no limit for a fraction of 1 (allowed_memory_maximum
  // stays empty), and garbage collection acts only under a limit.
  if (opt_.memory_fraction > 0 && opt_.memory_fraction < 1)
    allowed_max_ = static_cast<std::size_t>(opt_.memory_fraction * static_cast<double>(opt_.capacity));
  live_.reserve(1 << 12);
}

torch_caching_emulator::~torch_caching_emulator() = default;

torch_caching_emulator::block* torch_caching_emulator::new_block() {
  if (free_list_.empty()) {
    arenas_.emplace_back(new block[kArena]);
    for (std::size_t i = kArena; i-- > 0;) free_list_.push_back(&arenas_.back()[i]);
  }
  block* b = free_list_.back();
  free_list_.pop_back();
  *b = block{};
  return b;
}

void torch_caching_emulator::delete_block(block* b) noexcept { free_list_.push_back(b); }

void torch_caching_emulator::add_reserved(std::size_t n) noexcept {
  total_reserved_ += n;
  peak_reserved_ = std::max(peak_reserved_, total_reserved_);
}

std::size_t torch_caching_emulator::round_size(std::size_t size) const noexcept {
  if (size < kMinBlock) return kMinBlock;
  // the interval of `size` among the 16 power-of-two intervals from 1 MiB
  int lg = floor_log2(size);
  std::size_t idx = lg > 20 ? static_cast<std::size_t>(lg - 20) : 0;
  idx = std::min(idx, torch_options::intervals - 1);
  std::size_t div = opt_.divisions[idx];
  if (div > 1 && size > kMinBlock * div) {
    if ((size & (size - 1)) == 0) return size;
    std::size_t floor2 = std::size_t{1} << lg;
    std::size_t step = floor2 >> floor_log2(div);
    if (step == 0) return floor2 << 1;
    std::size_t down = size & ~(step - 1);
    return down == size ? size : down + step;
  }
  return round_up(size, kMinBlock);
}

std::size_t torch_caching_emulator::allocation_size_for(std::size_t size) noexcept {
  if (size <= kSmallSize) return kSmallBuffer;
  if (size < kMinLargeAlloc) return kLargeBuffer;
  return round_up(size, kRoundLarge);
}

bool torch_caching_emulator::should_split(const block* b, std::size_t size) const noexcept {
  std::size_t remaining = b->size - size;
  if (b->owner->small || opt_.expandable_segments) return remaining >= kMinBlock;
  return size < opt_.max_split_size && remaining > kSmallSize;
}

void* torch_caching_emulator::do_allocate(std::size_t orig, stream_t stream) {
  if (orig == 0) return nullptr;  // PyTorch hands out no block for an empty tensor
  std::lock_guard<std::mutex> lk(mu_);
  request r;
  r.stream = stream;
  if (orig > kAddressLimit) {  // larger than any device: out of memory before any rounding can wrap
    ++ctr_.num_ooms;
    throw out_of_memory(name_ + ": out of memory: tried to allocate " + format_bytes(orig) +
                            ", more than the emulated device's address space",
                        orig);
  }
  r.size = round_size(orig);
  r.p = r.size <= kSmallSize ? small_.get() : large_.get();
  r.alloc_size = allocation_size_for(r.size);
  bool found = get_free_block(r);
  if (!found) {
    if (allowed_max_ && opt_.garbage_collection_threshold > 0) garbage_collect();
    found = alloc_block(r, false) || (release_available_cached_blocks(r) && alloc_block(r, false)) ||
            (release_cached_blocks(), alloc_block(r, true));
  }
  if (!found) {
    ++ctr_.num_ooms;
    std::string limit = allowed_max_ ? format_bytes(allowed_max_) + " allowed by the memory fraction"
                                     : format_bytes(opt_.capacity) + " of capacity";
    throw out_of_memory(name_ + ": out of memory: tried to allocate " + format_bytes(r.alloc_size) + " with " +
                            format_bytes(total_reserved_) + " reserved, " + format_bytes(ctr_.allocated_bytes) +
                            " allocated, " + limit,
                        orig);
  }
  block* b = alloc_found_block(r, orig, should_split(r.found, r.size));
  live_.emplace(b->ptr, b);
  return reinterpret_cast<void*>(b->ptr);
}

bool torch_caching_emulator::get_free_block(request& r) {
  pool& p = *r.p;
  if (allowed_max_ && opt_.garbage_collection_threshold > 0) ++p.get_free_calls;
  block key;
  key.stream = r.stream;
  key.size = r.size;
  auto it = p.blocks.lower_bound(&key);
  if (it == p.blocks.end() || (*it)->stream != r.stream) return false;
  if ((*it)->space) {
    // An expandable block counts as big as it could grow into the unmapped
    // range after it: prefer the smallest such reach, as PyTorch does.
    auto reach = [](const block* b) { return b->size + (b->next && !b->next->mapped ? b->next->size : 0); };
    auto nx = std::next(it);
    while ((*it)->space && nx != p.blocks.end() && (*nx)->stream == r.stream && reach(*nx) < reach(*it)) it = nx++;
  }
  if (r.size < opt_.max_split_size && (*it)->size >= opt_.max_split_size) return false;
  if (r.size >= opt_.max_split_size && (*it)->size >= r.size + opt_.max_non_split_rounding) return false;
  r.found = *it;
  p.blocks.erase(it);
  return true;
}

bool torch_caching_emulator::alloc_block(request& r, bool retry) {
  if (retry) ++ctr_.num_alloc_retries;
  if (allowed_max_ && total_reserved_ + r.alloc_size > allowed_max_) return false;
  if (opt_.expandable_segments) {
    r.found = try_allocate_expandable(r.stream, *r.p, r.size);
    return r.found != nullptr;
  }
  if (opt_.capacity && total_reserved_ + r.alloc_size > opt_.capacity) return false;  // cudaMalloc fails
  // Without a capacity: no segment past the emulated address space either.
  if (r.alloc_size > kAddressLimit - std::min<std::uintptr_t>(next_addr_, kAddressLimit)) return false;
  block* b = new_block();
  b->stream = r.stream;
  b->size = r.alloc_size;
  b->owner = r.p;
  b->ptr = segment_address(r.alloc_size);
  held_segments_.emplace(b->ptr, r.alloc_size);
  add_reserved(r.alloc_size);
  ++ctr_.segment_current;
  ctr_.segment_peak = std::max(ctr_.segment_peak, ctr_.segment_current);
  ++ctr_.num_device_alloc;
  r.found = b;
  return true;
}

void torch_caching_emulator::set_segment_addresses(std::vector<std::uintptr_t> addresses) {
  std::lock_guard<std::mutex> lk(mu_);
  if (ctr_.num_device_alloc || !live_.empty())
    throw invalid_argument(name_ + ": segment addresses must be set before the first allocation");
  for (std::size_t i = 0; i < addresses.size(); ++i)
    if (addresses[i] == 0 || addresses[i] % kMinBlock || addresses[i] > (std::uintptr_t{1} << 57))
      throw invalid_argument(name_ + ": segment address " + std::to_string(i) + " (" + std::to_string(addresses[i]) +
                             ") is not a device address (non-zero, 512-byte aligned, under 2^57)");
  given_addrs_ = std::move(addresses);
  given_next_ = 0;
  // counted-up addresses start 1 TiB above the highest given one: past any segment placed there
  for (auto a : given_addrs_) next_addr_ = std::max(next_addr_, round_up(a, kRoundLarge) + (std::uintptr_t{1} << 40));
}

// The next given address while the list lasts and the run follows the real
// one; otherwise counting up.
std::uintptr_t torch_caching_emulator::segment_address(std::size_t size) {
  if (given_next_ < given_addrs_.size()) {
    std::uintptr_t a = given_addrs_[given_next_++];
    auto it = held_segments_.upper_bound(a);
    bool overlaps = (it != held_segments_.end() && it->first < a + size) ||
                    (it != held_segments_.begin() && std::prev(it)->first + std::prev(it)->second > a);
    if (!overlaps) {
      ++ctr_.given_addresses_used;
      return a;
    }
    given_next_ = given_addrs_.size();  // diverged: the rest of the list no longer applies
  }
  std::uintptr_t a = next_addr_;
  next_addr_ += round_up(size, kRoundLarge);
  return a;
}

// Frees oversize cached blocks (never split, so each is a whole segment) of the
// request's stream: one big enough if there is one, else the largest first.
bool torch_caching_emulator::release_available_cached_blocks(const request& r) {
  if (opt_.max_split_size == torch_options::no_limit) return false;
  pool& p = *r.p;
  block key;
  key.stream = r.stream;
  key.size = std::max(r.size, opt_.max_split_size);
  auto it = p.blocks.lower_bound(&key);
  if (it != p.blocks.end() && (*it)->stream == r.stream && !(*it)->space) {
    release_block(*it);
    return true;
  }
  if (it == p.blocks.begin()) return false;
  std::size_t released = 0;
  --it;
  while (released < key.size && (*it)->size >= opt_.max_split_size && (*it)->stream == r.stream) {
    auto cur = it;
    bool first = it == p.blocks.begin();
    if (!first) --it;
    if (!(*cur)->space) {
      released += (*cur)->size;
      release_block(*cur);
    }
    if (first) break;
  }
  return released >= key.size;
}

void torch_caching_emulator::release_cached_blocks() {
  release_blocks(*large_);
  release_blocks(*small_);
}

void torch_caching_emulator::release_blocks(pool& p) {
  std::vector<block*> to_unmap;
  for (auto it = p.blocks.begin(); it != p.blocks.end();) {
    block* b = *it++;
    if (b->space)
      to_unmap.push_back(b);
    else if (!b->split())
      release_block(b);
  }
  for (block* b : to_unmap) {
    unmap_block(b);
    if (!b->split() && !b->mapped) release_expandable_segment(b);
  }
}

void torch_caching_emulator::release_block(block* b) {
  held_segments_.erase(b->ptr);
  ++ctr_.num_device_free;
  --ctr_.segment_current;
  total_reserved_ -= b->size;
  b->owner->blocks.erase(b);
  delete_block(b);
}

void torch_caching_emulator::garbage_collect() {
  auto threshold = static_cast<std::size_t>(opt_.garbage_collection_threshold * static_cast<double>(allowed_max_));
  if (total_reserved_ <= threshold) return;
  const std::size_t target = total_reserved_ - threshold;
  pool& p = *large_;
  auto age = [&](const block* b) { return static_cast<std::size_t>(static_cast<int>(p.get_free_calls - b->gc_base)); };
  std::size_t total_age = 0, reclaimed = 0;
  int count = 0;
  for (block* b : p.blocks)
    if (!b->split() && !b->space) total_age += age(b), ++count;
  if (count == 0) return;
  bool freed = true;
  while (reclaimed < target && freed && count > 0) {
    // Oldest first: free every whole cached segment at least as old as the average.
    double limit = static_cast<double>(total_age) / count;
    freed = false;
    for (auto it = p.blocks.begin(); it != p.blocks.end();) {
      block* b = *it++;
      if (!b->split() && !b->space && static_cast<double>(age(b)) >= limit) {
        freed = true;
        reclaimed += b->size;
        total_age -= age(b);
        --count;
        release_block(b);
      }
    }
  }
}

torch_caching_emulator::block* torch_caching_emulator::alloc_found_block(request& r, std::size_t orig, bool split) {
  block* b = r.found;
  if (split) {
    block* rest = b;
    b = new_block();
    b->stream = r.stream;
    b->size = r.size;
    b->owner = r.p;
    b->ptr = rest->ptr;
    b->space = rest->space;
    b->prev = rest->prev;
    if (b->prev) b->prev->next = b;
    b->next = rest;
    rest->prev = b;
    rest->ptr += r.size;
    rest->size -= r.size;
    r.p->insert(rest);
  }
  b->allocated = true;
  b->requested = orig;
  ctr_.allocated_bytes += b->size;
  live_requested_ += orig;
  peak_allocated_ = std::max(peak_allocated_, ctr_.allocated_bytes);
  return b;
}

free_status torch_caching_emulator::try_deallocate(void* ptr, std::size_t bytes, stream_t) noexcept {
  if (!ptr) return free_status::ok;
  std::lock_guard<std::mutex> lk(mu_);
  auto it = live_.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == live_.end()) return free_status::not_owned;
  block* b = it->second;
  // A size, when given, is the request, its rounded size or the block's (as a trace may record it).
  if (bytes != 0 && bytes != b->requested && bytes != round_size(b->requested) && bytes != b->size)
    return free_status::wrong_size;
  live_.erase(it);
  b->allocated = false;
  ctr_.allocated_bytes -= b->size;
  live_requested_ -= b->requested;
  b->requested = 0;
  free_block(b);
  return free_status::ok;
}

void torch_caching_emulator::free_block(block* b) {
  pool& p = *b->owner;
  try_merge(b, b->prev, p);
  try_merge(b, b->next, p);
  p.insert(b);
}

std::size_t torch_caching_emulator::try_merge(block* dst, block* src, pool& p) {
  if (!src || src->allocated || dst->mapped != src->mapped) return 0;
  if (dst->prev == src) {
    dst->ptr = src->ptr;
    dst->prev = src->prev;
    if (dst->prev) dst->prev->next = dst;
  } else {
    dst->next = src->next;
    if (dst->next) dst->next->prev = dst;
  }
  std::size_t n = src->size;
  dst->size += n;
  if (src->mapped)
    p.blocks.erase(src);
  else
    p.unmapped.erase(src);
  delete_block(src);
  return n;
}

// ---- expandable segments ---------------------------------------------------

torch_caching_emulator::block* torch_caching_emulator::find_expandable_block(stream_t s, pool& p, std::size_t size) {
  auto usable = [](const block* b) { return b && !b->allocated; };
  auto room = [&](const block* b) {
    std::size_t bytes = 0;
    while (bytes < size && usable(b)) bytes += b->size, b = b->next;
    return bytes >= size;
  };
  block key;
  key.stream = s;
  for (auto it = p.unmapped.lower_bound(&key); it != p.unmapped.end() && (*it)->stream == s; ++it) {
    block* c = *it;
    if (usable(c->prev)) c = c->prev;  // a free mapped block just before the gap grows into it
    if (room(c)) return c;
  }
  // A new segment per (stream, pool): address space for 9/8 of the device.
  // None when the request is larger than that, or no address space is left.
  const std::size_t page = p.small ? kSmallBuffer : kLargeBuffer;
  const std::size_t total = opt_.capacity ? opt_.capacity : (std::size_t{1} << 40);
  const std::size_t max_pages = (total + total / 8 + page - 1) / page;
  const std::uintptr_t base = round_up(next_addr_, page);
  if (size > max_pages * page || base >= kAddressLimit || max_pages * page > kAddressLimit - base) return nullptr;
  auto sp = std::make_unique<segment_space>();
  sp->page = page;
  sp->max_pages = max_pages;
  sp->mapped.assign(sp->max_pages, false);
  sp->base = base;
  next_addr_ = sp->base + sp->bytes();
  block* c = new_block();
  c->stream = s;
  c->size = sp->bytes();
  c->owner = &p;
  c->ptr = sp->base;
  c->mapped = false;
  c->space = sp.get();
  spaces_.push_back(std::move(sp));
  p.unmapped.insert(c);
  return c;
}

bool torch_caching_emulator::map_block(block* b, std::size_t size) {
  segment_space& sp = *b->space;
  std::size_t first = (b->ptr - sp.base) / sp.page;
  std::size_t end = (b->ptr + size - sp.base + sp.page - 1) / sp.page;
  if (first == end) return false;
  std::size_t bytes = (end - first) * sp.page;
  // cuMemCreate fails page by page and PyTorch gives back the pages it got.
  if (opt_.capacity && total_reserved_ + bytes > opt_.capacity) return false;
  for (std::size_t i = first; i < end; ++i) sp.mapped[i] = true;
  pool& p = *b->owner;
  p.unmapped.erase(b);
  b->mapped = true;
  if (bytes < b->size) {
    block* rest = new_block();
    rest->stream = b->stream;
    rest->size = b->size - bytes;
    rest->owner = &p;
    rest->ptr = b->ptr + bytes;
    rest->mapped = false;
    rest->space = b->space;
    rest->prev = b;
    rest->next = b->next;
    if (b->next) b->next->prev = rest;
    b->next = rest;
    p.unmapped.insert(rest);
    b->size = bytes;
  }
  try_merge(b, b->prev, p);
  try_merge(b, b->next, p);
  p.insert(b);
  add_reserved(bytes);
  ++ctr_.num_device_alloc;
  return true;
}

torch_caching_emulator::block* torch_caching_emulator::try_allocate_expandable(stream_t s, pool& p, std::size_t size) {
  block* c = find_expandable_block(s, p, size);
  if (!c) return nullptr;  // larger than a segment's address space: cuMemAddressReserve would fail
  if (!c->mapped && !map_block(c, std::min(c->size, size))) return nullptr;
  while (c->size < size) {
    // c is free and mapped, followed by unmapped space: map what is missing
    block* nx = c->next;
    if (!nx || !map_block(nx, std::min(size - c->size, nx->size))) return nullptr;
    c = nx;  // map_block merged c into nx
  }
  p.blocks.erase(c);
  return c;
}

void torch_caching_emulator::unmap_block(block* b) {
  segment_space& sp = *b->space;
  // only whole free pages inside the block can go
  std::size_t first = (b->ptr - sp.base + sp.page - 1) / sp.page;
  std::size_t end = (b->ptr + b->size - sp.base) / sp.page;
  if (first >= end) return;
  for (std::size_t i = first; i < end; ++i) sp.mapped[i] = false;
  std::uintptr_t uptr = sp.base + first * sp.page;
  std::size_t usize = (end - first) * sp.page;
  pool& p = *b->owner;
  p.blocks.erase(b);
  std::size_t before = uptr - b->ptr;
  if (before > 0) {
    block* f = new_block();
    f->stream = b->stream, f->size = before, f->owner = &p, f->ptr = b->ptr, f->space = b->space;
    f->prev = b->prev;
    if (b->prev) b->prev->next = f;
    f->next = b;
    b->prev = f;
    p.insert(f);
  }
  std::size_t after = b->size - before - usize;
  if (after > 0) {
    block* f = new_block();
    f->stream = b->stream, f->size = after, f->owner = &p, f->ptr = uptr + usize, f->space = b->space;
    f->next = b->next;
    if (b->next) b->next->prev = f;
    f->prev = b;
    b->next = f;
    p.insert(f);
  }
  b->ptr = uptr;
  b->size = usize;
  b->mapped = false;
  try_merge(b, b->prev, p);
  try_merge(b, b->next, p);
  p.unmapped.insert(b);
  total_reserved_ -= usize;
  ++ctr_.num_device_free;
}

void torch_caching_emulator::release_expandable_segment(block* b) {
  b->owner->unmapped.erase(b);
  auto it = std::find_if(spaces_.begin(), spaces_.end(), [&](auto& s) { return s.get() == b->space; });
  if (it != spaces_.end()) spaces_.erase(it);
  delete_block(b);
}

// ---- the rest of the contract ----------------------------------------------

void torch_caching_emulator::record_stream(void*, stream_t) {}

void torch_caching_emulator::release_cached() {
  std::lock_guard<std::mutex> lk(mu_);
  release_cached_blocks();
}

memory_state torch_caching_emulator::state() const {
  std::lock_guard<std::mutex> lk(mu_);
  memory_state s;
  s.live_bytes = ctr_.allocated_bytes;
  s.live_count = live_.size();
  s.reserved_bytes = total_reserved_;
  s.cached_bytes = total_reserved_ - ctr_.allocated_bytes;
  for (const pool* p : {large_.get(), small_.get()})
    for (const block* b : p->blocks) s.largest_free_bytes = std::max(s.largest_free_bytes, b->size);
  s.capacity_bytes = allowed_max_ ? allowed_max_ : opt_.capacity;
  s.upstream_allocs = ctr_.num_device_alloc;
  s.upstream_frees = ctr_.num_device_free;
  s.oom_count = ctr_.num_ooms;
  s.retries = ctr_.num_alloc_retries;
  s.peak_live_bytes = peak_allocated_;
  s.peak_reserved_bytes = peak_reserved_;
  return s;
}

void torch_caching_emulator::reset_peaks() {
  std::lock_guard<std::mutex> lk(mu_);
  peak_reserved_ = total_reserved_;
  peak_allocated_ = ctr_.allocated_bytes;
  ctr_.segment_peak = ctr_.segment_current;
}

std::size_t torch_caching_emulator::allocation_size(const void* ptr) const noexcept {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = live_.find(reinterpret_cast<std::uintptr_t>(ptr));
  return it == live_.end() ? 0 : it->second->size;
}

std::vector<torch_segment_info> torch_caching_emulator::segments() const {
  std::lock_guard<std::mutex> lk(mu_);
  // Heads: every mapped block whose predecessor is missing or unmapped.
  std::vector<const block*> heads;
  auto consider = [&](const block* b) {
    if (b->mapped && (!b->prev || !b->prev->mapped)) heads.push_back(b);
  };
  for (const pool* p : {large_.get(), small_.get()})
    for (const block* b : p->blocks) consider(b);
  for (auto& kv : live_) consider(kv.second);
  std::sort(heads.begin(), heads.end(), [](const block* a, const block* b) { return a->ptr < b->ptr; });
  std::vector<torch_segment_info> out;
  out.reserve(heads.size());
  for (const block* h : heads) {
    torch_segment_info s;
    s.addr = h->ptr;
    s.stream = h->stream;
    s.small_pool = h->owner->small;
    s.expandable = h->space != nullptr;
    for (const block* b = h; b && b->mapped; b = b->next) {
      s.blocks.push_back({b->ptr, b->size, b->requested, b->allocated});
      s.size += b->size;
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace vramkit::emul
