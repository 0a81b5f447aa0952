"""The PyTorch caching-allocator emulation on hand-made traces whose answer is worked out here
from PyTorch's rules, plus the packaged real trace against the segments PyTorch really made."""
from __future__ import annotations

import gzip
import os
import subprocess
import sys

import numpy as np
import pytest

from vramkit import _vramkit
from vramkit.advise import config_line, profile

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


class T:
    """A tiny trace builder: a(id, size, stream) allocates, f(id) frees."""

    def __init__(self):
        self.rows, self.sizes = [], {}

    def a(self, i, size, stream=0):
        self.rows.append((0, i, size, stream))
        self.sizes[i] = (size, stream)
        return self

    def f(self, i):
        size, stream = self.sizes[i]
        self.rows.append((1, i, size, stream))
        return self

    def ops(self):
        return np.array(self.rows, dtype=np.int64).reshape(-1, 4)


def run(spec, t, capacity=0):
    r = _vramkit.torch_emulator(spec, capacity)
    p = _vramkit.profile_trace(t.ops(), r, 0, -1, None)
    return p, _vramkit.torch_counters(r)


def test_round_size_to_512_and_power2_divisions():
    rs = _vramkit.torch_round_size
    assert [rs("torch-default", n) for n in (1, 511, 512, 513, 1200)] == [512, 512, 512, 1024, 1536]
    # 4 divisions: only above 512*4 bytes; 1.2 MiB lies in [1, 2) MiB, steps of 256 KiB -> 1.25 MiB
    d4 = "torch:roundup_power2_divisions=4"
    assert rs(d4, 1200) == 1536
    assert rs(d4, 1258291) == 1310720
    assert rs(d4, 5 * MiB + 1) == 6 * MiB
    assert rs(d4, 4 * MiB) == 4 * MiB  # a power of two stays
    # per interval: <=256 MB intervals get 1 (plain 512 rounding), [512 MB, 1 GB) 2, above 4
    lst = "torch:roundup_power2_divisions=[256:1,512:2,>:4]"
    assert rs(lst, 300 * MiB + 1) == 300 * MiB + 512
    assert rs(lst, 600 * MiB + 1) == 768 * MiB
    assert rs(lst, 1536 * MiB + 1) == 1792 * MiB


def test_segment_sizes():
    seg = _vramkit.torch_segment_size
    assert seg(512) == 2 * MiB and seg(MiB) == 2 * MiB  # small pool: 2 MiB segments
    assert seg(MiB + 512) == 20 * MiB and seg(10 * MiB - 512) == 20 * MiB  # 1-10 MiB: 20 MiB
    assert seg(10 * MiB) == 10 * MiB and seg(11 * MiB) == 12 * MiB  # >= 10 MiB: rounded to 2 MiB


def test_small_pool_packs_2mib_segments():
    t = T()
    for i in range(2048):
        t.a(i, 1000)  # 1024 B each: 2048 of them fill exactly one 2 MiB segment
    p, c = run("torch-default", t)
    assert p["peak_reserved_bytes"] == 2 * MiB and c["num_device_alloc"] == 1
    t.a(5000, 1000)
    p, c = run("torch-default", t)
    assert p["peak_reserved_bytes"] == 4 * MiB and c["num_device_alloc"] == 2


def test_mid_size_requests_share_a_20mib_segment():
    # 5 MiB requests: split 20 -> 15 -> 10 -> 5, the fourth takes the last 5 MiB whole
    t = T()
    for i in range(4):
        t.a(i, 5 * MiB)
    p, c = run("torch-default", t)
    assert p["peak_reserved_bytes"] == 20 * MiB and c["num_device_alloc"] == 1
    t.a(4, 5 * MiB)
    p, c = run("torch-default", t)
    assert p["peak_reserved_bytes"] == 40 * MiB and c["num_device_alloc"] == 2


def test_large_requests_get_their_size_rounded_to_2mib():
    t = T().a(0, 11 * MiB).a(1, 10 * MiB).a(2, 33 * MiB + 1)
    p, c = run("torch-default", t)
    assert p["peak_reserved_bytes"] == (12 + 10 + 34) * MiB and c["num_device_alloc"] == 3


