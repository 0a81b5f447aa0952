"""Finding the repeating step of a trace: where a training or serving loop's steps begin.

A loop that repeats the same step makes the same large allocation requests (by size, in order)
each step. ``find_steps`` looks for the shortest period, in large requests, at which a long part
of the trace repeats itself, and gives the op indices where each step of that period begins (the
marks ``vramkit.mark_step()`` would get, for the pool option ``plan_steps``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Allocations a window of the trace's end holds while looking for earlier copies of it.
WINDOW = 64
#: Steps the period must span at the least (the first step of a program usually differs: lazy
#: initialisation, optimizer state).
MIN_STEPS = 4
#: Share of the requests in the checked region that must equal the request a period earlier.
MIN_MATCH = 0.98
#: Candidate periods checked whole (after a quick look at 64 requests), shortest first.
MAX_CANDIDATES = 64
#: Requests over this many bytes are the large ones, those step plans place (the pool's default
#: ``small_threshold``).
LARGE = 1 << 20
#: The longest step looked for, in large requests (no longer step gets a plan).
MAX_PERIOD = 8192
#: Requests looked at: the trace's last ones (a loop's steps repeat to its end; this bounds the
#: search's memory, about 50 bytes a request).
MAX_REQUESTS = 1 << 22

_R = np.uint64(0x9E3779B97F4A7C15)  # odd: invertible modulo 2**64
_R_INV = np.uint64(pow(int(_R), -1, 1 << 64))


@dataclass(frozen=True)
class Steps:
    """A repeating step: ``period`` large allocation requests a step, each step beginning at an op of
    ``marks`` (ascending op indices); ``matched`` is the share of the checked requests equal to
    the one a period earlier."""
    period: int
    marks: np.ndarray
    matched: float

    @property
    def count(self) -> int:
        return len(self.marks)


def _window_hashes(sizes: np.ndarray, w: int) -> np.ndarray:
    """A hash of every window of ``w`` consecutive values (polynomial, modulo 2**64)."""
    n = len(sizes)
    with np.errstate(over="ignore"):
        k = np.arange(n, dtype=np.uint64)
        pw = np.cumprod(np.concatenate(([np.uint64(1)], np.full(n - 1, _R, dtype=np.uint64)))) if n else k
        inv = np.cumprod(np.concatenate(([np.uint64(1)], np.full(n - 1, _R_INV, dtype=np.uint64)))) if n else k
        prefix = np.concatenate(([np.uint64(0)], np.cumsum(sizes.astype(np.uint64) * pw, dtype=np.uint64)))
        return (prefix[w:] - prefix[:-w]) * inv[: n - w + 1]


def _steady_run(sizes: np.ndarray, live: np.ndarray, period: int) -> tuple[int, int, float]:
    """The longest run of whole periods (cut from allocation 0) whose requests equal the ones a
    period earlier, in size and in the live bytes as they came, for at least ``MIN_MATCH`` of
    them: (first allocation, length, share matched)."""
    m = len(sizes)
    eq = np.zeros(m, dtype=bool)
    eq[period:] = (sizes[period:] == sizes[:-period]) & (live[period:] == live[:-period])
    chunks = m // period
    share = eq[:chunks * period].reshape(chunks, period).mean(axis=1)
    ok = share >= MIN_MATCH
    best = (0, 0, 0.0)
    k = 0
    while k < chunks:
        if not ok[k]:
            k += 1
            continue
        j = k
        while j < chunks and ok[j]:
            j += 1
        if (j - k) * period > best[1]:
            best = (k * period, (j - k) * period, float(share[k:j].mean()))
        k = j
    return best


def find_steps(ops) -> Steps | None:
    """The trace's repeating step, or None when the trace does not repeat itself (shapes that
    change from step to step, large tensors kept from step to step, or too few steps). ``ops``:
    int64 rows (action, id, size[, stream]) as ``vramkit.cli.replay_ops`` gives them.

    The rule of the pool's own search (``cpp/src/mr/pool/step_finder.cpp``), over the large
    requests (over ``LARGE`` bytes): one repeats the one a period earlier when both have the same
    size and came with the same bytes of large requests live. Candidate periods are the distances,
    at most a quarter of the requests looked at and ``MAX_PERIOD``, to earlier copies of windows
    of ``WINDOW`` requests taken across their second half; those under which at least 48 of 64
    requests spread over the last 40 % repeat are checked whole, most such requests first, then
    the shortest, and the first under which a run of whole periods, at least ``MIN_STEPS - 1`` of
    them and 40 % of the requests, has ``MIN_MATCH`` of each period's requests repeated is the
    step. A layer's period repeats only within a pass over the layers, and in training the live
    bytes grow from layer to layer: it is not taken for the step's."""
    ops = np.asarray(ops)
    if ops.ndim != 2 or ops.shape[1] < 3 or len(ops) == 0:
        return None
    large = (ops[:, 0] == 0) & (ops[:, 2] > LARGE)
    # Bytes of large requests live before each op: allocations add their size, frees take back
    # the size of the last allocation of the same id before them (0 for an id never allocated).
    ids = ops[:, 1]
    n = len(ops)
    order = np.lexsort((np.arange(n), ids))
    sorted_ids, sorted_alloc = ids[order], ops[order, 0] == 0
    sorted_size = np.where(large[order], ops[order, 2], 0)
    last_alloc = np.maximum.accumulate(np.where(sorted_alloc, np.arange(n), -1))
    has = last_alloc >= 0
    has[has] = sorted_ids[last_alloc[has]] == sorted_ids[has]
    freed = np.zeros(n, dtype=np.int64)
    freed[order] = np.where(~sorted_alloc & has, sorted_size[np.maximum(last_alloc, 0)], 0)
    delta = np.where(large, ops[:, 2], 0) - freed
    live_before = np.concatenate(([0], np.cumsum(delta)[:-1]))
    at_ops = np.nonzero(large)[0]
    base = max(0, len(at_ops) - MAX_REQUESTS)
    sizes = ops[at_ops[base:], 2].astype(np.int64)
    live = live_before[at_ops[base:]]
    m = len(sizes)
    if m < MIN_STEPS * WINDOW:
        return None
    hashes = _window_hashes(sizes, WINDOW)
    longest = min(m // MIN_STEPS, MAX_PERIOD)
    candidates: set[int] = set()
    for frac in (0.5, 0.6, 0.7, 0.8, 0.9, 1.0):
        at = min(m * int(frac * 10) // 10, m - WINDOW)
        lo = max(0, at - longest)
        # (a hash collision only adds a candidate: the checks below look at the requests)
        candidates.update((at - (lo + np.nonzero(hashes[lo:at] == hashes[at])[0])).tolist())
    probe = m - 1 - (np.arange(64) * (m * 4 // 10)) // 64
    ranked = []
    for period in sorted(candidates):
        back = np.maximum(probe - period, 0)
        hits = int(np.count_nonzero((probe >= period) & (sizes[probe] == sizes[back]) & (live[probe] == live[back])))
        if hits >= 48:
            ranked.append((64 - hits, period))
    for _, period in sorted(ranked)[:MAX_CANDIDATES]:
        first, length, matched = _steady_run(sizes, live, period)
        if length >= max((MIN_STEPS - 1) * period, m * 4 // 10):
            phase = (base + first) % period
            return Steps(period, at_ops[np.arange(phase, len(at_ops), period)].astype(np.int64), matched)
    return None
