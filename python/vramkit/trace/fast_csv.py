"""The long-trace path of the PyTorch trace CSV reader: C++ parses the file into columns and
NumPy pairs frees with allocations in one pass, so millions of rows never become Python objects.

Same result as the row-by-row reader (``importers.read_pytorch_trace_csv``), which remains the
reader of record: whenever the C++ side meets something it does not handle (quotes, hex numbers,
a malformed row, damaged gzip) it declines and the row-by-row reader runs and words the error.
"""
from __future__ import annotations

import os

import numpy as np

from .model import ALLOC, FREE, Trace

#: Files at least this large (bytes on disk) take the columnar path when the extension is built.
FAST_MIN_BYTES = 4 << 20


def read_fast(path: str | os.PathLike[str], name: str, fname: str) -> Trace | None:
    """The trace, or None when the columnar reader declines (then use the row-by-row one)."""
    try:
        from .. import _vramkit
    except ImportError:  # pure-Python install: no columnar reader
        return None
    cols, _why = _vramkit.read_torch_csv_columns(os.fspath(path))
    if cols is None:
        return None
    ops, t_us, streams, skipped, implicit, left_live = pair_by_address(
        cols["action"], cols["addr"], cols["size"], cols["stream"], cols["t_us"])
    meta = {"format": "pytorch-trace-csv", "file": fname, "events": dict(cols["events"])}
    if implicit:
        meta["implicit_frees"] = implicit
    return Trace(name=name, source="pytorch-trace-csv", ops=ops, streams=streams, sites=[""], t_us=t_us,
                 skipped_frees=skipped, left_live=left_live, metadata=meta)


def pair_by_address(act, addr, size, stream, t_us):
    """Address-keyed events to dense ops, with the row-by-row reader's rules: an alloc takes the
    next dense id; a free of an address not live is skipped; an alloc of a live address first
    frees the old allocation (an implicit free, placed just before it)."""
    n = act.shape[0]
    if n == 0:
        return np.zeros((0, 5), dtype=np.int64), None, [], 0, 0, 0
    act = act.astype(np.int8)
    order = np.lexsort((np.arange(n), addr))  # by address, then time
    g_act = act[order]
    same = np.zeros(n, dtype=bool)
    same[1:] = addr[order[1:]] == addr[order[:-1]]
    prev_alloc = np.zeros(n, dtype=bool)  # the previous event at this address is an alloc
    prev_alloc[1:] = same[1:] & (g_act[:-1] == ALLOC)
    last = np.ones(n, dtype=bool)
    last[:-1] = ~same[1:]
    left_live = int(np.count_nonzero(last & (g_act == ALLOC)))
    skipped = int(np.count_nonzero((g_act == FREE) & ~prev_alloc))
    partner = np.full(n, -1, dtype=np.int64)  # for a free or an alloc of a live address: the old alloc
    paired = np.flatnonzero(prev_alloc)
    partner[order[paired]] = order[paired - 1]
    del order, g_act, same, prev_alloc, last, paired
    is_alloc = act == ALLOC
    dense = np.cumsum(is_alloc, dtype=np.int64) - 1
    # streams numbered in order of first use by an allocation
    a_pos = np.flatnonzero(is_alloc)
    uniq, first, inv = np.unique(stream[a_pos], return_index=True, return_inverse=True)
    rank = np.empty(uniq.size, dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(uniq.size)
    s_idx = np.zeros(n, dtype=np.int64)
    s_idx[a_pos] = rank[inv.reshape(-1)]
    streams = [int(h) for h in uniq[np.argsort(first, kind="stable")]]
    frees = np.flatnonzero(~is_alloc & (partner >= 0))
    implicit = np.flatnonzero(is_alloc & (partner >= 0))
    rows_at = np.concatenate([a_pos, frees, implicit])  # the record each output row comes from
    src = np.concatenate([a_pos, partner[frees], partner[implicit]])  # the alloc it describes
    kind = np.concatenate([np.zeros(a_pos.size, np.int64), np.ones(frees.size + implicit.size, np.int64)])
    # an implicit free goes just before the alloc that displaced it
    sort_key = rows_at * 2 + 1
    sort_key[a_pos.size + frees.size:] -= 1
    o = np.argsort(sort_key, kind="stable")
    ops = np.empty((o.size, 5), dtype=np.int64)
    ops[:, 0] = kind[o]
    s = src[o]
    ops[:, 1] = dense[s]
    ops[:, 2] = size[s]
    ops[:, 3] = s_idx[s]
    ops[:, 4] = 0
    times = None if t_us is None else np.asarray(t_us, dtype=np.int64)[rows_at[o]]
    return ops, times, streams, skipped, int(implicit.size), left_live
