"""What one allocate+free pair costs from Python: vramkit vs PyTorch's Python paths.

    python3 benchmarks/python_alloc_bench.py [--iters 20000] [--runs 7] [--sizes 256,4096,...]

Rows (each a warm pair: the pool already holds the memory, so this is the fast path plus
the Python call overhead):

* ``vramkit.alloc(n).free()``           - the public API (argument checks, DeviceBuffer object)
* ``_vramkit.alloc(n).free()``          - the extension call, no Python wrapper
* ``Resource.allocate/deallocate``      - raw pointers through the current resource (no object)
* ``torch.cuda.caching_allocator_alloc/delete`` - PyTorch's raw-pointer path (if torch and a GPU)
* ``torch.empty(n, uint8, cuda)``       - a tensor through PyTorch's allocator
* ``torch.empty`` with vramkit          - the same through vramkit's shim (a child process, as
                                          vramkit.torch.use() must come first)

Prints ns per pair: the median over ``--runs`` runs of ``--iters`` pairs. Runs on the host
backend too (the torch rows are then skipped).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import vramkit
from vramkit import _vramkit

DEFAULT_SIZES = [256, 4096, 65536, 1 << 20, 16 << 20]


def short_size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def measure(pair, iters: int, runs: int) -> float:
    for _ in range(min(iters, 1000)):  # warm: the pool holds the memory, caches are hot
        pair()
    out = []
    for _ in range(runs):
        t0 = time.perf_counter_ns()
        for _ in range(iters):
            pair()
        out.append((time.perf_counter_ns() - t0) / iters)
    return statistics.median(out)


def vramkit_rows(n: int, iters: int, runs: int) -> dict:
    res = vramkit.get_current_resource()
    alloc = _vramkit.alloc
    return {
        "vramkit.alloc(n).free()": measure(lambda: vramkit.alloc(n).free(), iters, runs),
        "_vramkit.alloc(n).free()": measure(lambda: alloc(n, None, None).free(), iters, runs),
        "Resource.allocate/deallocate": measure(lambda: res.deallocate(res.allocate(n), n), iters, runs),
    }


def torch_rows(n: int, iters: int, runs: int) -> dict:
    import torch
    ca, cd = torch.cuda.caching_allocator_alloc, torch.cuda.caching_allocator_delete
    dev = torch.device("cuda", 0)
    u8 = torch.uint8
    rows = {"torch.cuda.caching_allocator_alloc/delete": measure(lambda: cd(ca(n)), iters, runs)}
    rows["torch.empty(n, uint8, cuda)"] = measure(lambda: torch.empty(n, dtype=u8, device=dev), iters, runs)
    return rows


def torch_vramkit_child(sizes, iters: int, runs: int) -> dict:
    import vramkit.torch
    vramkit.torch.use()
    import torch
    dev = torch.device("cuda", 0)
    u8 = torch.uint8
    return {str(n): {"torch.empty with vramkit": measure(lambda: torch.empty(n, dtype=u8, device=dev), iters, runs)}
            for n in sizes}


def have_torch_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available() and vramkit.backend() == "cuda"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=20000)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)))
    ap.add_argument("--child-torch-vramkit", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    sizes = [int(vramkit.parse_size(s)) for s in a.sizes.split(",")]
    if a.child_torch_vramkit:
        print(json.dumps(torch_vramkit_child(sizes, a.iters, a.runs)))
        return 0

    table = {n: vramkit_rows(n, a.iters, a.runs) for n in sizes}
    notes = []
    if have_torch_gpu():
        for n in sizes:
            table[n].update(torch_rows(n, a.iters, a.runs))
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child-torch-vramkit",
                            "--iters", str(a.iters), "--runs", str(a.runs), "--sizes", a.sizes],
                           capture_output=True, text=True, timeout=600)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        if p.returncode == 0 and lines:
            for n, rows in json.loads(lines[-1]).items():
                table[int(n)].update(rows)
        else:
            notes.append(f"torch.empty with vramkit: child failed (rc {p.returncode}): {p.stderr[-500:]}")
    else:
        notes.append("PyTorch rows skipped: " + ("no CUDA GPU for vramkit" if vramkit.backend() != "cuda"
                                                  else "torch is not installed or sees no GPU"))

    names = list(dict.fromkeys(k for rows in table.values() for k in rows))
    print(f"vramkit {vramkit.__version__}, backend {vramkit.backend()}, python {sys.version.split()[0]}; "
          f"ns per alloc+free pair, median of {a.runs} runs x {a.iters} pairs")
    print("| path | " + " | ".join(short_size(n) for n in sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    for name in names:
        cells = [f"{table[n][name]:.0f}" if name in table[n] else "-" for n in sizes]
        print(f"| {name} | " + " | ".join(cells) + " |")
    for note in notes:
        print(note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
