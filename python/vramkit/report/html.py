"""One self-contained HTML page that compares allocators on a trace.

Everything is inline (CSS, a small script for tooltips, SVG charts); the page loads nothing from
a file or the network, so it can be mailed, attached to a CI run or opened offline.
"""
from __future__ import annotations

import datetime as _dt
import html as _html
import json
import math
import os
import re
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ..trace.model import Trace
from .assets import CSS, JS
from .._axis import nice_step
from .._units import format_bytes

__all__ = ["render_report", "build_report_html", "analyze_peak_state", "format_bytes", "SECTION_TITLES"]

#: Headings of the built-in sections, in page order.
SECTION_TITLES = {
    "verdict": "Verdict",
    "comparison": "Allocator comparison",
    "timeline": "Memory over the trace",
    "sizes": "Allocation sizes",
    "largest": "Largest allocations at the peak",
    "peak": "The state at the peak, explained",
}

PALETTE = ["#2563eb", "#ea580c", "#16a34a", "#9333ea", "#dc2626", "#0891b2", "#a16207", "#db2777",
           "#4b5563", "#65a30d"]
_UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]
_TIMELINE_BUCKETS = 900


# -- formatting ------------------------------------------------------------------------------------
def _pow2_label(n: int) -> str:
    """``32768`` -> ``"32 KiB"``: a short label for a power of two (or 0)."""
    u = 0
    while n >= 1024 and n % 1024 == 0 and u < len(_UNITS) - 1:
        n //= 1024
        u += 1
    return f"{n} {_UNITS[u]}"


def _e(s: Any) -> str:
    return _html.escape(str(s), quote=True)


def _int(n: Any) -> str:
    return "\u2014" if n is None else f"{int(n):,}"


def _num(d: Mapping[str, Any], key: str) -> float | None:
    v = d.get(key)
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _ns(v: float | None) -> str:
    if v is None:
        return "\u2014"
    return f"{v:,.0f} ns" if v >= 10 else f"{v:.1f} ns"


def _pct(part: float, whole: float) -> str:
    return "\u2014" if not whole else f"{100.0 * part / whole:.1f}%"


def _slug(text: str, used: set[str]) -> str:
    base = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "section"
    slug, k = base, 2
    while slug in used:
        slug, k = f"{base}-{k}", k + 1
    used.add(slug)
    return slug


def _byte_axis(vmax: float) -> tuple[float, str, list[float]]:
    """(unit bytes, unit name, tick values in bytes) for an axis from 0 to ``vmax`` bytes."""
    vmax = max(float(vmax), 1.0)
    u = 0
    while vmax / (1024 ** u) >= 1024 and u < len(_UNITS) - 1:
        u += 1
    if u > 0 and vmax / (1024 ** u) < 1:
        u -= 1
    unit = float(1024 ** u)
    step = nice_step(vmax / unit)
    top = math.ceil(vmax / unit / step - 1e-9) * step
    ticks = [i * step * unit for i in range(int(round(top / step)) + 1)]
    return unit, _UNITS[u], ticks


def _tick_label(v: float, unit: float, name: str) -> str:
    x = v / unit
    if x == 0:
        return "0"
    s = f"{x:.0f}" if abs(x - round(x)) < 1e-9 else f"{x:.1f}" if abs(x * 10 - round(x * 10)) < 1e-6 else f"{x:.2f}"
    return f"{s} {name}"


