"""benchmarks/moe_trace.py: the synthetic mixture-of-experts trace of the host model."""
import os
import subprocess
import sys

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks")
sys.path.insert(0, BENCH)

import moe_trace  # noqa: E402


def _steps(out, marks):
    bounds = marks + [len(out)]
    return [out[bounds[i]:bounds[i + 1]] for i in range(len(marks))]


def test_every_free_is_of_a_live_block_and_the_steps_keep_their_order_while_routed_sizes_change():
    out, marks = moe_trace.trace(steps=4, alpha=10.0, seed=3)
    live = {}
    for line in out:
        action, i, size, stream = map(int, line.split())
        assert stream == 0
        if action == 0:
            assert i not in live and size > 0
            live[i] = size
        else:
            assert action == 1 and i in live, line
            del live[i]
    steps = _steps(out, marks)
    assert len({len(s) for s in steps[1:]}) == 1  # every step after the first has as many operations
    kinds = [[line.split()[0] for line in s] for s in steps[1:]]
    assert all(k == kinds[0] for k in kinds)  # the same order of requests and frees
    sizes = [[int(line.split()[2]) for line in s if line[0] == "0"] for s in steps[1:]]
    changed = sum(a != b for a, b in zip(sizes[0], sizes[1]))
    assert 0 < changed < len(sizes[0]) // 2  # the routed blocks change, the rest repeat


def test_the_same_seed_gives_the_same_trace_and_the_marks_go_to_stderr():
    cmd = [sys.executable, os.path.join(BENCH, "moe_trace.py"), "--steps", "3", "--seed", "5"]
    a = subprocess.run(cmd, capture_output=True, text=True, check=True)
    b = subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert a.stdout == b.stdout and a.stdout.endswith("\n")
    out, marks = moe_trace.trace(3, 10.0, 5)
    assert a.stderr.strip() == f"VKSTEP={marks[0]},{marks[1] - marks[0]}"


def test_bad_arguments_are_refused():
    for args in (["--steps", "0"], ["--alpha", "0"], ["--alpha", "nan"], ["--steps", "x"]):
        r = subprocess.run([sys.executable, os.path.join(BENCH, "moe_trace.py"), *args],
                           capture_output=True, text=True)
        assert r.returncode == 2 and r.stdout == "", args
        assert "error" in r.stderr
