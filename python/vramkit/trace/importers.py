"""Read allocation traces from PyTorch, RMM and vramkit into a :class:`~vramkit.trace.model.Trace`.

The format is chosen from the file's *content*, never its name (:func:`detect_format`):

``vramkit-v1``
    vramkit's binary trace (see ``docs/trace-format.md``), magic ``VKTRACE1``.
``pytorch-trace-csv``
    ``t_us,action,addr,size,stream`` rows of a PyTorch allocator trace (plain or gzip).
``pytorch-snapshot``
    a pickled ``torch.cuda.memory._snapshot()`` dict (``_dump_snapshot``), plain or gzip; read
    with :mod:`vramkit.trace.safe_pickle`, which refuses anything that would import or call.
``rmm-csv-log``
    RMM's ``logging_resource_adaptor`` CSV: ``Thread,Time,Action,Pointer,Size,Stream``.

Every problem with the input is a ``ValueError`` whose message names the file and the line,
record or byte offset.
"""
from __future__ import annotations

import collections
import csv
import gzip
import io
import os
import re
import zlib
from typing import Any, Iterator

from . import fast_csv, limits, safe_pickle, v1
from .model import Trace, TraceBuilder, trace_name_from_path

__all__ = [
    "FORMATS",
    "detect_format",
    "load_trace",
    "read_pytorch_trace_csv",
    "read_pytorch_snapshot",
    "snapshot_to_trace",
    "read_rmm_log",
    "trace_name_from_path",
]

FORMATS = ("vramkit-v1", "pytorch-trace-csv", "pytorch-snapshot", "rmm-csv-log")

# PyTorch trace actions that are not allocation events of the program (counted, not replayed).
_TORCH_OTHER = frozenset({"free_completed", "segment_alloc", "segment_free", "segment_map",
                          "segment_unmap", "snapshot", "oom"})
_TORCH_ALLOC = "alloc"
_TORCH_FREE = "free_requested"

_RMM_HEADER = ["thread", "time", "action", "pointer", "size", "stream"]
_RMM_ALLOC = frozenset({"allocate"})
_RMM_FREE = frozenset({"free", "deallocate"})
_RMM_OTHER = frozenset({"allocate failure", "allocate_failure", "allocation failure"})

# Protocol 0/1 pickles have no header: recognise their usual first opcodes (a dict or list, or a
# GLOBAL/INST naming a callable, which the safe reader then refuses with a clear message).
_OLD_PICKLE = re.compile(rb"\((?:d|l|t|\(|c|i[A-Za-z_])"  # MARK then DICT/LIST/TUPLE/GLOBAL/INST
                         rb"|[}\]](?:q|\(|r|h)|\}\.|\]\."  # EMPTY_DICT/EMPTY_LIST then PUT/MARK/STOP
                         rb"|c[A-Za-z_][\w.]*\n[A-Za-z_][\w.]*\n")  # GLOBAL module\nname\n
_GZIP_MAGIC = b"\x1f\x8b"
_SNIFF_BYTES = 1 << 16
_I64_MAX = (1 << 63) - 1


def _display(path: str | os.PathLike[str]) -> str:
    return os.path.basename(os.fspath(path)) or os.fspath(path)


# -- format detection ------------------------------------------------------------------------------
def _sniff(path: str | os.PathLike[str]) -> tuple[bytes, bool]:
    """First bytes of the (decompressed) content, and whether the file is gzip."""
    name = _display(path)
    limits.check_regular_file(path)
    with open(path, "rb") as f:
        head = f.read(_SNIFF_BYTES)
        if not head:
            raise ValueError(f"{name}: empty file")
        if head[:2] != _GZIP_MAGIC:
            return head, False
        f.seek(0)
        try:
            with gzip.GzipFile(fileobj=f) as g:
                data = g.read(_SNIFF_BYTES)
        except (OSError, EOFError, zlib.error) as exc:
            raise ValueError(f"{name}: corrupt or truncated gzip data: {exc}") from None
    if not data:
        raise ValueError(f"{name}: empty file (gzip of nothing)")
    return data, True


def _first_line(data: bytes) -> str:
    text = data.split(b"\n", 1)[0]
    if text.startswith(b"\xef\xbb\xbf"):
        text = text[3:]
    try:
        return text.decode("utf-8").strip()
    except UnicodeDecodeError:
        return ""


