"""vramkit.quant on the host (CI, no GPU, no PyTorch): the NumPy reference's accuracy gates,
round trips, bad input, and the code tables the CUDA kernels share with it."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

import vramkit
import vramkit.quant as vq
from vramkit.quant import _formats as F
from vramkit.quant import _reference as R

BLOCKS = [32, 64, 128, 256, 512, 1024, 2048, 4096]
# bitsandbytes' expected errors on randn(1024, 1024) (tests/test_functional.py, RTX 4090, 200 samples):
# blocksize: (NF4 mean abs, NF4 mean rel, FP4 mean abs, FP4 mean rel). One sample's mean moves by about
# 0.1 % (0.5 % at block 4096, where there are only 256 blocks), so the gate allows 1 %.
BNB_4BIT = {32: (0.06775, 0.1897, 0.08893, 0.2424), 64: (0.07280, 0.2033, 0.09654, 0.2601),
            128: (0.07683, 0.2152, 0.10297, 0.2758), 256: (0.08034, 0.2261, 0.10868, 0.2898),
            1024: (0.08661, 0.2454, 0.11933, 0.3150), 4096: (0.09255, 0.2625, 0.12954, 0.3372)}


@pytest.fixture(scope="module")
def randn():
    return np.random.default_rng(20261203).standard_normal((1024, 1024)).astype(np.float32)


def errors(x, y):
    err = np.abs(x.astype(np.float64) - y.astype(np.float64))
    return err, float(err.mean()), float((err / (np.abs(x.astype(np.float64)) + 1e-8)).mean())


# ------------------------------------------------------------------ accuracy gates

@pytest.mark.parametrize("block", BLOCKS)
def test_int8_max_error_is_half_a_step(randn, block):
    q = vq.quantize(randn, "int8", block=block)
    y = q.dequantize()
    err = np.abs(randn.astype(np.float64) - y).reshape(-1, block)
    bound = q.absmax.astype(np.float64) / 254
    # absmax/254 is half a step; fp32 rounding of inv, x*inv and q*scale adds under 2^-21 absmax.
    assert np.all(err.max(axis=1) <= bound + q.absmax * 2.0 ** -21), f"worst {np.max(err.max(1) / bound)} steps/2"
    assert np.mean(err.max(axis=1) / bound) > 0.9  # the bound is tight, not vacuous


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("block", BLOCKS)
def test_dynamic_code_gates(randn, block, dtype):
    x = randn.astype(dtype)
    y = vq.quantize(x, "int8_dynamic", block=block).dequantize(dtype="float32")
    _, mean_abs, mean_rel = errors(x.astype(np.float32), y)
    assert mean_abs < 0.011 and mean_rel < 0.018, (mean_abs, mean_rel)


@pytest.mark.parametrize("block", sorted(BNB_4BIT))
@pytest.mark.parametrize("fmt", ["nf4", "fp4"])
def test_4bit_no_worse_than_bitsandbytes(randn, fmt, block):
    y = vq.quantize(randn, fmt, block=block).dequantize()
    _, mean_abs, mean_rel = errors(randn, y)
    want_abs, want_rel = BNB_4BIT[block][0:2] if fmt == "nf4" else BNB_4BIT[block][2:4]
    assert mean_abs <= want_abs * 1.01 and mean_rel <= want_rel * 1.01, (mean_abs, mean_rel, want_abs, want_rel)


def test_double_quant_costs_little_accuracy(randn):
    for fmt in ("nf4", "fp4", "int8"):
        plain = errors(randn, vq.quantize(randn, fmt, block=64).dequantize())[1]
        q = vq.quantize(randn, fmt, block=64, double_quant=True)
        dq = errors(randn, q.dequantize())[1]
        assert dq <= plain * 1.02, (fmt, plain, dq)
        assert q.absmax is None and q.scale_codes.size == q.nblocks


def _nearest_fp8(v: np.ndarray, fmt: str) -> np.ndarray:
    """Brute force: the finite float8 value nearest each v, ties to the even code (mantissa LSB 0)."""
    table = F.decode_table(fmt).astype(np.float64)
    finite = np.flatnonzero(np.isfinite(table))
    vals = table[finite]
    d = np.abs(v.astype(np.float64)[:, None] - vals[None, :])
    best = d.min(axis=1, keepdims=True)
    cand = np.where(d == best, finite[None, :], 1 << 20)
    even = np.where((cand & 1) == 0, cand, 1 << 20).min(axis=1)
    pick = np.where(even < (1 << 20), even, cand.min(axis=1))
    return table[pick]


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_is_round_to_nearest_even(fmt):
    rng = np.random.default_rng(7)
    qmax = F.QMAX[fmt]
    v = np.concatenate([rng.uniform(-qmax, qmax, 20000), rng.standard_normal(20000) * 2.0 ** rng.integers(-20, 4, 20000),
                        (F.decode_table(fmt)[:-1].astype(np.float64) + F.decode_table(fmt)[1:]) / 2]).astype(np.float32)
    v = v[np.isfinite(v) & (np.abs(v) <= qmax)]
    got = F.decode_table(fmt)[R.fp8_encode(v, fmt)]
    want = _nearest_fp8(v, fmt)
    assert np.array_equal(np.abs(got), np.abs(want)), v[np.abs(got) != np.abs(want)][:5]
    assert np.array_equal(np.signbit(got), np.signbit(v))


def test_fp8_saturates_and_keeps_nan():
    v = np.array([448.0, 463.9, 464.0, 1e9, -1e9, np.inf, np.nan, -0.0, 1e-30], dtype=np.float32)
    assert R.fp8_encode(v, "fp8_e4m3").tolist() == [0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0x7E, 0x7F, 0x80, 0x00]
    assert R.fp8_encode(np.array([57344.0, 1e9, -1e9], np.float32), "fp8_e5m2").tolist() == [0x7B, 0x7B, 0xFB]


@pytest.mark.parametrize("fmt", list(vq.FORMATS))
def test_a_nan_product_is_the_positive_nan(fmt):
    """An infinite absmax makes its block's scale 0 and the infinite element inf * 0 = NaN; a NaN
    input stays NaN. The GPU's multiply gives the positive NaN either way (x86 gives inf * 0 the
    sign bit), so the reference encodes every NaN product as +NaN: for the table formats the
    last value's code, whatever the input's sign."""
    block = 64
    x = np.zeros(4 * block, np.float32)
    x[1], x[5] = 1.0, -2.0
    x[0] = np.inf                                   # block 0: +inf, scale 0
    x[block] = -np.inf                              # block 1: -inf, scale 0
    x[2 * block] = np.uint32(0xFFC00000).view(np.float32)  # block 2: a negative NaN input
    x[2 * block + 1] = 3.0
    x[3 * block] = np.nan                           # block 3: a positive NaN input
    x[3 * block + 1] = -3.0
    codes, absmax = R.encode(x, fmt, block)
    c = R.unpack(codes, fmt, x.size)
    plus_nan = R.encode(np.array([np.nan, 1.0], np.float32), fmt, 32)  # a lone +NaN, scale 1
    want = R.unpack(plus_nan[0], fmt, 2)[0]
    for i in (0, block, 2 * block, 3 * block):
        assert c[i] == want, (fmt, i, int(c[i]), int(want))
    if fmt in ("nf4", "fp4", "int8_dynamic"):
        assert int(want) == int(F.code_of_index(fmt)[-1])  # the last value's code


# ------------------------------------------------------------------ round trips

@pytest.mark.parametrize("fmt", list(vq.FORMATS))
def test_exact_values_come_back_exactly(fmt):
    """Values on the format's grid (times a power-of-two absmax) survive a round trip bit for bit."""
    vals = F.decode_table(fmt) if fmt != "int8" else np.arange(-127, 128, dtype=np.float32)
    vals = vals[np.isfinite(vals)]
    absmax = float(np.abs(vals).max())
    scale = np.float32(4.0)
    x = np.resize(vals, 4096).astype(np.float32) * scale / np.float32(absmax / F.QMAX[fmt])
    x[::64] = np.float32(F.QMAX[fmt]) * scale / np.float32(absmax / F.QMAX[fmt])  # every block has the absmax
    y = vq.quantize(x, fmt, block=64).dequantize()
    assert np.array_equal(y, x)


