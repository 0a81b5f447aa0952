"""The gradient-checkpoint planner on a real GPU: profile a model, apply plans, measure them.

Run on the GPU machine:  python3 -m pytest -m gpu python/tests/test_gpu_checkpoint.py -q

For GPT-2 (Hugging Face), a timm ViT and a timm ResNet-50, each built from a config with a fixed
seed, one child process profiles the model and runs every plan (no checkpointing, sqrt(n),
checkpoint-all, and optimal plans at budgets from the least feasible to the un-checkpointed
peak) on a fresh copy, with PyTorch's default allocator and deterministic kernels.
"""
from __future__ import annotations

import os
import sys

import pytest

from gpu_child import GPU_MARKS, needs, run_json, show

pytestmark = GPU_MARKS

HERE = os.path.dirname(os.path.abspath(__file__))
_results: dict = {}


def result(name: str) -> dict:
    if name not in _results:
        env = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "TIMM_FUSED_ATTN": "0"}
        _results[name] = run_json([sys.executable, os.path.join(HERE, "checkpoint_child.py"), name],
                                  env=env, timeout=600)
    return _results[name]


MODELS = [pytest.param("gpt2", marks=needs("torch", "transformers")),
          pytest.param("vit", marks=needs("torch", "timm")),
          pytest.param("resnet", marks=needs("torch", "timm"))]


def _summary(r: dict) -> str:
    rows = [f"{x['plan']:<22} budget {x['budget']} predicted {x['predicted_peak']} measured {x['peak_allocated']} "
            f"extra {x['predicted_extra_time']:.4f}s step {x['step_time']:.4f}s peak at {x['predicted_where']}"
            for x in r["runs"]]
    return "\n".join(rows)


@pytest.mark.parametrize("name", MODELS)
def test_measured_peak_within_budget(name):
    r = result(name)
    opt = [x for x in r["runs"] if x["budget"] is not None]
    assert len(opt) >= 4, show(r)
    for x in opt:
        assert x["peak_allocated"] <= x["budget"], f"{x['plan']}: measured peak over the budget\n{_summary(r)}"


@pytest.mark.parametrize("name", MODELS)
def test_predicted_peak_within_5_percent(name):
    r = result(name)
    for x in r["runs"]:
        err = abs(x["predicted_peak"] - x["peak_allocated"]) / x["peak_allocated"]
        assert err <= 0.05, f"{x['plan']}: predicted {x['predicted_peak']} vs measured {x['peak_allocated']} " \
                            f"({100 * err:.1f} %)\n{_summary(r)}"


@pytest.mark.parametrize("name", MODELS)
def test_loss_and_gradients_equal_to_plain(name):
    # The loss and every block's gradients are bitwise equal (recomputation replays the same
    # kernels on the same inputs, with the RNG state restored for dropout). Parameters outside the
    # chain (embeddings, stem, head) may go through kernels with atomic adds (embedding, pooling
    # backward), so the whole model is compared to a relative error of 1e-6.
    # If two plain runs already differ (a kernel with no deterministic version), the plans are held
    # to that noise floor instead (10x its relative difference), and the test says so.
    r = result(name)
    again = next(x for x in r["runs"] if x["plan"] == "none (again)")
    exact = again["loss_equal"] and again["block_grads_equal"]
    floor = max(1e-6, 10 * again["grads_max_rel"])
    for x in r["runs"]:
        if exact:
            assert x["loss_equal"], f"{x['plan']}: loss {x['loss']} differs\n{_summary(r)}"
            assert x["block_grads_equal"], f"{x['plan']}: block gradients differ (max abs " \
                                           f"{x['block_max_abs_diff']} at {x['block_worst']})"
        assert x["grads_max_rel"] <= floor, f"{x['plan']}: gradients differ (relative {x['grads_max_rel']}, " \
                                            f"plain vs plain {again['grads_max_rel']})"
    if not exact:
        pytest.xfail(f"{name}: two plain runs are not bitwise equal (relative {again['grads_max_rel']}); plans "
                     f"checked against that noise floor only")


@pytest.mark.parametrize("name", MODELS)
def test_plans_recompute_and_save(name):
    r = result(name)
    runs = {x["plan"]: x for x in r["runs"]}
    none, allp = runs["none"], runs["all"]
    assert allp["peak_allocated"] < none["peak_allocated"], _summary(r)
    # The optimal plan at the checkpoint-all and sqrt(n) peaks predicts no more recomputation.
    for base in ("all", "sqrt(n)"):
        b, o = runs[base], runs[f"optimal={base}"]
        assert o["predicted_peak"] <= b["predicted_peak"], _summary(r)
        assert o["predicted_extra_time"] <= b["predicted_extra_time"] + 1e-9, _summary(r)
    assert r["too_small_error"] and "least peak any plan reaches" in r["too_small_error"]
