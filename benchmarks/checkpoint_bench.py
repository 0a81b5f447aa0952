"""Gradient-checkpoint plans on the GPU: measured peak memory and step time per budget.

    python3 benchmarks/checkpoint_bench.py [--json checkpoint_bench.json] [--models gpt2,vit]
                                           [--vramkit] [--quick]

For each model (GPT-2 from a config: 12 layers, 768 wide, batch 8 x 1024 tokens, eager attention;
timm ViT-B/16 at batch 64), profile one training step, then measure: no checkpointing, Chen's
sqrt(n) rule, checkpoint-all, and the planner's optimal plan at budgets from the least feasible
peak to the un-checkpointed one and at the sqrt(n) and checkpoint-all peaks. Peak =
torch.cuda.max_memory_allocated (and max_memory_reserved) over the measured steps; time = median
step. PyTorch's default allocator unless --vramkit. Prints one table per model, writes JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time



def table(rows, none) -> str:
    hdr = ["plan", "budget GiB", "pred GiB", "alloc GiB", "resv GiB", "pred err", "fits", "ckpt blocks",
           "step ms", "vs none"]
    out = []
    for x in rows:
        b = x["budget"]
        fits = "-" if b is None else ("yes" if x["peak_allocated"] <= b else "NO")
        err = (x["predicted_peak"] - x["peak_allocated"]) / x["peak_allocated"]
        out.append([x["plan"], "-" if b is None else f"{b / 2**30:.2f}", f"{x['predicted_peak'] / 2**30:.2f}",
                    f"{x['peak_allocated'] / 2**30:.2f}", f"{x['peak_reserved'] / 2**30:.2f}", f"{100 * err:+.1f} %",
                    fits, str(len(x["checkpointed"])), f"{x['step_time'] * 1e3:.1f}",
                    f"{100 * (x['step_time'] / none['step_time'] - 1):+.1f} %"])
    w = [max(len(h), *(len(r[i]) for r in out)) for i, h in enumerate(hdr)]
    lines = ["  ".join(h.ljust(w[i]) for i, h in enumerate(hdr)), "  ".join("-" * v for v in w)]
    lines += ["  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(r)) for r in out]
    return "\n".join(lines)


def dominance(rows) -> list:
    """For sqrt(n) and all: the fastest optimal plan whose measured peak is no higher."""
    notes = []
    opt = [x for x in rows if x["plan"].startswith("optimal")]
    for name in ("sqrt(n)", "all"):
        b = next(x for x in rows if x["plan"] == name)
        ok = [x for x in opt if x["peak_allocated"] <= b["peak_allocated"]]
        if not ok:
            notes.append(f"{name}: no optimal plan measured at or below its peak")
            continue
        best = min(ok, key=lambda x: x["step_time"])
        notes.append(f"{name}: {b['peak_allocated'] / 2**30:.2f} GiB, {b['step_time'] * 1e3:.1f} ms; optimal at or "
                     f"below that memory: {best['peak_allocated'] / 2**30:.2f} GiB, {best['step_time'] * 1e3:.1f} ms "
                     f"({best['plan']})")
    return notes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default="checkpoint_bench.json", help="output JSON path")
    ap.add_argument("--models", default="gpt2,vit", help="comma-separated: gpt2, vit, resnet50")
    ap.add_argument("--vramkit", action="store_true", help="vramkit's pool as PyTorch's allocator")
    ap.add_argument("--quick", action="store_true", help="smaller models and fewer steps (a smoke run)")
    ap.add_argument("--steps", type=int, default=5, help="measured steps per plan (default 5)")
    args = ap.parse_args(argv)
    if args.vramkit:
        import vramkit.torch
        vramkit.torch.use()
    import torch

    import vramkit.checkpoint as ck
    from vramkit.checkpoint import harness
    if not torch.cuda.is_available():
        print("checkpoint_bench: needs a CUDA device", file=sys.stderr)
        return 1
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    q = args.quick
    models = {
        "gpt2": harness.gpt2(n_layer=12, n_embd=768, n_head=12, seq=512 if q else 1024, batch=4 if q else 8),
        "vit": harness.timm_model("vit_base_patch16_224", batch=16 if q else 64),
        "resnet50": harness.timm_model("resnet50", batch=32 if q else 128),
    }
    wanted = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in wanted if m not in models]
    if bad:
        print(f"checkpoint_bench: unknown model(s) {bad}; choose from {sorted(models)}", file=sys.stderr)
        return 2
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "allocator": "vramkit" if args.vramkit else "pytorch", "models": {}}
    tables = []
    for name in wanted:
        t0 = time.perf_counter()
        build = models[name]
        chain = harness.profile_fresh(build)
        rows = []
        for p in harness.plans_for(chain):
            rows.append(harness.run_plan(build, p, steps=2 if q else args.steps, warmup=1))
            print(f"# {name} {p.name}: {rows[-1]['peak_allocated'] / 2**30:.2f} GiB, "
                  f"{rows[-1]['step_time'] * 1e3:.1f} ms", flush=True)
        none = next(x for x in rows if x["plan"] == "none")
        report["models"][name] = {"chain": chain.to_dict(), "least_budget": ck.minimum_budget(chain), "runs": rows,
                                  "seconds": time.perf_counter() - t0}
        tables.append(f"== {name}: {len(chain)} blocks, profiled step {chain.meta['step_time'] * 1e3:.1f} ms, "
                      f"least feasible peak {ck.minimum_budget(chain) / 2**30:.2f} GiB "
                      f"({time.perf_counter() - t0:.0f} s)\n" + table(rows, none) + "\n" +
                      "\n".join(dominance(rows)))
    tmp = args.json + ".tmp"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=1)
    os.replace(tmp, args.json)
    print(f"\n{report['device']}, torch {report['torch']}, allocator {report['allocator']}; wrote {args.json}\n")
    print("\n\n".join(tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())
