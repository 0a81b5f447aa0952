"""What allocation tracking costs per alloc+free pair, seen from Python.

    python3 benchmarks/tracking_overhead.py [--n 200000] [--repeat 5] [--depth 0]

Rows (each the best of ``--repeat`` runs of ``vramkit.alloc(4096).free()`` in a loop, ns per pair):

* ``plain``                      - the device's current resource (statistics over the pool)
* ``tracking, no stacks``        - a tracking adaptor over it, no call sites (live table + event ring)
* ``tracking, python stacks``    - the same with the Python call-site hook (what vramkit.leaks installs)
* ``... called N frames deep``   - (``--depth N``) the loop body N Python calls below the loop; the
                                   hook walks out only to the first non-vramkit frame, so depth
                                   should not matter

The difference to ``plain`` is the tracking overhead (target: at most 1 us per pair).
"""
from __future__ import annotations

import argparse
import platform
import time

import vramkit
from vramkit import _vramkit


def _loop(n: int) -> float:
    alloc = vramkit.alloc
    t0 = time.perf_counter_ns()
    for _ in range(n):
        alloc(4096).free()
    return (time.perf_counter_ns() - t0) / n


def _deep(depth: int, n: int) -> float:
    if depth == 0:
        return _loop(n)
    return _deep(depth - 1, n)


def measure(n: int, repeat: int, depth: int) -> float:
    _loop(1000)  # warm the pool and the site table
    return min(_deep(depth, n) for _ in range(repeat))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--depth", type=int, default=0)
    a = ap.parse_args()
    from vramkit.leaks import _tracking
    _tracking._ensure_prefixes()
    base = _vramkit.current_resource(None)
    rows = [("plain", measure(a.n, a.repeat, 0))]
    for label, stacks in (("tracking, no stacks", False), ("tracking, python stacks", True)):
        t = _vramkit.tracking_adaptor(base, stacks)
        _vramkit.set_current_resource(t, None)
        try:
            rows.append((label, measure(a.n, a.repeat, 0)))
            if stacks and a.depth:
                rows.append((f"... called {a.depth} frames deep", measure(a.n, a.repeat, a.depth)))
        finally:
            _vramkit.set_current_resource(base, None)
    print(f"# tracking overhead, backend {_vramkit.backend()}, Python {platform.python_version()}, "
          f"{platform.machine()}, n={a.n}, best of {a.repeat}")
    print(f"{'configuration':34s} {'ns/pair':>9s} {'overhead ns':>12s}")
    for label, ns in rows:
        print(f"{label:34s} {ns:9.0f} {ns - rows[0][1]:12.0f}")


if __name__ == "__main__":
    main()
