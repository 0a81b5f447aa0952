#!/usr/bin/env python3
"""Makes a long steady trace out of a short one: one step of it repeated.

A recorded training loop of a few steps gives few steady steps to replay; this keeps the trace up
to the end of one step and then repeats that step N more times, each copy's blocks new, a block
the step frees that an earlier step made being the previous copy's. Blocks the step makes that
live into the next step are freed there where the recording's next step freed them, so the input
must hold the step after the repeated one (the window is checked against it: a step that does not
repeat is refused). The output is quick_replay's "action id size stream" lines, ids dense.

    python3 scripts/repeat_steps.py TRACE FIRST PERIOD N OUT
    python3 scripts/repeat_steps.py --body TRACE N OUT

TRACE: any trace vramkit.trace.load_trace reads (PyTorch snapshot, CSV trace, RMM log, v1), or
quick_replay lines ("action id size stream"). FIRST: the operation the repeated step begins at;
PERIOD: its operations; N: the copies added after it.

--body: a serving run made longer. The blocks made before the trace's first free and freed after
its last allocation (or never: a model's weights) stay live throughout; every other operation,
the body, comes N + 1 times in a row, each copy's blocks new (a block the body never frees is freed
at the end of its copy), and the kept blocks are freed at the end. Replayed in one pass, it shows what a pool does over a long run without starting each pass
from an empty pool.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile


def read_ops(path: str) -> list[tuple[int, int, int, int]]:
    with open(path, "rb") as f:
        head = f.read(64)
    try:
        text = head.decode("ascii")
        first = text.splitlines()[0].split() if text.strip() else []
        plain = len(first) == 4 and all(x.isdigit() for x in first)
    except UnicodeDecodeError:
        plain = False
    if plain:
        with open(path) as f:
            return [tuple(int(x) for x in line.split()) for line in f if line.strip()]
    from vramkit.trace import load_trace
    t = load_trace(path)
    return [(int(a), int(i), int(s), int(st)) for a, i, s, st in t.ops[:, :4]]


def dense_ids(out):
    """The same operations with ids 0, 1, 2, ... in the order the blocks are made."""
    dense = {}
    rows = []
    for a, i, s, st in out:
        if a == 0:
            dense[i] = len(dense)
        rows.append((a, dense[i], s, st))
    return rows


def repeat(ops, first: int, period: int, copies: int):
    end = first + period
    if first < 0 or period <= 0 or end + period > len(ops):
        raise ValueError(f"the trace has {len(ops)} operations: it must hold the step [{first}, {end}) "
                         f"and the one after it")
    window = ops[first:end]
    size = {i: s for a, i, s, _ in ops if a == 0}
    made, made_order, older = set(), [], []
    for a, i, s, _ in window:
        if a == 0:
            made.add(i)
            made_order.append(i)
        elif i not in made:
            older.append(i)  # made by an earlier step
    freed_in_window = {i for a, i, _, _ in window if a == 1}
    living_on = [i for i in made_order if i not in freed_in_window]
    freed_at = {}
    for q in range(end, len(ops)):
        a, i, _, _ = ops[q]
        if a == 1:
            freed_at[i] = q
    # The block the step makes and the next step frees at q is, one step later, the one the
    # window's operation q - end frees.
    previous = {}
    for i in living_on:
        q = freed_at.get(i)
        if q is None or q >= end + period:
            raise ValueError(f"block {i} made in the step lives past the next step: not a repeating step")
        a, j, s, _ = window[q - end]
        if a != 1 or j not in older or size.get(j) != size[i]:
            raise ValueError(f"operation {q} does not free what the step before freed there: not a repeating step")
        previous[j] = i
    missing = [j for j in older if j not in previous]
    if missing:
        raise ValueError(f"the step frees {len(missing)} blocks the step before did not make: not a repeating step")
    out = list(ops[:end])
    big = max(i for _, i, _, _ in ops) + 1
    for k in range(1, copies + 1):
        here = set()
        for a, i, s, st in window:
            if a == 0:
                out.append((0, i + k * big, s, st))
                here.add(i)
            elif i in here:
                out.append((1, i + k * big, s, st))
            else:
                out.append((1, previous[i] + (k - 1) * big, s, st))
    live = {}
    for a, i, s, st in out:
        if a == 0:
            live[i] = (s, st)
        else:
            live.pop(i, None)
    out.extend((1, i, s, st) for i, (s, st) in live.items())
    return dense_ids(out)


def repeat_body(ops, copies: int):
    if copies < 0:
        raise ValueError("the number of copies cannot be negative")
    allocs = [q for q, (a, _, _, _) in enumerate(ops) if a == 0]
    frees = [q for q, (a, _, _, _) in enumerate(ops) if a == 1]
    if not allocs:
        raise ValueError("the trace makes no block")
    first_free = frees[0] if frees else len(ops)
    last_alloc = allocs[-1]
    made_at, freed_at = {}, {}
    for q, (a, i, _, _) in enumerate(ops):
        (made_at if a == 0 else freed_at)[i] = q
    kept = {i for i, q in made_at.items() if q < first_free and freed_at.get(i, len(ops)) > last_alloc}
    body = [op for op in ops if op[1] not in kept]
    # A block of the body the trace never frees is freed at the end of its copy (as a replay frees
    # what a pass left live), so that copies do not pile up.
    body += [(1, i, s, st) for a, i, s, st in ops if a == 0 and i not in kept and i not in freed_at]
    if not body:
        raise ValueError("every block of the trace is kept: there is no body to repeat")
    big = max(i for _, i, _, _ in ops) + 1
    out = [op for op in ops if op[0] == 0 and op[1] in kept]
    for k in range(copies + 1):
        out.extend((a, i + (k + 1) * big, s, st) for a, i, s, st in body)
    out.extend((1, i, s, st) for a, i, s, st in ops if a == 0 and i in kept)
    return dense_ids(out), len(kept)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    body = "--body" in argv
    if body:
        argv.remove("--body")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 usage="%(prog)s TRACE FIRST PERIOD N OUT | %(prog)s --body TRACE N OUT")
    ap.add_argument("trace")
    if not body:
        ap.add_argument("first", type=int)
        ap.add_argument("period", type=int)
    ap.add_argument("copies", type=int)
    ap.add_argument("out")
    a = ap.parse_args(argv)
    try:
        if body:
            rows, kept = repeat_body(read_ops(a.trace), a.copies)
        else:
            rows = repeat(read_ops(a.trace), a.first, a.period, a.copies)
    except (OSError, ValueError) as e:
        print(f"repeat_steps: {e}", file=sys.stderr)
        return 2
    d = os.path.dirname(os.path.abspath(a.out))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".repeat_steps.")
    try:
        with os.fdopen(fd, "w") as f:
            f.writelines(f"{r[0]} {r[1]} {r[2]} {r[3]}\n" for r in rows)
        os.replace(tmp, a.out)
    except BaseException:
        os.unlink(tmp)
        raise
    if body:
        print(f"{len(rows)} operations: {kept} blocks kept live, the rest {a.copies + 1} times in a row")
    else:
        print(f"{len(rows)} operations: the trace to {a.first + a.period}, then the step "
              f"[{a.first}, {a.first + a.period}) {a.copies} more times")
    return 0


if __name__ == "__main__":
    sys.exit(main())
