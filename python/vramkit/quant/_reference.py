"""NumPy reference of the quantization kernels: the same format and the same fp32 steps, so the
GPU results equal these bit for bit (python/tests/test_gpu_quant.py checks it on the device).

Encoding one block of fp32 values x (fp16 and bf16 inputs are widened exactly first):
  absmax = max |x|                        (0 for an all-zero block; NaN is skipped)
  inv    = min(QMAX / absmax, FLT_MAX)    (fp32 division, round to nearest even; 0 when absmax == 0)
  v      = x * inv                        (fp32 product, no fused multiply-add)
  code   = int8:   clamp(rint(v), -127, 127)       (rint: half to even)
           fp8:    v cast to e4m3fn/e5m2, nearest even, saturating to the largest finite value
           tables: the index of the nearest table value, ties to the lower one (see _formats)
Decoding: value(code) * (absmax / QMAX), both fp32 steps, then rounded to the output dtype.
"""
from __future__ import annotations

import numpy as np

from ._formats import (F32_MAX, FOUR_BIT, QMAX, SCALE_GROUP, SPECS, bucket_table, decode_table)


def to_f32(a: np.ndarray, dtype: str) -> np.ndarray:
    """Widens float32/float16 values or bfloat16 bit patterns (uint16) to fp32, exactly."""
    if dtype == "float32":
        return np.ascontiguousarray(a, dtype=np.float32).reshape(-1)
    if dtype == "float16":
        return np.ascontiguousarray(a).reshape(-1).astype(np.float32)
    bits = np.ascontiguousarray(a).reshape(-1).view(np.uint16).astype(np.uint32) << np.uint32(16)
    return bits.view(np.float32)


def from_f32(v: np.ndarray, dtype: str) -> np.ndarray:
    """Rounds fp32 to the output dtype, nearest even (bfloat16 comes back as uint16 bits)."""
    if dtype == "float32":
        return v
    if dtype == "float16":
        with np.errstate(over="ignore"):  # beyond 65504 rounds to inf, as __float2half_rn does
            return v.astype(np.float16)
    u = v.view(np.uint32)
    r = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    r[np.isnan(v)] = 0x7FFF
    return r


def fp8_encode(v: np.ndarray, fmt: str) -> np.ndarray:
    """fp32 -> float8 bits, round to nearest even, saturating (what cvt.rn.satfinite does; equal to
    PyTorch's cast for every value up to the largest finite one). NaN -> 0x7f."""
    mbits, emin, maxv = (3, -6, 448.0) if fmt == "fp8_e4m3" else (2, -14, 57344.0)
    a = np.abs(v).astype(np.float64)
    nan = np.isnan(a)
    a[nan] = 0.0
    e = np.frexp(a)[1]
    quantum = np.ldexp(1.0, np.maximum(e - 1, emin) - mbits)
    with np.errstate(invalid="ignore", over="ignore"):
        r = np.minimum(np.rint(a / quantum) * quantum, maxv)  # every step exact in float64
    r[np.isinf(a)] = maxv
    e2 = np.frexp(r)[1] - 1
    normal = r >= 2.0 ** emin
    field = np.where(normal, e2 - emin + 1, 0)
    mant = np.where(normal, r / np.ldexp(1.0, e2) - 1.0, r / 2.0 ** emin) * (1 << mbits)
    code = (field << mbits) | np.rint(mant).astype(np.int64)
    code |= np.signbit(v).astype(np.int64) << 7
    code[nan] = 0x7F
    return code.astype(np.uint8)


def table_encode(v: np.ndarray, fmt: str) -> np.ndarray:
    """Nearest table value through the bucket table, exactly as the kernels look it up."""
    s = SPECS[fmt]
    thr, lo, hi = bucket_table(fmt)
    u = np.ascontiguousarray(v, dtype=np.float32).view(np.uint32)
    mag = ((u & np.uint32(0x7FFFFFFF)) >> np.uint32(23 - s.mbits)).astype(np.int64) - (s.e0 << s.mbits)
    key = (u >> np.uint32(31)).astype(np.int64) * s.per_sign + np.clip(mag, -1, s.octaves << s.mbits) + 1
    return np.where(v > thr[key], hi[key], lo[key]).astype(np.uint8)