def test_free_blocks_are_reused_on_their_own_stream_only():
    t = T().a(0, 40 * MiB, stream=1).f(0).a(1, 40 * MiB, stream=0)
    p, _ = run("torch-default", t)
    assert p["peak_reserved_bytes"] == 80 * MiB
    t = T().a(0, 40 * MiB).f(0).a(1, 40 * MiB)
    assert run("torch-default", t)[0]["peak_reserved_bytes"] == 40 * MiB


def test_max_split_size_keeps_oversize_blocks_whole():
    # default: the cached 100 MiB block is split for the 30 MiB request
    t = T().a(0, 100 * MiB).f(0).a(1, 30 * MiB)
    assert run("torch-default", t)[0]["peak_reserved_bytes"] == 100 * MiB
    # max_split_size 64 MiB: an oversize cached block never serves a small request
    assert run("torch:max_split_size_mb=64", t)[0]["peak_reserved_bytes"] == 130 * MiB
    # an oversize request takes a cached oversize block whole only within 20 MiB of slack
    t = T().a(0, 110 * MiB).f(0).a(1, 100 * MiB)
    p, c = run("torch:max_split_size_mb=64", t)
    assert p["peak_reserved_bytes"] == 110 * MiB and p["allocated_at_peak"] == 110 * MiB
    t = T().a(0, 130 * MiB).f(0).a(1, 100 * MiB)
    assert run("torch:max_split_size_mb=64", t)[0]["peak_reserved_bytes"] == 230 * MiB
    assert run("torch:max_split_size_mb=64,max_non_split_rounding_mb=40", t)[0]["peak_reserved_bytes"] == 130 * MiB


def test_release_cached_and_retry_on_oom():
    # 60 MiB cached, 80 MiB wanted on a 100 MiB device: cudaMalloc fails, the cache is freed, retry
    t = T().a(0, 60 * MiB).f(0).a(1, 80 * MiB)
    p, c = run("torch-default", t, capacity=100 * MiB)
    assert p["ooms"] == 0 and p["peak_reserved_bytes"] == 80 * MiB and c["num_alloc_retries"] == 1
    assert c["num_device_free"] == 1
    # max_split_size: oversize cached blocks are released first; 60 MiB is not enough for 80, so
    # PyTorch still goes on to the full release and its retry
    p, c = run("torch:max_split_size_mb=32", t, capacity=100 * MiB)
    assert p["ooms"] == 0 and c["num_alloc_retries"] == 1 and c["num_device_free"] == 1
    # a cached oversize block at least as large as the request is released alone: no full retry
    t = T().a(0, 90 * MiB).f(0).a(1, 50 * MiB)
    p, c = run("torch:max_split_size_mb=32", t, capacity=100 * MiB)
    assert p["ooms"] == 0 and c["num_alloc_retries"] == 0 and c["num_device_free"] == 1
    assert p["peak_reserved_bytes"] == 90 * MiB
    # live memory cannot be released: OOM at op 1
    t = T().a(0, 60 * MiB).a(1, 50 * MiB).a(2, 10 * MiB)
    p, _ = run("torch-default", t, capacity=100 * MiB)
    assert p["ooms"] == 1 and p["first_oom_op"] == 1 and p["first_oom_size"] == 50 * MiB
    assert "out of memory" in p["first_oom_message"]


def test_expandable_segments_grow_by_20mib_and_2mib_pages():
    t = T().a(0, 5 * MiB).a(1, 30 * MiB).a(2, 1000)
    p, c = run("torch-expandable", t)
    # 5 MiB maps one 20 MiB page; 30 MiB grows the same segment by one page (15 free + 20);
    # the small request maps one 2 MiB page of its own segment
    assert p["peak_reserved_bytes"] == 42 * MiB and c["num_device_alloc"] == 3
    # the default allocator: 20 MiB + 30 MiB + 2 MiB
    assert run("torch-default", t)[0]["peak_reserved_bytes"] == 52 * MiB


