"""The long-trace benchmark: `vramkit advise` on a synthetic 10-million-op trace.

    python benchmarks/long_trace.py [--ops 10000000] [--keep FILE]

Writes a synthetic training-like trace (vramkit v1; nothing is committed as data) with batch
sizes that change every step, then times `vramkit advise` on it (6 allocators) in a child process
and prints wall time, the child's peak RSS and the trace's size. The figures go to
docs/BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np


def make_trace(path: str, n_ops: int, seed: int = 0) -> int:
    """A model-like trace: 300 parameters live throughout; each step allocates activations
    (sizes scaled by a batch factor drawn per step), each with a temporary freed at once (some
    on a side stream), then frees the activations in reverse order."""
    from vramkit.trace import Trace, TraceWriter
    rng = np.random.default_rng(seed)
    m = 500
    base = np.exp(rng.uniform(np.log(4096), np.log(64 << 20), m)).astype(np.int64)
    side = rng.random(m) < 0.1
    params = (np.exp(rng.uniform(np.log(1 << 16), np.log(32 << 20), 300))).astype(np.int64)
    next_id = 0
    written = 0
    with TraceWriter(path, name="synthetic_long", device="synthetic") as w:
        rows = np.zeros((len(params), 5), dtype=np.int64)
        rows[:, 1] = np.arange(len(params))
        rows[:, 2] = params
        next_id = len(params)
        w.write_trace(Trace("p", "memory", rows, [0, 7], [""]))
        written += len(rows)
        while written < n_ops:
            steps = max(1, min(100, (n_ops - written) // (4 * m) or 1))
            chunks = []
            for _ in range(steps):
                act_sizes = np.maximum(1, (base * rng.uniform(0.5, 1.0))).astype(np.int64)
                tmp_sizes = np.maximum(1, (base // 4 * rng.uniform(0.5, 1.0))).astype(np.int64)
                a_ids = next_id + np.arange(m)
                t_ids = next_id + m + np.arange(m)
                next_id += 2 * m
                fwd = np.zeros((m, 3, 5), dtype=np.int64)
                fwd[:, 0] = np.stack([np.zeros(m), a_ids, act_sizes, np.zeros(m), np.zeros(m)], 1)
                fwd[:, 1] = np.stack([np.zeros(m), t_ids, tmp_sizes, side, np.zeros(m)], 1)
                fwd[:, 2] = np.stack([np.ones(m), t_ids, tmp_sizes, side, np.zeros(m)], 1)
                bwd = np.stack([np.ones(m), a_ids[::-1], act_sizes[::-1], np.zeros(m), np.zeros(m)], 1)
                chunks += [fwd.reshape(-1, 5), bwd.astype(np.int64)]
            rows = np.concatenate(chunks)
            w.write_trace(Trace("s", "memory", rows, [0, 7], [""]))
            written += len(rows)
        rows = np.zeros((len(params), 5), dtype=np.int64)
        rows[:, 0] = 1
        rows[:, 1] = np.arange(len(params))
        rows[:, 2] = params
        w.write_trace(Trace("p", "memory", rows, [0, 7], [""]))
        written += len(rows)
    return written


def write_csv(v1_path: str, csv_path: str) -> None:
    """The same trace as a gzip PyTorch trace CSV (t_us,action,addr,size,stream), with made-up
    addresses (one per allocation id) and times."""
    import gzip
    from vramkit.trace import load_trace
    tr = load_trace(v1_path)
    ops = tr.ops
    names = ("alloc", "free_requested")
    with gzip.open(csv_path, "wt", compresslevel=1) as f:
        f.write("t_us,action,addr,size,stream\n")
        step = 1 << 20
        for a in range(0, len(ops), step):
            part = ops[a:a + step]
            addr = (part[:, 1] * 512 + (1 << 40)).tolist()
            stream = [tr.streams[s] for s in part[:, 3].tolist()]
            f.write("".join(f"{a + k},{names[act]},{ad},{sz},{st}\n" for k, (act, ad, sz, st) in
                            enumerate(zip(part[:, 0].tolist(), addr, part[:, 2].tolist(), stream))))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", type=int, default=10_000_000)
    ap.add_argument("--keep", help="write the trace here and keep it")
    ap.add_argument("--capacity", default="24GiB")
    ap.add_argument("--csv", action="store_true",
                    help="also write the trace as a PyTorch trace CSV (gzip) and time advise on that")
    ap.add_argument("--report", action="store_true",
                    help="also time `vramkit report` (1 pass) and open the HTML in headless Chromium")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="vk-long-")
    path = args.keep or os.path.join(tmp, "synthetic_long.vktrace")
    t0 = time.perf_counter()
    n = make_trace(path, args.ops)
    t_make = time.perf_counter() - t0
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "vramkit", "advise", path, "--capacity", args.capacity,
                        "--no-progress"], capture_output=True, text=True)
    t_advise = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    if p.returncode != 0:
        print(p.stderr, file=sys.stderr)
        return 1
    print(p.stdout)
    print(f"{'ops':>12} {'trace MB':>9} {'make s':>7} {'advise s':>9} {'advise peak RSS MiB':>20}")
    print(f"{n:>12} {os.path.getsize(path) / 1e6:>9.1f} {t_make:>7.1f} {t_advise:>9.1f} {rss:>20.0f}")
    if args.csv:
        csv_path = os.path.join(tmp, "synthetic_long.trace.csv.gz")
        t0 = time.perf_counter()
        write_csv(path, csv_path)
        t_w = time.perf_counter() - t0
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "vramkit", "advise", csv_path, "--capacity", args.capacity,
                            "--no-progress"], capture_output=True, text=True)
        t_csv = time.perf_counter() - t0
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        if p.returncode != 0:
            print(p.stderr, file=sys.stderr)
            return 1
        print(f"\n{'CSV MB':>7} {'write s':>8} {'advise on CSV s':>16} {'peak RSS MiB (any child)':>25}")
        print(f"{os.path.getsize(csv_path) / 1e6:>7.1f} {t_w:>8.1f} {t_csv:>16.1f} {rss:>25.0f}")
        os.remove(csv_path)
    if args.report:
        html = os.path.join(tmp, "long.html")
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "vramkit", "report", path, "-o", html, "--passes", "1",
                            "--capacity", args.capacity, "--no-progress"], capture_output=True, text=True)
        t_report = time.perf_counter() - t0
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # max over both children
        if p.returncode != 0:
            print(p.stderr, file=sys.stderr)
            return 1
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
        import browser_check
        t0 = time.perf_counter()
        res = browser_check.check_page(html)
        t_open = time.perf_counter() - t0
        print(f"\n{'report s':>9} {'peak RSS MiB (any child)':>25} {'HTML MB':>8} {'Chromium open+check s':>22} errors")
        print(f"{t_report:>9.1f} {rss:>25.0f} {os.path.getsize(html) / 1e6:>8.2f} {t_open:>22.1f} "
              f"{len(res['errors'])}")
    if not args.keep:
        os.remove(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
