"""vramkit.leaks on the host backend: leak_check, growth detection, snapshots, the CLI."""
import inspect
import os
import pickle
import subprocess
import sys
import textwrap
import threading

import pytest

import vramkit
from vramkit import _vramkit
from vramkit import leaks
from vramkit.leaks import GrowthDetector, LeakError, leak_check, watch

HERE = os.path.abspath(__file__)


def _line_of(marker: str) -> str:
    """``file:line`` of the line of this file that holds ``marker``."""
    with open(HERE) as f:
        for i, text in enumerate(f, 1):
            if marker in text and "_line_of" not in text:
                return f"{HERE}:{i}"
    raise AssertionError(marker)


def test_tracking_adaptor_records_python_call_sites():
    base = _vramkit.current_resource(None)
    t = _vramkit.tracking_adaptor(base)
    b = _vramkit.alloc_from(t, 3000)  # SITE-A
    live = _vramkit.tracked_live(t)
    assert [(a["ptr"], a["size"]) for a in live] == [(b.ptr, 3000)]
    leaks._tracking._ensure_prefixes()
    names = leaks._tracking.SiteNames()
    # alloc_from is called straight from this file
    assert names.key(live[0]["site"]) == _line_of("# SITE-A")
    b.free()
    assert _vramkit.tracked_live(t) == []
    c = _vramkit.tracking_counts(t)
    assert c["allocs"] == 1 and c["frees"] == 1 and c["live_bytes"] == 0
    ev = _vramkit.tracked_events(t)
    assert [e[0] for e in ev] == ["alloc", "free"]
    assert any(s.startswith(_line_of("# SITE-A")) for s in _vramkit.site_table())
    with pytest.raises(ValueError, match="not a tracking adaptor"):
        _vramkit.tracked_live(base)
    t2 = _vramkit.tracking_adaptor(base, python_stacks=False)
    b2 = _vramkit.alloc_from(t2, 10)
    assert _vramkit.tracked_live(t2)[0]["site"] == 0
    b2.free()


def test_call_sites_of_allocations_made_without_the_gil():
    """PyTorch's op bindings release the GIL before they allocate, so its tensors reach vramkit
    (through the allocator shim) on a thread that has a Python thread state but not the GIL. The
    hook takes the GIL for the walk there; on a thread that never ran Python it gives no site and
    never waits for the GIL."""
    leaks._tracking._ensure_prefixes()
    base = _vramkit.current_resource(None)
    t = _vramkit.tracking_adaptor(base)
    made = []
    p = _vramkit._alloc_without_gil(t, 3000)  # NOGIL-MAIN
    made.append((p, 3000))

    got = {}

    def worker():  # a Python thread: its own thread state, the GIL released inside the call
        got["p"] = _vramkit._alloc_without_gil(t, 5000)  # NOGIL-THREAD

    th = threading.Thread(target=worker)
    th.start()
    th.join(60)
    assert not th.is_alive() and "p" in got
    made.append((got["p"], 5000))
    # A C++ thread with no Python thread state, while this thread keeps the GIL: the helper
    # raises after 10 s if the hook waits for the GIL there.
    calls = _vramkit.site_hook_calls()
    q = _vramkit._alloc_without_gil(t, 7000, new_thread=True)
    made.append((q, 7000))
    assert _vramkit.site_hook_calls() == calls, "the hook walked frames on a thread that never ran Python"

    names = leaks._tracking.SiteNames()
    sites = {a["ptr"]: a["site"] for a in _vramkit.tracked_live(t)}
    assert names.key(sites[p]) == _line_of("# NOGIL-MAIN")
    assert names.function(sites[p]) == "test_call_sites_of_allocations_made_without_the_gil"
    assert names.key(sites[got["p"]]) == _line_of("# NOGIL-THREAD") and names.function(sites[got["p"]]) == "worker"
    assert sites[q] == 0
    for ptr, n in made:
        t.deallocate(ptr, n)
    c = _vramkit.tracking_counts(t)
    assert c["allocs"] == 3 and c["frees"] == 3 and c["live_bytes"] == 0
    # The GIL-holding path is unchanged, and this thread holds the GIL again.
    b = _vramkit.alloc_from(t, 100)  # NOGIL-AFTER
    assert leaks._tracking.SiteNames().key(_vramkit.tracked_live(t)[0]["site"]) == _line_of("# NOGIL-AFTER")
    b.free()