def test_int8_rounds_half_to_even():
    x = np.array([127.0, 2.5, 3.5, -2.5, -0.5, 0.5, 1.5] + [0.0] * 25, dtype=np.float32)
    q = vq.quantize(x, "int8", block=32)
    assert q.codes.view(np.int8)[:7].tolist() == [127, 2, 4, -2, 0, 0, 2]


@pytest.mark.parametrize("n", [1, 31, 33, 4095, 4097, 12345])
@pytest.mark.parametrize("fmt", list(vq.FORMATS))
def test_tails_and_shapes(fmt, n):
    n += (fmt in F.FOUR_BIT) and n % 2
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32) * 3
    q = vq.quantize(x, fmt, block=32)
    assert q.nblocks == -(-n // 32) and q.absmax.size == q.nblocks
    assert q.codes.size == (n // 2 if fmt in F.FOUR_BIT else n)
    y = q.dequantize()
    assert y.shape == x.shape and y.dtype == np.float32
    # the last block's absmax covers only its own elements
    assert q.absmax[-1] == np.abs(x[(q.nblocks - 1) * 32:]).max()
    assert np.abs(y - x).max() <= 0.6 * q.absmax.max()


def test_dtypes_and_outputs():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, 64)).astype(np.float32)
    for dt in ("float16", "float32"):
        q = vq.quantize(x.astype(dt), "int8", block=64)
        assert q.dtype == dt and q.shape == (8, 64) and q.dequantize().dtype == np.dtype(dt)
    bits = R.from_f32(x.reshape(-1), "bfloat16").reshape(8, 64)  # bfloat16 as uint16 bits
    q = vq.quantize(bits, "nf4", block=64, dtype="bfloat16")
    assert q.dtype == "bfloat16" and q.original_nbytes == 1024
    y = q.dequantize()
    assert y.dtype == np.uint16 and y.shape == (8, 64)
    y32 = q.dequantize(dtype="float32")
    assert np.array_equal(y.reshape(-1), R.from_f32(y32.reshape(-1), "bfloat16"))
    out = np.empty((8, 64), np.float32)
    assert q.dequantize(out, dtype="float32") is out and np.array_equal(out, y32)


