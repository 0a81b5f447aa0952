"""Measuring plans on a real model (PyTorch, CUDA): the GPU tests and the benchmark use this.

Each plan runs on a freshly built model (same seed, so the same weights): the first step gives
the loss and gradients (before any update, to compare plans), then warmup steps, then measured
steps whose peak ``max_memory_allocated`` / ``max_memory_reserved`` and median time are kept.
"""
from __future__ import annotations

import gc
import statistics
from dataclasses import dataclass

from .model import BudgetError, Plan, parse_budget
from .profiling import Step


def _release():
    import torch
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def run_plan(build, plan: Plan, *, steps: int = 5, warmup: int = 1, keep_grads: bool = False,
             blocks=None, seed: int = 1234) -> dict:
    """``build() -> (model, sample_input, loss_fn, optimizer)`` makes a fresh model.

    Returns measured ``peak_allocated``, ``peak_reserved``, ``step_time`` (median seconds), the
    first step's ``loss`` and, with ``keep_grads``, its gradients (on the host)."""
    import torch
    from .wrapping import apply_plan, remove
    _release()
    model, sample, loss_fn, opt = build()
    try:
        apply_plan(model, plan, blocks=blocks)
        step = Step(model, sample, loss_fn, opt)
        torch.manual_seed(seed)
        torch.cuda.manual_seed_all(seed)
        step.zero()
        loss = step.forward()
        loss.backward()
        out = {"plan": plan.name, "budget": plan.budget, "predicted_peak": plan.peak, "predicted_where": plan.where,
               "predicted_extra_time": plan.extra_time, "checkpointed": plan.checkpointed,
               "segments": [list(s) for s in plan.segments], "loss": float(loss.detach().float().item())}
        if keep_grads:
            out["loss_tensor"] = loss.detach().cpu()
            out["grads"] = {n: (p.grad.detach().cpu() if p.grad is not None else None)
                            for n, p in model.named_parameters()}
        del loss
        step.update()
        for _ in range(warmup):
            step()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(steps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            step()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        out["peak_allocated"] = int(torch.cuda.max_memory_allocated())
        out["peak_reserved"] = int(torch.cuda.max_memory_reserved())
        out["step_time"] = statistics.median(times)
        out["step_times"] = times
    finally:
        remove(model)
        del model, sample, opt
        step = None
        _release()
    return out


def time_plans(build, plans, *, rounds: int = 5, steps: int = 5, warmup: int = 1, blocks=None) -> list:
    """Step times of several plans on one freshly built model, interleaved to cancel drift.

    Each round applies every plan in turn (the order reversed every other round), runs ``warmup``
    steps, then times ``steps`` steps; slow changes (clocks, temperature, the allocator's cache
    filling) then fall on every plan alike instead of on whichever ran at the time. Returns, per
    plan, one list of step seconds per round. Memory is not measured here (the model carries every
    plan's history): :func:`run_plan` measures it on a fresh model."""
    import torch
    from .wrapping import apply_plan, remove
    if rounds < 1 or steps < 1 or warmup < 0:
        raise ValueError(f"need rounds >= 1, steps >= 1 and warmup >= 0 (got {rounds}, {steps}, {warmup})")
    times = [[] for _ in plans]
    _release()
    model, sample, loss_fn, opt = build()
    try:
        step = Step(model, sample, loss_fn, opt)
        for r in range(rounds):
            order = range(len(plans)) if r % 2 == 0 else range(len(plans) - 1, -1, -1)
            for i in order:
                apply_plan(model, plans[i], blocks=blocks)
                for _ in range(warmup):
                    step()
                ev = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
                torch.cuda.synchronize()
                ev[0].record()
                for k in range(steps):
                    step()
                    ev[k + 1].record()
                ev[-1].synchronize()
                times[i].append([ev[k].elapsed_time(ev[k + 1]) / 1e3 for k in range(steps)])
    finally:
        remove(model)
        del model, sample, opt
        step = None
        _release()
    return times


def profile_fresh(build, **kw):
    """Profile a freshly built model, then free it (so nothing else is live while measuring)."""
    from .profiling import profile
    _release()
    model, sample, loss_fn, opt = build()
    try:
        return profile(model, sample, loss_fn=loss_fn, optimizer=opt, **kw)
    finally:
        del model, sample, opt
        _release()


def compare_grads(ref: dict, got: dict) -> dict:
    """Bitwise equality of the first step's loss and gradients, with the largest difference."""
    import torch
    equal = bool(torch.equal(ref["loss_tensor"], got["loss_tensor"]))
    worst, worst_name = 0.0, None
    for name, g in ref["grads"].items():
        h = got["grads"].get(name)
        if (g is None) != (h is None):
            return {"equal": False, "max_abs_diff": float("inf"), "where": name}
        if g is None:
            continue
        if not torch.equal(g, h):
            equal = False
            d = float((g.double() - h.double()).abs().max())
            if d > worst:
                worst, worst_name = d, name
    return {"equal": equal, "max_abs_diff": worst, "where": worst_name}


# ---------------------------------------------------------------- models built from configs
# No downloads: weights come from a fixed seed. Each returns build() for run_plan/profile_fresh.

def gpt2(n_layer=12, n_embd=768, n_head=12, vocab=50257, seq=1024, batch=8, attn="eager", seed=0):
    """Hugging Face GPT-2 LM (loss from labels = input ids), AdamW."""
    def build():
        import torch
        from transformers import GPT2Config, GPT2LMHeadModel
        kw = dict(n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab, n_positions=seq, use_cache=False)
        try:
            cfg = GPT2Config(attn_implementation=attn, **kw)
        except TypeError:              # a transformers without the argument
            cfg = GPT2Config(**kw)
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(cfg)
        if getattr(model.config, "_attn_implementation", attn) != attn:
            try:
                model.config._attn_implementation = attn
            except Exception:
                pass
        model = model.cuda().train()
        g = torch.Generator(device="cpu").manual_seed(seed + 1)
        ids = torch.randint(0, vocab, (batch, seq), generator=g).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        return model, {"input_ids": ids, "labels": ids}, None, opt
    return build


def timm_model(name, batch=32, image=224, classes=1000, seed=0, **kw):
    """A timm model (``vit_base_patch16_224``, ``resnet50``...) with cross-entropy, AdamW."""
    def build():
        import timm
        import torch
        import torch.nn.functional as F
        torch.manual_seed(seed)
        model = timm.create_model(name, pretrained=False, num_classes=classes, **kw).cuda().train()
        g = torch.Generator(device="cpu").manual_seed(seed + 1)
        x = torch.randn(batch, 3, image, image, generator=g).cuda()
        y = torch.randint(0, classes, (batch,), generator=g).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        return model, x, (lambda out: F.cross_entropy(out, y)), opt
    return build


@dataclass
class NoFit:
    """A budget no plan fits: the planner's answer (a valid outcome), reported as a row instead of
    a measurement. ``planned`` is what the planner was asked for (the budget less the margin)."""
    name: str
    budget: int
    planned: int
    least: int
    error: str

    def row(self) -> dict:
        return {"plan": self.name, "budget": self.budget, "planned_budget": self.planned, "fits": False,
                "least_peak": self.least, "error": self.error}


def plan_key(p: Plan) -> tuple:
    """Plans with the same key are the same plan (the same segments, so the same blocks recomputed
    the same way): measuring one measures the other."""
    return tuple((int(s), int(e), bool(c)) for s, e, c in p.segments)


def _optimal(chain, planned: int, budget, name: str, least: int, ref: Plan = None):
    """The optimal plan for ``planned`` bytes, labelled with ``budget``, or a :class:`NoFit`. With a
    baseline ``ref`` (planned at its peak), planned again without rounding when the rounded model
    finds nothing or only something slower than ``ref``, which fits there."""
    from .planner import exact_resolution, plan
    try:
        p = plan(chain, planned, name=name)
    except BudgetError as e:
        p, err = None, str(e)
    if ref is not None and (p is None or p.extra_time > ref.extra_time):
        try:
            p = plan(chain, planned, name=name, resolution=exact_resolution(chain))
        except BudgetError as e:
            p, err = None, str(e)
    if p is None:
        return NoFit(name, planned if budget is None else budget, planned, least, err)
    p.budget = budget
    return p


def plans_for(chain, fractions=(0.0, 0.25, 0.5, 0.75), margin: float = 0.03, budgets=()) -> list:
    """The plans to measure, in order: the baselines (none, sqrt(n), all); optimal plans for budgets
    spread between the least feasible peak and the peak without checkpointing, then for the
    ``budgets`` given (sizes or bytes), each planned ``margin`` below its budget, as :func:`apply`
    does, so that the measured peak stays within it; and optimal plans at exactly the predicted
    peaks of the sqrt(n) and checkpoint-all plans (``optimal=sqrt(n)``, ``optimal=all``: the same
    predicted memory or less, to compare times).

    A budget no plan fits gives a :class:`NoFit` entry instead of a plan (nothing raises). The
    planner's default rounding (up, on chains of many bytes) can put a baseline's exact peak a few
    hundred KB below the least peak it reaches, or leave the baseline itself out there; an
    ``optimal=...`` plan that comes out missing or slower than its baseline is planned again
    without rounding (:func:`.planner.exact_resolution`), where the baseline fits, so it always
    comes out with no more predicted memory or recomputation than the baseline."""
    from .planner import baselines, minimum_budget
    if not (0 <= margin < 0.5):
        raise ValueError(f"margin must be a fraction in [0, 0.5), not {margin!r}")
    base = baselines(chain)
    lo, hi = minimum_budget(chain), base[0].peak
    out = list(base)
    for f in fractions:
        target = int(lo + f * (hi - lo))
        b = -(-target * 1000 // int(1000 * (1 - margin)))     # target <= (1 - margin) * b
        out.append(_optimal(chain, target, b, f"optimal@{b / 2**30:.2f}GiB", lo))
    for b in budgets:
        b = parse_budget(b)
        out.append(_optimal(chain, int(b * (1 - margin)), b, f"optimal@{b / 2**30:.2f}GiB", lo))
    for ref in base[1:]:
        out.append(_optimal(chain, ref.peak, None, f"optimal={ref.name}", lo, ref=ref))
    return out