def _json_for_script(obj: Any) -> str:
    # Inside <script>, "</" would end the element and U+2028/9 break old parsers.
    return (json.dumps(obj, separators=(",", ":"), allow_nan=False)
            .replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


# -- data preparation ------------------------------------------------------------------------------
def _bucket_max(n_ops: int, buckets: int, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Max of ``y`` per op-index bucket; empty buckets hold the previous value (0 before any)."""
    out = np.full(buckets, -1, dtype=np.int64)
    if x.size:
        b = np.clip((x.astype(np.int64) * buckets) // max(n_ops, 1), 0, buckets - 1)
        np.maximum.at(out, b, y.astype(np.int64))
    filled = np.maximum.accumulate(np.where(out >= 0, np.arange(buckets), -1))
    res = np.where(filled >= 0, out[np.maximum(filled, 0)], 0)
    return res.astype(np.int64)


def _timeline_spec(trace: Trace, results: Sequence[Mapping[str, Any]],
                   timelines: Mapping[str, Sequence[Sequence[int]]],
                   colors: Mapping[str, str]) -> dict[str, Any]:
    n_ops = len(trace)
    max_tl = 0
    for tl in timelines.values():
        if len(tl):
            max_tl = max(max_tl, int(max(p[0] for p in tl)) + 1)
    n = max(n_ops, max_tl, 1)
    buckets = min(_TIMELINE_BUCKETS, n)
    starts = [-(-i * n // buckets) for i in range(buckets)]
    live = trace.live_bytes()
    series = [{"key": "live", "name": "live (requested)", "color": "#94a3b8",
               "values": _bucket_max(n, buckets, np.arange(live.size), live).tolist()}]
    order = [r.get("allocator") for r in results if r.get("allocator") in timelines]
    order += [k for k in timelines if k not in order]
    for k, name in enumerate(order):
        pts = np.asarray(timelines[name], dtype=np.int64).reshape(-1, 3) if len(timelines[name]) else \
            np.zeros((0, 3), dtype=np.int64)
        series.append({"key": f"s{k}", "name": f"{name} reserved", "color": colors[str(name)],
                       "values": _bucket_max(n, buckets, pts[:, 0], pts[:, 2]).tolist()})
    return {"x": starts, "n_ops": n, "series": series}


def analyze_peak_state(peak_state: Mapping[str, Any]) -> dict[str, Any]:
    """Explain a pool's state: where the bytes between live and reserved went.

    Returns a dict of byte counts (``mapped_bytes`` = reserved, ``requested_bytes`` = live,
    ``rounding_bytes``, ``partial_page_free_bytes``, ``cached_free_bytes``, ``free_ranges``, ...)
    such that ``mapped = requested + rounding + partial_page_free + cached_free`` whenever the
    state is consistent (``consistent`` says so).
    """
    page = int(peak_state.get("page_size") or 0)
    segs = list(peak_state.get("segments") or [])
    virtual = mapped = allocated = requested = free_total = 0
    n_blocks = n_small = 0
    free_ranges: list[int] = []
    partial_pages = partial_free = 0
    for seg in segs:
        base, size = int(seg.get("base", 0)), int(seg.get("size", 0))
        virtual += size
        mapped += int(seg.get("mapped_bytes", size))
        n_small += 1 if seg.get("small") else 0
        blocks = sorted(seg.get("blocks") or [], key=lambda b: int(b.get("addr", 0)))
        cursor, run = base, 0
        cover: dict[int, int] = {}
        for b in blocks:
            addr, bsize = int(b.get("addr", 0)), int(b.get("size", 0))
            n_blocks += 1
            if addr > cursor:  # a gap the pool did not list: free space
                run += addr - cursor
            if b.get("allocated"):
                if run:
                    free_ranges.append(run)
                    free_total += run
                    run = 0
                allocated += bsize
                requested += int(b.get("requested", bsize))
                if page > 0 and bsize > 0:
                    off = addr - base
                    fp, lp = off // page, (off + bsize - 1) // page
                    if fp == lp:
                        cover[fp] = cover.get(fp, 0) + bsize
                    else:
                        cover[fp] = cover.get(fp, 0) + (fp + 1) * page - off
                        cover[lp] = cover.get(lp, 0) + off + bsize - lp * page
            else:
                run += bsize
            cursor = max(cursor, addr + bsize)
        if base + size > cursor:
            run += base + size - cursor
        if run:
            free_ranges.append(run)
            free_total += run
        for covered in cover.values():
            if covered < page:
                partial_pages += 1
                partial_free += page - covered
    cached = mapped - allocated - partial_free
    free_ranges.sort(reverse=True)
    return {
        "page_size": page,
        "segments": len(segs),
        "small_segments": n_small,
        "blocks": n_blocks,
        "virtual_bytes": virtual,
        "mapped_bytes": mapped,
        "allocated_bytes": allocated,
        "requested_bytes": requested,
        "rounding_bytes": allocated - requested,
        "free_bytes": free_total,
        "free_ranges": free_ranges,
        "largest_free_range": free_ranges[0] if free_ranges else 0,
        "partial_pages": partial_pages,
        "partial_page_free_bytes": partial_free,
        "cached_free_bytes": max(0, cached),
        "fragmentation_cost": mapped - requested,
        "consistent": cached >= 0 and allocated >= requested,
    }


# -- SVG pieces ------------------------------------------------------------------------------------
def _timeline_svg(spec: dict[str, Any], peak_idx: int, peak_live: int) -> str:
    W, H, L, R, T, B = 1100, 380, 78, 18, 18, 44
    pw, ph = W - L - R, H - T - B
    nb = len(spec["x"])
    vmax = max((max(s["values"]) if s["values"] else 0) for s in spec["series"]) or 1
    unit, uname, ticks = _byte_axis(vmax * 1.04)
    top = ticks[-1] or 1.0

    def X(i: float) -> float:
        return L + pw * i / nb

    def Y(v: float) -> float:
        return T + ph * (1 - v / top)

    out = [f'<svg viewBox="0 0 {W} {H}" role="img" aria-label="live and reserved bytes over the trace">']
    for t in ticks:
        y = Y(t)
        out.append(f'<line class="grid" x1="{L}" x2="{L + pw}" y1="{y:.1f}" y2="{y:.1f}"/>')
        out.append(f'<text x="{L - 8}" y="{y + 4:.1f}" text-anchor="end">{_e(_tick_label(t, unit, uname))}</text>')
    n_ops = spec["n_ops"]
    xstep = nice_step(n_ops, 8)
    v = 0.0
    while v <= n_ops:
        x = L + pw * v / n_ops
        out.append(f'<line class="axis" x1="{x:.1f}" x2="{x:.1f}" y1="{T + ph}" y2="{T + ph + 5}"/>')
        lab = f"{v / 1000:g}k" if v >= 1000 else f"{v:g}"
        out.append(f'<text x="{x:.1f}" y="{T + ph + 19}" text-anchor="middle">{_e(lab)}</text>')
        v += xstep
    out.append(f'<text x="{L + pw / 2:.0f}" y="{H - 4}" text-anchor="middle">operation # in the trace</text>')
    out.append(f'<line class="axis" x1="{L}" x2="{L + pw}" y1="{T + ph}" y2="{T + ph}"/>')
    for s in spec["series"]:
        vals = s["values"]
        if not vals:
            continue
        d = [f"M{X(0):.1f},{Y(vals[0]):.1f}"]
        for i, val in enumerate(vals):
            if i:
                d.append(f"V{Y(val):.1f}")
            d.append(f"H{X(i + 1):.1f}")
        path = "".join(d)
        if s["key"] == "live":
            out.append(f'<path class="live-area" data-series="live" d="{path}V{T + ph}H{X(0):.1f}Z"/>')
        else:
            out.append(f'<path class="series" data-series="{s["key"]}" stroke="{s["color"]}" d="{path}"/>')
    if peak_idx >= 0 and nb:
        b = min(nb - 1, peak_idx * nb // max(n_ops, 1))
        px, py = X(b + 0.5), Y(peak_live)
        anchor = "end" if px > L + pw * 0.75 else "start"
        dx = -8 if anchor == "end" else 8
        label = f"peak live {format_bytes(peak_live)} at op {peak_idx:,}"
        out.append(f'<circle class="peak-dot" data-series="live" cx="{px:.1f}" cy="{py:.1f}" r="3.5"/>')
        out.append(f'<text class="peak-label" data-series="live" x="{px + dx:.1f}" y="{max(py - 8, T + 10):.1f}" '
                   f'text-anchor="{anchor}">{_e(label)}</text>')
    out.append(f'<line class="guide" x1="0" x2="0" y1="{T}" y2="{T + ph}" visibility="hidden"/>')
    out.append(f'<rect class="overlay" x="{L}" y="{T}" width="{pw}" height="{ph}" fill="transparent"/>')
    out.append("</svg>")
    spec["left"], spec["width"] = L, pw
    return "".join(out)


def _bars_svg(labels: list[str], values: list[int], tips: list[str], as_bytes: bool, css: str, aria: str) -> str:
    W, H, L, R, T, B = 540, 250, 70, 10, 12, 40
    pw, ph = W - L - R, H - T - B
    n = max(len(values), 1)
    vmax = max(values) if values else 1
    if as_bytes:
        unit, uname, ticks = _byte_axis(vmax)
        fmt = lambda v: _tick_label(v, unit, uname)  # noqa: E731
    else:
        step = max(1.0, nice_step(max(vmax, 1), 4))
        step = float(math.ceil(step))
        ticks = [i * step for i in range(int(math.ceil(max(vmax, 1) / step)) + 1)]
        fmt = lambda v: f"{v:,.0f}"  # noqa: E731
    top = ticks[-1] or 1.0
    out = [f'<svg viewBox="0 0 {W} {H}" role="img" aria-label="{_e(aria)}">']
    for t in ticks:
        y = T + ph * (1 - t / top)
        out.append(f'<line class="grid" x1="{L}" x2="{L + pw}" y1="{y:.1f}" y2="{y:.1f}"/>')
        out.append(f'<text x="{L - 6}" y="{y + 4:.1f}" text-anchor="end">{_e(fmt(t))}</text>')
    bw = pw / n
    every = max(1, math.ceil(n / 9))
    for i, (lab, v, tip) in enumerate(zip(labels, values, tips)):
        h = ph * v / top
        x = L + i * bw
        out.append(f'<rect class="hbar {css}" x="{x + bw * 0.12:.1f}" y="{T + ph - h:.1f}" width="{bw * 0.76:.1f}" '
                   f'height="{max(h, 0.0):.1f}" data-tip="{_e(tip)}"/>')
        if i % every == 0:
            out.append(f'<text x="{x + bw / 2:.1f}" y="{T + ph + 16}" text-anchor="middle">{_e(lab)}</text>')
    out.append(f'<line class="axis" x1="{L}" x2="{L + pw}" y1="{T + ph}" y2="{T + ph}"/>')
    out.append(f'<text x="{L + pw / 2:.0f}" y="{H - 4}" text-anchor="middle">allocation size (bucket start)</text>')
    out.append("</svg>")
    return "".join(out)


# -- sections --------------------------------------------------------------------------------------
def _result_rows(results: Sequence[Mapping[str, Any]], peak_live: int) -> list[dict[str, Any]]:
    rows = []
    for r in results:
        reserved = _num(r, "peak_reserved_bytes")
        frag = _num(r, "fragmentation")
        if frag is None and reserved is not None and peak_live:
            frag = reserved / peak_live
        frag_all = _num(r, "fragmentation_all_passes")
        rows.append({"name": str(r.get("allocator", "?")), "reserved": reserved, "frag": frag,
                     "frag_all": frag_all,
                     "cold": _num(r, "cold_ns_per_op"), "warm": _num(r, "warm_ns_per_op"),
                     "ooms": _num(r, "ooms"), "upstream": _num(r, "upstream_allocs"),
                     "ops": _num(r, "ops"), "live": _num(r, "peak_live_bytes")})
    return rows


def _later_passes_grow(r: Mapping[str, Any]) -> bool:
    """Whether a result's peak over all passes is visibly above its first pass's (to three decimals)."""
    return r["frag"] is not None and r["frag_all"] is not None and round(r["frag_all"], 3) > round(r["frag"], 3)


def _verdict(rows: list[dict[str, Any]], peak_live: int) -> str:
    if not rows:
        return ("No allocator results were given: this page describes the trace only. The floor no "
                f"allocator can go under is its peak of live bytes, <b>{format_bytes(peak_live)}</b>.")
    subject = rows[0]
    usable = [r for r in rows if r["reserved"] is not None and not r["ooms"]] or \
             [r for r in rows if r["reserved"] is not None]
    if not usable:
        return "No allocator reported its peak reserved bytes."
    best = min(usable, key=lambda r: r["reserved"])

    def ratio(r: dict[str, Any]) -> str:
        return f"{r['reserved'] / peak_live:.3f}\u00d7" if peak_live else "n/a"

    parts = []
    if len(usable) == 1:
        parts.append(f"<b>{_e(best['name'])}</b> reserves <b>{format_bytes(best['reserved'])}</b> at its peak, "
                     f"{ratio(best)} the {format_bytes(peak_live)} live at the trace's peak.")
    elif best is subject:
        others = sorted((r for r in usable if r is not subject), key=lambda r: r["reserved"])
        nxt, worst = others[0], others[-1]
        saved = nxt["reserved"] - subject["reserved"]
        parts.append(f"<b>{_e(subject['name'])}</b> needs the least memory on this trace: "
                     f"<b>{format_bytes(subject['reserved'])}</b> at its peak, {ratio(subject)} the "
                     f"{format_bytes(peak_live)} live at the trace's peak. That is "
                     f"<b>{format_bytes(saved)} ({_pct(saved, nxt['reserved'])}) less</b> than the next best, "
                     f"{_e(nxt['name'])} ({format_bytes(nxt['reserved'])})")
        if worst is not nxt:
            parts[-1] += (f", and {_pct(worst['reserved'] - subject['reserved'], worst['reserved'])} less than "
                          f"{_e(worst['name'])} ({format_bytes(worst['reserved'])}).")
        else:
            parts[-1] += "."
    else:
        extra = subject["reserved"] - best["reserved"] if subject["reserved"] is not None else None
        parts.append(f"<b>{_e(best['name'])}</b> needs the least memory on this trace: "
                     f"<b>{format_bytes(best['reserved'])}</b> at its peak ({ratio(best)} the live floor of "
                     f"{format_bytes(peak_live)}).")
        if extra is not None:
            parts.append(f"{_e(subject['name'])} needs {format_bytes(subject['reserved'])}, "
                         f"<b>{format_bytes(extra)} ({_pct(extra, best['reserved'])}) more</b>.")
    if _later_passes_grow(subject):
        parts.append(f"Replayed again with its cache kept, {_e(subject['name'])}'s peak grows: over all passes it "
                     f"reaches <b>{subject['frag_all']:.3f}\u00d7</b> the live floor, against "
                     f"{subject['frag']:.3f}\u00d7 in the first.")
    timed = [r for r in rows if r["warm"] is not None]
    if subject["warm"] is not None and len(timed) > 1:
        fastest = min(timed, key=lambda r: r["warm"])
        if fastest is subject:
            parts.append(f"It is also the fastest warm: {_ns(subject['warm'])} per operation.")
        else:
            parts.append(f"Warm, {_e(subject['name'])} costs {_ns(subject['warm'])} per operation "
                         f"({_e(fastest['name'])}: {_ns(fastest['warm'])}).")
    ooms = [r["name"] for r in rows if r["ooms"]]
    if ooms:
        parts.append("Ran out of memory: " + ", ".join(_e(n) for n in ooms) + ".")
    return " ".join(parts)


def _kpis(trace: Trace, rows: list[dict[str, Any]], peak_live: int) -> str:
    items = [("Peak live (floor)", format_bytes(peak_live), f"{peak_live:,} bytes requested")]
    if rows and rows[0]["reserved"] is not None:
        s = rows[0]
        items.append((f"{s['name']} peak reserved", format_bytes(s["reserved"]),
                      f"fragmentation {s['frag']:.3f}\u00d7" if s["frag"] is not None else ""))
        items.append(("Fragmentation cost", format_bytes(s["reserved"] - peak_live),
                      "reserved \u2212 live at the peaks"))
    items.append(("Operations", f"{len(trace):,}", f"{trace.n_allocs:,} allocations, {trace.n_frees:,} frees"))
    out = ['<div class="kpis">']
    for label, value, note in items:
        out.append(f'<div class="kpi"><div class="label">{_e(label)}</div><div class="value">{_e(value)}</div>'
                   f'<div class="note">{_e(note)}</div></div>')
    out.append("</div>")
    return "".join(out)


def _times(x: float | None) -> str:
    return "\u2014" if x is None else f"{x:.3f}\u00d7"


def _comparison_table(rows: list[dict[str, Any]], peak_live: int, colors: Mapping[str, str]) -> str:
    if not rows:
        return '<p class="muted">No allocator results.</p>'

    def best_of(key: str) -> float | None:
        vals = [r[key] for r in rows if r[key] is not None]
        return min(vals) if vals else None

    best = {k: best_of(k) for k in ("reserved", "frag", "frag_all", "cold", "warm")}
    fmax = max((r["frag"] for r in rows if r["frag"] is not None), default=1.0) or 1.0
    # Over several passes a pool's peak may grow past its first pass's; shown only where it does somewhere.
    all_col = any(_later_passes_grow(r) for r in rows)
    out = ['<table><thead><tr><th>Allocator</th><th class="num">Peak reserved</th>'
           '<th class="num">\u00d7 live floor</th>'
           + ('<th class="num">\u00d7 live floor, all passes</th>' if all_col else '')
           + '<th class="num">Cost (reserved \u2212 live)</th>'
           '<th class="num">Cold ns/op</th><th class="num">Warm ns/op</th><th class="num">OOMs</th>'
           '<th class="num">Upstream allocs</th></tr></thead><tbody>']
    for i, r in enumerate(rows):
        def cls(key: str) -> str:
            hit = r[key] is not None and r[key] == best[key] and len(rows) > 1
            return " best" if hit else ""
        frag = _times(r["frag"])
        bar = "" if r["frag"] is None else \
            f'<div class="bar"><span style="width:{min(100.0, 100.0 * r["frag"] / fmax):.1f}%"></span></div>'
        cost = "\u2014" if r["reserved"] is None else format_bytes(r["reserved"] - peak_live)
        title = "" if r["reserved"] is None else f' title="{int(r["reserved"]):,} bytes"'
        out.append(
            f'<tr class="{"subject" if i == 0 else ""}"><td><span class="swatch" '
            f'style="background:{colors[r["name"]]}"></span>{_e(r["name"])}</td>'
            f'<td class="num{cls("reserved")}"{title}>{format_bytes(r["reserved"])}</td>'
            f'<td class="num{cls("frag")}">{frag}{bar}</td>'
            + (f'<td class="num{cls("frag_all")}">{_times(r["frag_all"])}</td>' if all_col else '')
            + f'<td class="num">{cost}</td>'
            f'<td class="num{cls("cold")}">{_ns(r["cold"])}</td><td class="num{cls("warm")}">{_ns(r["warm"])}</td>'
            f'<td class="num">{_int(r["ooms"])}</td><td class="num">{_int(r["upstream"])}</td></tr>')
    out.append("</tbody></table>")
    out.append('<p class="small muted" style="margin-top:8px">Peak reserved: the most memory the allocator held '
               'from the device. \u00d7 live floor: peak reserved / peak live requested bytes '
               f'({format_bytes(peak_live)}); 1.000 is the floor, and the first pass\'s peak is the one '
               'counted' + ('; all passes: the peak over every pass of the replay, with the allocator\'s '
                            'cache kept between passes' if all_col else '') +
               '. Best value per column in green.</p>')
    return "".join(out)


def _timeline_section(spec: dict[str, Any], trace: Trace) -> str:
    if len(trace) == 0:
        return '<p class="muted">The trace is empty.</p>'
    svg = _timeline_svg(spec, trace.peak_index(), trace.peak_live_bytes())
    legend = ['<div class="legend">']
    for s in spec["series"]:
        legend.append(f'<span class="item" data-key="{s["key"]}" title="click to show or hide">'
                      f'<span class="line" style="background:{s["color"]}"></span>{_e(s["name"])}</span>')
    legend.append("</div>")
    return ("".join(legend) + f'<div class="chart" id="timeline-chart">{svg}</div>'
            '<p class="small muted" style="margin-top:6px">Grey area: bytes live (requested) after each operation. '
            "Lines: bytes each allocator reserved from the device. Each point is the maximum over "
            f"{max(1, spec['n_ops'] // max(len(spec['x']), 1)):,} operation(s). Hover for values; click a "
            "legend entry to hide it.</p>")


def _sizes_section(trace: Trace) -> str:
    h = trace.size_histogram()
    if h.counts.size == 0:
        return '<p class="muted">No allocations.</p>'
    labels = [_pow2_label(int(lo)) for lo in h.lo.tolist()]
    rng = [f"{_pow2_label(int(lo))} \u2264 size < {_pow2_label(2 * int(lo))}" if lo else "0 B"
           for lo in h.lo.tolist()]
    total_n, total_b = int(h.counts.sum()), int(h.bytes.sum())
    tips_n = [f"{r}\n{int(c):,} allocations ({_pct(int(c), total_n)})" for r, c in zip(rng, h.counts.tolist())]
    tips_b = [f"{r}\n{format_bytes(int(b))} allocated in total ({_pct(int(b), total_b)})"
              for r, b in zip(rng, h.bytes.tolist())]
    small = int(h.counts[h.lo < (1 << 20)].sum())
    return (
        f'<p>{total_n:,} allocations, {format_bytes(total_b)} requested in total; '
        f'{_pct(small, total_n)} of them are under 1 MiB.</p>'
        '<div class="two"><div><h3>Number of allocations</h3><div class="chart tips">'
        + _bars_svg(labels, h.counts.tolist(), tips_n, False, "", "allocations per size bucket")
        + '</div></div><div><h3>Bytes requested</h3><div class="chart tips">'
        + _bars_svg(labels, h.bytes.tolist(), tips_b, True, "bytes", "bytes per size bucket")
        + "</div></div></div>")


def _largest_section(trace: Trace, k: int = 20) -> str:
    p = trace.peak_index()
    if p < 0:
        return '<p class="muted">The trace is empty.</p>'
    live = trace.live_at(p)
    total = sum(b.size for b in live)
    top = live[:k]
    stream_pos = {h: i for i, h in enumerate(trace.streams)}
    has_sites = any(b.site for b in top)
    top_share = _pct(sum(b.size for b in top), total)
    out = [f"<p>At the peak (after op {p:,} of {len(trace):,}), <b>{len(live):,}</b> allocations are live, "
           f"<b>{format_bytes(total)}</b> in all; the {len(top)} largest hold {top_share}.</p>"]
    out.append('<table><thead><tr><th class="num">#</th><th class="num">Size</th><th class="num">Share</th>'
               '<th class="num">Allocated at op</th><th>Stream</th><th>Site</th></tr></thead><tbody>')
    for i, b in enumerate(top, 1):
        site = _e(b.site) if b.site else '<span class="muted">\u2014</span>'
        out.append(f'<tr><td class="num">{i}</td><td class="num" title="{b.size:,} bytes">{format_bytes(b.size)}</td>'
                   f'<td class="num">{_pct(b.size, total)}</td><td class="num">{b.alloc_op:,}</td>'
                   f'<td>#{stream_pos.get(b.stream, 0)} <span class="muted small">({b.stream:#x})</span></td>'
                   f'<td class="site">{site}</td></tr>')
    out.append("</tbody></table>")
    if not has_sites:
        out.append('<p class="small muted" style="margin-top:8px">This trace carries no allocation sites '
                   "(recorded without stacks). Record with Python stacks to see file:line here.</p>")
    return "".join(out)


def _stack_bar(parts: list[tuple[str, int, str]], total: int) -> str:
    bar = ['<div class="stack">']
    legend = ['<div class="stack-legend">']
    for label, v, color in parts:
        if total > 0 and v > 0:
            bar.append(f'<div style="width:{100.0 * v / total:.3f}%;background:{color}" '
                       f'title="{_e(label)}: {_e(format_bytes(v))}"></div>')
        legend.append(f'<span><span class="swatch" style="background:{color}"></span>{_e(label)}: '
                      f'<b>{format_bytes(v)}</b> <span class="muted">({_pct(v, total)})</span></span>')
    bar.append("</div>")
    legend.append("</div>")
    return "".join(bar) + "".join(legend)


def _segment_map(peak_state: Mapping[str, Any], limit: int = 40) -> str:
    segs = list(peak_state.get("segments") or [])
    if not segs:
        return ""
    shown = sorted(segs, key=lambda s: -int(s.get("size", 0)))[:limit]
    shown.sort(key=lambda s: int(s.get("base", 0)))
    out = ['<h3>Segments at the peak</h3><div class="segmap chart tips">']
    for seg in shown:
        base, size = int(seg.get("base", 0)), max(int(seg.get("size", 0)), 1)
        mapped = int(seg.get("mapped_bytes", size))
        rects = []
        live_b = 0
        for b in sorted(seg.get("blocks") or [], key=lambda b: int(b.get("addr", 0))):
            x = 1000.0 * (int(b.get("addr", 0)) - base) / size
            w = 1000.0 * int(b.get("size", 0)) / size
            if b.get("allocated"):
                req = int(b.get("requested", b.get("size", 0)))
                live_b += req
                wr = 1000.0 * req / size
                rects.append(f'<rect x="{x:.2f}" y="0" width="{wr:.2f}" height="12" fill="var(--seg-live)"/>')
                if w > wr:
                    rects.append(f'<rect x="{x + wr:.2f}" y="0" width="{w - wr:.2f}" height="12" '
                                 'fill="var(--seg-round)"/>')
        kind = "small" if seg.get("small") else "large"
        tip = (f"segment {base:#x} ({kind})\n{format_bytes(size)} address range, {format_bytes(mapped)} mapped\n"
               f"{len(seg.get('blocks') or []):,} blocks, {format_bytes(live_b)} live")
        mapped_note = f" \u00b7 {_pct(mapped, size)} mapped" if mapped != size else ""
        out.append(f'<div class="row" data-tip="{_e(tip)}"><div class="lab">{format_bytes(size)} \u00b7 {kind}'
                   f'{mapped_note}</div>'
                   '<svg viewBox="0 0 1000 12" preserveAspectRatio="none" shape-rendering="crispEdges">'
                   '<rect x="0" y="0" width="1000" height="12" fill="var(--seg-free)"/>'
                   + "".join(rects) + "</svg></div>")
    out.append("</div>")
    note = f"{len(segs) - len(shown)} smaller segments not drawn. " if len(segs) > len(shown) else ""
    out.append(f'<p class="small muted">{note}Each row is one segment scaled to full width: '
               '<span class="swatch" style="background:var(--seg-live)"></span>live '
               '<span class="swatch" style="background:var(--seg-round)"></span>rounding '
               '<span class="swatch" style="background:var(--seg-free)"></span>free.</p>')
    return "".join(out)


def _peak_section(rows: list[dict[str, Any]], peak_state: Mapping[str, Any] | None, peak_live: int) -> str:
    subject = rows[0]["name"] if rows else "the allocator"
    if peak_state is None:
        if rows and rows[0]["reserved"] is not None:
            reserved = int(rows[0]["reserved"])
            return ("<p>No pool state at the peak was captured for this report; only the totals are known.</p>"
                    + _stack_bar([("live (requested)", peak_live, "var(--seg-live)"),
                                  ("fragmentation cost", max(0, reserved - peak_live), "var(--seg-partial)")],
                                 max(reserved, peak_live)))
        return "<p class=\"muted\">No pool state at the peak was captured for this report.</p>"
    a = analyze_peak_state(peak_state)
    mapped, live = a["mapped_bytes"], a["requested_bytes"]
    parts = [("live (requested)", live, "var(--seg-live)"),
             ("rounding", a["rounding_bytes"], "var(--seg-round)"),
             ("free in partly used pages", a["partial_page_free_bytes"], "var(--seg-partial)"),
             ("free whole pages still mapped", a["cached_free_bytes"], "var(--seg-cached)")]
    ranges = a["free_ranges"]
    page = a["page_size"]
    text = [f"<p>At its peak, <b>{_e(subject)}</b> holds <b>{format_bytes(mapped)}</b> of device memory in "
            f"{a['segments']:,} segment(s) ({a['small_segments']:,} for small allocations) spanning "
            f"{format_bytes(a['virtual_bytes'])} of address space. <b>{format_bytes(live)}</b> "
            f"({_pct(live, mapped)}) holds live data. The fragmentation cost, reserved \u2212 live, is "
            f"<b>{format_bytes(a['fragmentation_cost'])}</b>:</p>"]
    text.append(_stack_bar(parts, max(mapped, 1)))
    items = [f"<li><b>{format_bytes(a['rounding_bytes'])}</b> lost to rounding: blocks handed out are larger "
             "than the sizes asked for.</li>"]
    if page:
        items.append(f"<li><b>{a['partial_pages']:,}</b> partly used pages of {format_bytes(page)}: their free "
                     f"parts, <b>{format_bytes(a['partial_page_free_bytes'])}</b>, cannot be unmapped while the "
                     "page also holds live data.</li>")
        items.append(f"<li><b>{format_bytes(a['cached_free_bytes'])}</b> in whole free pages that stay mapped "
                     "(cache the pool could release).</li>")
    if ranges:
        med = ranges[len(ranges) // 2]
        items.append(f"<li><b>{len(ranges):,}</b> free ranges, {format_bytes(a['free_bytes'])} of address space "
                     f"in all: largest {format_bytes(ranges[0])}, median {format_bytes(med)}; the 5 largest: "
                     + ", ".join(format_bytes(r) for r in ranges[:5]) + ".</li>")
    else:
        items.append("<li>No free ranges: every segment is fully used.</li>")
    text.append('<ul style="margin:10px 0 0 0;padding-left:20px">' + "".join(items) + "</ul>")
    if peak_live and live != peak_live:
        text.append(f'<p class="small muted">The trace\'s peak of live bytes is {format_bytes(peak_live)}; the '
                    f"pool state was taken when {format_bytes(live)} was live.</p>")
    if not a["consistent"]:
        text.append('<p class="note-box">The pool state does not add up (allocated blocks exceed the mapped '
                    "bytes, or requested sizes exceed block sizes); the breakdown above is approximate.</p>")
    text.append(_segment_map(peak_state))
    return "".join(text)


# -- page ------------------------------------------------------------------------------------------
def build_report_html(trace: Trace, results: Sequence[Mapping[str, Any]],
                      timelines: Mapping[str, Sequence[Sequence[int]]] | None,
                      peak_state: Mapping[str, Any] | None, title: str,
                      extra_sections: Iterable[tuple[str, str]] | None = None) -> str:
    """The report as an HTML string (see :func:`render_report`)."""
    timelines = dict(timelines or {})
    peak_live = trace.peak_live_bytes()
    rows = _result_rows(results, peak_live)
    colors: dict[str, str] = {}
    for name in [r["name"] for r in rows] + [str(k) for k in timelines]:
        if name not in colors:
            colors[name] = PALETTE[len(colors) % len(PALETTE)]
    spec = _timeline_spec(trace, results, timelines, colors)
    used: set[str] = set()
    sections: list[tuple[str, str, str]] = []  # (id, title, body)

    def add(title_text: str, body: str) -> None:
        sections.append((_slug(title_text, used), title_text, body))

    add(SECTION_TITLES["verdict"],
        f'<p class="verdict">{_verdict(rows, peak_live)}</p>' + _kpis(trace, rows, peak_live))
    add(SECTION_TITLES["comparison"], _comparison_table(rows, peak_live, colors))
    add(SECTION_TITLES["timeline"], _timeline_section(spec, trace))
    add(SECTION_TITLES["sizes"], _sizes_section(trace))
    add(SECTION_TITLES["largest"], _largest_section(trace))
    add(SECTION_TITLES["peak"], _peak_section(rows, peak_state, peak_live))
    for extra_title, extra_html in extra_sections or ():
        add(str(extra_title), str(extra_html))

    s = trace.summary()
    facts = [f"trace <b>{_e(trace.name)}</b>", f"format {_e(trace.source)}", f"{s['ops']:,} ops",
             f"{len(trace.streams)} stream(s)"]
    if "duration_us" in s:
        facts.append(f"{s['duration_us'] / 1e6:.2f} s recorded")
    if trace.skipped_frees:
        facts.append(f"{trace.skipped_frees:,} frees of unknown addresses skipped")
    if trace.left_live:
        facts.append(f"{trace.left_live:,} allocations never freed")
    generated = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    nav = "".join(f'<a href="#{sid}">{_e(t)}</a>' for sid, t, _ in sections)
    facts_html = " \u00b7 ".join(facts)
    body = "".join(f'<section class="card" id="{sid}"><h2>{_e(t)}</h2>{b}</section>' for sid, t, b in sections)
    data = _json_for_script({"timeline": {k: v for k, v in spec.items()}})
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        "<meta name=\"color-scheme\" content=\"light dark\">"
        f"<title>{_e(title)}</title><style>{CSS}</style></head><body>"
        f'<header class="top"><div class="wrap"><h1>{_e(title)}</h1>'
        f'<div class="sub">{facts_html}</div><nav class="toc">{nav}</nav></div></header>'
        f'<main><div class="wrap">{body}</div></main>'
        f"<footer>vramkit report \u00b7 generated {generated} \u00b7 self-contained: no network access needed</footer>"
        f'<script type="application/json" id="vk-data">{data}</script><script>{JS}</script>'
        "</body></html>\n")


def render_report(path_out: str | os.PathLike[str], trace: Trace, results: Sequence[Mapping[str, Any]],
                  timelines: Mapping[str, Sequence[Sequence[int]]] | None,
                  peak_state: Mapping[str, Any] | None, title: str,
                  extra_sections: Iterable[tuple[str, str]] | None = None) -> str:
    """Write the comparison report as one self-contained HTML file, atomically.

    Parameters
    ----------
    path_out : path-like
        Destination ``.html`` file (written to a temporary file in the same folder, then renamed).
    trace : Trace
        The trace that was replayed.
    results : list of dict
        One per allocator (vramkit's pool first) with keys ``trace, allocator, ops,
        peak_live_bytes, peak_reserved_bytes, fragmentation, cold_ns_per_op, warm_ns_per_op, ooms,
        upstream_allocs`` (missing or None values show as a dash).
    timelines : dict
        ``allocator -> [(op_index, live_bytes, reserved_bytes), ...]`` (any sampling).
    peak_state : dict or None
        vramkit's pool at the peak: ``{"segments": [{"base", "size", "mapped_bytes", "small",
        "blocks": [{"addr", "size", "requested", "allocated"}, ...]}, ...], "page_size"}``.
    title : str
        Page title.
    extra_sections : iterable of (title, html), optional
        More sections appended after the built-in ones (the HTML is inserted as is).

    Returns
    -------
    str
        The path written.
    """
    page = build_report_html(trace, results, timelines, peak_state, title, extra_sections)
    from .._atomic import write_atomic
    return write_atomic(path_out, page)
