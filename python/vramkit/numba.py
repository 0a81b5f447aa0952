"""vramkit as Numba's device memory manager (an EMM plugin).

Two ways to turn it on, both before Numba creates a CUDA context:

* ``NUMBA_CUDA_MEMORY_MANAGER=vramkit.numba python prog.py`` (Numba imports this module and
  takes its ``_numba_memory_manager``), or
* ``vramkit.numba.use()`` at the start of the program.

Device arrays (``cuda.device_array``, ``cuda.to_device``, ...) then live in
:class:`vramkit.DeviceBuffer` objects from the device's current resource; when Numba drops
an array, its buffer goes back to vramkit's pool at once. Host (pinned/mapped) memory stays
with Numba (the plugin derives from ``numba.cuda.HostOnlyCUDAMemoryManager``).

* The EMM interface has no stream argument: device memory is allocated on the default
  stream (0). Arrays used on other streams must be ordered by the user (``stream.synchronize()``
  or events), or marked with ``DeviceBuffer.record_stream``.
* ``numba.cuda.defer_cleanup()`` defers Numba's host-side cleanup only; vramkit's frees are
  cheap pool operations (no device synchronization), so device frees are not deferred.
* ``get_memory_info()`` reports the device's free memory plus what vramkit holds cached
  (both can be handed to Numba), and the device's total.

Importing this module does not import numba; the plugin class is built on first access to
``VramkitNumbaMemoryManager`` / ``_numba_memory_manager``, which raises ImportError with a
clear message if numba-cuda is not installed.
"""
from __future__ import annotations

import contextlib
import ctypes
import inspect
import itertools
import threading

from . import _vramkit

__all__ = ["use", "is_active"]  # and VramkitNumbaMemoryManager, built on first access

_lock = threading.Lock()
_cls = None
_keys = itertools.count(1)


def _import_numba_cuda():
    try:
        from numba import cuda
    except ImportError as e:
        raise ImportError("vramkit.numba needs Numba's CUDA target (pip install numba-cuda)") from e
    return cuda


def _device_pointer(address: int):
    """The pointer object Numba's driver layer expects: a ``CUdeviceptr`` of the NVIDIA
    bindings, or a ctypes integer with Numba's older ctypes binding."""
    from numba.cuda.cudadrv import driver as drv
    use_nv = getattr(drv, "USE_NV_BINDING", None)
    if use_nv is None:  # newer numba-cuda: the NVIDIA bindings only
        use_nv = True
    if use_nv:
        binding = getattr(drv, "binding", None)
        if binding is not None and hasattr(binding, "CUdeviceptr"):
            return binding.CUdeviceptr(address)
        try:
            from cuda.bindings.driver import CUdeviceptr
        except ImportError:  # cuda-python < 12.6
            from cuda.cuda import CUdeviceptr
        return CUdeviceptr(address)
    from numba.cuda.cudadrv import drvapi
    return getattr(drvapi, "cu_device_ptr", ctypes.c_uint64)(address)


def _make_finalizer(buffers: dict, key: int):
    # Holds the registry and the key, never the MemoryPointer: Numba calls this when the
    # last reference to the pointer goes; dropping the buffer returns the memory.
    def finalizer():
        buffers.pop(key, None)
    return finalizer