def test_bf16_and_fp16_rounding_of_outputs():
    v = np.array([1.0, 1.00390625, 1.01171875, -3.0e38, 3.4e38, 1e-40, -0.0], dtype=np.float32)
    assert R.from_f32(v, "bfloat16").tolist() == [0x3F80, 0x3F80, 0x3F82, 0xFF62, 0x7F80, 0x0001, 0x8000]
    with np.errstate(over="ignore"):
        assert np.array_equal(R.from_f32(v, "float16"), v.astype(np.float16))


def test_empty_input():
    q = vq.quantize(np.zeros(0, np.float32), "nf4")
    assert q.nbytes == 0 and q.dequantize().shape == (0,)


def test_bytes_accounting():
    x = np.ones(1 << 16, np.float32)
    q = vq.quantize(x, "int8", block=256)
    assert q.nbytes == (1 << 16) + 4 * 256 and q.bytes_saved == 4 * (1 << 16) - q.nbytes
    q4 = vq.quantize(x.astype(np.float16), "nf4", block=64, double_quant=True)
    assert q4.nbytes == (1 << 15) + 1024 + 8 * 4  # codes, one byte per block, (min, step) per 256 blocks
    assert 0.25 < q4.nbytes / q4.original_nbytes < 0.26
    assert "nf4" in repr(q4) and "saved" in repr(q4)


