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

import atexit
import contextlib
import ctypes
import os
import threading
import warnings
import weakref

from . import _vramkit

__all__ = ["use", "is_active", "stats", "record_stream", "library_path", "pool_conf", "pool",
           "graph_pools", "hooks_available", "mark_step", "step_marks"]

_ALLOC_FN = "vramkit_torch_alloc"
_FREE_FN = "vramkit_torch_free"
_RECORD_FN = "vramkit_torch_record_stream"

_lock = threading.Lock()
_state: dict = {"active": False, "conf": None, "allocator": None, "hooks": False, "marks": None,
                "mark_steps": None, "plan_conf": ""}
_MARK_SOURCES = ("optimizer", "manual")
_shim_lib = None


def library_path() -> str:
    """Where ``libvramkit_torch.so`` (the shim PyTorch loads) is installed."""
    return os.path.join(os.path.dirname(os.path.abspath(_vramkit.__file__)), "libvramkit_torch.so")


def hooks_path() -> str:
    """Where ``libvramkit_torch_hooks.so`` is installed (built only where PyTorch was present)."""
    return os.path.join(os.path.dirname(library_path()), "libvramkit_torch_hooks.so")


def hooks_available() -> tuple[bool, str]:
    """Whether the PyTorch hooks can be used with the PyTorch imported now, and why not.

    The hooks (CUDA graphs and ``torch.cuda.MemPool``, ``Tensor.record_stream``,
    ``torch.cuda.memory_stats()``, ``empty_cache()``, cuDNN's benchmark mode) are a library
    built against the PyTorch that was installed when vramkit was built; another version of
    PyTorch cannot load them safely.
    """
    path = hooks_path()
    if not os.path.exists(path):
        return False, ("vramkit was built without PyTorch present, so its PyTorch hooks were not built; "
                       "reinstall vramkit with PyTorch installed (pip install --no-build-isolation vramkit)")
    torch = _import_torch()
    try:
        with open(os.path.join(os.path.dirname(path), "torch_hooks.version")) as f:
            built_for = f.read().strip()
    except OSError:
        built_for = "an unknown version"
    if built_for != torch.__version__:
        return False, (f"vramkit's PyTorch hooks were built for PyTorch {built_for}, but PyTorch "
                       f"{torch.__version__} is imported; reinstall vramkit to rebuild them")
    return True, ""


def _install(torch):
    """Makes vramkit PyTorch's allocator: the hooks when they fit this PyTorch, else the bare
    two-function pluggable allocator (with a warning: graphs and MemPool then cannot work)."""
    path = library_path()
    if not os.path.exists(path):
        raise RuntimeError(f"vramkit.torch.use(): the PyTorch shim {os.path.basename(path)} is not "
                           "installed next to the vramkit extension; reinstall vramkit")
    ok, why = hooks_available()
    if ok:
        lib = ctypes.CDLL(hooks_path())
        lib.vramkit_torch_install.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        lib.vramkit_torch_install.restype = ctypes.c_int
        message = ctypes.create_string_buffer(2048)
        if lib.vramkit_torch_install(message, len(message)) != 0:
            said = message.value.decode(errors="replace").strip()
            if "initialized" in said:
                raise _too_late(f"PyTorch said: {said.splitlines()[0]}")
            raise RuntimeError(f"vramkit.torch.use(): PyTorch refused the allocator: {said}")
        _state["hooks"] = True
        return lib
    warnings.warn(f"vramkit.torch.use(): {why}. Without them CUDA graph capture, torch.cuda.MemPool, "
                  "Tensor.record_stream and torch.cuda.memory_stats() do not work under vramkit.",
                  RuntimeWarning, stacklevel=3)
    allocator = torch.cuda.memory.CUDAPluggableAllocator(path, _ALLOC_FN, _FREE_FN)
    try:
        torch.cuda.memory.change_current_allocator(allocator)
    except RuntimeError as e:
        raise _too_late(f"PyTorch said: {e}".strip()) from e
    _state["hooks"] = False
    return allocator


