"""Gradient-checkpoint plans on the GPU: measured peak memory and step time per budget.

    python3 benchmarks/checkpoint_bench.py [--json checkpoint_bench.json] [--models gpt2,vit]
                                           [--budgets 8GiB,12GiB] [--rounds 5] [--steps 5]
                                           [--vramkit] [--quick]

For each model (GPT-2 from a config: 12 layers, 768 wide, batch 8 x 1024 tokens, eager attention;
timm ViT-B/16 at batch 64), profile one training step, then measure: no checkpointing, Chen's
sqrt(n) rule, checkpoint-all, and the planner's optimal plan at budgets from the least feasible
peak to the un-checkpointed one (and at any --budgets) and at the sqrt(n) and checkpoint-all
peaks. Peak = torch.cuda.max_memory_allocated (and max_memory_reserved), each plan on a fresh
model. Time = median step over --rounds rounds on one model, each round timing --steps steps of
every plan in turn (interleaved, so that drift falls on all plans alike); the table gives the
spread of the per-round medians too. Plans with the same segments are the same plan: measured
once, and the table says "= <plan>". A budget no plan fits is a "does not fit" row (the planner's
answer), and the sweep goes on. PyTorch's default allocator unless --vramkit. Prints one table per
model, writes JSON. A full gpt2,vit run takes about 2 minutes on an H200.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


def table(rows, none) -> str:
    hdr = ["plan", "budget GiB", "pred GiB", "alloc GiB", "resv GiB", "pred err", "fits", "ckpt blocks",
           "step ms", "spread", "vs none"]
    out = []
    for x in rows:
        b = x["budget"]
        if "error" in x:                      # no plan fits this budget
            out.append([x["plan"], f"{b / 2**30:.2f}", "-", "-", "-", "-", "no plan", "-", "-", "-", "-"])
            continue
        fits = "-" if b is None else ("yes" if x["peak_allocated"] <= b else "NO")
        err = (x["predicted_peak"] - x["peak_allocated"]) / x["peak_allocated"]
        step = f"= {x['same_as']}" if x.get("same_as") else f"{x['step_time'] * 1e3:.1f}"
        out.append([x["plan"], "-" if b is None else f"{b / 2**30:.2f}", f"{x['predicted_peak'] / 2**30:.2f}",
                    f"{x['peak_allocated'] / 2**30:.2f}", f"{x['peak_reserved'] / 2**30:.2f}", f"{100 * err:+.1f} %",
                    fits, str(len(x["checkpointed"])), step, f"{100 * x['step_spread']:.1f} %",
                    f"{100 * (x['step_time'] / none['step_time'] - 1):+.1f} %"])
    w = [max(len(h), *(len(r[i]) for r in out)) for i, h in enumerate(hdr)]
    lines = ["  ".join(h.ljust(w[i]) for i, h in enumerate(hdr)), "  ".join("-" * v for v in w)]
    lines += ["  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(r)) for r in out]
    lines.append("spread: (max - min) / median of the per-round median step times; \"= p\": the same segments "
                 "as plan p (measured once)")
    lines += [f"{x['plan']}: does not fit: {x['error']}" for x in rows if "error" in x]
    return "\n".join(lines)


def dominance(rows) -> list:
    """For sqrt(n) and all: the fastest optimal plan whose measured peak is no higher."""
    notes = []
    opt = [x for x in rows if x["plan"].startswith("optimal") and "error" not in x]
    for name in ("sqrt(n)", "all"):
        b = next(x for x in rows if x["plan"] == name)
        ok = [x for x in opt if x["peak_allocated"] <= b["peak_allocated"]]
        if not ok:
            notes.append(f"{name}: no optimal plan measured at or below its peak")
            continue
        best = min(ok, key=lambda x: x["step_time"])
        same = best.get("same_as") or best["plan"]
        notes.append(f"{name}: {b['peak_allocated'] / 2**30:.2f} GiB, {b['step_time'] * 1e3:.1f} ms; optimal at or "
                     f"below that memory: {best['peak_allocated'] / 2**30:.2f} GiB, {best['step_time'] * 1e3:.1f} ms "
                     f"({best['plan']}" + (f", the same plan as {same})" if same == name else ")"))
    return notes


def measure(harness, build, entries, *, mem_steps: int, rounds: int, steps: int, log) -> list:
    """One row per entry of plans_for: no-fit rows as they are; each distinct plan's memory on a
    fresh model (run_plan), then the step times of all distinct plans, interleaved (time_plans)."""
    from vramkit.checkpoint import Plan
    rows, distinct, first = [], [], {}     # first: plan key -> the row that measured it
    for p in entries:
        if not isinstance(p, Plan):
            rows.append(p.row())
            log(f"{p.name}: does not fit ({p.error})")
            continue
        key = harness.plan_key(p)
        if key in first:
            row = dict(first[key])
            row.update(plan=p.name, budget=p.budget, same_as=first[key]["plan"])
            log(f"{p.name}: the same plan as {row['same_as']}")
        else:
            row = harness.run_plan(build, p, steps=mem_steps, warmup=1)
            row["memory_pass_step_time"] = row.pop("step_time")
            row["memory_pass_step_times"] = row.pop("step_times")
            first[key] = row
            distinct.append(p)
            log(f"{p.name}: {row['peak_allocated'] / 2**30:.2f} GiB")
        rows.append(row)
    times = harness.time_plans(build, distinct, rounds=rounds, steps=steps, warmup=1)
    timing = {}
    for p, per_round in zip(distinct, times):
        medians = [statistics.median(t) for t in per_round]
        mid = statistics.median([t for r in per_round for t in r])
        timing[harness.plan_key(p)] = {"step_time": mid, "round_medians": medians,
                                       "step_spread": (max(medians) - min(medians)) / mid, "step_times": per_round}
    for row in rows:
        if "error" not in row:
            row.update(timing[tuple((s, e, bool(c)) for s, e, c in row["segments"])])
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default="checkpoint_bench.json", help="output JSON path")
    ap.add_argument("--models", default="gpt2,vit", help="comma-separated: gpt2, vit, resnet50")
    ap.add_argument("--vramkit", action="store_true", help="vramkit's pool as PyTorch's allocator")
    ap.add_argument("--quick", action="store_true", help="smaller models and fewer steps (a smoke run)")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per plan and round (default 5)")
    ap.add_argument("--rounds", type=int, default=5, help="timing rounds over all plans (default 5)")
    ap.add_argument("--budgets", default="", help="more budgets for optimal plans, comma-separated (e.g. 8GiB,12GiB); "
                                                  "one no plan fits gives a 'does not fit' row")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.rounds < 1:
        ap.error("--steps and --rounds must be at least 1")
    from vramkit.checkpoint import BudgetError, parse_budget
    try:
        budgets = [parse_budget(b.strip()) for b in args.budgets.split(",") if b.strip()]
    except BudgetError as e:
        ap.error(str(e))
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
        rows = measure(harness, build, harness.plans_for(chain, budgets=budgets), mem_steps=2,
                       rounds=2 if q else args.rounds, steps=2 if q else args.steps,
                       log=lambda m, name=name: print(f"# {name} {m}", flush=True))
        for x in rows:
            if "error" not in x and not x.get("same_as"):
                print(f"# {name} {x['plan']}: {x['step_time'] * 1e3:.1f} ms (spread {100 * x['step_spread']:.1f} %)",
                      flush=True)
        none = next(x for x in rows if x["plan"] == "none")
        report["models"][name] = {"chain": chain.to_dict(), "least_budget": ck.minimum_budget(chain), "runs": rows,
                                  "seconds": time.perf_counter() - t0}
        tables.append(f"== {name}: {len(chain)} blocks, profiled step {chain.meta['step_time'] * 1e3:.1f} ms, "
                      f"least feasible peak {ck.minimum_budget(chain) / 2**30:.2f} GiB; held by checkpoints "
                      f"{chain.ckpt_extra / 2**20:.1f} MiB; recomputed backward vs kept, block 0 / last: "
                      + (f"{(chain.bwd_remat[0] - chain.bwd[0]) / 2**20:+.1f} / "
                         f"{(chain.bwd_remat[-1] - chain.bwd[-1]) / 2**20:+.1f} MiB " if chain.bwd_remat else "not measured ")
                      + f"({time.perf_counter() - t0:.0f} s)\n" + table(rows, none) + "\n" +
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