def test_deterministic_and_input_untouched():
    x = np.random.default_rng(5).standard_normal(50000).astype(np.float32)
    keep = x.copy()
    a, b = vq.quantize(x, "int8_dynamic", block=128), vq.quantize(x, "int8_dynamic", block=128)
    assert np.array_equal(a.codes, b.codes) and np.array_equal(a.absmax, b.absmax) and np.array_equal(x, keep)


def test_host_device_buffer():
    """A DeviceBuffer on the simulated host device goes through the reference and comes back as one."""
    if vramkit.backend() == "cuda":
        pytest.skip("the GPU tests cover DeviceBuffers on a real device")
    x = np.random.default_rng(9).standard_normal(4096).astype(np.float32)
    buf = vramkit.alloc(x.nbytes)
    buf.copy_from_host(x.tobytes())
    q = vq.quantize(buf, "fp8_e4m3", block=128, dtype="float32")
    y = q.dequantize()
    assert isinstance(y, vramkit.DeviceBuffer)
    assert np.array_equal(np.frombuffer(y.copy_to_host(), np.float32), vq.quantize(x, "fp8_e4m3", block=128).dequantize())


# ------------------------------------------------------------------ bad input

@pytest.mark.parametrize("call, exc, words", [
    (lambda x: vq.quantize(x, "int4"), ValueError, "unknown format"),
    (lambda x: vq.quantize(x, 8), TypeError, "format must be a string"),
    (lambda x: vq.quantize(x, "int8", block=100), ValueError, "power of two"),
    (lambda x: vq.quantize(x, "int8", block=16), ValueError, "from 32 to 4096"),
    (lambda x: vq.quantize(x, "int8", block=8192), ValueError, "from 32 to 4096"),
    (lambda x: vq.quantize(x, "int8", block=64.0), TypeError, "block must be an int"),
    (lambda x: vq.quantize(x[:, ::2], "int8"), ValueError, "not contiguous"),
    (lambda x: vq.quantize(x.astype(np.float64), "int8"), TypeError, "dtype float64"),
    (lambda x: vq.quantize(x.astype(np.int32), "int8"), TypeError, "dtype int32"),
    (lambda x: vq.quantize(x.reshape(-1)[:63], "nf4", block=32), ValueError, "even"),
    (lambda x: vq.quantize(x, "int8", double_quant="yes"), TypeError, "double_quant"),
    (lambda x: vq.quantize(x, "int8", dtype="float64"), ValueError, "dtype must be"),
    (lambda x: vq.quantize(x, "int8", dtype="bfloat16"), TypeError, "cannot be read as bfloat16"),
    (lambda x: vq.quantize([1.0, 2.0], "int8"), TypeError, "expected a NumPy array"),
    (lambda x: vq.quantize(vramkit.alloc(64), "int8"), TypeError, "dtype="),
    (lambda x: vq.quantize(x, "int8").dequantize(np.empty(5, np.float32)), ValueError, "holds 5 values"),
    (lambda x: vq.quantize(x, "int8").dequantize(np.empty(x.size, np.float16)), TypeError, "cannot be read as float32"),
    (lambda x: vq.quantize(x, "int8").dequantize(dtype="int8"), ValueError, "dtype must be"),
    (lambda x: vq.dequantize(x), TypeError, "QuantizedBuffer"),
])
def test_bad_input_gets_a_clear_error(call, exc, words):
    x = np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32)
    with pytest.raises(exc) as e:
        call(x)
    assert words in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def test_freed_buffer_refuses():
    q = vq.quantize(np.ones(64, np.float32), "int8", block=32)
    q.free()
    with pytest.raises(ValueError, match="freed"):
        q.dequantize()
    with pytest.raises(ValueError, match="already freed"):
        q.free()


# ------------------------------------------------------------------ code tables

def test_dynamic_map():
    v = F.sorted_values("int8_dynamic")
    assert v.size == 256 and np.all(np.diff(v) > 0)
    assert (v < 0).sum() == 127 and v[127] == 0 and v[-1] == 1.0 and v[0] == -v[-2]
    assert np.float32(0.99296875) == v[-2]  # top decade: midpoints of 64 steps over [0.1, 1]
    assert abs(v[128] - 5.5e-7) < 1e-12
    top = v[(v >= 0.1)]
    assert np.max(np.diff(top)) == pytest.approx(0.9 / 64, rel=1e-5)  # worst rounding error 0.00703 absmax


