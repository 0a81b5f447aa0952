"""Growth across iterations: which call sites keep more live memory after every step."""
from __future__ import annotations

import html as _html
import math
from typing import Callable

from .. import _vramkit
from .._units import format_bytes
from . import _tracking


def is_growing(series, window: int, min_bytes: int = 1) -> bool:
    """A monotone upward trend over the last ``window`` steps of ``series``.

    Every step in the window must keep or add live bytes (never shrink), more than half of them
    must add, and the window must add at least ``min_bytes``. A cache that fills once and then
    stays flat has a flat window and gives no alarm; memory that comes and goes is not monotone.
    """
    if window < 1 or len(series) < window + 1:
        return False
    tail = series[-(window + 1):]
    diffs = [b - a for a, b in zip(tail, tail[1:])]
    if any(d < 0 for d in diffs):
        return False
    grew = sum(1 for d in diffs if d > 0)
    return grew >= window // 2 + 1 and tail[-1] - tail[0] >= min_bytes


class GrowthVerdict:
    """What :func:`watch` or :meth:`GrowthDetector.verdict` found.

    Attributes
    ----------
    growing : list of dict
        One per growing call site, most growth first: ``site`` (``file:line``), ``function``,
        ``bytes_per_step`` (mean over the window), ``live_bytes`` (at the last step),
        ``count`` (live allocations at the last step) and ``series`` (live bytes per step).
    total : list of int
        Live bytes (allocations made since the start) at each step boundary; index 0 is before
        the first step.
    window : int
        Steps the trend was judged over.
    """

    def __init__(self, growing: list[dict], total: list[int], series: dict[str, list[int]],
                 window: int, steps: int) -> None:
        self.growing = growing
        self.total = total
        self.series = series
        self.window = window
        self.steps = steps

    @property
    def leaking(self) -> bool:
        return bool(self.growing)

    def __bool__(self) -> bool:  # truthy when something grows
        return self.leaking

    def __repr__(self) -> str:
        return f"<GrowthVerdict {len(self.growing)} growing site(s) over {self.steps} steps>"

    def report(self) -> str:
        fb = format_bytes
        if not self.growing:
            return (f"vramkit growth check: no call site grew over the last {self.window} of "
                    f"{self.steps} steps (live at the end: {fb(self.total[-1] if self.total else 0)})")
        lines = [f"vramkit growth check: {len(self.growing)} call site(s) kept growing over the last "
                 f"{self.window} of {self.steps} steps:"]
        for g in self.growing:
            fn = f" ({g['function']})" if g["function"] else ""
            lines.append(f"  +{fb(g['bytes_per_step']):>11s}/step, {fb(g['live_bytes']):>11s} live in "
                         f"{g['count']} allocation(s)  {g['site']}{fn}")
        return "\n".join(lines)

    def html(self, top: int = 5) -> str:
        """A self-contained HTML fragment: the report and an inline SVG of live bytes per step."""
        sites = [g["site"] for g in self.growing[:top]]
        if len(sites) < top:  # fill with the largest other sites for context
            rest = sorted((s for s in self.series if s not in sites),
                          key=lambda s: -(self.series[s][-1] if self.series[s] else 0))
            sites += rest[: top - len(sites)]
        return _html_plot(self.report(), {s: self.series[s] for s in sites}, self.total,
                          {g["site"] for g in self.growing})


_COLORS = ("#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2")


