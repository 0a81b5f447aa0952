// Steps found in the requests (plan_steps, for programs that never call
// mark_step): the pool keeps the sizes of its last large requests and, every
// few thousand of them, looks for the period at which they repeat. Once one
// is found it marks a step itself every `period` large requests, and the step
// plans (step_plan.cpp) work as with the program's marks. The program's own
// first mark ends all of this.
//
// The search (the rule of vramkit.trace.steps, which finds the marks for
// `vramkit advise`). A large request repeats the one a period earlier when
// both have the same size and came with the same bytes live in the large
// arenas. Candidate periods are the distances (at most a quarter of the
// history, and at most 8,192: no longer step gets a plan) to earlier copies
// of windows of 64 requests taken across the history's second half. Those
// under which at least 48 of 64 requests spread over the history's last 40 %
// repeat are checked whole, most such requests first, then the shortest: the
// first under which a run of whole periods, at least three of them and 40 %
// of the history, has 98 % of each period's requests repeated is the step.
// A layer's period repeats only within one pass over the layers, far less
// than that, and in training the live bytes grow from layer to layer
// (activations kept for the backward pass): it is not taken for the step's.
// Steps whose shapes change find none, and so do loops whose large live bytes
// grow from step to step (a large tensor kept each step). Small blocks do not
// count: a loss kept each step changes nothing. The first search waits for
// 8,192 large requests (a short history holding one pass over a deep model's
// layers could pass for several steps).
//
// A plan dropped after the period was found, or three recorded steps that
// did not repeat (the loop changed, or the period was wrong), stop the marks;
// the search starts again. Searches come every 4,096 large requests; once the
// history is full, those that find nothing come less and less often (doubling
// up to every 262,144). A search holds the pool's lock for up to a few
// milliseconds (a history of one size and no period, the worst case).
#include <algorithm>
#include <vector>

#include "pool_impl.hpp"

