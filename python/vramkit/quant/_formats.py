"""The formats' constants and code tables, computed exactly as the CUDA kernels compute them
(cpp/kernels/quant_tables.cuh): the same double-precision steps, then one rounding to fp32."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

FORMATS = {"int8": 0, "int8_dynamic": 1, "fp8_e4m3": 2, "fp8_e5m2": 3, "nf4": 4, "fp4": 5}
FOUR_BIT = frozenset({"nf4", "fp4"})
TABLE_FORMATS = frozenset({"int8_dynamic", "nf4", "fp4"})
# Normalized range of each format: a block's values are multiplied by QMAX / absmax.
QMAX = {"int8": 127.0, "int8_dynamic": 1.0, "fp8_e4m3": 448.0, "fp8_e5m2": 57344.0, "nf4": 1.0, "fp4": 6.0}
DEFAULT_BLOCK = {"int8": 256, "int8_dynamic": 256, "fp8_e4m3": 256, "fp8_e5m2": 256, "nf4": 64, "fp4": 64}
DTYPES = {"float32": 0, "float16": 1, "bfloat16": 2}
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
SCALE_GROUP = 256  # absmax values per group in double quantization
MIN_BLOCK, MAX_BLOCK = 32, 4096
F32_MAX = np.float32(np.finfo(np.float32).max)
F32_INF = np.float32(np.inf)


def check_block(block) -> int:
    if isinstance(block, bool) or not isinstance(block, (int, np.integer)):
        raise TypeError(f"block must be an int, not {type(block).__name__}")
    block = int(block)
    if block < MIN_BLOCK or block > MAX_BLOCK or block & (block - 1):
        raise ValueError(f"block must be a power of two from {MIN_BLOCK} to {MAX_BLOCK} (got {block})")
    return block


def check_format(fmt) -> str:
    if not isinstance(fmt, str):
        raise TypeError(f"format must be a string, one of {', '.join(FORMATS)} (got {type(fmt).__name__})")
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}: expected one of {', '.join(FORMATS)}")
    return fmt


@dataclass(frozen=True)
class TableSpec:
    values: int   # sorted distinct values (K); K-1 thresholds
    slots: int    # thresholds padded with +inf to this many
    e0: int       # biased exponent of the lowest regular octave of the bucket table
    octaves: int
    mbits: int    # mantissa bits that split an octave

    @property
    def per_sign(self) -> int:
        return (self.octaves << self.mbits) + 2

    @property
    def buckets(self) -> int:
        return 2 * self.per_sign


SPECS = {"int8_dynamic": TableSpec(256, 256, 107, 20, 6), "nf4": TableSpec(16, 16, 122, 5, 2),
         "fp4": TableSpec(15, 16, 125, 5, 2)}

# NormalFloat4 (QLoRA, as bitsandbytes lists it): normal quantiles scaled to [-1, 1].
NF4 = (-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
       -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
       0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
       0.7229568362236023, 1.0)
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # OCP MX FP4 magnitudes, codes 0..7
_DECADE = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)


def _dynamic_positive(p: int) -> float:
    """Positive half of the signed dynamic map, ascending: decade i holds the 2^i midpoints of
    2^i equal steps over [0.1, 1], scaled by 10^(i-6) (Dettmers 2015)."""
    i = (p + 1).bit_length() - 1
    j = p + 1 - (1 << i)
    return (0.1 + 0.9 * float(2 * j + 1) / float(2 << i)) * _DECADE[i]


@lru_cache(maxsize=None)
def sorted_values(fmt: str) -> np.ndarray:
    """The format's distinct values, ascending, as fp32."""
    if fmt == "int8_dynamic":
        pos = [_dynamic_positive(p) for p in range(127)]
        v = [-x for x in reversed(pos)] + [0.0] + pos + [1.0]
    elif fmt == "nf4":
        v = list(NF4)
    elif fmt == "fp4":
        v = [-m for m in reversed(E2M1[1:])] + list(E2M1)
    else:
        raise ValueError(f"{fmt} has no value table")
    out = np.array(v, dtype=np.float64).astype(np.float32)
    out.setflags(write=False)
    return out


@lru_cache(maxsize=None)
def code_of_index(fmt: str) -> np.ndarray:
    """The stored code of each sorted value (identity except for fp4's sign-magnitude codes)."""
    k = np.arange(SPECS[fmt].values)
    if fmt == "fp4":
        k = np.where(k < 7, 8 | (7 - k), k - 7)
    out = k.astype(np.uint8)
    out.setflags(write=False)
    return out


