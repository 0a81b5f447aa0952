"""``vramkit smi``: GPU memory per device and per process, as a table, JSON or CSV, once or every N s.

Exit codes: 0 done, 1 an output error, 2 no driver (or an unusable ``VRAMKIT_FAKE_NVML`` file).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import io
import json
import os
import signal
import sys
from typing import Any

from . import NvmlUnavailableError, Snapshotter, format_size, open_monitor, unavailable_message
from .sampler import _to_csv, snapshot_rows, ticks

PROG = "vramkit smi"
DESCRIPTION = ("GPU memory per device (total, used, driver-reserved, free, utilization, temperature, power) and "
               "per process, from NVML. Without a driver set VRAMKIT_FAKE_NVML=FILE (JSON) for a simulated one.")


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (v > 0 and v < 1e7):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text}")
    return v


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {v}")
    return v


def _id_list(text: str) -> list[int]:
    try:
        ids = [int(x) for x in text.split(",") if x.strip() != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected GPU indices like 0 or 0,2, not {text!r}") from None
    if not ids or min(ids) < 0:
        raise argparse.ArgumentTypeError(f"expected GPU indices like 0 or 0,2, not {text!r}")
    return ids


def add_arguments(p: argparse.ArgumentParser) -> None:
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true",
                     help="JSON (one object; with --watch one object per line)")
    fmt.add_argument("--csv", action="store_true",
                     help="CSV with a timestamp column: one header, then rows per device and process per sample")
    p.add_argument("--watch", "-l", type=_positive_float, metavar="SECONDS",
                   help="repeat every SECONDS until interrupted (or --count samples)")
    p.add_argument("--count", "-c", type=_positive_int, metavar="N", help="stop after N samples")
    p.add_argument("--output", "-o", metavar="FILE", help="write to FILE instead of standard output")
    p.add_argument("--id", "-i", type=_id_list, metavar="GPU[,GPU...]", help="only these GPUs (NVML indices)")
    p.add_argument("--no-processes", action="store_true", help="skip the per-process lists")


# ---- formatting ----------------------------------------------------------------------------------

def _pct(v: Any) -> str:
    return "-" if v is None else f"{v}%"


def _table(snap: dict[str, Any]) -> str:
    when = _dt.datetime.fromtimestamp(snap["timestamp"]).strftime("%Y-%m-%d %H:%M:%S")
    lines = [f"{PROG}  {when}  driver {snap['driver_version'] or '?'} ({snap['backend']})  host {snap['hostname']}"]
    rows = [("GPU", "NAME", "TOTAL", "USED", "RESERVED", "FREE", "UTIL", "MEM-BW", "TEMP", "POWER")]
    for d in snap["devices"]:
        rows.append((
            str(d["index"]), d["name"] or "?", format_size(d["total_bytes"]), format_size(d["used_bytes"]),
            format_size(d["reserved_bytes"]), format_size(d["free_bytes"]), _pct(d["utilization_gpu"]),
            _pct(d["utilization_memory"]), "-" if d["temperature_c"] is None else f"{d['temperature_c']}C",
            "-" if d["power_w"] is None else f"{d['power_w']:.0f}W",
        ))
    lines += _columns(rows, right={0, 2, 3, 4, 5, 6, 7, 8, 9})
    if not snap["devices"]:
        lines.append("No GPU found.")
    procs = [(d["index"], p) for d in snap["devices"] for p in d.get("processes", ())]
    if any("processes" in d for d in snap["devices"]):
        lines.append("")
        if procs:
            procs.sort(key=lambda x: (x[0], -(x[1]["used_bytes"] or 0)))
            prow = [("GPU", "PID", "PROCESS", "USED")]
            prow += [(str(g), str(p["pid"]), p["name"] or "?", format_size(p["used_bytes"])) for g, p in procs]
            lines += _columns(prow, right={0, 1, 3})
        else:
            lines.append("No running processes found.")
    return "\n".join(lines) + "\n"


def _columns(rows: list[tuple[str, ...]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(r)]
        out.append("  ".join(cells).rstrip())
    return out


def _json(snap: dict[str, Any], pretty: bool) -> str:
    doc = dict(snap)
    doc["time"] = _dt.datetime.fromtimestamp(snap["timestamp"], _dt.timezone.utc).isoformat(timespec="milliseconds")
    if pretty:
        return json.dumps(doc, indent=2) + "\n"
    return json.dumps(doc, separators=(",", ":")) + "\n"


# ---- running -------------------------------------------------------------------------------------

def run(args: argparse.Namespace) -> int:
    """The ``vramkit smi`` command on parsed arguments (see :func:`add_arguments`)."""
    try:
        snapper = Snapshotter(open_monitor(), devices=args.id)
    except NvmlUnavailableError as e:
        print(f"{PROG}: {unavailable_message(e)}", file=sys.stderr)
        return 2
    except ValueError as e:  # a bad VRAMKIT_FAKE_NVML file
        print(f"{PROG}: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    if args.id:
        n = snapper.monitor.device_count()
        bad = [i for i in args.id if i >= n]
        if bad:
            print(f"{PROG}: no GPU {', '.join(map(str, bad))} ({snapper.backend} reports {n} GPU(s))", file=sys.stderr)
            return 2
    count = args.count if args.count is not None else (None if args.watch else 1)
    interval = args.watch or 1.0
    repeated = count != 1
    out: Any = sys.stdout
    # --output: the file appears whole when the command ends (--count reached, Ctrl-C or SIGTERM);
    # on a failure an existing file stays as it was and nothing is left behind.
    sink = None
    try:
        if args.output:
            from .._atomic import AtomicFile
            sink = AtomicFile(args.output)
            out = io.TextIOWrapper(sink.file, encoding="utf-8", newline="")
    except OSError as e:
        print(f"{PROG}: cannot write {args.output}: {e.strerror or e}", file=sys.stderr)
        return 1
    clear = repeated and not args.json and not args.csv and out is sys.stdout and sys.stdout.isatty()
    old_term = _sigterm_ends_watch() if sink is not None else None
    published = False
    try:
        try:
            for i in ticks(interval, count):
                snap = snapper.take(processes=not args.no_processes)
                if args.csv:
                    text = _to_csv(snapshot_rows(snap), header=i == 0)
                elif args.json:
                    text = _json(snap, pretty=not repeated)
                else:
                    text = _table(snap) + ("" if clear or not repeated else "\n")
                if clear:
                    text = "\033[H\033[2J" + text
                out.write(text)
                out.flush()
        except KeyboardInterrupt:
            pass  # the way to end --watch
        except BrokenPipeError:  # `vramkit smi --watch 1 | head`: the reader left; not an error
            if out is sys.stdout:
                # Python would report the failed flush at exit otherwise (see the signal module's docs).
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        except OSError as e:
            print(f"{PROG}: write failed: {e}", file=sys.stderr)
            return 1
        if sink is not None:
            try:
                out.flush()
                out.detach()  # the file is the sink's to close
                sink.commit()
                published = True
            except OSError as e:
                print(f"{PROG}: write failed: {e}", file=sys.stderr)
                return 1
        return 0
    finally:
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
        if sink is not None and not published:
            sink.abort()


def _sigterm_ends_watch():
    """SIGTERM ends a --watch like Ctrl-C (the recording is published); returns the handler it
    replaced, or None where none can be set (not the main thread)."""
    def stop(signum, frame):
        raise KeyboardInterrupt
    try:
        return signal.signal(signal.SIGTERM, stop)
    except ValueError:
        return None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION)
    add_arguments(p)
    return p


def smi_main(argv: list[str] | None = None) -> int:
    """``vramkit smi`` with ``argv`` (``sys.argv[1:]`` by default); returns the exit code."""
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(smi_main())
