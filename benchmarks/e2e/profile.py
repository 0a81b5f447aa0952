"""Where one step's time goes on the GPU: an extra step under torch.profiler.

The suite's step times say that an allocator's step is slower, not why. A step that waits for the
GPU in its middle (MoE's expert loop learns each expert's token count that way) leaves the GPU
idle while the host prepares what comes after each wait, so the host's own time, the allocator's
included, lands on the step. `--profile-step N` runs one more step after the timed ones, on step
N's inputs (the same shapes), under torch.profiler, and keeps:

* ``wall_ms``: the step by the host clock (the profiler's own cost included, alike for every
  allocator);
* ``gpu_busy_ms``: the union of the GPU's kernel, copy and fill intervals; ``gpu_idle_ms`` the
  rest of the wall time;
* ``kernel_ms``: the GPU intervals added up, and ``gpu_ops`` their count;
* ``host_wait_ms``/``host_waits``: the host's time in the runtime's synchronize calls.

Same work, same kernels: where two allocators' busy times agree and their idle times differ, the
difference is the host's (between the waits); where busy times differ, the kernels ran slower.
"""
from __future__ import annotations

import time


def union_ms(intervals: list[tuple[float, float]]) -> float:
    """The time covered by (start_us, end_us) intervals, in ms (overlaps counted once)."""
    total, end = 0.0, None
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total / 1e3


def is_wait(name: str) -> bool:
    """A runtime call in which the host waits for the GPU."""
    return "Synchronize" in name


def summarize_events(events, wall_ms: float) -> dict:
    """The figures above from profiler events: each with ``device`` ("cuda" for work on the GPU),
    ``name``, and ``start``/``end`` in us."""
    gpu = [(e["start"], e["end"]) for e in events if e["device"] == "cuda"]
    waits = [e for e in events if e["device"] != "cuda" and is_wait(e["name"])]
    busy = union_ms(gpu)
    return {"wall_ms": round(wall_ms, 3), "gpu_busy_ms": round(busy, 3),
            "gpu_idle_ms": round(max(wall_ms - busy, 0.0), 3),
            "kernel_ms": round(sum(e - s for s, e in gpu) / 1e3, 3), "gpu_ops": len(gpu),
            "host_wait_ms": round(sum(e["end"] - e["start"] for e in waits) / 1e3, 3), "host_waits": len(waits)}


def profile_step(torch, runner, index: int) -> dict:
    """Runs step ``index``'s inputs once more under torch.profiler; the figures above, plus
    ``step`` (1-based)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    batch = runner.inputs(index)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        runner.step(batch).tolist()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t) * 1e3
    events = [{"device": "cuda" if e.device_type == DeviceType.CUDA else "cpu", "name": e.name,
               "start": e.time_range.start, "end": e.time_range.end} for e in prof.events()]
    out = summarize_events(events, wall)
    out["step"] = index + 1
    return out