def _build_class():
    cuda = _import_numba_cuda()
    from numba.cuda import HostOnlyCUDAMemoryManager, MemoryInfo, MemoryPointer

    wants_context = "context" in inspect.signature(MemoryPointer.__init__).parameters

    class VramkitNumbaMemoryManager(HostOnlyCUDAMemoryManager):
        """Numba EMM plugin: device memory from vramkit, host memory from Numba."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._buffers: dict = {}

        def initialize(self):
            # vramkit creates each device's resource on first use; nothing to prepare.
            # Numba may call this more than once: it must not drop earlier state.
            pass

        def memalloc(self, size):
            device = self.context.device.id
            buf = _vramkit.alloc(size, 0, device)  # vramkit.OutOfMemoryError (a MemoryError) if full
            key = next(_keys)
            self._buffers[key] = buf
            ptr = _device_pointer(buf.ptr)
            fin = _make_finalizer(self._buffers, key)
            if wants_context:
                return MemoryPointer(self.context, ptr, size, finalizer=fin)
            return MemoryPointer(ptr, size, finalizer=fin)

        def get_memory_info(self):
            device = self.context.device.id
            free, total = _vramkit.mem_get_info(device)
            cached = _vramkit.current_resource(device).state()["cached_bytes"]
            return MemoryInfo(free=min(free + cached, total), total=total)

        def get_ipc_handle(self, memory):
            mixin = getattr(cuda, "GetIpcHandleMixin", None)
            if mixin is None:
                from numba.cuda.cudadrv import driver as drv
                mixin = getattr(drv, "GetIpcHandleMixin", None)
            if mixin is None:
                raise RuntimeError("vramkit.numba: this Numba has no GetIpcHandleMixin to build IPC handles with")
            try:
                return mixin.get_ipc_handle(self, memory)
            except Exception as e:
                raise RuntimeError(
                    "vramkit.numba: cannot export this memory with cuIpcGetMemHandle. Memory from the default "
                    "vmm upstream (cuMemCreate pages) is not shareable through legacy CUDA IPC; use a pool over "
                    "cudaMalloc for memory to share: vramkit.set_current_resource("
                    "_vramkit.statistics_adaptor(vramkit.make_resource('pool:upstream=cuda', device)), device)"
                ) from e

        def reset(self):
            # Frees every device buffer of this context: Numba resets a context only when
            # all its memory is to be released (numba.cuda.close(), context reset).
            super().reset()
            self._buffers.clear()

        @contextlib.contextmanager
        def defer_cleanup(self):
            # Device frees are pool operations and stay immediate; host cleanup is deferred.
            with super().defer_cleanup():
                yield

        @property
        def interface_version(self):
            return 1

    VramkitNumbaMemoryManager.__module__ = __name__
    VramkitNumbaMemoryManager.__qualname__ = "VramkitNumbaMemoryManager"
    return VramkitNumbaMemoryManager


def _get_class():
    global _cls
    with _lock:
        if _cls is None:
            _cls = _build_class()
        return _cls


def __getattr__(name):
    # PEP 562: NUMBA_CUDA_MEMORY_MANAGER=vramkit.numba makes Numba read _numba_memory_manager.
    if name in ("_numba_memory_manager", "VramkitNumbaMemoryManager"):
        return _get_class()
    raise AttributeError(f"module 'vramkit.numba' has no attribute {name!r}")


def _existing_contexts():
    from numba.cuda.cudadrv import driver as drv
    out = []
    devices = getattr(drv.driver, "devices", None) or {}
    for dev in list(devices.values()):
        ctx = getattr(dev, "primary_context", None)
        if ctx is not None:
            out.append(ctx)
    return out


def is_active() -> bool:
    """Whether Numba's contexts allocate through vramkit (or will, once created)."""
    if _cls is None:
        return False
    import importlib
    mods = []
    for name in ("numba.cuda.cudadrv.driver", "numba.cuda.cudadrv.memory"):
        try:
            mods.append(importlib.import_module(name))
        except ImportError:
            pass
    if not mods:
        return False
    ctxs = _existing_contexts()
    if ctxs:
        return all(isinstance(getattr(c, "memory_manager", None), _cls) for c in ctxs)
    return any(getattr(m, "_memory_manager", None) is _cls for m in mods)


def use() -> None:
    """Make vramkit Numba's device memory manager (``numba.cuda.set_memory_manager``).

    Must be called before Numba creates a CUDA context (before the first kernel launch,
    device array or ``cuda.current_context()``): contexts keep the manager they were created
    with. Calling it again does nothing.

    Raises
    ------
    ImportError
        numba-cuda is not installed.
    RuntimeError
        There is no CUDA GPU, or Numba already created a context with its own manager.
    """
    cls = _get_class()
    if _vramkit.backend() != "cuda":
        raise RuntimeError(
            "vramkit.numba.use() needs a CUDA GPU, but vramkit runs on its simulated host device "
            f"({_vramkit.cuda_unavailable_reason() or 'VRAMKIT_BACKEND=host is set'})")
    cuda = _import_numba_cuda()
    others = [c for c in _existing_contexts() if not isinstance(getattr(c, "memory_manager", None), cls)]
    if others:
        raise RuntimeError(
            "vramkit.numba.use() must be called before Numba creates a CUDA context: "
            f"{len(others)} context(s) already use Numba's own memory manager. Call it at the start of the "
            "program, set NUMBA_CUDA_MEMORY_MANAGER=vramkit.numba, or call numba.cuda.close() first "
            "(which invalidates that context's arrays and kernels)")
    cuda.set_memory_manager(cls)