IPC_REFUSED = (
    "vramkit: this tensor's memory comes from vramkit's pool, which cannot be shared with another "
    "process through CUDA IPC (torch.multiprocessing). Share it from a process that does not call "
    "vramkit.torch.use(), route only chosen allocations through vramkit with vramkit.torch.pool(), or copy "
    "the tensor to shared CPU memory (tensor.cpu().share_memory_())")


def _refuse_ipc(torch) -> None:
    # PyTorch would export the address with cudaIpcGetMemHandle, which VMM memory does not
    # support: say so before it tries.
    def _share_cuda_(self, *args, **kwargs):
        raise RuntimeError(IPC_REFUSED)
    torch.UntypedStorage._share_cuda_ = _share_cuda_


def _plain_inductor_graphs() -> None:
    # torch.compile(mode="reduce-overhead") records CUDA graphs in "trees" that checkpoint and
    # restore the allocator's pool state (getCheckpointState / setCheckpointPoolState), which
    # vramkit does not implement. Inductor's plain CUDA graphs (one private pool per graph,
    # through torch.cuda.graph) work under vramkit.
    try:
        import torch._inductor.config as inductor_config
        inductor_config.triton.cudagraph_trees = False
    except Exception:  # an inductor without that setting: nothing to change
        pass


def _at_exit() -> None:
    # PyTorch frees tensors during interpreter teardown, after vramkit's state and
    # possibly CUDA are gone: from here on frees are dropped, silently (the process
    # gives all its memory back). A double free before this point is still reported.
    try:
        _shim().vramkit_torch_exiting()
    except Exception:
        pass


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


def use(*, mark_steps: str | None = None, **pool_options) -> None:
    """Make vramkit PyTorch's CUDA allocator, for every device.

    Call it once, first: before PyTorch allocates CUDA memory or initializes CUDA.

    Parameters
    ----------
    mark_steps
        Where the steps of ``plan_steps`` begin (used only when the pool has that option):
        ``"optimizer"`` (the default) marks one each time the program's first optimizer to
        step on a CUDA device finishes a step, through PyTorch's global optimizer step hook;
        ``"manual"`` leaves it to ``vramkit.torch.mark_step()``. A program that calls
        ``mark_step()`` itself turns the optimizer's marks off from then on. Each device is
        marked by the first optimizer to step with parameters on it.
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
    if mark_steps is not None and mark_steps not in _MARK_SOURCES:
        raise ValueError(f"vramkit.torch.use(): mark_steps must be one of {', '.join(map(repr, _MARK_SOURCES))}, "
                         f"not {mark_steps!r}")
    conf = pool_conf(**pool_options)
    with _lock:
        if _state["active"]:
            if pool_options and conf != _state["conf"]:
                raise RuntimeError(
                    f"vramkit.torch.use() was already called (pool options {_state['conf']!r}); "
                    f"the pool cannot be changed to {conf!r} while PyTorch holds memory from it")
            if mark_steps is not None and mark_steps != _state["mark_steps"]:
                raise RuntimeError(
                    f"vramkit.torch.use() was already called with mark_steps={_state['mark_steps']!r}; "
                    f"it cannot change to {mark_steps!r}")
            return
        mark_steps = mark_steps or "optimizer"
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
            allocator = _install(torch)
        except BaseException:
            for d, r in enumerate(previous):
                _vramkit.set_current_resource(r, d)
            raise
        atexit.register(_at_exit)
        _refuse_ipc(torch)
        _plain_inductor_graphs()
        # The pools start from VRAMKIT_ALLOC_CONF and take use()'s options over it.
        plan_conf = os.environ.get("VRAMKIT_ALLOC_CONF", "") + "," + conf
        marks = None
        if mark_steps == "optimizer" and _plans_steps(plan_conf):
            marks = _OptimizerMarks.install(torch)
        _state.update(active=True, conf=conf, allocator=allocator, marks=marks, mark_steps=mark_steps,
                      plan_conf=plan_conf)


def _plans_steps(conf: str) -> bool:
    from ._pool_conf import plans_steps
    return plans_steps(conf)


def _device_plans(device: int) -> bool:
    """Whether the device's current resource is a paged pool with ``plan_steps`` on."""
    c = _vramkit.current_resource(device).pool_counters()
    return bool(c) and bool(c.get("paged", True)) and "plan_steps:true" in c.get("options", "")


