"""Would this run fit, and with which allocator? Replays a trace through emulations of PyTorch's
CUDA caching allocator (several PYTORCH_CUDA_ALLOC_CONF settings) and through vramkit's pool.

Everything per op happens in C++ (``_vramkit.profile_trace``): a 10-million-op trace is never
10 million Python objects.
"""
from __future__ import annotations

import math
import os
import sys
from typing import Any, Callable

#: Allocators `vramkit advise` compares by default: PyTorch as shipped, the option sets users
#: reach for first, and vramkit's pool.
DEFAULT_CANDIDATES = (
    "torch-default",
    "torch-expandable",
    "torch:max_split_size_mb=256",
    "torch:roundup_power2_divisions=4",
    "torch-expandable:roundup_power2_divisions=4",
    "vramkit",
)

#: What `replay` and `report` add to their default comparison.
TORCH_DEFAULTS = ("torch-default", "torch-expandable")

#: What `vramkit advise` adds to its defaults when the trace repeats a step (a training loop):
#: the pool with step plans, each step marked where the trace's steps begin.
PLAN_CANDIDATE = "vramkit:plan_steps:true,remap_own_slack:0"


def plans_steps(spec: str) -> bool:
    """Whether a vramkit spec turns the pool option ``plan_steps`` on (its last mention counts)."""
    from ._pool_conf import plans_steps as conf_plans_steps
    kind, _, opts = spec.partition(":")
    return kind in ("vramkit", "pool") and conf_plans_steps(opts)


def is_torch(spec: str) -> bool:
    from . import _vramkit
    return bool(_vramkit.is_torch_spec(spec))


def make_resource(spec: str, capacity: int | None):
    """A fresh resource for ``spec``, limited to ``capacity`` bytes (None: unlimited)."""
    from . import _vramkit
    if is_torch(spec):
        return _vramkit.torch_emulator(spec, capacity or 0)
    kind, _, opts = spec.partition(":")
    if kind in ("vramkit", "pool"):
        # On the simulated device, like the PyTorch emulations: no GPU memory is touched, and the
        # device is as large as the capacity asked for (1 TiB when none).
        if "upstream=" not in opts:
            opts = "upstream=host" + ("," + opts if opts else "")
        if capacity is not None:
            opts += f",reserve_limit:{capacity}"
        old = os.environ.get("VRAMKIT_HOST_CAPACITY")
        os.environ["VRAMKIT_HOST_CAPACITY"] = str(capacity or (1 << 40))
        try:
            return _vramkit.make_resource(f"{kind}:{opts}", 0)
        finally:
            if old is None:
                os.environ.pop("VRAMKIT_HOST_CAPACITY", None)
            else:
                os.environ["VRAMKIT_HOST_CAPACITY"] = old
    r = _vramkit.make_resource(spec, 0)
    if capacity is not None:
        r = _vramkit.limiting_adaptor(r, capacity)
    return r


def config_line(spec: str) -> str:
    """The line a user puts in their environment or code to get ``spec``."""
    from . import _vramkit
    if is_torch(spec):
        conf = _vramkit.torch_conf_line(spec)
        line = f"PYTORCH_CUDA_ALLOC_CONF={conf}" if conf else "(PyTorch defaults: no PYTORCH_CUDA_ALLOC_CONF)"
        if "per_process_memory_fraction" in spec:
            frac = spec.split("per_process_memory_fraction", 1)[1].lstrip("=:").split(",")[0]
            line += f" + torch.cuda.set_per_process_memory_fraction({frac})"
        return line
    kind, _, opts = spec.partition(":")
    if kind in ("vramkit", "pool"):
        args = ", ".join(f"{k}={_py_value(v)}" for k, v in (o.split(":", 1) for o in opts.split(",") if ":" in o))
        return f"import vramkit.torch; vramkit.torch.use({args})  # before the first CUDA tensor"
    return spec


