#include "vramkit/mr/pool_resource.hpp"

#include <algorithm>
#include <bit>
#include <cstring>

#include "../detail/flat_map.hpp"
#include "../detail/free_index.hpp"

namespace vramkit {

namespace {
constexpr std::size_t round_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }
}  // namespace

using detail::block;
using detail::free_index;

// One contiguous address range: the whole virtual reservation of a paged
// arena, or one segment taken from a non-paged upstream.
struct detail::arena {
  std::uintptr_t base = 0;
  std::size_t size = 0;
  bool paged = false;
  bool small = false;
  block* first = nullptr;
  // Paged only: the physical page behind each page of the range (0 = none).
  std::vector<page_handle> handles;
  std::vector<std::uint64_t> mapped_bits;
  // Paged only: the page the device maps at each page of the range. Equal
  // to handles[p] where mapped; elsewhere 0 or a kept (stale) mapping of a
  // page now in use at another address or spare (keep_mappings).
  std::vector<page_handle> phys;
  std::size_t top = 0;  // one past the highest page ever mapped
  // defer_unmap: pages moved away while work queued before their free may
  // still use this address; physically still mapped here, logically not.
  std::vector<std::uint64_t> zombie_bits;

  bool mapped(std::size_t p) const { return mapped_bits[p >> 6] >> (p & 63) & 1; }
  bool zombie(std::size_t p) const { return zombie_bits[p >> 6] >> (p & 63) & 1; }
  void set_zombie(std::size_t p, bool on) {
    if (on)
      zombie_bits[p >> 6] |= std::uint64_t{1} << (p & 63);
    else
      zombie_bits[p >> 6] &= ~(std::uint64_t{1} << (p & 63));
  }
  void set_mapped(std::size_t p, bool on) {
    if (on)
      mapped_bits[p >> 6] |= std::uint64_t{1} << (p & 63);
    else
      mapped_bits[p >> 6] &= ~(std::uint64_t{1} << (p & 63));
  }
};

namespace {

// Free blocks of one stream (slot 0: free blocks any stream may take).
struct stream_slot {
  stream_t stream = 0;
  // [0] large arena, [1] small arena.
  free_index backed[2];  // every page behind the block is mapped
  free_index hollow[2];  // some pages inside are unmapped
  block* steal_head = nullptr;  // free blocks with mapped pages wholly inside them
  block* steal_tail = nullptr;
  bool event_pending = false;
  event_id event = 0;
  std::uint64_t event_seq = 0;  // blocks freed before this are covered by `event`
  std::size_t free_blocks = 0;
};

}  // namespace

struct pool_resource::impl {
  std::shared_ptr<page_device> pages;
  std::shared_ptr<device_resource> upstream;
  std::shared_ptr<stream_ops> streams;
  pool_options opt;
  std::size_t page = 0;      // page size (paged) or segment granularity
  std::size_t capacity = 0;  // device capacity
  std::size_t limit = 0;     // reserve limit in force
  int dev = 0;

  mutable std::mutex mu;
  std::vector<detail::arena*> arenas;  // paged: [small, large]; else segments
  std::vector<stream_slot> slots;
  detail::ptr_map<block*> live;
  std::vector<block*> pending;
  std::vector<page_handle> spare_handles;  // created, in use nowhere (may keep stale mappings)
  std::size_t stale = 0;                   // kept mappings of pages not in use there
  // defer_unmap: old addresses of pages moved from the requesting stream's
  // own free blocks, unmapped once the event recorded at the move completes.
  struct deferred_unmap {
    detail::arena* a;
    std::size_t first, count;
    event_id ev;
  };
  std::vector<deferred_unmap> deferred;
  detail::block_pool blocks;

  std::size_t live_bytes = 0;
  std::size_t pending_bytes = 0;
  std::size_t reserved = 0;
  std::size_t peak_live = 0;
  std::size_t peak_reserved = 0;
  std::uint64_t free_seq = 0;
  memory_state st;  // counters only (oom_count, retries, upstream_*)
  pool_counters ctr;

  // ---- setup -------------------------------------------------------------
  void init_common() {
    opt.validate();
    slots.emplace_back();  // slot 0: shared
    limit = opt.reserve_limit ? std::min(opt.reserve_limit, capacity) : capacity;
  }

  void init_paged() {
    page = opt.page_size ? opt.page_size : pages->granularity();
    if (page % pages->granularity() != 0)
      throw invalid_argument("page_size " + std::to_string(page) +
                             " is not a multiple of the device granularity " +
                             std::to_string(pages->granularity()));
    capacity = pages->capacity();
    dev = pages->device();
    init_common();
    std::size_t va = round_up(static_cast<std::size_t>(static_cast<double>(capacity) * opt.va_factor), page);
    va = std::max(va, page * 64);
    for (bool small : {true, false}) {
      auto* a = new detail::arena;
      a->base = pages->reserve(va);
      a->size = va;
      a->paged = true;
      a->small = small;
      std::size_t np = va / page;
      a->handles.assign(np, 0);
      a->mapped_bits.assign((np + 63) / 64, 0);
      a->zombie_bits.assign((np + 63) / 64, 0);
      a->phys.assign(np, 0);
      block* b = blocks.make();
      b->addr = a->base;
      b->size = va;
      b->ar = a;
      b->unmapped = np;
      a->first = b;
      arenas.push_back(a);
      insert_free(b, 0);
    }
  }

  void init_segmented() {
    page = opt.large_rounding;
    memory_state us = upstream->state();
    capacity = us.capacity_bytes ? us.capacity_bytes : std::numeric_limits<std::size_t>::max() / 2;
    dev = upstream->device();
    init_common();
  }

  ~impl() {
    // Old addresses still waiting: unmapped without waiting (nothing may run
    // on memory of a pool being destroyed), their events given back.
    for (auto& d : deferred) streams->release(d.ev);  // their old addresses go with the rest below
    for (auto& s : slots)
      if (s.event_pending) streams->release(s.event);
    for (block* b : pending)
      for (event_id e : b->events) streams->release(e);
    // Every mapping goes before any page is destroyed: a page in use in one
    // arena may keep a stale mapping in the other.
    for (auto* a : arenas)
      if (a->paged)
        for (std::size_t p = 0; p < a->top;) {
          if (!a->phys[p]) {
            ++p;
            continue;
          }
          std::size_t e = p;
          while (e < a->top && a->phys[e]) ++e;
          pages->unmap(a->base + p * page, e - p);
          p = e;
        }
    for (auto* a : arenas) {
      if (a->paged) {
        for (std::size_t p = 0; p < a->top; ++p)
          if (a->handles[p]) pages->destroy(a->handles[p]);
        pages->unreserve(a->base, a->size);
      } else {
        upstream->deallocate(reinterpret_cast<void*>(a->base), a->size, 0);
      }
      delete a;
    }
    for (auto h : spare_handles) pages->destroy(h);
  }

  // ---- slots -------------------------------------------------------------
  std::uint32_t slot_for(stream_t s) {
    for (std::uint32_t i = 1; i < slots.size(); ++i)
      if (slots[i].stream == s) return i;
    slots.emplace_back();
    slots.back().stream = s;
    return static_cast<std::uint32_t>(slots.size() - 1);
  }

  // ---- page arithmetic ---------------------------------------------------
  std::size_t first_page(const block* b) const { return (b->addr - b->ar->base) / page; }
  std::size_t last_page(const block* b) const { return (b->addr + b->size - 1 - b->ar->base) / page; }
  // Pages lying wholly inside [addr, addr+size).
  std::size_t interior_pages(const block* b) const {
    if (!b->ar->paged) return 0;
    std::size_t lo = round_up(b->addr - b->ar->base, page) / page;
    std::size_t hi = (b->addr + b->size - b->ar->base) / page;
    return hi > lo ? hi - lo : 0;
  }
  bool stealable(const block* b) const { return b->ar->paged && interior_pages(b) > b->unmapped; }

