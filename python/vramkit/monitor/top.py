"""``vramkit top``: a live terminal view of GPU memory (curses).

One sample per interval (devices, then one process list per device); between samples the screen is only
redrawn on a key or a resize, so watching costs next to nothing. Keys: ``q`` quits, ``+``/``-`` change the
interval, ``p`` toggles the process list.
"""
from __future__ import annotations

import argparse
import collections
import datetime as _dt
import locale
import sys
import time
from typing import Any

from . import NvmlUnavailableError, Snapshotter, format_size, open_monitor, unavailable_message

PROG = "vramkit top"
DESCRIPTION = "A live view of GPU memory: devices with a history of used memory, processes by memory. q quits."
_HISTORY = 1024
_SPARK_UNICODE = "\u2581\u2582\u2583\u2584\u2585\u2586\u2587\u2588"
_SPARK_ASCII = "_.-:=+*#"


def _interval(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (0.1 <= v <= 3600):
        raise argparse.ArgumentTypeError(f"the interval must be between 0.1 and 3600 seconds, not {text}")
    return v


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--interval", "-d", type=_interval, default=1.0, metavar="SECONDS",
                   help="seconds between samples (default 1.0; at least 0.1)")
    p.add_argument("--no-processes", action="store_true", help="do not list processes")
    p.add_argument("--ascii", action="store_true", help="draw with ASCII only (no Unicode block characters)")


def sparkline(values: list[float], width: int, chars: str = _SPARK_UNICODE) -> str:
    """The last ``width`` values (fractions 0..1) as one character each."""
    out = []
    top = len(chars) - 1
    for v in list(values)[-width:] if width > 0 else []:
        v = 0.0 if v != v else min(1.0, max(0.0, v))
        out.append(chars[min(top, int(round(v * top)))])
    return "".join(out)


def bar(fraction: float, width: int, full: str = "\u2588", empty: str = "\u2591") -> str:
    n = int(round(min(1.0, max(0.0, fraction)) * width))
    return full * n + empty * (width - n)


def render_lines(snap: dict[str, Any], history: dict[int, collections.deque], width: int, *,
                 interval: float, unicode: bool = True, show_processes: bool = True) -> list[tuple[str, str]]:
    """The screen as (text, style) lines; style is "" / "title" / "head" / "warn". Kept free of curses so
    it can be tested and measured on its own."""
    width = max(20, width)
    spark = _SPARK_UNICODE if unicode else _SPARK_ASCII
    full, empty = ("\u2588", "\u2591") if unicode else ("#", ".")
    when = _dt.datetime.fromtimestamp(snap["timestamp"]).strftime("%H:%M:%S")
    lines = [(f"{PROG}  {snap['backend']} driver {snap['driver_version'] or '?'}  {snap['hostname']}  "
              f"every {interval:g} s  {when}  (q quit, +/- interval, p processes)", "title"), ("", "")]
    if not snap["devices"]:
        lines.append(("No GPU found.", "warn"))
    for d in snap["devices"]:
        total = d["total_bytes"] or 0
        used = d["used_bytes"] or 0
        frac = used / total if total else 0.0
        facts = [f"used {format_size(used)} / {format_size(total)} ({frac * 100:.0f}%)"]
        if d["reserved_bytes"] is not None:
            facts.append(f"reserved {format_size(d['reserved_bytes'])}")
        if d["utilization_gpu"] is not None:
            facts.append(f"util {d['utilization_gpu']}%")
        if d["temperature_c"] is not None:
            facts.append(f"{d['temperature_c']}C")
        if d["power_w"] is not None:
            facts.append(f"{d['power_w']:.0f} W")
        lines.append((f"GPU {d['index']}  {d['name']}  " + "  ".join(facts), "head"))
        bw = max(10, width - 12)
        lines.append((f"  mem  [{bar(frac, bw - 2, full, empty)}]", "warn" if frac >= 0.9 else ""))
        h = history.get(d["index"], ())
        lines.append((f"  hist  {sparkline(list(h), bw - 1, spark)}", ""))
        lines.append(("", ""))
    if show_processes:
        procs = [(d["index"], p) for d in snap["devices"] for p in d.get("processes", ())]
        procs.sort(key=lambda x: -(x[1]["used_bytes"] or 0))
        lines.append((f"{'GPU':>3}  {'PID':>8}  {'USED':>10}  PROCESS", "head"))
        if not procs:
            lines.append(("  no processes", ""))
        for g, p in procs:
            lines.append((f"{g:>3}  {p['pid']:>8}  {format_size(p['used_bytes']):>10}  {p['name'] or '?'}", ""))
    return lines


