"""The planner: the least recomputation whose predicted peak fits a budget, for a chain.

Dynamic programming over the boundaries between blocks. The state at boundary j is the number
of bytes the segments before j keep (``K``) and whether one of them was checkpointed (then the
chain's ``ckpt_extra`` is held from there on); everything that happens from j on depends on the
past only through these two (see :mod:`.model`), and a smaller ``K`` is never worse. So keeping,
at each boundary and for each flag, the states that no other state beats on both ``K`` and time
(a Pareto front) loses no plan: the result is the exact optimum of the model.

To bound the front on real chains (byte counts in the billions), ``K`` is rounded *up* to a
resolution (by default the greatest common divisor of the sizes, which loses nothing; on a
chain too fine for that, 1/65536 of its total activation bytes):
every plan is judged with at least its true memory, so a plan found always fits, and the DP is
exact for the rounded model. Because the rounded model is the same for every budget, a plan
feasible at a budget stays feasible at any larger one: a larger budget never gives a slower
plan (the optimum over a larger set).
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from .model import BudgetError, Chain, Plan, evaluate, fmt_bytes, parse_budget, segment_phases


def exact_resolution(ch: Chain) -> int:
    """The resolution that rounds nothing: every ``K`` is a sum of act and inp values, so their
    greatest common divisor loses nothing (allocator sizes are multiples of 512 bytes). Pass it as
    ``resolution=`` for the exact model on a chain the default rounds (slower on long chains)."""
    return math.gcd(*ch.act, *ch.inp) or 1


def _resolution(ch: Chain, resolution) -> int:
    if resolution is not None:
        r = int(resolution)
        if r < 1:
            raise ValueError(f"resolution must be at least 1 byte, not {resolution}")
        return r
    # Only a chain whose total is more than 2^18 exact units is rounded, to 1/65536 of its total.
    total = sum(max(a, x) for a, x in zip(ch.act, ch.inp))
    g = exact_resolution(ch)
    if total // g <= 1 << 18:
        return g
    return max(g, -(-(total >> 16) // g) * g)


def _phases(ch: Chain):
    n = len(ch)
    plain = [segment_phases(ch, l, l + 1, False) for l in range(n)]
    ck = [[None] * (n + 1) for _ in range(n)]
    for l in range(n):
        for r in range(l + 1, n + 1):
            ck[l][r] = segment_phases(ch, l, r, True)
    return plain, ck


def _transitions(ch, plain, ck, l, max_segment):
    yield (l, l + 1, False), plain[l]
    for r in range(l + 1, min(len(ch), l + max_segment) + 1):
        yield (l, r, True), ck[l][r]


# The DP's states at a boundary are split by whether a segment before it was checkpointed (then
# ``ckpt_extra`` is held from there on). A front is a tuple of arrays, one entry per state, sorted
# by K: (K, value, previous boundary, index of the previous state there, its flag, end of the
# segment that led here, checkpointed or not).

def _pareto(parts):
    """The states of ``parts`` that no state with a smaller or equal K beats in value."""
    k, v, pl, pi, pf, pe, pc = (np.concatenate(x) for x in zip(*parts))
    order = np.lexsort((v, k))
    k, v = k[order], v[order]
    best_before = np.minimum.accumulate(np.concatenate(([np.inf], v[:-1])))
    keep = v < best_before
    order = order[keep]
    return k[keep], v[keep], pl[order], pi[order], pf[order], pe[order], pc[order]


def _walk(fronts, flag, i):
    segs, j = [], len(fronts) - 1
    while fronts[j][flag][2][i] >= 0:
        f = fronts[j][flag]
        segs.append((int(f[2][i]), int(f[5][i]), bool(f[6][i])))
        j, i, flag = int(f[2][i]), int(f[3][i]), int(f[4][i])
    return segs[::-1]


def _run(ch: Chain, q: int, budget: int | None, max_segment: int):
    """The DP. With a budget: value = recompute time, transitions must fit. Without: value =
    the running peak (the least-peak plan)."""
    n = len(ch)
    plain, ck = _phases(ch)
    extra = ch.ckpt_extra
    start = 0.0 if budget is not None else float(ch.fixed_peak)
    cands = [[[], []] for _ in range(n + 1)]
    cands[0][0] = [(np.zeros(1, np.int64), np.array([start]), np.array([-1]), np.array([-1]), np.zeros(1, np.int64),
                    np.zeros(1, np.int64), np.zeros(1, bool))]
    fronts = [[None, None] for _ in range(n + 1)]
    for l in range(n):
        for flag in (0, 1):
            if not cands[l][flag]:                  # nothing fits up to this boundary
                continue
            fronts[l][flag] = _pareto(cands[l][flag])
            cands[l][flag] = None
            k, v = fronts[l][flag][0], fronts[l][flag][1]
            idx = np.arange(len(k))
            for (s, e, c), (kept, fwd, bwd, t) in _transitions(ch, plain, ck, l, max_segment):
                nflag = 1 if (flag or c) else 0
                local = max(fwd, bwd + (extra if nflag else 0))
                if budget is not None:
                    lim = min(budget - ch.base - local, 1 << 62)
                    m = int(np.searchsorted(k, lim, side="right"))      # k is sorted: a prefix fits
                    if m == 0:
                        continue
                    nk, nv, src = k[:m] + kept, v[:m] + t, idx[:m]
                else:
                    nk, nv, src = k + kept, np.maximum(v, ch.base + k + local), idx
                nk = -(-nk // q) * q                    # rounded up: never less than the true bytes
                cands[e][nflag].append((nk, nv, np.full(len(nk), l), src, np.full(len(nk), flag), np.full(len(nk), e),
                                        np.full(len(nk), c)))
    for flag in (0, 1):
        if cands[n][flag]:
            fronts[n][flag] = _pareto(cands[n][flag])
    if fronts[n][0] is None and fronts[n][1] is None:
        return None
    return fronts


def _finish(ch, fronts, budget, q, name):
    if fronts is None:
        return None
    best = None                                     # (key, K, flag, index, value)
    for flag in (0, 1):
        if fronts[-1][flag] is None:
            continue
        k, v = fronts[-1][flag][0], fronts[-1][flag][1]
        end = ch.base + k + ch.head + (ch.ckpt_extra if flag else 0)
        if budget is not None:
            ok = np.flatnonzero((end <= budget) & (ch.fixed_peak <= budget))
            if len(ok) == 0:
                continue
            key = v[ok]
        else:
            ok = np.arange(len(k))
            key = np.maximum(v, end)
        i = ok[np.lexsort((k[ok], key))[0]]
        value = float(v[i]) if budget is not None else float(max(v[i], end[i]))
        cand = (float(key[np.searchsorted(ok, i)]), int(k[i]), flag, int(i), value)
        if best is None or cand[:3] < best[:3]:
            best = cand
    if best is None:
        return None
    _, _, flag, i, value = best
    segs = _walk(fronts, flag, i)
    peak, extra, where = evaluate(ch, segs, detail=True)
    return Plan(segments=segs, peak=peak, extra_time=extra, budget=budget, name=name, names=ch.names,
                where=where), value


def _max_segment(ch, max_segment):
    if max_segment is None:
        return len(ch)
    if isinstance(max_segment, bool) or not isinstance(max_segment, int) or max_segment < 1:
        raise ValueError(f"max_segment must be a positive integer, not {max_segment!r}")
    return max_segment


def minimum_budget(ch: Chain, *, resolution=None, max_segment=None) -> int:
    """The smallest budget any plan fits (in the planner's rounded model)."""
    q = _resolution(ch, resolution)
    _, least = _finish(ch, _run(ch, q, None, _max_segment(ch, max_segment)), None, q, "least-memory")
    return int(least)


def plan(ch: Chain, budget, *, resolution=None, max_segment=None, name: str = "optimal") -> Plan:
    """The plan with the least recomputation time whose predicted peak is at most ``budget``.

    ``budget``: bytes (int) or a size string (``"12GiB"``, ``"1.5 GB"``). Raises
    :class:`BudgetError` for a bad budget or one no plan fits (the message gives the least).
    ``max_segment``: the most blocks one checkpoint call may span (default: any)."""
    b = parse_budget(budget)
    q = _resolution(ch, resolution)
    got = _finish(ch, _run(ch, q, b, _max_segment(ch, max_segment)), b, q, name)
    if got is None:
        least = minimum_budget(ch, resolution=resolution, max_segment=max_segment)
        raise BudgetError(f"no plan fits a budget of {fmt_bytes(b)} ({b} bytes): the least peak any plan "
                          f"reaches is {fmt_bytes(least)} ({least} bytes)")
    return got[0]


def sweep(ch: Chain, budgets, *, resolution=None, max_segment=None) -> list:
    """[(budget bytes, Plan or None when nothing fits)] for each budget."""
    out = []
    for b in [parse_budget(b) for b in budgets]:
        try:
            out.append((b, plan(ch, b, resolution=resolution, max_segment=max_segment)))
        except BudgetError:
            out.append((b, None))
    return out


def _named(ch, segs, name):
    peak, extra, where = evaluate(ch, segs, detail=True)
    return Plan(segments=segs, peak=peak, extra_time=extra, name=name, names=ch.names, where=where)


def no_checkpoint(ch: Chain) -> Plan:
    return _named(ch, [(i, i + 1, False) for i in range(len(ch))], "none")


def checkpoint_all(ch: Chain) -> Plan:
    """Every block checkpointed on its own (what per-layer gradient checkpointing flags do)."""
    return _named(ch, [(i, i + 1, True) for i in range(len(ch))], "all")


def chen_sqrt(ch: Chain) -> Plan:
    """Chen et al.'s sqrt(n) rule, laid out as ``torch.utils.checkpoint.checkpoint_sequential``
    with round(sqrt(n)) segments: the first segments of n // k blocks are checkpointed, the rest
    (the last segment and leftovers) runs plainly since its backward comes first."""
    n = len(ch)
    k = max(1, round(math.sqrt(n)))
    size = n // k
    segs = [(i * size, (i + 1) * size, True) for i in range(k - 1)]
    segs += [(i, i + 1, False) for i in range((k - 1) * size, n)]
    return _named(ch, segs, "sqrt(n)")


def baselines(ch: Chain) -> list:
    return [no_checkpoint(ch), chen_sqrt(ch), checkpoint_all(ch)]


def all_plans(n: int):
    """Every distinct plan of an n-block chain: plain blocks and checkpointed segments."""
    if n == 0:
        yield []
        return
    for first in itertools.chain([(0, 1, False)], ((0, r, True) for r in range(1, n + 1))):
        for rest in all_plans(n - first[1]):
            yield [first] + [(s + first[1], e + first[1], c) for s, e, c in rest]


def brute_force(ch: Chain, budget) -> Plan | None:
    """The optimum by trying every plan (for tests: 75,025 plans at n = 12)."""
    b = parse_budget(budget)
    best = None
    for segs in all_plans(len(ch)):
        peak, extra = evaluate(ch, segs)
        if peak <= b and (best is None or extra < best.extra_time - 1e-12):
            best = Plan(segments=segs, peak=peak, extra_time=extra, budget=b, name="brute force", names=ch.names)
    return best