  // ---- free index --------------------------------------------------------
  void steal_link(block* b, stream_slot& s) {
    b->in_steal = true;
    b->sprev = s.steal_tail;
    b->snext = nullptr;
    if (s.steal_tail)
      s.steal_tail->snext = b;
    else
      s.steal_head = b;
    s.steal_tail = b;
  }
  void steal_unlink(block* b, stream_slot& s) {
    if (!b->in_steal) return;
    if (b->sprev)
      b->sprev->snext = b->snext;
    else
      s.steal_head = b->snext;
    if (b->snext)
      b->snext->sprev = b->sprev;
    else
      s.steal_tail = b->sprev;
    b->in_steal = false;
    b->sprev = b->snext = nullptr;
  }

  void insert_free(block* b, std::uint32_t slot) {
    auto& s = slots[slot];
    b->state = block::free_state;
    b->slot = slot;
    b->hollow = b->unmapped > 0;
    (b->hollow ? s.hollow : s.backed)[b->ar->small].insert(b);
    if (stealable(b)) steal_link(b, s);
    ++s.free_blocks;
  }
  void remove_free(block* b) {
    auto& s = slots[b->slot];
    (b->hollow ? s.hollow : s.backed)[b->ar->small].remove(b);
    steal_unlink(b, s);
    --s.free_blocks;
  }

  // Frees b into `slot`, merging with free neighbours of the same slot.
  void make_free(block* b, std::uint32_t slot, std::uint64_t seq) {
    b->requested = 0;
    b->seq = seq;
    if (block* p = b->prev; p && p->state == block::free_state && p->slot == slot) {
      remove_free(p);
      p->size += b->size;
      p->unmapped += b->unmapped;
      p->seq = std::max(p->seq, b->seq);
      p->next = b->next;
      if (b->next) b->next->prev = p;
      blocks.recycle(b);
      b = p;
    }
    if (block* n = b->next; n && n->state == block::free_state && n->slot == slot) {
      remove_free(n);
      b->size += n->size;
      b->unmapped += n->unmapped;
      b->seq = std::max(b->seq, n->seq);
      b->next = n->next;
      if (n->next) n->next->prev = b;
      blocks.recycle(n);
    }
    insert_free(b, slot);
  }

  block* find_fit(std::size_t size, bool small, std::uint32_t slot, bool hollow) {
    const std::uint32_t order[2] = {slot, 0};
    const int n = slot == 0 ? 1 : 2;
    // The tighter of the stream's own fit and the shared one (lower address on ties).
    block* best = nullptr;
    for (int i = 0; i < n; ++i) {
      auto& s = slots[order[i]];
      auto& idx = (hollow ? s.hollow : s.backed)[small];
      if (block* b = idx.find(size)) {
        if (!best || b->size < best->size || (b->size == best->size && b->addr < best->addr)) best = b;
        if (best->size == size) break;
      }
    }
    return best;
  }

  block* find_fit_exhaustive(std::size_t size, bool small, std::uint32_t slot) {
    const std::uint32_t order[2] = {slot, 0};
    const int n = slot == 0 ? 1 : 2;
    for (int i = 0; i < n; ++i)
      if (block* b = slots[order[i]].backed[small].find_in_bin(size)) return b;
    return nullptr;
  }

  // ---- physical pages ----------------------------------------------------
  bool may_grow(std::size_t need_live) const {
    if (reserved + page > limit) return false;
    if (!opt.remap) return true;
    return static_cast<double>(reserved + page) <=
           (1.0 + opt.growth_slack) * static_cast<double>(std::max(need_live, peak_live));
  }

  page_handle create_page() {
    page_handle h = pages->create();
    if (h) {
      reserved += page;
      peak_reserved = std::max(peak_reserved, reserved);
      ++ctr.pages_created;
      ++st.upstream_allocs;
      st.upstream_alloc_bytes += page;
    }
    return h;
  }

  // The highest mapped page in [lo, hi], or lo when none is (a word at a time).
  static std::size_t last_mapped_page(const detail::arena* a, std::size_t lo, std::size_t hi) {
    std::size_t p = hi + 1;
    while (p > lo) {
      std::size_t w = (p - 1) >> 6;
      std::uint64_t bits = a->mapped_bits[w];
      std::size_t top = (p - 1) & 63;
      bits &= top == 63 ? ~std::uint64_t{0} : ((std::uint64_t{1} << (top + 1)) - 1);
      if (bits) {
        std::size_t q = (w << 6) + 63 - static_cast<std::size_t>(std::countl_zero(bits));
        return q >= lo ? q : lo;
      }
      p = w << 6;
    }
    return lo;
  }

  static constexpr int steal_scan = 32;

  // Takes up to `want` mapped pages wholly inside a stealable free
  // block of `slot` (one contiguous run, from its high end; unmapped in one
  // call, or kept mapped there with keep_mappings) and
  // appends their physical pages to out. Returns how many it took.
  std::size_t steal(std::uint32_t slot, std::size_t want, std::vector<page_handle>& out, bool defer = false) {
    auto& s = slots[slot];
    block* b = s.steal_head;
    if (!b || want == 0) return 0;
    // From the free block with the fewest mapped pages inside among the
    // oldest `steal_scan` (the oldest of equals): small scattered pieces go
    // first, long mapped runs stay whole for the large blocks that need them.
    std::size_t least = interior_pages(b) - b->unmapped;
    int looked = 0;
    for (block* c = b->snext; c && least > 1 && ++looked < steal_scan; c = c->snext) {
      std::size_t m = interior_pages(c) - c->unmapped;
      if (m < least) {
        least = m;
        b = c;
      }
    }
    detail::arena* a = b->ar;
    std::size_t lo = round_up(b->addr - a->base, page) / page;
    std::size_t hi = (b->addr + b->size - a->base) / page;
    if (hi <= lo) return 0;  // cannot happen while invariants hold
    std::size_t p = last_mapped_page(a, lo, hi - 1);
    if (p < lo || p >= hi || !a->mapped(p)) return 0;  // cannot happen while invariants hold
    std::size_t first = p;
    while (first > lo && a->mapped(first - 1) && p + 1 - first < want) --first;
    std::size_t k = p + 1 - first;
    if (defer) {
      deferred.push_back({a, first, k, streams->record(s.stream)});
      // The block keeps the pages' old addresses: it reaches other streams
      // only through an event recorded after this one, when they are gone.
      b->seq = ++free_seq;
      for (std::size_t q = first; q <= p; ++q) a->set_zombie(q, true);
      ctr.pages_deferred += k;
      stale += k;
    } else if (opt.keep_mappings) {
      stale += k;  // still mapped there, no longer in use there
    } else {
      pages->unmap(a->base + first * page, k);
      for (std::size_t q = first; q <= p; ++q) a->phys[q] = 0;
      ctr.pages_unmapped += k;
    }
    for (std::size_t q = first; q <= p; ++q) {
      out.push_back(a->handles[q]);
      a->handles[q] = 0;
      a->set_mapped(q, false);
    }
    ctr.pages_remapped += k;
    (b->hollow ? s.hollow : s.backed)[b->ar->small].remove(b);
    b->unmapped += k;
    b->hollow = true;
    s.hollow[b->ar->small].insert(b);
    if (!stealable(b)) steal_unlink(b, s);
    return k;
  }