def test_leak_check_names_the_leaking_line_and_restores_the_resource():
    before = vramkit.get_current_resource()
    old = vramkit.alloc(512)  # allocated before: not looked at, frees normally inside
    keep = []
    with leak_check() as lc:
        assert _vramkit.is_tracking(vramkit.get_current_resource())
        old.free()
        for _ in range(3):
            keep.append(vramkit.alloc(1000))  # LEAK-LIST
        tmp = vramkit.alloc(1 << 20)
        tmp.free()
        with vramkit.alloc(4096):
            pass
    assert not _vramkit.is_tracking(vramkit.get_current_resource())
    assert vramkit.get_current_resource().name == before.name
    assert len(lc.leaks) == 1
    g = lc.leaks[0]
    assert g["site"] == _line_of("# LEAK-LIST")
    assert g["count"] == 3 and g["bytes"] == 3000 and lc.leaked_bytes == 3000
    assert g["function"] == "test_leak_check_names_the_leaking_line_and_restores_the_resource"
    rep = lc.report()
    assert _line_of("# LEAK-LIST") in rep and "3 allocation(s)" in rep
    for b in keep:  # buffers made inside keep freeing through the tracker after the block
        b.free()


def test_leak_check_clean_block_and_strict():
    with leak_check(strict=True) as lc:
        for _ in range(10):
            vramkit.alloc(4096).free()
    assert lc.leaks == [] and not lc and "no allocation" in lc.report()
    keep = []
    with pytest.raises(LeakError) as ei:
        with leak_check(strict=True):
            keep.append(vramkit.alloc(2048))  # STRICT-LEAK
    assert _line_of("# STRICT-LEAK") in str(ei.value)
    assert ei.value.leaks[0]["bytes"] == 2048
    # the block's own exception wins over the leak verdict
    with pytest.raises(KeyError):
        with leak_check(strict=True):
            keep.append(vramkit.alloc(2048))
            raise KeyError("x")
    assert isinstance(LeakError("m"), RuntimeError)


def test_leak_check_sees_garbage_cycles_as_freed():
    class Holder:
        pass

    with leak_check(strict=True):
        h = Holder()
        h.me = h
        h.buf = vramkit.alloc(4096)
        del h


def test_nested_checks_share_one_tracker():
    keep = []
    with leak_check() as outer:
        keep.append(vramkit.alloc(100))  # OUTER
        with leak_check() as inner:
            keep.append(vramkit.alloc(200))  # INNER
        assert _vramkit.is_tracking(vramkit.get_current_resource())
    assert [g["site"] for g in inner.leaks] == [_line_of("# INNER")]
    assert sorted(g["site"] for g in outer.leaks) == sorted([_line_of("# OUTER"), _line_of("# INNER")])
    assert not _vramkit.is_tracking(vramkit.get_current_resource())


def test_watch_names_a_growing_cache():
    cache = []

    def step():
        cache.append(vramkit.alloc(4096))  # GROWS
        scratch = vramkit.alloc(1 << 20)  # reused every step
        scratch.free()

    v = watch(step, steps=10)
    assert v.leaking and bool(v)
    assert [g["site"] for g in v.growing] == [_line_of("# GROWS")]
    g = v.growing[0]
    assert g["bytes_per_step"] == 4096 and g["live_bytes"] == 10 * 4096 and g["count"] == 10
    assert _line_of("# GROWS") in v.report()
    h = v.html()
    assert "<svg" in h and "</svg>" in h and "polyline" in h and "(growing)" in h
    assert "<script" not in h and "http://www.w3.org/2000/svg" in h


def test_watch_no_false_alarm_for_reuse_and_warm_cache():
    warm = {}
    pool = []

    def reuse():
        bufs = [vramkit.alloc(1 << 16) for _ in range(4)]
        for b in bufs:
            b.free()

    def warm_cache():
        if "w" not in warm:
            warm["w"] = [vramkit.alloc(1 << 20) for _ in range(3)]  # fills once
        tmp = vramkit.alloc(8192)
        del tmp

    def bounded():  # a pool of at most 3 buffers, refilled: flat after warm-up
        pool.append(vramkit.alloc(4096))
        if len(pool) > 3:
            pool.pop(0)

    for fn in (reuse, warm_cache, bounded):
        v = watch(fn, steps=10)
        assert not v.leaking, (fn.__name__, v.report())
        assert "no call site grew" in v.report()
    assert warm["w"]
    with pytest.raises(ValueError):
        watch(reuse, steps=2)


