"""vramkit as CuPy's device memory allocator.

>>> import vramkit.cupy, cupy
>>> vramkit.cupy.use()
>>> a = cupy.arange(1 << 20)          # memory from vramkit's pool
>>> vramkit.cupy.unuse()              # back to the allocator CuPy had before

Each allocation is a :class:`vramkit.DeviceBuffer` from the device's current resource,
allocated on CuPy's current stream and wrapped in ``cupy.cuda.UnownedMemory`` that keeps the
buffer alive; when CuPy drops the memory, the buffer dies and the memory goes back to vramkit
(on the stream it was allocated on). CuPy can switch allocators at any time: memory allocated
before ``use()`` stays with CuPy's own pool, and memory allocated through vramkit stays valid
after ``unuse()``.

This module imports cupy inside its functions only.
"""
from __future__ import annotations

import contextlib
import threading

from . import _vramkit

__all__ = ["use", "unuse", "is_active", "using", "allocator", "record_stream"]

_lock = threading.Lock()
_previous: list = []  # the allocator use() replaced, restored by unuse()


def _import_cupy():
    try:
        import cupy
    except ImportError as e:
        raise ImportError("vramkit.cupy needs CuPy (pip install cupy-cuda12x or cupy-cuda13x)") from e
    return cupy


def allocator(size: int):
    """The CuPy allocator function: ``size`` bytes on CuPy's current device and stream."""
    import cupy
    device = cupy.cuda.runtime.getDevice()
    stream = cupy.cuda.get_current_stream().ptr
    buf = _vramkit.alloc(size, stream, device)
    mem = cupy.cuda.UnownedMemory(buf.ptr, size, buf, device)
    return cupy.cuda.MemoryPointer(mem, 0)


def _require_gpu() -> None:
    if _vramkit.backend() != "cuda":
        raise RuntimeError(
            "vramkit.cupy.use() needs a CUDA GPU, but vramkit runs on its simulated host device "
            f"({_vramkit.cuda_unavailable_reason() or 'VRAMKIT_BACKEND=host is set'})")


def use() -> None:
    """Route CuPy's device allocations through vramkit (all threads that have no
    ``cupy.cuda.using_allocator`` of their own). Calling it again does nothing."""
    cupy = _import_cupy()
    _require_gpu()
    with _lock:
        current = cupy.cuda.get_allocator()
        if current is allocator:
            return
        _previous[:] = [current]
        cupy.cuda.set_allocator(allocator)


def unuse() -> None:
    """Give CuPy back the allocator it had before :func:`use` (its default memory pool)."""
    cupy = _import_cupy()
    with _lock:
        if cupy.cuda.get_allocator() is not allocator:
            return
        prev = _previous[0] if _previous else cupy.get_default_memory_pool().malloc
        _previous.clear()
        cupy.cuda.set_allocator(prev)


def is_active() -> bool:
    """Whether CuPy's (global) allocator is vramkit's."""
    try:
        import cupy
    except ImportError:
        return False
    return cupy.cuda.get_allocator() is allocator


@contextlib.contextmanager
def using():
    """Use vramkit for CuPy allocations in this thread inside a ``with`` block."""
    cupy = _import_cupy()
    _require_gpu()
    with cupy.cuda.using_allocator(allocator):
        yield


def record_stream(array, stream) -> None:
    """Mark a CuPy array's vramkit memory as used on ``stream`` (a ``cupy.cuda.Stream``
    or a ``cudaStream_t``): after the array is freed, the memory is not reused by other
    streams until the work queued on ``stream`` has finished."""
    mem = array.data.mem
    owner = getattr(mem, "_owner", None) or getattr(mem, "owner", None)
    if isinstance(owner, _vramkit.DeviceBuffer):
        owner.record_stream(stream)
        return
    _vramkit.current_resource(mem.device_id).record_stream(mem.ptr, stream)