def test_nf4_and_fp4_tables():
    assert F.sorted_values("nf4").tolist() == [np.float32(c) for c in F.NF4]
    assert F.decode_table("fp4").tolist() == [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6]
    for fmt in ("nf4", "fp4", "int8_dynamic"):
        # every value's code decodes to that value
        assert np.array_equal(F.decode_table(fmt)[F.code_of_index(fmt)], F.sorted_values(fmt))


def test_fp8_tables():
    e4 = F.decode_table("fp8_e4m3")
    assert e4[0x7E] == 448 and np.isnan(e4[0x7F]) and e4[0x01] == 2.0 ** -9 and e4[0x38] == 1.0 and e4[0xBC] == -1.5
    assert np.nanmax(e4) == 448 and np.isnan(e4).sum() == 2
    e5 = F.decode_table("fp8_e5m2")
    assert e5[0x7B] == 57344 and e5[0x7C] == np.inf and e5[0x01] == 2.0 ** -16 and e5[0x3C] == 1.0
    assert np.isnan(e5).sum() == 6


@pytest.mark.parametrize("fmt", ["int8_dynamic", "nf4", "fp4"])
def test_bucket_lookup_equals_nearest_value(fmt):
    """The kernels' one-comparison lookup gives the index of the nearest value (ties to the lower),
    checked at every threshold and bucket edge, a few float steps either side, and at random."""
    s = F.SPECS[fmt]
    thr = F.thresholds(fmt)
    edges = []
    for t in range(s.per_sign):
        e = (s.e0 << 23) if t == 0 else ((s.e0 << s.mbits) + t - 1) << (23 - s.mbits)
        edges.append(e)
    edge_vals = np.array(edges, np.uint32).view(np.float32)
    centre = np.concatenate([thr, edge_vals, -edge_vals, [0.0, -0.0, 1.0, -1.0, 6.0, -6.0]]).astype(np.float32)
    steps = np.arange(-40, 41, dtype=np.int64)
    bits = centre.view(np.uint32).astype(np.int64)[:, None] + steps  # neighbours, a float step apart
    near = np.clip(bits, 0, 0xFFFFFFFF).astype(np.uint32).reshape(-1).view(np.float32)
    rng = np.random.default_rng(11)
    rand = np.concatenate([rng.uniform(-F.QMAX[fmt], F.QMAX[fmt], 200000),
                           rng.standard_normal(100000) * 10.0 ** rng.integers(-8, 1, 100000)]).astype(np.float32)
    v = np.concatenate([near, rand])
    v = v[np.isfinite(v)]
    got = R.table_encode(v, fmt)
    want = F.code_of_index(fmt)[np.searchsorted(thr, v, side="left")]
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{bad.size} differ, e.g. v={v[bad[:3]]} got {got[bad[:3]]} want {want[bad[:3]]}"


def test_kernel_library_tables_match():
    """libvramkit_kernels computes its tables with the same steps (host side of the same code the
    device runs): values, thresholds and bucket entries equal Python's bit for bit."""
    if not vq.kernels_available():
        pytest.skip("vramkit was built without its CUDA kernels (no nvcc)")
    from vramkit.quant._arrays import library
    lib = library()
    for name in ("int8_dynamic", "nf4", "fp4"):
        f = F.FORMATS[name]
        vals = np.zeros(256, np.float32)
        n = lib.vk_quant_table(f, 0, vals.ctypes.data, 256)
        assert np.array_equal(vals[:n].view(np.uint32), F.decode_table(name).view(np.uint32)), name
        thr = np.zeros(256, np.float32)
        n = lib.vk_quant_table(f, 1, thr.ctypes.data, 256)
        assert np.array_equal(thr[:n].view(np.uint32), F.thresholds(name).view(np.uint32)), name
        b = np.zeros((8192, 2), np.uint32)
        n = lib.vk_quant_table(f, 2, b.ctypes.data, 8192)
        t, lo, hi = F.bucket_table(name)
        assert n == t.size, (name, n)
        assert np.array_equal(b[:n, 0], t.view(np.uint32)) and np.array_equal(b[:n, 1], lo | (hi.astype(np.uint32) << 8))


