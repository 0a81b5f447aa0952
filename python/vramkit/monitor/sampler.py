"""Record GPU memory over time to CSV, read recordings back, and plot them as inline SVG.

The recording format is the one ``vramkit smi --csv --watch`` writes: a header, then one row per device,
process and allocator per sample, all rows of a sample sharing its ``timestamp`` (Unix seconds).
``kind`` says what a row describes:

* ``device``: ``gpu`` (NVML index), ``name``, ``uuid``, ``total/used/reserved/free_bytes`` (``reserved`` is the
  driver's reserve), utilization (%), ``temperature_c``, ``power_w``;
* ``process``: ``gpu``, ``pid``, ``name`` (command name), ``used_bytes`` on that GPU;
* ``allocator``: this process's vramkit allocator on ``gpu`` (vramkit's device index, which is the CUDA
  ordinal and may differ from the NVML index), ``pid``, ``allocated_bytes``, ``reserved_bytes`` (held from the
  device), ``cached_bytes`` and ``fragmentation``.

Empty cells are unknown values.
"""
from __future__ import annotations

import csv
import html
import io
import math
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from . import NvmlUnavailableError, Snapshotter, format_size, open_monitor
from .._axis import nice_step
from .._threads import start_daemon

__all__ = ["CSV_COLUMNS", "snapshot_rows", "allocator_rows", "Sampler", "Recording", "DeviceSeries",
           "ProcessSeries", "AllocatorSeries", "load_recording", "recording_section_html", "ticks"]

CSV_COLUMNS = [
    "timestamp", "kind", "gpu", "pid", "name", "uuid", "total_bytes", "used_bytes", "reserved_bytes",
    "free_bytes", "utilization_gpu", "utilization_memory", "temperature_c", "power_w", "allocated_bytes",
    "cached_bytes", "fragmentation",
]


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def snapshot_rows(snap: dict[str, Any]) -> list[dict[str, str]]:
    """The CSV rows (``kind`` device and process) of one :meth:`Snapshotter.take`."""
    ts = f"{snap['timestamp']:.3f}"
    rows = []
    for d in snap["devices"]:
        rows.append({
            "timestamp": ts, "kind": "device", "gpu": str(d["index"]), "name": d["name"], "uuid": d["uuid"],
            **{k: _cell(d.get(k)) for k in ("total_bytes", "used_bytes", "reserved_bytes", "free_bytes",
                                            "utilization_gpu", "utilization_memory", "temperature_c", "power_w")},
        })
        for p in d.get("processes", ()):
            rows.append({"timestamp": ts, "kind": "process", "gpu": str(d["index"]), "pid": str(p["pid"]),
                         "name": p["name"], "used_bytes": _cell(p["used_bytes"])})
    return rows


ALLOCATOR_KEYS = ("allocated_bytes.all.current", "reserved_bytes.all.current", "cached_bytes", "fragmentation",
                  "largest_free_bytes", "num_ooms", "num_alloc_calls")


def allocator_stats(device: int) -> dict[str, Any]:
    """The figures of ``vramkit.memory_stats(device)`` that the exporter and the Sampler publish
    (:data:`ALLOCATOR_KEYS`), read from the device's current resource alone: statistics and state, not
    the pool's page counters, which cost more and which a monitoring thread has no use for."""
    from .. import _vramkit
    r = _vramkit.current_resource(device)
    st = r.state()
    s = r.statistics()
    if s is None:  # a user-set resource without a statistics adaptor (as vramkit.memory_stats does)
        live, reserved = st["live_bytes"], st["reserved_bytes"]
        s = {"allocated_bytes.all.current": live, "reserved_bytes.all.current": reserved,
             "fragmentation": reserved / live if live else 0.0, "largest_free_bytes": st["largest_free_bytes"],
             "num_ooms": st["oom_count"]}
    out = {k: s[k] for k in ALLOCATOR_KEYS if k in s}
    out["cached_bytes"] = st["cached_bytes"]
    return out


def allocator_rows(devices: Iterable[int], timestamp: float | None = None) -> list[dict[str, str]]:
    """CSV rows (``kind`` allocator) with this process's vramkit statistics on ``devices``."""
    ts = f"{time.time() if timestamp is None else timestamp:.3f}"
    pid = str(os.getpid())
    rows = []
    for dev in devices:
        s = allocator_stats(dev)
        rows.append({
            "timestamp": ts, "kind": "allocator", "gpu": str(dev), "pid": pid, "name": "vramkit",
            "allocated_bytes": _cell(s.get("allocated_bytes.all.current")),
            "reserved_bytes": _cell(s.get("reserved_bytes.all.current")),
            "cached_bytes": _cell(s.get("cached_bytes")), "fragmentation": _cell(s.get("fragmentation")),
        })
    return rows


