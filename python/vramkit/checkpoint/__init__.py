"""Gradient checkpointing that meets a memory budget at the least recomputation time.

>>> import vramkit.checkpoint as ckpt
>>> plan = ckpt.apply(model, budget="12GiB", sample_input=batch)   # profile, plan, wrap
>>> plan.checkpointed, plan.peak, plan.extra_time

The planner (:func:`plan`) is pure Python and exact for its model of a chain of blocks
(:mod:`vramkit.checkpoint.model`); profiling and applying need PyTorch and a CUDA device.
See docs/checkpointing.md.
"""
from .model import BudgetError, Chain, Plan, evaluate, parse_budget
from .planner import (all_plans, baselines, brute_force, checkpoint_all, chen_sqrt, minimum_budget,
                      no_checkpoint, plan, sweep)


def profile(model, sample_input, **kw) -> Chain:
    """Measure a model's chain of blocks over a training step (PyTorch, CUDA); see :mod:`.profiling`."""
    from .profiling import profile as _p
    return _p(model, sample_input, **kw)


def apply(model, budget=None, sample_input=None, **kw) -> Plan:
    """Profile (unless ``chain=``), plan and wrap the chosen blocks; see :func:`.wrapping.apply`."""
    from .wrapping import apply as _a
    return _a(model, budget, sample_input, **kw)


def apply_plan(model, plan_: Plan, **kw) -> Plan:
    from .wrapping import apply_plan as _ap
    return _ap(model, plan_, **kw)


def remove(model) -> None:
    """Undo :func:`apply`: every block runs its own forward again."""
    from .wrapping import remove as _r
    _r(model)


def find_blocks(model, blocks=None):
    from .profiling import find_blocks as _f
    return _f(model, blocks)


__all__ = ["BudgetError", "Chain", "Plan", "evaluate", "parse_budget", "all_plans", "baselines", "brute_force",
           "checkpoint_all", "chen_sqrt", "minimum_budget", "no_checkpoint", "plan", "sweep", "profile", "apply",
           "apply_plan", "remove", "find_blocks"]