@pytest.mark.parametrize("fmt", ["nf4", "fp4"])
def test_direct_table_lookup_equals_nearest_value(fmt):
    """The 4-bit encoders' direct table (index: a value's bits >> 21, from the kernel library's
    host side of the device code) gives the nearest value's code, as the reference does: at every
    threshold and every 2^21-bit edge, a few float steps either side, at random, and for +-0,
    +-inf and NaNs of both signs (+NaN and +inf the last value, -NaN and -inf the first)."""
    if not vq.kernels_available():
        pytest.skip("vramkit was built without its CUDA kernels (no nvcc)")
    from vramkit.quant._arrays import library
    d = np.zeros((2048, 2), np.uint32)
    assert library().vk_quant_table(F.FORMATS[fmt], 3, d.ctypes.data, 2048) == 2048
    assert library().vk_quant_table(F.FORMATS["int8_dynamic"], 3, d.ctypes.data, 2048) == -1
    thr = F.thresholds(fmt)
    edges = (np.arange(2048, dtype=np.uint64) << np.uint64(21)).astype(np.uint32).view(np.float32)
    centre = np.concatenate([thr, -thr, edges, [0.0, -0.0, 1.0, -1.0, 6.0, -6.0]]).astype(np.float32)
    bits = centre.view(np.uint32).astype(np.int64)[:, None] + np.arange(-8, 9, dtype=np.int64)
    near = np.clip(bits, 0, 0xFFFFFFFF).astype(np.uint32).reshape(-1).view(np.float32)
    rng = np.random.default_rng(5)
    rand = np.concatenate([rng.uniform(-F.QMAX[fmt], F.QMAX[fmt], 200000),
                           rng.standard_normal(100000) * 10.0 ** rng.integers(-30, 2, 100000)]).astype(np.float32)
    special = np.array([np.inf, -np.inf], np.float32)
    nans = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001], np.uint32).view(np.float32)
    v = np.concatenate([near, rand, special, nans])
    e = d[v.view(np.uint32) >> np.uint32(21)]
    got = np.where(v > e[:, 0].view(np.float32), (e[:, 1] >> np.uint32(8)) & np.uint32(0xFF), e[:, 1] & np.uint32(0xFF))
    idx = np.searchsorted(thr, v, side="left")
    idx[np.isnan(v) & ~np.signbit(v)] = thr.size  # +NaN: the last value
    idx[np.isnan(v) & np.signbit(v)] = 0          # -NaN: the first
    want = F.code_of_index(fmt)[idx]
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{bad.size} differ, e.g. v={v[bad[:3]]} got {got[bad[:3]]} want {want[bad[:3]]}"
    # and the reference's own encoder agrees on the finite values
    fin = np.isfinite(v)
    assert np.array_equal(got[fin], R.table_encode(v[fin], fmt))


def _packed_lookup(words: np.ndarray, key: np.ndarray, v: np.ndarray, low_bits: int, shift: int,
                   high: bool = False) -> np.ndarray:
    """The encoders' lookup of a packed entry (quant_tables.cuh): the carry out of
    (bits(v) << (32 - low_bits)) + word picks the code at bit `shift` or the one at bit 0; a
    4-bit pair's first code comes out in bits 4-7 (high)."""
    w = words[key].astype(np.uint64)
    u = v.view(np.uint32).astype(np.uint64)
    above = ((((u << np.uint64(32 - low_bits)) & np.uint64(0xFFFFFFFF)) + w) >> np.uint64(32)) != 0
    if high:
        return ((np.where(above, w, w << np.uint64(4)) >> np.uint64(4)) & np.uint64(0xF)).astype(np.uint8)
    mask = np.uint64(0xF if shift == 4 else 0xFF)
    return (np.where(above, w >> np.uint64(shift), w) & mask).astype(np.uint8)


