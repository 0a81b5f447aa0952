"""The report's "Would it fit?" section: PyTorch's allocator (emulated, several settings) and
vramkit side by side, and at each one's peak what the reserved bytes are made of: live blocks,
rounding, and the free pieces that could not serve the request that made the allocator grow.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .html import _e, _stack_bar, format_bytes

TITLE = "Would it fit? PyTorch's allocator and vramkit"
#: Points of each allocator's curve (each the highest of its run of ops).
CURVE_POINTS = 3000


def _classify_free(seg_list: list[dict[str, Any]], req_size: int, req_stream: int, req_small: bool,
                   rounded: int) -> dict[str, list[int]]:
    """Free blocks at the peak by why they could not serve the request made there."""
    out: dict[str, list[int]] = {}
    for s in seg_list:
        for _addr, size, _req, allocated in s["blocks"]:
            if allocated:
                continue
            if bool(s["small"]) != req_small:
                why = "in the other pool (small vs large)"
            elif int(s["stream"]) != req_stream:
                why = "cached for another stream"
            elif size < rounded:
                why = "too small for the request (fragments)"
            else:
                why = "left over after the request was placed"
            out.setdefault(why, []).append(int(size))
    return out


def peak_breakdown(ops: np.ndarray, spec: str, peak_op: int, capacity: int | None) -> dict[str, Any]:
    """Replays up to the op where ``spec`` peaks and describes the segments there."""
    from .. import _vramkit
    from ..advise import profile
    p = profile(ops, spec, capacity, stop=peak_op)
    segs = p.get("segments") or []
    act, size, stream = (int(v) for v in ops[peak_op, [0, 2, 3]])
    is_torch = bool(_vramkit.is_torch_spec(spec))
    rounded = int(_vramkit.torch_round_size(spec, size)) if is_torch and size else size
    small = rounded <= (1 << 20) if is_torch else size <= (1 << 20)
    live = [(int(b[1]), int(b[2])) for s in segs for b in s["blocks"] if b[3]]
    free = _classify_free(segs, size, stream, small, rounded) if act == 0 else {}
    return {"segments": len(segs), "mapped": sum(int(s["size"]) for s in segs), "live": live, "free": free,
            "request": (act, size, stream)}


def allocator_section(trace, ops: np.ndarray, specs: Sequence[str], capacity: int | None,
                      progress_for: Callable[[str], Any] | None = None,
                      timelines: dict[str, Any] | None = None) -> tuple[str, str]:
    """(title, html) of the section; one profile pass per allocator plus one to its peak.

    ``timelines`` (the report's reserved-over-time series, by allocator name): the series of
    every allocator profiled here is replaced by its profile curve, whose points are the maximum
    of each run of ops, so the drawn peak is the exact one (sampling every k-th op can miss it).
    """
    from ..advise import profile, recommend
    ops = np.ascontiguousarray(ops, dtype=np.int64)
    rows = []
    for spec in specs:
        cb = progress_for(spec) if progress_for else None
        rows.append(profile(ops, spec, capacity, points=CURVE_POINTS, progress=cb))
        if timelines is not None and spec in timelines:
            r = rows[-1]
            timelines[spec] = list(zip(r["curve_op"].tolist(), r["curve_live"].tolist(),
                                       r["curve_reserved"].tolist()))
    floor = max((r["peak_live_bytes"] for r in rows), default=0)
    cap = f" on a device of {format_bytes(capacity)}" if capacity else " (no capacity given: unlimited device)"
    html = [f"<p>{len(ops):,} operations replayed through each allocator{_e(cap)}. The floor (peak of live "
            f"requested bytes) is <b>{format_bytes(floor)}</b>.</p>",
            '<table class="cmp"><thead><tr><th>allocator</th><th>setting</th><th>peak reserved</th><th>x floor</th>'
            "<th>fits</th><th>first out-of-memory</th></tr></thead><tbody>"]
    for r in rows:
        oom = "\u2013" if r["first_oom_op"] < 0 else (f"op {r['first_oom_op']:,}: {format_bytes(r['first_oom_size'])}"
                                                     f" ({r['ooms']:,} in all)")
        fits = ("yes" if r["fits"] else "<b>no</b>") if capacity else "\u2013"
        html.append(f"<tr><td>{_e(r['allocator'])}</td><td><code>{_e(r['config'])}</code></td>"
                    f"<td>{format_bytes(r['peak_reserved_bytes'])}</td>"
                    f"<td>{r['peak_reserved_bytes'] / max(floor, 1):.3f}</td><td>{fits}</td><td>{oom}</td></tr>")
    html.append("</tbody></table>")
    html.append(f"<p><b>Recommendation:</b> <code>{_e(recommend(rows, capacity))}</code></p>")
    html.append("<h3>What each allocator's peak is made of</h3>")
    for r in rows:
        b = peak_breakdown(ops, r["allocator"], int(r["peak_op"]), capacity)
        live_req = sum(q for _, q in b["live"])
        live_sz = sum(s for s, _ in b["live"])
        free = b["free"]
        colors = ["var(--seg-partial)", "var(--seg-cached)", "var(--seg-free)", "#b58900"]
        parts = [("live (requested)", live_req, "var(--seg-live)"),
                 ("rounding", max(0, live_sz - live_req), "var(--seg-round)")]
        parts += [(why, sum(v), colors[k % len(colors)]) for k, (why, v) in enumerate(sorted(free.items()))]
        act, size, stream = b["request"]
        what = (f"allocating {format_bytes(size)} on stream index {stream}" if act == 0 else "a free")
        html.append(f"<h4>{_e(r['allocator'])}: {format_bytes(r['peak_reserved_bytes'])} at op "
                    f"{int(r['peak_op']):,} ({_e(what)}), {b['segments']:,} segments</h4>")
        html.append(_stack_bar(parts, max(b["mapped"], 1)))
        items = []
        big = sorted(b["live"], reverse=True)[:5]
        if big:
            items.append(f"<li>{len(b['live']):,} live blocks; the largest: "
                         + ", ".join(f"{format_bytes(s)} (asked {format_bytes(q)})" for s, q in big) + "</li>")
        for why, v in sorted(free.items(), key=lambda kv: -sum(kv[1])):
            items.append(f"<li>free, {_e(why)}: {len(v):,} pieces, {format_bytes(sum(v))}, largest "
                         f"{format_bytes(max(v))}</li>")
        html.append('<ul class="small">' + "".join(items) + "</ul>")
    return TITLE, "".join(html)
