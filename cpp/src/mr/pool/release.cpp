// Release: giving memory back to the device (trim to release_threshold,
// release_cached, a lowered reserve limit, the last try before out of
// memory), and the segments of pools over a non-paged upstream.
#include <algorithm>
#include <vector>

#include "pool_impl.hpp"

namespace vramkit {

// Destroys every spare page (unmapping first the stale mappings they keep).
void pool_resource::impl::destroy_spares() {
  drop_pages(spare_handles);
  for (std::size_t i = 0; i < spare_handles.size(); ++i) {
    reserved -= page;
    ++ctr.pages_destroyed;
    ++st.upstream_frees;
    st.upstream_free_bytes += page;
  }
  spare_handles.clear();
}

// Gives back physical memory held by free blocks until cached <= target.
// (on_free: called by a free over release_threshold, which does not wait for
// a batch of pages the helper is making.)
void pool_resource::impl::trim_to(std::size_t target, bool on_free) {
  auto cached = [&] { return reserved > live_bytes ? reserved - live_bytes : 0; };
  if (cached() <= target) return;
  if (upstream) {
    release_free_segments();
    return;
  }
  destroy_spares();
  // Pages made ahead go only when giving back the spares was not enough (and
  // a batch still being made is not waited for on a free).
  if (cached() > target) drop_ahead(!on_free);
  reclaim_streams(false);
  std::vector<page_handle> hs;
  while (cached() > target) {
    hs.clear();
    // Only memory no stream still uses; a chunk it meets is given back there.
    if (!steal(0, (cached() - target + page - 1) / page, hs)) break;
    std::size_t k = hs.size();
    ctr.pages_remapped -= k;
    drop_pages(hs);
    reserved -= k * page;
    ctr.pages_destroyed += k;
    st.upstream_frees += k;
    st.upstream_free_bytes += k * page;
  }
}

void pool_resource::impl::release_cached() {
  std::lock_guard<std::mutex> lk(mu);
  process_pending(true);
  reclaim_streams(true);
  drop_ahead();  // also holds the helper until the pool grows again
  trim_to(0);
}

// ---- segments (non-paged upstreams) -------------------------------------
bool pool_resource::impl::grow_segment(std::size_t size, bool small, stream_t stream) {
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
  slots.insert(b, 0);
  return true;
}

std::size_t pool_resource::impl::release_free_segments() {
  std::size_t released = 0;
  for (std::size_t i = 0; i < arenas.size();) {
    detail::arena* a = arenas[i];
    block* b = a->first;
    if (!a->paged && b->state == block::free_state && b->size == a->size) {
      slots.remove(b);
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

}  // namespace vramkit