def test_empty_cache_unmaps_free_pages():
    r = _vramkit.torch_emulator("torch-expandable", 0)
    a = r.allocate(50 * MiB)
    b = r.allocate(10 * MiB)
    assert r.state()["reserved_bytes"] == 60 * MiB
    r.deallocate(a, 50 * MiB)
    r.release_cached()
    # only whole free pages go: [0, 40) MiB of the 60 MiB is free and page-aligned
    assert r.state()["reserved_bytes"] == 20 * MiB
    r.deallocate(b, 10 * MiB)
    r.release_cached()
    assert r.state()["reserved_bytes"] == 0


def test_garbage_collection_threshold_frees_old_cached_segments():
    # fraction 0.999 of 100 MiB, threshold 0.5: at the miss of op 3, 70 MiB > 49.95 MiB reserved,
    # so the old unsplit 40 MiB cached segment (stream 1) is freed before growing
    t = T().a(0, 40 * MiB, stream=1).f(0).a(1, 30 * MiB).a(2, 20 * MiB, stream=2)
    p, _ = run("torch:garbage_collection_threshold=0.5,per_process_memory_fraction=0.999", t, capacity=100 * MiB)
    assert p["peak_reserved_bytes"] == 70 * MiB and p["final_reserved_bytes"] == 50 * MiB
    # a fraction of 1 sets no limit in PyTorch (allowed_memory_maximum stays empty), so no collection
    p, _ = run("torch:garbage_collection_threshold=0.5,per_process_memory_fraction=1.0", t, capacity=100 * MiB)
    assert p["peak_reserved_bytes"] == 90 * MiB
    p, _ = run("torch-default", t, capacity=100 * MiB)
    assert p["peak_reserved_bytes"] == 90 * MiB
    # without a fraction the threshold does nothing (as in PyTorch)
    p, _ = run("torch:garbage_collection_threshold=0.5", t, capacity=100 * MiB)
    assert p["peak_reserved_bytes"] == 90 * MiB


def test_equal_free_blocks_go_by_segment_address():
    # B = 12 MiB segment (a1), then A = 20 MiB segment split [a0 8 MiB | 12 MiB free]; a1 freed.
    # Two free 12 MiB blocks: B and A's tail. Best fit takes the lower address.
    t = T().a(1, 12 * MiB).a(0, 8 * MiB).f(1).a(2, 12 * MiB).f(0).a(3, 20 * MiB)
    # Counting up, B (first cudaMalloc) is lower: a2 takes B, A merges back to a whole 20 MiB
    # block when a0 is freed and a3 reuses it: 32 MiB, 2 segments.
    p, c = run("torch-default", t)
    assert p["peak_reserved_bytes"] == 32 * MiB and c["num_device_alloc"] == 2
    # If the driver put A below B, a2 takes A's tail, A is left [8 free | a2], and a3 needs a
    # third segment: 52 MiB.
    hi, lo = 1 << 36, 1 << 34
    p = profile(t.ops(), "torch-default", None, segment_addresses=[hi, lo])
    assert p["peak_reserved_bytes"] == 52 * MiB and p["device_allocs"] == 3
    assert p["given_addresses_used"] == 3 - 1  # the third segment counts up past the list
    r = _vramkit.torch_emulator("torch-default", 0)
    _vramkit.torch_set_segment_addresses(r, [hi, lo])
    b = r.allocate(12 * MiB)
    a0 = r.allocate(8 * MiB)
    r.deallocate(b, 12 * MiB)
    assert (b, a0, r.allocate(12 * MiB)) == (hi, lo, lo + 8 * MiB)
    with pytest.raises(ValueError, match="before the first allocation"):
        _vramkit.torch_set_segment_addresses(r, [hi])
    with pytest.raises(ValueError, match="not a device address"):
        _vramkit.torch_set_segment_addresses(_vramkit.torch_emulator("torch-default", 0), [hi, 0])
    with pytest.raises(ValueError, match="not a device address"):  # no overflow counting up past it
        _vramkit.torch_set_segment_addresses(_vramkit.torch_emulator("torch-default", 0), [(1 << 64) - 512])


