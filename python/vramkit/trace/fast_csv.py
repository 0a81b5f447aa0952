"""The long-trace path of the PyTorch trace CSV reader: C++ parses the file into columns and
NumPy pairs frees with allocations in one pass, so millions of rows never become Python objects.

Same result as the row-by-row reader (``importers.read_pytorch_trace_csv``), which remains the
reader of record: whenever the C++ side meets something it does not handle (quotes, hex numbers,
a malformed row, damaged gzip) it declines and the row-by-row reader runs and words the error.
"""
from __future__ import annotations

import os

import numpy as np

from .model import ALLOC, FREE, Trace, check_live_range

#: Files at least this large (bytes on disk) take the columnar path when the extension is built.
FAST_MIN_BYTES = 4 << 20


def read_fast(path: str | os.PathLike[str], name: str, fname: str) -> Trace | None:
    """The trace, or None when the columnar reader declines (then use the row-by-row one)."""
    try:
        from .. import _vramkit
    except ImportError:  # pure-Python install: no columnar reader
        return None
    from . import limits
    max_bytes, max_rows = limits.max_bytes(), limits.max_events(columnar=True)
    cols, why = _vramkit.read_torch_csv_columns(os.fspath(path), max_bytes, max_rows)
    if why == "bytes bound":
        raise limits.too_many_bytes(fname, max_bytes)
    if why == "rows bound":
        raise limits.too_many_events(fname, max_rows)
    if cols is None:
        return None
    ops, t_us, streams, skipped, implicit, left_live = pair_by_address(cols)
    meta = {"format": "pytorch-trace-csv", "file": fname, "events": dict(cols["events"])}
    if implicit:
        meta["implicit_frees"] = implicit
    check_live_range(ops, fname)
    return Trace(name=name, source="pytorch-trace-csv", ops=ops, streams=streams, sites=[""], t_us=t_us,
                 skipped_frees=skipped, left_live=left_live, metadata=meta)


def pair_by_address(cols: dict):
    """Address-keyed events to dense ops, with the row-by-row reader's rules: an alloc takes the
    next dense id; a free of an address not live is skipped; an alloc of a live address first
    frees the old allocation (an implicit free, placed just before it).

    ``cols`` holds ``action`` (0 alloc, 1 free), ``addr``, ``size``, ``stream`` and ``t_us`` (or
    None); they are taken out of it so that each is released as soon as it is no longer needed.
    """
    act = cols.pop("action").astype(np.int8)
    addr = cols.pop("addr")
    n = act.shape[0]
    if n == 0:
        return np.zeros((0, 5), dtype=np.int64), None, [], 0, 0, 0
    order = np.lexsort((np.arange(n), addr))  # by address, then time
    same = np.zeros(n, dtype=bool)
    same[1:] = addr[order[1:]] == addr[order[:-1]]
    del addr
    g_act = act[order]
    prev_alloc = np.zeros(n, dtype=bool)  # the previous event at this address is an alloc
    prev_alloc[1:] = same[1:] & (g_act[:-1] == ALLOC)
    last = np.ones(n, dtype=bool)
    last[:-1] = ~same[1:]
    left_live = int(np.count_nonzero(last & (g_act == ALLOC)))
    skipped = int(np.count_nonzero((g_act == FREE) & ~prev_alloc))
    del same, last
    paired = np.flatnonzero(prev_alloc)
    partner = np.full(n, -1, dtype=np.int64)  # for a free or an alloc of a live address: the old alloc
    partner[order[paired]] = order[paired - 1]
    del order, g_act, prev_alloc, paired
    is_alloc = act == ALLOC
    del act
    a_pos = np.flatnonzero(is_alloc)
    dense = np.cumsum(is_alloc, dtype=np.int64) - 1  # an alloc's dense id, by record
    frees = np.flatnonzero(~is_alloc & (partner >= 0))
    imp = is_alloc & (partner >= 0)
    implicit = np.flatnonzero(imp)
    del is_alloc
    # streams numbered in order of first use by an allocation; per dense id
    stream = cols.pop("stream")
    uniq, first, inv = np.unique(stream[a_pos], return_index=True, return_inverse=True)
    del stream
    by_first = np.argsort(first, kind="stable")
    rank = np.empty(uniq.size, dtype=np.int64)
    rank[by_first] = np.arange(uniq.size)
    streams = [int(h) for h in uniq[by_first]]
    a_stream = rank[inv.reshape(-1)]
    del inv
    size = cols.pop("size")
    a_size = size[a_pos]
    del size
    # output rows in record order; an alloc that displaces a live one is preceded by its free
    cnt = np.zeros(n, dtype=np.int64)
    cnt[a_pos] = 1
    cnt[frees] = 1
    cnt[implicit] += 1
    start = np.cumsum(cnt) - cnt
    total = int(cnt.sum())
    del cnt
    ops = np.empty((total, 5), dtype=np.int64)
    ops[:, 4] = 0
    pos_a = start[a_pos] + imp[a_pos]
    del imp
    ops[pos_a, 0] = ALLOC
    ops[pos_a, 1] = np.arange(a_pos.size)
    ops[pos_a, 2] = a_size
    ops[pos_a, 3] = a_stream
    t_out = None
    t_us = cols.pop("t_us", None)
    if t_us is not None:
        t_out = np.empty(total, dtype=np.int64)
        t_out[pos_a] = t_us[a_pos]
    del pos_a
    for rec in (frees, implicit):
        pos = start[rec]
        ident = dense[partner[rec]]
        ops[pos, 0] = FREE
        ops[pos, 1] = ident
        ops[pos, 2] = a_size[ident]
        ops[pos, 3] = a_stream[ident]
        if t_out is not None:
            t_out[pos] = t_us[rec]
    return ops, t_out, streams, skipped, int(implicit.size), left_live
