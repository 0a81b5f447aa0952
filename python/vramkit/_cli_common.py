"""What every ``vramkit`` subcommand shares: the one-line error and loading a trace.

Its own module so that the subcommands kept elsewhere (``vramkit.leaks.cli``) need not import
``vramkit.cli``, which imports them.
"""
from __future__ import annotations


class CliError(Exception):
    """A user-facing error: printed as one line, exit code 1."""


def _load(path: str | None):
    from .trace import default_trace_path, load_trace
    p = path or default_trace_path()
    try:
        trace = load_trace(p)
    except FileNotFoundError:
        raise CliError(f"no such trace file: {p}") from None
    except IsADirectoryError:
        raise CliError(f"{p} is a directory, not a trace file") from None
    except OSError as e:  # PermissionError and the like: the file named, no traceback
        raise CliError(f"cannot read {p}: {e.strerror or e}") from None
    except ValueError as e:
        raise CliError(str(e)) from None
    if trace.n_allocs == 0:
        raise CliError(f"{p}: the trace holds no allocation")
    return trace


def _parse_capacity(text: str | None) -> int | None:
    if text is None:
        return None
    from . import _vramkit
    try:
        cap = _vramkit.parse_size(text)
    except ValueError as e:
        raise CliError(f"--capacity: {e}") from None
    if cap < (2 << 20):
        raise CliError(f"--capacity {text} is impossible: a device needs at least one 2 MiB page")
    if cap > (1 << 47):
        raise CliError(f"--capacity {text} is impossible: more than 128 TiB cannot be simulated")
    return cap


def add_import_limit_args(s) -> None:
    """--max-import-bytes / --max-import-events: see vramkit.trace.limits."""
    s.add_argument("--max-import-bytes", metavar="SIZE",
                   help="refuse a trace that expands to more (default 1GiB; env VRAMKIT_MAX_IMPORT_BYTES)")
    s.add_argument("--max-import-events", metavar="N",
                   help="refuse a trace with more events (default 5000000, or 40000000 for vramkit v1 files and long "
                        "PyTorch CSVs, read into arrays; env VRAMKIT_MAX_IMPORT_EVENTS)")