def test_growth_detector_manual_steps_and_trend_rule():
    keep = []
    with GrowthDetector(window=3) as det:
        for i in range(6):
            if i % 2 == 0 or i > 2:
                keep.append(vramkit.alloc(1024))  # MANUAL
            det.step()
        v = det.verdict()
    assert [g["site"] for g in v.growing] == [_line_of("# MANUAL")]
    assert v.total[0] == 0 and v.total[-1] == 5 * 1024
    assert leaks.is_growing([0, 5, 5, 5, 5], 3) is False  # filled once
    assert leaks.is_growing([0, 1, 2, 3], 3) is True
    assert leaks.is_growing([0, 1, 2, 1, 2], 3) is False  # comes and goes
    assert leaks.is_growing([0, 0, 1, 1, 2], 4) is False  # only half the steps grew
    assert leaks.is_growing([0, 1, 2], 3) is False  # too short


def test_leak_report_at_exit_in_a_subprocess(tmp_path):
    script = tmp_path / "leaky.py"
    script.write_text(textwrap.dedent("""
        import vramkit
        import vramkit.leaks
        keep = []
        def work():
            for _ in range(4):
                keep.append(vramkit.alloc(3000))
            vramkit.alloc(100).free()
        work()
    """))
    env = dict(os.environ, VRAMKIT_LEAK_REPORT="1")
    r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"{script}:7 (work)" in r.stderr
    assert "4 allocation(s)" in r.stderr and "still alive at exit" in r.stderr
    env["VRAMKIT_LEAK_REPORT"] = "0"
    r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "still alive" not in r.stderr


def _check_snapshot_schema(s):
    assert set(s) >= {"segments", "device_traces", "allocator_settings"}
    for seg in s["segments"]:
        assert {"device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream",
                "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks"} <= set(seg)
        assert seg["segment_type"] in ("large", "small")
        addr = seg["address"]
        for b in seg["blocks"]:
            assert set(b) == {"address", "size", "requested_size", "state", "frames"}
            assert b["state"] in ("active_allocated", "active_pending_free", "inactive")
            assert b["address"] == addr  # blocks tile the segment
            addr += b["size"]
        assert addr - seg["address"] == seg["total_size"]
    for tr in s["device_traces"]:
        for e in tr:
            assert e["action"] in ("alloc", "free_requested", "free_completed", "segment_alloc")
            assert {"addr", "size", "stream", "time_us", "frames"} <= set(e)


def test_snapshot_roundtrip_through_the_importer(tmp_path):
    from vramkit.trace import load_trace
    keep = []
    with GrowthDetector() as det:
        for _ in range(8):
            keep.append(vramkit.alloc(1000))  # SNAP-LEAK
            t = vramkit.alloc(5000)
            t.free()
            det.step()
        s = leaks.snapshot()
        path = leaks.dump_snapshot(tmp_path / "snap.pickle")
    _check_snapshot_schema(s)
    blocks = [b for seg in s["segments"] for b in seg["blocks"] if b["state"] == "active_allocated"]
    mine = [b for b in blocks if b["address"] in {k.ptr for k in keep}]
    assert len(mine) == 8 and all(b["frames"][0]["filename"] == HERE for b in mine)
    assert mine[0]["frames"][0]["line"] == int(_line_of("# SNAP-LEAK").rsplit(":", 1)[1])
    actions = [e["action"] for e in s["device_traces"][0]]
    assert actions.count("alloc") == 16 and actions.count("free_requested") == 8
    with open(path, "rb") as f:
        back = pickle.load(f)["device_traces"][0]
    assert [(e["action"], e["addr"], e["size"]) for e in back] == \
        [(e["action"], e["addr"], e["size"]) for e in s["device_traces"][0]]
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".vramkit-snapshot-")]
    tr = load_trace(path)
    assert tr.source == "pytorch-snapshot" and tr.n_allocs == 16 and tr.left_live == 8
    assert _line_of("# SNAP-LEAK") in tr.sites
    # without tracking: state only, no frames, no events
    s2 = leaks.snapshot()
    _check_snapshot_schema(s2)
    assert s2["device_traces"][0] == []


