"""What vramkit.quant accepts and gives back: NumPy arrays (the CPU reference), PyTorch tensors,
CuPy arrays, vramkit DeviceBuffers, and any object with __cuda_array_interface__ or DLPack;
plus the ctypes binding of libvramkit_kernels (the CUDA kernels, built when nvcc was found)."""
from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass

import numpy as np

from .._vramkit import DeviceBuffer

_TYPESTR = {"<f4": "float32", "<f2": "float16"}
_RAW_OK = {"float32": ("<u4", "<i4", "|u1"), "float16": ("<u2", "<i2", "|u1"), "bfloat16": ("<u2", "<i2", "|u1", "<V2")}
_ITEM = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass
class Arr:
    """One input or output array, described."""
    kind: str            # numpy, torch-cpu, vramkit-host (host memory) | torch, cupy, vramkit, cai, dlpack (device)
    dtype: str           # float32, float16 or bfloat16
    shape: tuple
    numel: int
    ptr: int = 0
    device: int | None = None
    stream: int = 0
    host: np.ndarray | None = None   # host kinds: the data (bfloat16 as uint16 bits)
    obj: object = None
    keep: object = None              # a DLPack capsule to hold while the pointer is used
    np_dtype: object = None          # numpy inputs: the dtype to give back

    @property
    def on_device(self) -> bool:
        return self.device is not None


def _fn(where: str) -> str:
    return f"vramkit.quant.{where}"


def _check_dtype(override, where: str):
    if override is not None and override not in _ITEM:
        raise ValueError(f"{_fn(where)}: dtype must be 'float32', 'float16' or 'bfloat16' (got {override!r})")
    return override


def _numpy(x: np.ndarray, override, where: str, name: str) -> Arr:
    if not x.flags.c_contiguous:
        raise ValueError(f"{_fn(where)}: {name} is not contiguous (strides {x.strides}); pass np.ascontiguousarray({name})")
    dname = x.dtype.name
    np_dtype = x.dtype
    if override is not None:
        if override == dname or (override == "bfloat16" and x.dtype in (np.uint16, np.int16)):
            dname = override
        else:
            raise TypeError(f"{_fn(where)}: {name} has dtype {x.dtype}, which cannot be read as {override}")
    if dname not in _ITEM:
        raise TypeError(f"{_fn(where)}: {name} has dtype {x.dtype}; expected float32, float16 or bfloat16 "
                        "(bfloat16 as ml_dtypes.bfloat16, or uint16 bits with dtype='bfloat16')")
    host = x.view(np.uint16) if dname == "bfloat16" else x
    return Arr("numpy", dname, tuple(x.shape), int(x.size), host=host, obj=x, np_dtype=np_dtype)


def _torch_dtype_name(torch, dt, where: str, name: str) -> str:
    names = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
    if dt not in names:
        raise TypeError(f"{_fn(where)}: {name} has dtype {dt}; expected torch.float32, torch.float16 or torch.bfloat16")
    return names[dt]


def _torch(torch, x, override, where: str, name: str) -> Arr:
    dname = _torch_dtype_name(torch, x.dtype, where, name)
    if override is not None and override != dname:
        raise TypeError(f"{_fn(where)}: {name} is a {x.dtype} tensor, not {override}")
    if not x.is_contiguous():
        raise ValueError(f"{_fn(where)}: {name} is not contiguous (strides {tuple(x.stride())}); pass {name}.contiguous()")
    if x.device.type == "cuda":
        stream = torch.cuda.current_stream(x.device).cuda_stream
        return Arr("torch", dname, tuple(x.shape), x.numel(), ptr=x.data_ptr(), device=x.device.index,
                   stream=stream, obj=x)
    if x.device.type == "cpu":
        t = x.detach()
        host = t.view(torch.int16).numpy().view(np.uint16) if dname == "bfloat16" else t.numpy()
        return Arr("torch-cpu", dname, tuple(x.shape), x.numel(), host=host, obj=x)
    raise TypeError(f"{_fn(where)}: {name} is on {x.device}; expected a CUDA or CPU tensor")