@pytest.mark.parametrize("fmt", ["int8_dynamic", "nf4", "fp4"])
def test_packed_tables_give_the_nearest_value(fmt):
    """The encoders' packed tables (one 32-bit word an entry, compared on the low bits a bucket's
    values do not share; the 4-bit formats', and the dynamic map's in builds with
    -DVK_QUANT_ENC_PACKED=2) give the same code as the two-word tables and the nearest value: around
    every threshold and every bucket or 2^21 edge, at random over many decades, and for +-0,
    +-inf and NaNs of both signs. (All 2^32 bit patterns were compared when they were written.)"""
    if not vq.kernels_available():
        pytest.skip("vramkit was built without its CUDA kernels (no nvcc)")
    from vramkit.quant._arrays import library
    lib = library()
    s = F.SPECS[fmt]
    packed = np.zeros(8192, np.uint32)
    n = lib.vk_quant_table(F.FORMATS[fmt], 4, packed.ctypes.data, 8192)
    if fmt == "int8_dynamic" and s.mbits < 7:
        # this build keeps the dynamic map's two-word entries: its 6-bit buckets leave 17 low bits,
        # too many for ~T and two 8-bit codes in one word, and the table says so
        assert n == -2, n
        return
    assert n == s.buckets, (fmt, n)
    thr = F.thresholds(fmt)
    edges = [(s.e0 << 23) if t == 0 else ((s.e0 << s.mbits) + t - 1) << (23 - s.mbits) for t in range(s.per_sign)]
    edges += list(np.arange(2048, dtype=np.int64) << 21)  # the direct table's, infinities and NaNs too
    ev = np.array(edges, np.int64)
    fixed = np.array([0.0, 1.0, 6.0], np.float32).view(np.uint32).astype(np.int64)
    centre = np.concatenate([thr.view(np.uint32).astype(np.int64), ev, fixed]) & 0x7FFFFFFF
    centre = np.concatenate([centre, centre | 0x80000000])  # both signs
    bits = centre[:, None] + np.arange(-8, 9, dtype=np.int64)
    near = np.clip(bits, 0, 0xFFFFFFFF).astype(np.uint32).reshape(-1).view(np.float32)
    rng = np.random.default_rng(17)
    rand = np.concatenate([rng.uniform(-F.QMAX[fmt], F.QMAX[fmt], 200000),
                           rng.standard_normal(200000) * 10.0 ** rng.integers(-30, 2, 200000)]).astype(np.float32)
    nans = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF, 0xFFFFFFFF], np.uint32).view(np.float32)
    v = np.concatenate([near, rand, np.array([np.inf, -np.inf], np.float32), nans])
    idx = np.searchsorted(thr, v, side="left")
    idx[np.isnan(v) & ~np.signbit(v)] = thr.size  # +NaN: the last value
    idx[np.isnan(v) & np.signbit(v)] = 0          # -NaN: the first
    want = F.code_of_index(fmt)[idx]
    # the bucket table, indexed as bucket_of_float does (a NaN goes to its sign's last bucket)
    u = v.view(np.uint32)
    mag = ((u & np.uint32(0x7FFFFFFF)) >> np.uint32(23 - s.mbits)).astype(np.int64) - (s.e0 << s.mbits)
    mag[np.isnan(v)] = s.octaves << s.mbits
    key = (u >> np.uint32(31)).astype(np.int64) * s.per_sign + np.clip(mag, -1, s.octaves << s.mbits) + 1
    shift = 8 if fmt == "int8_dynamic" else 4
    low = 23 - s.mbits
    tables = [(packed, key, low)]
    if fmt != "int8_dynamic":
        direct = np.zeros(2048, np.uint32)
        assert lib.vk_quant_table(F.FORMATS[fmt], 5, direct.ctypes.data, 2048) == 2048
        tables.append((direct, (u >> np.uint32(21)).astype(np.int64), 21))
    for words, k, lb in tables:
        for high in ((False, True) if shift == 4 else (False,)):
            got = _packed_lookup(words, k, v, lb, shift, high)
            bad = np.flatnonzero(got != want)
            assert bad.size == 0, f"{fmt} ({words.size} entries, high={high}): {bad.size} differ, e.g. v={v[bad[:3]]} got {got[bad[:3]]} want {want[bad[:3]]}"
    assert lib.vk_quant_table(F.FORMATS["int8_dynamic"], 5, packed.ctypes.data, 8192) == -1


