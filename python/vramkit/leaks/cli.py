"""``vramkit leaks FILE``: what was alive at the end of a trace or snapshot, and what grew."""
from __future__ import annotations

import json

import numpy as np

from .._units import format_bytes
from .._cli_common import _load, add_import_limit_args
from .growth import is_growing


def analyze(trace, windows: int = 8, top: int = 20) -> dict:
    """Live-at-end and growth by call site of a :class:`vramkit.trace.Trace`.

    Growth: the trace is cut into ``windows`` equal runs of ops; a site grows when its live bytes
    at the run boundaries rise monotonically (:func:`vramkit.leaks.is_growing` over all runs).
    """
    ops = trace.ops
    n = len(trace)
    sites = trace.sites
    is_alloc = ops[:, 0] == 0
    alloc_rows = np.flatnonzero(is_alloc)
    site_of_id = ops[alloc_rows, 4]
    size_of_id = ops[alloc_rows, 2]
    ids = ops[:, 1]
    op_site = site_of_id[ids] if n else np.zeros(0, dtype=np.int64)
    delta = np.where(is_alloc, 1, -1) * size_of_id[ids] if n else np.zeros(0, dtype=np.int64)
    count_delta = np.where(is_alloc, 1, -1)
    nsites = max(len(sites), 1)
    end_bytes = np.zeros(nsites, dtype=np.int64)
    end_count = np.zeros(nsites, dtype=np.int64)
    np.add.at(end_bytes, op_site, delta)
    np.add.at(end_count, op_site, count_delta)
    alive = [{"site": sites[s] or "<unknown>", "count": int(end_count[s]), "bytes": int(end_bytes[s])}
             for s in np.flatnonzero(end_count > 0)]
    alive.sort(key=lambda g: (-g["bytes"], g["site"]))

    windows = max(2, min(windows, n)) if n else 2
    seg = (np.arange(n) * windows) // max(n, 1)
    grid = np.zeros((windows, nsites), dtype=np.int64)
    np.add.at(grid, (seg, op_site), delta)
    live = np.vstack([np.zeros((1, nsites), dtype=np.int64), np.cumsum(grid, axis=0)])
    grew = []
    for s in range(nsites):
        series = live[:, s].tolist()
        if is_growing(series, windows):
            grew.append({"site": sites[s] or "<unknown>", "bytes_per_window": (series[-1] - series[0]) // windows,
                         "live_bytes": series[-1], "series": series})
    grew.sort(key=lambda g: (-g["live_bytes"], g["site"]))
    return {"name": trace.name, "source": trace.source, "ops": n, "windows": windows,
            "alive_at_end": alive[:top] if top else alive, "alive_sites": len(alive),
            "alive_bytes": int(sum(g["bytes"] for g in alive)),
            "alive_count": int(sum(g["count"] for g in alive)), "grew": grew}


def _text(r: dict, top: int) -> str:
    lines = [f"{r['name']} ({r['source']}, {r['ops']} ops)"]
    if r["alive_count"]:
        lines.append(f"alive at the end: {r['alive_count']} allocation(s), {format_bytes(r['alive_bytes'])}, "
                     f"at {r['alive_sites']} call site(s):")
        for g in r["alive_at_end"][:top]:
            lines.append(f"  {g['count']:6d} x {format_bytes(g['bytes']):>11s}  {g['site']}")
        if r["alive_sites"] > top:
            lines.append(f"  ... {r['alive_sites'] - top} more sites")
    else:
        lines.append("alive at the end: nothing")
    if r["grew"]:
        lines.append(f"grew in every part of the trace ({r['windows']} equal parts), by call site:")
        for g in r["grew"][:top]:
            lines.append(f"  +{format_bytes(g['bytes_per_window']):>11s}/part, {format_bytes(g['live_bytes']):>11s} "
                         f"live at the end  {g['site']}")
    else:
        lines.append(f"grew steadily: nothing (trace cut into {r['windows']} parts)")
    return "\n".join(lines)


def cmd_leaks(args) -> int:
    from .._cli_common import CliError
    if args.top < 0:
        raise CliError(f"--top must be 0 or more, not {args.top}")
    if not 2 <= args.windows <= 1000:
        raise CliError(f"--windows must be between 2 and 1000, not {args.windows}")
    trace = _load(args.trace)
    r = analyze(trace, windows=args.windows, top=0)
    if args.json:
        print(json.dumps(r, indent=1))
    else:
        print(_text(r, args.top))
    return 0


def add_leak_commands(sub) -> None:
    s = sub.add_parser("leaks", help="what was alive at the end of a trace or snapshot, and what grew, by call site")
    s.add_argument("trace", help="trace or snapshot file (PyTorch snapshot or trace CSV, RMM log, vramkit v1)")
    s.add_argument("--top", type=int, default=20, help="call sites to list (default 20)")
    s.add_argument("--windows", type=int, default=8,
                   help="parts the trace is cut into to judge growth (default 8)")
    s.add_argument("--json", action="store_true", help="print JSON instead of text")
    add_import_limit_args(s)
    s.set_defaults(func=cmd_leaks)