def test_cli_leaks_on_a_snapshot_and_on_bad_files(tmp_path):
    keep = []
    with GrowthDetector():
        for _ in range(16):
            keep.append(vramkit.alloc(777))  # CLI-LEAK
            t = vramkit.alloc(4096)
            t.free()
        path = leaks.dump_snapshot(tmp_path / "snap.pickle")
    from vramkit.cli import main
    r = subprocess.run([sys.executable, "-m", "vramkit", "leaks", str(path)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    site = _line_of("# CLI-LEAK")
    assert "16 x" in r.stdout and site in r.stdout
    grew = r.stdout.split("grew in every part", 1)
    assert len(grew) == 2 and site in grew[1]
    r = subprocess.run([sys.executable, "-m", "vramkit", "leaks", "--json", str(path)], capture_output=True,
                       text=True, timeout=120)
    import json
    d = json.loads(r.stdout)
    assert d["alive_at_end"][0]["site"] == site and d["alive_at_end"][0]["bytes"] == 16 * 777
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"\x00garbage" * 10)
    for p in (bad, tmp_path / "missing.pickle", tmp_path):
        r = subprocess.run([sys.executable, "-m", "vramkit", "leaks", str(p)], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 1
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("vramkit leaks: error:"), r.stderr
    for opt, msg in ((["--top", "-1"], "--top must be 0 or more"), (["--windows", "0"], "--windows must be between"),
                     (["--windows", "1"], "--windows must be between")):
        r = subprocess.run([sys.executable, "-m", "vramkit", "leaks", str(path)] + opt, capture_output=True,
                           text=True, timeout=120)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 1 and len(lines) == 1 and lines[0].startswith(f"vramkit leaks: error: {msg}"), r.stderr
    evil = tmp_path / "evil.pickle"
    evil.write_bytes(pickle.dumps({"segments": [], "device_traces": [[{"action": os.system}]]}))
    r = subprocess.run([sys.executable, "-m", "vramkit", "leaks", str(evil)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.gpu
def test_snapshot_opens_in_torch_memory_viz(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or vramkit.backend() != "cuda":
        pytest.skip("needs a CUDA GPU")
    from torch.cuda import _memory_viz
    keep = []
    with leak_check():
        for i in range(5):
            keep.append(vramkit.alloc(1 << 20))
            vramkit.alloc(1 << 16).free()
        s = leaks.snapshot()
    assert "<html" in _memory_viz.segment_plot(s).lower() or "<script" in _memory_viz.segment_plot(s)
    out = _memory_viz.trace_plot(s)
    assert "<script" in out


def test_guard_zones_catch_overflow_underflow_and_use_after_free():
    import ctypes
    if vramkit.backend() != "host":
        pytest.skip("writes through host pointers")
    base = vramkit.get_current_resource()
    leaks._tracking._ensure_prefixes()
    g = _vramkit.guard_adaptor(base, redzone=256, quarantine=4)
    vramkit.set_current_resource(g)
    try:
        b = vramkit.alloc(1000)  # GUARDED
        assert b.ptr % 256 == 0
        ctypes.memset(b.ptr, 1, 1000)  # in bounds: fine
        assert leaks.check_guards() == []
        ctypes.memset(b.ptr + 1000, 7, 3)  # overflow
        v = leaks.check_guards()
        assert len(v) == 1 and v[0]["where"] == "after" and v[0]["offset"] == 1000 and v[0]["ptr"] == b.ptr
        assert v[0]["site"] == _line_of("# GUARDED") and "overrun" in v[0]["message"]
        assert leaks.check_guards() == []  # reported once
        ctypes.memset(b.ptr - 8, 7, 1)  # underflow
        v = leaks.check_guards()
        assert len(v) == 1 and v[0]["where"] == "before" and v[0]["offset"] == -8
        p = b.ptr
        b.free()
        ctypes.memset(p + 10, 9, 1)  # use after free, the block is in quarantine
        with pytest.raises(leaks.GuardError, match="use after free"):
            leaks.check_guards(strict=True)
        c = vramkit.alloc(64)
        ctypes.memset(c.ptr + 64, 1, 1)
        c.free()  # checked at free, reported at the next check
        assert [x["where"] for x in leaks.check_guards()] == ["after"]
        for _ in range(8):  # quarantine cycles without false alarms
            vramkit.alloc(300).free()
        assert leaks.check_guards() == []
    finally:
        vramkit.set_current_resource(base)
    with pytest.raises(ValueError, match="no guard adaptor"):
        leaks.check_guards()
    with pytest.raises(ValueError, match="multiple of 256"):
        _vramkit.guard_adaptor(base, redzone=100)