@lru_cache(maxsize=None)
def thresholds(fmt: str) -> np.ndarray:
    """Midpoints of neighbouring values (computed in float64, rounded once to fp32)."""
    v = sorted_values(fmt).astype(np.float64)
    out = ((v[:-1] + v[1:]) * 0.5).astype(np.float32)
    out.setflags(write=False)
    return out


def _fp8_decode(fmt: str) -> np.ndarray:
    c = np.arange(256)
    sign = np.where(c & 0x80, -1.0, 1.0)
    if fmt == "fp8_e4m3":  # e4m3fn: bias 7, no infinities, S.1111.111 is NaN
        e, m = (c >> 3) & 15, c & 7
        mag = np.where(e == 0, m * 2.0 ** -9, (1 + m / 8) * 2.0 ** (e - 7))
        mag = np.where((e == 15) & (m == 7), np.nan, mag)
    else:  # e5m2: bias 15, IEEE-style infinities and NaNs
        e, m = (c >> 2) & 31, c & 3
        mag = np.where(e == 0, m * 2.0 ** -16, (1 + m / 4) * 2.0 ** (e - 15))
        mag = np.where(e == 31, np.where(m == 0, np.inf, np.nan), mag)
    return (sign * mag).astype(np.float32)


@lru_cache(maxsize=None)
def decode_table(fmt: str) -> np.ndarray:
    """fp32 value of each code at scale 1 (256 entries for 8-bit formats, 16 for 4-bit)."""
    if fmt in ("fp8_e4m3", "fp8_e5m2"):
        out = _fp8_decode(fmt)
    elif fmt == "int8":
        out = np.arange(256, dtype=np.uint8).view(np.int8).astype(np.float32)
    elif fmt == "fp4":
        c = np.arange(16)
        mag = np.array(E2M1, dtype=np.float32)[c & 7]
        out = np.where(c & 8, -mag, mag).astype(np.float32)
    else:
        out = np.empty(256 if fmt == "int8_dynamic" else 16, dtype=np.float32)
        out[code_of_index(fmt)] = sorted_values(fmt)
    out.setflags(write=False)
    return out


def _f32(bits: int) -> np.float32:
    return np.array([bits], dtype=np.uint32).view(np.float32)[0]


@lru_cache(maxsize=None)
def bucket_table(fmt: str):
    """(thr fp32, low code, high code) per bucket; see quant_tables.cuh. Raises if a bucket
    would hold two thresholds (then one comparison would not finish the search)."""
    s = SPECS[fmt]
    thr = np.full(s.slots, F32_INF, dtype=np.float32)
    thr[: s.values - 1] = thresholds(fmt)
    codes = code_of_index(fmt)
    top = s.octaves << s.mbits
    nb = s.buckets
    t_thr = np.empty(nb, dtype=np.float32)
    lo_c = np.empty(nb, dtype=np.uint8)
    hi_c = np.empty(nb, dtype=np.uint8)
    real = thr[: s.slots - 1]
    for b in range(nb):
        sign, t = divmod(b, s.per_sign)
        if t == 0:
            lo_bits, hi_bits = 0, (s.e0 << 23) - 1
        elif t <= top:
            lo_bits = ((s.e0 << s.mbits) + t - 1) << (23 - s.mbits)
            hi_bits = lo_bits + (1 << (23 - s.mbits)) - 1
        else:
            lo_bits, hi_bits = (s.e0 + s.octaves) << 23, 0x7F800000
        vmin = -_f32(hi_bits) if sign else _f32(lo_bits)
        vmax = -_f32(lo_bits) if sign else _f32(hi_bits)
        lo = int(np.searchsorted(real, vmin, side="left"))
        hi = int(np.searchsorted(real, vmax, side="left"))
        if hi - lo > 1:
            raise AssertionError(f"{fmt}: bucket {b} holds {hi - lo} thresholds")
        t_thr[b] = thr[lo]
        lo_c[b] = codes[lo]
        hi_c[b] = codes[min(lo + 1, s.values - 1)]
    for a in (t_thr, lo_c, hi_c):
        a.setflags(write=False)
    return t_thr, lo_c, hi_c
