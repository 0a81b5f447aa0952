"""GPU memory as the driver sees it: devices and processes through NVML.

The tools built on it:

* ``vramkit smi`` (:func:`smi_main`): a table, JSON or CSV of devices and processes, once or every N s;
* ``vramkit top`` (:func:`top_main`): a live terminal view with memory history;
* ``vramkit exporter`` (:func:`exporter_main`) and :func:`start_exporter`: Prometheus ``/metrics`` with
  DCGM-compatible device metrics, plus the allocator's own metrics when run inside a process;
* :class:`Sampler`, :func:`load_recording`, :func:`recording_section_html`: record memory over time to CSV
  and plot it.

NVML is loaded at run time; without a driver :func:`open_monitor` raises :class:`NvmlUnavailableError`.
Set ``VRAMKIT_FAKE_NVML=FILE`` (a JSON description of devices and processes, see ``docs/monitoring.md``) to
use a simulated driver instead.

>>> from vramkit.monitor import open_monitor
>>> m = open_monitor()                      # doctest: +SKIP
>>> [d["used_bytes"] for d in m.devices()]  # doctest: +SKIP
"""
from __future__ import annotations

import os
import socket
import time
from typing import Any

from .._units import format_bytes

__all__ = [
    "NvmlUnavailableError", "open_monitor", "snapshot", "Snapshotter", "process_name", "format_size",
    "unavailable_message", "smi_main", "top_main", "exporter_main", "start_exporter", "Exporter", "Sampler",
    "load_recording", "recording_section_html", "Recording",
]

NO_DRIVER_HINT = "set VRAMKIT_FAKE_NVML=FILE to use a simulated device"


def _native():
    from .. import _vramkit
    mod = getattr(_vramkit, "monitor", None)
    if mod is None:  # an extension built before the monitor existed
        raise ImportError("this build of vramkit has no monitor module (vramkit._vramkit.monitor)")
    return mod


try:
    NvmlUnavailableError = _native().NvmlUnavailableError
except ImportError:  # pragma: no cover - only with a stale extension
    class NvmlUnavailableError(RuntimeError):  # type: ignore[no-redef]
        """NVML (the NVIDIA driver's management library) cannot be used."""


def open_monitor(fake_json: str | None = None):
    """The NVML monitor, or the simulated one from ``fake_json`` / ``$VRAMKIT_FAKE_NVML``.

    Raises
    ------
    NvmlUnavailableError
        No NVIDIA driver (libnvidia-ml.so.1 cannot be loaded) or NVML fails to start.
    ValueError
        The fake JSON file cannot be read or is malformed.
    """
    if fake_json is None and os.environ.get("VRAMKIT_FAKE_NVML"):
        fake_json = os.environ["VRAMKIT_FAKE_NVML"]
    if fake_json is not None:
        from .fake import FakeMonitor
        return FakeMonitor(fake_json)
    try:
        native = _native()
    except ImportError as e:
        raise NvmlUnavailableError(str(e)) from None
    return native.open()


def unavailable_message(exc: BaseException) -> str:
    """One line saying why there is no monitor, for a tool's stderr."""
    text = " ".join(str(exc).split())
    if "libnvidia-ml.so.1 not found" in text:
        return f"no NVIDIA driver found (libnvidia-ml.so.1 could not be loaded); {NO_DRIVER_HINT}"
    return f"{text}; {NO_DRIVER_HINT}"


def process_name(pid: int) -> str:
    """The command name of ``pid`` from ``/proc/PID/comm``, or ``""`` when it cannot be read.

    NVML reports host PIDs: inside a container without ``--pid=host`` the name is unknown, or
    belongs to an unrelated process of the container that happens to have the same PID.
    """
    try:
        with open(f"/proc/{int(pid)}/comm", "rb") as f:
            return f.read(64).decode("utf-8", "replace").strip()
    except (OSError, ValueError):
        return ""


# The tools' columns use vramkit's one byte formatter ("10.00 GiB"; a dash for unknown).
format_size = format_bytes


class Snapshotter:
    """Takes snapshots of one monitor: devices, and each device's processes with their names.

    Everything a tool prints comes from one :meth:`take`, so process lists are read at most once per
    sample (they are the expensive NVML call and hold the driver's lock).
    """

    def __init__(self, monitor=None, devices: list[int] | None = None):
        self.monitor = monitor if monitor is not None else open_monitor()
        self.backend = self.monitor.backend_name()
        self.driver_version = self.monitor.driver_version()
        self.hostname = socket.gethostname()
        self.only = None if devices is None else set(int(d) for d in devices)

    def take(self, processes: bool = True) -> dict[str, Any]:
        """``{"timestamp", "hostname", "backend", "driver_version", "devices": [...]}``; each device dict
        (see :meth:`Monitor.devices`) gains ``"processes": [{"pid", "name", "used_bytes"}]``."""
        ts = time.time()
        devs = self.monitor.devices()
        if self.only is not None:
            devs = [d for d in devs if d["index"] in self.only]
        for d in devs:
            plist = self.monitor.processes(d["index"]) if processes else []
            for p in plist:
                if not p["name"]:
                    p["name"] = process_name(p["pid"])
            d["processes"] = plist
        return {"timestamp": ts, "hostname": self.hostname, "backend": self.backend,
                "driver_version": self.driver_version, "devices": devs}


def snapshot(monitor=None, processes: bool = True) -> dict[str, Any]:
    """One :meth:`Snapshotter.take` of ``monitor`` (NVML or the fake by default)."""
    return Snapshotter(monitor).take(processes)


_LAZY = {
    "smi_main": "smi", "top_main": "top", "exporter_main": "exporter", "start_exporter": "exporter",
    "Exporter": "exporter", "Sampler": "sampler", "load_recording": "sampler",
    "recording_section_html": "sampler", "Recording": "sampler",
}


def __getattr__(name: str):
    # The tools load on first use so `python -m vramkit.monitor.smi` and `import vramkit.monitor` stay light.
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'vramkit.monitor' has no attribute {name!r}")
    import importlib
    return getattr(importlib.import_module(f"{__name__}.{mod}"), name)
