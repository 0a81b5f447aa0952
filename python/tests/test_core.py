"""The Python API of the core on the host backend: every call and every error it documents."""
import os
import subprocess
import sys

import pytest

import vramkit
from vramkit import _vramkit


def test_alloc_stats_and_free():
    base = vramkit.memory_allocated()
    b = vramkit.alloc(3 << 20)
    assert b.nbytes == 3 << 20 and b.ptr % 256 == 0 and not b.freed
    assert vramkit.memory_allocated() == base + (3 << 20)
    assert vramkit.memory_reserved() >= vramkit.memory_allocated()
    assert vramkit.max_memory_allocated() >= base + (3 << 20)
    b.free()
    assert b.freed and vramkit.memory_allocated() == base
    vramkit.reset_peak_memory_stats()
    assert vramkit.max_memory_allocated() == base
    info = vramkit.get_memory_info()
    assert set(info) == {"current", "peak"}


def test_context_manager_views_and_use_after_free():
    with vramkit.alloc(4096) as b:
        v = b[100:200]
        assert v.nbytes == 100 and v.ptr == b.ptr + 100 and v.is_view
        with pytest.raises(ValueError, match="view"):
            b.free()
        del v
        b.copy_from_host(b"abc", 10)
        assert b.copy_to_host()[10:13] == b"abc"
    with pytest.raises(ValueError, match="freed"):
        b.ptr
    with pytest.raises(ValueError, match="already freed"):
        b.free()


def test_bad_sizes_devices_and_options():
    with pytest.raises(ValueError, match="negative"):
        vramkit.alloc(-1)
    with pytest.raises(ValueError):
        vramkit.alloc(1.5)
    with pytest.raises(vramkit.OutOfMemoryError) as e:
        vramkit.alloc(1 << 50)
    assert isinstance(e.value, MemoryError) and "requested" in str(e.value)
    with pytest.raises(ValueError, match="unknown device"):
        vramkit.alloc(16, device=7)
    with pytest.raises(ValueError):
        vramkit.make_resource("pool:alignment:100")
    with pytest.raises(ValueError, match="unknown allocator"):
        vramkit.make_resource("bogus")
    for dev in (-1, 7, 2 ** 70):  # a device the backend does not have, for every kind of resource
        for spec in ("pool", "host", "torch-default"):
            with pytest.raises(ValueError, match="unknown device|must not be negative|over 2"):
                vramkit.make_resource(spec, dev)
    with pytest.raises(ValueError):
        vramkit.set_per_process_memory_fraction(1.5)
    b = vramkit.alloc(0)
    assert b.ptr == 0 and b.nbytes == 0
    b.free()
    # The resource's own calls: one ValueError naming the argument, and the resource unchanged.
    r = vramkit.make_resource("pool", 0)
    before = r.state()
    for call, msg in ((lambda: r.allocate(-1), "nbytes must not be negative"),
                      (lambda: r.allocate(1.5), "nbytes must be an integer, not float"),
                      (lambda: r.allocate(2 ** 70), "over 2\\*\\*64-1"),
                      (lambda: r.deallocate("x"), "ptr must be an integer, not str"),
                      (lambda: r.deallocate(4096, -2), "nbytes must not be negative"),
                      (lambda: r.record_stream(-1, 0), "ptr must not be negative")):
        with pytest.raises(ValueError, match=msg):
            call()
    assert r.state() == before
    p = r.allocate(1000)
    r.deallocate(p, 1000)


def test_make_resource_serves_the_current_device_by_default():
    # As set_current_resource: no device given means the current one, so the README's
    # set_current_resource(make_resource(...)) works whichever device is current.
    r = vramkit.make_resource("pool")
    assert r.device == vramkit.get_current_resource().device
    assert vramkit.make_resource("pool", None).device == r.device
    old = vramkit.get_current_resource()
    vramkit.set_current_resource(r)
    try:
        assert vramkit.get_current_resource().device == r.device
    finally:
        vramkit.set_current_resource(old)


def test_resource_double_free_and_foreign_pointer_change_nothing():
    r = vramkit.make_resource("vramkit")
    p = r.allocate(1000)
    r.deallocate(p, 1000)
    before = r.state()
    with pytest.raises(ValueError, match="double free"):
        r.deallocate(p, 1000)
    with pytest.raises(ValueError):
        r.deallocate(12345, 0)
    q = r.allocate(5000)
    with pytest.raises(ValueError, match="size"):
        r.deallocate(q, 1 << 30)
    r.deallocate(q, 5000)
    assert r.state()["reserved_bytes"] == before["reserved_bytes"]
    r.check_invariants()