def default_allocator_devices() -> list[int]:
    """The devices whose allocator statistics a process reports by default: every simulated device on the
    host backend; on CUDA only the current device (asking for another device's statistics would create a
    pool, and a CUDA context, there)."""
    from .. import _vramkit
    if _vramkit.backend() == "host":
        return list(range(_vramkit.device_count()))
    return [_vramkit.to_device(None)]


def ticks(interval: float, count: int | None = None, stop: threading.Event | None = None) -> Iterator[int]:
    """Yields 0, 1, 2... on a fixed schedule every ``interval`` s (missed ticks are skipped, not bunched),
    ``count`` times or until ``stop`` is set."""
    next_t = time.monotonic()
    i = 0
    while count is None or i < count:
        if i:
            now = time.monotonic()
            if next_t <= now:  # fell behind (a slow sample or a suspended machine): restart the schedule
                next_t = now + interval
            delay = next_t - now
            if stop is not None:
                if stop.wait(delay):
                    return
            else:
                time.sleep(delay)
        elif stop is not None and stop.is_set():
            return
        yield i
        i += 1
        next_t += interval


class Sampler:
    """Record device and process memory (NVML) and this process's allocator statistics to a CSV file on a
    background thread.

    Parameters
    ----------
    interval : float
        Seconds between samples (> 0; 1.0 costs well under 1 % of a core).
    path : str or path-like
        The CSV file, overwritten. ``vramkit report --recording FILE`` plots it.
    processes : bool
        Record per-process memory (one NVML process list per device per sample).
    allocator : bool
        Record this process's vramkit statistics (``kind`` allocator rows).
    devices : list of int, optional
        vramkit devices for the allocator rows (default :func:`default_allocator_devices`).
    fake_json : str, optional
        Use the simulated driver from this JSON file.

    Without an NVIDIA driver only the allocator rows are recorded (``nvml_error`` says why).

    >>> with Sampler(0.5, "memory.csv"):   # doctest: +SKIP
    ...     train()
    """

    def __init__(self, interval: float = 1.0, path: str | os.PathLike = "vramkit-recording.csv", *,
                 processes: bool = True, allocator: bool = True, devices: list[int] | None = None,
                 fake_json: str | None = None, monitor=None):
        try:
            interval = float(interval)
        except (TypeError, ValueError):
            raise ValueError(f"interval must be a number of seconds, not {interval!r}") from None
        if not (interval > 0 and math.isfinite(interval)):
            raise ValueError(f"interval must be > 0 seconds, not {interval}")
        self.interval = interval
        self.path = os.fspath(path)
        self.processes = processes
        self.nvml_error: str | None = None
        self._snap = None
        try:
            self._snap = Snapshotter(monitor if monitor is not None else open_monitor(fake_json))
        except NvmlUnavailableError as e:
            if not allocator:
                raise
            self.nvml_error = str(e)
        self.devices = (list(devices) if devices is not None else default_allocator_devices()) if allocator else []
        allocator_rows(self.devices)  # an unknown device fails here, not on the sampling thread
        self.samples = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._file = None
        self._writer = None

    def sample(self) -> None:
        """Write one sample now (the thread calls this every ``interval``)."""
        if self._writer is None:
            raise RuntimeError("the sampler is not started")
        ts = time.time()
        rows: list[dict[str, str]] = []
        if self._snap is not None:
            rows += snapshot_rows(self._snap.take(self.processes))
        rows += allocator_rows(self.devices, ts)
        self._writer.writerows(rows)
        self._file.flush()
        self.samples += 1

    def start(self) -> "Sampler":
        if self._thread is not None:
            raise RuntimeError("the sampler is already started")
        self._file = open(self.path, "w", newline="", encoding="utf-8")
        self._writer = csv.DictWriter(self._file, CSV_COLUMNS, restval="", lineterminator="\n")
        self._writer.writeheader()
        self._stop.clear()
        self._thread = start_daemon(self._run, "vramkit-sampler")
        return self

    def _run(self) -> None:
        try:
            for _ in ticks(self.interval, stop=self._stop):
                self.sample()
        except BaseException as e:  # kept for stop() to report; a sampler must not kill the program
            self.error = e

    def stop(self) -> None:
        """Take a last sample, stop the thread and close the file; raises what killed the thread, if anything."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        try:
            if self.error is None:
                self.sample()
        finally:
            self._file.close()
            self._file = self._writer = None
        if self.error is not None:
            raise RuntimeError(f"the sampler stopped after {self.samples} sample(s): {self.error}") from self.error

    def __enter__(self) -> "Sampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# ---- reading recordings --------------------------------------------------------------------------

@dataclass
class DeviceSeries:
    gpu: int
    name: str
    uuid: str
    total_bytes: int
    t: list[float] = field(default_factory=list)          # seconds since the recording started
    used_bytes: list[float] = field(default_factory=list)
    reserved_bytes: list[float | None] = field(default_factory=list)
    free_bytes: list[float] = field(default_factory=list)


@dataclass
class ProcessSeries:
    gpu: int
    pid: int
    name: str
    t: list[float] = field(default_factory=list)
    used_bytes: list[float | None] = field(default_factory=list)


@dataclass
class AllocatorSeries:
    device: int
    pid: int
    t: list[float] = field(default_factory=list)
    allocated_bytes: list[float] = field(default_factory=list)
    reserved_bytes: list[float] = field(default_factory=list)
    cached_bytes: list[float] = field(default_factory=list)


@dataclass
class Recording:
    """A recording as time series: ``start`` is the first timestamp (Unix s), ``t`` lists are relative."""
    path: str
    start: float
    end: float
    samples: int
    devices: list[DeviceSeries]
    processes: list[ProcessSeries]
    allocator: list[AllocatorSeries]


_MAX_BYTES = 512 << 20


def load_recording(path: str | os.PathLike) -> Recording:
    """Read a CSV written by :class:`Sampler` or ``vramkit smi --csv``.

    A process keeps one series over the whole recording; samples where it was absent are simply missing
    from its ``t`` list (the chart joins the samples it has).

    Raises
    ------
    OSError
        The file cannot be read.
    ValueError
        It is not such a recording, or a row is malformed (the message names the line).
    """
    path = os.fspath(path)
    if os.path.getsize(path) > _MAX_BYTES:
        raise ValueError(f"{path}: larger than {_MAX_BYTES >> 20} MiB; record with a longer interval")
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        reader = csv.DictReader(f)
        missing = {"timestamp", "kind", "gpu"} - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: not a vramkit recording (no column {', '.join(sorted(missing))}); "
                             "record one with `vramkit smi --csv --watch 1 --output FILE` or vramkit.monitor.Sampler")
        rows = []
        for row in reader:
            line = reader.line_num
            try:
                ts = float(row["timestamp"])
                if not math.isfinite(ts):
                    raise ValueError("timestamp is not finite")
                gpu = int(row["gpu"])
                rows.append((ts, row, gpu))
            except (TypeError, ValueError) as e:
                raise ValueError(f"{path}, line {line}: {e}") from None
    if not rows:
        return Recording(path, 0.0, 0.0, 0, [], [], [])
    start = min(r[0] for r in rows)
    end = max(r[0] for r in rows)
    devices: dict[int, DeviceSeries] = {}
    procs: dict[tuple[int, int], ProcessSeries] = {}
    allocs: dict[tuple[int, int], AllocatorSeries] = {}
    stamps = set()

    def num(row: dict, key: str, line_ts: float, *, required: bool = False) -> float | None:
        v = row.get(key) or ""
        if v == "":
            if required:
                raise ValueError(f"{path}: row at t={line_ts:.3f}: {key} is empty")
            return None
        try:
            x = float(v)
        except ValueError:
            raise ValueError(f"{path}: row at t={line_ts:.3f}: {key}={v!r} is not a number") from None
        if not math.isfinite(x) or x < 0:
            raise ValueError(f"{path}: row at t={line_ts:.3f}: {key}={v!r} is out of range")
        return x

    for ts, row, gpu in rows:
        stamps.add(ts)
        t = ts - start
        kind = row["kind"]
        if kind == "device":
            d = devices.get(gpu)
            if d is None:
                total = num(row, "total_bytes", ts) or 0
                d = devices[gpu] = DeviceSeries(gpu, row.get("name") or f"GPU {gpu}", row.get("uuid") or "",
                                                int(total))
            d.t.append(t)
            d.used_bytes.append(num(row, "used_bytes", ts, required=True))
            d.reserved_bytes.append(num(row, "reserved_bytes", ts))
            d.free_bytes.append(num(row, "free_bytes", ts) or 0.0)
        elif kind == "process":
            pid = int(num(row, "pid", ts, required=True))
            p = procs.get((gpu, pid))
            if p is None:
                p = procs[(gpu, pid)] = ProcessSeries(gpu, pid, row.get("name") or "")
            p.t.append(t)
            p.used_bytes.append(num(row, "used_bytes", ts))
        elif kind == "allocator":
            pid = int(num(row, "pid", ts, required=True))
            a = allocs.get((gpu, pid))
            if a is None:
                a = allocs[(gpu, pid)] = AllocatorSeries(gpu, pid)
            a.t.append(t)
            a.allocated_bytes.append(num(row, "allocated_bytes", ts) or 0.0)
            a.reserved_bytes.append(num(row, "reserved_bytes", ts) or 0.0)
            a.cached_bytes.append(num(row, "cached_bytes", ts) or 0.0)
        # other kinds: written by a newer vramkit; ignored
    return Recording(path, start, end, len(stamps), [devices[k] for k in sorted(devices)],
                     [procs[k] for k in sorted(procs)], [allocs[k] for k in sorted(allocs)])


# ---- plotting ------------------------------------------------------------------------------------

_PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#65a30d",
            "#9333ea", "#0d9488", "#ea580c", "#4f46e5"]
_W, _H = 760, 240
_ML, _MR, _MT, _MB = 64, 12, 10, 30


def _byte_ticks(vmax: float) -> tuple[float, float, str]:
    """(step, unit, unit name) for a byte axis up to vmax."""
    for unit, name in ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"), (1, "B")):
        if vmax >= unit or unit == 1:
            return nice_step(vmax / unit) * unit, unit, name
    return 1.0, 1, "B"


def _thin(t: list[float], v: list[float], max_points: int = 1200) -> tuple[list[float], list[float]]:
    """At most ~max_points points, keeping each bucket's minimum and maximum so peaks survive."""
    if len(t) <= max_points:
        return t, v
    buckets = max_points // 2
    n = len(t)
    ot, ov = [], []
    for b in range(buckets):
        lo, hi = b * n // buckets, (b + 1) * n // buckets
        if lo >= hi:
            continue
        seg = range(lo, hi)
        i_min = min(seg, key=lambda i: v[i])
        i_max = max(seg, key=lambda i: v[i])
        for i in sorted({i_min, i_max}):
            ot.append(t[i])
            ov.append(v[i])
    return ot, ov


