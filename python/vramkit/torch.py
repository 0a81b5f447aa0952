"""vramkit as PyTorch's CUDA allocator.

>>> import vramkit.torch
>>> vramkit.torch.use(growth_slack=0.05)   # first, before PyTorch allocates CUDA memory
>>> import torch
>>> x = torch.empty(1 << 20, device="cuda")  # comes from vramkit's pool
>>> vramkit.torch.stats()["allocated_bytes.all.current"]
4194304

PyTorch loads the two C functions of ``libvramkit_torch.so`` (installed next to the
extension) through ``torch.cuda.memory.CUDAPluggableAllocator``. They allocate from
vramkit's current resource of each device, the same one ``vramkit.alloc`` uses, so
``vramkit.memory_allocated()`` and friends count PyTorch's tensors.

This module imports torch inside its functions only: ``import vramkit`` never imports
a framework. See ``docs/integrations.md`` for stream semantics and ``record_stream``.
"""
from __future__ import annotations

import ctypes
import os
import threading

from . import _vramkit

__all__ = ["use", "is_active", "stats", "record_stream", "library_path", "pool_conf"]

_ALLOC_FN = "vramkit_torch_alloc"
_FREE_FN = "vramkit_torch_free"
_RECORD_FN = "vramkit_torch_record_stream"

_lock = threading.Lock()
_state: dict = {"active": False, "conf": None, "allocator": None}
_shim_lib = None


def library_path() -> str:
    """Where ``libvramkit_torch.so`` (the shim PyTorch loads) is installed."""
    return os.path.join(os.path.dirname(os.path.abspath(_vramkit.__file__)), "libvramkit_torch.so")


def pool_conf(**pool_options) -> str:
    """The ``VRAMKIT_ALLOC_CONF``-style string ``use(**pool_options)`` builds its pool from.

    ``pool_conf(growth_slack=0.05, remap=False)`` is ``"growth_slack:0.05,remap:false"``;
    the special option ``upstream`` (``"vmm"``, ``"cuda"``, ``"cuda_async"``) picks where
    the pool gets its memory: ``pool_conf(upstream="cuda")`` is ``"upstream=cuda"``.
    Values are not checked here; building the pool checks them.
    """
    upstream = pool_options.pop("upstream", None)
    items = []
    for key, value in pool_options.items():
        if isinstance(value, bool):
            value = "true" if value else "false"
        text = str(value)
        if any(c in text for c in ",:") or any(c in key for c in ",:="):
            raise ValueError(f"pool option {key}={value!r}: keys and values may not contain ',', ':' or '='")
        items.append(f"{key}:{text}")
    if upstream is not None:
        if not isinstance(upstream, str) or any(c in upstream for c in ",:="):
            raise ValueError(f"upstream must be one of 'vmm', 'cuda', 'cuda_async', not {upstream!r}")
        items.insert(0, f"upstream={upstream}")
    return ",".join(items)


def _too_late(detail: str) -> RuntimeError:
    return RuntimeError(
        "vramkit.torch.use() must be called before PyTorch allocates CUDA memory (or initializes "
        "CUDA): PyTorch cannot swap its allocator once its own is in use. " + detail +
        " Call vramkit.torch.use() at the very start of the program, before the first "
        "tensor.cuda()/torch.empty(device='cuda') or torch.cuda.* call, or run that code in a new process."
    )


def _require_gpu() -> None:
    backend = _vramkit.backend()
    if backend != "cuda":
        raise RuntimeError(
            "vramkit.torch.use() needs a CUDA GPU, but vramkit runs on its simulated host device "
            f"(backend {backend!r}: {_vramkit.cuda_unavailable_reason() or 'VRAMKIT_BACKEND=host is set'}). "
            "PyTorch tensors cannot live in simulated device memory."
        )


def _import_torch():
    try:
        import torch
    except ImportError as e:
        raise ImportError("vramkit.torch needs PyTorch (pip install torch)") from e
    return torch


def is_active() -> bool:
    """Whether vramkit is PyTorch's CUDA allocator in this process."""
    return _state["active"]


