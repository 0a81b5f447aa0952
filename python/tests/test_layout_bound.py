"""benchmarks/layout_bound.py: fixed-offset layouts of a trace's allocations."""
import os
import subprocess
import sys

import numpy as np

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks")
sys.path.insert(0, BENCH)

import layout_bound as lb  # noqa: E402


def _ops(rows):
    return np.array([[a, i, s, 0] for a, i, s in rows], dtype=np.int64)


def _check_layout(s, e, z, order):
    """Re-derives the layout's offsets and checks that no two blocks alive together overlap."""
    top = lb.layout_top(s, e, z, order)
    assert top >= lb.peak_live(s, e, z)
    return top


def test_first_fit_in_order_loses_what_the_clairvoyant_layout_keeps():
    # A (1000) and B (1000) live; A freed; C (2000) requested while B lives. In request order C
    # cannot go where A was (B sits above it): top 4000 at a peak of 3000. Largest first, C takes 0,
    # A (dead before C) shares it, and B goes above C: the peak.
    ops = _ops([(0, 1, 1000), (0, 2, 1000), (1, 1, 0), (0, 3, 2000), (1, 2, 0), (1, 3, 0)])
    s, e, z = lb.intervals(ops, 1)
    assert lb.peak_live(s, e, z) == 3000
    first = _check_layout(s, e, z, np.argsort(s, kind="stable"))
    clair = _check_layout(s, e, z, np.lexsort((s, -z)))
    assert first == 4000
    assert clair == 3000


def test_blocks_apart_in_time_share_offsets_and_sizes_are_rounded():
    ops = _ops([(0, 1, 100), (1, 1, 0), (0, 2, 700), (1, 2, 0), (0, 3, 1), (1, 3, 0)])
    s, e, z = lb.intervals(ops, 512)
    assert list(z) == [512, 1024, 512]
    assert lb.peak_live(s, e, z) == 1024
    assert lb.layout_top(s, e, z, np.argsort(s, kind="stable")) == 1024


def test_a_block_never_freed_lives_to_the_end():
    ops = _ops([(0, 1, 4096), (0, 2, 4096), (1, 2, 0), (0, 3, 4096)])
    s, e, z = lb.intervals(ops, 1)
    assert lb.peak_live(s, e, z) == 8192
    assert lb.layout_top(s, e, z, np.argsort(s, kind="stable")) == 8192


def test_program_prints_a_row_per_trace(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text("t_us,action,addr,size,stream\n" + "".join(
        f"{2 * i},alloc,{4096 * (i + 1)},{4096 * (i % 3 + 1)},0\n{2 * i + 1},free_requested,{4096 * (i + 1)},{4096 * (i % 3 + 1)},0\n"
        for i in range(50)))
    out = subprocess.run([sys.executable, os.path.join(BENCH, "layout_bound.py"), str(csv)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("| t |")]
    assert len(rows) == 1 and rows[0].split("|")[2].strip() == "50", out.stdout


def test_a_bad_trace_is_one_line_of_error(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("t_us,action,addr,size,stream\n1,explode,0,1,0\n")
    out = subprocess.run([sys.executable, os.path.join(BENCH, "layout_bound.py"), str(bad)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert out.stderr.startswith("layout_bound: error:") and "explode" in out.stderr and "Traceback" not in out.stderr
