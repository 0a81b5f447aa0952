"""The memory and time model of one training step over a chain of blocks.

A *plan* cuts the chain into segments. A plain segment is one block run normally: it keeps
what autograd saves (``act``) until its backward. A checkpointed segment ``[l, r)`` runs blocks
l..r-1 inside one ``torch.utils.checkpoint`` call: it keeps only the input of block l and, when
backward reaches it, runs those blocks' forward again, so their activations exist again while
its backward runs. The extra time of a plan is the forward time of every checkpointed block.

Every figure is measured by :func:`vramkit.checkpoint.profile` (or given by hand), in bytes
relative to what is live at the time, so the predicted peak of any plan is a sum of measured
parts. Definitions, with ``K`` the bytes kept by the segments before the one considered and
``base`` what is live before block 0 runs (parameters, optimizer state, inputs):

- ``act[i]``: bytes block i keeps for backward when run plainly (its input too if it saves it).
- ``inp[i]``: bytes of block i's input (kept by a checkpointed segment that starts at i).
- ``saves_input[i]``: whether a plain block i saves its own input (then it is part of act[i]).
- ``fwd[i]``: forward peak of block i with autograd recording, above the memory at its start
  (which holds its input); ``fwd_nograd[i]``: the same while nothing is saved (a checkpointed
  forward).
- ``bwd[i]``: backward peak of block i minus ``base + act[0] + ... + act[i]`` (gradients live
  then, the incoming gradient, temporaries).
- ``grad_in[i]``: memory when block i's backward starts minus ``base + act[0..i]``.
- ``bwd_remat[i]`` (optional): the same as ``bwd[i]`` when block i's activations were recomputed
  (measured with every block checkpointed on its own: backward peak minus
  ``base + K + u + act[i] + ckpt_extra``).
  A recomputed block's backward need not peak where the kept block's does (on ViT-B it is 70 MiB
  lower); without it ``bwd`` stands for both.
- ``head``: peak from the end of the last block's forward to the start of its backward (final
  layers, loss and their backward) minus ``base + sum(act)``.
- ``fixed_peak``: the peak before block 0 runs and after block 0's backward (embedding
  backward, optimizer step): the same for every plan.
- ``ckpt_extra`` (optional): bytes a plan with a checkpointed segment keeps from the first such
  segment's forward until its backward, besides the inputs: a checkpoint holds every tensor its
  blocks were called with, so an attention mask made in the model's forward (GPT-2: 32 MiB) outlives
  it. Measured as the head's peak with every block checkpointed minus the head's peak without.

The peak of a plan is the largest of ``fixed_peak``, ``base + K_all + head`` (plus ``ckpt_extra``
when a segment is checkpointed) and, for each segment, ``base + K + max(forward, backward)`` with
``ckpt_extra`` added to the backward phase of the first checkpointed segment and every segment
after it (their backward runs while the checkpoint still holds it); :func:`segment_phases` gives
the two phases.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

Segment = tuple  # (start, stop, checkpointed): blocks start..stop-1


class BudgetError(ValueError):
    """A budget that is not a size, is negative, or is below what any plan needs."""


_SIZE_LIMIT = 1 << 62  # bytes: past any device, and far from overflowing the model's int64 sums


def _size(field: str, x, negative_ok: bool) -> int:
    """A byte count of the chain: an integer (or a float with an integral value) of at most 2^62
    in magnitude, not negative unless the field may be; a ValueError naming the field otherwise."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise ValueError(f"chain field {field!r} holds {x!r}, not a number of bytes")
    if isinstance(x, float) and (not math.isfinite(x) or x != int(x)):
        raise ValueError(f"chain field {field!r} holds {x!r}, not a whole number of bytes")
    v = int(x)
    if v < 0 and not negative_ok:
        raise ValueError(f"chain field {field!r} holds a negative size ({v})")
    if abs(v) > _SIZE_LIMIT:
        raise ValueError(f"chain field {field!r} holds {v} bytes, beyond 2^62 in magnitude")
    return v


def _seq(field: str, v) -> list:
    if isinstance(v, (str, bytes, dict)) or not hasattr(v, "__len__"):
        raise ValueError(f"chain field {field!r} must be a list, not {type(v).__name__}")
    return list(v)