def _header_cols(line: str) -> list[str]:
    return [c.strip().strip('"').lower() for c in line.split(",")]


def detect_format(path: str | os.PathLike[str]) -> str:
    """Return the format name (one of :data:`FORMATS`) of a trace file, from its content.

    Raises
    ------
    ValueError
        Empty file, unreadable gzip, or a content that matches no known format.
    """
    head, _ = _sniff(path)
    if head.startswith(v1.MAGIC):
        return "vramkit-v1"
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return "pytorch-snapshot"
    line = _first_line(head)
    cols = _header_cols(line)
    if cols == _RMM_HEADER:
        return "rmm-csv-log"
    if {"action", "addr", "size"} <= set(cols):
        return "pytorch-trace-csv"
    if _OLD_PICKLE.match(head):
        return "pytorch-snapshot"
    shown = line[:60] if line and line.isprintable() else repr(head[:16])
    raise ValueError(
        f"{_display(path)}: unknown trace format (starts with {shown!s}); expected a vramkit v1 "
        "trace, a PyTorch trace CSV (t_us,action,addr,size,stream), a PyTorch memory snapshot "
        "pickle, or an RMM log (Thread,Time,Action,Pointer,Size,Stream)")


def load_trace(path: str | os.PathLike[str], *, name: str | None = None,
               device: int | None = None) -> Trace:
    """Read a trace file of any supported format (chosen by content).

    Parameters
    ----------
    path : path-like
        The file (gzip is recognised by content too).
    name : str, optional
        Trace name; default the file name without its suffixes (or the name stored in a v1 file).
    device : int, optional
        For snapshots: which device's trace to use (default: the first device with events).

    Raises
    ------
    ValueError
        For any malformed, truncated, hostile or unknown input; the message names the file.
    """
    fmt = detect_format(path)
    if fmt == "vramkit-v1":
        trace = v1.read_v1(path)
        if name:
            trace.name = name
        return trace
    if fmt == "pytorch-snapshot":
        return read_pytorch_snapshot(path, name=name, device=device)
    if fmt == "rmm-csv-log":
        return read_rmm_log(path, name=name)
    return read_pytorch_trace_csv(path, name=name)


# -- CSV plumbing ----------------------------------------------------------------------------------
class _Bounded(io.RawIOBase):
    """A byte stream that refuses to yield more than ``limit`` bytes (decompressed)."""

    def __init__(self, raw: Any, name: str, limit: int) -> None:
        self._raw, self._name, self._limit, self._n = raw, name, limit, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = self._raw.readinto(b)
        self._n += n or 0
        if self._n > self._limit:
            raise limits.too_many_bytes(self._name, self._limit)
        return n

    def close(self) -> None:
        self._raw.close()
        super().close()


def _open_text(path: str | os.PathLike[str]) -> io.TextIOBase:
    limits.check_regular_file(path)
    with open(path, "rb") as f:
        magic = f.read(2)
    raw = gzip.open(path, "rb") if magic == _GZIP_MAGIC else open(path, "rb")
    stream = io.BufferedReader(_Bounded(raw, _display(path), limits.max_bytes()))
    return io.TextIOWrapper(stream, encoding="utf-8-sig", newline="")


def _bad_utf8_line(path: str | os.PathLike[str]) -> int | None:
    """The line holding the first byte that is not UTF-8 (the text reader decodes ahead of the
    line it hands out, so its position does not say), or None."""
    with open(path, "rb") as f:
        magic = f.read(2)
    lines, carry = 0, b""
    with (gzip.open(path, "rb") if magic == _GZIP_MAGIC else open(path, "rb")) as raw:
        while True:
            chunk = raw.read(1 << 20)
            data = carry + chunk
            try:
                data.decode("utf-8")
                carry = b""
            except UnicodeDecodeError as e:
                if chunk and e.reason == "unexpected end of data" and e.end == len(data):
                    carry = data[e.start:]  # a character cut by the chunk's end
                    data = data[:e.start]
                else:
                    return lines + data[:e.start].count(b"\n") + 1
            lines += data.count(b"\n")
            if not chunk:
                return None


