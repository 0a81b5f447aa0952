"""Block-wise quantization of buffers: store fp32/fp16/bf16 data as 8 or 4 bits per value.

>>> import numpy as np, vramkit.quant as vq
>>> x = np.random.default_rng(0).standard_normal(4096).astype(np.float32)
>>> q = vq.quantize(x, "nf4", block=64)
>>> q.nbytes, q.bytes_saved
(2304, 14080)
>>> y = q.dequantize()          # float32 again, within the format's error

Formats: ``int8`` (symmetric absmax), ``int8_dynamic`` (the signed dynamic 8-bit map),
``fp8_e4m3`` and ``fp8_e5m2`` (per-block scaled float8), ``nf4`` and ``fp4`` (two codes per
byte); each block of ``block`` elements (a power of two, 32..4096) keeps one fp32 absmax, or with
``double_quant=True`` one byte plus a small per-256-blocks header. docs/quantization.md has the
exact formats.

GPU inputs (PyTorch, CuPy, vramkit.DeviceBuffer, ``__cuda_array_interface__`` or DLPack objects)
run on the CUDA kernels, ordered on the input's stream (the framework's current stream, or
``stream=``) without waiting for the device; their storage and dequantized outputs come from
vramkit's pool. NumPy arrays (and CPU tensors) run the NumPy reference, which the kernels equal bit
for bit.
"""
from __future__ import annotations

import sys

import numpy as np

from .. import _vramkit
from . import _reference as ref
from ._arrays import Arr, check, describe, kernels_available, library
from ._formats import (DEFAULT_BLOCK, DTYPES, FORMATS, FOUR_BIT, ITEMSIZE, SCALE_GROUP, check_block,
                       check_format)

__all__ = ["quantize", "dequantize", "QuantizedBuffer", "FORMATS", "kernels_available", "set_launch"]

_ALIGN = 256  # each part of a buffer's storage starts on this boundary


def set_launch(tile: int = 0, grid: str = "auto", table: str = "auto", max_blocks: int = 0) -> None:
    """Shape of the kernels' later launches, for the whole process: a tuning knob for benchmarks
    (codes and values do not depend on it). ``tile``: elements an encoder's thread block takes at
    a time, 0 for the default (4096) or 8192 (which also doubles a decoder's tile, by default 2048
    fp32 or 4096 16-bit elements); ``grid``: ``"persistent"`` (the resident thread blocks loop
    over the tiles, loading the next while they work on the current one), ``"tiles"`` (one thread
    block per tile) or ``"auto"`` (the default: per kernel, from the H200's figures: a block per
    tile for every decoder and for the int8/fp8 encoders, persistent for the table formats'
    encoders); ``table``: which
    table the 4-bit encoders (nf4, fp4) read, ``"buckets"`` (44 entries, indexed by the value's
    clamped exponent and top mantissa bits), ``"direct"`` (2048 entries, indexed by its top 11
    bits: fewer instructions, a bigger table for each thread block to build) or ``"auto"`` (the
    default: direct with a persistent grid, buckets with a block per tile); ``max_blocks``: at
    most this many thread blocks in a persistent grid (0, the default: as many as are resident;
    the GPU tests use a few, so that every block loops over several tiles)."""
    grids, tables = {"auto": 0, "persistent": 1, "tiles": 2}, {"auto": 0, "buckets": 1, "direct": 2}
    if isinstance(tile, bool) or not isinstance(tile, int):
        raise TypeError(f"set_launch: tile must be an int, not {type(tile).__name__}")
    if grid not in grids:
        raise ValueError(f"set_launch: grid must be 'auto', 'persistent' or 'tiles', not {grid!r}")
    if table not in tables:
        raise ValueError(f"set_launch: table must be 'auto', 'buckets' or 'direct', not {table!r}")
    if isinstance(max_blocks, bool) or not isinstance(max_blocks, int) or max_blocks < 0:
        raise ValueError(f"set_launch: max_blocks must be an int >= 0, not {max_blocks!r}")
    check(library().vk_quant_set_launch(tile, grids[grid], tables[table]))
    check(library().vk_quant_set_max_blocks(max_blocks))