@dataclass
class Chain:
    act: list
    inp: list
    time: list
    names: list = None
    saves_input: list = None
    fwd: list = None
    fwd_nograd: list = None
    bwd: list = None
    grad_in: list = None
    bwd_remat: list = None
    base: int = 0
    head: int = 0
    fixed_peak: int = 0
    ckpt_extra: int = 0
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        self.act = _seq("act", self.act)
        n = len(self.act)
        if n == 0:
            raise ValueError("a chain needs at least one block")
        zeros = [0] * n
        self.names = [str(x) for x in _seq("names", self.names)] if self.names is not None \
            else [f"block{i}" for i in range(n)]
        self.saves_input = [bool(v) for v in _seq("saves_input", self.saves_input)] \
            if self.saves_input is not None else [False] * n
        for name in ("fwd", "fwd_nograd", "bwd", "grad_in"):
            if getattr(self, name) is None:
                setattr(self, name, list(zeros))
        for name in ("inp", "time", "fwd", "fwd_nograd", "bwd", "grad_in") + (
                ("bwd_remat",) if self.bwd_remat is not None else ()):
            setattr(self, name, _seq(name, getattr(self, name)))
        if self.meta is None:
            self.meta = {}
        if not isinstance(self.meta, dict):
            raise ValueError(f"chain field 'meta' must be an object, not {type(self.meta).__name__}")
        st = self.meta.get("step_time")
        if st is not None and (isinstance(st, bool) or not isinstance(st, (int, float)) or not math.isfinite(st)
                               or st < 0):
            raise ValueError(f"chain field 'meta.step_time' must be a number of seconds, not {st!r}")
        fields = ["act", "inp", "fwd", "fwd_nograd", "bwd", "grad_in", "names", "saves_input", "time"]
        sizes = ["act", "inp", "fwd", "fwd_nograd", "bwd", "grad_in"]
        if self.bwd_remat is not None:
            fields.append("bwd_remat")
            sizes.append("bwd_remat")
        for name in fields:
            v = getattr(self, name)
            if len(v) != n:
                raise ValueError(f"chain field {name!r} has {len(v)} entries for {n} blocks")
        for name in sizes:
            setattr(self, name, [_size(name, x, name not in ("act", "inp")) for x in getattr(self, name)])
        for t in self.time:
            if isinstance(t, bool) or not isinstance(t, (int, float)):
                raise ValueError(f"chain field 'time' holds {t!r}, not a number of seconds")
            if not math.isfinite(t) or t < 0:
                raise ValueError(f"chain field 'time' holds {t!r}: block times must be finite and not negative")
        self.time = [float(t) for t in self.time]
        self.base = _size("base", self.base, False)
        self.head = _size("head", self.head, True)
        self.fixed_peak = _size("fixed_peak", self.fixed_peak, False)
        self.ckpt_extra = _size("ckpt_extra", 0 if self.ckpt_extra is None else self.ckpt_extra, False)

    def __len__(self):
        return len(self.act)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Chain":
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**known)

    def save(self, path: str) -> None:
        """Writes the chain as JSON, whole or not at all (a temporary file renamed over ``path``)."""
        from .._atomic import write_atomic
        write_atomic(path, json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: str) -> "Chain":
        with open(path) as f:
            try:
                d = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path} is not a chain JSON file: {e}") from None
            except RecursionError:
                raise ValueError(f"{path} is not a chain JSON file: nested too deeply") from None
            except UnicodeDecodeError as e:
                raise ValueError(f"{path} is not a chain JSON file: not UTF-8 text ({e.reason})") from None
        if not isinstance(d, dict) or "act" not in d:
            raise ValueError(f"{path} is not a chain JSON file (no 'act' field)")
        try:
            return cls.from_dict(d)
        except (ValueError, TypeError) as e:
            raise ValueError(f"{path}: {e}") from None


@dataclass
class Plan:
    """Which blocks to checkpoint and what the model predicts for the step."""
    segments: list           # [(start, stop, checkpointed)]
    peak: int                # predicted peak bytes of the step
    extra_time: float        # predicted recomputation seconds per step
    budget: int | None = None
    name: str = "plan"
    names: list = None       # block names, for display
    where: str = None        # the phase where the predicted peak falls

    @property
    def checkpointed(self) -> list:
        """Indices of the blocks that are recomputed."""
        return [i for s, e, c in self.segments if c for i in range(s, e)]

    @property
    def checkpoint_segments(self) -> list:
        return [(s, e) for s, e, c in self.segments if c]

    def describe(self) -> str:
        segs = [f"{s}-{e - 1}" if e - s > 1 else f"{s}" for s, e in self.checkpoint_segments]
        return "none" if not segs else " ".join(f"[{x}]" for x in segs)

    def to_dict(self) -> dict:
        return {"name": self.name, "budget": self.budget, "peak": self.peak, "extra_time": self.extra_time,
                "where": self.where,
                "segments": [list(s) for s in self.segments], "checkpointed": self.checkpointed}


