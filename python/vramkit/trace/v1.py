"""vramkit trace format v1: a compact, streamable, checksummed binary trace.

Layout (all integers little-endian; the full specification is ``docs/trace-format.md``)::

    header   20 bytes   magic "VKTRACE1", u16 version=1, u16 flags=0, u32 meta_len, u32 meta_crc32
    meta     meta_len   UTF-8 JSON object (name, device, created, ...)
    chunk*              20-byte chunk header + zlib stream:
                        4s kind, u32 count, u32 raw_len, u32 comp_len, u32 crc32(stored zlib bytes)
                        kinds in order: "RECS"* then "STRM", "SITE", then "END\\0" (no payload)

A ``RECS`` payload is ``count`` 32-byte records ``<B B H I q Q Q>``:
``action, flags, stream, site, t_ns, id, size``.

:class:`TraceWriter` streams records to disk in bounded memory and publishes the file atomically;
:func:`iter_records` and :class:`V1Reader` read it back one chunk at a time; :func:`read_v1`
builds a :class:`~vramkit.trace.model.Trace`. Any damage (truncation, flipped bytes, bad
lengths) is a ``ValueError`` that names the file and the byte offset.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import struct
import zlib
from array import array
from typing import Any, BinaryIO, Iterator, NamedTuple

import numpy as np

from .._atomic import AtomicFile, PublishOnExit
from . import limits
from .model import ALLOC, FREE, Trace, check_live_range, trace_name_from_path

__all__ = [
    "MAGIC", "VERSION", "RECORD_DTYPE", "Record", "TraceWriter", "V1Reader",
    "iter_records", "read_v1", "write_v1",
]

MAGIC = b"VKTRACE1"
VERSION = 1
FLAG_TIME = 0x01  # record flag: t_ns is valid

HEADER = struct.Struct("<8sHHII")  # magic, version, flags, meta_len, meta_crc32
CHUNK = struct.Struct("<4sIIII")  # kind, count, raw_len, comp_len, crc32
RECORD = struct.Struct("<BBHIqQQ")  # action, flags, stream, site, t_ns, id, size
RECORD_DTYPE = np.dtype([("action", "u1"), ("flags", "u1"), ("stream", "<u2"), ("site", "<u4"),
                         ("t_ns", "<i8"), ("id", "<u8"), ("size", "<u8")])
assert HEADER.size == 20 and CHUNK.size == 20 and RECORD.size == 32 == RECORD_DTYPE.itemsize

KIND_RECORDS = b"RECS"
KIND_STREAMS = b"STRM"
KIND_SITES = b"SITE"
KIND_END = b"END\x00"

# Reader limits: a damaged length can never make the reader allocate more than this.
MAX_META_BYTES = 16 << 20
MAX_CHUNK_RECORDS = 1 << 20
MAX_STREAMS = 1 << 16
MAX_TABLE_BYTES = 256 << 20
DEFAULT_CHUNK_RECORDS = 1 << 16
_I64_MAX = (1 << 63) - 1


class Record(NamedTuple):
    """One v1 record; ``stream`` and ``site`` are indices into the file's tables."""

    action: int
    flags: int
    stream: int
    site: int
    t_ns: int
    id: int
    size: int


def _max_comp(raw_len: int) -> int:
    # Above zlib's compressBound(): a longer compressed length is damage.
    return raw_len + raw_len // 1000 + 64


