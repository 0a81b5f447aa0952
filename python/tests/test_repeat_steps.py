"""scripts/repeat_steps.py: a short recording made into a long steady trace for the host model."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "repeat_steps.py")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import repeat_steps  # noqa: E402

MiB = 1 << 20


def loop(steps, kept=True):
    """Weights, then steps: activations freed in reverse, and an output kept until the next step
    has made its own (logits). Returns rows and the operation each step begins at."""
    rows, nid, starts = [], 0, []

    def alloc(size):
        nonlocal nid
        rows.append((0, nid, size, 0))
        nid += 1
        return nid - 1

    w = [alloc(s * MiB) for s in (40, 24)]
    out = None
    for _ in range(steps):
        starts.append(len(rows))
        acts = [alloc(s * MiB) for s in (12, 20, 6, 33)]
        new = alloc(30 * MiB)
        if out is not None:
            rows.append((1, out, 30 * MiB, 0))
        out = new
        if not kept:
            rows.append((1, out, 30 * MiB, 0))
            out = None
        for a in reversed(acts):
            rows.append((1, a, 0, 0))
    for i in w + ([out] if out is not None else []):
        rows.append((1, i, 0, 0))
    return rows, starts


def check_whole(rows):
    live = set()
    for a, i, s, _ in rows:
        if a == 0:
            assert i not in live
            live.add(i)
        else:
            assert i in live, f"free of {i}, not live"
            live.remove(i)
    assert not live


def test_the_step_is_repeated_with_the_carried_block_freed_by_the_next_copy():
    rows, starts = loop(4)
    first, period = starts[1], starts[2] - starts[1]
    out = repeat_steps.repeat(rows, first, period, 5)
    check_whole(out)
    assert len(out) == first + period * 6 + 3  # the weights and the last output freed at the end
    # Each copy is the step's operations, sizes and actions alike.
    step = [(a, s) for a, _, s, _ in rows[first:first + period] if a == 0]
    for k in range(1, 6):
        got = [(a, s) for a, _, s, _ in out[first + k * period:first + (k + 1) * period] if a == 0]
        assert got == step
    # The output made in copy k is freed in copy k + 1, after copy k + 1 made its own.
    allocs = {i: n for n, (a, i, _, _) in enumerate(out) if a == 0}
    frees = {i: n for n, (a, i, _, _) in enumerate(out) if a == 1}
    outs = [i for i, n in allocs.items() if out[n][2] == 30 * MiB and n >= first]
    for x, y in zip(outs, outs[1:]):
        assert allocs[y] < frees[x] < allocs[y] + period


def test_a_step_that_does_not_repeat_is_refused(tmp_path):
    rows, starts = loop(4)
    first, period = starts[1], starts[2] - starts[1]
    broken = list(rows)
    # The next step frees the output before making its own: not what the repeated step did.
    nxt = starts[2]
    new_at = next(n for n in range(nxt, starts[3]) if broken[n][0] == 0 and broken[n][2] == 30 * MiB)
    broken.insert(nxt, broken.pop(new_at + 1))
    with pytest.raises(ValueError, match="not a repeating step"):
        repeat_steps.repeat(broken, first, period, 3)
    with pytest.raises(ValueError, match="must hold the step"):
        repeat_steps.repeat(rows, starts[3], period, 3)
    src = tmp_path / "t.ops"
    src.write_text("".join(f"{a} {i} {s} {st}\n" for a, i, s, st in broken))
    dst = tmp_path / "long.ops"
    r = subprocess.run([sys.executable, SCRIPT, str(src), str(first), str(period), "3", str(dst)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "not a repeating step" in r.stderr
    assert not dst.exists() and os.listdir(tmp_path) == ["t.ops"]


def test_the_cli_writes_quick_replay_lines(tmp_path):
    rows, starts = loop(4, kept=False)
    src = tmp_path / "t.ops"
    src.write_text("".join(f"{a} {i} {s} {st}\n" for a, i, s, st in rows))
    dst = tmp_path / "long.ops"
    first, period = starts[1], starts[2] - starts[1]
    r = subprocess.run([sys.executable, SCRIPT, str(src), str(first), str(period), "4", str(dst)],
                       capture_output=True, text=True, check=True)
    assert "4 more times" in r.stdout
    got = [tuple(int(x) for x in line.split()) for line in dst.read_text().splitlines()]
    check_whole(got)
    assert len(got) == first + 5 * period + 2
