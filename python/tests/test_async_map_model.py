"""benchmarks/async_map_model.py: page calls per operation from the pool's counters, their cost on
the allocating thread (at once) and on a worker that falls behind when calls come faster than it
makes them."""
import gzip
import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks")
sys.path.insert(0, BENCH)
import async_map_model as amm  # noqa: E402

MiB = 1 << 20


def _trace(path, rows):
    with gzip.open(path, "wt") as f:
        f.write("t_us,action,addr,size,stream\n")
        for r in rows:
            f.write(",".join(str(x) for x in r) + "\n")


def test_two_blocks_at_once_then_apart(tmp_path):
    # Two 8 MiB blocks 10 us apart (4 new pages each: the worker cannot keep up), freed, then a
    # third long after (the pool takes the freed pages back: no new call).
    p = tmp_path / "t.trace.csv.gz"
    _trace(p, [(0, "alloc", "0xa", 8 * MiB, 0), (10, "alloc", "0xb", 8 * MiB, 0),
               (20, "free_requested", "0xa", 8 * MiB, 0), (30, "free_requested", "0xb", 8 * MiB, 0),
               (100_000, "alloc", "0xc", 8 * MiB, 0), (100_010, "free_requested", "0xc", 8 * MiB, 0)])
    costs = {"create": 10.0, "map": 30.0, "unmap": 20.0, "destroy": 15.0}
    m = amm.model(str(p), costs)
    assert m["ops"] == 6 and m["pages_created"] == 8 and m["pages_mapped"] == 8
    assert m["sync_ms"] == pytest.approx(8 * 40 / 1e3)           # creations and maps, on the host
    assert m["map_host_ms"] == pytest.approx(8 * 10 / 1e3)       # async_map: the creations stay there
    # async_map's worker: the first block's maps arrive at 40 us (its creations first) and end at
    # 160; the second's arrive at 90 and end at 280: 190 us behind, the worst.
    assert m["map_behind_max_ms"] == pytest.approx(0.190)
    # async_create: 160 us of calls from 0, then 160 more from 160: 310 us behind the op at 10.
    assert m["create_behind_max_ms"] == pytest.approx(0.310)
    assert m["map_behind_end_ms"] == 0 and m["create_behind_end_ms"] == 0


def test_the_command_prints_a_row_per_trace_and_refuses_bad_input(tmp_path):
    _trace(tmp_path / "a.trace.csv.gz", [(0, "alloc", "0x1", 3 * MiB, 0), (5, "free_requested", "0x1", 3 * MiB, 0)])
    run = lambda *a: subprocess.run([sys.executable, os.path.join(BENCH, "async_map_model.py"), *a],
                                    capture_output=True, text=True, timeout=120)
    p = run(str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert "| a | 2 |" in p.stdout
    p = run(str(tmp_path), "--cost", "map:fast")
    assert p.returncode != 0 and "map needs a number" in p.stderr
    p = run(str(tmp_path / "nothing"))
    assert p.returncode == 2 and "no *.trace.csv.gz" in p.stderr
