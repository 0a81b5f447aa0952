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

from .model import Chain, Plan
from .profiling import find_blocks, hidden_of

_applied: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _chain_call(forwards):
    """Runs block forwards one after the other, each on the previous one's hidden state."""
    def run(*args, **kwargs):
        out = forwards[0](*args, **kwargs)
        for f in forwards[1:]:
            h = out[0] if isinstance(out, (tuple, list)) else out
            if args:
                out = f(h, *args[1:], **kwargs)
            else:
                out = f(**{**kwargs, "hidden_states": h})
        return out
    return run


def _wrap(mods, l, r):
    import torch.utils.checkpoint as cp
    seg = mods[l:r]
    run = _chain_call([m.forward for m in seg])    # the blocks' own forwards (ours were removed)
    state = {}

    def checkpointed(*args, **kwargs):
        out = cp.checkpoint(run, *args, use_reentrant=False, **kwargs)
        if r - l > 1:
            state["out"] = out
            state["left"] = r - l - 1
        return out

    def passthrough(i):
        def forward(*args, **kwargs):
            out = state.get("out")
            h = out[0] if isinstance(out, (tuple, list)) else out
            if out is None or hidden_of(args, kwargs) is not h:
                raise RuntimeError(f"vramkit.checkpoint: block {i} of a checkpointed segment ({l}-{r - 1}) was not "
                                   "called with the segment's output; this model's loop does more than chain its "
                                   "blocks: plan with max_segment=1")
            state["left"] -= 1
            if state["left"] == 0:
                state.clear()
            return out
        return forward

    checkpointed._vramkit_checkpoint = True
    seg[0].forward = checkpointed
    for k, m in enumerate(seg[1:], start=l + 1):
        m.forward = passthrough(k)
        m.forward._vramkit_checkpoint = True
    return seg


def _unwrap(mods) -> None:
    """Drop any forward of ours from these blocks (also one applied through another handle)."""
    for m in mods:
        f = m.__dict__.get("forward")
        if f is not None and getattr(f, "_vramkit_checkpoint", False):
            del m.__dict__["forward"]


def remove(model) -> None:
    """Undo :func:`apply_plan`: the blocks run their own ``forward`` again."""
    for m in _applied.pop(model, []):
        m.__dict__.pop("forward", None)


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
