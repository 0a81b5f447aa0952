"""The in-memory trace: a dense table of allocation and free operations.

Every importer (PyTorch trace CSV and snapshots, RMM logs, vramkit trace v1) produces a
:class:`Trace`, and replay, reports and the v1 writer consume one.
"""
from __future__ import annotations

import dataclasses
import os
from array import array
from typing import Any, Hashable, NamedTuple

import numpy as np

_I64_MAX = (1 << 63) - 1

__all__ = ["ALLOC", "FREE", "COLUMNS", "Trace", "TraceBuilder", "LiveBlock", "SizeHistogram",
           "downsample_max"]

ALLOC = 0
FREE = 1
#: Column order of :attr:`Trace.ops`.
COLUMNS = ("action", "id", "size", "stream", "site")


class LiveBlock(NamedTuple):
    """One allocation live at a given moment."""

    id: int
    size: int
    site: str
    stream: int  # the original stream handle
    alloc_op: int  # index of the op that allocated it


class SizeHistogram(NamedTuple):
    """Allocation sizes in power-of-two buckets: bucket ``k`` holds sizes in ``[lo[k], 2*lo[k])``.

    A bucket with ``lo == 0`` holds the zero-byte allocations.
    """

    lo: np.ndarray  # int64 lower bound of each bucket (bytes)
    counts: np.ndarray  # int64 number of allocations
    bytes: np.ndarray  # int64 sum of their sizes


