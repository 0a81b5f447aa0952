"""How much one import may expand to, so that a small hostile file cannot take the machine's memory.

A 3 MB gzip can hold gigabytes of zeros, and a 20 MB pickle millions of references to one event;
both are refused once they pass these bounds, with a message that says how to raise them:
``--max-import-bytes`` / ``--max-import-events`` on the command line, or the environment variables
``VRAMKIT_MAX_IMPORT_BYTES`` / ``VRAMKIT_MAX_IMPORT_EVENTS``.
"""
from __future__ import annotations

import os
import re

#: Decompressed bytes one trace file may hold (a real 200k-op snapshot is ~20 MiB).
DEFAULT_MAX_BYTES = 1 << 30
#: Allocation events one trace may hold when each becomes Python objects (pickles, row readers;
#: real training traces: ~10^5 to 10^6).
DEFAULT_MAX_EVENTS = 5_000_000
#: ... and when it is read into columns (vramkit's v1 format, long PyTorch CSVs): ~40 bytes each.
DEFAULT_MAX_COLUMNAR_EVENTS = 40_000_000

_override: dict[str, int] = {}
_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


def parse_count(text: str, what: str, units: bool) -> int:
    """A positive whole number, with a binary/decimal unit when ``units``; ValueError naming ``what``."""
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", str(text))
    unit = m.group(2).lower() if m else ""
    if not m or (unit and not units) or unit not in _UNITS:
        kind = "a whole number of bytes (e.g. 4GiB)" if units else "a whole number"
        raise ValueError(f"{what}: {text!r} is not {kind}")
    value = int(m.group(1)) * _UNITS[unit]
    if value <= 0:
        raise ValueError(f"{what}: must be positive, not {text!r}")
    return value


def set_limits(max_bytes: str | int | None = None, max_events: str | int | None = None) -> None:
    """Override the bounds for this process (the command line's flags)."""
    if max_bytes is not None:
        _override["bytes"] = parse_count(str(max_bytes), "--max-import-bytes", True)
    if max_events is not None:
        _override["events"] = parse_count(str(max_events), "--max-import-events", False)


def max_bytes() -> int:
    if "bytes" in _override:
        return _override["bytes"]
    env = os.environ.get("VRAMKIT_MAX_IMPORT_BYTES")
    return parse_count(env, "VRAMKIT_MAX_IMPORT_BYTES", True) if env else DEFAULT_MAX_BYTES


def max_events(columnar: bool = False) -> int:
    """The bound in force: the flag's, else the environment's, else the default of the reader
    (``columnar``: one that keeps events in arrays, not objects)."""
    if "events" in _override:
        return _override["events"]
    env = os.environ.get("VRAMKIT_MAX_IMPORT_EVENTS")
    if env:
        return parse_count(env, "VRAMKIT_MAX_IMPORT_EVENTS", False)
    return DEFAULT_MAX_COLUMNAR_EVENTS if columnar else DEFAULT_MAX_EVENTS


def too_many_bytes(name: str, limit: int) -> ValueError:
    return ValueError(f"{name}: expands to more than {limit} bytes; if the trace is real, raise the bound "
                      "with --max-import-bytes SIZE or VRAMKIT_MAX_IMPORT_BYTES")


def too_many_events(name: str, limit: int) -> ValueError:
    return ValueError(f"{name}: holds more than {limit} events; if the trace is real, raise the bound "
                      "with --max-import-events N or VRAMKIT_MAX_IMPORT_EVENTS")


def check_regular_file(path: str | os.PathLike[str]) -> None:
    """Refuse what cannot be read twice (FIFOs, pipes, terminals) before opening it: opening a FIFO
    with no writer blocks forever, and format detection reads the start of the file once more."""
    p = os.fspath(path)
    st = os.stat(p)  # FileNotFoundError / PermissionError go to the caller as they are
    import stat as _stat
    if _stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(21, "Is a directory", p)
    if not _stat.S_ISREG(st.st_mode):
        kind = "a FIFO or pipe" if _stat.S_ISFIFO(st.st_mode) else "not a regular file"
        raise ValueError(f"{p}: is {kind}; vramkit reads a trace from a regular file (save the stream "
                         "first, e.g. zcat trace.csv.gz > trace.csv)")