class _OptimizerMarks:
    """Marks a step of a device's pool each time the optimizer pacing that device finishes
    ``step()``.

    A device's pacing optimizer is the first to step with parameters on it: a program with
    several optimizers over one device (a GAN's two) steps each once an iteration, and only one
    may mark; one with an optimizer per device (pipeline stages in one process) gets each device
    marked by its own. When a pacing optimizer is gone, the next optimizer to step on its device
    takes its place. After ``step()`` the optimizer's temporaries are freed: the quietest point
    of a training step. Steps taken while the current stream is being captured into a CUDA graph
    mark nothing (the graph's replays would not mark either).
    """

    def __init__(self, torch=None):
        self.torch = torch
        self.pacers: dict = {}  # device -> weakref to the optimizer pacing it
        self.known = weakref.WeakKeyDictionary()  # optimizer -> its CUDA devices whose pools plan
        self.marks = 0
        self.handle = None

    @classmethod
    def install(cls, torch):
        register = getattr(getattr(torch.optim, "optimizer", None), "register_optimizer_step_post_hook", None)
        if register is None:  # PyTorch 2.11 does not bind the submodule torch.optim.optimizer on torch.optim
            try:
                import importlib
                register = getattr(importlib.import_module("torch.optim.optimizer"),
                                   "register_optimizer_step_post_hook", None)
            except ImportError:
                register = None
        if register is None:
            warnings.warn("vramkit.torch.use(): this PyTorch has no global optimizer step hook "
                          "(torch.optim.optimizer.register_optimizer_step_post_hook), so plan_steps' steps are "
                          "not marked by themselves; call vramkit.torch.mark_step() at the top of each step",
                          RuntimeWarning, stacklevel=3)
            return None
        marks = cls(torch)
        marks.handle = register(marks)
        return marks

    def remove(self) -> None:
        """Unregisters the hook (never from inside it: PyTorch iterates over its hooks then)."""
        if self.handle is not None:
            self.handle.remove()
            self.handle = None

    def _capturing(self) -> bool:
        if self.torch is None:
            return False
        try:
            return bool(self.torch.cuda.is_current_stream_capturing())
        except Exception:  # noqa: BLE001 - no answer: take it as not capturing
            return False

    def __call__(self, optimizer, args, kwargs) -> None:
        from . import _manual_marks
        if _manual_marks[0] or self._capturing():
            return
        devices = self.known.get(optimizer)
        if devices is None:
            found = {p.device.index for group in optimizer.param_groups for p in group["params"]
                     if p.device.type == "cuda" and p.device.index is not None}
            devices = tuple(d for d in sorted(found) if _device_plans(d))
            self.known[optimizer] = devices
        marked = False
        for d in devices:
            ref = self.pacers.get(d)
            pacer = ref() if ref is not None else None
            if pacer is None:
                self.pacers[d] = weakref.ref(optimizer)
                pacer = optimizer
            if pacer is optimizer:
                _vramkit.current_resource(d).mark_step()
                marked = True
        if marked:
            self.marks += 1

    def devices(self) -> list:
        return sorted(d for d, ref in self.pacers.items() if ref() is not None)


def _manual_mark_seen() -> None:
    """The program marked a step itself (``vramkit.mark_step``): the optimizer's marks stop."""
    m = _state["marks"]
    if m is not None:
        m.remove()


def step_marks() -> dict:
    """How the steps of ``plan_steps`` are marked in this process. ``source``: ``"optimizer"``
    (after each step of the pacing optimizers), ``"manual"`` (the program calls ``mark_step()``,
    or ``use(mark_steps="manual")`` waits for it to), ``"pool"`` (nothing marked them and the
    current device's pool found their period itself) or ``"none"`` (vramkit is not PyTorch's
    allocator, or its pools do not plan steps); ``marks``: the optimizer steps that marked;
    ``devices``: the devices they marked; ``pool_period``: the period, in large requests, the
    current device's pool found (0: none)."""
    from . import _manual_marks
    m = _state["marks"]
    plans = _state["active"] and _plans_steps(_state["plan_conf"])
    period = 0
    if plans:
        c = _vramkit.current_resource(None).pool_counters()
        period = int(c.get("step_period", 0)) if c else 0
    if not plans:
        source = "none"
    elif _manual_marks[0]:
        source = "manual"
    elif m is not None and m.marks:
        source = "optimizer"
    elif period:
        source = "pool"
    else:
        source = "optimizer" if m is not None else "manual"
    return {"source": source, "marks": m.marks if m else 0, "devices": m.devices() if m else [],
            "pool_period": period}