def test_summary_stats_info_and_empty_cache():
    b = vramkit.alloc(1 << 20)
    s = vramkit.memory_stats()
    for k in ("allocated_bytes.all.current", "reserved_bytes.all.peak", "active_bytes.all.current",
              "num_ooms", "fragmentation", "largest_free_bytes"):
        assert k in s
    text = vramkit.memory_summary()
    assert "Allocated memory" in text and "Reserved memory" in text
    d = vramkit.device_info()
    assert d["simulated"] and d["l2_cache_bytes"] > 0 and d["theoretical_bandwidth_bytes_per_s"] > 0
    free, total = vramkit.mem_get_info()
    assert 0 < free <= total
    b.free()
    vramkit.empty_cache()
    assert vramkit.memory_reserved() == vramkit.memory_allocated()


def test_per_process_fraction_and_current_resource():
    r = _vramkit.statistics_adaptor(_vramkit.host_pool())  # the device's capacity
    old = vramkit.get_current_resource()
    vramkit.set_current_resource(r)
    try:
        total = vramkit.mem_get_info()[1]
        vramkit.set_per_process_memory_fraction(0.001)  # ~82 MiB of 80 GiB
        with pytest.raises(vramkit.OutOfMemoryError):
            vramkit.alloc(int(total * 0.0012))
        vramkit.alloc(int(total * 0.0005)).free()
    finally:
        vramkit.set_current_resource(old)
    with pytest.raises(ValueError):
        vramkit.set_current_resource("not a resource")


def test_cli_info_and_bad_trace(tmp_path):
    out = subprocess.run([sys.executable, "-m", "vramkit", "info"], capture_output=True, text=True)
    assert out.returncode == 0 and "backend: host" in out.stdout
    bad = tmp_path / "empty.csv"
    bad.write_text("")
    out = subprocess.run([sys.executable, "-m", "vramkit", "replay", str(bad)], capture_output=True, text=True)
    assert out.returncode == 1 and "error" in out.stderr and "Traceback" not in out.stderr
    html = tmp_path / "r.html"
    out = subprocess.run([sys.executable, "-m", "vramkit", "report", str(bad), "-o", str(html)],
                         capture_output=True, text=True)
    assert out.returncode == 1 and not html.exists()
    out = subprocess.run([sys.executable, "-m", "vramkit", "replay", "--capacity", "1KiB"],
                         capture_output=True, text=True)
    assert out.returncode == 1 and "impossible" in out.stderr