def _contiguous(shape, strides, itemsize) -> bool:
    if strides is None:
        return True
    expect = itemsize
    for dim, st in zip(reversed(shape), reversed(strides)):
        if dim != 1 and st != expect:
            return False
        expect *= dim
    return True


def _cai(x, cai: dict, override, where: str, name: str) -> Arr:
    typestr = cai["typestr"]
    shape = tuple(int(d) for d in cai["shape"])
    if typestr in _TYPESTR and (override is None or override == _TYPESTR[typestr]):
        dname = _TYPESTR[typestr]
    elif override is not None and typestr in _RAW_OK[override]:
        dname = override
    else:
        raise TypeError(f"{_fn(where)}: {name} has typestr {typestr!r}; expected float32 ('<f4') or float16 ('<f2'), "
                        "or raw bits with dtype='float32'|'float16'|'bfloat16'")
    item = int(typestr[2:]) if typestr[1] != "V" else 2
    if not _contiguous(shape, cai.get("strides"), item):
        raise ValueError(f"{_fn(where)}: {name} is not contiguous (strides {cai.get('strides')})")
    nbytes = int(np.prod(shape, dtype=np.int64)) * item
    if nbytes % _ITEM[dname]:
        raise ValueError(f"{_fn(where)}: {name} holds {nbytes} bytes, not a whole number of {dname} values")
    n = nbytes // _ITEM[dname]
    if item != _ITEM[dname]:
        shape = (n,)
    ptr = int(cai["data"][0])
    stream = cai.get("stream")
    stream = 0 if stream in (None, 1) else int(stream)
    mod = type(x).__module__.split(".")[0]
    if mod == "cupy":
        import cupy
        return Arr("cupy", dname, shape, n, ptr=ptr, device=int(x.device.id),
                   stream=int(cupy.cuda.get_current_stream().ptr), obj=x)
    if isinstance(x, DeviceBuffer):
        return Arr("vramkit", dname, shape, n, ptr=ptr, device=int(x.device), stream=int(x.stream), obj=x)
    dev = pointer_device(ptr) if ptr else 0
    if dev < 0:
        raise ValueError(f"{_fn(where)}: {name}'s __cuda_array_interface__ points at memory that is not on a GPU")
    return Arr("cai", dname, shape, n, ptr=ptr, device=dev, stream=stream, obj=x)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32), ("dtype", _DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


def _dlpack(x, override, where: str, name: str) -> Arr:
    dev_type, dev_id = x.__dlpack_device__()
    if int(dev_type) == 1:  # kDLCPU
        return _numpy(np.from_dlpack(x), override, where, name)
    if int(dev_type) not in (2, 13):  # kDLCUDA, kDLCUDAManaged
        raise TypeError(f"{_fn(where)}: {name} is on DLPack device type {dev_type}; expected CUDA or CPU")
    cap = x.__dlpack__()
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    t = _DLTensor.from_address(get(cap, b"dltensor"))  # DLManagedTensor starts with its DLTensor
    shape = tuple(t.shape[i] for i in range(t.ndim))
    code, bits = t.dtype.code, t.dtype.bits
    found = {(2, 32): "float32", (2, 16): "float16", (4, 16): "bfloat16"}.get((code, bits))
    if t.dtype.lanes != 1 or found is None or (override is not None and override != found):
        raise TypeError(f"{_fn(where)}: {name} has DLPack dtype (code {code}, {bits} bits); expected float32, float16 "
                        "or bfloat16")
    strides = None if not t.strides else tuple(t.strides[i] * (bits // 8) for i in range(t.ndim))
    if not _contiguous(shape, strides, bits // 8):
        raise ValueError(f"{_fn(where)}: {name} is not contiguous")
    n = int(np.prod(shape, dtype=np.int64))
    return Arr("dlpack", found, shape, n, ptr=(t.data or 0) + t.byte_offset, device=int(dev_id), obj=x, keep=cap)


def describe(x, dtype=None, *, where: str = "quantize", name: str = "x") -> Arr:
    """Reads what x is: its kind, dtype, shape, pointer, device and the stream its work is on."""
    override = _check_dtype(dtype, where)
    if isinstance(x, np.ndarray):
        return _numpy(x, override, where, name)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return _torch(torch, x, override, where, name)
    if isinstance(x, DeviceBuffer):
        if override is None:
            raise TypeError(f"{_fn(where)}: a DeviceBuffer holds raw bytes: say what they are with "
                            "dtype='float32', 'float16' or 'bfloat16'")
        if x.nbytes % _ITEM[override]:
            raise ValueError(f"{_fn(where)}: the DeviceBuffer's {x.nbytes} bytes are not a whole number of {override} values")
        n = x.nbytes // _ITEM[override]
        from .. import backend
        if backend() != "cuda":  # the simulated host device: its memory is host memory
            raw = np.frombuffer(x.copy_to_host(), dtype=np.uint8)
            host = raw.view(np.float32 if override == "float32" else np.float16 if override == "float16" else np.uint16)
            return Arr("vramkit-host", override, (n,), n, host=host, obj=x)
        return _cai(x, x.__cuda_array_interface__, override, where, name)
    try:
        cai = getattr(x, "__cuda_array_interface__", None)
    except Exception:  # noqa: BLE001 - a producer that refuses (e.g. an unsupported dtype)
        cai = None
    if isinstance(cai, dict):
        return _cai(x, cai, override, where, name)
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        return _dlpack(x, override, where, name)
    raise TypeError(f"{_fn(where)}: {name} is a {type(x).__name__}; expected a NumPy array, a PyTorch tensor, a CuPy "
                    "array, a vramkit.DeviceBuffer, or an object with __cuda_array_interface__ or __dlpack__")


# ---------------------------------------------------------------- the kernels' library

_lib = None
_lib_error: str | None = None


def library():
    """libvramkit_kernels through ctypes; RuntimeError saying why when it is not there."""
    global _lib, _lib_error
    if _lib is None and _lib_error is None:
        path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "libvramkit_kernels.so")
        if not os.path.exists(path):
            _lib_error = ("vramkit was built without its CUDA kernels (no CUDA compiler was found at build time): "
                          "vramkit.quant works on NumPy arrays only")
        else:
            try:
                lib = ctypes.CDLL(path)
            except OSError as e:
                _lib_error = f"vramkit's CUDA kernels could not be loaded ({e})"
            else:
                i, i64, p = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p
                lib.vk_quant_encode.argtypes = [i, i, p, i64, i, p, p, i, p]
                lib.vk_quant_decode.argtypes = [i, i, p, p, p, p, i64, i, p, i, p]
                lib.vk_quant_compress_scales.argtypes = [p, i64, p, p, i, p]
                lib.vk_quant_table.argtypes = [i, i, p, i]
                lib.vk_quant_pointer_device.argtypes = [p]
                lib.vk_quant_set_launch.argtypes = [i, i, i]
                lib.vk_quant_set_max_blocks.argtypes = [i]
                lib.vk_quant_probe_traffic.argtypes = [p, i, p, i, i64, i, p]
                for f in ("vk_quant_encode", "vk_quant_decode", "vk_quant_compress_scales", "vk_quant_table",
                          "vk_quant_pointer_device", "vk_quant_set_launch", "vk_quant_set_max_blocks", "vk_quant_probe_traffic"):
                    getattr(lib, f).restype = i
                lib.vk_quant_last_error.restype = ctypes.c_char_p
                lib.vk_quant_last_error.argtypes = []
                _lib = lib
    if _lib is None:
        raise RuntimeError(_lib_error)
    return _lib


def kernels_available() -> bool:
    try:
        library()
        return True
    except RuntimeError:
        return False


def check(rc: int) -> None:
    if rc:
        msg = library().vk_quant_last_error().decode(errors="replace")
        raise (ValueError if rc == 1 else RuntimeError)(msg)


def pointer_device(ptr: int) -> int:
    return int(library().vk_quant_pointer_device(ptr))
