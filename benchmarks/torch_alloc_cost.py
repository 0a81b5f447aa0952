#!/usr/bin/env python3
"""What one allocation and its free cost the host, through PyTorch, under each allocator.

A step that waits for the GPU in its middle (an MoE's expert loop reads each expert's token
count back) or that launches many small kernels is bound by the host, and then every
microsecond an allocation costs is on the step. This times ``torch.empty`` plus the tensor's
free in a loop, with no kernel launched, in one new process per (allocator, repeat), the
allocators interleaved and their order rotated per repeat:

    python3 benchmarks/torch_alloc_cost.py [--allocators default,expandable,vramkit,vramkit-cuda]
                                           [--repeat 3] [--count 100000] [--json PATH] [--dry-run]

Patterns (sizes drawn once from a fixed seed: 256 B to 16 MiB plus up to 256 KiB, a mix of the
small and large requests a model makes):

* ``temp``: each tensor is freed before the next is made (a temporary inside an op);
* ``window8`` / ``window64``: the last 8 / 64 tensors stay alive (activations in flight).

Under vramkit each process also keeps the time its pool spent in page calls during each
pattern's timed loops (``<pattern>_page_call_ms`` in the JSON and the progress lines): a
process whose figure is high there moved pages inside the loop.

Each process warms every pattern up once, then times it ``--loops`` times; its figure is the
median loop's us per pair. The table gives, per allocator, the median over the repeats and the
ratio to PyTorch default's. Allocator names are those of gpu_end_to_end.py (``vramkit@KEY:VALUE``
runs the pool with those options).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e.child import _page_op_reader, is_vramkit, variant_options  # noqa: E402

PATTERNS = {"temp": 0, "window8": 8, "window64": 64}
RESULT = "ALLOC-COST "


def sizes(n: int = 4096, seed: int = 1) -> list[int]:
    rng = random.Random(seed)
    return [rng.choice([256, 4096, 65536, 1 << 20, 4 << 20, 16 << 20]) + rng.randrange(0, 512) * 512
            for _ in range(n)]


def child(alloc: str, count: int, loops: int) -> dict:
    if alloc == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    elif is_vramkit(alloc):
        import vramkit.torch
        vramkit.torch.use(**variant_options(alloc))
    elif alloc != "default":
        raise SystemExit(f"unknown allocator {alloc!r}")
    import torch
    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    sz = sizes()
    mask = len(sz) - 1

    def loop(hold: int) -> float:
        live: list = []
        t = time.perf_counter()
        for i in range(count):
            live.append(torch.empty(sz[i & mask], dtype=torch.uint8, device="cuda"))
            if len(live) > hold:
                del live[0]
        live.clear()
        torch.cuda.synchronize()
        return (time.perf_counter() - t) / count * 1e6

    read = _page_op_reader(alloc)  # the pool's page calls, to tell a loop that moved pages
    out = {}
    for name, hold in PATTERNS.items():
        loop(hold)
        before = read() if read else None
        out[name] = statistics.median(loop(hold) for _ in range(loops))
        if read:
            after = read()
            out[name + "_page_call_ms"] = sum(after[k] - before[k] for k in after if k.endswith("_ns")) / 1e6
    return out


def plan(allocators: list[str], repeat: int) -> list[tuple[int, str]]:
    """(repeat, allocator) in run order: every allocator once per repeat, the order rotated by one
    place from repeat to repeat."""
    runs = []
    for r in range(repeat):
        k = r % len(allocators)
        runs += [(r, a) for a in allocators[k:] + allocators[:k]]
    return runs


def table(results: dict[str, list[dict]], allocators: list[str]) -> str:
    """Medians over the repeats, us per pair, and the ratio to default's where it ran."""
    med = {a: {p: statistics.median(r[p] for r in results[a]) for p in PATTERNS} for a in allocators if results.get(a)}
    base = med.get("default")
    lines = ["| allocator | " + " | ".join(f"{p}, us/pair" for p in PATTERNS)
             + (" | " + " | ".join(f"{p} / default" for p in PATTERNS) if base else "") + " |",
             "|---" * (1 + len(PATTERNS) * (2 if base else 1)) + "|"]
    for a, m in med.items():
        row = [a] + [f"{m[p]:.2f}" for p in PATTERNS]
        if base:
            row += [f"{m[p] / base[p]:.2f}" for p in PATTERNS]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--allocators", default="default,expandable,vramkit,vramkit-cuda")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--count", type=int, default=100_000, help="allocations per timed loop")
    ap.add_argument("--loops", type=int, default=3, help="timed loops per pattern and process")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per process")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--dry-run", action="store_true", help="print the run order and stop")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(RESULT + json.dumps(child(a.child[0], int(a.child[1]), int(a.child[2]))), flush=True)
        return 0
    allocators = [x for x in (s.strip() for s in a.allocators.split(",")) if x]
    bad = [x for x in allocators if x not in ("default", "expandable") and not is_vramkit(x)]
    if bad or not allocators:
        ap.error(f"unknown allocator {bad[0]!r}" if bad else "no allocator given")
    for x in allocators:
        try:
            variant_options(x)
        except ValueError as e:
            ap.error(str(e))
    if a.repeat < 1 or a.count < 1 or a.loops < 1:
        ap.error("--repeat, --count and --loops must be at least 1")
    runs = plan(allocators, a.repeat)
    if a.dry_run:
        for r, x in runs:
            print(f"repeat {r}: {x}")
        return 0
    results: dict[str, list[dict]] = {x: [] for x in allocators}
    failed = 0
    for r, x in runs:
        env = {k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}
        try:
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", x, str(a.count), str(a.loops)],
                               capture_output=True, text=True, timeout=a.timeout, env=env)
            line = next((s for s in p.stdout.splitlines() if s.startswith(RESULT)), None)
        except subprocess.TimeoutExpired:
            p, line = None, None
        if line is None:
            failed += 1
            why = "timed out" if p is None else (p.stderr.strip().splitlines() or ["no output"])[-1]
            print(f"repeat {r} {x}: failed: {why}", file=sys.stderr)
            continue
        res = json.loads(line[len(RESULT):])
        results[x].append(res)
        print(f"repeat {r} {x}: " + ", ".join(f"{k} {v:.2f}" for k, v in res.items()), file=sys.stderr, flush=True)
    print(f"torch.empty + free, us per pair (median of {a.repeat} processes, each the median of {a.loops} loops "
          f"of {a.count:,})")
    print(table(results, allocators))
    if a.json:
        tmp = a.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"argv": sys.argv[1:] if argv is None else argv, "results": results}, f, indent=1)
        os.replace(tmp, a.json)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