# -- reading ---------------------------------------------------------------------------------------
class V1Reader:
    """Read a v1 file chunk by chunk (bounded memory).

    ``metadata`` is available at once; ``streams`` and ``sites`` after :meth:`chunks` is
    exhausted (the tables follow the records). The file is complete and intact only when
    :meth:`chunks` finished without raising.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.name = os.path.basename(self.path) or self.path
        self.streams: list[int] | None = None
        self.sites: list[str] | None = None
        self.records = 0
        self._f: BinaryIO = open(self.path, "rb")
        self._off = 0
        try:
            self.metadata = self._read_header()
        except BaseException:
            self._f.close()
            raise

    def __enter__(self) -> "V1Reader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._f.close()

    def _err(self, offset: int, what: str) -> ValueError:
        return ValueError(f"{self.name}: corrupt vramkit trace at offset {offset}: {what}")

    def _read(self, n: int, what: str) -> bytes:
        data = self._f.read(n)
        if len(data) != n:
            raise ValueError(f"{self.name}: truncated vramkit trace at offset {self._off}: {what} "
                             f"needs {n} bytes, only {len(data)} left")
        self._off += n
        return data

    def _read_header(self) -> dict[str, Any]:
        raw = self._f.read(HEADER.size)
        if not raw:
            raise ValueError(f"{self.name}: empty file")
        if len(raw) < HEADER.size:
            if MAGIC.startswith(raw[:8]) or raw.startswith(MAGIC):
                raise ValueError(f"{self.name}: truncated vramkit trace at offset 0: header needs "
                                 f"{HEADER.size} bytes, only {len(raw)} present")
            raise ValueError(f"{self.name}: not a vramkit trace (bad magic)")
        magic, version, flags, meta_len, meta_crc = HEADER.unpack(raw)
        if magic != MAGIC:
            raise ValueError(f"{self.name}: not a vramkit trace (bad magic {magic!r})")
        self._off = HEADER.size
        if version != VERSION:
            raise self._err(8, f"unsupported version {version} (this reader knows {VERSION})")
        if flags != 0:
            raise self._err(10, f"unknown header flags 0x{flags:04x}")
        if meta_len > MAX_META_BYTES:
            raise self._err(12, f"metadata length {meta_len} exceeds {MAX_META_BYTES}")
        meta_raw = self._read(meta_len, "metadata")
        if zlib.crc32(meta_raw) != meta_crc:
            raise self._err(HEADER.size, "metadata checksum mismatch")
        try:
            meta = json.loads(meta_raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise self._err(HEADER.size, f"metadata is not UTF-8 JSON: {exc}") from None
        if not isinstance(meta, dict):
            raise self._err(HEADER.size, "metadata is not a JSON object")
        return meta

    def _payload(self, kind: bytes, raw_len: int, comp_len: int, crc: int, at: int) -> bytes:
        if comp_len > _max_comp(raw_len):
            raise self._err(at + 12, f"compressed length {comp_len} impossible for {raw_len} bytes")
        comp = self._read(comp_len, f"{kind.decode('ascii', 'replace')} chunk payload")
        if zlib.crc32(comp) != crc:
            raise self._err(at, "chunk checksum mismatch")
        d = zlib.decompressobj()
        try:
            out = d.decompress(comp, raw_len + 1)
        except zlib.error as exc:
            raise self._err(at + CHUNK.size, f"chunk payload does not inflate: {exc}") from None
        if len(out) != raw_len or not d.eof or d.unused_data or d.unconsumed_tail:
            raise self._err(at + CHUNK.size, f"chunk payload does not inflate to exactly {raw_len} bytes")
        return out

    def chunks(self) -> Iterator[np.ndarray]:
        """Yield each ``RECS`` chunk as a structured array of :data:`RECORD_DTYPE`."""
        while True:
            at = self._off
            kind, count, raw_len, comp_len, crc = CHUNK.unpack(self._read(CHUNK.size, "chunk header"))
            if kind == KIND_RECORDS:
                if self.streams is not None or self.sites is not None:
                    raise self._err(at, "records after the stream/site tables")
                if not 0 < count <= MAX_CHUNK_RECORDS:
                    raise self._err(at + 4, f"record count {count} outside 1..{MAX_CHUNK_RECORDS}")
                if raw_len != count * RECORD.size:
                    raise self._err(at + 8, f"raw length {raw_len} is not {count} x {RECORD.size}")
                recs = np.frombuffer(self._payload(kind, raw_len, comp_len, crc, at), dtype=RECORD_DTYPE)
                self._check_records(recs, at)
                self.records += count
                if self.records > limits.max_events(columnar=True):
                    raise limits.too_many_events(self.name, limits.max_events(columnar=True))
                yield recs
            elif kind == KIND_STREAMS:
                if self.streams is not None:
                    raise self._err(at, "second stream table")
                if count > MAX_STREAMS or raw_len != 8 * count:
                    raise self._err(at + 4, f"stream table of {count} entries with {raw_len} bytes")
                payload = self._payload(kind, raw_len, comp_len, crc, at)
                self.streams = np.frombuffer(payload, dtype="<i8").tolist()
            elif kind == KIND_SITES:
                if self.sites is not None:
                    raise self._err(at, "second site table")
                if count < 1 or raw_len > MAX_TABLE_BYTES or raw_len < count:
                    raise self._err(at + 4, f"site table of {count} entries with {raw_len} bytes")
                payload = self._payload(kind, raw_len, comp_len, crc, at)
                if not payload.endswith(b"\x00"):
                    raise self._err(at, "site table does not end with a NUL")
                parts = payload[:-1].split(b"\x00")
                if len(parts) != count:
                    raise self._err(at, f"site table holds {len(parts)} strings, header says {count}")
                try:
                    self.sites = [p.decode("utf-8") for p in parts]
                except UnicodeDecodeError as exc:
                    raise self._err(at, f"site table is not UTF-8: {exc}") from None
                if self.sites[0] != "":
                    raise self._err(at, "site 0 must be the empty string")
            elif kind == KIND_END:
                if raw_len or comp_len or crc:
                    raise self._err(at, "end marker with a payload")
                if self.streams is None or self.sites is None:
                    raise self._err(at, "end marker before the stream and site tables")
                if count != self.records & 0xFFFFFFFF:
                    raise self._err(at + 4, f"end marker counts {count} records, file holds {self.records}")
                if self._f.read(1):
                    raise self._err(self._off, "bytes after the end marker")
                return
            else:
                raise self._err(at, f"unknown chunk kind {kind!r}")

    def _check_records(self, recs: np.ndarray, at: int) -> None:
        bad = np.flatnonzero((recs["action"] > FREE) | ((recs["flags"] & np.uint8(0xFF ^ FLAG_TIME)) != 0)
                             | (recs["size"] > _I64_MAX))
        if bad.size:
            k = int(bad[0])
            raise self._err(at, f"record {self.records + k}: bad action/flags/size "
                                f"({int(recs['action'][k])}, 0x{int(recs['flags'][k]):02x}, {int(recs['size'][k])})")


def iter_records(path: str | os.PathLike[str]) -> Iterator[Record]:
    """Yield every record of a v1 file in order, in bounded memory.

    Damage is reported when it is reached: a caller must drain the iterator to know the file was
    complete (the end marker is checked last).
    """
    with V1Reader(path) as r:
        for recs in r.chunks():
            for row in recs.tolist():
                yield Record(*row)


def read_v1(path: str | os.PathLike[str], *, name: str | None = None) -> Trace:
    """Read a whole v1 file into a :class:`Trace` (ids renumbered densely from 0).

    Frees of ids that are not live are skipped and counted (a tracer attached mid-run); an alloc
    of an id that is live, a free whose size differs from its allocation's, and indices outside
    the stream/site tables are errors.
    """
    # Column by column, chunk by chunk: the raw 32-byte records never exist all at once.
    names = ("action", "stream", "site", "id", "size", "t_ns")
    cols: dict[str, list[np.ndarray]] = {k: [] for k in names}
    all_timed = True
    with V1Reader(path) as r:
        fname = r.name
        for recs in r.chunks():
            all_timed = all_timed and bool(np.all(recs["flags"] & FLAG_TIME))
            for k in names:
                if k != "t_ns" or all_timed:
                    cols[k].append(recs[k].copy())
            if not all_timed:
                cols["t_ns"].clear()
        meta = r.metadata
        stream_table = r.streams or []
        site_table = r.sites or [""]
    joined = {}
    for k in names:
        joined[k] = np.concatenate(cols[k]) if cols[k] else np.zeros(0, dtype=RECORD_DTYPE[k])
        cols[k].clear()
    all_timed = all_timed and joined["action"].size > 0
    ops, keep, skipped, left_live = _pair_records(joined, fname)
    n = ops.shape[0]
    times = (joined["t_ns"][keep] // 1000).astype(np.int64) if all_timed else None
    del joined, keep
    if n and int(ops[:, 3].max()) >= len(stream_table):
        k = int(np.argmax(ops[:, 3] >= len(stream_table)))
        raise ValueError(f"{fname}: op {k}: stream index {int(ops[k, 3])} outside the stream table "
                         f"({len(stream_table)} entries)")
    if n and int(ops[:, 4].max()) >= len(site_table):
        k = int(np.argmax(ops[:, 4] >= len(site_table)))
        raise ValueError(f"{fname}: op {k}: site index {int(ops[k, 4])} outside the site table "
                         f"({len(site_table)} entries)")
    t_us = times if (all_timed and n) else None
    check_live_range(ops, fname)
    trace_name = name or (meta.get("name") if isinstance(meta.get("name"), str) and meta.get("name") else None)
    return Trace(name=trace_name or trace_name_from_path(path), source="vramkit-v1", ops=ops,
                 streams=list(stream_table),
                 sites=list(site_table), t_us=t_us, skipped_frees=skipped, left_live=left_live,
                 metadata={"format": "vramkit-v1", "file": fname, "v1": meta})


def _pair_records(recs: dict[str, np.ndarray], fname: str) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Pairs each free with its allocation, all at once (a 10-million-record file stays a few
    arrays, never Python objects per record).

    Records are grouped by id in time order: within a group a free right after an alloc frees
    it; a free after nothing or after a free is dropped (the tracer started mid-run); an alloc
    right after an alloc is an error. Returns ``(ops, kept record mask, skipped, left live)``.
    """
    n = recs["action"].shape[0]
    if n == 0:
        return np.zeros((0, 5), dtype=np.int64), np.zeros(0, dtype=bool), 0, 0
    act = recs["action"].astype(np.int8)
    ids = recs["id"]
    order = np.lexsort((np.arange(n), ids))  # by id, then time
    g_act = act[order]
    same = np.zeros(n, dtype=bool)
    same[1:] = ids[order[1:]] == ids[order[:-1]]
    prev_alloc = np.zeros(n, dtype=bool)  # the previous record of the same id is an alloc
    prev_alloc[1:] = same[1:] & (g_act[:-1] == ALLOC)
    double = np.flatnonzero((g_act == ALLOC) & prev_alloc)
    if double.size:
        k = int(order[double].min())
        raise ValueError(f"{fname}: record {k}: alloc of id {int(ids[k])} that is still live")
    skip_sorted = (g_act == FREE) & ~prev_alloc
    keep = np.ones(n, dtype=bool)
    keep[order[skip_sorted]] = False
    n_skipped = int(skip_sorted.sum())
    last = np.ones(n, dtype=bool)  # the last record of each id group
    last[:-1] = ~same[1:]
    left_live = int(np.count_nonzero(last & (g_act == ALLOC)))
    del skip_sorted, last, same
    is_alloc = act == ALLOC
    dense = np.cumsum(is_alloc, dtype=np.int64) - 1  # dense id of each alloc, in time order
    # each kept free takes the record index of the alloc just before it in its group
    partner = np.full(n, -1, dtype=np.int64)
    free_sorted = np.flatnonzero((g_act == FREE) & prev_alloc)
    partner[order[free_sorted]] = order[free_sorted - 1]
    del order, g_act, prev_alloc, free_sorted
    fr = np.flatnonzero(partner >= 0)
    src = partner[fr]
    del partner
    sizes = recs["size"].astype(np.int64)
    bad = np.flatnonzero((sizes[fr] != 0) & (sizes[fr] != sizes[src]))
    if bad.size:
        k, j = int(fr[bad[0]]), int(src[bad[0]])
        raise ValueError(f"{fname}: record {k}: free of id {int(ids[k])} with size {int(sizes[k])}, "
                         f"allocated with {int(sizes[j])}")
    ops = np.empty((int(keep.sum()), 5), dtype=np.int64)
    ops[:, 0] = act[keep]
    # frees take their allocation's dense id, size and site (written in place: frees read
    # only allocation rows)
    dense[fr] = dense[src]
    ops[:, 1] = dense[keep]
    del dense
    sizes[fr] = sizes[src]
    ops[:, 2] = sizes[keep]
    del sizes
    ops[:, 3] = recs["stream"][keep]
    site = recs["site"].astype(np.int64)
    site[fr] = site[src]
    ops[:, 4] = site[keep]
    return ops, keep, n_skipped, left_live


