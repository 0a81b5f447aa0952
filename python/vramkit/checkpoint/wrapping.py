"""Applying a plan: checkpointed segments become ``torch.utils.checkpoint`` calls.

The block modules stay where they are (state_dict keys, hooks and the model's own loop are
unchanged); their ``forward`` is replaced on the instance. A checkpointed segment of blocks
l..r-1 becomes one non-reentrant checkpoint around block l's call, which runs blocks l..r-1;
blocks l+1..r-1 then return that result unchanged when the model's loop calls them. They must be
called with exactly the segment's output, which the wrapper checks (a model whose loop does
more between blocks than pass the hidden state on should use ``max_segment=1``).
"""
from __future__ import annotations

import warnings
import weakref

from .blocks import find_blocks
from .model import Chain, Plan
from .segments import _unwrap, _wrap  # noqa: F401 (used by profile and the tests too)

_applied: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def remove(model) -> None:
    """Undo :func:`apply_plan`: the blocks run the forward they had before it again."""
    _unwrap(_applied.pop(model, []))


def apply_plan(model, plan: Plan, *, blocks=None) -> Plan:
    """Wrap the checkpointed segments of ``plan`` (any previous plan is removed first)."""
    names, mods = find_blocks(model, blocks)
    n = sum(e - s for s, e, _ in plan.segments)
    if n != len(mods):
        raise ValueError(f"the plan covers {n} blocks, the model has {len(mods)}")
    if plan.names and list(plan.names) != list(names):
        raise ValueError("the plan was made for other blocks (names differ): profile this model")
    remove(model)
    _unwrap(mods)
    cfg = getattr(model, "config", None)
    if plan.checkpointed and getattr(cfg, "use_cache", False):
        warnings.warn("model.config.use_cache is True: every layer's keys and values are kept (and made inside "
                      "checkpointed blocks); set model.config.use_cache = False for training", stacklevel=3)
    done = []
    for s, e, c in plan.segments:
        if c:
            done += _wrap(mods, s, e)
    _applied[model] = done
    return plan


def apply(model, budget=None, sample_input=None, *, chain: Chain = None, strategy: str = "optimal",
          loss_fn=None, optimizer=None, blocks=None, max_segment: int = None, margin: float = 0.03,
          **profile_kw) -> Plan:
    """Choose and apply checkpointing for ``model``; returns the :class:`Plan`.

    ``strategy``: ``"optimal"`` (least recomputation whose predicted peak fits ``budget`` less
    ``margin``, a fraction kept for the model's error and the allocator's rounding), ``"sqrt"``
    (Chen's rule), ``"all"`` (every block), ``"none"``. The chain is profiled on
    ``sample_input`` unless ``chain`` is given (from :func:`profile` or :meth:`Chain.load`)."""
    from . import planner
    strategies = {"optimal", "sqrt", "all", "none"}
    if strategy not in strategies:
        raise ValueError(f"strategy must be one of {sorted(strategies)}, not {strategy!r}")
    if strategy == "optimal" and budget is None:
        raise ValueError("strategy 'optimal' needs a budget, e.g. budget='12GiB'")
    if not (0 <= margin < 0.5):
        raise ValueError(f"margin must be a fraction in [0, 0.5), not {margin!r}")
    if budget is not None:
        from .model import parse_budget
        budget = parse_budget(budget)      # a bad budget fails before any profiling
    if chain is None:
        if sample_input is None:
            raise ValueError("apply needs sample_input= to profile the model (or chain= from a profile)")
        import torch  # noqa: F401  (profiling needs it: fail before touching the model)
        from .profiling import profile
        remove(model)
        chain = profile(model, sample_input, loss_fn=loss_fn, optimizer=optimizer, blocks=blocks, **profile_kw)
    if strategy == "optimal":
        p = planner.plan(chain, int(budget * (1 - margin)), max_segment=max_segment)
        p.budget = budget
    else:
        p = {"sqrt": planner.chen_sqrt, "all": planner.checkpoint_all, "none": planner.no_checkpoint}[strategy](chain)
    return apply_plan(model, p, blocks=blocks)