def block_absmax(x32: np.ndarray, block: int) -> np.ndarray:
    n = x32.size
    nb = -(-n // block)
    xb = np.zeros(nb * block, dtype=np.float32)
    xb[:n] = x32
    if nb == 0:
        return np.zeros(0, dtype=np.float32)
    return np.fmax(np.fmax.reduce(np.abs(xb.reshape(nb, block)), axis=1), np.float32(0))


def encode(x32: np.ndarray, fmt: str, block: int):
    """-> (codes uint8: n bytes, or n/2 for 4-bit formats; absmax fp32 per block)."""
    n = x32.size
    absmax = block_absmax(x32, block)
    with np.errstate(divide="ignore", over="ignore"):
        inv = np.where(absmax > 0, np.fmin(np.float32(QMAX[fmt]) / absmax, F32_MAX), np.float32(0))
    inv = inv.astype(np.float32)
    with np.errstate(invalid="ignore"):  # inf * 0: NaN, below
        v = x32 * np.repeat(inv, block)[:n]
    # A NaN product is the positive NaN, as a GPU's multiply gives it (x86 gives inf * 0 and a
    # negative NaN times anything the sign bit); the table formats' code depends on the sign.
    v[np.isnan(v)] = np.float32(np.nan)
    if fmt == "int8":
        codes = np.fmin(np.fmax(np.rint(v), np.float32(-127)), np.float32(127)).astype(np.int8).view(np.uint8)
    elif fmt in ("fp8_e4m3", "fp8_e5m2"):
        codes = fp8_encode(v, fmt)
    else:
        codes = table_encode(v, fmt)
    if fmt in FOUR_BIT:
        codes = ((codes[0::2] << 4) | codes[1::2]).astype(np.uint8)
    return np.ascontiguousarray(codes), absmax


def unpack(codes: np.ndarray, fmt: str, n: int) -> np.ndarray:
    if fmt not in FOUR_BIT:
        return codes[:n]
    c = np.empty(n, dtype=np.uint8)
    c[0::2] = codes[: n // 2] >> 4
    c[1::2] = codes[: n // 2] & 15
    return c


def compress_scales(absmax: np.ndarray):
    """Double quantization: per group of 256 absmax values, (min, step) and one byte each."""
    nb = absmax.size
    g = -(-nb // SCALE_GROUP)
    if nb == 0:
        return np.zeros(0, np.uint8), np.zeros(0, np.float32)
    a = np.full(g * SCALE_GROUP, absmax[-1], dtype=np.float32)  # a repeated value changes no min/max
    a[:nb] = absmax
    a = a.reshape(g, SCALE_GROUP)
    lo = np.fmin.reduce(a, axis=1)
    rng = (np.fmax.reduce(a, axis=1) - lo).astype(np.float32)
    with np.errstate(divide="ignore", over="ignore"):
        inv = np.where(rng > 0, np.fmin(np.float32(255) / rng, F32_MAX), np.float32(0)).astype(np.float32)
    q = np.fmin(np.rint((a - lo[:, None]) * inv[:, None]), np.float32(255)).astype(np.uint8).reshape(-1)[:nb]
    params = np.stack([lo, (rng / np.float32(255)).astype(np.float32)], axis=1).astype(np.float32).reshape(-1)
    return q, params


def expand_scales(q8: np.ndarray, params: np.ndarray) -> np.ndarray:
    g = np.arange(q8.size) // SCALE_GROUP
    return (params[0::2][g] + q8.astype(np.float32) * params[1::2][g]).astype(np.float32)


def decode(codes: np.ndarray, absmax: np.ndarray, fmt: str, block: int, n: int) -> np.ndarray:
    """-> fp32 values (n)."""
    c = unpack(codes, fmt, n)
    s = (absmax / np.float32(QMAX[fmt])).astype(np.float32)
    with np.errstate(invalid="ignore"):  # a zero code times an infinite scale: NaN, as on the GPU
        return (decode_table(fmt)[c] * np.repeat(s, block)[:n]).astype(np.float32)
