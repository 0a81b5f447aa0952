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
* ``host_wait_ms``/``host_waits``: the host's time in the runtime's synchronize calls;
* ``host_api_ms``/``host_api_calls``: the host's time in CUDA runtime and driver calls other than
  those waits (launches, copies, event records), and their count; ``host_api``, in the JSON
  only, the same by call name, ``{name: [ms, count]}``;
* ``host_top``: the host's costliest event names by their own time (``self``, children left
  out), ``[name, ms, count]``, in the JSON only: where two allocators' idle times differ, this
  says whether launches, copies or the operators around the allocator took the difference.

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


def is_api(name: str) -> bool:
    """A CUDA runtime or driver call (``cudaLaunchKernel``, ``cuLaunchKernel``, ...)."""
    return name.startswith("cu") and len(name) > 2 and name[2].isalpha() and not name.startswith("cub")


TOP = 12  # names kept in host_top


def _by_name(events, own: bool) -> dict[str, list]:
    """{name: [us, count]} over ``events``: their own time (``self``, else their span) or span."""
    out: dict[str, list] = {}
    for e in events:
        t = out.setdefault(e["name"], [0.0, 0])
        t[0] += e.get("self", e["end"] - e["start"]) if own else e["end"] - e["start"]
        t[1] += 1
    return out


def summarize_events(events, wall_ms: float) -> dict:
    """The figures above from profiler events: each with ``device`` ("cuda" for work on the GPU),
    ``name``, ``start``/``end`` in us and, for host events, optionally ``self`` (its own us)."""
    gpu = [(e["start"], e["end"]) for e in events if e["device"] == "cuda"]
    host = [e for e in events if e["device"] != "cuda"]
    waits = [e for e in host if is_wait(e["name"])]
    api = [e for e in host if is_api(e["name"]) and not is_wait(e["name"])]
    top = sorted(_by_name(host, own=True).items(), key=lambda kv: (-kv[1][0], kv[0]))[:TOP]
    by_api = _by_name(api, own=False)
    busy = union_ms(gpu)
    return {"wall_ms": round(wall_ms, 3), "gpu_busy_ms": round(busy, 3),
            "gpu_idle_ms": round(max(wall_ms - busy, 0.0), 3),
            "kernel_ms": round(sum(e - s for s, e in gpu) / 1e3, 3), "gpu_ops": len(gpu),
            "host_wait_ms": round(sum(e["end"] - e["start"] for e in waits) / 1e3, 3), "host_waits": len(waits),
            "host_api_ms": round(sum(e["end"] - e["start"] for e in api) / 1e3, 3), "host_api_calls": len(api),
            "host_api": {n: [round(t / 1e3, 3), c] for n, (t, c) in sorted(by_api.items())},
            "host_top": [[n, round(t / 1e3, 3), c] for n, (t, c) in top]}


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
    events = []
    for e in prof.events():
        ev = {"device": "cuda" if e.device_type == DeviceType.CUDA else "cpu", "name": e.name,
              "start": e.time_range.start, "end": e.time_range.end}
        if e.device_type != DeviceType.CUDA:
            ev["self"] = e.self_cpu_time_total
        events.append(ev)
    out = summarize_events(events, wall)
    out["step"] = index + 1
    return out