def _align(n: int, a: int = _ALIGN) -> int:
    return (n + a - 1) // a * a


def _device_library():
    """The kernels, once it is clear GPU memory can be allocated through vramkit."""
    lib = library()
    if _vramkit.backend() != "cuda":
        raise RuntimeError("vramkit.quant: the input is on a GPU but vramkit runs on its simulated host device "
                           f"({_vramkit.cuda_unavailable_reason() or 'VRAMKIT_BACKEND=host'}); GPU arrays need the cuda backend")
    return lib


def _stream_of(stream, arr: Arr) -> int:
    return arr.stream if stream is None else int(_vramkit.to_stream(stream))


class QuantizedBuffer:
    """A quantized copy of an array: its codes and per-block scales, and how to get values back.

    Attributes: ``format``, ``shape``, ``dtype`` (of the original), ``block``, ``double_quant``,
    ``numel``, ``device`` (``None`` for host data), ``nbytes`` (memory held), ``original_nbytes``,
    ``bytes_saved``, ``ratio``; ``codes``, ``absmax`` (``None`` with double quantization),
    ``scale_codes`` and ``scale_params`` (double quantization) as NumPy arrays on the host or
    DeviceBuffers on the GPU.
    """

    def __init__(self, *, format, shape, dtype, block, double_quant, numel, kind, device, stream, np_dtype,
                 codes, absmax, scale_codes, scale_params, storage, nbytes):
        self.format, self.shape, self.dtype, self.block = format, tuple(shape), dtype, block
        self.double_quant, self.numel, self.device = double_quant, numel, device
        self._kind, self._stream, self._np_dtype = kind, stream, np_dtype
        self.codes, self.absmax, self.scale_codes, self.scale_params = codes, absmax, scale_codes, scale_params
        self._storage = storage
        self.nbytes = nbytes
        self._freed = False

    @property
    def original_nbytes(self) -> int:
        return self.numel * ITEMSIZE[self.dtype]

    @property
    def bytes_saved(self) -> int:
        return self.original_nbytes - self.nbytes

    @property
    def ratio(self) -> float:
        """original bytes / stored bytes"""
        return self.original_nbytes / self.nbytes if self.nbytes else float("inf")

    @property
    def nblocks(self) -> int:
        return -(-self.numel // self.block)

    def __repr__(self) -> str:
        where = "host" if self.device is None else f"cuda:{self.device}"
        return (f"<vramkit.quant.QuantizedBuffer {self.format} block={self.block}{' double_quant' if self.double_quant else ''}"
                f" {self.dtype}{list(self.shape)} on {where}: {self.nbytes} bytes "
                f"({self.bytes_saved} saved, {self.ratio:.2f}x smaller){' freed' if self._freed else ''}>")

    def free(self) -> None:
        """Returns the storage to vramkit's pool now (GPU), or drops the arrays (host)."""
        if self._freed:
            raise ValueError("QuantizedBuffer.free(): already freed")
        self.codes = self.absmax = self.scale_codes = self.scale_params = None  # the views of the storage
        if self._storage is not None:
            self._storage.free()
        self._freed = True

    # ------------------------------------------------------------------ decoding
    def dequantize(self, out=None, *, dtype=None, stream=None):
        """The values again, as the kind of array that was quantized (NumPy array, tensor, CuPy array,
        DeviceBuffer), in ``dtype`` (default: the original dtype). ``out``: an array of as many
        values of that dtype to write instead (contiguous, on the same device)."""
        if self._freed:
            raise ValueError("QuantizedBuffer.dequantize(): the buffer was freed")
        dtype = self.dtype if dtype is None else dtype
        if dtype not in DTYPES:
            raise ValueError(f"vramkit.quant.dequantize: dtype must be 'float32', 'float16' or 'bfloat16' (got {dtype!r})")
        if self.device is None:
            return self._dequantize_host(out, dtype)
        return self._dequantize_device(out, dtype, stream)

    def _host_absmax(self) -> np.ndarray:
        return self.absmax if not self.double_quant else ref.expand_scales(self.scale_codes, self.scale_params)

    def _dequantize_host(self, out, dtype):
        y = ref.from_f32(ref.decode(self.codes, self._host_absmax(), self.format, self.block, self.numel), dtype)
        if out is not None:
            o = describe(out, dtype, where="dequantize", name="out")
            if o.on_device:
                raise ValueError("vramkit.quant.dequantize: the data is on the host but out is on a GPU")
            _check_out(o, self.numel, dtype)
            dst = o.host.reshape(-1)
            if not dst.flags.writeable:
                raise ValueError("vramkit.quant.dequantize: out is read-only")
            dst[...] = y.view(dst.dtype)
            if o.kind == "vramkit-host":
                o.obj.copy_from_host(dst.tobytes())
            return out
        if self._kind == "torch-cpu":
            import torch
            if dtype == "bfloat16":
                return torch.from_numpy(y.view(np.int16)).view(torch.bfloat16).reshape(self.shape)
            return torch.from_numpy(y).reshape(self.shape)
        if self._kind == "vramkit-host":
            from .. import alloc
            buf = alloc(y.nbytes)
            if y.nbytes:
                buf.copy_from_host(y.tobytes())
            return buf
        if dtype == "bfloat16" and self._np_dtype is not None and self._np_dtype.name == "bfloat16":
            y = y.view(self._np_dtype)  # ml_dtypes.bfloat16 in, ml_dtypes.bfloat16 out
        return y.reshape(self.shape)

    def _dequantize_device(self, out, dtype, stream):
        lib = _device_library()
        torch = sys.modules.get("torch")
        if out is not None:
            o = describe(out, dtype, where="dequantize", name="out")
            if o.device != self.device:
                raise ValueError(f"vramkit.quant.dequantize: out is on {'the host' if o.device is None else f'cuda:{o.device}'}"
                                 f", the data on cuda:{self.device}")
            _check_out(o, self.numel, dtype)
            st = _stream_of(stream, o) if (stream is not None or o.kind in ("torch", "cupy")) else self._stream
            dst_ptr, result, holder = o.ptr, out, None
        else:
            if stream is not None:
                st = int(_vramkit.to_stream(stream))
            elif self._kind == "torch" and torch is not None:
                st = torch.cuda.current_stream(self.device).cuda_stream
            else:
                st = self._stream
            from .. import alloc
            holder = alloc(self.numel * ITEMSIZE[dtype], stream=st, device=self.device)
            dst_ptr, result = holder.ptr, None
        if st != self._storage.stream:
            self._storage.record_stream(st)  # not reused before this stream's read is done
        absmax = 0 if self.double_quant else self.absmax.ptr
        q8 = self.scale_codes.ptr if self.double_quant else 0
        params = self.scale_params.ptr if self.double_quant else 0
        if self.numel:
            check(lib.vk_quant_decode(FORMATS[self.format], DTYPES[dtype], self.codes.ptr, absmax, q8, params,
                                      self.numel, self.block, dst_ptr, self.device, st))
        return result if holder is None else _wrap(holder, self._kind, dtype, self.shape)


def _check_out(o: Arr, n: int, dtype: str) -> None:
    if o.dtype != dtype:
        raise TypeError(f"vramkit.quant.dequantize: out holds {o.dtype}, not {dtype}")
    if o.numel != n:
        raise ValueError(f"vramkit.quant.dequantize: out holds {o.numel} values, not {n}")


def _wrap(buf, kind: str, dtype: str, shape: tuple):
    """A device buffer as the kind of array that came in (the array keeps the buffer alive)."""
    if kind == "torch":
        import torch
        tdt = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
        if buf.nbytes == 0:
            return torch.empty(shape, dtype=tdt, device=f"cuda:{buf.device}")
        return torch.from_dlpack(buf).view(tdt).view(shape)
    if kind == "cupy" and dtype != "bfloat16":
        import cupy
        if buf.nbytes == 0:
            return cupy.empty(shape, dtype=dtype)
        return cupy.asarray(buf).view(np.dtype(dtype)).reshape(shape)
    return buf


def _sub(storage, offset: int, nbytes: int):
    return storage[offset:offset + nbytes]


def quantize(x, format: str = "int8", block: int | None = None, double_quant: bool = False, *, dtype=None,
             stream=None) -> QuantizedBuffer:
    """Quantizes x block-wise (see the module help). ``dtype`` says what a raw buffer holds (a
    vramkit.DeviceBuffer, or uint16 bfloat16 bits); ``stream`` overrides the stream the work is
    ordered on. Raises ValueError/TypeError for an unknown format, a block that is not a power of
    two from 32 to 4096, an input that is not contiguous or not fp32/fp16/bf16, or an odd element
    count for the 4-bit formats."""
    format = check_format(format)
    block = DEFAULT_BLOCK[format] if block is None else check_block(block)
    if not isinstance(double_quant, (bool, np.bool_)):
        raise TypeError(f"double_quant must be True or False (got {double_quant!r})")
    a = describe(x, dtype, where="quantize", name="x")
    if format in FOUR_BIT and a.numel % 2:
        raise ValueError(f"vramkit.quant.quantize: {format} packs two codes per byte, so the element count must be "
                         f"even (got {a.numel})")
    n, nb = a.numel, -(-a.numel // block)
    code_bytes = n // 2 if format in FOUR_BIT else n
    common = dict(format=format, shape=a.shape, dtype=a.dtype, block=block, double_quant=bool(double_quant), numel=n,
                  kind=a.kind, np_dtype=a.np_dtype)
    if not a.on_device:
        codes, absmax = ref.encode(ref.to_f32(a.host, a.dtype), format, block)
        if double_quant:
            q8, params = ref.compress_scales(absmax)
            return QuantizedBuffer(**common, device=None, stream=0, codes=codes, absmax=None, scale_codes=q8,
                                   scale_params=params, storage=None, nbytes=codes.nbytes + q8.nbytes + params.nbytes)
        return QuantizedBuffer(**common, device=None, stream=0, codes=codes, absmax=absmax, scale_codes=None,
                               scale_params=None, storage=None, nbytes=codes.nbytes + absmax.nbytes)

    lib = _device_library()
    from .. import alloc
    st = _stream_of(stream, a)
    groups = -(-nb // SCALE_GROUP)
    scale_off = _align(code_bytes)
    if double_quant:
        params_off = scale_off + _align(nb, 16)
        total = params_off + 8 * groups
    else:
        total = scale_off + 4 * nb
    storage = alloc(total, stream=st, device=a.device)
    codes = _sub(storage, 0, code_bytes)
    if double_quant:
        q8, params = _sub(storage, scale_off, nb), _sub(storage, params_off, 8 * groups)
        scratch = alloc(4 * nb, stream=st, device=a.device)
        check(lib.vk_quant_encode(FORMATS[format], DTYPES[a.dtype], a.ptr, n, block, codes.ptr, scratch.ptr,
                                  a.device, st))
        check(lib.vk_quant_compress_scales(scratch.ptr, nb, q8.ptr, params.ptr, a.device, st))
        scratch.free()  # back to the pool in stream order: later work on st runs after the kernels
        absmax = None
    else:
        absmax = _sub(storage, scale_off, 4 * nb)
        q8 = params = None
        check(lib.vk_quant_encode(FORMATS[format], DTYPES[a.dtype], a.ptr, n, block, codes.ptr, absmax.ptr,
                                  a.device, st))
    return QuantizedBuffer(**common, device=a.device, stream=st, codes=codes, absmax=absmax, scale_codes=q8,
                           scale_params=params, storage=storage, nbytes=total)


def dequantize(q: QuantizedBuffer, out=None, *, dtype=None, stream=None):
    """``q.dequantize(out, dtype=..., stream=...)``"""
    if not isinstance(q, QuantizedBuffer):
        raise TypeError(f"vramkit.quant.dequantize: expected a QuantizedBuffer, not {type(q).__name__}")
    return q.dequantize(out, dtype=dtype, stream=stream)