def test_given_addresses_stop_when_they_would_overlap_a_held_segment():
    # two live 12 MiB segments given the same address: the runs went different ways, so the
    # second counts up instead
    p = profile(T().a(0, 12 * MiB).a(1, 12 * MiB).ops(), "torch-default", None, segment_addresses=[1 << 34] * 2)
    assert p["given_addresses_used"] == 1 and p["peak_reserved_bytes"] == 24 * MiB


def test_memory_fraction_limits_like_a_smaller_device():
    t = T().a(0, 60 * MiB).a(1, 30 * MiB)
    p, _ = run("torch:per_process_memory_fraction=0.8", t, capacity=100 * MiB)
    assert p["ooms"] == 1 and p["first_oom_op"] == 1


@pytest.mark.parametrize("spec, words", [
    ("torch:max_split_size_mb=20", "more than 20"),
    ("torch:max_split_size_mb=abc", "not a non-negative integer"),
    ("torch:bogus=1", "unknown option 'bogus'"),
    ("torch:garbage_collection_threshold=1.5", "(0, 1)"),
    ("torch:roundup_power2_divisions=3", "power of 2"),
    ("torch:roundup_power2_divisions=[256:3]", "power of 2"),
    ("torch:roundup_power2_divisions=[256:2", "']'"),
    ("torch:expandable_segments=maybe", "True or False"),
    ("torch:backend=cudaMallocAsync", "cannot be emulated"),
    ("torch:per_process_memory_fraction=0.5", "needs a device capacity"),
    ("torch-default:expandable_segments=True", "contradicts"),
    ("torch", "needs options"),
])
def test_bad_options_are_refused(spec, words):
    with pytest.raises(ValueError, match=None) as e:
        _vramkit.torch_emulator(spec, 0)
    assert words in str(e.value)


def test_config_lines():
    assert config_line("torch-default") == "(PyTorch defaults: no PYTORCH_CUDA_ALLOC_CONF)"
    assert config_line("torch-expandable") == "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    assert config_line("torch:max_split_size_mb:128,roundup_power2_divisions:4") == \
        "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128,roundup_power2_divisions:4"


def test_packaged_real_trace_matches_the_segments_pytorch_made():
    """The packaged BERT trace was recorded under PyTorch's default allocator with its
    segment_alloc/segment_free events: the emulation must make the same segments."""
    from vramkit.cli import replay_ops
    from vramkit.trace import default_trace_path, load_trace
    path = default_trace_path()
    cur = peak = nseg = 0
    with gzip.open(path, "rt") as f:
        next(f)
        for line in f:
            parts = line.split(",")
            if parts[1] == "segment_alloc":
                cur += int(parts[3])
                nseg += 1
                peak = max(peak, cur)
            elif parts[1] == "segment_free":
                cur -= int(parts[3])
    assert nseg > 10
    p = profile(replay_ops(load_trace(path)), "torch-default", None)
    assert p["peak_reserved_bytes"] == peak
    assert p["device_allocs"] == nseg


def _real_traces():
    from vramkit.trace import default_trace_path
    out = [default_trace_path()]
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import conftest_trace as ct
    d = ct.shared_traces()  # VRAMKIT_SHARED_TRACES: the other recorded traces, where present
    if d is not None:
        out += sorted(str(p) for p in d.glob("*.trace.csv.gz") if p.name != os.path.basename(out[0]))
    return out


