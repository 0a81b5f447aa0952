// Page supply ahead (map_ahead): while the pool grows, a helper thread
// creates pages and maps them just past the large arena's highest page in
// use, a batch at a time, so that the next blocks placed there find them
// ready (use_ahead: no driver call on the allocating thread). The driver
// runs page calls one at a time whichever thread makes them, but without
// holding up other threads' launches or the GPU's work (vramkit_vmm_overlap
// measures both), so the calls the helper makes are time the allocating
// thread no longer spends.
//
// The helper holds the pool's lock only to claim a batch (its pages count as
// reserved from then on) and to publish it (apply_ahead); it makes the calls
// without it. A placement over a batch still being made waits for it.
#include <pthread.h>

#include <algorithm>
#include <csignal>
#include <limits>
#include <vector>

#include "pool_impl.hpp"

namespace vramkit {

namespace {
// Starts the helper with every asynchronous signal blocked in it (a thread
// inherits its creator's mask, so the caller's is blocked around the start and
// restored): a process-directed SIGTERM or SIGINT then goes to a thread that
// handles it. Python runs its handlers only in the main thread, and one that
// the kernel hands to a helper never wakes a main thread blocked in a wait.
// Faults stay deliverable. The thread is named for debuggers and /proc.
template <class F>
std::thread start_helper(F&& body) {
  sigset_t quiet, old;
  sigfillset(&quiet);
  for (int s : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT}) sigdelset(&quiet, s);
  pthread_sigmask(SIG_BLOCK, &quiet, &old);
  std::thread t;
  try {
    t = std::thread(std::forward<F>(body));
  } catch (...) {
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    throw;
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  pthread_setname_np(t.native_handle(), "vramkit-ahead");
  return t;
}
}  // namespace

// How many pages to keep made ahead: a 32nd of what the pool holds (at least
// 4 pages, at most map_ahead), so the extra memory stays within about 3 % and
// a pool that grows fast gets a lead in step with its growth.
std::size_t pool_resource::impl::ahead_target() const {
  const std::size_t held = (reserved - held_ahead_bytes()) / page;
  return std::min(opt.map_ahead / page, std::max<std::size_t>(4, held / 32));
}

// Called with the lock held after a block in the large arena took new pages
// (created, or made ahead): the helper tops the ahead pages up.
void pool_resource::impl::wake_ahead() {
  if (!opt.map_ahead || ahead_failed || !pages) return;
  if (ahead_pages + (inflight.active ? inflight.count : 0) >= ahead_target()) return;
  if (!ahead_thread.joinable()) {
    try {
      ahead_thread = start_helper([this] { ahead_loop(); });
    } catch (...) {
      ahead_failed = true;  // no thread: the pool makes its pages itself, as without map_ahead
      return;
    }
  }
  {
    std::lock_guard<std::mutex> l(ahead_mu);
    ahead_wake = true;
  }
  ahead_cv.notify_one();
}

// With the lock, after a block in the large arena was backed: `created` pages
// made on this thread (the pool grew), `used` pages made ahead taken.
void pool_resource::impl::after_backing(std::size_t created, std::size_t used) noexcept {
  if (!created && !used) return;
  ahead_held = false;
  try {
    wake_ahead();
  } catch (...) {
  }
}

void pool_resource::impl::ahead_loop() {
  try {
    pages->attach_thread();
  } catch (...) {
    std::lock_guard<std::mutex> g(mu);
    ahead_failed = true;
    return;
  }
  for (;;) {
    {
      std::unique_lock<std::mutex> l(ahead_mu);
      ahead_cv.wait(l, [&] { return ahead_wake || ahead_stop; });
      if (ahead_stop) return;
      ahead_wake = false;
    }
    for (;;) {
      {
        std::lock_guard<std::mutex> g(mu);
        apply_ahead();
        if (!claim_ahead()) break;
      }
      make_ahead();
      std::lock_guard<std::mutex> l(ahead_mu);
      if (ahead_stop) return;  // the batch is published by stop_ahead
    }
  }
}

// With the lock: claims the next batch past the large arena's highest page
// in use, within the target, the reserve limit and the release threshold.
// False when there is nothing to do.
bool pool_resource::impl::claim_ahead() {
  if (inflight.active || ahead_failed || ahead_held) return false;
  detail::arena* a = nullptr;
  for (auto* x : arenas)
    if (x->paged && !x->small) a = x;
  const std::size_t target = ahead_target();
  if (!a || ahead_pages >= target) return false;
  std::size_t k = std::min(ahead_batch_pages, target - ahead_pages);
  k = std::min(k, reserved < limit ? (limit - reserved) / page : 0);
  // No lead past the release threshold: cached memory above it is given back.
  if (opt.release_threshold != std::numeric_limits<std::size_t>::max()) {
    const std::size_t cached = reserved > live_bytes ? reserved - live_bytes : 0;
    k = std::min(k, cached < opt.release_threshold ? (opt.release_threshold - cached) / page : 0);
  }
  if (!k) return false;
  // Only while the pool's own pages (those made ahead aside) are within the
  // growth slack of the peak live bytes: when blocks of new shapes take the
  // pages made ahead instead of free pages elsewhere, that is not growth,
  // and no more are made. (Letting the helper also follow the pages the
  // allocating thread created past the slack raised BERT's peak reserved
  // memory on an H200 from 2,720 to 3,164 MiB.)
  if (opt.remap &&
      static_cast<double>(reserved - held_ahead_bytes()) > (1.0 + opt.growth_slack) * static_cast<double>(peak_live))
    return false;
  // Where the next blocks go: just past the highest page mapped or made
  // ahead (after a trim that can be far below `top`), over pages that no
  // mapping is kept at; as many of them in a row as are free, up to k.
  std::size_t first = a->top ? last_backed_page(a, 0, a->top - 1) : 0;
  if (a->top && (a->mapped(first) || a->ahead(first))) ++first;
  while (first < a->top && a->phys[first]) ++first;
  std::size_t run = 0;
  while (run < k && first + run < a->handles.size() &&
         (first + run >= a->top || !a->phys[first + run]))
    ++run;
  if (!run) return false;
  k = run;
  inflight.a = a;
  inflight.first = first;
  inflight.count = k;
  inflight.made.clear();
  inflight.done.store(false, std::memory_order_relaxed);
  inflight.active = true;
  reserved += k * page;
  peak_reserved = std::max(peak_reserved, reserved);
  return true;
}

// Without the lock: creates and maps the claimed batch. A page the device
// refuses ends the batch there; any other failure gives every page back.
void pool_resource::impl::make_ahead() noexcept {
  auto& b = inflight;
  try {
    b.made.reserve(b.count);
    for (std::size_t i = 0; i < b.count; ++i) {
      page_handle h = pages->create();
      if (!h) break;
      b.made.push_back(h);
    }
    if (!b.made.empty()) pages->map(b.a->base + b.first * page, b.made.data(), b.made.size());
  } catch (...) {
    for (page_handle h : b.made) pages->destroy(h);
    b.made.clear();
  }
  b.done.store(true, std::memory_order_release);
}

// With the lock: publishes a finished batch (its pages become ahead pages;
// what was claimed but not made stops counting as reserved).
void pool_resource::impl::apply_ahead() {
  auto& b = inflight;
  if (!b.active || !b.done.load(std::memory_order_acquire)) return;
  const std::size_t n = b.made.size();
  for (std::size_t i = 0; i < n; ++i) {
    b.a->phys[b.first + i] = b.made[i];
    b.a->set_ahead(b.first + i, true);
  }
  if (n) b.a->top = std::max(b.a->top, b.first + n);  // (the batch may lie below it after a trim)
  ahead_pages += n;
  reserved -= (b.count - n) * page;
  ctr.pages_created += n;
  ctr.pages_made_ahead += n;
  st.upstream_allocs += n;
  st.upstream_alloc_bytes += n * page;
  if (n < b.count) ahead_failed = true;
  b.made.clear();
  b.active = false;
}

// With the lock: waits for the batch being made (the helper needs no lock to
// finish it) and publishes it.
void pool_resource::impl::wait_ahead() {
  if (!inflight.active) return;
  while (!inflight.done.load(std::memory_order_acquire)) std::this_thread::yield();
  apply_ahead();
}

// With the lock, for a block being backed over pages [p0, p1] of arena a:
// the ahead pages there become its own. Returns how many.
std::size_t pool_resource::impl::use_ahead(detail::arena* a, std::size_t p0, std::size_t p1) {
  if (inflight.active) {
    if (inflight.a == a && inflight.first <= p1 && inflight.first + inflight.count > p0) wait_ahead();
    else apply_ahead();
  }
  ahead_took.clear();
  if (!ahead_pages) return 0;
  std::size_t n = 0;
  for (std::size_t p = p0; p <= p1; ++p) {
    if (!a->ahead(p)) continue;
    a->set_ahead(p, false);
    a->handles[p] = a->phys[p];
    a->set_mapped(p, true);
    ahead_took.push_back(p);
    ++n;
  }
  ahead_pages -= n;
  ctr.pages_ahead_used += n;
  return n;
}

// With the lock, when backing a block failed after use_ahead took pages
// under it: they are pages made ahead again (the block goes back free with
// the unmapped count it had).
void pool_resource::impl::unuse_ahead(detail::arena* a) {
  for (std::size_t p : ahead_took) {
    a->set_mapped(p, false);
    a->handles[p] = 0;
    a->set_ahead(p, true);
  }
  ahead_pages += ahead_took.size();
  ctr.pages_ahead_used -= ahead_took.size();
  ahead_took.clear();
}

// With the lock: up to `want` ahead pages for a block elsewhere (when no new
// page may be created), the highest first. Their mapping where they were
// made stays as a kept one (keep_mappings) or goes.
std::size_t pool_resource::impl::take_ahead(std::size_t want, std::vector<page_handle>& out) {
  std::size_t got = 0;
  for (auto* a : arenas) {
    if (!a->paged || a->small) continue;
    for (std::size_t p = a->top; p-- > 0 && got < want && ahead_pages;) {
      if (!a->ahead(p)) continue;
      a->set_ahead(p, false);
      out.push_back(a->phys[p]);
      if (opt.keep_mappings) {
        ++stale;
      } else {
        pages->unmap(a->base + p * page, 1);
        a->phys[p] = 0;
        ++ctr.pages_unmapped;
      }
      --ahead_pages;
      ++got;
    }
  }
  ctr.pages_remapped += got;
  return got;
}

// With the lock: gives every ahead page back to the device (trim, the
// out-of-memory path), after the batch being made (or, without `wait`, only
// those published: the batch stays with the helper).
void pool_resource::impl::drop_ahead(bool wait) {
  if (wait) wait_ahead();
  else apply_ahead();
  ahead_failed = false;
  ahead_held = true;  // the helper makes no more until the pool grows again
  if (!ahead_pages) return;
  std::size_t n = 0;
  for (auto* a : arenas) {
    if (!a->paged) continue;
    for (std::size_t p = 0; p < a->top;) {
      if (!a->ahead(p)) {
        ++p;
        continue;
      }
      std::size_t e = p;
      while (e < a->top && a->ahead(e)) ++e;
      pages->unmap(a->base + p * page, e - p);
      for (std::size_t q = p; q < e; ++q) {
        pages->destroy(a->phys[q]);
        a->phys[q] = 0;
        a->set_ahead(q, false);
      }
      n += e - p;
      p = e;
    }
  }
  ahead_pages = 0;
  reserved -= n * page;
  ctr.pages_unmapped += n;
  ctr.pages_destroyed += n;
  st.upstream_frees += n;
  st.upstream_free_bytes += n * page;
}

// Without the lock (teardown): the helper stops; its last batch is published.
void pool_resource::impl::stop_ahead() noexcept {
  if (!ahead_thread.joinable()) return;
  {
    std::lock_guard<std::mutex> l(ahead_mu);
    ahead_stop = true;
  }
  ahead_cv.notify_one();
  ahead_thread.join();
  std::lock_guard<std::mutex> g(mu);
  try {
    wait_ahead();
  } catch (...) {
  }
}

}  // namespace vramkit