  void finish_deferred(std::size_t i) {
    deferred_unmap d = deferred[i];
    // Its stream's work is done: the old mapping becomes an ordinary kept one.
    if (!opt.keep_mappings) {
      pages->unmap(d.a->base + d.first * page, d.count);
      for (std::size_t q = d.first; q < d.first + d.count; ++q) d.a->phys[q] = 0;
      stale -= d.count;
      ctr.pages_unmapped += d.count;
    }
    for (std::size_t q = d.first; q < d.first + d.count; ++q) d.a->set_zombie(q, false);
    streams->release(d.ev);
    deferred[i] = deferred.back();
    deferred.pop_back();
  }

  // Ends the wait of old addresses whose stream work is done (unmapped, or
  // kept as ordinary stale mappings with keep_mappings).
  void flush_deferred() {
    for (std::size_t i = 0; i < deferred.size();)
      if (streams->done(deferred[i].ev))
        finish_deferred(i);
      else
        ++i;
  }

  // Before pages are mapped in [p0, p1] of arena a: old mappings there go
  // first, after their stream's work (waiting for it if need be).
  void clear_zombies(detail::arena* a, std::size_t p0, std::size_t p1) {
    for (std::size_t i = 0; i < deferred.size();) {
      deferred_unmap& d = deferred[i];
      if (d.a != a || d.first > p1 || d.first + d.count <= p0) {
        ++i;
        continue;
      }
      if (!streams->done(d.ev)) {
        streams->wait(d.ev);
        ++ctr.deferred_waits;
      }
      finish_deferred(i);
    }
  }

  // Old addresses waiting since entry `mark` end their wait now, after their
  // stream's work (a page about to become a spare may keep stale mappings,
  // but none that queued work may still use).
  void settle_deferred(std::size_t mark) noexcept {
    while (deferred.size() > mark) {
      try {
        if (!streams->done(deferred.back().ev)) streams->wait(deferred.back().ev);
      } catch (...) {
      }
      finish_deferred(deferred.size() - 1);
    }
  }

  // Destroys pages given back to the device, unmapping first the stale
  // mappings they keep (a page's memory is freed only once it is mapped
  // nowhere).
  void drop_pages(const std::vector<page_handle>& hs) noexcept {
    if (hs.empty()) return;
    if (stale) {
      settle_deferred(0);  // no old address that queued work may still use is unmapped under it
      thread_local std::vector<page_handle> sorted;
      sorted.assign(hs.begin(), hs.end());
      std::sort(sorted.begin(), sorted.end());
      auto kept = [&](const detail::arena* a, std::size_t p) {
        return a->phys[p] && !a->mapped(p) && std::binary_search(sorted.begin(), sorted.end(), a->phys[p]);
      };
      for (auto* a : arenas) {
        if (!a->paged) continue;
        for (std::size_t p = 0; p < a->top;) {
          if (!kept(a, p)) {
            ++p;
            continue;
          }
          std::size_t e = p;
          while (e < a->top && kept(a, e)) ++e;
          pages->unmap(a->base + p * page, e - p);
          for (std::size_t q = p; q < e; ++q) a->phys[q] = 0;
          stale -= e - p;
          ctr.pages_unmapped += e - p;
          p = e;
        }
      }
    }
    for (auto h : hs) pages->destroy(h);
  }

  // Gets n physical pages for a block that will hold `need_live` live bytes.
  // The first `clean` of them are never pages moved with their old address
  // still mapped (defer_unmap): they go where the block shares a page with
  // its neighbours, which other streams may reach.
  // Only pages of blocks whose stream work is known complete (the shared
  // slot) are remapped without waiting; the requester's own stream is waited
  // for only when the device is otherwise full (or, with wait_to_remap,
  // before growing past the slack).
  bool acquire(std::size_t n, std::size_t need_live, std::uint32_t slot, std::vector<page_handle>& out,
               std::size_t clean = 0) {
    out.clear();
    try {
      if (acquire_some(n, need_live, slot, out, clean)) return true;
    } catch (...) {
      // Pages taken so far stay with the pool as spares: nothing leaks. No
      // spare keeps an old address that queued work may still use: every one
      // still waiting ends its wait first (not only this call's: a page taken
      // here may have been moved with its old address kept by an earlier call).
      settle_deferred(0);
      spare_handles.insert(spare_handles.end(), out.begin(), out.end());
      out.clear();
      throw;
    }
    settle_deferred(0);
    spare_handles.insert(spare_handles.end(), out.begin(), out.end());
    out.clear();
    return false;
  }

  bool acquire_some(std::size_t n, std::size_t need_live, std::uint32_t slot, std::vector<page_handle>& out,
                    std::size_t clean) {
    bool reclaimed = false, waited = false;
    // Pages of the requester's own free blocks, once its stream's queued work is done.
    auto wait_and_steal_own = [&] {
      if (!opt.remap || slot == 0 || !slots[slot].steal_head) return false;
      if (!waited) {
        streams->wait_for_stream(slots[slot].stream);
        waited = true;
      }
      return steal(slot, n - out.size(), out) > 0;
    };
    while (out.size() < n) {
      if (!spare_handles.empty()) {
        out.push_back(spare_handles.back());
        spare_handles.pop_back();
        continue;
      }
      if (may_grow(need_live)) {
        if (page_handle h = create_page()) {
          out.push_back(h);
          continue;
        }
      }
      if (opt.remap) {
        if (steal(0, n - out.size(), out)) continue;
        if (!reclaimed) {
          reclaimed = true;
          if (reclaim_streams(false)) continue;
        }
      }
      // defer_unmap: the requester's own stream freed these; its later work
      // runs after the work that used them, so they can serve it at once, and
      // only their old addresses wait to be unmapped.
      if (opt.remap && opt.defer_unmap && slot != 0 && out.size() >= clean && slots[slot].steal_head &&
          steal(slot, n - out.size(), out, true))
        continue;
      if (opt.wait_to_remap && wait_and_steal_own()) continue;  // rather than grow
      if (reserved + page <= limit) {
        if (page_handle h = create_page()) {
          out.push_back(h);
          continue;
        }
      }
      if (wait_and_steal_own()) continue;  // the device is full otherwise
      return false;  // acquire() puts what was taken back
    }
    return true;
  }

