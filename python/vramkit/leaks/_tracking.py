"""Installing the tracking adaptor as a device's current resource, shared by every leak tool."""
from __future__ import annotations

import importlib.util
import os
import threading

from .. import _vramkit
from .._units import format_bytes

_lock = threading.RLock()
# device -> [tracker, resource it replaced (None if we did not install it), users]
_installed: dict[int, list] = {}
_prefixes_set = False

_FRAMEWORKS = ("torch", "cupy", "cupy_backends", "numba", "cupyx", "functorch")


def _skip_prefixes() -> list[str]:
    """Directories whose frames are never a call site: vramkit's own and the frameworks'."""
    out = [os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep]
    for name in _FRAMEWORKS:
        try:
            spec = importlib.util.find_spec(name)  # finds without importing
        except (ImportError, ValueError):
            spec = None
        for loc in (spec.submodule_search_locations or []) if spec else []:
            out.append(os.path.join(os.path.abspath(loc), ""))
    return out


def _ensure_prefixes() -> None:
    global _prefixes_set
    if not _prefixes_set:
        _vramkit.set_site_skip_prefixes(_skip_prefixes())
        _prefixes_set = True


def acquire(device=None, python_stacks: bool = True):
    """Make sure ``device``'s current resource tracks allocations; returns ``(device, tracker)``.

    Every ``acquire`` needs one :func:`release`. The first one wraps the current resource; a
    current resource that already tracks (installed by the user) is used as it is.
    """
    _ensure_prefixes()
    dev = _vramkit.to_device(device)
    with _lock:
        entry = _installed.get(dev)
        cur = _vramkit.current_resource(dev)
        if entry is not None and entry[0] is not None and _vramkit.is_tracking(cur):
            entry[2] += 1
            return dev, cur
        if _vramkit.is_tracking(cur):
            _installed[dev] = [cur, None, 1]
            return dev, cur
        t = _vramkit.tracking_adaptor(cur, python_stacks)
        _vramkit.set_current_resource(t, dev)
        _installed[dev] = [t, cur, 1]
        return dev, t


def release(dev: int) -> None:
    """Undo one :func:`acquire`; the last one puts the replaced resource back.

    Buffers allocated while tracking was on keep the tracker (and free through it)."""
    with _lock:
        entry = _installed.get(dev)
        if entry is None:
            return
        entry[2] -= 1
        if entry[2] > 0:
            return
        del _installed[dev]
        t, prev, _ = entry
        if prev is not None:
            try:
                if _vramkit.current_resource(dev) is t or _vramkit.is_tracking(_vramkit.current_resource(dev)):
                    _vramkit.set_current_resource(prev, dev)
            except Exception:  # interpreter teardown: nothing left to restore
                pass


def active_tracker(device=None):
    """The tracking adaptor serving ``device`` now, or None."""
    dev = _vramkit.to_device(device)
    cur = _vramkit.current_resource(dev)
    return cur if _vramkit.is_tracking(cur) else None


class SiteNames:
    """Site id -> ``file:line`` and ``(filename, line, function)``, read once per report."""

    def __init__(self) -> None:
        self.frames = _vramkit.site_frames()

    def key(self, site: int) -> str:
        if 0 < site < len(self.frames):
            f, line, _ = self.frames[site]
            return f"{f}:{line}"
        return "<unknown>"

    def function(self, site: int) -> str:
        return self.frames[site][2] if 0 < site < len(self.frames) else ""

    def frame_list(self, site: int) -> list[dict]:
        if 0 < site < len(self.frames):
            f, line, name = self.frames[site]
            return [{"filename": f, "line": int(line), "name": name}]
        return []


def group_by_site(live: list[dict], names: SiteNames | None = None) -> list[dict]:
    """Live allocations grouped by call site, most bytes first."""
    names = names or SiteNames()
    groups: dict[str, dict] = {}
    for a in live:
        k = names.key(a["site"])
        g = groups.get(k)
        if g is None:
            g = groups[k] = {"site": k, "function": names.function(a["site"]), "count": 0, "bytes": 0,
                             "ptrs": []}
        g["count"] += 1
        g["bytes"] += a["size"]
        g["ptrs"].append(a["ptr"])
    return sorted(groups.values(), key=lambda g: (-g["bytes"], g["site"]))


def format_groups(groups: list[dict], top: int = 20) -> list[str]:
    fb = format_bytes
    lines = []
    for g in groups[:top]:
        fn = f" ({g['function']})" if g.get("function") else ""
        lines.append(f"  {g['count']:6d} x {fb(g['bytes']):>11s}  {g['site']}{fn}")
    if len(groups) > top:
        rest = groups[top:]
        lines.append(f"  ... {len(rest)} more sites, {sum(g['count'] for g in rest)} allocations, "
                     f"{fb(sum(g['bytes'] for g in rest))}")
    return lines
