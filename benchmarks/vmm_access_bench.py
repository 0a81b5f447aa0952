"""Do kernels run slower on memory vramkit maps page by page than on cudaMalloc memory?

The end-to-end suite (gpu_end_to_end.py) measures whole training steps in separate processes,
where the host's noise is as large as the differences sought. In one repeat on an H200, an MoE's
later steps took 166-207 ms under vramkit with no page operation, 157-194 under PyTorch's
expandable_segments and 110-141 under its default. In another repeat of the same run the default
was the slowest. This benchmark asks the GPU-side question alone, in one process, with the same
tensors and indices: the same kernels over buffers of the same size taken from

- ``cudaMalloc``: PyTorch's allocator (one segment);
- ``vmm``: vramkit's page resource (a reservation mapped with one 2 MiB handle per page);
- ``pool``: vramkit's pool over the vmm device (2 MiB pages, as ``vramkit.torch.use()`` gives);
- ``pool-8MiB``: the same with ``page_size:8MiB``;
- ``chunks-N``: the pool with ``chunk_size:N`` (2 MiB pages, the buffer's interior in N-byte handles);
- ``expandable``: PyTorch's allocator with ``expandable_segments:True`` (20 MiB handles), where
  this PyTorch can switch it on at run time.

Kernels: a sequential copy, a gather of random rows (``index_select``, as an MoE layer routes
tokens), a scatter-add of random rows (``index_add_``), and a gather of random 2-byte elements
(``take``: the worst case for address translation). Each is timed with CUDA events, the memories
interleaved round by round; the table prints the median over rounds and the ratio to cudaMalloc.

The second table asks the host-side question (``--host-ops``, 0 for none): what the host spends
submitting small operations over each memory, the GPU kept ahead of it. Each memory gets 256
views of 1 KiB, one every 2 MiB (each in a driver handle of its own where pages are 2 MiB), and
the host times, without waiting for the GPU, ``--host-ops`` launches of an in-place add over them
in turn and as many device-to-device copies between them (``copy_``, a cudaMemcpyAsync); us per
operation, median over rounds. A host-bound generation loop ran level with PyTorch's default
allocator under the paged pool, with no page call in its steps, and 4 % faster than it under the
same pool over cudaMalloc (docs/BENCHMARKS.md section 5, calls on different machines): if the
driver's handling of launches or copies costs more over memory mapped in many handles, it shows
here. On an H100 it did not: every memory within 2.5 % of cudaMalloc's host time for both
(docs/BENCHMARKS.md section 5, thirteenth session).

    python3 benchmarks/vmm_access_bench.py [--gib 4] [--rounds 15] [--host-ops 20000] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=4.0, help="size of each source buffer (GiB, default 4)")
    ap.add_argument("--rounds", type=int, default=15, help="rounds; each times every kernel on every memory")
    ap.add_argument("--json", default="", help="also write the results here")
    ap.add_argument("--chunks", default="16MiB,64MiB", help="chunk sizes to run the pool with (comma list; '' for none)")
    ap.add_argument("--host-ops", type=int, default=20000,
                    help="small operations a round for the host-side table (0: no such table; default 20000)")
    a = ap.parse_args(argv)
    if a.gib <= 0 or a.rounds < 1:
        ap.error("--gib must be > 0 and --rounds >= 1")
    if a.host_ops < 0:
        ap.error("--host-ops must be >= 0")
    if int(a.gib * (1 << 30)) < (2 << 20):
        ap.error("--gib must be at least one 2 MiB page (0.002)")
    try:
        import torch
    except ImportError:
        print("vmm_access_bench: needs PyTorch", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("vmm_access_bench: needs a CUDA GPU", file=sys.stderr)
        return 2
    import vramkit

    dev = torch.device("cuda", 0)
    nbytes = int(a.gib * (1 << 30)) // (1 << 21) * (1 << 21)
    width = 1024  # fp16 elements per row: 2 KiB rows
    rows = nbytes // (2 * width)

    keep = []  # vramkit buffers stay alive as long as their tensors

    def from_vramkit(spec: str):
        res = vramkit.make_resource(spec, 0)
        vramkit.set_current_resource(res, 0)
        buf = vramkit.alloc(nbytes)
        keep.append((res, buf))
        return torch.from_dlpack(buf).view(torch.float16).view(rows, width)

    memories = {"cudaMalloc": torch.empty(rows, width, dtype=torch.float16, device=dev)}
    default_resource = vramkit.get_current_resource(0)
    specs = [("vmm", "vmm"), ("pool", "pool:upstream=vmm"), ("pool-8MiB", "pool:upstream=vmm,page_size:8MiB")]
    specs += [(f"chunks-{c}", f"pool:upstream=vmm,chunk_size:{c}") for c in a.chunks.split(",") if c]
    for name, spec in specs:
        memories[name] = from_vramkit(spec)
    vramkit.set_current_resource(default_resource, 0)
    try:  # PyTorch's expandable segments, for new segments from here on
        torch.cuda.memory._set_allocator_settings("expandable_segments:True")
        memories["expandable"] = torch.empty(rows, width, dtype=torch.float16, device=dev)
        torch.cuda.memory._set_allocator_settings("expandable_segments:False")
    except (AttributeError, RuntimeError) as e:
        print(f"(no expandable segments at run time: {e})", file=sys.stderr)
    g = torch.Generator(device=dev).manual_seed(0)
    for t in memories.values():
        t.normal_(generator=g)
    picks = rows // 4
    idx = torch.randint(0, rows, (picks,), device=dev, generator=g)
    vals = torch.randn(picks, width, dtype=torch.float16, device=dev, generator=g)
    flat_idx = torch.randint(0, rows * width, (picks * width // 8,), device=dev, generator=g)
    out_rows = torch.empty(picks, width, dtype=torch.float16, device=dev)
    copy_dst = torch.empty(rows, width, dtype=torch.float16, device=dev)

    kernels = {
        "copy (sequential)": lambda t: copy_dst.copy_(t),
        "gather rows (index_select)": lambda t: torch.index_select(t, 0, idx, out=out_rows),
        "scatter-add rows (index_add_)": lambda t: t.index_add_(0, idx, vals),
        "gather elements (take)": lambda t: torch.take(t.view(-1), flat_idx),
    }
    times = {(k, m): [] for k in kernels for m in memories}
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for r in range(a.rounds + 1):  # round 0 warms up
        for k, fn in kernels.items():
            for m, t in memories.items():
                start.record()
                fn(t)
                stop.record()
                stop.synchronize()
                if r:
                    times[(k, m)].append(start.elapsed_time(stop))
    names = list(memories)
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}; buffers of {nbytes / (1 << 30):.2f} GiB, "
          f"median ms of {a.rounds} rounds (ratio to cudaMalloc)")
    print(f"| kernel | {' | '.join(names)} |\n|---|{'---|' * len(names)}")
    res = {"device": torch.cuda.get_device_name(0), "bytes": nbytes, "rounds": a.rounds, "ms": {}}
    for k in kernels:
        base = statistics.median(times[(k, "cudaMalloc")])
        cells = []
        for m in names:
            med = statistics.median(times[(k, m)])
            res["ms"][f"{k} / {m}"] = med
            cells.append(f"{med:.3f}" + ("" if m == "cudaMalloc" else f" ({med / base:.3f}x)"))
        print(f"| {k} | {' | '.join(cells)} |")
    if a.host_ops:
        res["host_us"] = host_table(torch, memories, a.rounds, a.host_ops)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    del memories
    keep.clear()
    return 0


HOST_VIEWS = 256        # views a memory, one every HOST_STRIDE bytes
HOST_STRIDE = 2 << 20   # a 2 MiB page apart: a handle each under 2 MiB pages
HOST_VIEW_BYTES = 1024


def host_views(t, views: int = HOST_VIEWS, stride: int = HOST_STRIDE, nbytes: int = HOST_VIEW_BYTES) -> list:
    """Views of ``nbytes`` at every ``stride`` bytes of the flat fp16 tensor ``t``, as many as fit up
    to ``views``."""
    flat = t.view(-1)
    step, n = stride // flat.element_size(), nbytes // flat.element_size()
    count = min(views, max(0, (flat.numel() - n) // step + 1))
    return [flat[i * step:i * step + n] for i in range(count)]


def host_table(torch, memories: dict, rounds: int, ops: int) -> dict:
    """Host us per small operation submitted over each memory (median over rounds), printed as a
    table; the GPU is waited for outside the timed loops."""
    import time
    views = {m: host_views(t) for m, t in memories.items()}
    kinds = {
        "add_ launch": lambda vs, i: vs[i % len(vs)].add_(1.0),
        "copy_ (memcpy D2D)": lambda vs, i: vs[i % len(vs)].copy_(vs[(i + 1) % len(vs)]),
    }
    us = {(k, m): [] for k in kinds for m in memories}
    for r in range(rounds + 1):  # round 0 warms up
        for k, fn in kinds.items():
            for m, vs in views.items():
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for i in range(ops):
                    fn(vs, i)
                t1 = time.perf_counter()
                torch.cuda.synchronize()
                if r:
                    us[(k, m)].append((t1 - t0) * 1e6 / ops)
    names = list(memories)
    print(f"\nhost us per operation submitted ({ops} a round over {HOST_VIEWS} views of {HOST_VIEW_BYTES} B, one every "
          f"{HOST_STRIDE >> 20} MiB; median of {rounds} rounds; ratio to cudaMalloc)")
    print(f"| operation | {' | '.join(names)} |\n|---|{'---|' * len(names)}")
    out = {}
    for k in kinds:
        base = statistics.median(us[(k, "cudaMalloc")])
        cells = []
        for m in names:
            med = statistics.median(us[(k, m)])
            out[f"{k} / {m}"] = med
            cells.append(f"{med:.2f}" + ("" if m == "cudaMalloc" else f" ({med / base:.3f}x)"))
        print(f"| {k} | {' | '.join(cells)} |")
    return out


if __name__ == "__main__":
    sys.exit(main())
