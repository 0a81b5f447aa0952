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


def serving_run():
    """Weights made first and never freed, then requests whose blocks come and go; the last
    request's output is never freed either (a recording that stopped with it live)."""
    rows = [(0, 0, 40 * MiB, 0), (0, 1, 24 * MiB, 0)]
    nid = 2
    for n in (3, 7, 5):
        acts = list(range(nid, nid + 3))
        for k, i in enumerate(acts):
            rows.append((0, i, (n + k) * MiB, 0))
        for i in reversed(acts):
            rows.append((1, i, 0, 0))
        nid += 3
    rows.append((0, nid, 2 * MiB, 0))  # never freed
    return rows


def test_body_keeps_the_weights_and_repeats_the_rest():
    rows = serving_run()
    got, kept = repeat_steps.repeat_body(rows, 2)
    assert kept == 2
    check_whole(got)
    assert got[:2] == [(0, 0, 40 * MiB, 0), (0, 1, 24 * MiB, 0)]
    assert got[-2:] == [(1, 0, 40 * MiB, 0), (1, 1, 24 * MiB, 0)]
    body = rows[2:] + [(1, 11, 2 * MiB, 0)]  # the unfreed output, freed at the end of its copy
    middle = got[2:-2]
    assert len(middle) == 3 * len(body)
    for k in range(3):
        copy = middle[k * len(body):(k + 1) * len(body)]
        assert [(a, s) for a, _, s, _ in copy if a == 0] == [(a, s) for a, _, s, _ in body if a == 0]
        ids = {i for a, i, _, _ in copy if a == 0}
        assert len(ids) == 10 and not ids & {0, 1}
    # The weights live through every copy: the peak is theirs plus the largest request's.
    live = peak = 0
    size = {}
    for a, i, s, _ in got:
        if a == 0:
            size[i] = s
            live += s
        else:
            live -= size[i]
        peak = max(peak, live)
    assert peak == (40 + 24 + 7 + 8 + 9) * MiB


def test_body_refuses_what_it_cannot_repeat(tmp_path):
    with pytest.raises(ValueError, match="cannot be negative"):
        repeat_steps.repeat_body(serving_run(), -1)
    with pytest.raises(ValueError, match="no body"):
        repeat_steps.repeat_body([(0, 0, MiB, 0), (0, 1, MiB, 0)], 3)
    with pytest.raises(ValueError, match="makes no block"):
        repeat_steps.repeat_body([], 3)
    src = tmp_path / "t.ops"
    src.write_text("".join(f"{a} {i} {s} {st}\n" for a, i, s, st in serving_run()))
    dst = tmp_path / "long.ops"
    r = subprocess.run([sys.executable, SCRIPT, "--body", str(src), "4", str(dst)], capture_output=True, text=True)
    assert r.returncode == 0 and "2 blocks kept live, the rest 5 times in a row" in r.stdout
    check_whole([tuple(int(x) for x in line.split()) for line in dst.read_text().splitlines()])
    r = subprocess.run([sys.executable, SCRIPT, "--body", str(tmp_path / "missing.ops"), "4", str(dst)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "repeat_steps:" in r.stderr