  // Maps every unmapped page overlapping [addr, addr+size) of arena a.
  bool back(detail::arena* a, std::uintptr_t addr, std::size_t size, std::size_t need_live,
            std::uint32_t slot, std::size_t& newly) {
    std::size_t p0 = (addr - a->base) / page, p1 = (addr + size - 1 - a->base) / page;
    std::size_t n = 0;
    for (std::size_t p = p0; p <= p1; ++p) n += !a->mapped(p);
    newly = n;
    if (n == 0) return true;
    if (!deferred.empty()) {
      flush_deferred();
      clear_zombies(a, p0, p1);
    }
    // Pages the block shares with its neighbours (partly covered) get clean pages.
    auto inside = [&](std::size_t p) {
      return a->base + p * page >= addr && a->base + (p + 1) * page <= addr + size;
    };
    const bool edge0 = !inside(p0) && !a->mapped(p0);
    const bool edge1 = p1 != p0 && !inside(p1) && !a->mapped(p1);
    const std::size_t clean = std::size_t{edge0} + std::size_t{edge1};
    thread_local std::vector<page_handle> got, hs;
    if (!acquire(n, need_live, slot, got, clean)) return false;
    // In page order: the clean ones at the edges, the rest in between.
    hs.clear();
    {
      std::size_t c = 0, r = clean;
      for (std::size_t p = p0; p <= p1; ++p)
        if (!a->mapped(p)) hs.push_back(((p == p0 && edge0) || (p == p1 && edge1)) ? got[c++] : got[r++]);
    }
    if (stale) return_home(a, p0, p1, edge0, edge1, hs);
    std::size_t k = 0;  // pages of hs placed so far
    std::size_t p = p0;
    try {
      while (p <= p1) {
        if (a->mapped(p)) {
          ++p;
          continue;
        }
        // A page coming back where it is still mapped costs nothing; the
        // others replace what stale mapping is there.
        std::size_t run = p;
        while (run <= p1 && !a->mapped(run) && (a->phys[run] == hs[k + (run - p)]) == (a->phys[p] == hs[k]))
          ++run;
        for (std::size_t q = p; q < run; ++q) a->handles[q] = hs[k + (q - p)];
        if (a->phys[p] == hs[k]) {
          stale -= run - p;
          ctr.mappings_reused += run - p;
        } else {
          const bool replaces = pages->map_replaces();
          for (std::size_t q = p; q < run;) {
            if (!a->phys[q]) {
              ++q;
              continue;
            }
            std::size_t e = q;
            while (e < run && a->phys[e]) a->phys[e++] = 0;
            if (!replaces) pages->unmap(a->base + q * page, e - q);  // else the map below replaces them
            stale -= e - q;
            ctr.pages_unmapped += e - q;
            q = e;
          }
          pages->map(a->base + p * page, &hs[k], run - p);
          for (std::size_t q = p; q < run; ++q) a->phys[q] = hs[k + (q - p)];
          a->top = std::max(a->top, run);
          ctr.pages_mapped += run - p;
          ++ctr.map_calls;
        }
        for (std::size_t q = p; q < run; ++q) a->set_mapped(q, true);
        k += run - p;
        p = run;
      }
    } catch (...) {
      // Undo this call: the pages placed so far keep their new mappings as
      // stale ones and go back to the spares with the rest; the pool stays
      // as it was, then rethrow.
      for (std::size_t q = p0; q < p; ++q)
        if (a->mapped(q) && std::find(hs.begin(), hs.begin() + k, a->handles[q]) != hs.begin() + k) {
          a->set_mapped(q, false);
          if (opt.keep_mappings) {
            ++stale;
          } else {
            pages->unmap(a->base + q * page, 1);
            a->phys[q] = 0;
          }
        }
      for (std::size_t q = p0; q <= p1; ++q)
        if (!a->mapped(q)) a->handles[q] = 0;
      settle_deferred(0);
      spare_handles.insert(spare_handles.end(), hs.begin(), hs.end());
      throw;
    }
    return true;
  }

  // Puts each page of hs (placed in page order over the unmapped pages of
  // [p0, p1]) where it is still mapped, if that is one of those pages.
  // The clean pages at the edges stay where they are.
  static void return_home(const detail::arena* a, std::size_t p0, std::size_t p1, bool edge0, bool edge1,
                          std::vector<page_handle>& hs) {
    thread_local std::vector<std::pair<page_handle, std::size_t>> where;  // page -> index in hs
    thread_local std::vector<std::size_t> slot_of;                        // index in hs -> page of the arena
    where.clear();
    slot_of.clear();
    for (std::size_t p = p0; p <= p1; ++p)
      if (!a->mapped(p)) slot_of.push_back(p);
    const std::size_t lo = edge0 ? 1 : 0, hi = hs.size() - (edge1 && hs.size() > lo ? 1 : 0);
    for (std::size_t i = lo; i < hi; ++i) where.emplace_back(hs[i], i);
    std::sort(where.begin(), where.end());
    for (std::size_t i = lo; i < hi; ++i) {
      page_handle want = a->phys[slot_of[i]];
      if (!want || want == hs[i]) continue;
      auto it = std::lower_bound(where.begin(), where.end(), std::make_pair(want, std::size_t{0}));
      if (it == where.end() || it->first != want) continue;
      std::size_t j = it->second;
      if (a->phys[slot_of[j]] == want) continue;  // already home there
      // hs[j] goes home to i; what was at i moves to j.
      auto jt = std::lower_bound(where.begin(), where.end(), std::make_pair(hs[i], std::size_t{0}));
      jt->second = j;
      it->second = i;
      std::swap(hs[i], hs[j]);
    }
  }

  // ---- segments (non-paged upstreams) -------------------------------------
  bool grow_segment(std::size_t size, bool small, stream_t stream) {
    std::size_t seg = small ? std::max(opt.small_segment, size) : round_up(size, opt.large_rounding);
    if (reserved + seg > limit) return false;
    void* p = nullptr;
    try {
      p = upstream->allocate(seg, stream);
    } catch (const out_of_memory&) {
      return false;
    }
    if (!p) return false;
    auto* a = new detail::arena;
    a->base = reinterpret_cast<std::uintptr_t>(p);
    a->size = seg;
    a->small = small;
    block* b = blocks.make();
    b->addr = a->base;
    b->size = seg;
    b->ar = a;
    a->first = b;
    arenas.push_back(a);
    reserved += seg;
    peak_reserved = std::max(peak_reserved, reserved);
    ++ctr.segments_allocated;
    ++st.upstream_allocs;
    st.upstream_alloc_bytes += seg;
    insert_free(b, 0);
    return true;
  }