def _chart(title: str, duration: float, series: list[tuple[str, str, list[float], list[float | None]]],
           note: str = "") -> str:
    """One SVG line chart; series are (label, color, t, values), values in bytes (None: unknown)."""
    clean = []
    for label, color, t, v in series:
        pts = [(a, b) for a, b in zip(t, v) if b is not None]
        if pts:
            clean.append((label, color, [p[0] for p in pts], [p[1] for p in pts]))
    vmax = max((max(v) for _, _, _, v in clean), default=0.0) or 1.0
    step, unit, uname = _byte_ticks(vmax * 1.05)
    ymax = math.ceil(vmax * 1.05 / step) * step
    xmax = duration if duration > 0 else 1.0
    xstep = nice_step(xmax, 6)
    pw, ph = _W - _ML - _MR, _H - _MT - _MB

    def X(x: float) -> float:
        return _ML + pw * x / xmax

    def Y(y: float) -> float:
        return _MT + ph * (1 - y / ymax)

    out = [f'<svg viewBox="0 0 {_W} {_H}" width="100%" role="img" aria-label="{html.escape(title)}" '
           f'xmlns="http://www.w3.org/2000/svg" style="max-width:{_W}px;display:block">']
    y = 0.0
    while y <= ymax + step / 2:
        yy = Y(y)
        lab = f"{y / unit:g} {uname}"
        out.append(f'<line x1="{_ML}" x2="{_W - _MR}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#8884" stroke-width="1"/>'
                   f'<text x="{_ML - 6}" y="{yy + 4:.1f}" text-anchor="end" font-size="11" fill="#888">{lab}</text>')
        y += step
    x = 0.0
    while x <= xmax + xstep / 2:
        xx = X(x)
        lab = f"{x:g} s"
        out.append(f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{_MT}" y2="{_H - _MB}" stroke="#8882" stroke-width="1"/>'
                   f'<text x="{xx:.1f}" y="{_H - _MB + 16}" text-anchor="middle" font-size="11" fill="#888">{lab}</text>')
        x += xstep
    for label, color, t, v in clean:
        t2, v2 = _thin(t, v)
        if len(t2) == 1:
            out.append(f'<circle cx="{X(t2[0]):.1f}" cy="{Y(v2[0]):.1f}" r="3" fill="{color}">'
                       f"<title>{html.escape(label)}: {format_size(v2[0])}</title></circle>")
            continue
        pts = " ".join(f"{X(a):.1f},{Y(b):.1f}" for a, b in zip(t2, v2))
        out.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="1.8" '
                   f'stroke-linejoin="round"><title>{html.escape(label)}: peak {format_size(max(v))}, '
                   f"last {format_size(v[-1])}</title></polyline>")
    out.append("</svg>")
    legend = "".join(
        f'<span style="white-space:nowrap;margin-right:16px"><span style="display:inline-block;width:18px;'
        f'height:3px;background:{color};vertical-align:middle;margin-right:6px"></span>{html.escape(label)} '
        f'<span style="opacity:.7">(peak {format_size(max(v))})</span></span>'
        for label, color, t, v in clean)
    body = "".join(out) if clean else '<p style="opacity:.7">No values in this series.</p>'
    note_html = f'<p style="opacity:.7;font-size:13px;margin:2px 0">{note}</p>' if note else ""
    return (f'<div class="vk-rec-chart" style="margin:10px 0 18px"><h3 style="font-size:15px;margin:6px 0">'
            f'{html.escape(title)}</h3>{note_html}<div style="font-size:13px;margin:4px 0">{legend}</div>{body}</div>')


