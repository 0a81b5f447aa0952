"""End-to-end training steps with vramkit as PyTorch's CUDA allocator vs PyTorch's own.

    python3 benchmarks/gpu_end_to_end.py [--out results.jsonl] [--models gpt2,resnet50]
                                         [--allocators default,vramkit[,vramkit-tracking]]
                                         [--warmup 3] [--steps 10]

Each (model, allocator) pair runs in its own process (``--child MODEL ALLOC``), since
vramkit.torch.use() must come before PyTorch allocates and each run must start cold:

* gpt2: GPT-2 small (transformers ``GPT2Config()``, random weights), batch 8, sequence 1024
  (halved until it fits), bf16 autocast, AdamW.
* resnet50: torchvision's (or timm's) ResNet-50, batch 128, 224x224, bf16 autocast, SGD with momentum.

Allocators: ``default`` is PyTorch's own caching allocator; ``vramkit`` is vramkit.torch.use();
``vramkit-tracking`` is vramkit.torch.use() plus leak tracking with Python call sites for the
whole run (the tracking adaptor that ``vramkit.leaks`` installs, wrapping the device's current
resource, so every tensor allocation records its size, stream and the Python line that made it).
Compare ``vramkit-tracking`` with ``vramkit`` for the cost of tracking:

    python3 benchmarks/gpu_end_to_end.py --models gpt2 --allocators vramkit,vramkit-tracking

Its JSON line adds ``tracking``: the tracker's counts (allocs, frees, live, events dropped), the
site hook's frame walks, and how many allocations in the event history got a call site (those
made on PyTorch's autograd threads, which run no Python, get none).

Warm-up steps, then timed steps (CUDA events around each step); the table shows the median
step time, the first (cold) step, and the peak memory the allocator reserved and handed out:
``torch.cuda.max_memory_reserved()/max_memory_allocated()`` for PyTorch's allocator,
``vramkit.max_memory_reserved()/max_memory_allocated()`` for vramkit. VRAMKIT_ALLOC_CONF in
the environment configures vramkit's pool. Whole script: about a minute and a half on an H200.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

MiB = 1 << 20


def build_gpt2(torch, seq: int, batch: int):
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config()
    model = GPT2LMHeadModel(cfg).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    data = [torch.randint(0, cfg.vocab_size, (batch, seq), generator=g) for _ in range(4)]

    def step(i):
        x = data[i % len(data)].cuda(non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss
    return step


def build_resnet50(torch, batch: int):
    try:
        import torchvision
        model = torchvision.models.resnet50(weights=None)
        source = "torchvision"
    except ImportError:
        import timm
        model = timm.create_model("resnet50", pretrained=False)
        source = "timm"
    model = model.cuda().train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(batch, 3, 224, 224, generator=g) for _ in range(2)]
    ys = [torch.randint(0, 1000, (batch,), generator=g) for _ in range(2)]
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(i):
        x = xs[i % 2].cuda(non_blocking=True)
        y = ys[i % 2].cuda(non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss
    step.source = source
    return step


ALLOCATORS = ("default", "vramkit", "vramkit-tracking")


def tracking_summary(tracker, hook_calls0: int) -> dict:
    """What the tracker saw: counts, frame walks, and call sites in the event history."""
    from vramkit import _vramkit
    out = dict(_vramkit.tracking_counts(tracker))
    out["hook_calls"] = _vramkit.site_hook_calls() - hook_calls0
    ev = [e for e in _vramkit.tracked_events(tracker) if e[0] == "alloc"]
    out["history_allocs"] = len(ev)
    out["history_allocs_with_site"] = sum(1 for e in ev if e[5])
    out["sites"] = len({e[5] for e in ev if e[5]})
    return out


def child(model_name: str, alloc: str, warmup: int, steps: int, seq: int, snapshot: str = "") -> dict:
    if alloc not in ALLOCATORS:
        raise SystemExit(f"unknown allocator {alloc!r} ({', '.join(ALLOCATORS)})")
    tracking = None
    if alloc.startswith("vramkit"):
        import vramkit
        import vramkit.torch
        vramkit.torch.use()
        if alloc == "vramkit-tracking":
            from vramkit import _vramkit
            from vramkit.leaks import _tracking
            hook_calls0 = _vramkit.site_hook_calls()
            tracking = _tracking.acquire(None, python_stacks=True)  # (device, tracker), until the end
    import torch
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    # cuDNN benchmark mode asks the allocator for cacheInfo, which PyTorch's pluggable
    # allocators cannot answer: off for both allocators so the comparison is fair.
    torch.backends.cudnn.benchmark = False
    torch.manual_seed(0)
    if snapshot:
        # PyTorch's allocation history from the first allocation on, without stacks: a
        # whole-run trace that `vramkit replay` reads (recording slows the steps down).
        if alloc != "default":
            raise SystemExit("--snapshot records PyTorch's own allocator's history: use it with 'default'")
        torch.cuda.memory._record_memory_history(max_entries=1_000_000, context=None, stacks="python")
    res = {"model": model_name, "allocator": alloc, "torch": torch.__version__,
           "device": torch.cuda.get_device_name(0), "warmup": warmup, "steps": steps}
    try:
        if model_name == "gpt2":
            step = build_gpt2(torch, seq, 8)
            res.update(batch=8, seq=seq)
        elif model_name == "resnet50":
            step = build_resnet50(torch, 128)
            res.update(batch=128, source=step.source)
        else:
            raise SystemExit(f"unknown model {model_name!r} (gpt2, resnet50)")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step(0)
        torch.cuda.synchronize()
        res["first_step_ms"] = (time.perf_counter() - t0) * 1e3
        for i in range(1, warmup):
            step(i)
        torch.cuda.synchronize()
        times = []
        loss = None
        for i in range(steps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            loss = step(warmup + i)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        res["final_loss"] = float(loss)
    except torch.cuda.OutOfMemoryError as e:
        res["oom"] = str(e).splitlines()[0][:300]
        print(json.dumps(res), flush=True)
        return res
    if snapshot:
        torch.cuda.memory._dump_snapshot(snapshot)
        torch.cuda.memory._record_memory_history(enabled=None)
        res["snapshot"] = snapshot
    if tracking is not None:
        res["tracking"] = tracking_summary(tracking[1], hook_calls0)
        _tracking.release(tracking[0])  # the statistics below read the pool's own adaptor
    res["step_ms"] = times
    res["median_ms"] = statistics.median(times)
    res["min_ms"] = min(times)
    if alloc.startswith("vramkit"):
        res["peak_reserved"] = vramkit.max_memory_reserved()
        res["peak_allocated"] = vramkit.max_memory_allocated()
        st = vramkit.memory_stats()
        res["vramkit"] = {k: st[k] for k in ("fragmentation", "peak_fragmentation", "num_device_alloc",
                                             "num_alloc_retries", "pool.pages_remapped") if k in st}
        res["alloc_conf"] = os.environ.get("VRAMKIT_ALLOC_CONF", "")
    else:
        res["peak_reserved"] = torch.cuda.max_memory_reserved()
        res["peak_allocated"] = torch.cuda.max_memory_allocated()
        res["alloc_conf"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    print(json.dumps(res), flush=True)
    return res


def run_child(model: str, alloc: str, a) -> dict:
    seq = a.seq
    while True:
        cmd = [sys.executable, os.path.abspath(__file__), "--child", model, alloc,
               "--warmup", str(a.warmup), "--steps", str(a.steps), "--seq", str(seq)]
        if a.snapshot:
            cmd += ["--snapshot", os.path.join(a.snapshot, f"{model}-{alloc}.pickle")]
        env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=a.timeout)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        if p.returncode != 0 or not lines:
            return {"model": model, "allocator": alloc, "error": f"rc {p.returncode}: {p.stderr[-1500:]}"}
        r = json.loads(lines[-1])
        r["process_s"] = time.perf_counter() - t0
        if "oom" in r and model == "gpt2" and seq > 128:
            seq //= 2  # "sequence 1024 if memory allows"
            continue
        return r


def fmt_mib(n) -> str:
    return f"{n / MiB:,.0f}" if isinstance(n, (int, float)) else "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", nargs=2, metavar=("MODEL", "ALLOC"), help=argparse.SUPPRESS)
    ap.add_argument("--models", default="gpt2,resnet50")
    ap.add_argument("--allocators", default="default,vramkit")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--seq", type=int, default=1024, help="GPT-2 sequence length to try first")
    ap.add_argument("--timeout", type=float, default=200, help="seconds per child process")
    ap.add_argument("--out", help="append one JSON line per run to this file")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run every (model, allocator) pair this many times, interleaved; the summary "
                         "compares the medians over runs")
    ap.add_argument("--snapshot", metavar="DIR",
                    help="record PyTorch's allocation history of the 'default' runs into "
                         "DIR/MODEL-default.pickle (slows them: their step times do not compare)")
    a = ap.parse_args()
    if a.child:
        r = child(a.child[0], a.child[1], a.warmup, a.steps, a.seq, a.snapshot or "")
        return 0 if "oom" not in r else 3

    stamp = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    if a.repeat < 1:
        ap.error("--repeat must be at least 1")
    if a.snapshot:
        os.makedirs(a.snapshot, exist_ok=True)
    rows = []
    for model in a.models.split(","):
        for alloc in [x for _ in range(a.repeat) for x in a.allocators.split(",")]:
            r = run_child(model, alloc, a)
            r["date"] = stamp
            rows.append(r)
            if a.out:
                with open(a.out, "a") as f:
                    f.write(json.dumps(r) + "\n")
            state = r.get("error") or r.get("oom") or f"{r['median_ms']:.1f} ms/step"
            print(f"  {model:9s} {alloc:16s} {state}", file=sys.stderr, flush=True)

    dev = next((r.get("device") for r in rows if r.get("device")), "?")
    tv = next((r.get("torch") for r in rows if r.get("torch")), "?")
    print(f"\n{stamp}  {dev}  torch {tv}  warm-up {a.warmup}, timed {a.steps} steps (CUDA events)")
    print("| model | allocator | batch x seq | median step ms | min ms | first step ms | peak reserved MiB "
          "| peak allocated MiB | reserved/allocated |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "median_ms" not in r:
            print(f"| {r['model']} | {r['allocator']} | | {r.get('error') or r.get('oom')} | | | | | |")
            continue
        shape = f"{r['batch']} x {r['seq']}" if "seq" in r else f"{r['batch']} x 224²"
        ratio = r["peak_reserved"] / r["peak_allocated"] if r.get("peak_allocated") else float("nan")
        print(f"| {r['model']} | {r['allocator']} | {shape} | {r['median_ms']:.1f} | {r['min_ms']:.1f} | "
              f"{r['first_step_ms']:.0f} | {fmt_mib(r['peak_reserved'])} | {fmt_mib(r['peak_allocated'])} | "
              f"{ratio:.3f} |")
    by = {}
    for r in rows:
        if "median_ms" in r:
            by.setdefault((r["model"], r["allocator"]), []).append(r)
    # Over repeated runs: the median of the runs' median step times and peaks.
    by = {k: {"median_ms": statistics.median(x["median_ms"] for x in v),
              "peak_reserved": statistics.median(x["peak_reserved"] for x in v),
              "tracking": v[-1].get("tracking", {}), "runs": len(v)} for k, v in by.items()}
    if a.repeat > 1:
        print(f"(summary below: medians over {a.repeat} runs of each pair)")
    for model in a.models.split(","):
        d, v, t = by.get((model, "default")), by.get((model, "vramkit")), by.get((model, "vramkit-tracking"))
        if d and v:
            print(f"{model}: vramkit step time {v['median_ms'] / d['median_ms']:.3f}x of PyTorch's allocator, "
                  f"peak reserved {v['peak_reserved'] / d['peak_reserved']:.3f}x")
        if v and t:
            tr = t.get("tracking", {})
            print(f"{model}: tracking with call sites costs {100 * (t['median_ms'] / v['median_ms'] - 1):+.1f}% "
                  f"median step time over vramkit ({t['median_ms']:.1f} vs {v['median_ms']:.1f} ms); "
                  f"{tr.get('allocs', 0)} allocations tracked, {tr.get('hook_calls', 0)} frame walks, "
                  f"{tr.get('history_allocs_with_site', 0)} of the last {tr.get('history_allocs', 0)} with a site")
    return 0 if all("median_ms" in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