def _html_plot(report: str, series: dict[str, list[int]], total: list[int], growing: set) -> str:
    w, h, pad_l, pad_b, pad_t, pad_r = 640, 260, 70, 30, 10, 10
    n = max([len(total)] + [len(v) for v in series.values()] + [2])
    ymax = max([1] + total + [max(v) for v in series.values() if v])
    ymax_nice = 10 ** math.floor(math.log10(ymax)) if ymax > 0 else 1
    ymax = math.ceil(ymax / ymax_nice) * ymax_nice

    def pt(i, v):
        x = pad_l + (w - pad_l - pad_r) * i / max(1, n - 1)
        y = pad_t + (h - pad_t - pad_b) * (1 - v / ymax)
        return f"{x:.1f},{y:.1f}"

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
             'font-family="sans-serif" font-size="11">',
             f'<rect x="{pad_l}" y="{pad_t}" width="{w - pad_l - pad_r}" height="{h - pad_t - pad_b}" '
             'fill="none" stroke="#999"/>']
    for frac in (0, 0.5, 1):
        y = pad_t + (h - pad_t - pad_b) * (1 - frac)
        parts.append(f'<text x="{pad_l - 4}" y="{y + 4:.1f}" text-anchor="end">'
                     f'{_html.escape(format_bytes(int(ymax * frac)))}</text>')
    parts.append(f'<text x="{pad_l}" y="{h - 8}">step 0</text>')
    parts.append(f'<text x="{w - pad_r}" y="{h - 8}" text-anchor="end">step {n - 1}</text>')
    if total:
        parts.append('<polyline fill="none" stroke="#bbb" stroke-dasharray="4 3" points="'
                     + " ".join(pt(i, v) for i, v in enumerate(total)) + '"><title>all sites</title></polyline>')
    legend = []
    for k, (site, vals) in enumerate(series.items()):
        c = _COLORS[k % len(_COLORS)]
        width = 2.5 if site in growing else 1.2
        label = _html.escape(site)
        parts.append(f'<polyline fill="none" stroke="{c}" stroke-width="{width}" points="'
                     + " ".join(pt(i, v) for i, v in enumerate(vals)) + f'"><title>{label}</title></polyline>')
        legend.append(f'<li><span style="color:{c}">&#9632;</span> {label}'
                      f'{" <b>(growing)</b>" if site in growing else ""}</li>')
    parts.append("</svg>")
    return ('<div class="vramkit-growth"><pre>' + _html.escape(report) + "</pre>" + "".join(parts)
            + '<ul style="list-style:none;padding-left:0;font-family:sans-serif;font-size:12px">'
            + "".join(legend) + "</ul></div>")


class GrowthDetector:
    """Live bytes per call site at iteration boundaries.

    >>> det = GrowthDetector()          # installs tracking on the device
    >>> for batch in data:
    ...     train_step(batch)
    ...     det.step()
    >>> print(det.verdict().report())
    >>> det.close()

    Only allocations made after the detector started count. Usable as a context manager.
    """

    def __init__(self, device=None, window: int | None = None, min_bytes: int = 1) -> None:
        self._dev, self._tracker = _tracking.acquire(device)
        self._mark = _vramkit.tracking_mark(self._tracker)
        self._window = window
        self._min_bytes = min_bytes
        self._samples: list[dict[int, tuple[int, int]]] = []  # site -> (bytes, count)
        self._closed = False
        self._sample()

    def _sample(self) -> None:
        per: dict[int, list[int]] = {}
        for a in _vramkit.tracked_live(self._tracker, self._mark):
            e = per.setdefault(a["site"], [0, 0])
            e[0] += a["size"]
            e[1] += 1
        self._samples.append({k: (v[0], v[1]) for k, v in per.items()})

    def step(self) -> None:
        """Mark the end of one iteration."""
        if self._closed:
            raise RuntimeError("GrowthDetector.step(): the detector was closed")
        self._sample()

    @property
    def steps(self) -> int:
        return len(self._samples) - 1

    def verdict(self) -> GrowthVerdict:
        steps = self.steps
        window = self._window or max(2, min(5, steps // 2))
        names = _tracking.SiteNames()
        sites = set()
        for s in self._samples:
            sites.update(s)
        series = {}
        growing = []
        for site in sites:
            vals = [s.get(site, (0, 0))[0] for s in self._samples]
            key = names.key(site)
            if key in series:  # two ids of one line (cannot happen today): merge
                series[key] = [a + b for a, b in zip(series[key], vals)]
            else:
                series[key] = vals
            if is_growing(vals, window, self._min_bytes):
                tail = vals[-(window + 1):]
                growing.append({"site": key, "function": names.function(site),
                                "bytes_per_step": (tail[-1] - tail[0]) // window, "live_bytes": vals[-1],
                                "count": self._samples[-1].get(site, (0, 0))[1], "series": vals})
        growing.sort(key=lambda g: (-g["bytes_per_step"], g["site"]))
        total = [sum(v[0] for v in s.values()) for s in self._samples]
        return GrowthVerdict(growing, total, series, window, steps)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            _tracking.release(self._dev)

    def __enter__(self) -> "GrowthDetector":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def watch(step_fn: Callable[[], object], steps: int = 10, *, device=None, window: int | None = None,
          min_bytes: int = 1) -> GrowthVerdict:
    """Run ``step_fn()`` ``steps`` times and name the call sites whose live bytes keep growing.

    The trend is judged over the last ``window`` steps (default: half the steps, at most 5), so
    give warm-up effects (caches that fill once) a few steps before the window.
    """
    if steps < 3:
        raise ValueError(f"watch needs at least 3 steps to see a trend (got {steps})")
    with GrowthDetector(device, window, min_bytes) as det:
        for _ in range(steps):
            step_fn()
            det.step()
        return det.verdict()