@pytest.mark.parametrize("path", _real_traces(), ids=os.path.basename)
def test_real_trace_reserved_after_every_op(path):
    """Stronger: PyTorch's reserved bytes after each alloc and free of a recording made under
    its default allocator (from its segment events) equal the emulation's, op by op."""
    from vramkit.trace import load_trace
    tr = load_trace(path)
    assert tr.skipped_frees == 0
    real = []
    cur = 0
    with gzip.open(path, "rt") as f:
        next(f)
        for line in f:
            act, size = line.split(",")[1], int(line.split(",")[3])
            if act == "segment_alloc":
                cur += size
            elif act == "segment_free":
                cur -= size
            elif act in ("alloc", "free_requested"):
                real.append(cur)
    ops = np.ascontiguousarray(tr.ops)
    assert len(real) == len(ops)
    p = _vramkit.profile_trace(ops, _vramkit.torch_emulator("torch-default", 0), len(ops), -1, None)
    assert np.array_equal(p["curve_op"], np.arange(len(ops)))
    assert np.array_equal(p["curve_reserved"], np.array(real))


@pytest.mark.parametrize("path", _real_traces(), ids=os.path.basename)
def test_real_trace_allocations_land_where_pytorch_put_them(path):
    """Given the addresses PyTorch's cudaMalloc calls returned (its segment_alloc events), every
    allocation of the recording gets the address PyTorch gave it: the best fit, its address
    tie-break and the split rules are PyTorch's, block by block."""
    with gzip.open(path, "rt") as f:
        next(f)
        rows = [ln.rstrip("\n").split(",") for ln in f]
    r = _vramkit.torch_emulator("torch-default", 0)
    _vramkit.torch_set_segment_addresses(r, [int(x[2]) for x in rows if x[1] == "segment_alloc"])
    live, n = {}, 0
    for _, act, addr, size, stream in rows:
        if act == "alloc":
            assert r.allocate(int(size), int(stream)) == int(addr), f"allocation {n}"
            live[int(addr)] = int(size)
            n += 1
        elif act == "free_requested":
            r.deallocate(int(addr), live.pop(int(addr)), int(stream))
    assert n > 500 and _vramkit.torch_counters(r)["given_addresses_used"] == _vramkit.torch_counters(r)["num_device_alloc"]


def test_advise_cli_table_and_bad_option(tmp_path):
    env = dict(os.environ)
    out = subprocess.run([sys.executable, "-m", "vramkit", "advise", "--capacity", "1GiB", "--no-progress"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "torch-expandable" in out.stdout and "recommendation:" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "vramkit", "advise", "--allocator", "torch:bogus=1"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "unknown option 'bogus'" in bad.stderr


def test_recommendation_rules():
    from vramkit.advise import recommend

    def row(spec, peak, fits=True, live=100 * MiB):
        return {"allocator": spec, "config": config_line(spec), "peak_reserved_bytes": peak, "fits": fits,
                "peak_live_bytes": live}
    # the PyTorch setting with the least peak that fits
    rows = [row("torch-default", 300 * MiB), row("torch-expandable", 200 * MiB), row("vramkit", 195 * MiB)]
    assert recommend(rows, 1 * GiB).startswith("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    # vramkit when it saves more than 5 %, with the best PyTorch line beside it
    rows[2] = row("vramkit", 150 * MiB)
    r = recommend(rows, 1 * GiB)
    assert r.startswith("import vramkit.torch") and "best PyTorch setting: PYTORCH_CUDA_ALLOC_CONF=expandable" in r
    # vramkit when it is the only one that fits
    rows = [row("torch-default", 300 * MiB, False), row("vramkit", 250 * MiB)]
    assert recommend(rows, 260 * MiB).startswith("import vramkit.torch")
    # nothing fits, and the live bytes alone are over the capacity
    rows = [row("torch-default", 90 * MiB, False, live=120 * MiB)]
    assert recommend(rows, 100 * MiB).startswith("nothing fits on 100.00 MiB: the live tensors alone")


def test_advise_devices_are_simulated_and_sized_by_capacity():
    """vramkit's row runs on the simulated device too, as large as asked (1 TiB when unlimited)."""
    ops = T().a(0, 100 * GiB).a(1, 30 * GiB).f(0).ops()
    for spec in ("vramkit", "torch-default", "torch-expandable"):
        assert profile(ops, spec, None)["fits"], spec
        p = profile(ops, spec, 120 * GiB)
        assert not p["fits"] and p["first_oom_op"] == 1, spec