def _csv_rows(path: str | os.PathLike[str]) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) for every non-blank line, with read errors turned into ValueError."""
    name = _display(path)
    lineno = 0
    try:
        with _open_text(path) as f:
            for row in csv.reader(f):
                lineno += 1
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                yield lineno, row
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise ValueError(f"{name}: corrupt or truncated gzip data after line {lineno}: {exc}") from None
    except UnicodeDecodeError as exc:
        try:
            line = _bad_utf8_line(path) or lineno + 1
        except (OSError, EOFError, zlib.error):
            line = lineno + 1
        raise ValueError(f"{name}: line {line}: not UTF-8 text ({exc.reason})") from None
    except csv.Error as exc:
        raise ValueError(f"{name}: line {lineno + 1}: malformed CSV: {exc}") from None
    except OSError as exc:
        if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError)):
            raise
        raise ValueError(f"{name}: unreadable data after line {lineno}: {exc}") from None


def _parse_int(text: str, name: str, lineno: int, column: str) -> int:
    t = text.strip()
    v: int | None = None
    try:
        v = int(t)
    except ValueError:
        try:
            if t.lower().startswith(("0x", "-0x")):
                v = int(t, 16)
        except ValueError:
            pass
    if v is None:
        raise ValueError(f"{name}: line {lineno}: {column} is not an integer: {text[:40]!r}")
    if column != "addr" and not -_I64_MAX <= v <= _I64_MAX:
        raise ValueError(f"{name}: line {lineno}: {column} {text.strip()[:40]} is outside the 64-bit range")
    return v


def _check_width(row: list[str], width: int, name: str, lineno: int) -> None:
    if len(row) != width:
        raise ValueError(f"{name}: line {lineno}: expected {width} fields, found {len(row)}")


# -- PyTorch trace CSV -----------------------------------------------------------------------------
def read_pytorch_trace_csv(path: str | os.PathLike[str], *, name: str | None = None) -> Trace:
    """Read a PyTorch allocator trace CSV (``t_us,action,addr,size,stream``, plain or gzip).

    Each ``alloc`` is a new allocation keyed by ``addr`` until its ``free_requested`` (when the
    program dropped it: the live-bytes floor no allocator can go under). ``free_completed``,
    ``segment_*``, ``snapshot`` and ``oom`` rows are counted in ``metadata["events"]``.
    """
    fname = _display(path)
    if os.path.getsize(path) >= fast_csv.FAST_MIN_BYTES:  # long traces: columnar, same result
        fast = fast_csv.read_fast(path, name or trace_name_from_path(path), fname)
        if fast is not None:
            return fast
    b = TraceBuilder(name or trace_name_from_path(path), "pytorch-trace-csv")
    events: collections.Counter[str] = collections.Counter()
    rows = _csv_rows(path)
    header = next(rows, None)
    if header is None:
        raise ValueError(f"{fname}: empty file")
    cols = _header_cols(",".join(header[1]))
    index = {c: i for i, c in enumerate(cols)}
    missing = [c for c in ("action", "addr", "size") if c not in index]
    if missing:
        raise ValueError(f"{fname}: line {header[0]}: header lacks column(s) {', '.join(missing)}")
    i_act, i_addr, i_size = index["action"], index["addr"], index["size"]
    i_t = index.get("t_us", index.get("time_us"))
    i_stream = index.get("stream")
    width = len(cols)
    for lineno, row in rows:
        _check_width(row, width, fname, lineno)
        action = row[i_act].strip()
        events[action] += 1
        if action == _TORCH_ALLOC:
            size = _parse_int(row[i_size], fname, lineno, "size")
            if size < 0:
                raise ValueError(f"{fname}: line {lineno}: negative size {size}")
            addr = _parse_int(row[i_addr], fname, lineno, "addr")
            stream = _parse_int(row[i_stream], fname, lineno, "stream") if i_stream is not None else 0
            t = _parse_int(row[i_t], fname, lineno, "t_us") if i_t is not None else None
            b.alloc(addr, size, stream, "", t)
        elif action == _TORCH_FREE:
            addr = _parse_int(row[i_addr], fname, lineno, "addr")
            t = _parse_int(row[i_t], fname, lineno, "t_us") if i_t is not None else None
            b.free(addr, t)
        elif action in _TORCH_OTHER:
            if i_t is not None and row[i_t].strip():
                _parse_int(row[i_t], fname, lineno, "t_us")
        else:
            raise ValueError(f"{fname}: line {lineno}: unknown action {action[:40]!r}")
    b.metadata.update({"format": "pytorch-trace-csv", "file": fname, "events": dict(events)})
    return b.build()


# -- RMM CSV log -----------------------------------------------------------------------------------
def _rmm_time_us(text: str, name: str, lineno: int) -> int:
    """``HH:MM:SS.ffffff`` (RMM's pattern) or seconds since the epoch, as microseconds."""
    t = text.strip()
    try:
        if ":" in t:
            h, m, s = t.split(":")
            sec, _, frac = s.partition(".")
            frac = (frac + "000000")[:6]
            if not (h.isdigit() and m.isdigit() and sec.isdigit() and frac.isdigit()):
                raise ValueError
            us = ((int(h) * 60 + int(m)) * 60 + int(sec)) * 1_000_000 + int(frac)
            if us > _I64_MAX // 2:
                raise ValueError
            return us
        sec, _, frac = t.partition(".")
        frac = (frac + "000000")[:6]
        if not (sec.isdigit() and frac.isdigit()):
            raise ValueError
        us = int(sec) * 1_000_000 + int(frac)
        if us > _I64_MAX // 2:
            raise ValueError
        return us
    except ValueError:
        raise ValueError(f"{name}: line {lineno}: Time is not HH:MM:SS.ffffff or seconds: {text[:40]!r}") from None


def _rmm_pointer(text: str, name: str, lineno: int, column: str) -> int:
    t = text.strip().lower()
    if t in ("(nil)", "nullptr", "null", "0x0", "0", ""):
        return 0
    if t.startswith("0x"):
        try:
            return int(t, 16)
        except ValueError:
            pass
    return _parse_int(text, name, lineno, column)


def read_rmm_log(path: str | os.PathLike[str], *, name: str | None = None) -> Trace:
    """Read RMM's ``logging_resource_adaptor`` CSV log (``Thread,Time,Action,Pointer,Size,Stream``).

    ``allocate`` starts an allocation keyed by ``Pointer`` until its ``free``; ``allocate
    failure`` rows are counted in ``metadata["events"]``. Times of day (``HH:MM:SS.ffffff``)
    that go backwards by more than 12 hours are taken as a new day.
    """
    fname = _display(path)
    b = TraceBuilder(name or trace_name_from_path(path), "rmm-csv-log")
    events: collections.Counter[str] = collections.Counter()
    threads: set[str] = set()
    rows = _csv_rows(path)
    header = next(rows, None)
    if header is None:
        raise ValueError(f"{fname}: empty file")
    if _header_cols(",".join(header[1])) != _RMM_HEADER:
        raise ValueError(f"{fname}: line {header[0]}: not an RMM log header (Thread,Time,Action,Pointer,Size,Stream)")
    day = 0
    last_t: int | None = None
    for lineno, row in rows:
        _check_width(row, 6, fname, lineno)
        action = row[2].strip().lower()
        events[action] += 1
        threads.add(row[0].strip())
        t = _rmm_time_us(row[1], fname, lineno) + day
        if last_t is not None and t < last_t - 12 * 3600 * 1_000_000 and ":" in row[1]:
            day += 24 * 3600 * 1_000_000
            t += 24 * 3600 * 1_000_000
        last_t = t
        if action in _RMM_ALLOC:
            ptr = _rmm_pointer(row[3], fname, lineno, "Pointer")
            size = _parse_int(row[4], fname, lineno, "Size")
            if size < 0:
                raise ValueError(f"{fname}: line {lineno}: negative size {size}")
            stream = _rmm_pointer(row[5], fname, lineno, "Stream")
            b.alloc(ptr, size, stream, "", t)
        elif action in _RMM_FREE:
            ptr = _rmm_pointer(row[3], fname, lineno, "Pointer")
            _parse_int(row[4], fname, lineno, "Size")
            b.free(ptr, t)
        elif action in _RMM_OTHER:
            _parse_int(row[4], fname, lineno, "Size")
        else:
            raise ValueError(f"{fname}: line {lineno}: unknown action {row[2][:40]!r}")
    b.metadata.update({"format": "rmm-csv-log", "file": fname, "events": dict(events),
                       "threads": len(threads)})
    return b.build()


# -- PyTorch snapshot ------------------------------------------------------------------------------
def _is_framework_file(filename: str) -> bool:
    f = filename.replace("\\", "/")
    if f in ("", "??") or f.startswith("<frozen") or f.startswith("torch/"):
        return True
    if "/torch/" in f or "/functorch/" in f:
        return True
    return f.endswith((".cpp", ".cc", ".cxx", ".c", ".h", ".hpp", ".cu", ".cuh"))


def _site_from_frames(frames: Any) -> str:
    """``file:line`` of the first frame outside PyTorch (frames are leaf first), else of the leaf."""
    if not isinstance(frames, list):
        return ""
    chosen: tuple[str, Any] | None = None
    for fr in frames:
        if not isinstance(fr, dict):
            continue
        filename = fr.get("filename")
        if not isinstance(filename, str) or not filename:
            continue
        if chosen is None:
            chosen = (filename, fr.get("line"))
        if not _is_framework_file(filename):
            chosen = (filename, fr.get("line"))
            break
    if chosen is None:
        return ""
    line = chosen[1]
    return f"{chosen[0]}:{line}" if isinstance(line, int) and not isinstance(line, bool) else chosen[0]


def _int_of(entry: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    v = entry.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int):
        if v is None and default is not None:
            return default
        raise ValueError(f"{where}: {key!r} is not an integer ({type(v).__name__})")
    if key != "addr" and not -_I64_MAX <= v <= _I64_MAX:
        raise ValueError(f"{where}: {key!r} {v} is outside the 64-bit range")
    return v


def snapshot_to_trace(snapshot: Any, *, name: str = "snapshot", device: int | None = None,
                      file: str = "<snapshot>") -> Trace:
    """Build a :class:`Trace` from a snapshot object (``torch.cuda.memory._snapshot()``).

    Uses ``device_traces[device]`` (``alloc`` / ``free_requested``); when there are no trace
    events it falls back to the live blocks of ``segments`` (allocations only). Accepts the
    whole dict, or the list of segments alone (``torch.cuda.memory_snapshot()``).
    """
    if isinstance(snapshot, list):
        snapshot = {"segments": snapshot}
    if not isinstance(snapshot, dict) or not ({"segments", "device_traces"} & set(snapshot)):
        raise ValueError(f"{file}: not a PyTorch memory snapshot (no 'segments' or 'device_traces')")
    traces = snapshot.get("device_traces") or []
    segments = snapshot.get("segments") or []
    if not isinstance(traces, list) or not all(isinstance(t, list) for t in traces):
        raise ValueError(f"{file}: 'device_traces' is not a list of lists")
    if not isinstance(segments, list):
        raise ValueError(f"{file}: 'segments' is not a list")
    if device is not None and (isinstance(device, bool) or not isinstance(device, int) or device < 0):
        raise ValueError(f"{file}: device must be a device number (an int >= 0), not {device!r}")

    def has_allocs(t: list[Any]) -> bool:
        return any(isinstance(e, dict) and e.get("action") == _TORCH_ALLOC for e in t)

    devices_with_events = [d for d, t in enumerate(traces) if has_allocs(t)]
    use = device if device is not None else (devices_with_events[0] if devices_with_events else None)
    meta: dict[str, Any] = {"format": "pytorch-snapshot", "file": file,
                            "devices_with_traces": devices_with_events}
    if isinstance(snapshot.get("allocator_settings"), dict):
        meta["allocator_settings"] = snapshot["allocator_settings"]
    if use is not None and 0 <= use < len(traces) and traces[use]:
        return _snapshot_events(traces[use], name, use, file, meta)
    if device is not None and not any(isinstance(sg, dict) and sg.get("device", 0) == device for sg in segments):
        with_segments = sorted({sg.get("device", 0) for sg in segments if isinstance(sg, dict)
                                and isinstance(sg.get("device", 0), int)})
        raise ValueError(f"{file}: the snapshot holds nothing of device {device} (devices with events: "
                         f"{devices_with_events or 'none'}; with segments: {with_segments or 'none'})")
    return _snapshot_segments(segments, name, device, file, meta)


def _snapshot_events(entries: list[Any], name: str, device: int, file: str, meta: dict[str, Any]) -> Trace:
    if len(entries) > limits.max_events():  # refused before a builder grows to that size
        raise limits.too_many_events(file, limits.max_events())
    b = TraceBuilder(name, "pytorch-snapshot")
    events: collections.Counter[str] = collections.Counter()
    for k, e in enumerate(entries):
        where = f"{file}: device_traces[{device}][{k}]"
        if not isinstance(e, dict):
            raise ValueError(f"{where}: entry is not a dict")
        action = e.get("action")
        if not isinstance(action, str):
            raise ValueError(f"{where}: no 'action'")
        events[action] += 1
        t = e.get("time_us")
        if t is not None and (isinstance(t, bool) or not isinstance(t, int) or not -_I64_MAX <= t <= _I64_MAX):
            raise ValueError(f"{where}: 'time_us' is not a 64-bit integer")
        if action == _TORCH_ALLOC:
            size = _int_of(e, "size", where)
            if size < 0:
                raise ValueError(f"{where}: negative size {size}")
            addr = _int_of(e, "addr", where)
            stream = _int_of(e, "stream", where, 0)
            b.alloc(addr, size, stream, _site_from_frames(e.get("frames")), t)
        elif action == _TORCH_FREE:
            b.free(_int_of(e, "addr", where), t)
        elif action not in _TORCH_OTHER:
            raise ValueError(f"{where}: unknown action {action[:40]!r}")
    meta.update({"events": dict(events), "device": device, "from": "device_traces"})
    b.metadata.update(meta)
    return b.build()


def _block_request(block: dict[str, Any], where: str) -> tuple[int, Any]:
    """(requested bytes, frames) of a live block, for current and legacy (``history``) layouts."""
    size = _int_of(block, "size", where)
    req = block.get("requested_size")
    frames = block.get("frames")
    hist = block.get("history")
    if isinstance(hist, list) and hist and isinstance(hist[-1], dict):
        real = hist[-1].get("real_size")
        if req is None and isinstance(real, int) and not isinstance(real, bool):
            req = real
        if not frames:
            frames = hist[-1].get("frames")
    if isinstance(req, bool) or not isinstance(req, int) or req <= 0 or req > size:
        req = size
    return req, frames


def _snapshot_segments(segments: list[Any], name: str, device: int | None, file: str,
                       meta: dict[str, Any]) -> Trace:
    b = TraceBuilder(name, "pytorch-snapshot")
    segs = []
    for k, seg in enumerate(segments):
        if not isinstance(seg, dict):
            raise ValueError(f"{file}: segments[{k}] is not a dict")
        segs.append((k, seg))
    if device is None and segs:
        devs = [s.get("device", 0) for _, s in segs if isinstance(s.get("device", 0), int)]
        device = min(devs) if devs else 0
    states: collections.Counter[str] = collections.Counter()
    chosen = [(k, s) for k, s in segs if s.get("device", 0) == device]
    chosen.sort(key=lambda ks: ks[1].get("address", 0) if isinstance(ks[1].get("address", 0), int) else 0)
    for k, seg in chosen:
        stream = _int_of(seg, "stream", f"{file}: segments[{k}]", 0)
        blocks = seg.get("blocks") or []
        if not isinstance(blocks, list):
            raise ValueError(f"{file}: segments[{k}]: 'blocks' is not a list")
        addr = seg.get("address", 0)
        addr = addr if isinstance(addr, int) else 0
        for j, blk in enumerate(blocks):
            where = f"{file}: segments[{k}].blocks[{j}]"
            if not isinstance(blk, dict):
                raise ValueError(f"{where}: block is not a dict")
            state = blk.get("state")
            state = state if isinstance(state, str) else "?"
            states[state] += 1
            size = _int_of(blk, "size", where)
            if size < 0:
                raise ValueError(f"{where}: negative size {size}")
            if state == "active_allocated":
                req, frames = _block_request(blk, where)
                b.alloc(blk.get("address", addr) if isinstance(blk.get("address"), int) else addr,
                        req, stream, _site_from_frames(frames))
            addr += size
    meta.update({"events": {}, "device": device, "from": "segments", "block_states": dict(states),
                 "segments": len(chosen)})
    b.metadata.update(meta)
    return b.build()


def read_pytorch_snapshot(path: str | os.PathLike[str], *, name: str | None = None,
                          device: int | None = None) -> Trace:
    """Read a pickled PyTorch memory snapshot (plain or gzip) without running any of it."""
    fname = _display(path)
    obj = safe_pickle.load_file(path)
    return snapshot_to_trace(obj, name=name or trace_name_from_path(path), device=device, file=fname)
