"""Allocation traces: the model, importers (PyTorch, RMM, vramkit v1) and the v1 format.

Nothing here needs the compiled extension: ``import vramkit.trace`` works on any machine with
NumPy.
"""
from __future__ import annotations

import os

from .importers import (FORMATS, detect_format, load_trace, read_pytorch_snapshot,
                        read_pytorch_trace_csv, read_rmm_log, snapshot_to_trace,
                        trace_name_from_path)
from .model import ALLOC, FREE, LiveBlock, SizeHistogram, Trace, TraceBuilder
from .safe_pickle import UnsafePickleError
from .v1 import TraceWriter, V1Reader, iter_records, read_v1, write_v1

__all__ = [
    "ALLOC", "FREE", "FORMATS", "DEFAULT_TRACE_NAME", "LiveBlock", "SizeHistogram", "Trace",
    "TraceBuilder", "TraceWriter", "UnsafePickleError", "V1Reader", "default_trace_path",
    "detect_format", "iter_records", "load_trace", "read_pytorch_snapshot",
    "read_pytorch_trace_csv", "read_rmm_log", "read_v1", "snapshot_to_trace",
    "trace_name_from_path", "write_v1",
]

#: File name of the trace shipped inside the package (the default of replay and report).
DEFAULT_TRACE_NAME = "bert_dynamic_infer.trace.csv.gz"


def default_trace_path() -> str:
    """Path of the real trace shipped with the package (BERT-base inference, dynamic shapes)."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data",
                        DEFAULT_TRACE_NAME)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"the packaged default trace {DEFAULT_TRACE_NAME} is missing from "
                                "the installation (vramkit/data)")
    return path