def stats(device=None) -> dict:
    """``vramkit.memory_stats(device)``: the statistics of the pool PyTorch allocates from.

    With a pluggable allocator ``torch.cuda.memory_stats()`` and ``torch.cuda.memory_allocated()``
    do not work (PyTorch raises); use this, or ``vramkit.memory_allocated()`` and friends.
    """
    from . import memory_stats
    return memory_stats(device)


def mark_step(device=None) -> None:
    """``vramkit.mark_step(device)`` for the pool PyTorch allocates from: call it at the top of each
    step (with ``plan_steps``, the pool's default, later steps' tensors land where the recorded step's did,
    with no page moves). Training loops need not: ``use()`` marks a step after each optimizer
    step. The first call here turns those marks off, so that each step is marked once."""
    from . import mark_step as _mark
    _mark(None if device is None else _device_index(device))


def _device_index(device) -> int:
    if isinstance(device, int):
        return device
    torch = _import_torch()
    if device is None:
        return torch.cuda.current_device()
    index = torch.device(device).index
    return torch.cuda.current_device() if index is None else index


class _PoolRow(ctypes.Structure):
    _fields_ = [("first", ctypes.c_uint64), ("second", ctypes.c_uint64), ("users", ctypes.c_int64),
                ("windows", ctypes.c_int64), ("captured", ctypes.c_int64), ("set_aside_count", ctypes.c_uint64),
                ("set_aside_bytes", ctypes.c_uint64), ("live_bytes", ctypes.c_uint64),
                ("live_count", ctypes.c_uint64), ("reserved_bytes", ctypes.c_uint64),
                ("peak_reserved_bytes", ctypes.c_uint64)]


def _shim():
    global _shim_lib
    if _shim_lib is None:
        lib = ctypes.CDLL(library_path())
        fn = getattr(lib, _RECORD_FN)
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        fn.restype = ctypes.c_int
        lib.vramkit_torch_graph_pools.argtypes = [ctypes.c_int, ctypes.POINTER(_PoolRow), ctypes.c_int]
        lib.vramkit_torch_graph_pools.restype = ctypes.c_int
        lib.vramkit_torch_exiting.argtypes = []
        lib.vramkit_torch_exiting.restype = None
        _shim_lib = lib
    return _shim_lib


def graph_pools(device=None) -> list[dict]:
    """The private pools of CUDA graphs and ``torch.cuda.MemPool`` objects on a device.

    Each is a dict: ``id`` (PyTorch's pool id), ``users`` (graphs and MemPool objects
    holding it), ``open`` (capture or ``use_mem_pool`` windows open now), ``captured``,
    ``live_bytes``, ``live_count``, ``reserved_bytes``, ``peak_reserved_bytes``, and
    ``set_aside_bytes``/``set_aside_count``: memory of other tensors freed during a capture,
    held back until the graph is destroyed (the graph may still use it). A pool goes once
    nothing holds it and none of its tensors is alive; its memory goes back to the device.
    """
    device = _device_index(device)
    lib = _shim()
    rows = (_PoolRow * 256)()
    n = lib.vramkit_torch_graph_pools(device, rows, 256)
    if n < 0:
        raise RuntimeError(f"vramkit: cannot read the graph pools of device {device}")
    out = []
    for r in rows[:min(n, 256)]:
        out.append({"id": (r.first, r.second), "users": r.users, "open": r.windows, "captured": bool(r.captured),
                    "live_bytes": r.live_bytes, "live_count": r.live_count, "reserved_bytes": r.reserved_bytes,
                    "peak_reserved_bytes": r.peak_reserved_bytes, "set_aside_bytes": r.set_aside_bytes,
                    "set_aside_count": r.set_aside_count})
    return out


