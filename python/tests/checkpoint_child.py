"""GPU child for test_gpu_checkpoint.py: profile a small model, measure every plan, print JSON.

Usage: python checkpoint_child.py {gpt2,vit,resnet}
Runs with deterministic kernels (CUBLAS_WORKSPACE_CONFIG set by the parent) so that the loss and
gradients of every plan can be compared with the un-checkpointed model's.
"""
from __future__ import annotations

import json
import sys

import torch

import vramkit.checkpoint as ck
from vramkit.checkpoint import harness

MODELS = {
    # Small enough for seconds per plan, large enough that activations are most of the peak.
    "gpt2": harness.gpt2(n_layer=6, n_embd=512, n_head=8, vocab=8192, seq=512, batch=8),
    "vit": harness.timm_model("vit_small_patch16_224", batch=32, classes=10, depth=6),
    "resnet": harness.timm_model("resnet50", batch=32, image=128, classes=10),
}


def main(name: str) -> None:
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    build = MODELS[name]
    chain = harness.profile_fresh(build)
    # Budgets no plan fits come back as NoFit rows (none is expected here: every budget is at or
    # above the least feasible peak); they are kept in the JSON, not run.
    entries = harness.plans_for(chain)
    plans = [p for p in entries if isinstance(p, ck.Plan)]
    res = {"model": name, "blocks": len(chain), "names": chain.names, "least": ck.minimum_budget(chain),
           "chain": chain.to_dict(), "runs": [], "no_fit": [p.row() for p in entries if not isinstance(p, ck.Plan)]}
    try:
        ck.plan(chain, res["least"] - 1)
        res["too_small_error"] = None
    except ck.BudgetError as e:
        res["too_small_error"] = str(e)
    ref = None
    model_blocks = [f"{n}." for n in chain.names]
    # The plain model runs twice: if two plain runs differ (a kernel without a deterministic
    # version), that difference is the noise floor the checkpointed plans are held to.
    again = ck.no_checkpoint(chain)
    again.name = "none (again)"
    for p in [plans[0], again] + plans[1:]:
        r = harness.run_plan(build, p, steps=2, warmup=1, keep_grads=True)
        if ref is None:
            ref = r     # the plain run's loss and gradients; r's own are dropped from its row below
        cmp_blocks = harness.compare_grads(
            {**ref, "grads": {k: v for k, v in ref["grads"].items() if k.startswith(tuple(model_blocks))}},
            {**r, "grads": {k: v for k, v in r["grads"].items() if k.startswith(tuple(model_blocks))}})
        cmp_all = harness.compare_grads(ref, r)
        loss_equal = bool(torch.equal(ref["loss_tensor"], r["loss_tensor"]))
        rel = 0.0
        for k, g in ref["grads"].items():
            h = r["grads"][k]
            if g is not None and h is not None:
                rel = max(rel, float((g.double() - h.double()).norm() / max(g.double().norm(), 1e-30)))
        # A new dict for the row: r may be ref itself, whose tensors every later plan compares with.
        row = {k: v for k, v in r.items() if k not in ("grads", "loss_tensor")}
        row.update(block_grads_equal=cmp_blocks["equal"], block_max_abs_diff=cmp_blocks["max_abs_diff"],
                   block_worst=cmp_blocks["where"], loss_equal=loss_equal,
                   all_grads_equal=cmp_all["equal"], grads_max_rel=rel)
        res["runs"].append(row)
        print(f"# {p.name:<22} predicted {p.peak / 2**20:9.1f} MiB measured {row['peak_allocated'] / 2**20:9.1f} MiB "
              f"step {row['step_time'] * 1e3:7.2f} ms  block grads equal {row['block_grads_equal']}", flush=True)
    for x in res["no_fit"]:
        print(f"# {x['plan']:<22} does not fit: {x['error']}", flush=True)
    print(json.dumps(res, default=str))


if __name__ == "__main__":
    main(sys.argv[1])