@dataclasses.dataclass
class Trace:
    """A sequence of allocations and frees.

    Attributes
    ----------
    name : str
        Short name (usually the file name without its suffixes).
    source : str
        Format it was read from: ``"pytorch-trace-csv"``, ``"pytorch-snapshot"``,
        ``"rmm-csv-log"``, ``"vramkit-v1"`` or ``"memory"``.
    ops : numpy.ndarray
        int64, shape ``(n, 5)``, columns ``action, id, size, stream, site``.
        ``action``: 0 alloc, 1 free. ``id``: allocations are numbered densely from 0 in the order
        they happen; a free names a live id. ``size``: bytes requested; a free row carries the
        size of the allocation it frees. ``stream``: index into :attr:`streams`. ``site``: 0 for
        none, else index into :attr:`sites`.
    streams : list[int]
        Original stream handles; index 0 is the first stream seen.
    sites : list[str]
        Allocation sites (``"file:line"``); index 0 is ``""`` (no site).
    t_us : numpy.ndarray or None
        int64 time of each op in microseconds, when the source had times.
    skipped_frees : int
        Frees of addresses never seen allocated (dropped; a ring buffer starts mid-run).
    left_live : int
        Allocations never freed by the end of the trace.
    metadata : dict
        Source details: counts of non-allocation events, device, and so on.
    """

    name: str
    source: str
    ops: np.ndarray
    streams: list[int]
    sites: list[str]
    t_us: np.ndarray | None = None
    skipped_frees: int = 0
    left_live: int = 0
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)

    # -- basic facts -----------------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.ops.shape[0])

    @property
    def n_allocs(self) -> int:
        return int(np.count_nonzero(self.ops[:, 0] == ALLOC))

    @property
    def n_frees(self) -> int:
        return int(np.count_nonzero(self.ops[:, 0] == FREE))

    def live_bytes(self) -> np.ndarray:
        """Live requested bytes after each op (int64, one value per op)."""
        if len(self) == 0:
            return np.zeros(0, dtype=np.int64)
        sign = np.where(self.ops[:, 0] == ALLOC, 1, -1).astype(np.int64)
        return np.cumsum(sign * self.ops[:, 2])

    def peak_index(self) -> int:
        """Index of the first op after which live bytes are at their peak (-1 if empty)."""
        if len(self) == 0:
            return -1
        return int(np.argmax(self.live_bytes()))

    def peak_live_bytes(self) -> int:
        """Peak of live requested bytes: the floor no allocator can go under."""
        if len(self) == 0:
            return 0
        return max(0, int(self.live_bytes().max()))

    def size_histogram(self) -> SizeHistogram:
        """Allocation sizes in log2 buckets (only buckets from the smallest to the largest size)."""
        sizes = self.ops[self.ops[:, 0] == ALLOC, 2]
        if sizes.size == 0:
            empty = np.zeros(0, dtype=np.int64)
            return SizeHistogram(empty, empty.copy(), empty.copy())
        # bucket -1 for zero bytes, else floor(log2(size)), exact for any int64
        uniq, inverse = np.unique(sizes, return_inverse=True)
        ubucket = np.array([int(v).bit_length() - 1 for v in uniq.tolist()], dtype=np.int64)
        bucket = ubucket[inverse.reshape(-1)]
        first, last = int(bucket.min()), int(bucket.max())
        ks = np.arange(first, last + 1)
        idx = bucket - first
        counts = np.bincount(idx, minlength=ks.size).astype(np.int64)
        total = np.zeros(ks.size, dtype=np.int64)
        np.add.at(total, idx, sizes)
        lo = np.array([0 if k < 0 else 1 << int(k) for k in ks.tolist()], dtype=np.int64)
        return SizeHistogram(lo, counts, total)

    def live_over_time(self, max_points: int = 2000) -> tuple[np.ndarray, np.ndarray]:
        """Live bytes over the trace, at most ``max_points`` points, peaks kept.

        Returns ``(op_index, live_bytes)``: the ops are cut into ``max_points`` equal runs and
        each run is represented by its maximum (at the op where it happens), so the peak of the
        trace is always one of the points.
        """
        live = self.live_bytes()
        x = np.arange(live.size, dtype=np.int64)
        return downsample_max(x, live, max_points)

    def live_at(self, op_index: int) -> list[LiveBlock]:
        """Allocations live just after op ``op_index``, largest first."""
        n = len(self)
        if not 0 <= op_index < n:
            raise IndexError(f"op index {op_index} out of range for a trace of {n} ops")
        ops = self.ops
        is_alloc = ops[:, 0] == ALLOC
        alloc_pos = np.flatnonzero(is_alloc)  # id -> op index (ids are dense in order)
        free_pos = np.full(alloc_pos.size, n, dtype=np.int64)
        fr = np.flatnonzero(~is_alloc)
        free_pos[ops[fr, 1]] = fr
        live_ids = np.flatnonzero((alloc_pos <= op_index) & (free_pos > op_index))
        sizes = ops[alloc_pos[live_ids], 2]
        order = np.lexsort((live_ids, -sizes))
        out = []
        for i in live_ids[order]:
            row = ops[alloc_pos[i]]
            out.append(LiveBlock(int(i), int(row[2]), self.sites[int(row[4])],
                                 int(self.streams[int(row[3])]) if self.streams else 0,
                                 int(alloc_pos[i])))
        return out

    def largest_at_peak(self, k: int = 20) -> list[LiveBlock]:
        """The ``k`` largest allocations live at the (first) peak of live bytes."""
        p = self.peak_index()
        if p < 0:
            return []
        return self.live_at(p)[:max(0, k)]

    def summary(self) -> dict[str, Any]:
        """Plain-dict facts for printing or JSON."""
        out: dict[str, Any] = {
            "name": self.name,
            "source": self.source,
            "ops": len(self),
            "allocs": self.n_allocs,
            "frees": self.n_frees,
            "peak_live_bytes": self.peak_live_bytes(),
            "streams": len(self.streams),
            "sites": max(0, len(self.sites) - 1),
            "skipped_frees": self.skipped_frees,
            "left_live": self.left_live,
        }
        if self.t_us is not None and len(self.t_us):
            out["duration_us"] = int(self.t_us[-1] - self.t_us[0])
        return out

    def replay_ops(self, free_left_live: bool = True) -> np.ndarray:
        """``(n, 3)`` int64 ``[action, id, size]`` rows for a replay engine.

        With ``free_left_live`` the allocations still live at the end are freed at the end (in
        allocation order), so a replay leaves nothing behind; this matches the anchors' ``.ops``
        files op for op (their free rows carry size 0, ours the freed size).
        """
        rows = self.ops[:, :3]
        if not free_left_live or self.left_live == 0:
            return np.ascontiguousarray(rows)
        is_alloc = self.ops[:, 0] == ALLOC
        n_ids = int(np.count_nonzero(is_alloc))
        freed = np.zeros(n_ids, dtype=bool)
        freed[self.ops[~is_alloc, 1]] = True
        left = np.flatnonzero(~freed)
        sizes = self.ops[np.flatnonzero(is_alloc)[left], 2]
        tail = np.stack([np.full(left.size, FREE, dtype=np.int64), left, sizes], axis=1)
        return np.ascontiguousarray(np.concatenate([rows, tail]))

    # -- integrity -------------------------------------------------------------------------------
    def validate(self) -> None:
        """Check every invariant; raise ``ValueError`` naming the first bad op index."""
        ops = self.ops
        if not isinstance(ops, np.ndarray) or ops.dtype != np.int64 or ops.ndim != 2 or ops.shape[1] != 5:
            raise ValueError(f"trace {self.name!r}: ops must be an int64 array of shape (n, 5)")
        n = ops.shape[0]
        if not self.sites or self.sites[0] != "":
            raise ValueError(f"trace {self.name!r}: sites[0] must be the empty string")
        if self.t_us is not None and (not isinstance(self.t_us, np.ndarray) or self.t_us.shape != (n,)):
            raise ValueError(f"trace {self.name!r}: t_us must have one value per op")
        if n == 0:
            if self.left_live:
                raise ValueError(f"trace {self.name!r}: left_live={self.left_live} but no ops")
            return

        def fail(mask: np.ndarray, what: str) -> None:
            bad = np.flatnonzero(mask)
            if bad.size:
                raise ValueError(f"trace {self.name!r}: op {int(bad[0])}: {what}")

        action, ids, size, stream, site = (ops[:, i] for i in range(5))
        fail((action != ALLOC) & (action != FREE), "action must be 0 (alloc) or 1 (free)")
        fail(size < 0, "negative size")
        fail((stream < 0) | (stream >= len(self.streams)), f"stream index outside 0..{len(self.streams) - 1}")
        fail((site < 0) | (site >= len(self.sites)), f"site index outside 0..{len(self.sites) - 1}")
        is_alloc = action == ALLOC
        alloc_pos = np.flatnonzero(is_alloc)
        expected = np.zeros(n, dtype=np.int64)
        expected[alloc_pos] = np.arange(alloc_pos.size)
        fail(is_alloc & (ids != expected), "allocation ids must be dense, numbered from 0 in order")
        free_pos = np.flatnonzero(~is_alloc)
        fids = ids[free_pos]
        fail(_scatter(n, free_pos, (fids < 0) | (fids >= alloc_pos.size)), "free of an id that was never allocated")
        when = alloc_pos[fids]
        fail(_scatter(n, free_pos, when > free_pos), "free of an id before it is allocated")
        # a second free of the same id
        order = np.argsort(fids, kind="stable")
        dup = np.zeros(fids.size, dtype=bool)
        dup[order[1:]] = fids[order[1:]] == fids[order[:-1]]
        fail(_scatter(n, free_pos, dup), "second free of the same id")
        fail(_scatter(n, free_pos, size[free_pos] != size[when]), "free size differs from the allocation's size")
        left = int(alloc_pos.size - free_pos.size)
        if left != self.left_live:
            raise ValueError(f"trace {self.name!r}: left_live={self.left_live} but {left} allocations are never freed")


