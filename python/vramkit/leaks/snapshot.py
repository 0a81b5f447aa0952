"""Memory snapshots in PyTorch's schema (``torch.cuda.memory._snapshot()``), readable by
``torch.cuda._memory_viz``, PyTorch's MemoryViz page and ``vramkit.trace.load_trace``."""
from __future__ import annotations

import os
import pickle
import time

from .. import _vramkit
from . import _tracking


def _pool_and_tracker(dev: int):
    cur = _vramkit.current_resource(dev)
    tracker = cur if _vramkit.is_tracking(cur) else None
    base = _vramkit.tracking_upstream(cur) if tracker is not None else cur
    return base, tracker


def snapshot(device=None) -> dict:
    """The device's allocator state (and, while tracking is on, its recent events) as a dict.

    Keys as PyTorch writes them: ``segments`` (with ``blocks``), ``device_traces`` and
    ``allocator_settings``. Frames (the allocating Python line) are known for allocations made
    while tracking was on (:func:`vramkit.leaks.leak_check`, :class:`GrowthDetector`,
    ``VRAMKIT_LEAK_REPORT=1``, or a tracking adaptor set as the current resource).
    Contains only dicts, lists, tuples, str, int and bool.
    """
    dev = _vramkit.to_device(device)
    base, tracker = _pool_and_tracker(dev)
    names = _tracking.SiteNames()
    frames_of: dict[int, list] = {}

    def frames(site: int) -> list:
        f = frames_of.get(site)
        if f is None:
            f = frames_of[site] = names.frame_list(site)
        return f

    live = {}
    if tracker is not None:
        live = {a["ptr"]: a for a in _vramkit.tracked_live(tracker, 0)}
    try:
        segs = base.segments()
    except ValueError:  # not a pool: no segment view
        segs = []
    options = ""
    counters = base.pool_counters()
    if counters:
        options = counters.get("options", "")

    out_segments = []
    for s in sorted(segs, key=lambda s: s["base"]):
        blocks = []
        allocated = active = requested = 0
        for b in s["blocks"]:
            if b["allocated"]:
                state = "active_allocated"
            elif b["pending"]:
                state = "active_pending_free"
            else:
                state = "inactive"
            rec = live.get(b["addr"])
            req = b["requested"] if b["requested"] else b["size"]
            if state != "inactive":
                active += b["size"]
                requested += req
            if state == "active_allocated":
                allocated += b["size"]
            blocks.append({"address": b["addr"], "size": b["size"], "requested_size": req, "state": state,
                           "frames": frames(rec["site"]) if rec is not None and state == "active_allocated"
                           else []})
        total = sum(b["size"] for b in s["blocks"]) or s["size"]
        out_segments.append({
            "device": dev, "address": s["base"], "total_size": total, "allocated_size": allocated,
            "active_size": active, "requested_size": requested, "stream": s["blocks"][0]["stream"]
            if s["blocks"] else 0, "segment_type": "small" if s["small"] else "large",
            "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks,
        })

    traces: list[list[dict]] = [[] for _ in range(max(dev + 1, _vramkit.device_count()))]
    if tracker is not None:
        # The adaptor keeps steady-clock times; PyTorch writes Unix-epoch microseconds.
        offset = time.time_ns() - time.monotonic_ns()
        tr = traces[dev]
        for action, ptr, size, stream, t_ns, site in _vramkit.tracked_events(tracker):
            t_us = (t_ns + offset) // 1000
            fr = frames(site)
            if action == "alloc":
                tr.append({"action": "alloc", "addr": ptr, "size": size, "stream": stream, "time_us": t_us,
                           "frames": fr})
            else:
                for a in ("free_requested", "free_completed"):
                    tr.append({"action": a, "addr": ptr, "size": size, "stream": stream, "time_us": t_us,
                               "frames": fr})
    settings = {
        "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "VRAMKIT_ALLOC_CONF": options,
        "expandable_segments": False,
        "backend": _vramkit.backend(),
        "allocator": base.name,
    }
    return {"segments": out_segments, "device_traces": traces, "allocator_settings": settings,
            "external_annotations": []}


def dump_snapshot(path, device=None) -> str:
    """Write :func:`snapshot` to ``path`` as a pickle (protocol 4, which MemoryViz reads), atomically.

    Returns the path written."""
    from .._atomic import write_atomic
    return write_atomic(path, pickle.dumps(snapshot(device), protocol=4))