def test_cli_replay_json_on_default_trace():
    import json
    out = subprocess.run([sys.executable, "-m", "vramkit", "replay", "--json", "--passes", "2"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert rows[0]["allocator"].startswith("vramkit")
    for k in ("trace", "ops", "peak_live_bytes", "peak_reserved_bytes", "fragmentation", "fragmentation_all_passes",
              "cold_ns_per_op", "warm_ns_per_op", "ooms"):
        assert k in rows[0]
    assert rows[0]["peak_live_bytes"] == 755556864
    assert rows[0]["fragmentation"] <= 1.05
    assert rows[0]["fragmentation_all_passes"] >= rows[0]["fragmentation"]


def test_fit_address_keeps_the_bundled_trace_from_creeping():
    """The bundled BERT trace, replayed 12 times through one pool: under the default best fit the
    peak reserved creeps pass after pass; fit:address keeps it within 1.05 of peak live."""
    import json
    out = subprocess.run([sys.executable, "-m", "vramkit", "replay", "--json", "--passes", "12",
                          "--allocator", "vramkit", "--allocator", "vramkit:fit:address"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    best, address = json.loads(out.stdout)
    assert address["allocator"] == "vramkit:fit:address"
    assert best["fragmentation"] <= 1.05 and address["fragmentation"] <= 1.05
    assert address["fragmentation_all_passes"] <= 1.05
    assert address["fragmentation_all_passes"] < best["fragmentation_all_passes"]


def test_pool_pages_of_another_size_are_backed_whole():
    """VRAMKIT_ALLOC_CONF=page_size:8MiB: the device's pages are 8 MiB too, so every byte of an
    allocation is backed (a 2 MiB device page per 8 MiB pool page left the rest unmapped)."""
    import subprocess
    import sys
    code = ("import numpy as np, vramkit\n"
            "b = vramkit.alloc(24 << 20)\n"
            "b.copy_from_host(np.full(24 << 20, 7, dtype=np.uint8).tobytes())\n"
            "out = np.frombuffer(b.copy_to_host(), dtype=np.uint8)\n"
            "assert (out == 7).all()\n"
            "print(vramkit.memory_reserved())\n")
    env = dict(os.environ, VRAMKIT_ALLOC_CONF="page_size:8MiB")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    assert int(p.stdout.split()[-1]) % (8 << 20) == 0


def test_pool_page_usage_counts_chunk_pages_a_live_block_holds():
    """pool_page_usage() on the host pool with 8 MiB chunks: a 10 MiB block in place over freed
    chunks holds 5 pages; the chunk of its last page has 3 free pages that cannot move."""
    MiB = 1 << 20
    r = vramkit.make_resource("pool:chunk_size:8MiB", 0)
    a = r.allocate(64 * MiB)
    r.deallocate(a, 64 * MiB)
    b = r.allocate(10 * MiB)
    try:
        u = r.pool_page_usage()
        assert u["in_chunks"] == 32 and u["under_live_blocks_large"] == 5, u
        assert u["chunk_free_held"] == 3, u
    finally:
        r.deallocate(b, 10 * MiB)
    assert r.pool_page_usage()["chunk_free_held"] == 0
    r.release_cached()
    assert r.pool_page_usage()["mapped_large"] == 0


def test_chunk_min_size_from_python_counts_chunk_pages():
    """chunk_min_size through a pool conf string: a 60 MiB block at the arena's start takes
    chunks of 16, 8 and 4 MiB (five handles for 30 pages); the counters say how many pages the
    chunks held, and a bad size is refused with the rule it breaks."""
    MiB = 1 << 20
    r = vramkit.make_resource("pool:chunk_size:16MiB,chunk_min_size:4MiB", 0)
    a = r.allocate(60 * MiB)
    c = r.pool_counters()
    assert (c["chunks_created"], c["chunk_pages_created"], c["pages_created"]) == (5, 30, 30), c
    r.deallocate(a, 60 * MiB)
    r.release_cached()
    c = r.pool_counters()
    assert c["chunk_pages_released"] == 30 and c["chunks_released"] == 5, c
    r.check_invariants()
    with pytest.raises(ValueError, match="chunk_min_size .* divide chunk_size"):
        vramkit.make_resource("pool:chunk_size:24MiB,chunk_min_size:8MiB", 0)


def test_split_chunks_from_python_leaves_no_chunk_after_the_second_mark():
    """split_chunks through a pool conf string: a block kept from the first step lies over chunks;
    at the second mark they become single pages (counted in chunks_split), with split_chunks:false
    they stay."""
    MiB = 1 << 20
    for split in (True, False):
        r = vramkit.make_resource(f"pool:chunk_size:16MiB,chunk_min_size:4MiB,split_chunks:{str(split).lower()}", 0)
        r.mark_step()  # the program's start
        w = r.allocate(60 * MiB)
        t = r.allocate(40 * MiB)
        r.deallocate(t, 40 * MiB)
        assert r.pool_page_usage()["in_chunks"] > 0
        r.mark_step()  # the second: the free chunks go back, the others are split (or kept)
        c = r.pool_counters()
        if split:
            assert c["chunks_split"] == 5 and r.pool_page_usage()["in_chunks"] == 0, c
        else:
            assert c["chunks_split"] == 0 and r.pool_page_usage()["in_chunks"] == 30, c
        r.check_invariants()
        r.deallocate(w, 60 * MiB)
        r.release_cached()
        assert r.pool_page_usage()["mapped_large"] == 0


def test_pool_counters_name_the_pages_created_past_the_slack():
    """Holes of 1.5 MiB between live 4 MiB blocks hold no whole 2 MiB page: a 16 MiB block placed
    above them makes the pool grow past its slack, and pool_counters() says by how many pages."""
    MiB = 1 << 20
    r = vramkit.make_resource("pool", 0)
    live, holes = [], []
    for _ in range(64):
        live.append(r.allocate(4 * MiB))
        holes.append(r.allocate(3 * MiB // 2))
    live.append(r.allocate(4 * MiB))
    for h in holes:
        r.deallocate(h, 3 * MiB // 2)
    c0 = r.pool_counters()
    big = r.allocate(16 * MiB)
    c1 = r.pool_counters()
    created = c1["pages_created"] - c0["pages_created"]
    past = c1["pages_past_slack"] - c0["pages_past_slack"]
    assert created == 8 and 0 < past < created, (c0, c1)
    assert c1["pages_remapped"] == c0["pages_remapped"], c1
    r.deallocate(big, 16 * MiB)
    for p in live:
        r.deallocate(p, 4 * MiB)
    r.check_invariants()


def test_pool_counters_time_the_page_calls():
    """pool_counters() carries the wall time inside the page device's calls: the host device's
    mmap calls for mapping and unmapping, its bookkeeping for creating and destroying pages."""
    MiB = 1 << 20
    r = vramkit.make_resource("pool", 0)
    c0 = r.pool_counters()
    a = r.allocate(64 * MiB)
    c1 = r.pool_counters()
    assert c1["page_create_ns"] > c0["page_create_ns"] and c1["page_map_ns"] > c0["page_map_ns"], c1
    r.deallocate(a, 64 * MiB)
    r.release_cached()
    c2 = r.pool_counters()
    assert c2["page_unmap_ns"] > c1["page_unmap_ns"] and c2["page_destroy_ns"] > c1["page_destroy_ns"], c2
    # The pool's waits for the GPU (timed in the C++ tests with a GPU that takes its time): the
    # host's streams finish at once, so release_cached's waits cost next to nothing.
    assert 0 <= c1["gpu_wait_ns"] <= c2["gpu_wait_ns"] < 10**8, c2


def test_an_emulator_cannot_be_the_current_resource():
    """PyTorch's allocator emulations hand out made-up addresses (for replays): as the current
    resource, vramkit.alloc's buffers would point at no memory, so it is refused and nothing changes."""
    old = vramkit.get_current_resource()
    for spec in ("torch-default", "torch-expandable"):
        with pytest.raises(ValueError, match="emulates an allocator"):
            vramkit.set_current_resource(vramkit.make_resource(spec, 0))
    assert vramkit.get_current_resource().name == old.name
    b = vramkit.alloc(4096)
    b.copy_from_host(b"x" * 4096)
    assert b.copy_to_host()[:1] == b"x"


def test_copy_from_host_takes_any_contiguous_buffer():
    """bytes, bytearray, memoryview and NumPy arrays copy in; a non-contiguous view or an object
    without the buffer protocol is a ValueError naming what it got, and the buffer keeps its bytes."""
    import numpy as np
    b = vramkit.alloc(16)
    b.copy_from_host(b"\x01" * 16)
    b.copy_from_host(np.arange(2, dtype=np.int32), offset=4)
    b.copy_from_host(bytearray(b"\x09\x09"), offset=14)
    b.copy_from_host(memoryview(b"\x07"), offset=0)
    assert b.copy_to_host() == b"\x07" + b"\x01" * 3 + np.arange(2, dtype=np.int32).tobytes() + b"\x01" * 2 + b"\x09\x09"
    before = b.copy_to_host()
    for bad, msg in ((np.arange(8, dtype=np.int16)[::2], "C-contiguous"), ("text", "not str"), (None, "not NoneType"),
                     (np.zeros(5, dtype=np.int32), "20 bytes at offset 0 do not fit in 16")):
        with pytest.raises(ValueError, match=msg):
            b.copy_from_host(bad)
    assert b.copy_to_host() == before
    b.free()


def _marked_steps(r, sizes, steps=7):
    """Marks each of `steps` steps that allocate `sizes` and free them in reverse; each step's addresses."""
    seen = []
    for _ in range(steps):
        r.mark_step()
        ptrs = [r.allocate(n) for n in sizes]
        for p, n in zip(reversed(ptrs), reversed(sizes)):
            r.deallocate(p, n)
        seen.append(ptrs)
        r.check_invariants()
    return seen


def test_mark_step_places_a_repeating_steps_requests_where_they_were():
    """The plan made as soon as it is laid out (plan_needs_moves:false): these steps settle without
    one, so the default makes none (the next test)."""
    r = vramkit.make_resource("pool:plan_steps:true,plan_needs_moves:false")
    sizes = [12 << 20, 3 << 20, 20 << 20, 7 << 20]
    seen = _marked_steps(r, sizes)
    c = r.pool_counters()
    assert c["plans_made"] == 1 and c["plan_missed"] == 0
    assert c["plan_placed"] == 4 * len(sizes)  # steps 3-6 (0-2: warming, recording, following)
    assert seen[3] == seen[4] == seen[5] == seen[6] and seen[3] != seen[2]
    assert c["plan_bytes"] >= 20 << 20
    assert "plan_steps:true" in c["options"]


def test_plan_needs_moves_leaves_steps_that_already_repeat_where_they_are():
    """plan_needs_moves (the default): the same steps as above already land where they did without a
    plan (the pool's own placement has settled), so no plan is made and no page moves; a bad value
    is refused."""
    r = vramkit.make_resource("pool:plan_steps:true")
    seen = _marked_steps(r, [12 << 20, 3 << 20, 20 << 20, 7 << 20])
    c = r.pool_counters()
    assert c["plans_made"] == 0 and c["plans_skipped"] >= 1, c
    assert seen[1] == seen[2] == seen[3] == seen[6]
    assert c["pages_remapped"] == 0 and c["pages_unmapped"] == 0, c
    assert "plan_needs_moves:true" in c["options"]
    with pytest.raises(ValueError, match="plan_needs_moves"):
        vramkit.make_resource("pool:plan_needs_moves:maybe")


def test_mark_step_without_plans_changes_nothing():
    vramkit.mark_step()  # the default pool, plan_steps off
    r = vramkit.make_resource("pool")
    r.mark_step()
    assert r.pool_counters()["plans_made"] == 0
    vramkit.make_resource("host").mark_step()  # not a pool: nothing to do
    assert "pool.plan_placed" in vramkit.memory_stats()