def recording_section_html(path: str | os.PathLike) -> str:
    """An HTML fragment (inline SVG, no scripts, no network) plotting a recording: for each GPU its used
    memory and each process's memory on it, and for each recorded vramkit allocator its allocated,
    reserved and cached bytes. Raises what :func:`load_recording` raises."""
    rec = load_recording(path)
    name = html.escape(os.path.basename(rec.path))
    if rec.samples == 0:
        return f'<div class="vk-recording"><p>The recording <code>{name}</code> holds no samples.</p></div>'
    duration = rec.end - rec.start
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(rec.start))
    parts = [f'<div class="vk-recording"><p><code>{name}</code>: {rec.samples} sample(s) over {duration:.1f} s, '
             f"from {started}; {len(rec.devices)} GPU(s), {len(rec.processes)} process(es).</p>"]
    for d in rec.devices:
        series = [(f"GPU {d.gpu} used", "#111827", d.t, d.used_bytes)]
        if any(r is not None for r in d.reserved_bytes):
            series.append((f"GPU {d.gpu} used + driver reserve", "#9ca3af", d.t,
                           [u + r if r is not None else None for u, r in zip(d.used_bytes, d.reserved_bytes)]))
        for i, p in enumerate(q for q in rec.processes if q.gpu == d.gpu):
            series.append((f"pid {p.pid} {p.name}".strip(), _PALETTE[i % len(_PALETTE)], p.t, p.used_bytes))
        title = f"GPU {d.gpu}: {d.name}" + (f" ({format_size(d.total_bytes)})" if d.total_bytes else "")
        parts.append(_chart(title, duration, series))
    orphans = [p for p in rec.processes if p.gpu not in {d.gpu for d in rec.devices}]
    if orphans:
        parts.append(_chart("Processes", duration, [(f"GPU {p.gpu} pid {p.pid} {p.name}".strip(),
                                                     _PALETTE[i % len(_PALETTE)], p.t, p.used_bytes)
                                                    for i, p in enumerate(orphans)]))
    for a in rec.allocator:
        parts.append(_chart(
            f"vramkit allocator, device {a.device}, pid {a.pid}", duration,
            [("allocated", _PALETTE[0], a.t, a.allocated_bytes), ("reserved", _PALETTE[1], a.t, a.reserved_bytes),
             ("cached", _PALETTE[2], a.t, a.cached_bytes)],
            note="Device index as vramkit numbers devices (the CUDA ordinal), which can differ from the NVML index."))
    parts.append("</div>")
    return "".join(parts)


def _to_csv(rows: list[dict[str, str]], header: bool) -> str:
    """Rows as CSV text (for ``vramkit smi --csv``)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, CSV_COLUMNS, restval="", lineterminator="\n")
    if header:
        w.writeheader()
    w.writerows(rows)
    return buf.getvalue()
