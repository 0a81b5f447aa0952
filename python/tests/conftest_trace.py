"""Helpers for the trace and report tests (not a conftest: imported explicitly).

* :func:`import_vramkit_pure` imports ``vramkit.trace`` / ``vramkit.report`` even where the
  compiled extension is not built: these subpackages are pure Python by design, and their tests
  should not depend on the C++ build.
* :func:`shared_traces` finds the real traces through ``VRAMKIT_SHARED_TRACES``.
* :func:`packed_pages_model` and :func:`segment_per_alloc_model` compute honest, simple allocator
  models from a trace (no C++ needed) to feed the report.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import pathlib
import sys
import types
import warnings
from typing import Any

import numpy as np

PYTHON_DIR = pathlib.Path(__file__).resolve().parents[1]
REPO_DIR = PYTHON_DIR.parent
PAGE = 2 << 20
GRANULE = 512


def import_vramkit_pure() -> types.ModuleType:
    """Import ``vramkit`` far enough to reach its pure-Python subpackages.

    When ``vramkit/__init__.py`` cannot import (the compiled extension is not built here), a bare
    package object pointing at the source folder stands in for it.
    """
    # The installed package first: putting the source folder ahead of it would shadow its
    # compiled extension. The source folder only serves when nothing is installed.
    if importlib.util.find_spec("vramkit") is None and str(PYTHON_DIR) not in sys.path:
        sys.path.insert(0, str(PYTHON_DIR))
    try:
        importlib.import_module("vramkit")
        importlib.import_module("vramkit.trace")
        importlib.import_module("vramkit.report")
        return sys.modules["vramkit"]
    except ImportError as exc:
        warnings.warn(f"vramkit did not import ({exc}); testing its pure-Python subpackages alone")
        for name in [n for n in sys.modules if n == "vramkit" or n.startswith("vramkit.")]:
            del sys.modules[name]
        pkg = types.ModuleType("vramkit")
        pkg.__path__ = [str(PYTHON_DIR / "vramkit")]  # type: ignore[attr-defined]
        sys.modules["vramkit"] = pkg
        importlib.import_module("vramkit.trace")
        importlib.import_module("vramkit.report")
        return pkg


def shared_traces() -> pathlib.Path | None:
    """The folder of real traces named by ``VRAMKIT_SHARED_TRACES``, or None."""
    d = os.environ.get("VRAMKIT_SHARED_TRACES")
    if d and pathlib.Path(d).is_dir():
        return pathlib.Path(d)
    return None


def load_browser_check() -> types.ModuleType:
    """``tools/browser_check.py`` as a module."""
    path = REPO_DIR / "tools" / "browser_check.py"
    spec = importlib.util.spec_from_file_location("vramkit_browser_check", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _roundup(v: np.ndarray, k: int) -> np.ndarray:
    return -(-v // k) * k


def packed_pages_model(trace: Any) -> tuple[dict[str, Any], list[tuple[int, int, int]], dict[str, Any]]:
    """An ideal packer: blocks rounded to 512 B, packed with no holes, memory mapped in 2 MiB pages.

    Returns (result row, timeline, pool state at the peak). Reserved after each op is the packed
    block bytes rounded up to whole pages; the peak state is one segment holding the blocks live
    at the peak, back to back.
    """
    ops = trace.ops
    sign = np.where(ops[:, 0] == 0, 1, -1)
    live = np.cumsum(sign * ops[:, 2])
    blocks = np.cumsum(sign * _roundup(ops[:, 2], GRANULE))
    reserved = _roundup(blocks, PAGE)
    timeline = [(int(i), int(a), int(b)) for i, (a, b) in enumerate(zip(live.tolist(), reserved.tolist()))]
    peak_res = int(reserved.max()) if reserved.size else 0
    p = trace.peak_index()
    state_blocks, addr = [], 0
    for blk in sorted(trace.live_at(p), key=lambda b: b.alloc_op) if p >= 0 else []:
        size = int(_roundup(np.int64(blk.size), GRANULE))
        state_blocks.append({"addr": addr, "size": size, "requested": blk.size, "allocated": True})
        addr += size
    seg_size = int(_roundup(np.int64(max(addr, 1)), PAGE))
    if seg_size > addr:
        state_blocks.append({"addr": addr, "size": seg_size - addr, "requested": 0, "allocated": False})
    state = {"page_size": PAGE,
             "segments": [{"base": 0, "size": seg_size, "mapped_bytes": seg_size, "small": False,
                           "blocks": state_blocks}]}
    peak_live = trace.peak_live_bytes()
    result = {"trace": trace.name, "allocator": "ideal packing, 2 MiB pages (model)", "ops": len(trace),
              "peak_live_bytes": peak_live, "peak_reserved_bytes": peak_res,
              "fragmentation": peak_res / peak_live if peak_live else None,
              "cold_ns_per_op": None, "warm_ns_per_op": None, "ooms": 0, "upstream_allocs": None}
    return result, timeline, state


def segment_per_alloc_model(trace: Any) -> tuple[dict[str, Any], list[tuple[int, int, int]]]:
    """Every allocation in its own run of 2 MiB pages (what plain cudaMalloc does)."""
    ops = trace.ops
    sign = np.where(ops[:, 0] == 0, 1, -1)
    live = np.cumsum(sign * ops[:, 2])
    reserved = np.cumsum(sign * _roundup(np.maximum(ops[:, 2], 1), PAGE))
    step = max(1, len(trace) // 3000)  # a sampled timeline, as a replay engine may report
    idx = list(range(0, len(trace), step))
    if len(trace) and idx[-1] != len(trace) - 1:
        idx.append(len(trace) - 1)
    timeline = [(i, int(live[i]), int(reserved[i])) for i in idx]
    peak_live = trace.peak_live_bytes()
    peak_res = int(reserved.max()) if reserved.size else 0
    result = {"trace": trace.name, "allocator": "one segment per allocation (model)", "ops": len(trace),
              "peak_live_bytes": peak_live, "peak_reserved_bytes": peak_res,
              "fragmentation": peak_res / peak_live if peak_live else None,
              "cold_ns_per_op": None, "warm_ns_per_op": None, "ooms": 0,
              "upstream_allocs": trace.n_allocs}
    return result, timeline