def _py_value(text: str) -> str:
    """A pool option's value as Python source: True/False, a number, or a quoted string."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low.capitalize()
    try:
        if math.isfinite(float(text)):
            return text.strip()
    except ValueError:
        pass
    return repr(text.strip())


def profile(ops, spec: str, capacity: int | None, points: int = 0,
            progress: Callable[[int, int], None] | None = None, stop: int = -1,
            segment_addresses=None, marks=None) -> dict[str, Any]:
    """One pass of ``ops`` (int64 rows action, id, size, stream) through a fresh ``spec``.

    ``segment_addresses`` (PyTorch emulations only): the addresses a real run's cudaMalloc calls
    returned, in order; the emulation places its segments there instead of at increasing addresses
    (see ``torch_set_segment_addresses``). ``marks``: op indices, ascending, where a step begins
    (``mark_step`` on a vramkit pool, for ``plan_steps``; see ``vramkit.trace.steps``)."""
    from . import _vramkit
    r = make_resource(spec, capacity)
    if segment_addresses is not None:
        if not is_torch(spec):
            raise ValueError(f"{spec}: segment addresses apply to PyTorch emulations only")
        _vramkit.torch_set_segment_addresses(r, [int(a) for a in segment_addresses])
    marks = [] if marks is None else [int(x) for x in marks]
    d = dict(_vramkit.profile_trace(ops, r, points, stop, progress, marks))
    d["allocator"] = spec
    d["config"] = config_line(spec)
    d["fits"] = d["ooms"] == 0
    counters = _vramkit.torch_counters(r)
    if counters is not None:
        d["device_allocs"] = counters["num_device_alloc"]
        d["segments_peak"] = counters["segment_peak"]
        d["alloc_retries"] = counters["num_alloc_retries"]
        if segment_addresses is not None:
            d["given_addresses_used"] = counters["given_addresses_used"]
    return d


def advise(ops, candidates, capacity: int | None, progress_for=None, add_plans: bool = False) -> dict[str, Any]:
    """Profiles every candidate; returns rows and a one-line recommendation.

    Candidates with ``plan_steps`` get their steps marked where the trace's repeating step begins
    (``vramkit.trace.steps.find_steps``; none found: no marks, the pool without plans). With
    ``add_plans``, a trace that repeats a step also gets ``PLAN_CANDIDATE``. ``steps`` in the
    result: the step found (period in allocation requests, marks), or None."""
    from .trace.steps import find_steps
    candidates = list(candidates)
    steps = find_steps(ops) if add_plans or any(plans_steps(c) for c in candidates) else None
    if add_plans and steps is not None and PLAN_CANDIDATE not in candidates:
        candidates.append(PLAN_CANDIDATE)
    rows = []
    for spec in candidates:
        cb = progress_for(spec) if progress_for else None
        marks = steps.marks if steps is not None and plans_steps(spec) else None
        rows.append(profile(ops, spec, capacity, progress=cb, marks=marks))
        rows[-1]["marked_steps"] = len(marks) if marks is not None else 0
    found = None if steps is None else {"period": steps.period, "marks": steps.count, "matched": steps.matched}
    return {"capacity": capacity, "rows": rows, "recommendation": recommend(rows, capacity), "steps": found}


def recommend(rows: list[dict[str, Any]], capacity: int | None) -> str:
    """PyTorch users first: the PyTorch setting with the least peak that fits; vramkit when it
    is the only one that fits, or saves more than 5 % over the best PyTorch setting."""
    torch_rows = [r for r in rows if is_torch(r["allocator"]) and r["fits"]]
    other = [r for r in rows if not is_torch(r["allocator"]) and r["fits"]]
    best_t = min(torch_rows, key=lambda r: r["peak_reserved_bytes"], default=None)
    best_o = min(other, key=lambda r: r["peak_reserved_bytes"], default=None)
    where = f" on {fmt(capacity)}" if capacity else ""
    if best_t is None and best_o is None:
        floor = max((r["peak_live_bytes"] for r in rows), default=0)
        if capacity and floor > capacity:
            return (f"nothing fits{where}: the live tensors alone peak at {fmt(floor)}; shrink the batch "
                    "or the model")
        return f"nothing tried fits{where}; the live tensors peak at {fmt(floor)}, so a tighter allocator could"
    if best_t is not None and (best_o is None or
                               best_o["peak_reserved_bytes"] >= 0.95 * best_t["peak_reserved_bytes"]):
        pick = best_t
    else:
        pick = best_o
    verb = "fits" if capacity else "reserves least"
    line = f"{pick['config']}  ({pick['allocator']} {verb}{where}: peak reserved {fmt(pick['peak_reserved_bytes'])})"
    if pick is not best_t and best_t is not None:  # a PyTorch user may prefer to stay on PyTorch's allocator
        line += f"; best PyTorch setting: {best_t['config']} ({fmt(best_t['peak_reserved_bytes'])})"
    return line


def fmt(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k:
            return f"{n / (1 << k):.2f} {unit}"
    return f"{n} B"


def table(result: dict[str, Any]) -> str:
    hdr = ["allocator", "peak reserved", "x floor", "at peak: live / rounding / cached", "fits", "first OOM (op, size)"]
    out_rows = []
    for r in result["rows"]:
        floor = r["peak_live_bytes"] or 1
        req, alloc, res = r["requested_at_peak"], r["allocated_at_peak"], r["peak_reserved_bytes"]
        split = f"{fmt(req)} / {fmt(max(0, alloc - req))} / {fmt(max(0, res - alloc))}"
        oom = "-" if r["first_oom_op"] < 0 else f"op {r['first_oom_op']}, {fmt(r['first_oom_size'])} ({r['ooms']} OOMs)"
        fits = ("yes" if r["fits"] else "NO") if result["capacity"] else "-"
        out_rows.append([r["allocator"], fmt(res), f"{res / floor:.3f}", split, fits, oom])
    w = [max(len(h), *(len(x[i]) for x in out_rows)) for i, h in enumerate(hdr)]
    lines = ["  ".join(h.ljust(w[i]) for i, h in enumerate(hdr)), "  ".join("-" * x for x in w)]
    lines += ["  ".join(c.ljust(w[i]) for i, c in enumerate(x)) for x in out_rows]
    return "\n".join(lines)


def progress_printer(name: str, enabled: bool):
    """A factory of per-allocator progress callbacks that draw one line on stderr."""
    if not enabled:
        return None

    def make(spec):
        def cb(done, total):
            k = int(30 * done / max(total, 1))
            sys.stderr.write(f"\r  {name} [{spec[:28]}] [{'#' * k}{'.' * (30 - k)}] {done}/{total} ops")
            sys.stderr.flush()
            if done >= total:
                sys.stderr.write("\r" + " " * 100 + "\r")
        return cb
    return make