def test_kernel_library_refuses_bad_arguments():
    """The C interface checks its arguments before touching a device (runs without a GPU)."""
    if not vq.kernels_available():
        pytest.skip("vramkit was built without its CUDA kernels (no nvcc)")
    from vramkit.quant._arrays import library
    lib = library()
    cases = [((0, 0, 1, 64, 100, 1, 1, 0, None), "power of two"), ((7, 0, 1, 64, 64, 1, 1, 0, None), "unknown format"),
             ((4, 0, 1, 63, 64, 1, 1, 0, None), "even element count"), ((0, 5, 1, 64, 64, 1, 1, 0, None), "unknown dtype"),
             ((0, 0, None, 64, 64, 1, 1, 0, None), "null pointer")]
    for args, words in cases:
        assert lib.vk_quant_encode(*args) == 1
        assert words in lib.vk_quant_last_error().decode()
    assert lib.vk_quant_encode(0, 0, None, 0, 64, None, None, 0, None) == 0  # nothing to do
    probes = [((None, 16, None, 16, 16, 0, None), "null pointer"), ((16, 16, 4096, 3, 16, 0, None), "one side moves 16"),
              ((16, 4, 4096, 2, 16, 0, None), "one side moves 16"), ((16, 16, 4096, 16, -1, 0, None), "negative vector"),
              ((24, 16, 4096, 16, 16, 0, None), "unaligned pointer")]
    for args, words in probes:
        assert lib.vk_quant_probe_traffic(*args) == 1, words
        assert words in lib.vk_quant_last_error().decode()
    assert lib.vk_quant_probe_traffic(None, 16, None, 16, 0, 0, None) == 0  # nothing to do
    assert lib.vk_quant_pointer_device(ctypes.c_void_p(12345)) == -1 or vramkit.backend() == "cuda"


def test_set_launch_checks_its_arguments():
    """The launch shape is a process-wide tuning knob: only the shapes the library has are taken,
    and a refused call leaves the current shape alone (runs without a GPU)."""
    if not vq.kernels_available():
        pytest.skip("vramkit was built without its CUDA kernels (no nvcc)")
    from vramkit.quant._arrays import library
    with pytest.raises(ValueError, match="tile must be 0 \\(default\\), 4096 or 8192 \\(got 1000\\)"):
        vq.set_launch(1000)
    with pytest.raises(ValueError, match="grid must be 'auto', 'persistent' or 'tiles'"):
        vq.set_launch(4096, "blocks")
    with pytest.raises(TypeError, match="tile must be an int"):
        vq.set_launch("8192")
    with pytest.raises(ValueError, match="table must be 'auto', 'buckets' or 'direct'"):
        vq.set_launch(4096, "tiles", "linear")
    assert library().vk_quant_set_launch(4096, 3, 0) == 1
    assert "grid_mode must be 0" in library().vk_quant_last_error().decode()
    assert library().vk_quant_set_launch(4096, 0, 3) == 1
    assert "table must be 0" in library().vk_quant_last_error().decode()
    with pytest.raises(ValueError, match="max_blocks must be an int >= 0"):
        vq.set_launch(4096, "persistent", "auto", -1)
    assert library().vk_quant_set_max_blocks(-3) == 1
    assert "blocks must be 0 (no cap) or more" in library().vk_quant_last_error().decode()
    vq.set_launch(8192, "tiles", "direct")
    vq.set_launch(4096, "persistent", "buckets", max_blocks=3)
    vq.set_launch()

