"""vramkit: GPU memory (VRAM) management.

A low-fragmentation caching allocator with explicit device buffers and the
statistics ``torch.cuda`` users know, plus traces, replay, reports, leak
detection and monitoring. On a machine without a GPU everything runs on a
simulated device in host memory (the ``host`` backend).

>>> import vramkit
>>> buf = vramkit.alloc(1 << 20)
>>> vramkit.memory_allocated()
1048576
>>> buf.free()
"""
from __future__ import annotations

import atexit
import sys as _sys

from . import _vramkit
from ._units import format_bytes
from ._vramkit import DeviceBuffer, Resource, OutOfMemoryError, parse_size
from ._version import __version__

# The per-device current resources live in C++ globals and may hold Python-made
# resources; drop them before the interpreter tears the module down.
atexit.register(_vramkit.reset_runtime)

import os as _os  # noqa: E402

if _os.environ.get("VRAMKIT_LEAK_REPORT", "").strip() not in ("", "0"):
    from .leaks import install_from_env as _install_leaks
    _install_leaks()

__all__ = [
    "DeviceBuffer", "Resource", "OutOfMemoryError", "alloc", "memory_allocated", "memory_reserved",
    "max_memory_allocated", "max_memory_reserved", "reset_peak_memory_stats", "memory_stats",
    "memory_summary", "empty_cache", "mem_get_info", "peer_devices", "set_per_process_memory_fraction",
    "get_memory_info", "device_info", "set_current_resource", "get_current_resource", "make_resource",
    "mark_step", "backend", "device_count", "info", "format_bytes", "parse_size", "LeakError",
]


def alloc(nbytes: int, stream=None, device=None) -> DeviceBuffer:
    """Allocate ``nbytes`` of device memory from the device's current resource.

    Parameters
    ----------
    nbytes : int
        Size in bytes. 0 gives an empty buffer (``ptr == 0``) that takes no memory.
    stream : int or stream object, optional
        The ``cudaStream_t`` (or a torch/cupy/numba stream) the memory is used on.
    device : int, optional
        Device index; the current device by default.

    Raises
    ------
    ValueError
        ``nbytes`` is negative or not an integer, or the device is unknown.
    OutOfMemoryError
        The device cannot hold it even after the cache is released.
    """
    if type(nbytes) is not int:
        if isinstance(nbytes, bool) or not hasattr(nbytes, "__index__"):
            raise ValueError(f"nbytes must be an integer, not {type(nbytes).__name__}")
        nbytes = int(nbytes.__index__())
    if nbytes < 0:
        raise ValueError(f"nbytes must not be negative (got {nbytes})")
    return _vramkit.alloc(nbytes, stream, device)


def backend() -> str:
    """``"cuda"`` when a GPU serves vramkit, ``"host"`` for the simulated device."""
    return _vramkit.backend()


def device_count() -> int:
    return _vramkit.device_count()


def get_current_resource(device=None) -> Resource:
    """The resource ``alloc`` and the framework integrations allocate from."""
    return _vramkit.current_resource(device)


def set_current_resource(resource: Resource, device=None) -> None:
    """Make ``resource`` the device's current resource (buffers already handed out keep theirs)."""
    if not isinstance(resource, Resource):
        raise ValueError(f"expected a vramkit.Resource, not {type(resource).__name__}")
    _vramkit.set_current_resource(resource, device)


def make_resource(spec: str = "vramkit", device=None) -> Resource:
    """Build an allocator from a spec such as ``"vramkit"``, ``"pool:growth_slack:0.05"``,
    ``"pool:upstream=cuda"``, ``"host"``, ``"vmm"``, ``"cuda"``, ``"cuda_async"``, for ``device``
    (an index or a ``torch.device``; default: the current device, as ``set_current_resource``)."""
    return _vramkit.make_resource(spec, device)


def mark_step(device=None) -> None:
    """A step of the program begins (call it at the top of each training or serving step).

    With the pool option ``plan_steps`` the pool records a step's large requests, lays them out
    once, and places the same requests of later steps at the same addresses: no page moves once
    the plan is in force. Without it, or on an allocator other than vramkit's pool, nothing happens.
    """
    _manual_marks[0] = True  # vramkit.torch's marks at optimizer steps give way to the program's own
    marks_from_torch = _sys.modules.get("vramkit.torch")
    if marks_from_torch is not None:
        marks_from_torch._manual_mark_seen()
    _vramkit.current_resource(device).mark_step()


# Whether the program marks its steps itself (vramkit.mark_step or vramkit.torch.mark_step).
_manual_marks = [False]