def use(**pool_options) -> None:
    """Make vramkit PyTorch's CUDA allocator, for every device.

    Call it once, first: before PyTorch allocates CUDA memory or initializes CUDA.

    Parameters
    ----------
    **pool_options
        Pool settings, as ``VRAMKIT_ALLOC_CONF`` keys (``growth_slack=0.05``,
        ``release_threshold="2GiB"``, ``remap=False``, ...) plus ``upstream``
        (``"vmm"`` by default, ``"cuda"``, ``"cuda_async"``). With none, the devices keep
        their current resource (the default pool, which reads ``VRAMKIT_ALLOC_CONF``).
        With some, a new pool ``make_resource("pool:" + conf, device)`` wrapped in a
        statistics adaptor becomes each device's current resource before PyTorch switches.

    Raises
    ------
    RuntimeError
        There is no CUDA GPU; or PyTorch already allocated CUDA memory or initialized CUDA
        ("too late"); or ``use()`` was already called with other options.
    ValueError
        An unknown pool option or a bad value (nothing is changed).
    ImportError
        PyTorch is not installed.
    """
    conf = pool_conf(**pool_options)
    with _lock:
        if _state["active"]:
            if pool_options and conf != _state["conf"]:
                raise RuntimeError(
                    f"vramkit.torch.use() was already called (pool options {_state['conf']!r}); "
                    f"the pool cannot be changed to {conf!r} while PyTorch holds memory from it")
            return
        _require_gpu()
        torch = _import_torch()
        if not torch.cuda.is_available():
            raise RuntimeError("vramkit.torch.use(): PyTorch sees no CUDA device "
                               f"(torch {torch.__version__}, built for CUDA {torch.version.cuda})")
        if torch.cuda.is_initialized():
            # Allocated memory is the clearest sign; an initialized (even empty) native
            # allocator is enough for PyTorch to refuse the swap, and it says so below.
            try:
                allocated = torch.cuda.memory_allocated()
                reserved = torch.cuda.memory_reserved()
            except RuntimeError:  # a pluggable allocator of someone else's: no statistics
                allocated = reserved = None
            if reserved:
                raise _too_late(f"PyTorch's own allocator already holds {_vramkit.format_bytes(reserved)} "
                                f"({_vramkit.format_bytes(allocated or 0)} in tensors).")

        n = _vramkit.device_count()
        previous = [_vramkit.current_resource(d) for d in range(n)] if conf else []
        if conf:
            # Build every pool first: a bad option raises here and changes nothing.
            fresh = [_vramkit.statistics_adaptor(_vramkit.make_resource("pool:" + conf, d)) for d in range(n)]
            for d, r in enumerate(fresh):
                _vramkit.set_current_resource(r, d)
        try:
            path = library_path()
            if not os.path.exists(path):
                raise RuntimeError(f"vramkit.torch.use(): the PyTorch shim {os.path.basename(path)} is not "
                                   "installed next to the vramkit extension; reinstall vramkit")
            allocator = torch.cuda.memory.CUDAPluggableAllocator(path, _ALLOC_FN, _FREE_FN)
            try:
                torch.cuda.memory.change_current_allocator(allocator)
            except RuntimeError as e:
                raise _too_late(f"PyTorch said: {e}".strip()) from e
        except BaseException:
            for d, r in enumerate(previous):
                _vramkit.set_current_resource(r, d)
            raise
        _state.update(active=True, conf=conf, allocator=allocator)


def stats(device=None) -> dict:
    """``vramkit.memory_stats(device)``: the statistics of the pool PyTorch allocates from.

    With a pluggable allocator ``torch.cuda.memory_stats()`` and ``torch.cuda.memory_allocated()``
    do not work (PyTorch raises); use this, or ``vramkit.memory_allocated()`` and friends.
    """
    from . import memory_stats
    return memory_stats(device)


def _shim():
    global _shim_lib
    if _shim_lib is None:
        lib = ctypes.CDLL(library_path())
        fn = getattr(lib, _RECORD_FN)
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        fn.restype = ctypes.c_int
        _shim_lib = lib
    return _shim_lib


def _stream_handle(stream) -> int:
    if hasattr(stream, "cuda_stream"):
        return int(stream.cuda_stream)
    return _vramkit.to_stream(stream)


def record_stream(tensor, stream) -> None:
    """Mark ``tensor``'s memory as used on ``stream`` (PyTorch's ``Tensor.record_stream``).

    When the tensor is freed, its memory is not handed to work on other streams until
    everything queued on ``stream`` before the free has finished. Call it after queuing the
    work that uses the tensor on ``stream`` when the tensor was allocated on another stream.

    PyTorch's own ``tensor.record_stream(stream)`` does not reach a pluggable allocator
    (PyTorch's Python API gives no way to register the hook), so with vramkit active it
    does nothing: use this function. Without vramkit active it calls
    ``tensor.record_stream(stream)``.
    """
    if not _state["active"]:
        tensor.record_stream(stream)
        return
    if not getattr(tensor, "is_cuda", False):
        raise ValueError(f"record_stream: the tensor is on {tensor.device}, not on a CUDA device")
    ptr = int(tensor.untyped_storage().data_ptr())
    if ptr == 0:
        return  # an empty tensor owns no memory
    device = int(tensor.device.index)
    handle = _stream_handle(stream)
    rc = _shim().vramkit_torch_record_stream(ptr, device, handle)
    if rc != 0:
        # The C function only says "failed"; the same call through the binding says why.
        _vramkit.current_resource(device).record_stream(ptr, handle)
        raise RuntimeError(f"record_stream failed for the tensor at 0x{ptr:x} on device {device}")
