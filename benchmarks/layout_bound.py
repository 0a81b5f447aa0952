"""How little memory a trace needs when no block ever moves: fixed-offset layouts made with the
whole trace known in advance, against first fit in the order the requests came.

    python3 benchmarks/layout_bound.py TRACE [TRACE ...] [--round 512]

Each allocation is an interval in time (from its request to its free) with a size; a layout gives
each one an offset, and two blocks live at the same time may not overlap. The top of the highest
block over the peak of live bytes is the fragmentation of that layout: what a pool would reserve if
it mapped that layout once and never moved a page.

- clairvoyant: blocks placed largest first, each at the lowest offset free for its whole lifetime
  (knows every lifetime in advance, as a static planner for a repeating training step would).
- first fit: blocks placed in the order they were requested, each at the lowest offset free for its
  lifetime (what an allocator that never moves memory and packs downwards reaches at best).

The gap between the two is what online placement without page moves loses; a pool that moves
pages reaches the floor (1.000) at the price of driver calls. Streams are ignored (a layout shared
by streams would also need their ordering), and sizes are rounded up to --round bytes.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np


def intervals(ops: np.ndarray, rounding: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, end, size) of every allocation of rows ``action, id, size, ...`` (action 0: alloc,
    1: free); a block never freed lives to the end."""
    start: dict[int, int] = {}
    size: dict[int, int] = {}
    s, e, z = [], [], []
    t = 0
    for t, (action, ident, nbytes) in enumerate(ops[:, :3].tolist(), start=1):
        if action == 0:
            start[ident] = t
            size[ident] = -(-nbytes // rounding) * rounding
        elif ident in start:
            s.append(start.pop(ident))
            e.append(t)
            z.append(size.pop(ident))
    for ident, t0 in start.items():
        s.append(t0)
        e.append(t + 1)
        z.append(size[ident])
    return np.array(s, np.int64), np.array(e, np.int64), np.array(z, np.int64)


def peak_live(s: np.ndarray, e: np.ndarray, z: np.ndarray) -> int:
    if len(z) == 0:
        return 0
    delta = np.zeros(int(e.max()) + 2, np.int64)
    np.add.at(delta, s, z)
    np.add.at(delta, e, -z)
    return int(np.cumsum(delta).max())


def layout_top(s: np.ndarray, e: np.ndarray, z: np.ndarray, order: np.ndarray) -> int:
    """Places the blocks in `order`, each at the lowest offset where it overlaps no block placed
    before it and alive at the same time; returns the highest end."""
    off = np.zeros(len(z), np.int64)
    placed = np.zeros(len(z), bool)
    top = 0
    for k in order:
        idx = np.nonzero(placed & (s < e[k]) & (e > s[k]))[0]
        o = 0
        if len(idx):
            by = np.argsort(off[idx], kind="stable")
            lo = off[idx][by]
            hi = np.maximum.accumulate(lo + z[idx][by])
            cand = np.concatenate(([0], hi))  # lowest free offset after each prefix of neighbours
            nxt = np.concatenate((lo, [np.iinfo(np.int64).max]))
            o = int(cand[np.nonzero(nxt - cand >= z[k])[0][0]])
        off[k] = o
        placed[k] = True
        top = max(top, o + int(z[k]))
    return top


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("traces", nargs="+", help="trace files vramkit reads (PyTorch snapshot or CSV, RMM log, v1)")
    ap.add_argument("--round", type=int, default=512, help="round sizes up to this many bytes (default 512)")
    a = ap.parse_args()
    if a.round < 1:
        ap.error("--round must be at least 1")
    from vramkit.cli import replay_ops
    from vramkit.trace import load_trace
    print("| trace | allocations | peak live MiB | clairvoyant layout / peak | first fit in order / peak |")
    print("|---|---|---|---|---|")
    for path in a.traces:
        try:
            t = load_trace(path)
        except (OSError, ValueError) as e:
            print(f"layout_bound: error: {e}", file=sys.stderr)
            return 1
        s, e, z = intervals(replay_ops(t), a.round)
        peak = peak_live(s, e, z)
        if peak == 0:
            print(f"| {t.name} | {len(z)} | 0 | - | - |")
            continue
        clair = layout_top(s, e, z, np.lexsort((s, -z)))
        first = layout_top(s, e, z, np.argsort(s, kind="stable"))
        print(f"| {t.name} | {len(z)} | {peak / 2**20:,.0f} | {clair / peak:.3f} | {first / peak:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