def segment_phases(ch: Chain, l: int, r: int, ckpt: bool) -> tuple:
    """(kept bytes, forward peak, backward peak above base + K, recompute seconds) of segment [l, r).

    The backward phase of a checkpointed segment includes its recomputation."""
    if not ckpt:
        if r != l + 1:
            raise ValueError("a plain segment is one block")
        return ch.act[l], ch.inp[l] + ch.fwd[l], ch.act[l] + ch.bwd[l], 0.0
    x, a = ch.inp, ch.act
    bw = ch.bwd if ch.bwd_remat is None else ch.bwd_remat
    u = 0 if ch.saves_input[l] else x[l]     # the kept input, when a[l] does not hold it
    g = ch.grad_in[r - 1]                    # gradients live when the segment's backward starts
    fwd = x[l] + ch.fwd_nograd[l]            # forward of the first block (nothing saved)
    bwd = g + x[l] + ch.fwd[l]               # recomputing the first block (everything saved)
    acc = 0                                  # act of the recomputed blocks l..j-1
    for j in range(l, r):
        if j > l:
            fwd = max(fwd, x[l] + x[j] + ch.fwd_nograd[j])
            bwd = max(bwd, g + u + acc + x[j] + ch.fwd[j])
        acc += a[j]
        bwd = max(bwd, u + acc + bw[j])      # backward of j with l..j rematerialized
    return x[l], fwd, bwd, sum(ch.time[l:r])


def segment_terms(ch: Chain, l: int, r: int, ckpt: bool) -> tuple:
    """(kept bytes, local peak above base + K, recompute seconds) of segment [l, r), without
    ``ckpt_extra``."""
    kept, fwd, bwd, t = segment_phases(ch, l, r, ckpt)
    return kept, max(fwd, bwd), t


def evaluate(ch: Chain, segments, *, detail: bool = False):
    """Predicted (peak, extra seconds) of a plan given as segments covering the chain in order.

    With ``detail``, also the phase where the peak falls ("forward/backward of segment i..j",
    "head", "fixed")."""
    pos, k = 0, 0
    peak, where, extra = ch.fixed_peak, "fixed", 0.0
    held = 0                                  # ckpt_extra, from the first checkpointed segment on
    for s, e, c in segments:
        if s != pos or e <= s or e > len(ch):
            raise ValueError(f"segments must cover blocks 0..{len(ch) - 1} in order; got {list(segments)}")
        if c:
            held = ch.ckpt_extra
        kept, fwd, bwd, t = segment_phases(ch, s, e, c)
        local = max(fwd, bwd + held)
        if ch.base + k + local > peak:
            blocks = f"blocks {s}-{e - 1}" if e - s > 1 else f"block {s}"
            peak, where = ch.base + k + local, ("checkpointed " if c else "") + blocks
        k += kept
        extra += t
        pos = e
    if pos != len(ch):
        raise ValueError(f"segments end at block {pos}, the chain has {len(ch)}")
    if ch.base + k + ch.head + held > peak:
        peak, where = ch.base + k + ch.head + held, "head (end of forward)"
    return (peak, extra, where) if detail else (peak, extra)


def parse_budget(budget) -> int:
    """Bytes from ``"12GiB"``, ``"1.5 GB"``, ``"800MB"`` or an int; a clear error otherwise."""
    if isinstance(budget, bool):
        raise BudgetError(f"budget must be a size such as '12GiB' or a number of bytes, not {budget!r}")
    if isinstance(budget, int):
        if budget < 0:
            raise BudgetError(f"budget must not be negative (got {budget} bytes)")
        return budget
    if isinstance(budget, float):
        if not math.isfinite(budget) or budget != int(budget):
            raise BudgetError(f"budget {budget!r} is not a whole number of bytes")
        return parse_budget(int(budget))
    if isinstance(budget, str):
        text = budget.strip()
        if text.startswith("-"):
            raise BudgetError(f"budget must not be negative (got {budget!r})")
        from .._vramkit import parse_size
        try:
            return int(parse_size(text))
        except ValueError as e:
            raise BudgetError(f"budget {budget!r} is not a size ({e}); write e.g. '12GiB', '1.5 GB' or bytes") \
                from None
    raise BudgetError(f"budget must be a size such as '12GiB' or a number of bytes, not {type(budget).__name__}")


def fmt_bytes(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n} B"