class _App:
    def __init__(self, snapper: Snapshotter, interval: float, show_processes: bool, unicode: bool):
        self.snapper = snapper
        self.interval = interval
        self.show_processes = show_processes
        self.unicode = unicode
        self.history: dict[int, collections.deque] = {}
        self.snap: dict[str, Any] | None = None

    def sample(self) -> None:
        self.snap = self.snapper.take(processes=self.show_processes)
        for d in self.snap["devices"]:
            total = d["total_bytes"] or 0
            self.history.setdefault(d["index"], collections.deque(maxlen=_HISTORY)).append(
                d["used_bytes"] / total if total else 0.0)

    def draw(self, scr, curses) -> None:
        rows, cols = scr.getmaxyx()
        scr.erase()
        styles = {"title": curses.A_REVERSE, "head": curses.A_BOLD, "warn": curses.A_BOLD, "": curses.A_NORMAL}
        lines = render_lines(self.snap, self.history, cols - 1, interval=self.interval, unicode=self.unicode,
                             show_processes=self.show_processes)
        for y, (text, style) in enumerate(lines[:rows]):
            try:  # the bottom-right cell cannot be written; a shrinking terminal can race us
                scr.addnstr(y, 0, text, max(0, cols - 1), styles.get(style, curses.A_NORMAL))
            except curses.error:
                pass
        if len(lines) > rows and rows > 0:
            try:
                scr.addnstr(rows - 1, 0, f"... {len(lines) - rows + 1} more line(s)", max(0, cols - 1))
            except curses.error:
                pass
        scr.refresh()

    def run(self, scr) -> None:
        import curses
        try:
            curses.curs_set(0)
        except curses.error:
            pass
        scr.keypad(True)
        next_sample = time.monotonic()
        while True:
            now = time.monotonic()
            if now >= next_sample:
                self.sample()
                next_sample = max(next_sample + self.interval, now + self.interval / 2)
                self.draw(scr, curses)
            scr.timeout(max(1, int((next_sample - time.monotonic()) * 1000)))
            ch = scr.getch()
            if ch in (ord("q"), ord("Q"), 27):
                return
            if ch in (ord("+"), ord("=")):
                self.interval = min(3600.0, self.interval * 2)
            elif ch in (ord("-"), ord("_")):
                self.interval = max(0.1, self.interval / 2)
            elif ch in (ord("p"), ord("P")):
                self.show_processes = not self.show_processes
            if ch != -1:
                self.draw(scr, curses)


def run(args: argparse.Namespace) -> int:
    """The ``vramkit top`` command on parsed arguments."""
    try:
        snapper = Snapshotter(open_monitor())
    except NvmlUnavailableError as e:
        print(f"{PROG}: {unavailable_message(e)}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"{PROG}: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        print(f"{PROG}: needs a terminal; for plain output use `vramkit smi --watch {args.interval:g}`",
              file=sys.stderr)
        return 2
    locale.setlocale(locale.LC_ALL, "")
    unicode = not args.ascii and "utf" in (locale.getpreferredencoding(False) or "").lower()
    import curses
    app = _App(snapper, args.interval, not args.no_processes, unicode)
    try:
        curses.wrapper(app.run)
    except KeyboardInterrupt:
        pass
    except curses.error as e:
        print(f"{PROG}: the terminal cannot be used ({e}); check $TERM", file=sys.stderr)
        return 2
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION)
    add_arguments(p)
    return p


def top_main(argv: list[str] | None = None) -> int:
    """``vramkit top`` with ``argv``; returns the exit code."""
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(top_main())
