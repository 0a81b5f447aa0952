"""A checkpointed segment: blocks l..r-1 run inside one non-reentrant ``torch.utils.checkpoint``
call placed on block l's ``forward`` (on the instance); blocks l+1..r-1 pass its output on. Used
by :func:`vramkit.checkpoint.apply_plan` and by :func:`vramkit.checkpoint.profile` (which measures
every block checkpointed on its own)."""
from __future__ import annotations

from .blocks import hidden_of


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

    # A forward another tool set on the instance (accelerate's hooks, say) is what the segment runs,
    # and what _unwrap puts back.
    checkpointed._vramkit_checkpoint = True
    checkpointed._vramkit_prev = seg[0].__dict__.get("forward")
    seg[0].forward = checkpointed
    for k, m in enumerate(seg[1:], start=l + 1):
        prev = m.__dict__.get("forward")
        m.forward = passthrough(k)
        m.forward._vramkit_checkpoint = True
        m.forward._vramkit_prev = prev
    return seg


def _unwrap(mods) -> None:
    """Take any forward of ours off these blocks (also one applied through another handle),
    leaving the forward the instance had before, if any."""
    for m in mods:
        f = m.__dict__.get("forward")
        while f is not None and getattr(f, "_vramkit_checkpoint", False):
            prev = getattr(f, "_vramkit_prev", None)
            if prev is None:
                del m.__dict__["forward"]
            else:
                m.__dict__["forward"] = prev
            f = prev