namespace vramkit {

namespace {
constexpr std::size_t kWindow = 64;
constexpr std::uint64_t kMinSteps = 4;
constexpr double kMinMatch = 0.98;
constexpr std::size_t kMaxCandidates = 64;
constexpr std::uint64_t kHashMul = 0x9E3779B97F4A7C15ull;
}  // namespace

// The program marks its steps: what was found in the requests is dropped (a
// plan made on the pool's own marks too: the program's marks may fall
// elsewhere in the step), then the mark counts as usual.
void pool_resource::impl::mark_step_from_program() {
  auto& P = plan;
  if (!P.marked && opt.plan_steps && !upstream) {
    P.marked = true;
    P.period = 0;
    std::vector<std::uint64_t>().swap(P.history);
    std::vector<std::uint64_t>().swap(P.history_live);
    if (P.ph != step_plan::phase::off) {
      P.ph = step_plan::phase::warming;
      P.rest = 0;
      P.items.clear();
      P.open.clear();
      P.by_size.clear();
      P.seen.clear();
      P.cursor = nullptr;
      ctr.plan_bytes = 0;
    }
  }
  mark_step();
}

// Before a large request is placed: notes its size, looks for the period when
// due, and begins a step when the found period says one begins here.
void pool_resource::impl::plan_find_steps(std::size_t size) noexcept {
  auto& P = plan;
  try {
    if (P.history.size() < step_plan::history_cap) {
      P.history_live.reserve(P.history.capacity() + 1);  // both grow, or neither
      P.history.push_back(size);
      P.history_live.push_back(live_large);
    } else {
      P.history[P.requests % step_plan::history_cap] = size;
      P.history_live[P.requests % step_plan::history_cap] = live_large;
    }
  } catch (...) {  // no host memory for the history: nothing is found this time
    P.history_live.resize(P.history.size());
    return;
  }
  const std::uint64_t i = P.requests++;
  if (P.period) {
    // The loop changed, or the period was wrong: a plan dropped, or three
    // recorded steps that did not repeat. Look again.
    if (ctr.plans_dropped != P.drops_at_find || P.unplanned >= P.unplanned_at_find + 3) {
      P.period = 0;
      P.searches_failed = 0;
      P.next_search = P.requests + step_plan::search_every;
      return;
    }
    if (i == P.next_mark) {
      P.next_mark += P.period;
      try {
        mark_step();
      } catch (...) {  // no host memory for the plan's bookkeeping: the marks stop
        P.period = 0;
        P.next_search = P.requests + step_plan::search_every;
      }
    }
    return;
  }
  if (P.requests < P.next_search) return;
  std::uint64_t period = 0, first = 0;
  bool found = false;
  try {
    found = plan_search(period, first);
  } catch (...) {
    found = false;
  }
  if (!found) {
    // While the history fills, a search may just be early; once it is full,
    // searches that find nothing come less often.
    if (P.history.size() == step_plan::history_cap)
      P.searches_failed = std::min<std::uint32_t>(P.searches_failed + 1, 6);
    P.next_search = P.requests + (step_plan::search_every << P.searches_failed);
    return;
  }
  // The next request of the found phase after this one begins the next step.
  P.period = period;
  P.next_mark = P.requests + (period - (P.requests - first) % period) % period;
  P.drops_at_find = ctr.plans_dropped;
  P.unplanned_at_find = P.unplanned;
  ++ctr.steps_found;
}

// The period of the history's requests, and the index (counted over all large
// requests) of one where a step of it begins; false when none repeats.
bool pool_resource::impl::plan_search(std::uint64_t& period, std::uint64_t& first) const {
  const auto& P = plan;
  const std::size_t m = P.history.size();
  if (m < kMinSteps * kWindow) return false;
  // The history in request order (the ring's oldest first).
  std::vector<std::uint64_t> s(m), live(m);
  const std::size_t head = m < step_plan::history_cap ? 0 : static_cast<std::size_t>(P.requests % step_plan::history_cap);
  for (std::size_t k = 0; k < m; ++k) s[k] = P.history[(head + k) % m], live[k] = P.history_live[(head + k) % m];
  const std::uint64_t start = P.requests - m;  // the index of s[0] among all large requests
  // A hash of every window of kWindow requests (a polynomial modulo 2^64).
  std::vector<std::uint64_t> h(m - kWindow + 1);
  std::uint64_t top = 1;
  for (std::size_t k = 1; k < kWindow; ++k) top *= kHashMul;
  std::uint64_t cur = 0;
  for (std::size_t k = 0; k < kWindow; ++k) cur = cur * kHashMul + s[k];
  h[0] = cur;
  for (std::size_t k = kWindow; k < m; ++k) {
    cur = (cur - s[k - kWindow] * top) * kHashMul + s[k];
    h[k - kWindow + 1] = cur;
  }
  // Every distance, up to a quarter of the history, to an earlier copy of a
  // window taken in its second half (a layer's window has a copy every layer:
  // the step's distance is among many).
  std::vector<std::uint64_t> candidates;
  for (int tenth = 5; tenth <= 10; ++tenth) {
    const std::size_t at = std::min(m * static_cast<std::size_t>(tenth) / 10, m - kWindow);
    // (A hash collision only adds a candidate: the checks below look at the
    // requests themselves.)
    for (std::size_t e = at; e-- > 0 && at - e <= std::min<std::size_t>(m / kMinSteps, step_plan::max_items);)
      if (h[e] == h[at]) candidates.push_back(at - e);
  }
  std::sort(candidates.begin(), candidates.end());
  candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
  // A quick look first: 64 requests spread over the history's last 40 %, how
  // many the same (size and live bytes) as a period earlier; then the whole
  // check for those with most (at least 48), fewer periods first. (A layer's
  // period, or a multiple of it, fails wherever the layers end.)
  auto same = [&](std::size_t k, std::uint64_t p) { return k >= p && s[k] == s[k - p] && live[k] == live[k - p]; };
  std::vector<std::pair<std::size_t, std::uint64_t>> ranked;  // (64 - hits, period)
  for (std::uint64_t p : candidates) {
    if (p * kMinSteps > m) break;
    std::size_t hits = 0;
    for (std::size_t j = 0; j < 64; ++j) hits += same(m - 1 - j * (m * 4 / 10) / 64, p);
    if (hits >= 48) ranked.emplace_back(64 - hits, p);
  }
  std::sort(ranked.begin(), ranked.end());
  if (ranked.size() > kMaxCandidates) ranked.resize(kMaxCandidates);
  for (auto [misses, p] : ranked) {
    // Whole periods cut from the history's start; the longest run of those
    // matching the period before them.
    const std::size_t chunks = m / p;
    const std::size_t need = (std::max<std::size_t>((kMinSteps - 1) * p, m * 4 / 10) + p - 1) / p;  // periods
    std::size_t run = 0, best = 0, best_end = 0;
    for (std::size_t c = 0; c < chunks && best < need && run + (chunks - c) >= need; ++c) {
      std::size_t equal = 0;
      for (std::size_t k = c * p; k < (c + 1) * p; ++k) equal += same(k, p);
      if (static_cast<double>(equal) >= kMinMatch * static_cast<double>(p)) {
        if (++run > best) best = run, best_end = c + 1;
      } else {
        run = 0;
      }
    }
    if (best >= need) {
      period = p;
      first = start + (best_end - best) * p;
      return true;
    }
  }
  return false;
}

}  // namespace vramkit