def _stats(device=None) -> dict:
    r = _vramkit.current_resource(device)
    s = r.statistics()
    if s is None:  # a user-set resource without a statistics adaptor
        st = r.state()
        s = {
            "allocated_bytes.all.current": st["live_bytes"], "allocated_bytes.all.peak": st["peak_live_bytes"],
            "reserved_bytes.all.current": st["reserved_bytes"],
            "reserved_bytes.all.peak": max(st["peak_reserved_bytes"], st["reserved_bytes"]),
        }
    return s


def memory_allocated(device=None) -> int:
    """Bytes currently allocated (requested sizes of live allocations)."""
    return _stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device=None) -> int:
    return _stats(device)["allocated_bytes.all.peak"]


def memory_reserved(device=None) -> int:
    """Bytes the allocator holds from the device (allocated plus cached)."""
    return _stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device=None) -> int:
    return _stats(device)["reserved_bytes.all.peak"]


def reset_peak_memory_stats(device=None) -> None:
    _vramkit.current_resource(device).reset_peaks()


def memory_stats(device=None) -> dict:
    """A flat dict with ``torch.cuda.memory_stats()`` key names (``allocated_bytes.all.current``, ...)
    plus vramkit's own (``fragmentation``, ``largest_free_bytes``, ``pool.pages_remapped``, ...)."""
    r = _vramkit.current_resource(device)
    s = dict(_stats(device))
    st = r.state()
    s["cached_bytes"] = st["cached_bytes"]
    s["pending_free_bytes"] = st["pending_free_bytes"]
    c = r.pool_counters()
    if c:
        for k, v in c.items():
            if k != "options":
                s["pool." + k] = v
    return dict(sorted(s.items()))


def empty_cache(device=None) -> None:
    """Return cached memory to the device; live allocations are untouched."""
    _vramkit.current_resource(device).release_cached()


def peer_devices(device=None) -> list[int]:
    """The other GPUs whose kernels may read and write this device's pool memory.

    vramkit's pages are mapped with read/write access for every peer that
    ``cudaDeviceCanAccessPeer`` allows (so that NCCL's peer-to-peer paths and
    ``cudaMemcpyPeer`` work on them), unless ``VRAMKIT_PEER_ACCESS=off``. Empty on one GPU
    and on the simulated device.
    """
    return list(_vramkit.peer_devices(device))


def mem_get_info(device=None) -> tuple[int, int]:
    """``(free, total)`` bytes of the device, as ``cudaMemGetInfo`` reports them."""
    return _vramkit.mem_get_info(device)


def set_per_process_memory_fraction(fraction: float, device=None) -> None:
    """Cap the memory this process's allocator may reserve at ``fraction`` of the device."""
    import numbers
    if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real):
        raise ValueError(f"fraction must be a number, not {fraction!r}")
    fraction = float(fraction)
    if not (0.0 < fraction <= 1.0):
        raise ValueError(f"fraction must be in (0, 1], not {fraction}")
    r = _vramkit.current_resource(device)
    total = _vramkit.mem_get_info(device)[1]
    limit = int(total * fraction)
    if limit < 1:  # a limit of 0 means "no limit" to the pool
        raise ValueError(f"fraction {fraction} of {total} bytes is less than one byte")
    r.set_reserve_limit(limit)


def get_memory_info(device=None) -> dict:
    """TensorFlow's ``{'current': bytes, 'peak': bytes}`` of allocated memory."""
    s = _stats(device)
    return {"current": s["allocated_bytes.all.current"], "peak": s["allocated_bytes.all.peak"]}


def device_info(device=None) -> dict:
    """The memory hierarchy of the device (simulated values on the host backend)."""
    return _vramkit.device_properties(device)


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """A readable table of the allocator's state, in the spirit of ``torch.cuda.memory_summary``."""
    from ._summary import memory_summary as _ms
    return _ms(device, abbreviated)


def info() -> str:
    """What ``vramkit info`` prints: backend, devices and their memory hierarchy."""
    from ._summary import info_text
    return info_text()


def __getattr__(name):
    # Framework integrations and tools load lazily: importing vramkit never imports a framework.
    import importlib
    if name in ("LeakError", "GuardError"):
        return getattr(importlib.import_module("vramkit.leaks"), name)
    if name in ("torch", "cupy", "numba", "trace", "report", "leaks", "monitor", "cli"):
        return importlib.import_module(f"vramkit.{name}")
    raise AttributeError(f"module 'vramkit' has no attribute {name!r}")
