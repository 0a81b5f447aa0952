"""vramkit on a real CUDA device, from Python: resource conformance, streams checked by
data, out of memory near capacity, GPT-2 training through vramkit as PyTorch's allocator,
CuPy and Numba kernels on vramkit memory, and zero-copy interop.

Run on the GPU machine:  python3 -m pytest -m gpu python/tests -q

Every framework test runs in a child process: vramkit.torch.use() and Numba's memory
manager must be set before the framework touches CUDA, and each child starts clean.
Children print one JSON line of measurements; failures show it.
"""
from __future__ import annotations

import gc
import sys
import textwrap
import zlib

import numpy as np
import pytest

import vramkit
from vramkit import _vramkit

from gpu_child import GPU_MARKS, ON_GPU, have, needs, run_json, show

pytestmark = GPU_MARKS

MiB = 1 << 20
GiB = 1 << 30


def child(code: str, *, env: dict | None = None, timeout: float = 300) -> dict:
    """Runs code in a fresh interpreter; returns the last JSON object it printed."""
    return run_json([sys.executable, "-c", textwrap.dedent(code)], env=env, timeout=timeout)


# ============================================================ (1) resource conformance on the device

SPECS = ["cuda", "cuda_async", "vmm", "pool:upstream=vmm", "pool:upstream=vmm,map_ahead:64MiB",
         "pool:upstream=vmm,chunk_size:16MiB", "pool:upstream=cuda",
         "pool:upstream=cuda_async"]
SIZES = [1, 255, 256, 4097, 1 * MiB, 3 * MiB + 17, 64 * MiB, 1 * GiB]


