"""Find leaks and memory bugs: allocations still alive after a block, call sites whose memory
grows every iteration, PyTorch-style memory snapshots.

Tracking wraps the device's current resource in a tracking adaptor that records every live
allocation with the Python line that made it (the first frame outside vramkit, PyTorch, CuPy and
Numba). A caching pool hides leaks from tools like compute-sanitizer (its blocks stay reserved),
so this table is the leak oracle.

>>> from vramkit.leaks import leak_check, watch
>>> with leak_check() as lc:
...     run_once()
>>> print(lc.report())
>>> print(watch(train_step, steps=10).report())

``VRAMKIT_LEAK_REPORT=1`` in the environment tracks from import on and prints what is still
alive at interpreter exit.
"""
from __future__ import annotations

import atexit
import gc
import os
import sys

from .. import _vramkit
from .._units import format_bytes
from . import _tracking
from .growth import GrowthDetector, GrowthVerdict, is_growing, watch
from .snapshot import dump_snapshot, snapshot

__all__ = ["LeakError", "leak_check", "GrowthDetector", "GrowthVerdict", "watch", "snapshot",
           "dump_snapshot", "install_from_env", "outstanding", "is_growing"]


class LeakError(RuntimeError):
    """Raised by ``leak_check(strict=True)`` when allocations made inside are still alive.

    ``leaks`` holds the same list as :attr:`leak_check.leaks`."""

    def __init__(self, message: str, leaks: list[dict] | None = None) -> None:
        super().__init__(message)
        self.leaks = leaks or []


class leak_check:
    """Context manager: which allocations made inside the block are still alive at its end?

    Parameters
    ----------
    strict : bool
        Raise :class:`LeakError` at the end of the block when something leaked (not when the
        block itself raised).
    device : int, optional
        The device to watch (default: the current one).
    collect : bool
        Run ``gc.collect()`` before looking, so that garbage cycles do not count (default True).

    After the block, :attr:`leaks` is a list of ``{"site": "file:line", "function", "count",
    "bytes", "ptrs"}``, most bytes first, and :meth:`report` says the same in words.
    Buffers allocated before the block are not looked at, and keep freeing normally.
    """

    def __init__(self, strict: bool = False, device=None, collect: bool = True) -> None:
        self.strict = strict
        self.device = device
        self.collect = collect
        self.leaks: list[dict] = []
        self._dev = None
        self._tracker = None
        self._mark = 0
        self._done = False

    def __enter__(self) -> "leak_check":
        self._dev, self._tracker = _tracking.acquire(self.device)
        self._mark = _vramkit.tracking_mark(self._tracker)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            if self.collect:
                gc.collect()
            live = _vramkit.tracked_live(self._tracker, self._mark)
            self.leaks = _tracking.group_by_site(live)
            self._done = True
        finally:
            _tracking.release(self._dev)
        if self.strict and self.leaks and exc_type is None:
            raise LeakError(self.report(), self.leaks)
        return False

    @property
    def leaked_bytes(self) -> int:
        return sum(g["bytes"] for g in self.leaks)

    @property
    def leaked_count(self) -> int:
        return sum(g["count"] for g in self.leaks)

    def __bool__(self) -> bool:  # truthy when something leaked
        return bool(self.leaks)

    def report(self, top: int = 20) -> str:
        if not self._done:
            return "vramkit leak check: still running"
        if not self.leaks:
            return "vramkit leak check: no allocation made inside the block is still alive"
        head = (f"vramkit leak check: {self.leaked_count} allocation(s), "
                f"{format_bytes(self.leaked_bytes)}, made inside the block are still alive, by call site:")
        return "\n".join([head] + _tracking.format_groups(self.leaks, top))


def outstanding(device=None) -> list[dict]:
    """Live tracked allocations of the device grouped by call site ([] when tracking is off)."""
    t = _tracking.active_tracker(device)
    if t is None:
        return []
    return _tracking.group_by_site(_vramkit.tracked_live(t, 0))


_env_installed = False


def _exit_report(dev: int, tracker) -> None:
    try:
        gc.collect()
        groups = _tracking.group_by_site(_vramkit.tracked_live(tracker, 0))
    except Exception:
        return
    if not groups:
        print("vramkit: no tracked allocation is alive at exit", file=sys.stderr)
        return
    n = sum(g["count"] for g in groups)
    b = sum(g["bytes"] for g in groups)
    lines = [f"vramkit: {n} allocation(s), {format_bytes(b)}, still alive at exit, by call site:"]
    lines += _tracking.format_groups(groups, top=50)
    print("\n".join(lines), file=sys.stderr)


def install_from_env() -> bool:
    """With ``VRAMKIT_LEAK_REPORT`` set (not ``0``), track the current device from now on and
    print the outstanding allocations by call site at interpreter exit. Idempotent."""
    global _env_installed
    if _env_installed or os.environ.get("VRAMKIT_LEAK_REPORT", "").strip() in ("", "0"):
        return _env_installed
    dev, tracker = _tracking.acquire(None)
    _env_installed = True
    atexit.register(_exit_report, dev, tracker)  # runs before vramkit's own runtime reset
    return True


install_from_env()


class GuardError(RuntimeError):
    """Raised by ``check_guards(strict=True)``: memory outside a block or after its free was written."""

    def __init__(self, message: str, violations: list[dict]) -> None:
        super().__init__(message)
        self.violations = violations


def check_guards(device=None, strict: bool = False) -> list[dict]:
    """Check the red zones and the quarantine of the device's guard adaptor.

    Install one first (a debug option, it costs two red zones per allocation)::

        r = vramkit._vramkit.guard_adaptor(vramkit.get_current_resource(), redzone=256)
        vramkit.set_current_resource(r)

    Returns one dict per violation (``ptr``, ``size``, ``where``: ``before`` / ``after`` /
    ``use_after_free``, ``offset`` from ``ptr``, ``site`` as ``file:line``, ``message``);
    ``strict=True`` raises :class:`GuardError` when there is any.
    """
    dev = _vramkit.to_device(device)
    r = _vramkit.current_resource(dev)
    if not _vramkit.is_guard(r):
        raise ValueError(f"check_guards: the current resource of device {dev} ({r.name}) has no guard adaptor")
    found = _vramkit.check_guards(r)
    names = _tracking.SiteNames()
    for v in found:
        v["site"] = names.key(v["site"]) if v["site"] else "<unknown>"
        v["message"] = v["message"].rsplit(", site ", 1)[0] + f", allocated at {v['site']}"
    if strict and found:
        raise GuardError("\n".join(v["message"] for v in found), found)
    return found


__all__ += ["GuardError", "check_guards"]