class ScopedPool:
    """What ``vramkit.torch.pool()`` yields: the ``torch.cuda.MemPool`` and vramkit's figures."""

    def __init__(self, mempool, device: int):
        self.mempool = mempool
        self.device = device

    @property
    def id(self):
        return self.mempool.id

    def stats(self) -> dict:
        """vramkit's statistics of the memory this scope took (``vramkit.memory_stats`` names)."""
        if _state["active"]:
            for p in graph_pools(self.device):
                if tuple(p["id"]) == tuple(self.mempool.id):
                    return {"allocated_bytes.all.current": p["live_bytes"],
                            "allocation.all.current": p["live_count"],
                            "reserved_bytes.all.current": p["reserved_bytes"],
                            "reserved_bytes.all.peak": p["peak_reserved_bytes"]}
            return {"allocated_bytes.all.current": 0, "allocation.all.current": 0,
                    "reserved_bytes.all.current": 0, "reserved_bytes.all.peak": 0}
        from . import memory_stats
        return memory_stats(self.device)


_scoped_allocator = None


@contextlib.contextmanager
def pool(device=None):
    """Route only the allocations made inside the ``with`` block (on this thread) to vramkit.

    >>> with vramkit.torch.pool() as p:
    ...     kv_cache = torch.empty(n, device="cuda")   # memory from vramkit
    >>> x = torch.empty(n, device="cuda")              # PyTorch's own allocator
    >>> p.stats()["reserved_bytes.all.current"]

    Without ``vramkit.torch.use()``, PyTorch's allocator keeps every other allocation and
    takes the memory of this scope's segments from vramkit (a ``torch.cuda.MemPool`` whose
    allocator is vramkit's). With ``use()`` active, the scope is a private vramkit pool of its
    own, apart from everything else, released when its tensors and the ``MemPool`` are gone.

    Raises
    ------
    RuntimeError
        This PyTorch has no ``torch.cuda.MemPool``/``torch.cuda.use_mem_pool`` (PyTorch 2.8
        or later has them), or no CUDA device.
    """
    global _scoped_allocator
    torch = _import_torch()
    if not (hasattr(torch.cuda, "MemPool") and hasattr(torch.cuda, "use_mem_pool")):
        raise RuntimeError("vramkit.torch.pool() needs torch.cuda.MemPool and torch.cuda.use_mem_pool, "
                           f"which PyTorch {torch.__version__} lacks (PyTorch 2.8 or later has them); "
                           "use vramkit.torch.use() to route every allocation instead")
    if not torch.cuda.is_available():
        raise RuntimeError("vramkit.torch.pool(): PyTorch sees no CUDA device")
    index = _device_index(device)
    if _state["active"]:
        if not _state["hooks"]:
            raise RuntimeError("vramkit.torch.pool() under vramkit.torch.use() needs vramkit's PyTorch hooks: "
                               + hooks_available()[1])
        mempool = torch.cuda.MemPool()
    else:
        _require_gpu()
        with _lock:
            if _scoped_allocator is None:
                _scoped_allocator = torch.cuda.memory.CUDAPluggableAllocator(library_path(), _ALLOC_FN, _FREE_FN)
        mempool = torch.cuda.MemPool(_scoped_allocator.allocator())
    with torch.cuda.use_mem_pool(mempool, device=index):
        yield ScopedPool(mempool, index)


def _stream_handle(stream) -> int:
    if hasattr(stream, "cuda_stream"):
        return int(stream.cuda_stream)
    return _vramkit.to_stream(stream)


def record_stream(tensor, stream) -> None:
    """Mark ``tensor``'s memory as used on ``stream`` (PyTorch's ``Tensor.record_stream``).

    When the tensor is freed, its memory is not handed to work on other streams until
    everything queued on ``stream`` before the free has finished. Call it after queuing the
    work that uses the tensor on ``stream`` when the tensor was allocated on another stream.

    With vramkit's PyTorch hooks (the usual case) ``tensor.record_stream(stream)`` itself
    reaches vramkit, and this function just calls it. Without the hooks PyTorch's own call
    does nothing under a pluggable allocator: this function then tells vramkit directly.
    """
    if not _state["active"] or _state["hooks"]:
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