def _chunks(n: int):
    """Where each allocation gets data: all of a small one, head and tail of a big one."""
    if n <= 8 * MiB:
        return [(0, n)]
    return [(0, 1 * MiB), (n // 2, 1 * MiB), (n - 1 * MiB, 1 * MiB)]


def _write(rng, p: int, n: int, stream=None) -> dict:
    if stream is not None:
        # The stream is non-blocking and copies run on the legacy stream: let the
        # allocation (stream-ordered for cuda_async) complete before touching the memory.
        _vramkit.synchronize(0)
    data = {}
    for off, ln in _chunks(n):
        d = rng.integers(0, 256, ln, dtype=np.uint8).tobytes()
        _vramkit.copy_to_device(p + off, d)
        data[off] = d
    return data


def _check(p: int, n: int, data: dict, what: str):
    for off, d in data.items():
        got = _vramkit.copy_to_host(p + off, len(d))
        if got != d:
            a, b = np.frombuffer(got, np.uint8), np.frombuffer(d, np.uint8)
            bad = np.flatnonzero(a != b)
            pytest.fail(f"{what}: allocation 0x{p:x} ({n} bytes): {bad.size} of {len(d)} bytes differ at offset "
                        f"{off}; first at +{int(bad[0])}: got {int(a[bad[0]])}, wrote {int(b[bad[0]])}", pytrace=False)


@pytest.mark.parametrize("stream_kind", ["default", "created"])
@pytest.mark.parametrize("spec", SPECS)
def test_resource_roundtrip_on_device(spec, stream_kind):
    r = vramkit.make_resource(spec, 0)
    stream = _vramkit.create_stream(0) if stream_kind == "created" else None
    rng = np.random.default_rng(zlib.crc32(f"{spec}/{stream_kind}".encode()))
    live = []
    try:
        for n in SIZES + SIZES[::-1]:
            p = r.allocate(n, stream)
            assert p != 0 and p % 256 == 0, f"{spec}: allocate({n}) gave 0x{p:x} (not 256-byte aligned)"
            live.append([p, n, _write(rng, p, n, stream)])
        spans = sorted((p, p + n) for p, n, _ in live)
        for (a0, a1), (b0, b1) in zip(spans, spans[1:]):
            assert a1 <= b0, f"{spec}: allocations overlap: [0x{a0:x}, 0x{a1:x}) and [0x{b0:x}, 0x{b1:x})"
        for p, n, data in live:
            _check(p, n, data, f"{spec} after all writes")
        st = r.state()
        if st["live_bytes"]:
            assert st["live_bytes"] >= sum(n for _, n, _ in live), f"{spec}: state {show(st)}"
        # Free every other allocation, allocate again into the holes, and check that the
        # survivors kept their bytes.
        keep = live[::2]
        for p, n, _ in live[1::2]:
            r.deallocate(p, n, stream)
        live = keep
        for n in SIZES:
            p = r.allocate(n, stream)
            keep.append([p, n, _write(rng, p, n, stream)])
        for p, n, data in keep:
            _check(p, n, data, f"{spec} after free/reallocate")
        # Bad frees change nothing. The pointer is inside the largest allocation, where no
        # other allocation can start.
        p0, n0, _ = max(live, key=lambda e: e[1])
        with pytest.raises(ValueError):
            r.deallocate(p0 + 4096, n0, stream)  # not an allocation's start
        _check(p0, n0, max(live, key=lambda e: e[1])[2], f"{spec} after a bad free")
        for p, n, _ in live:
            r.deallocate(p, n, stream)
        live = []
        with pytest.raises(ValueError):
            r.deallocate(p0, n0, stream)  # double free
        st = r.state()
        assert st["live_bytes"] == 0, f"{spec}: after freeing everything: {show(st)}"
        r.release_cached()
        assert r.state()["live_bytes"] == 0
    finally:
        for p, n, _ in live:
            r.deallocate(p, n, stream)
        if stream is not None:
            _vramkit.synchronize(0)
            _vramkit.destroy_stream(stream)


def test_default_alloc_roundtrip_and_views():
    rng = np.random.default_rng(7)
    buf = vramkit.alloc(5 * MiB + 3)
    data = rng.integers(0, 256, buf.nbytes, dtype=np.uint8).tobytes()
    buf.copy_from_host(data)
    assert buf.copy_to_host() == data
    view = buf[MiB:2 * MiB]
    assert view.copy_to_host() == data[MiB:2 * MiB]
    del view
    buf.free()


def test_chunks_hold_data_and_go_back_whole():
    """chunk_size on the vmm device: blocks grown in 16 MiB handles hold their bytes; after some are
    freed, release_cached gives back the chunks wholly free (the driver unmaps a handle only whole)
    and the data of the blocks left is intact; then every byte goes back."""
    r = vramkit.make_resource("pool:upstream=vmm,chunk_size:16MiB", 0)
    rng = np.random.default_rng(11)
    live = []
    try:
        for i in range(24):
            n = (3 + 7 * i) * MiB + 4096 * i
            p = r.allocate(n)
            live.append([p, n, _write(rng, p, n)])
        r.check_invariants()
        c = r.pool_counters()
        assert c["chunks_created"] > 0, show(c)
        for p, n, _ in live[::2]:
            r.deallocate(p, n)
        live = live[1::2]
        r.release_cached()
        r.check_invariants()
        assert r.pool_counters()["chunks_released"] > 0, show(r.pool_counters())
        for p, n, data in live:
            _check(p, n, data, "chunks after release_cached")
        # Memory that must move: a request larger than any free place, with the chunks of freed
        # blocks given back and single pages made.
        p = r.allocate(600 * MiB)
        live.append([p, 600 * MiB, _write(rng, p, 600 * MiB)])
        r.check_invariants()
        for p, n, data in live:
            _check(p, n, data, "chunks after a large request")
    finally:
        for p, n, _ in live:
            r.deallocate(p, n)
    r.release_cached()
    assert r.state()["reserved_bytes"] == 0


def test_map_ahead_pages_made_on_the_helper_thread_hold_data():
    """map_ahead on the vmm device: the helper thread (its own CUDA context binding) makes pages
    that blocks then use; their bytes survive; every page goes back."""
    import time
    r = vramkit.make_resource("pool:upstream=vmm,map_ahead:256MiB", 0)
    rng = np.random.default_rng(5)
    live = []
    try:
        for i in range(48):
            n = (8 + 5 * i) * MiB + 4096 * i
            p = r.allocate(n)
            live.append([p, n, _write(rng, p, n)])
            r.check_invariants()
            time.sleep(0.002)  # the helper runs beside this thread
        c = r.pool_counters()
        assert c["pages_made_ahead"] > 0 and c["pages_ahead_used"] > 0, show(c)
        for p, n, data in live:
            _check(p, n, data, "map_ahead")
        for p, n, _ in live[::2]:
            r.deallocate(p, n)
        live = live[1::2]
        r.release_cached()
        r.check_invariants()
        for p, n, data in live:
            _check(p, n, data, "map_ahead after release_cached")
    finally:
        for p, n, _ in live:
            r.deallocate(p, n)
    r.release_cached()
    assert r.state()["reserved_bytes"] == 0


# ============================================================ (2) streams, checked by data

STREAMS_CHILD = r"""
import json, sys
import vramkit, vramkit.torch
vramkit.torch.use()
import torch

SLEEP = int(4e9)          # cycles: about two seconds of a busy stream A
N = 16 << 20              # float32 elements (64 MiB); 2**24 keeps arange exact
dev = torch.device("cuda", 0)
sa, sb = torch.cuda.Stream(dev), torch.cuda.Stream(dev)
res = {"torch": torch.__version__}

# Load every kernel used below once, so that no first-launch module loading on
# stream B outlasts stream A's long kernel.
_w = torch.full((16,), 1.0, device=dev)
torch.arange(16, device=dev, dtype=torch.float32).mul_(0.5).add_(_w)
_w * 2 + 1
(_w != 1.0).sum()
torch.cuda._sleep(1000)
torch.cuda.synchronize()
del _w

def overlap(p, n, rng):
    return p < rng[1] and rng[0] < p + n

# --- A: a kernel fills A on stream A (behind a long kernel) while B allocates and writes.
with torch.cuda.stream(sa):
    torch.cuda._sleep(SLEEP)
    tmp = torch.full((N,), 7.0, device=dev)               # allocated on A, filled later
    A = torch.arange(N, device=dev, dtype=torch.float32)
    A.mul_(0.5).add_(tmp)                                  # A = 0.5 i + 7, once A's queue runs
    tmp_rng = (tmp.data_ptr(), tmp.data_ptr() + tmp.nbytes)
    a_rng = (A.data_ptr(), A.data_ptr() + A.nbytes)
    del tmp                                                # freed on A while A's work is queued
    C = torch.full((N,), 9.0, device=dev)                  # same-stream reuse is allowed
    c_reused_tmp = overlap(C.data_ptr(), C.nbytes, tmp_rng)
overlaps, kept = 0, []
with torch.cuda.stream(sb):
    for r in range(6):
        bs = [torch.full((N,), float(-(r + 1)), device=dev) for _ in range(4)]
        for b in bs:
            overlaps += overlap(b.data_ptr(), b.nbytes, tmp_rng) or overlap(b.data_ptr(), b.nbytes, a_rng)
        kept.append((r, bs[0]))                            # the other three go back on B
res["a_busy_while_b_allocated"] = not sa.query()
torch.cuda.synchronize()
expect = torch.arange(N, device=dev, dtype=torch.float32).mul_(0.5).add_(7.0)
res["a_bad_elements"] = int((A != expect).sum())
res["c_bad_elements"] = int((C != 9.0).sum())
res["c_reused_tmp"] = bool(c_reused_tmp)
res["b_bad_elements"] = sum(int((b != float(-(r + 1))).sum()) for r, b in kept)
res["b_overlaps_with_a_pending"] = int(overlaps)
del A, C, kept, expect
torch.cuda.synchronize()

# --- record_stream: X allocated on A, used on B by a long kernel, freed on A, then A allocates.
def record_case(mark):
    with torch.cuda.stream(sa):
        X = torch.full((N,), 3.0, device=dev)
    sb.wait_stream(sa)
    with torch.cuda.stream(sb):
        torch.cuda._sleep(SLEEP)
        Y = X * 2 + 1                                      # reads X after B's long kernel
    x_rng = (X.data_ptr(), X.data_ptr() + X.nbytes)
    mark(X)
    before = vramkit.memory_stats()["pending_free_bytes"]
    del X                                                  # PyTorch frees it on A (its allocation stream)
    pending = vramkit.memory_stats()["pending_free_bytes"] - before
    zs, ov = [], 0
    with torch.cuda.stream(sa):
        for _ in range(6):
            z = torch.full((N,), -5.0, device=dev)
            ov += overlap(z.data_ptr(), z.nbytes, x_rng)
            zs.append(z)
    busy = not sb.query()
    torch.cuda.synchronize()
    out = {"pending_after_free": int(pending), "x_bytes": N * 4, "new_allocs_overlapping_x": int(ov),
           "y_bad_elements": int((Y != 7.0).sum()), "b_busy_while_a_allocated": busy}
    del Y, zs
    torch.cuda.synchronize()
    return out

res["vramkit_record_stream"] = record_case(lambda t: vramkit.torch.record_stream(t, sb))
res["tensor_record_stream"] = record_case(lambda t: t.record_stream(sb))
res["hooks"] = vramkit.torch.hooks_available()[0]
res["stats"] = {k: v for k, v in vramkit.memory_stats().items()
                if k in ("pool.stream_reclaims", "num_alloc_retries", "pending_free_bytes", "fragmentation")}
print(json.dumps(res))
"""


@pytest.fixture(scope="module")
def streams_result():
    if not have("torch"):
        pytest.skip("needs torch (not installed)")
    return child(STREAMS_CHILD)


def test_streams_pending_work_keeps_memory(streams_result):
    r = streams_result
    if not r["a_busy_while_b_allocated"]:
        pytest.skip(f"stream A finished before B allocated, so the race was not exercised\n{show(r)}")
    assert r["b_overlaps_with_a_pending"] == 0, f"stream B got memory stream A still uses\n{show(r)}"
    assert r["a_bad_elements"] == 0, f"tensor A was corrupted\n{show(r)}"
    assert r["b_bad_elements"] == 0, f"stream B's tensors were corrupted\n{show(r)}"
    assert r["c_bad_elements"] == 0, f"a tensor reusing memory on its own stream is wrong\n{show(r)}"


def test_streams_vramkit_record_stream(streams_result):
    r = streams_result["vramkit_record_stream"]
    assert r["b_busy_while_a_allocated"], f"stream B finished too early to test anything\n{show(streams_result)}"
    assert r["pending_after_free"] >= r["x_bytes"], (
        f"vramkit.torch.record_stream did not reach the pool (no pending free)\n{show(streams_result)}")
    assert r["new_allocs_overlapping_x"] == 0, f"memory still used on B was handed out on A\n{show(streams_result)}"
    assert r["y_bad_elements"] == 0, f"B's result was corrupted by A's new allocations\n{show(streams_result)}"


def test_streams_tensor_record_stream_forwarding(streams_result):
    """Documents whether PyTorch forwards Tensor.record_stream to a pluggable allocator."""
    r = streams_result["tensor_record_stream"]
    if r["pending_after_free"] < r["x_bytes"] and not streams_result["hooks"]:
        pytest.xfail("PyTorch does not forward Tensor.record_stream to a pluggable allocator "
                     f"(pending after free: {r['pending_after_free']}); use vramkit.torch.record_stream. "
                     f"Data: y_bad_elements={r['y_bad_elements']}, overlaps={r['new_allocs_overlapping_x']}")
    assert r["pending_after_free"] >= r["x_bytes"], f"Tensor.record_stream did not reach vramkit\n{show(r)}"
    assert r["y_bad_elements"] == 0 and r["new_allocs_overlapping_x"] == 0, show(r)


def test_torch_use_is_too_late_after_allocation():
    if not have("torch"):
        pytest.skip("needs torch (not installed)")
    r = child("""
        import json, torch, vramkit, vramkit.torch
        x = torch.ones(1 << 20, device="cuda")
        try:
            vramkit.torch.use()
            out = {"raised": None}
        except RuntimeError as e:
            out = {"raised": "RuntimeError", "msg": str(e)}
        out["active"] = vramkit.torch.is_active()
        out["x_ok"] = bool((x == 1).all())
        print(json.dumps(out))
    """)
    assert r["raised"] == "RuntimeError", show(r)
    assert "must be called before PyTorch allocates CUDA memory" in r["msg"], r["msg"]
    assert r["active"] is False and r["x_ok"], show(r)


def test_torch_out_of_memory_through_vramkit_raises():
    """An allocation vramkit cannot serve must become a Python exception in PyTorch, not a
    tensor at address 0 (PyTorch's pluggable allocator does not check the pointer it gets)."""
    if not have("torch"):
        pytest.skip("needs torch (not installed)")
    r = child("""
        import json, vramkit, vramkit.torch
        vramkit.torch.use()
        import torch
        total = vramkit.mem_get_info()[1]
        out = {"ask": 2 * total}
        try:
            t = torch.empty(2 * total, dtype=torch.uint8, device="cuda")
            out.update(raised=None, data_ptr=t.data_ptr())
            del t
        except Exception as e:
            out.update(raised=type(e).__name__, msg=str(e)[:500])
        x = torch.ones(1 << 20, device="cuda")
        out["works_after"] = float(x.sum()) == float(1 << 20)
        print(json.dumps(out))
    """)
    assert r["raised"] is not None, (
        f"PyTorch got a tensor of {r['ask']} bytes at 0x{r.get('data_ptr', 0):x} instead of an error: the shim's "
        f"null return is not checked by CUDAPluggableAllocator, so kernels would write to address 0\n{show(r)}")
    assert "out of memory" in r["msg"].lower(), show(r)
    assert r["works_after"], show(r)


def test_torch_use_is_first_and_counts_tensors():
    if not have("torch"):
        pytest.skip("needs torch (not installed)")
    r = child("""
        import json, vramkit, vramkit.torch
        vramkit.torch.use(growth_slack=0.05)
        vramkit.torch.use(growth_slack=0.05)       # same options again: a no-op
        import torch
        base = vramkit.memory_allocated()
        x = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
        held = vramkit.memory_allocated() - base
        try:
            vramkit.torch.use(growth_slack=0.5)
            again = None
        except RuntimeError as e:
            again = str(e)
        try:
            torch.cuda.memory_allocated()
            torch_stats = "works"
        except RuntimeError as e:
            torch_stats = str(e)[:200]
        del x
        torch.cuda.synchronize()
        print(json.dumps({"held": held, "after_del": vramkit.memory_allocated() - base, "again": again,
                          "active": vramkit.torch.is_active(), "torch_stats": torch_stats,
                          "options": vramkit.get_current_resource().pool_counters()["options"]}))
    """)
    assert r["active"] and r["held"] == 3 << 20 and r["after_del"] == 0, show(r)
    assert r["again"] and "already called" in r["again"], show(r)
    assert "growth_slack:0.05" in r["options"], show(r)


REMAP_OWN_CHILD = r"""
import json
import vramkit, vramkit.torch
vramkit.torch.use()
import torch

SLEEP = int(3e9)          # cycles: over a second of a busy stream
N = 16 << 20              # float32 elements (64 MiB)
dev = torch.device("cuda", 0)
s = torch.cuda.Stream(dev)
_w = torch.full((16,), 1.0, device=dev)                    # load every kernel used below once
(_w * 2).sum(); torch.cuda._sleep(1000); torch.cuda.synchronize(); del _w

def counters():
    return vramkit.get_current_resource().pool_counters()

res = {}
with torch.cuda.stream(s):
    torch.cuda._sleep(SLEEP)                               # the GPU is now far behind the host
    ts = [torch.full((N,), float(i), device=dev) for i in range(16)]
    sums = [t.sum() for t in ts]                           # read on the GPU after the sleep
    for i in range(0, 16, 2):
        ts[i] = None                                       # freed on s while their reads are queued
    before = vramkit.memory_reserved()
    c0 = counters()
    big = torch.full((7 * N,), 42.0, device=dev)           # 448 MiB: past the slack, 512 MiB freed on s
    res["grew_mib"] = (vramkit.memory_reserved() - before) >> 20
    res["taken_early"] = counters()["pages_taken_early"] - c0["pages_taken_early"]
    res["busy_after_big"] = not s.query()
    # Blocks back over the holes while the GPU is still behind: the old addresses of the pages
    # taken early are mapped over only once the reads queued on them are done.
    again = [torch.full((N,), -float(i), device=dev) for i in range(8)]
    res["busy_after_again"] = not s.query()
    big_sum = big.sum()
torch.cuda.synchronize()
res["early_waits"] = counters()["early_waits"]
res["sums_bad"] = [i for i in range(16) if float(sums[i]) != float(i) * N]
res["big_bad"] = int((big != 42.0).sum())
res["big_sum_ok"] = float(big_sum) == 42.0 * 7 * N
res["again_bad"] = [i for i in range(8) if int((again[i] != -float(i)).sum())]
res["odd_bad"] = [i for i in range(1, 16, 2) if int((ts[i] != float(i)).sum())]
res["options"] = counters()["options"]
vramkit.get_current_resource().check_invariants()
print(json.dumps(res))
"""


def test_remap_own_takes_the_streams_frees_while_the_gpu_is_behind():
    """remap_own on the vmm device, with no growth allowance first (remap_own_slack:0): with the GPU
    over a second behind, a request past the slack takes the pages its stream freed at once (their
    queued reads still run on the old addresses, which stay mapped), and blocks placed back there
    later do not disturb those reads. Every value is checked."""
    if not have("torch"):
        pytest.skip("needs torch (not installed)")
    r = child(REMAP_OWN_CHILD, env={"VRAMKIT_ALLOC_CONF": "remap_own:true,remap_own_slack:0,chunk_size:0"})
    assert "remap_own:true" in r["options"], show(r)
    if not r["busy_after_big"]:
        pytest.skip(f"the stream finished before the request past the slack: nothing was exercised\n{show(r)}")
    assert r["taken_early"] > 0, f"no page was taken from the stream's own frees\n{show(r)}"
    assert r["grew_mib"] < 128, f"the pool grew although the stream's frees were there\n{show(r)}"
    assert not r["sums_bad"], f"reads queued on freed tensors saw other data\n{show(r)}"
    assert r["big_bad"] == 0 and r["big_sum_ok"], f"the block made of pages taken early is wrong\n{show(r)}"
    assert not r["again_bad"] and not r["odd_bad"], f"blocks placed later, or kept ones, are wrong\n{show(r)}"


# ============================================================ (3) out of memory near the real capacity

OOM_CHILD = r"""
import json, vramkit
from vramkit import _vramkit
GiB = 1 << 30
free0, total = vramkit.mem_get_info()
target = min(int(0.9 * total), free0 - 2 * GiB)       # leave room for the driver and other processes
bufs = []
while (len(bufs) + 1) * 4 * GiB <= target:
    bufs.append(vramkit.alloc(4 * GiB))
bufs[-1].copy_from_host(b"\x5a" * 4096, 4 * GiB - 4096)
free1 = vramkit.mem_get_info()[0]
ask = free1 + 8 * GiB
res = {"total": total, "free0": free0, "held": len(bufs) * 4 * GiB, "free1": free1, "ask": ask,
       "ask_text": vramkit.format_bytes(ask)}
try:
    extra = vramkit.alloc(ask)
    res["raised"] = None
    extra.free()
except vramkit.OutOfMemoryError as e:
    res.update(raised="OutOfMemoryError", is_memory_error=isinstance(e, MemoryError), msg=str(e))
except Exception as e:
    res.update(raised=type(e).__name__, msg=str(e))
vramkit.get_current_resource().check_invariants()
res["tail_intact"] = bufs[-1][4 * GiB - 4096:].copy_to_host() == b"\x5a" * 4096
res["stats_after_oom"] = {k: v for k, v in vramkit.memory_stats().items()
                          if k in ("num_ooms", "num_alloc_retries", "reserved_bytes.all.current",
                                   "allocated_bytes.all.current", "largest_free_bytes")}
for b in bufs:
    b.free()
bufs.clear()
vramkit.empty_cache()
res["reserved_after_empty"] = vramkit.memory_reserved()
res["free_after_empty"] = vramkit.mem_get_info()[0]
# Recovery: half the device in one piece, then 4 GiB pieces back up to the old level.
big = vramkit.alloc((total // 2) & ~((2 << 20) - 1))
big.copy_from_host(b"\xa5" * 4096, big.nbytes - 4096)
res["big_ok"] = big[big.nbytes - 4096:].copy_to_host() == b"\xa5" * 4096
more = []
while (len(more) + 1) * 4 * GiB + big.nbytes <= res["held"]:
    more.append(vramkit.alloc(4 * GiB))
res["recovered"] = big.nbytes + len(more) * 4 * GiB
big.free()
for b in more:
    b.free()
vramkit.get_current_resource().check_invariants()
print(json.dumps(res))
"""


def test_out_of_memory_near_capacity_and_recovery():
    vramkit.empty_cache()  # this process's cache would look like someone else's memory to the child
    r = child(OOM_CHILD, timeout=400)
    info = show({k: v for k, v in r.items()})
    assert r["raised"] == "OutOfMemoryError", f"asking {r['ask_text']} more than is free did not raise OOM\n{info}"
    assert r["is_memory_error"], info
    msg = r["msg"]
    for word in ("out of memory", "requested", "live", "cached", "largest free", "capacity", "fragmentation"):
        assert word in msg, f"the OOM message lacks {word!r}: {msg}"
    assert r["ask_text"] in msg, f"the OOM message does not say what was asked ({r['ask_text']}): {msg}"
    assert r["tail_intact"], f"memory held across the OOM changed\n{info}"
    assert r["held"] >= 0.5 * r["total"], f"could only take {r['held'] / GiB:.1f} GiB of {r['total'] / GiB:.1f}\n{info}"
    assert r["reserved_after_empty"] <= 64 << 20, f"empty_cache left {r['reserved_after_empty']} bytes reserved\n{info}"
    assert r["free_after_empty"] >= r["free0"] - GiB, f"the device did not get its memory back\n{info}"
    assert r["big_ok"] and r["recovered"] >= r["held"] - 4 * GiB, f"no recovery after OOM\n{info}"


# ============================================================ (4) GPT-2 small: vramkit vs PyTorch's allocator

GPT2_CHILD = r"""
import json, os, sys, time
alloc = sys.argv[1] if len(sys.argv) > 1 else os.environ["VK_ALLOC"]
# Step plans: later steps placed where a recorded one went. "vramkit-plan" marks each step at the
# top of the loop; "vramkit-plan-auto" calls nothing but use(): the optimizer's steps mark them.
# The plan is made as soon as it is laid out (plan_needs_moves off), at the steps the tests name.
plan = alloc in ("vramkit-plan", "vramkit-plan-auto")
manual_marks = alloc == "vramkit-plan"
if alloc.startswith("vramkit"):
    import vramkit, vramkit.torch
    vramkit.torch.use(**({"plan_steps": True, "remap_own_slack": 0, "plan_needs_moves": False} if plan else {}))
import torch
torch.use_deterministic_algorithms(True, warn_only=True)
torch.backends.cudnn.benchmark = False
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
from transformers import GPT2Config, GPT2LMHeadModel
torch.manual_seed(0)
torch.cuda.manual_seed_all(0)
try:
    cfg = GPT2Config(attn_implementation="eager")
except TypeError:
    cfg = GPT2Config()
model = GPT2LMHeadModel(cfg)
if getattr(model.config, "_attn_implementation", "eager") != "eager":
    try:
        model.config._attn_implementation = "eager"   # plain matmul + softmax: deterministic
    except Exception:
        pass
model = model.cuda().train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
g = torch.Generator().manual_seed(1234)
data = torch.randint(0, cfg.vocab_size, (20, 4, 128), generator=g)
losses = []
page_ops = []  # with plan: the pool's pages mapped + unmapped by the end of each step
t0 = time.perf_counter()
for step in range(20):
    if manual_marks:
        vramkit.torch.mark_step()
    x = data[step].cuda()
    out = model(input_ids=x, labels=x)
    opt.zero_grad(set_to_none=True)
    out.loss.backward()
    opt.step()
    losses.append(out.loss.item())
    if plan:
        c = vramkit.get_current_resource().pool_counters()
        page_ops.append(c["pages_mapped"] + c["pages_unmapped"])
torch.cuda.synchronize()
res = {"alloc": alloc, "losses": losses, "seconds": time.perf_counter() - t0, "torch": torch.__version__,
       "attn": getattr(model.config, "_attn_implementation", "?")}
if plan:
    res["page_ops"] = page_ops
    res["plan"] = {k: v for k, v in vramkit.get_current_resource().pool_counters().items() if k.startswith("plan")}
    res["step_marks"] = vramkit.torch.step_marks()
if alloc.startswith("vramkit"):
    res["peak_allocated"] = vramkit.max_memory_allocated()
    res["peak_reserved"] = vramkit.max_memory_reserved()
    res["allocated_now"] = vramkit.memory_allocated()
else:
    res["peak_allocated"] = torch.cuda.max_memory_allocated()
    res["peak_reserved"] = torch.cuda.max_memory_reserved()
print(json.dumps(res))
"""


@needs("torch", "transformers")
def test_gpt2_training_losses_match_default_allocator():
    env = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    runs = {a: child(GPT2_CHILD, env={**env, "VK_ALLOC": a}, timeout=500) for a in ("vramkit", "default")}
    lv, ld = np.array(runs["vramkit"]["losses"]), np.array(runs["default"]["losses"])
    diff = np.abs(lv - ld)
    summary = (f"max |loss diff| = {diff.max():.3g} (bitwise equal: {bool((lv == ld).all())}); "
               f"first/last loss vramkit {lv[0]:.6f}/{lv[-1]:.6f}, default {ld[0]:.6f}/{ld[-1]:.6f}; "
               f"peak allocated vramkit {runs['vramkit']['peak_allocated'] / MiB:.0f} MiB, "
               f"default {runs['default']['peak_allocated'] / MiB:.0f} MiB; "
               f"peak reserved vramkit {runs['vramkit']['peak_reserved'] / MiB:.0f} MiB, "
               f"default {runs['default']['peak_reserved'] / MiB:.0f} MiB; attention {runs['vramkit']['attn']}, "
               f"{runs['vramkit']['seconds']:.1f} s vs {runs['default']['seconds']:.1f} s for 20 steps")
    print(summary)
    assert len(lv) == len(ld) == 20
    # Random weights on random tokens: the loss need not fall in 20 steps, but it must move
    # (the optimizer ran) and stay finite.
    assert np.isfinite(lv).all() and np.ptp(lv) > 0, f"training did not run: {summary}"
    assert runs["vramkit"]["allocated_now"] > 100 * MiB, f"the model's memory is not in vramkit: {show(runs['vramkit'])}"
    assert np.allclose(lv, ld, rtol=0, atol=1e-5), f"losses differ: {summary}\nvramkit {lv}\ndefault {ld}"


def _plan_memory_bounds(r, summary):
    """A pool with a plan reserves at most 1.08x its peak allocated (the growth the default pool
    allows itself before it takes its stream's frees early), and the suite's target is 1.03x. The
    peak of this loop is made before the plan is in force, by the steps placed as usual (1.049 and
    1.061 on an H100): the test fails above 1.08, and between the two it reports the target as an
    expected failure (XFAIL, with the figures) until the pool meets it."""
    ratio = r["peak_reserved"] / r["peak_allocated"]
    assert ratio <= 1.08, summary
    if ratio > 1.03:
        pytest.xfail(f"peak reserved {ratio:.3f}x allocated, over the suite's 1.03x (made before the plan): {summary}")


@needs("torch", "transformers")
def test_gpt2_training_with_step_plans():
    """plan_steps: the same losses as PyTorch's allocator, and from the sixth step on no page mapped
    or unmapped (steps 1-3 warm up, record and compare; the fourth maps the plan's pages, and the
    fifth those of the odd steps' places: the logits live into the next step, so the plan is laid
    out over two steps)."""
    env = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    runs = {a: child(GPT2_CHILD, env={**env, "VK_ALLOC": a}, timeout=500) for a in ("vramkit-plan", "default")}
    r = runs["vramkit-plan"]
    lp, ld = np.array(r["losses"]), np.array(runs["default"]["losses"])
    ops = r["page_ops"]
    summary = (f"max |loss diff| {np.abs(lp - ld).max():.3g}; plan counters {r['plan']}; page ops by step {ops}; "
               f"peak reserved {r['peak_reserved'] / MiB:.0f} MiB for {r['peak_allocated'] / MiB:.0f} MiB allocated "
               f"(PyTorch: {runs['default']['peak_reserved'] / MiB:.0f} MiB); {r['seconds']:.1f} s vs "
               f"{runs['default']['seconds']:.1f} s")
    print(summary)
    assert np.allclose(lp, ld, rtol=0, atol=1e-5), f"losses differ: {summary}"
    assert r["plan"]["plans_made"] >= 1 and r["plan"]["plans_dropped"] == 0, summary
    assert r["plan"]["plan_placed"] > 0, summary
    assert r["step_marks"]["source"] == "manual", summary
    assert r["plan"]["plan_missed"] == 0, summary
    assert ops[-1] == ops[4], f"pages moved after the plan was in force: {summary}"
    _plan_memory_bounds(r, summary)


@needs("torch", "transformers")
def test_gpt2_training_with_step_plans_marked_by_the_optimizer():
    """plan_steps with nothing but use(): each AdamW step marks a step (20 marks in 20 steps), the
    plan is made, and from the seventh step on no page is mapped or unmapped (the marks come after
    each optimizer step, one step later in the loop than marks at its top)."""
    env = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    r = child(GPT2_CHILD, env={**env, "VK_ALLOC": "vramkit-plan-auto"}, timeout=500)
    ops = r["page_ops"]
    summary = (f"step marks {r['step_marks']}; plan counters {r['plan']}; page ops by step {ops}; peak reserved "
               f"{r['peak_reserved'] / MiB:.0f} MiB for {r['peak_allocated'] / MiB:.0f} MiB allocated")
    print(summary)
    assert {k: r["step_marks"][k] for k in ("source", "marks", "devices")} == \
        {"source": "optimizer", "marks": 20, "devices": [0]}, summary
    assert r["plan"]["plans_made"] >= 1 and r["plan"]["plans_dropped"] == 0, summary
    assert r["plan"]["plan_placed"] > 0, summary
    assert r["plan"]["plan_missed"] == 0, summary
    assert ops[-1] == ops[6], f"pages moved after the plan was in force: {summary}"
    _plan_memory_bounds(r, summary)


@needs("torch", "transformers")
def test_gpt2_inference_steps_found_by_the_pool():
    """plan_steps with no marks at all (an inference loop: no optimizer, no mark_step): the pool
    finds the loop's period in its large requests, makes a plan, and the last steps move no page;
    the outputs are the ones the same loop gives under PyTorch's allocator."""
    code = r"""
import json, os, sys
alloc = os.environ["VK_ALLOC"]
if alloc == "vramkit":
    import vramkit, vramkit.torch
    vramkit.torch.use(plan_steps=True, remap_own_slack=0, plan_needs_moves=False)
import torch
from transformers import GPT2Config, GPT2LMHeadModel
torch.manual_seed(0)
try:
    cfg = GPT2Config(attn_implementation="eager")
except TypeError:
    cfg = GPT2Config()
model = GPT2LMHeadModel(cfg).cuda().eval()
x = torch.randint(0, cfg.vocab_size, (8, 256), generator=torch.Generator().manual_seed(1)).cuda()
sums, page_ops = [], []
with torch.no_grad():
    for step in range(400):
        out = model(input_ids=x).logits
        if step % 50 == 0 or step >= 380:
            sums.append(float(out.float().sum().item()))
        del out
        if alloc == "vramkit":
            c = vramkit.get_current_resource().pool_counters()
            page_ops.append(c["pages_mapped"] + c["pages_unmapped"])
torch.cuda.synchronize()
res = {"sums": sums}
if alloc == "vramkit":
    c = vramkit.get_current_resource().pool_counters()
    res.update(page_ops=page_ops, counters={k: c[k] for k in ("steps_found", "step_period", "plans_made",
               "plans_dropped", "plan_placed", "plan_missed")}, marks=vramkit.torch.step_marks(),
               peak_reserved=vramkit.max_memory_reserved(), peak_allocated=vramkit.max_memory_allocated())
print(json.dumps(res))
"""
    runs = {a: child(code, env={"VK_ALLOC": a}, timeout=400) for a in ("vramkit", "default")}
    r = runs["vramkit"]
    ops = r["page_ops"]
    summary = (f"counters {r['counters']}; step marks {r['marks']}; page ops at steps 200/300/380/399: "
               f"{ops[200]}/{ops[300]}/{ops[380]}/{ops[399]}; peak reserved {r['peak_reserved'] / MiB:.0f} MiB "
               f"for {r['peak_allocated'] / MiB:.0f} MiB allocated")
    print(summary)
    assert r["sums"] == runs["default"]["sums"], f"outputs differ: {r['sums']} vs {runs['default']['sums']}"
    assert r["marks"]["source"] == "pool" and r["marks"]["marks"] == 0, summary  # no optimizer stepped
    assert r["marks"]["pool_period"] == r["counters"]["step_period"], summary
    assert r["counters"]["steps_found"] >= 1 and r["counters"]["step_period"] > 0, summary
    assert r["counters"]["plans_made"] >= 1 and r["counters"]["plans_dropped"] == 0, summary
    assert ops[-1] == ops[380], f"pages moved in the last steps: {summary}"


# ============================================================ (5) CuPy and Numba kernels on vramkit memory

@needs("cupy")
def test_cupy_kernels_on_vramkit_memory():
    r = child("""
        import gc, json
        import numpy as np
        import vramkit, vramkit.cupy
        import cupy as cp
        vramkit.cupy.use()
        base = vramkit.memory_allocated()
        n = 1 << 22
        x = cp.arange(n, dtype=cp.float32)
        y = cp.full(n, 3.0, dtype=cp.float32)
        held = vramkit.memory_allocated() - base
        res = {"active": vramkit.cupy.is_active(), "held": held,
               "x_in_pool": vramkit.get_current_resource().allocation_size(x.data.ptr)}
        ew = cp.ElementwiseKernel("float32 x, float32 y", "float32 z", "z = x * x + y", "vk_sq_add")
        z = ew(x, y)
        red = cp.ReductionKernel("float32 x", "float64 s", "x", "a + b", "s = a", "0", "vk_sum")
        s = float(red(x))
        zh = cp.asnumpy(z)
        xh = np.arange(n, dtype=np.float32)
        # The GPU fuses x * x + y into one FMA, so compare within float32 rounding.
        res["z_bad"] = int((~np.isclose(zh, xh * xh + 3.0, rtol=2e-7, atol=0)).sum())
        res["sum"] = s
        res["sum_expect"] = float(n * (n - 1) // 2)
        with cp.cuda.Stream(non_blocking=True) as st:
            w = cp.ones(1 << 20, dtype=cp.float64) * 2
            res["w_sum"] = float(w.sum())
            st.synchronize()
        del x, y, z, w
        gc.collect()
        cp.cuda.Device().synchronize()
        res["after_del"] = vramkit.memory_allocated() - base
        vramkit.cupy.unuse()
        u = cp.zeros(1 << 20)
        res["after_unuse"] = vramkit.memory_allocated() - base
        res["active_after_unuse"] = vramkit.cupy.is_active()
        print(json.dumps(res))
    """)
    assert r["active"] and r["held"] >= 2 * 4 * (1 << 22), f"CuPy's arrays are not in vramkit\n{show(r)}"
    assert r["x_in_pool"] > 0, show(r)
    assert r["z_bad"] == 0, f"ElementwiseKernel gave wrong results\n{show(r)}"
    assert r["sum"] == r["sum_expect"], f"ReductionKernel sum\n{show(r)}"
    assert r["w_sum"] == 2.0 * (1 << 20), show(r)
    assert r["after_del"] == 0, f"memory CuPy dropped did not return to vramkit\n{show(r)}"
    assert r["after_unuse"] == 0 and not r["active_after_unuse"], show(r)


NUMBA_KERNELS = """
import numpy as np
# numba-cuda releases that predate NumPy 2.3 still name np.row_stack (removed
# there; it was an alias of vstack) while compiling any kernel. Restoring the
# alias lets them run; it changes nothing vramkit does.
if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack
from numba import cuda
@cuda.jit
def fill_u8(a, v):
    i = cuda.grid(1)
    if i < a.size:
        a[i] = (i * 7 + v) % 256
@cuda.jit
def saxpy(out, x, alpha, beta):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = alpha * x[i] + beta
"""


@needs("numba")
def test_numba_kernel_on_device_buffer():
    r = child(NUMBA_KERNELS + """
import json
import numpy as np
import vramkit
n = (1 << 22) + 5
buf = vramkit.alloc(n)
arr = cuda.as_cuda_array(buf)
fill_u8[(n + 255) // 256, 256](arr, 3)
cuda.synchronize()
got = np.frombuffer(buf.copy_to_host(), np.uint8)
want = ((np.arange(n, dtype=np.int64) * 7 + 3) % 256).astype(np.uint8)
fbuf = vramkit.alloc(4 << 20)
f = cuda.as_cuda_array(fbuf).view(np.float32)
src = np.arange(f.size, dtype=np.float32)
f.copy_to_device(src)
saxpy[(f.size + 255) // 256, 256](f, f, np.float32(2.0), np.float32(1.0))
fh = f.copy_to_host()
print(json.dumps({"u8_bad": int((got != want).sum()), "f_bad": int((fh != src * 2 + 1).sum()),
                  "same_ptr": int(arr.__cuda_array_interface__["data"][0]) == buf.ptr}))
""")
    assert r["same_ptr"] and r["u8_bad"] == 0 and r["f_bad"] == 0, show(r)


@needs("numba")
@pytest.mark.parametrize("how", ["env", "use"])
def test_numba_emm_plugin(how):
    setup = "import vramkit.numba\nvramkit.numba.use()\n" if how == "use" else ""
    env = {"NUMBA_CUDA_MEMORY_MANAGER": "vramkit.numba"} if how == "env" else {}
    r = child(setup + NUMBA_KERNELS + """
import gc, json
import numpy as np
import vramkit
base = vramkit.memory_allocated()
n = 1 << 22
x = cuda.to_device(np.arange(n, dtype=np.float32))
out = cuda.device_array(n, dtype=np.float32)
held = vramkit.memory_allocated() - base
saxpy[(n + 255) // 256, 256](out, x, np.float32(2.0), np.float32(1.0))
res = out.copy_to_host()
ctx = cuda.current_context()
mi = ctx.get_memory_info()
mm = type(ctx.memory_manager).__name__
bad = int((res != np.arange(n, dtype=np.float32) * 2 + 1).sum())
with cuda.defer_cleanup():
    tmp = cuda.device_array(1 << 20, dtype=np.uint8)
    del tmp
del x, out
gc.collect()
import vramkit.numba as vn
print(json.dumps({"held": held, "bad": bad, "mm": mm, "free": mi[0], "total": mi[1],
                  "after_del": vramkit.memory_allocated() - base, "active": vn.is_active()}))
""", env=env)
    assert r["mm"] == "VramkitNumbaMemoryManager", f"Numba is not using the plugin\n{show(r)}"
    assert r["held"] >= 2 * 4 * (1 << 22), f"Numba's arrays are not in vramkit\n{show(r)}"
    assert r["bad"] == 0, f"the kernel gave wrong results on vramkit memory\n{show(r)}"
    assert 0 < r["free"] <= r["total"], show(r)
    assert r["after_del"] == 0, f"memory Numba dropped did not return to vramkit\n{show(r)}"
    assert r["active"], show(r)


# ============================================================ (6) interop and lifetime

@needs("torch", "cupy", "numba")
def test_interop_same_memory_and_lifetime():
    r = child("""
        import gc, json
        import numpy as np
        import vramkit
        import torch, cupy as cp
        from numba import cuda
        n = 8 << 20
        pattern = ((np.arange(n, dtype=np.int64) * 13 + 5) % 251).astype(np.uint8)
        base = vramkit.memory_allocated()
        buf = vramkit.alloc(n)
        buf.copy_from_host(pattern.tobytes())
        ptr = buf.ptr
        t = torch.from_dlpack(buf)
        c = cp.asarray(buf)
        nb = cuda.as_cuda_array(buf)
        res = {"ptrs": [t.data_ptr() == ptr, int(c.data.ptr) == ptr,
                        int(nb.__cuda_array_interface__["data"][0]) == ptr],
               "t_dev": str(t.device), "t_dtype": str(t.dtype)}
        res["read"] = [bool((t.cpu().numpy() == pattern).all()), bool((cp.asnumpy(c) == pattern).all()),
                       bool((nb.copy_to_host() == pattern).all())]
        # A write through torch is seen through CuPy, Numba and the buffer.
        t[:4096] = 77
        torch.cuda.synchronize()
        pattern[:4096] = 77
        res["write_seen"] = [bool((cp.asnumpy(c[:4096]) == 77).all()), bool((nb[:4096].copy_to_host() == 77).all()),
                             np.frombuffer(buf.copy_to_host(), np.uint8)[:4096].tolist() == [77] * 4096]
        del buf
        gc.collect()
        res["held_after_del_buf"] = vramkit.memory_allocated() - base
        others = [vramkit.alloc(n) for _ in range(4)]
        res["overlaps"] = sum(o.ptr < ptr + n and ptr < o.ptr + n for o in others)
        for o in others:
            o.copy_from_host(b"\\xee" * n)
        del o
        res["still_read"] = [bool((t.cpu().numpy() == pattern).all()), bool((cp.asnumpy(c) == pattern).all()),
                             bool((nb.copy_to_host() == pattern).all())]
        del others
        gc.collect()
        steps = []
        for name in ("t", "c", "nb"):
            del globals()[name]
            gc.collect()
            torch.cuda.synchronize()
            steps.append(vramkit.memory_allocated() - base)
        res["held_as_holders_go"] = steps
        print(json.dumps(res))
    """)
    n = 8 << 20
    assert all(r["ptrs"]), f"torch/cupy/numba do not see the buffer's address\n{show(r)}"
    assert r["t_dev"] == "cuda:0" and r["t_dtype"] == "torch.uint8", show(r)
    assert all(r["read"]), f"a framework read other bytes (torch, cupy, numba)\n{show(r)}"
    assert all(r["write_seen"]), f"a write through torch was not seen (cupy, numba, buffer)\n{show(r)}"
    assert r["held_after_del_buf"] == n, f"the memory was freed while frameworks held it\n{show(r)}"
    assert r["overlaps"] == 0, f"new allocations landed on memory the frameworks hold\n{show(r)}"
    assert all(r["still_read"]), f"the held memory changed after del buf\n{show(r)}"
    assert r["held_as_holders_go"] == [n, n, 0], f"bytes held as torch, cupy, numba let go\n{show(r)}"


def teardown_module(module):
    gc.collect()
    if ON_GPU:
        vramkit.empty_cache()