# -- writing ---------------------------------------------------------------------------------------
class TraceWriter(PublishOnExit):
    """Stream records into a v1 file; the file appears (atomically) only on :meth:`close`.

    Records are buffered and compressed ``chunk_records`` at a time, so memory stays bounded
    (plus the stream and site tables). The data goes to a temporary file in the destination
    folder, which is fsync'ed and renamed over ``path`` on :meth:`close`; :meth:`abort` (or an
    exception inside a ``with`` block) removes it, so a half-written trace never appears.
    Not thread-safe: callers recording from several threads hold one lock around each call.

    Parameters
    ----------
    path : path-like
        Destination file (conventionally ``*.vktrace``).
    name : str, optional
        Trace name stored in the metadata (default: the file name without suffixes).
    device : str or int, optional
        Device description stored in the metadata.
    metadata : dict, optional
        Extra JSON-serialisable metadata.
    chunk_records : int
        Records per chunk (1 .. 1,048,576).
    """

    def __init__(self, path: str | os.PathLike[str], *, name: str | None = None,
                 device: Any = None, metadata: dict[str, Any] | None = None,
                 chunk_records: int = DEFAULT_CHUNK_RECORDS, level: int = 6) -> None:
        if not 0 < chunk_records <= MAX_CHUNK_RECORDS:
            raise ValueError(f"chunk_records must be in 1..{MAX_CHUNK_RECORDS}")
        self.path = os.fspath(path)
        self._chunk_records = chunk_records
        self._level = level
        meta: dict[str, Any] = {
            "name": name or trace_name_from_path(self.path),
            "device": device,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "writer": "vramkit-python",
        }
        if metadata:
            meta.update(metadata)
        try:
            meta_raw = json.dumps(meta, sort_keys=True, ensure_ascii=False).encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise ValueError(f"metadata is not JSON-serialisable: {exc}") from None
        if len(meta_raw) > MAX_META_BYTES:
            raise ValueError(f"metadata is {len(meta_raw)} bytes, over {MAX_META_BYTES}")
        self._f: AtomicFile | None = AtomicFile(self.path)
        self._buf = bytearray()
        self._pending = 0
        self.records = 0
        self._streams: list[int] = []
        self._stream_index: dict[int, int] = {}
        self._sites: list[str] = [""]
        self._site_index: dict[str, int] = {"": 0}
        self._live: dict[int, int] = {}  # id -> size of the allocations not yet freed (what the reader checks)
        try:
            self._f.write(HEADER.pack(MAGIC, VERSION, 0, len(meta_raw), zlib.crc32(meta_raw)))
            self._f.write(meta_raw)
        except BaseException:
            self.abort()
            raise

    def __del__(self) -> None:
        if getattr(self, "_f", None) is not None:
            self.abort()

    @property
    def closed(self) -> bool:
        return self._f is None

    def stream_index(self, handle: int) -> int:
        """Index of a stream handle in the table (added on first use)."""
        idx = self._stream_index.get(handle)
        if idx is None:
            h = int(handle)
            if not -(1 << 63) <= h < (1 << 64):
                raise ValueError(f"stream handle {h} does not fit 64 bits")
            if len(self._streams) >= MAX_STREAMS:
                raise ValueError(f"more than {MAX_STREAMS} streams")
            idx = self._stream_index[handle] = len(self._streams)
            self._streams.append(h - (1 << 64) if h > _I64_MAX else h)
        return idx

    def site_index(self, site: str) -> int:
        """Index of a site string in the table (added on first use; 0 is no site)."""
        idx = self._site_index.get(site)
        if idx is None:
            if "\x00" in site:
                raise ValueError("a site string cannot contain NUL")
            site.encode("utf-8")  # refuse lone surrogates now, not at close
            idx = self._site_index[site] = len(self._sites)
            self._sites.append(site)
        return idx

    def record(self, action: int, id: int, size: int, *, stream: int = 0, site: str = "",
               t_ns: int | None = None) -> None:
        """Append one record; ``stream`` is the original handle, ``site`` a string."""
        self._check_open()
        for what, v in (("action", action), ("id", id), ("size", size), ("stream", stream), ("t_ns", t_ns)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer))):
                raise ValueError(f"{what} must be an integer, not {type(v).__name__}")
        if not isinstance(site, str):
            raise ValueError(f"site must be a string, not {type(site).__name__}")
        action, id, size = int(action), int(id), int(size)
        if action not in (ALLOC, FREE):
            raise ValueError(f"action must be 0 (alloc) or 1 (free), not {action}")
        if not 0 <= id < (1 << 64):
            raise ValueError(f"id {id} does not fit an unsigned 64-bit integer")
        if not 0 <= size <= _I64_MAX:
            raise ValueError(f"size {size} outside 0..2**63-1")
        flags = 0
        if t_ns is not None:
            t_ns = int(t_ns)
            if not -(1 << 63) <= t_ns <= _I64_MAX:
                raise ValueError(f"t_ns {t_ns} does not fit a signed 64-bit integer")
            flags = FLAG_TIME
        # What the reader refuses is refused here, before anything is written.
        if action == ALLOC and id in self._live:
            raise ValueError(f"alloc of id {id} that is still live")
        if action == FREE and size and id in self._live and self._live[id] != size:
            raise ValueError(f"free of id {id} with size {size}, allocated with {self._live[id]}")
        rec = RECORD.pack(action, flags, self.stream_index(stream), self.site_index(site) if site else 0,
                          t_ns or 0, id, size)
        if action == ALLOC:
            self._live[id] = size
        else:
            self._live.pop(id, None)  # a free of an id not live is kept; the reader skips it
        self._buf += rec
        self._pending += 1
        if self._pending >= self._chunk_records:
            self._flush_records()

    def alloc(self, id: int, size: int, *, stream: int = 0, site: str = "", t_ns: int | None = None) -> None:
        """Append an allocation record."""
        self.record(ALLOC, id, size, stream=stream, site=site, t_ns=t_ns)

    def free(self, id: int, size: int = 0, *, stream: int = 0, t_ns: int | None = None) -> None:
        """Append a free record (``size`` 0 means unknown; else it must match the allocation)."""
        self.record(FREE, id, size, stream=stream, t_ns=t_ns)

    def write_trace(self, trace: Trace) -> None:
        """Append all ops of a :class:`Trace` (vectorised; its ids, streams and sites kept)."""
        self._check_open()
        ops = trace.ops
        allocs = ops[:, 0] == ALLOC
        if self._live:
            clash = np.intersect1d(ops[allocs, 1].astype(np.uint64),  # ids up to 2**64 - 1 here
                                   np.fromiter(self._live, dtype=np.uint64, count=len(self._live)))
            if clash.size:
                raise ValueError(f"alloc of id {int(clash[0])} that is still live (written before this trace)")
        freed = np.zeros(int(ops[:, 1].max()) + 1 if len(ops) else 0, dtype=bool)
        freed[ops[~allocs, 1]] = True
        stream_map = np.array([self.stream_index(h) for h in trace.streams] or [0], dtype=np.uint16)
        site_map = np.array([self.site_index(s) if s else 0 for s in trace.sites] or [0], dtype=np.uint32)
        start = 0
        n = ops.shape[0]
        while start < n:
            room = self._chunk_records - self._pending
            part = ops[start:start + room]
            recs = np.zeros(part.shape[0], dtype=RECORD_DTYPE)
            recs["action"] = part[:, 0]
            recs["stream"] = stream_map[part[:, 3]]
            recs["site"] = site_map[part[:, 4]]
            recs["id"] = part[:, 1]
            recs["size"] = part[:, 2]
            if trace.t_us is not None:
                recs["flags"] = FLAG_TIME
                recs["t_ns"] = trace.t_us[start:start + room] * 1000
            self._buf += recs.tobytes()
            self._pending += part.shape[0]
            start += part.shape[0]
            if self._pending >= self._chunk_records:
                self._flush_records()
        for i, size in ops[allocs & ~freed[ops[:, 1]], 1:3]:  # left live by the trace
            self._live[int(i)] = int(size)

    def _check_open(self) -> None:
        if self._f is None:
            raise ValueError(f"trace writer for {os.path.basename(self.path)} is closed")

    def _chunk(self, kind: bytes, count: int, raw: bytes) -> None:
        assert self._f is not None
        comp = zlib.compress(raw, self._level)
        self._f.write(CHUNK.pack(kind, count, len(raw), len(comp), zlib.crc32(comp)))
        self._f.write(comp)

    def _flush_records(self) -> None:
        if self._pending:
            self._chunk(KIND_RECORDS, self._pending, bytes(self._buf))
            self.records += self._pending
            self._buf.clear()
            self._pending = 0

    def close(self) -> None:
        """Write the tables and end marker, fsync, and rename into place."""
        if self._f is None:
            return
        try:
            self._flush_records()
            self._chunk(KIND_STREAMS, len(self._streams), array("q", self._streams).tobytes()
                        if self._streams else b"")
            sites_raw = b"".join(s.encode("utf-8") + b"\x00" for s in self._sites)
            self._chunk(KIND_SITES, len(self._sites), sites_raw)
            if self.records > 0xFFFFFFFF:
                raise ValueError("more than 2**32-1 records in one file")
            self._f.write(CHUNK.pack(KIND_END, self.records, 0, 0, 0))
        except BaseException:
            self.abort()
            raise
        f, self._f = self._f, None
        f.commit()

    def abort(self) -> None:
        """Discard everything written so far (the destination is left untouched)."""
        f, self._f = getattr(self, "_f", None), None
        if f is not None:
            f.abort()


def write_v1(path: str | os.PathLike[str], trace: Trace, *, chunk_records: int = DEFAULT_CHUNK_RECORDS,
             metadata: dict[str, Any] | None = None) -> None:
    """Write a :class:`Trace` as a v1 file (atomically)."""
    meta = {"source": trace.source, "skipped_frees": trace.skipped_frees}
    if metadata:
        meta.update(metadata)
    with TraceWriter(path, name=trace.name, metadata=meta, chunk_records=chunk_records) as w:
        w.write_trace(trace)