def _scatter(n: int, where: np.ndarray, values: np.ndarray) -> np.ndarray:
    out = np.zeros(n, dtype=bool)
    out[where] = values
    return out


def downsample_max(x: np.ndarray, y: np.ndarray, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """Keep at most ``max_points`` points of ``(x, y)``: the maximum of each of equal index runs."""
    x = np.asarray(x, dtype=np.int64)
    y = np.asarray(y, dtype=np.int64)
    n = y.size
    if max_points <= 0:
        raise ValueError("max_points must be positive")
    if n <= max_points:
        return x.copy(), y.copy()
    edges = np.linspace(0, n, max_points + 1).astype(np.int64)
    starts = edges[:-1]
    starts = starts[np.concatenate([[True], starts[1:] != starts[:-1]])]
    # argmax within each run: reduceat gives the max; locate its first position
    maxima = np.maximum.reduceat(y, starts)
    run = np.repeat(np.arange(starts.size), np.diff(np.append(starts, n)))
    hit = y == maxima[run]
    first = np.full(starts.size, n, dtype=np.int64)
    np.minimum.at(first, run[hit], np.flatnonzero(hit))
    return x[first], y[first]


class TraceBuilder:
    """Turn a stream of (address-keyed) alloc/free events into a :class:`Trace`.

    Keys are whatever identifies a live allocation in the source (a device address, a v1 id).
    Each :meth:`alloc` gets the next dense id; :meth:`free` of a key that is not live is
    skipped and counted (a ring buffer, or a tracer attached mid-run, starts with such frees).
    An :meth:`alloc` of a key that is still live means the source lost a free: the old
    allocation is freed first and the event is counted in ``metadata["implicit_frees"]``.
    """

    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source
        self.metadata: dict[str, Any] = {}
        self.streams: list[int] = []
        self.sites: list[str] = [""]
        self.skipped_frees = 0
        self.implicit_frees = 0
        self._cols = [array("q") for _ in range(5)]
        self._t = array("q")
        self._all_timed = True
        self._live: dict[Hashable, tuple[int, int, int, int]] = {}  # key -> (id, size, stream, site)
        self._stream_index: dict[int, int] = {}
        self._site_index: dict[str, int] = {"": 0}
        self._next_id = 0
        from .limits import max_events
        self._max_events = max_events()

    def stream_index(self, handle: int) -> int:
        idx = self._stream_index.get(handle)
        if idx is None:
            idx = self._stream_index[handle] = len(self.streams)
            self.streams.append(handle)
        return idx

    def site_index(self, site: str) -> int:
        idx = self._site_index.get(site)
        if idx is None:
            idx = self._site_index[site] = len(self.sites)
            self.sites.append(site)
        return idx

    def _row(self, action: int, ident: int, size: int, stream: int, site: int, t: int | None) -> None:
        c = self._cols
        if len(c[0]) >= self._max_events:
            from .limits import too_many_events
            raise too_many_events(self.name, self._max_events)
        if not (0 <= size <= _I64_MAX) or (t is not None and not (-_I64_MAX <= t <= _I64_MAX)):
            # The importers name the line; this is the backstop for other callers.
            raise ValueError(f"{self.name}: event {len(c[0])}: size or time outside the 64-bit range")
        c[0].append(action)
        c[1].append(ident)
        c[2].append(size)
        c[3].append(stream)
        c[4].append(site)
        if t is None:
            self._all_timed = False
        elif self._all_timed:
            self._t.append(t)

    def alloc(self, key: Hashable, size: int, stream: int = 0, site: str = "", t: int | None = None) -> int:
        """Record an allocation; ``stream`` is the original handle. Returns its dense id."""
        if size < 0:
            raise ValueError(f"negative size {size}")
        old = self._live.get(key)
        if old is not None:
            self.implicit_frees += 1
            self._live.pop(key)
            self._row(FREE, old[0], old[1], old[2], old[3], t)
        ident = self._next_id
        self._next_id += 1
        s_idx = self.stream_index(stream)
        site_idx = self.site_index(site) if site else 0
        self._live[key] = (ident, size, s_idx, site_idx)
        self._row(ALLOC, ident, size, s_idx, site_idx, t)
        return ident

    def free(self, key: Hashable, t: int | None = None) -> tuple[int, int] | None:
        """Record the free of ``key``; returns ``(id, size)``, or None when it was not live."""
        rec = self._live.pop(key, None)
        if rec is None:
            self.skipped_frees += 1
            return None
        self._row(FREE, rec[0], rec[1], rec[2], rec[3], t)
        return rec[0], rec[1]

    def is_live(self, key: Hashable) -> bool:
        return key in self._live

    @property
    def n_ops(self) -> int:
        return len(self._cols[0])

    def build(self) -> Trace:
        n = self.n_ops
        ops = np.empty((n, 5), dtype=np.int64)
        for i, col in enumerate(self._cols):
            ops[:, i] = np.frombuffer(col, dtype=np.int64) if n else 0
        t_us = np.frombuffer(self._t, dtype=np.int64).copy() if (self._all_timed and n) else None
        meta = dict(self.metadata)
        if self.implicit_frees:
            meta["implicit_frees"] = self.implicit_frees
        check_live_range(ops, self.name)
        return Trace(name=self.name, source=self.source, ops=ops, streams=list(self.streams),
                     sites=list(self.sites), t_us=t_us, skipped_frees=self.skipped_frees,
                     left_live=len(self._live), metadata=meta)


LIVE_LIMIT = 1 << 62  # bytes: past any device, and far enough from int64's end for every sum made of them


def check_live_range(ops: np.ndarray, name: str) -> None:
    """Refuse a trace whose live bytes ever pass 2^62 (sums of sizes would overflow int64 on the
    way: negative live memory, ratios below 1); names the first op that does."""
    if ops.shape[0] == 0 or float(ops[:, 2].max()) * ops.shape[0] <= LIVE_LIMIT:
        return  # (no sum of its sizes can get there: one pass, no array made)
    sign = np.where(ops[:, 0] == ALLOC, 1.0, -1.0)
    live = np.cumsum(sign * ops[:, 2].astype(np.float64))
    over = np.flatnonzero(live > LIVE_LIMIT)
    if over.size:
        k = int(over[0])
        raise ValueError(f"{name}: op {k}: live memory reaches {live[k]:.3g} bytes, past 2^62: not the memory "
                         "of a device")


_SUFFIXES = (".gz", ".csv", ".log", ".pickle", ".pkl", ".vktrace", ".trace", ".snapshot")


def trace_name_from_path(path: str | os.PathLike[str]) -> str:
    """``bert.trace.csv.gz`` -> ``bert``: the file name without its known suffixes."""
    base = os.path.basename(os.fspath(path))
    changed = True
    while changed:
        changed = False
        for suf in _SUFFIXES:
            if base.lower().endswith(suf) and len(base) > len(suf):
                base = base[: -len(suf)]
                changed = True
    return base