  std::size_t release_free_segments() {
    std::size_t released = 0;
    for (std::size_t i = 0; i < arenas.size();) {
      detail::arena* a = arenas[i];
      block* b = a->first;
      if (!a->paged && b->state == block::free_state && b->size == a->size) {
        remove_free(b);
        blocks.recycle(b);
        upstream->deallocate(reinterpret_cast<void*>(a->base), a->size, 0);
        reserved -= a->size;
        released += a->size;
        ++ctr.segments_freed;
        ++st.upstream_frees;
        st.upstream_free_bytes += a->size;
        delete a;
        arenas.erase(arenas.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
    return released;
  }

  // ---- streams -----------------------------------------------------------
  void process_pending(bool wait) {
    for (std::size_t i = 0; i < pending.size();) {
      block* b = pending[i];
      bool ready = true;
      for (event_id e : b->events) {
        if (wait)
          streams->wait(e);
        else if (!streams->done(e)) {
          ready = false;
          break;
        }
      }
      if (!ready) {
        ++i;
        continue;
      }
      for (event_id e : b->events) streams->release(e);
      b->events.clear();
      b->extra_streams.clear();
      pending_bytes -= b->size;
      pending[i] = pending.back();
      pending.pop_back();
      make_free(b, slot_for(b->stream), ++free_seq);
    }
  }

  // Hands free blocks of other streams to all streams once their work is done.
  bool reclaim_streams(bool wait) {
    bool moved = false;
    for (std::uint32_t i = 1; i < slots.size(); ++i) {
      auto& s = slots[i];
      // Waiting, a second round covers what was freed after a pending event
      // was recorded: after it the slot holds nothing.
      for (int round = 0; round < (wait ? 2 : 1); ++round) {
        if (s.free_blocks == 0) break;
        if (!s.event_pending) {
          s.event = streams->record(s.stream);
          s.event_seq = free_seq;
          s.event_pending = true;
        }
        if (wait)
          streams->wait(s.event);
        else if (!streams->done(s.event))
          break;
        streams->release(s.event);
        s.event_pending = false;
        std::vector<block*> take;
        for (auto* idx : {&s.backed[0], &s.backed[1], &s.hollow[0], &s.hollow[1]})
          idx->for_each([&](block* b) {
            if (b->seq <= s.event_seq) take.push_back(b);
          });
        for (block* b : take) {
          remove_free(b);
          make_free(b, 0, b->seq);
          moved = true;
        }
        ctr.stream_reclaims += take.size();
      }
    }
    return moved;
  }

  // ---- allocate / free ---------------------------------------------------
  void* allocate(std::size_t bytes, stream_t stream) {
    if (bytes == 0) return nullptr;
    std::lock_guard<std::mutex> lk(mu);
    if (bytes > limit) throw_oom(bytes, "the request is larger than the ");
    std::size_t size = round_up(bytes, opt.alignment);
    bool small = size <= opt.small_threshold;
    std::uint32_t slot = slot_for(stream);
    if (!pending.empty()) process_pending(false);
    if (block* b = try_place(size, small, slot, stream)) return finish(b, bytes, stream);
    // Slow path: take other streams' finished frees, then wait for them,
    // then give back everything cached, before declaring out of memory.
    ++st.retries;
    if (reclaim_streams(false))
      if (block* b = try_place(size, small, slot, stream)) return finish(b, bytes, stream);
    if (!pending.empty()) process_pending(true);
    reclaim_streams(true);
    settle_deferred(0);
    if (!upstream) {
      drop_pages(spare_handles);
      for (std::size_t i = 0; i < spare_handles.size(); ++i) {
        reserved -= page;
        ++ctr.pages_destroyed;
        ++st.upstream_frees;
        st.upstream_free_bytes += page;
      }
      spare_handles.clear();
    } else {
      release_free_segments();
    }
    if (block* b = try_place(size, small, 0, stream)) return finish(b, bytes, stream);
    ++st.oom_count;
    throw_oom(bytes, "");
  }

  // Unmapped pages lying wholly inside [addr, addr+size) of arena a.
  std::size_t unmapped_inside(const detail::arena* a, std::uintptr_t addr, std::size_t size) const {
    std::size_t lo = round_up(addr - a->base, page) / page;
    std::size_t hi = (addr + size - a->base) / page;
    if (hi <= lo) return 0;
    // Mapped pages counted a word at a time (a free block can span the whole arena).
    std::size_t mapped = 0;
    for (std::size_t w = lo >> 6; w <= (hi - 1) >> 6; ++w) {
      std::uint64_t bits = a->mapped_bits[w];
      if (w == lo >> 6) bits &= ~std::uint64_t{0} << (lo & 63);
      if (w == (hi - 1) >> 6 && ((hi - 1) & 63) != 63) bits &= (std::uint64_t{1} << (((hi - 1) & 63) + 1)) - 1;
      mapped += static_cast<std::size_t>(std::popcount(bits));
    }
    return (hi - lo) - mapped;
  }

  // What mapping page p for a new block costs: nothing if mapped, one page if
  // not, more if its old mapping still waits for a stream (defer_unmap:
  // placing there may mean waiting for the GPU).
  static std::size_t page_cost(const detail::arena* a, std::size_t p) {
    return a->mapped(p) ? 0 : a->zombie(p) ? 4 : 1;
  }

  // Free blocks the requester of `slot` may take together with its own: its
  // stream's and the shared slot's (adjacent free blocks of one slot are
  // always merged, so a run alternates between the two).
  static bool runs_with(const block* x, std::uint32_t slot) {
    return x && x->state == block::free_state && (x->slot == slot || x->slot == 0);
  }

  // The free block with unmapped pages, and the place inside it, where a block
  // of `size` needs the fewest new pages (a rare path: every hollow candidate
  // of the two slots is looked at).
  block* best_hollow(std::size_t size, bool small, std::uint32_t slot, std::uintptr_t& at, std::size_t& best_cost) {
    block* best = nullptr;
    best_cost = ~std::size_t{0};
    const std::uint32_t order[2] = {slot, 0};
    const int n = slot == 0 ? 1 : 2;
    for (int i = 0; i < n; ++i) {
      slots[order[i]].hollow[small].for_each([&](block* b) {
        if (b->size < size || best_cost == 0) return;
        const detail::arena* a = b->ar;
        auto pages_of = [&](std::uintptr_t x, std::size_t& p0, std::size_t& p1) {
          p0 = (x - a->base) / page;
          p1 = (x + size - 1 - a->base) / page;
        };
        auto consider = [&](std::uintptr_t x, std::size_t cost) {
          if (cost < best_cost || (cost == best_cost && best && b->size < best->size)) {
            best = b;
            best_cost = cost;
            at = x;
          }
        };
        // At the block's start.
        std::size_t p0, p1;
        pages_of(b->addr, p0, p1);
        std::size_t c = 0;
        for (std::size_t p = p0; p <= p1; ++p) c += page_cost(a, p);
        consider(b->addr, c);
        // Against the block that follows (the gap's far end), when that needs
        // fewer new pages: the block then shares that neighbour's partly used
        // page instead of leaving a gap in it.
        if (b->next && b->size > size) {
          std::uintptr_t e = b->addr + b->size - size;
          std::size_t q0, q1, ce = 0;
          pages_of(e, q0, q1);
          for (std::size_t p = q0; p <= q1; ++p) ce += page_cost(a, p);
          if (ce < best_cost) {
            best = b;
            best_cost = ce;
            at = e;
          }
        }
        // At each page boundary inside, sliding the window one page at a time,
        // up to the last mapped page (past it every place costs the whole window).
        std::uintptr_t last_start = b->addr + b->size - size;
        std::uintptr_t x = (b->addr - a->base + page - 1) / page * page + a->base;
        if (x == b->addr) x += page;
        if (x > last_start) return;
        std::size_t hi_page = (b->addr + b->size - 1 - a->base) / page;
        std::size_t last_mapped = last_mapped_page(a, p0, hi_page);
        pages_of(x, p0, p1);
        c = 0;
        for (std::size_t p = p0; p <= p1; ++p) c += page_cost(a, p);
        while (true) {
          consider(x, c);
          if (best_cost == 0 || x + page > last_start || p0 > last_mapped) break;
          c -= page_cost(a, p0);
          x += page;
          std::size_t q0, q1;
          pages_of(x, q0, q1);
          for (std::size_t p = p1 + 1; p <= q1; ++p) c += page_cost(a, p);
          p0 = q0;
          p1 = q1;
        }
      });
    }
    return best;
  }

  // When every place inside one free block needs new pages: places reaching
  // from a hollow block into the free blocks next to it that the requester
  // may also use (its own stream's and shared ones, see runs_with), at the
  // start and at the end of such a run. A block at the edge of mapped memory
  // then takes the free pages below the edge instead of only fresh ones past
  // it. Returns a block of the run, with `at`, when cheaper than `best_cost`.
  block* best_run(std::size_t size, bool small, std::uint32_t slot, std::uintptr_t& at, std::size_t best_cost) {
    block* best = nullptr;
    if (slot == 0) return nullptr;
    const std::uint32_t order[2] = {slot, 0};
    for (std::uint32_t sl : order) {
      slots[sl].hollow[small].for_each([&](block* b) {
        if (best_cost == 0) return;
        const bool before = runs_with(b->prev, slot), past = runs_with(b->next, slot);
        if (!before && !past) return;
        std::uintptr_t lo = b->addr, hi = b->addr + b->size;
        for (const block* x = b->prev; runs_with(x, slot); x = x->prev) lo = x->addr;
        const block* after = b->next;
        while (runs_with(after, slot)) {
          hi = after->addr + after->size;
          after = after->next;
        }
        if (hi - lo < size) return;
        const detail::arena* a = b->ar;
        auto cost_at = [&](std::uintptr_t x) {
          std::size_t c = 0;
          for (std::size_t p = (x - a->base) / page, e = (x + size - 1 - a->base) / page; p <= e; ++p)
            c += page_cost(a, p);
          return c;
        };
        for (std::uintptr_t x : {lo, hi - size}) {
          std::size_t c = cost_at(x);
          if (c < best_cost) {
            best = b;
            best_cost = c;
            at = x;
          }
        }
      });
    }
    return best;
  }

  // Joins the neighbouring blocks first..last (out of every free index) into
  // first; its unmapped count is left for the caller to set.
  block* join(block* first, block* last) {
    while (first != last) {
      block* nx = first->next;
      first->size += nx->size;
      first->seq = std::max(first->seq, nx->seq);
      first->next = nx->next;
      if (nx->next) nx->next->prev = first;
      if (nx == last) last = first;
      blocks.recycle(nx);
    }
    return first;
  }

  // Cuts [at, at+size) out of the run of free blocks around b that the
  // requester of `slot` may take (see runs_with), for a place best_run found
  // reaching past b: the pieces inside become one free block of `slot`, the
  // parts outside stay free where they were (their slots unchanged).
  block* carve_run(block* b, std::uintptr_t at, std::size_t size, std::uint32_t slot) {
    block* f = b;  // the block holding `at`: before b, in b or after it
    while (f->addr > at) f = f->prev;
    while (f->addr + f->size <= at) f = f->next;
    block* l = f;
    while (l->addr + l->size < at + size) l = l->next;
    for (block* x = f;; x = x->next) {
      remove_free(x);
      if (x == l) break;
    }
    detail::arena* a = b->ar;
    auto cut = [&](block* x, std::uintptr_t c) {  // x keeps [addr, c); returns [c, end)
      block* r = blocks.make();
      r->addr = c;
      r->size = x->addr + x->size - c;
      r->ar = a;
      r->prev = x;
      r->next = x->next;
      if (x->next) x->next->prev = r;
      x->next = r;
      x->size = c - x->addr;
      r->seq = x->seq;
      r->slot = x->slot;
      r->state = block::free_state;
      return r;
    };
    block* left = nullptr;
    block* right = nullptr;
    if (f->addr < at) {
      left = f;
      f = cut(f, at);
      if (l == left) l = f;
    }
    if (l->addr + l->size > at + size) right = cut(l, at + size);
    block* m = join(f, l);
    for (block* x : {left, right, m}) {
      if (!x) continue;
      x->unmapped = unmapped_inside(a, x->addr, x->size);
      insert_free(x, x == m ? slot : x->slot);
    }
    return m;
  }

  // A carved place could not be backed: it and the run around it become one
  // free block of the requester (edges that shared an unmapped page with it
  // are inside again).
  void uncarve(block* b, std::uint32_t slot) {
    block* first = b;
    while (runs_with(first->prev, slot)) first = first->prev;
    block* last = b;
    while (runs_with(last->next, slot)) last = last->next;
    for (block* x = first;; x = x->next) {
      if (x != b) remove_free(x);
      if (x == last) break;
    }
    block* m = join(first, last);
    m->unmapped = unmapped_inside(m->ar, m->addr, m->size);
    insert_free(m, slot);
  }

  block* try_place(std::size_t size, bool small, std::uint32_t slot, stream_t stream) {
    block* b = find_fit(size, small, slot, false);
    // Before taking fresh pages, let other streams' finished frees serve.
    if (!b && slots.size() > 2 && reclaim_streams(false)) b = find_fit(size, small, slot, false);
    // Every block of the request's own bin, before mapping anything new.
    if (!b) b = find_fit_exhaustive(size, small, slot);
    // Hollow space: where the fewest pages must be mapped.
    std::uintptr_t at = 0;
    if (!b && upstream) b = find_fit(size, small, slot, true);
    if (!b && !upstream) {
      std::size_t cost = 0;
      b = best_hollow(size, small, slot, at, cost);  // cost: all ones when none fits
      if (cost > 0)
        if (block* r = best_run(size, small, slot, at, cost)) b = r;
    }
    if (!b && upstream) {
      if (!grow_segment(size, small, stream)) return nullptr;
      b = find_fit(size, small, slot, false);
    }
    if (!b) return nullptr;
    const bool carved = at && (at < b->addr || at + size > b->addr + b->size);
    if (carved) {
      b = carve_run(b, at, size, slot);
      at = b->addr;
    }
    std::uint32_t from = b->slot;
    remove_free(b);
    detail::arena* a = b->ar;
    const bool split_left = at > b->addr;
    if (split_left) {
      // Placed inside the free block: the part before it stays free.
      block* l = blocks.make();
      l->addr = b->addr;
      l->size = at - b->addr;
      l->ar = a;
      l->prev = b->prev;
      l->next = b;
      if (b->prev) b->prev->next = l; else a->first = l;
      b->prev = l;
      l->seq = b->seq;
      l->unmapped = unmapped_inside(a, l->addr, l->size);
      b->unmapped -= l->unmapped;
      b->size -= l->size;
      b->addr = at;
      insert_free(l, from);
    }
    // Not free while being placed: a merge triggered below must not absorb it.
    b->state = block::live_state;
    std::size_t un_l = 0;  // unmapped pages under the part handed out
    if (a->paged) {
      std::size_t p0 = (b->addr - a->base) / page, p1 = (b->addr + size - 1 - a->base) / page;
      for (std::size_t p = p0; p <= p1; ++p) un_l += !a->mapped(p);
    }
    // Split first, so the remainder's mapped pages can be remapped under the
    // new block instead of growing. The remainder keeps b's slot.
    const bool split = b->size - size >= opt.alignment;
    if (split) {
      block* r = blocks.make();
      r->addr = b->addr + size;
      r->size = b->size - size;
      r->ar = a;
      r->prev = b;
      r->next = b->next;
      if (b->next) b->next->prev = r;
      b->next = r;
      r->unmapped = b->unmapped - un_l;
      r->seq = b->seq;
      b->size = size;
      insert_free(r, from);
    }
    if (un_l) {
      // On failure b is free again, where it came from. While pages were
      // being found, a part cut off above (after it, or before it when the
      // two share a page) may have been handed to the shared slot (its
      // stream's work was done; b was freed at the same time): then b goes
      // there too, so the page they share is inside one free block again.
      auto put_back = [&] {
        if (carved) {
          b->state = block::free_state;
          uncarve(b, from);
          return;
        }
        b->unmapped = un_l;
        std::uint32_t to = from;
        if (split && b->next && b->next->state == block::free_state && b->next->slot != from)
          to = b->next->slot;
        else if (split_left && b->prev && b->prev->state == block::free_state && b->prev->slot != from)
          to = b->prev->slot;  // (only one side can share a page: see best_hollow)
        make_free(b, to, b->seq);
      };
      bool ok = false;
      std::size_t newly = 0;
      try {
        ok = back(a, b->addr, size, live_bytes + size, slot, newly);
      } catch (...) {
        put_back();
        throw;
      }
      if (!ok) {
        put_back();
        return nullptr;
      }
    }
    b->unmapped = 0;
    return b;
  }

  void* finish(block* b, std::size_t bytes, stream_t stream) {
    b->state = block::live_state;
    b->requested = bytes;
    b->stream = stream;
    live.insert(b->addr, b);
    live_bytes += b->size;
    if (live_bytes > peak_live) peak_live = live_bytes;
    return reinterpret_cast<void*>(b->addr);
  }

  [[noreturn]] void throw_oom(std::size_t bytes, const char* why) {
    std::size_t largest = 0;
    for (auto& s : slots) largest = std::max({largest, s.backed[0].largest(), s.backed[1].largest()});
    std::size_t cached = reserved > live_bytes ? reserved - live_bytes : 0;
    double frag = live_bytes ? static_cast<double>(reserved) / static_cast<double>(live_bytes) : 0.0;
    std::string m = "vramkit: out of memory on device " + std::to_string(dev) + " (" +
                    (upstream ? upstream->name() : pages->name()) + "): " + why + (why[0] ? "limit; " : "") +
                    "requested " + format_bytes(bytes) + "; live " + format_bytes(live_bytes) + ", cached " +
                    format_bytes(cached) + ", reserved " + format_bytes(reserved) + ", largest free range " +
                    format_bytes(largest) + ", limit " + format_bytes(limit) + ", device capacity " +
                    format_bytes(capacity) + ", fragmentation " + format_fixed(frag, 3) + " (reserved/live)";
    throw out_of_memory(m, bytes);
  }

  free_status deallocate(void* ptr, std::size_t bytes, stream_t stream) {
    if (!ptr) return free_status::ok;
    std::lock_guard<std::mutex> lk(mu);
    auto key = reinterpret_cast<std::uintptr_t>(ptr);
    block** slot = live.find(key);
    if (!slot) return free_status::not_owned;
    block* b = *slot;
    if (bytes != 0 && bytes != b->requested && round_up(bytes, opt.alignment) != b->size)
      return free_status::wrong_size;
    live.erase(key);
    live_bytes -= b->size;
    // Freed on another stream than allocated: the memory is in use on both.
    if (stream != b->stream &&
        std::find(b->extra_streams.begin(), b->extra_streams.end(), stream) == b->extra_streams.end())
      b->extra_streams.push_back(stream);
    if (!b->extra_streams.empty()) {
      for (stream_t s : b->extra_streams) b->events.push_back(streams->record(s));
      b->state = block::pending_state;
      pending_bytes += b->size;
      pending.push_back(b);
      return free_status::ok;
    }
    b->unmapped = 0;
    make_free(b, slot_for(b->stream), ++free_seq);
    if (opt.release_threshold != std::numeric_limits<std::size_t>::max()) trim_to(opt.release_threshold);
    return free_status::ok;
  }

  void record_stream(void* ptr, stream_t stream) {
    std::lock_guard<std::mutex> lk(mu);
    block** slot = live.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (!slot) throw invalid_argument("record_stream: pointer " + std::to_string(reinterpret_cast<std::uintptr_t>(ptr)) +
                                      " is not a live allocation of this pool");
    block* b = *slot;
    if (stream == b->stream) return;
    if (std::find(b->extra_streams.begin(), b->extra_streams.end(), stream) == b->extra_streams.end())
      b->extra_streams.push_back(stream);
  }

  // Gives back physical memory held by free blocks until cached <= target.
  void trim_to(std::size_t target) {
    auto cached = [&] { return reserved > live_bytes ? reserved - live_bytes : 0; };
    if (cached() <= target) return;
    if (upstream) {
      release_free_segments();
      return;
    }
    drop_pages(spare_handles);
    for (std::size_t i = 0; i < spare_handles.size(); ++i) {
      reserved -= page;
      ++ctr.pages_destroyed;
      ++st.upstream_frees;
      st.upstream_free_bytes += page;
    }
    spare_handles.clear();
    reclaim_streams(false);
    // Pages are destroyed only once mapped nowhere else: what reached the
    // shared slot has its old addresses' work done, so they go first.
    if (!deferred.empty()) flush_deferred();
    std::vector<page_handle> hs;
    while (cached() > target) {
      hs.clear();
      std::size_t k = steal(0, (cached() - target + page - 1) / page, hs);  // only memory no stream still uses
      if (!k) break;
      ctr.pages_remapped -= k;
      drop_pages(hs);
      reserved -= k * page;
      ctr.pages_destroyed += k;
      st.upstream_frees += k;
      st.upstream_free_bytes += k * page;
    }
  }

  void release_cached() {
    std::lock_guard<std::mutex> lk(mu);
    process_pending(true);
    reclaim_streams(true);
    settle_deferred(0);
    trim_to(0);
  }

  memory_state state() const {
    std::lock_guard<std::mutex> lk(mu);
    memory_state s = st;
    s.live_bytes = live_bytes;
    s.live_count = live.size();
    s.reserved_bytes = reserved;
    s.cached_bytes = reserved > live_bytes ? reserved - live_bytes : 0;
    s.pending_free_bytes = pending_bytes;
    for (auto& sl : slots)
      s.largest_free_bytes = std::max({s.largest_free_bytes, sl.backed[0].largest(), sl.backed[1].largest()});
    s.largest_free_bytes = std::min(s.largest_free_bytes, s.cached_bytes);
    s.capacity_bytes = limit;
    s.peak_live_bytes = peak_live;
    s.peak_reserved_bytes = peak_reserved;
    return s;
  }

  void check() const;
  std::vector<segment_info> segments() const;
};

// ---- invariants (tests) -----------------------------------------------------
void pool_resource::impl::check() const {
  std::lock_guard<std::mutex> lk(mu);
  auto fail = [](const std::string& what) { throw error("pool invariant broken: " + what); };
  std::size_t live_sum = 0, live_n = 0, mapped_pages = 0, zombie_pages = 0, stale_pages = 0;
  std::vector<page_handle> in_use(spare_handles.begin(), spare_handles.end()), kept;
  for (auto* a : arenas) {
    std::uintptr_t at = a->base;
    const block* prev = nullptr;
    for (const block* b = a->first; b; prev = b, b = b->next) {
      if (b->addr != at) fail("blocks do not tile the arena at " + std::to_string(b->addr));
      if (b->prev != prev) fail("broken back link");
      if (b->ar != a) fail("block in the wrong arena");
      if (b->addr % opt.alignment) fail("misaligned block");
      at += b->size;
      if (b->state == block::live_state) {
        live_sum += b->size;
        ++live_n;
        auto* f = live.find(b->addr);
        if (!f || *f != b) fail("live block missing from the live table");
        if (b->requested > b->size) fail("block smaller than its request");
      }
      if (b->state == block::free_state && prev && prev->state == block::free_state &&
          prev->slot == b->slot)
        fail("two adjacent free blocks of one stream left unmerged");
      if (a->paged) {
        std::size_t p0 = (b->addr - a->base) / page, p1 = (b->addr + b->size - 1 - a->base) / page;
        if (b->state != block::free_state) {
          for (std::size_t p = p0; p <= p1; ++p)
            if (!a->mapped(p)) fail("live block over an unmapped page");
        } else {
          std::size_t lo = round_up(b->addr - a->base, page) / page;
          std::size_t hi = (b->addr + b->size - a->base) / page;
          std::size_t un = 0;
          for (std::size_t p = lo; p < hi; ++p) un += !a->mapped(p);
          if (un != b->unmapped) fail("free block's unmapped count is stale");
          if (b->hollow != (un > 0)) fail("free block in the wrong index");
          if (b->in_steal != (hi > lo && hi - lo > un)) fail("stealable list out of date");
          // Pages partly inside a free block must be mapped.
          if (p0 < lo && !a->mapped(p0)) fail("unmapped page at a free block's edge");
          if (p1 >= hi && !a->mapped(p1)) fail("unmapped page at a free block's edge");
        }
      }
    }
    if (at != a->base + a->size) fail("blocks do not cover the arena");
    if (a->paged) {
      // Above the highest page ever mapped everything must be empty (checked
      // a word or a vector run at a time: tests call this after every step).
      auto zero = [](const auto& v, std::size_t from) {
        return std::all_of(v.begin() + static_cast<std::ptrdiff_t>(from), v.end(), [](auto x) { return x == 0; });
      };
      const std::size_t wtop = (a->top + 63) / 64;
      if (!zero(a->handles, a->top) || !zero(a->phys, a->top) || !zero(a->mapped_bits, wtop) ||
          !zero(a->zombie_bits, wtop))
        fail("a page in use or mapped above the arena's top");
      for (std::size_t p = a->top; p < std::min(wtop * 64, a->handles.size()); ++p)
        if (a->mapped(p) || a->zombie(p)) fail("a page in use or mapped above the arena's top");
    }
    if (a->paged)
      for (std::size_t p = 0; p < a->top; ++p) {
        if (a->mapped(p) != (a->handles[p] != 0)) fail("page map and handles disagree");
        if (a->zombie(p) && a->mapped(p)) fail("a page waiting to be unmapped is also in use");
        if (a->mapped(p) && a->phys[p] != a->handles[p]) fail("the device maps another page than the pool uses");
        if (a->zombie(p) && !a->phys[p]) fail("a page waiting to be unmapped is not mapped");
        if (a->mapped(p)) in_use.push_back(a->handles[p]);
        if (a->phys[p] && !a->mapped(p)) kept.push_back(a->phys[p]);
        stale_pages += a->phys[p] && !a->mapped(p);
        zombie_pages += a->zombie(p);
        mapped_pages += a->mapped(p);
      }
  }
  if (live_sum != live_bytes) fail("live bytes do not add up");
  if (live_n != live.size()) fail("live table has stale entries");
  std::size_t pend = 0;
  for (auto* b : pending) pend += b->size;
  if (pend != pending_bytes) fail("pending bytes do not add up");
  std::size_t deferred_pages = 0;
  for (auto& d : deferred) deferred_pages += d.count;
  if (zombie_pages != deferred_pages) fail("pages waiting to be unmapped do not match their list");
  if (stale_pages != stale) fail("the count of kept mappings is stale");
  if (!opt.keep_mappings && stale_pages != zombie_pages) fail("a mapping kept with keep_mappings off");
  std::sort(in_use.begin(), in_use.end());
  if (std::adjacent_find(in_use.begin(), in_use.end()) != in_use.end()) fail("one page in use at two places");
  for (page_handle h : kept)
    if (!std::binary_search(in_use.begin(), in_use.end(), h)) fail("a mapping kept of a page given back");
  if (!upstream && (mapped_pages + spare_handles.size()) * page != reserved)
    fail("reserved != mapped + spare pages");
}

std::vector<segment_info> pool_resource::impl::segments() const {
  std::lock_guard<std::mutex> lk(mu);
  std::vector<segment_info> out;
  for (auto* a : arenas) {
    if (!a->paged) {
      segment_info s;
      s.base = a->base;
      s.size = a->size;
      s.mapped_bytes = a->size;
      s.small = a->small;
      for (const block* b = a->first; b; b = b->next)
        s.blocks.push_back({b->addr, b->size, b->requested, b->state == block::live_state,
                            b->state == block::pending_state, b->stream});
      out.push_back(std::move(s));
      continue;
    }
    // A paged arena is reported as its runs of mapped pages.
    std::size_t np = a->handles.size();
    for (std::size_t p = 0; p < np;) {
      if (!a->mapped(p)) {
        ++p;
        continue;
      }
      std::size_t q = p;
      while (q < np && a->mapped(q)) ++q;
      segment_info s;
      s.base = a->base + p * page;
      s.size = (q - p) * page;
      s.mapped_bytes = s.size;
      s.small = a->small;
      std::uintptr_t lo = s.base, hi = s.base + s.size;
      for (const block* b = a->first; b; b = b->next) {
        std::uintptr_t bl = std::max(b->addr, lo), bh = std::min(b->addr + b->size, hi);
        if (bl >= bh) continue;
        s.blocks.push_back({bl, bh - bl, b->state == block::live_state ? b->requested : 0,
                            b->state == block::live_state, b->state == block::pending_state, b->stream});
      }
      out.push_back(std::move(s));
      p = q;
    }
  }
  return out;
}

// ---- public surface ---------------------------------------------------------
pool_resource::pool_resource(std::shared_ptr<page_device> pages, std::shared_ptr<stream_ops> streams,
                             pool_options options)
    : impl_(std::make_unique<impl>()) {
  if (!pages) throw invalid_argument("pool_resource: no page device given");
  impl_->pages = std::move(pages);
  impl_->streams = streams ? std::move(streams) : std::make_shared<host_stream_ops>();
  impl_->opt = options;
  impl_->init_paged();
}

pool_resource::pool_resource(std::shared_ptr<device_resource> upstream, std::shared_ptr<stream_ops> streams,
                             pool_options options)
    : impl_(std::make_unique<impl>()) {
  if (!upstream) throw invalid_argument("pool_resource: no upstream resource given");
  impl_->upstream = std::move(upstream);
  impl_->streams = streams ? std::move(streams) : std::make_shared<host_stream_ops>();
  impl_->opt = options;
  impl_->init_segmented();
}

pool_resource::~pool_resource() = default;

void* pool_resource::do_allocate(std::size_t bytes, stream_t stream) { return impl_->allocate(bytes, stream); }
free_status pool_resource::try_deallocate(void* p, std::size_t bytes, stream_t stream) noexcept {
  return impl_->deallocate(p, bytes, stream);
}
void pool_resource::record_stream(void* p, stream_t s) { impl_->record_stream(p, s); }
void pool_resource::release_cached() { impl_->release_cached(); }
void pool_resource::reset_peaks() {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->peak_live = impl_->live_bytes;
  impl_->peak_reserved = impl_->reserved;
}
memory_state pool_resource::state() const { return impl_->state(); }
int pool_resource::device() const noexcept { return impl_->dev; }
std::string pool_resource::name() const {
  return "pool(" + (impl_->upstream ? impl_->upstream->name() : impl_->pages->name()) + ")";
}
std::size_t pool_resource::allocation_size(const void* p) const noexcept {
  std::lock_guard<std::mutex> lk(impl_->mu);
  auto* b = impl_->live.find(reinterpret_cast<std::uintptr_t>(p));
  return b ? (*b)->requested : 0;
}
pool_counters pool_resource::counters() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->ctr;
}
const pool_options& pool_resource::options() const noexcept { return impl_->opt; }
bool pool_resource::paged() const noexcept { return !impl_->upstream; }
std::size_t pool_resource::page_size() const noexcept { return impl_->page; }
void pool_resource::set_reserve_limit(std::size_t bytes) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  if (bytes > impl_->capacity)
    throw invalid_argument("reserve limit " + format_bytes(bytes) + " is above the device capacity " +
                           format_bytes(impl_->capacity));
  impl_->limit = bytes ? bytes : impl_->capacity;
  // Cached memory over the new limit goes back now; live memory stays (later
  // growth is refused until usage is under the limit).
  if (impl_->reserved > impl_->limit) impl_->trim_to(impl_->limit > impl_->live_bytes ? impl_->limit - impl_->live_bytes : 0);
}
std::vector<segment_info> pool_resource::segments() const { return impl_->segments(); }
void pool_resource::check_invariants() const { impl_->check(); }
pool_resource::page_usage pool_resource::usage() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  page_usage u;
  for (auto* a : impl_->arenas) {
    if (!a->paged) continue;
    for (const detail::block* b = a->first; b; b = b->next) {
      if (b->state == detail::block::free_state) {
        u.free_interior_mapped[a->small] += impl_->interior_pages(b) - b->unmapped;
        continue;
      }
    }
    std::size_t np = a->handles.size();
    std::vector<char> live(np, 0);
    for (const detail::block* b = a->first; b; b = b->next)
      if (b->state != detail::block::free_state)
        for (std::size_t p = impl_->first_page(b); p <= impl_->last_page(b); ++p) live[p] = 1;
    for (std::size_t p = 0; p < np; ++p) {
      u.mapped[a->small] += a->mapped(p);
      u.live_overlap[a->small] += live[p];
    }
  }
  u.spare = impl_->spare_handles.size();
  return u;
}

}  // namespace vramkit
