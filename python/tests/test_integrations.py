"""Framework integrations (vramkit.torch, vramkit.cupy, vramkit.numba) and buffer interop
that can be checked without a GPU. The GPU side lives in test_gpu_integrations.py."""
from __future__ import annotations

import ctypes
import gc
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import vramkit
from vramkit import _vramkit

ON_GPU = vramkit.backend() == "cuda"
gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not ON_GPU, reason=f"needs a CUDA GPU (vramkit backend is {vramkit.backend()!r})")


def run_python(code: str, env_extra: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs code in a fresh interpreter (so nothing imported here leaks in)."""
    env = dict(os.environ)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, timeout=timeout)


def last_json(proc: subprocess.CompletedProcess):
    assert proc.returncode == 0, f"child failed (rc {proc.returncode}):\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    lines = [ln for ln in proc.stdout.splitlines() if ln[:1] in ("{", "[")]
    assert lines, f"child printed no JSON:\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return json.loads(lines[-1])


# ---------------------------------------------------------------- lazy imports

def test_import_vramkit_imports_no_framework():
    out = last_json(run_python("""
        import json, sys
        import vramkit
        vramkit.alloc(1 << 20).free()
        print(json.dumps({m: m in sys.modules for m in ("torch", "cupy", "numba")}))
    """))
    assert out == {"torch": False, "cupy": False, "numba": False}, f"importing vramkit imported frameworks: {out}"


def test_integration_modules_import_lazily():
    # The integration modules themselves must import without their framework: the
    # framework is imported inside the functions that need it.
    out = last_json(run_python("""
        import json, sys
        import vramkit.torch, vramkit.cupy, vramkit.numba
        print(json.dumps({m: m in sys.modules for m in ("torch", "cupy", "numba")}))
    """))
    assert out == {"torch": False, "cupy": False, "numba": False}, f"an integration module imported its framework: {out}"


def test_attribute_access_loads_integration():
    out = last_json(run_python("""
        import json, vramkit
        print(json.dumps([vramkit.torch.__name__, vramkit.cupy.__name__, vramkit.numba.__name__]))
    """))
    assert out == ["vramkit.torch", "vramkit.cupy", "vramkit.numba"]


# ---------------------------------------------------------------- vramkit.torch

def test_torch_pool_conf():
    from vramkit.torch import pool_conf
    assert pool_conf() == ""
    assert pool_conf(growth_slack=0.05) == "growth_slack:0.05"
    assert pool_conf(remap=False, release_threshold="2GiB") == "remap:false,release_threshold:2GiB"
    assert pool_conf(upstream="cuda", growth_slack=0.1) == "upstream=cuda,growth_slack:0.1"
    with pytest.raises(ValueError):
        pool_conf(growth_slack="0.1,remap:false")  # would smuggle a second option in
    # The string is what make_resource and VRAMKIT_ALLOC_CONF take.
    assert "growth_slack:0.05" in _vramkit.parse_options(pool_conf(growth_slack=0.05))


def test_torch_shim_is_installed_with_its_symbols():
    from vramkit.torch import library_path
    path = library_path()
    assert os.path.exists(path), f"libvramkit_torch.so not found at {path}"
    lib = ctypes.CDLL(path)
    for name in ("vramkit_torch_alloc", "vramkit_torch_free", "vramkit_torch_record_stream"):
        assert hasattr(lib, name), f"{name} missing from {path}"


def test_torch_shim_allocates_from_current_resource():
    # The shim and the Python module share one core library, hence one pool per device.
    # On the host backend the "device pointers" are host memory, so this runs anywhere.
    code = """
        import ctypes, json, vramkit, vramkit.torch
        lib = ctypes.CDLL(vramkit.torch.library_path())
        lib.vramkit_torch_alloc.restype = ctypes.c_void_p
        lib.vramkit_torch_alloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        lib.vramkit_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        lib.vramkit_torch_record_stream.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        before = vramkit.memory_allocated()
        p = lib.vramkit_torch_alloc(3 << 20, 0, None)
        during = vramkit.memory_allocated()
        rc_ok = lib.vramkit_torch_record_stream(p, 0, None)
        rc_bad = lib.vramkit_torch_record_stream(p + 256, 0, None)
        lib.vramkit_torch_free(p, 3 << 20, 0, None)
        print(json.dumps(dict(p=p, before=before, during=during, after=vramkit.memory_allocated(),
                              rc_ok=rc_ok, rc_bad=rc_bad)))
    """
    env = {} if ON_GPU else {"VRAMKIT_BACKEND": "host"}
    out = last_json(run_python(code, env))
    assert out["p"], f"the shim returned null: {out}"
    assert out["during"] - out["before"] == 3 << 20, f"the shim's allocation is not in vramkit's statistics: {out}"
    assert out["after"] == out["before"], f"the shim's free did not reach the pool: {out}"
    assert out["rc_ok"] == 0 and out["rc_bad"] == -1, f"record_stream return codes: {out}"


def test_torch_use_without_gpu_raises_clear_error():
    # VRAMKIT_BACKEND=host stands for "no GPU", also on the GPU machine; torch is not needed
    # for this check (the GPU check comes first), but is used when installed.
    out = last_json(run_python("""
        import json, sys, vramkit, vramkit.torch
        try:
            vramkit.torch.use(growth_slack=0.05)
            res = {"raised": None}
        except Exception as e:
            res = {"raised": type(e).__name__, "msg": str(e)}
        res["active"] = vramkit.torch.is_active()
        res["torch_imported"] = "torch" in sys.modules
        print(json.dumps(res))
    """, {"VRAMKIT_BACKEND": "host"}))
    assert out["raised"] == "RuntimeError", f"expected a RuntimeError without a GPU, got {out}"
    assert "needs a CUDA GPU" in out["msg"] and "host" in out["msg"], out["msg"]
    assert out["active"] is False
    assert out["torch_imported"] is False, "use() imported torch before finding there is no GPU"


def test_torch_record_stream_falls_back_when_inactive():
    # Without vramkit active, record_stream is PyTorch's own.
    import vramkit.torch as vt

    class FakeTensor:
        called = None

        def record_stream(self, s):
            FakeTensor.called = s

    vt.record_stream(FakeTensor(), "s1")
    assert FakeTensor.called == "s1"


def test_torch_use_without_torch_says_so():
    try:
        import torch  # noqa: F401
        pytest.skip("torch is installed here: the missing-torch message cannot be checked")
    except ImportError:
        pass
    if not ON_GPU:
        pytest.skip("without a GPU use() stops at the GPU check before looking for torch")
    import vramkit.torch as vt
    with pytest.raises(ImportError, match="needs PyTorch"):
        vt.use()


# ---------------------------------------------------------------- vramkit.cupy / vramkit.numba

def test_cupy_without_cupy_or_gpu_raises_clearly():
    import vramkit.cupy as vc
    try:
        import cupy  # noqa: F401
        have = True
    except ImportError:
        have = False
    if not have:
        with pytest.raises(ImportError, match="needs CuPy"):
            vc.use()
        assert vc.is_active() is False
        assert callable(vc.unuse) and callable(vc.using)
    elif not ON_GPU:
        with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
            vc.use()
    else:
        pytest.skip("CuPy and a GPU are here: covered by test_gpu_integrations.py")


def test_numba_plugin_module_contract():
    import vramkit.numba as vn
    try:
        import numba.cuda  # noqa: F401
        have = True
    except ImportError:
        have = False
    if not have:
        with pytest.raises(ImportError, match="needs Numba"):
            vn._numba_memory_manager
        with pytest.raises(ImportError, match="needs Numba"):
            vn.use()
        assert vn.is_active() is False
        return
    cls = vn._numba_memory_manager
    assert cls is vn.VramkitNumbaMemoryManager
    from numba.cuda import BaseCUDAMemoryManager
    assert issubclass(cls, BaseCUDAMemoryManager)
    assert cls(context=None).interface_version == 1


def test_numba_env_var_module_resolves():
    # What NUMBA_CUDA_MEMORY_MANAGER=vramkit.numba does: import the module, read the global.
    out = last_json(run_python("""
        import importlib, json
        m = importlib.import_module("vramkit.numba")
        try:
            cls = m._numba_memory_manager
            res = {"name": cls.__name__, "module": cls.__module__}
        except ImportError as e:
            res = {"import_error": str(e)}
        print(json.dumps(res))
    """))
    if "import_error" in out:
        assert "needs Numba" in out["import_error"]
    else:
        assert out == {"name": "VramkitNumbaMemoryManager", "module": "vramkit.numba"}


# ---------------------------------------------------------------- DLPack / CUDA array interface (host backend)

needs_host = pytest.mark.skipif(ON_GPU, reason="host-backend interop: on a GPU the buffers are device memory "
                                "(test_gpu_integrations.py covers them)")


@needs_host
def test_dlpack_host_numpy_sees_same_memory():
    n = 1 << 16
    buf = vramkit.alloc(n)
    assert buf.__dlpack_device__() == (1, 0), "host-backend buffers are CPU memory to DLPack"
    arr = np.from_dlpack(buf)
    assert arr.dtype == np.uint8 and arr.shape == (n,)
    assert arr.ctypes.data == buf.ptr, f"numpy sees 0x{arr.ctypes.data:x}, the buffer is 0x{buf.ptr:x}"
    # vramkit -> numpy
    pattern = (np.arange(n, dtype=np.uint32) * 2654435761 >> 24).astype(np.uint8)
    buf.copy_from_host(pattern.tobytes())
    np.testing.assert_array_equal(arr, pattern)
    # numpy -> vramkit. numpy imports an unversioned DLPack capsule read-only, so write
    # through the address numpy exposes (the same memory, which is what is checked).
    other = pattern[::-1].copy()
    ctypes.memmove(arr.ctypes.data, other.ctypes.data, n)
    got = np.frombuffer(buf.copy_to_host(), dtype=np.uint8)
    assert np.array_equal(got, other), f"first mismatch at {int(np.argmax(got != other))}"
    np.testing.assert_array_equal(arr, other)
    del arr
    gc.collect()
    buf.free()


@needs_host
def test_dlpack_keeps_memory_alive_after_del_buf():
    n = 3 << 20
    base_alloc = vramkit.memory_allocated()
    buf = vramkit.alloc(n)
    buf.copy_from_host(bytes(range(256)) * (n // 256))
    arr = np.from_dlpack(buf)
    with pytest.raises(ValueError, match="still use"):
        buf.free()  # the exported array still uses it
    ptr = buf.ptr
    del buf
    gc.collect()
    held = vramkit.memory_allocated() - base_alloc
    assert held == n, f"after del buf with the numpy array alive, {held} bytes are allocated (expected {n})"
    assert arr.ctypes.data == ptr
    # Fresh allocations must not land on the memory the array still holds.
    others = [vramkit.alloc(n) for _ in range(4)]
    for o in others:
        assert not (o.ptr < ptr + n and ptr < o.ptr + n), f"0x{o.ptr:x} overlaps the exported 0x{ptr:x}"
        o.copy_from_host(b"\xee" * n)
    expect = np.frombuffer(bytes(range(256)) * (n // 256), dtype=np.uint8)
    assert np.array_equal(arr, expect), f"the exported memory changed: first bad byte {int(np.argmax(arr != expect))}"
    del others, o
    del arr
    gc.collect()
    assert vramkit.memory_allocated() == base_alloc, (
        f"{vramkit.memory_allocated() - base_alloc} bytes still allocated after the numpy array died")


@needs_host
def test_dlpack_view_and_capsule_lifetime():
    buf = vramkit.alloc(1 << 20)
    view = buf[4096:8192]
    arr = np.from_dlpack(view)
    assert arr.shape == (4096,) and arr.ctypes.data == buf.ptr + 4096
    cap = buf.__dlpack__()  # an unconsumed capsule releases its hold when it dies
    del cap
    del arr, view
    gc.collect()
    buf.free()  # nothing holds it any more
    assert buf.freed


@needs_host
def test_cuda_array_interface_absent_on_host():
    buf = vramkit.alloc(1024)
    assert not hasattr(buf, "__cuda_array_interface__"), "host memory must not claim to be CUDA memory"
    with pytest.raises(AttributeError, match="simulated host device"):
        buf.__cuda_array_interface__
    buf.free()


@gpu
@needs_gpu
def test_cuda_array_interface_on_gpu():
    buf = vramkit.alloc(1 << 20)
    cai = buf.__cuda_array_interface__
    assert cai["version"] == 3 and cai["shape"] == (1 << 20,) and cai["typestr"] == "|u1"
    assert cai["data"] == (buf.ptr, False)
    assert buf.__dlpack_device__() == (2, buf.device)
    buf.free()
