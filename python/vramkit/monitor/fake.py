"""A simulated driver for the monitoring tools: devices and processes from a JSON file.

It stands in for NVML in tests and on machines without a GPU (``VRAMKIT_FAKE_NVML=FILE`` or the
``fake_json`` argument of :func:`vramkit.monitor.open_monitor`). It lives here, in Python, rather
than in the C++ library, which only ever talks to the real driver. A document looks like::

    {"driver_version": "550.54.15",
     "devices": [{"name": "NVIDIA H200", "uuid": "GPU-0", "pci_bus_id": "00000000:19:00.0",
                  "total_bytes": 150754820096, "used_bytes": 1073741824, "reserved_bytes": 597688320,
                  "utilization_gpu": 35, "utilization_memory": 12, "temperature_c": 41, "power_w": 120.5,
                  "processes": [{"pid": 4242, "used_bytes": 1073741824, "name": "python3"}]}]}

``free_bytes`` defaults to ``total - used - reserved``. The file is read again when it changes
(a test moves memory over time); a file caught half-written keeps the last good state.
"""
from __future__ import annotations

import json
import os
import threading
from typing import Any

_MAX_FILE = 16 << 20
_U32 = (1 << 32) - 1
_U64 = (1 << 64) - 1


def _uint(o: dict, key: str, where: str, limit: int = _U64) -> int | None:
    v = o.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{where}.{key} must be a non-negative integer")
    if v > limit:
        raise ValueError(f"{where}.{key} is too large")
    return v


def _real(o: dict, key: str, where: str) -> float | None:
    v = o.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
        raise ValueError(f"{where}.{key} must be a number >= 0")
    return float(v)


def _text(o: dict, key: str, where: str, fallback: str) -> str:
    v = o.get(key)
    if v is None:
        return fallback
    if not isinstance(v, str):
        raise ValueError(f"{where}.{key} must be a string")
    return v


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse(text: str) -> tuple[str, list[tuple[dict, list[dict]]]]:
    """``(driver_version, [(device dict, process dicts), ...])`` of a document; ValueError if bad."""
    try:
        doc = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"invalid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    if not isinstance(doc, dict):
        raise ValueError('the document must be a JSON object with a "devices" list')
    driver = _text(doc, "driver_version", "", "fake")
    devs = doc.get("devices")
    if not isinstance(devs, list):
        raise ValueError('"devices" must be a list')
    out = []
    for i, d in enumerate(devs):
        where = f"devices[{i}]"
        if not isinstance(d, dict):
            raise ValueError(f"{where} must be an object")
        total = _uint(d, "total_bytes", where)
        if total is None:
            raise ValueError(f"{where}.total_bytes is required")
        used = _uint(d, "used_bytes", where) or 0
        reserved = _uint(d, "reserved_bytes", where)
        if used > total or (reserved or 0) > total - used:
            raise ValueError(f"{where}: used_bytes + reserved_bytes exceeds total_bytes")
        free = _uint(d, "free_bytes", where)
        free = total - used - (reserved or 0) if free is None else free
        if free > total:
            raise ValueError(f"{where}.free_bytes exceeds total_bytes")
        sample = {
            "index": i, "name": _text(d, "name", where, f"Fake GPU {i}"),
            "uuid": _text(d, "uuid", where, f"GPU-fake-{i}"),
            "pci_bus_id": _text(d, "pci_bus_id", where, f"00000000:{(i + 1) & 0xFF:02X}:00.0"),
            "total_bytes": total, "used_bytes": used, "free_bytes": free, "reserved_bytes": reserved,
            "utilization_gpu": _uint(d, "utilization_gpu", where, _U32),
            "utilization_memory": _uint(d, "utilization_memory", where, _U32),
            "temperature_c": _uint(d, "temperature_c", where, _U32), "power_w": _real(d, "power_w", where),
        }
        procs = d.get("processes", [])
        if not isinstance(procs, list):
            raise ValueError(f"{where}.processes must be a list")
        plist = []
        for j, p in enumerate(procs):
            pw = f"{where}.processes[{j}]"
            if not isinstance(p, dict):
                raise ValueError(f"{pw} must be an object")
            pid = _uint(p, "pid", pw, _U32)
            if not pid:
                raise ValueError(f"{pw}.pid must be a positive integer")
            plist.append({"pid": pid, "used_bytes": _uint(p, "used_bytes", pw), "name": _text(p, "name", pw, "")})
        out.append((sample, plist))
    return driver, out


def _stamp(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_FILE + 1)
    except OSError as e:
        raise ValueError(f"cannot read fake NVML file '{path}': {e.strerror or e}") from None
    if len(data) > _MAX_FILE:
        raise ValueError(f"fake NVML file '{path}' is larger than 16 MiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"fake NVML file '{path}': not UTF-8 ({e.reason})") from None


class FakeMonitor:
    """The methods of :class:`vramkit._vramkit.monitor.Monitor`, over a JSON file; thread-safe."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._lock = threading.Lock()
        self._stamp = _stamp(self.path)
        try:
            self._driver, self._devices = parse(_read(self.path))
        except ValueError as e:
            raise ValueError(str(e) if str(e).startswith(("cannot read", "fake NVML"))
                             else f"fake NVML file '{self.path}': {e}") from None

    def _reload_if_changed(self) -> None:
        stamp = _stamp(self.path)
        if stamp is None or stamp == self._stamp:
            return  # a vanished file keeps the last state
        try:
            self._driver, self._devices = parse(_read(self.path))
            self._stamp = stamp
        except ValueError:
            pass  # caught half-written: look again next time

    def _state(self) -> tuple[str, list[tuple[dict, list[dict]]]]:
        with self._lock:
            self._reload_if_changed()
            return self._driver, self._devices

    def _one(self, index: int) -> tuple[dict, list[dict]]:
        devs = self._state()[1]
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(devs):
            raise ValueError(f"unknown device {index} (the fake has {len(devs)} device(s))")
        return devs[index]

    def backend_name(self) -> str:
        return "fake"

    def driver_version(self) -> str:
        return self._state()[0]

    def device_count(self) -> int:
        return len(self._state()[1])

    def device(self, index: int) -> dict:
        return dict(self._one(index)[0])

    def devices(self) -> list[dict]:
        return [dict(s) for s, _ in self._state()[1]]  # one state of the file for all devices

    def processes(self, index: int) -> list[dict]:
        plist = [dict(p) for p in self._one(index)[1]]
        plist.sort(key=lambda p: -(p["used_bytes"] or 0))  # stable: largest first
        return plist

    def __repr__(self) -> str:
        return "<vramkit.monitor.Monitor fake>"
