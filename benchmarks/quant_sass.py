#!/usr/bin/env python3
"""Instructions per element of the quantization encoders, read off their machine code (SASS).

The table formats' encoders (the dynamic 8-bit map, NF4, FP4) are bound by the instructions they
issue, not by memory, on a GPU whose bandwidth is high enough (docs/BENCHMARKS.md section 9). This
counts, for each encoder kernel of a build, the instructions of one turn of its main loop (from one
tile's loads into a register set to the next tile's loads into the other set) and divides by the
elements a thread encodes in that turn. It needs no GPU: only the machine code, which
``cuobjdump -sass`` prints (a CUDA toolkit's, or the ``nvidia-cuda-cuobjdump`` wheel's).

    python3 benchmarks/quant_sass.py libvramkit_kernels.so [other builds...]
    python3 benchmarks/quant_sass.py build.sass            # cuobjdump -sass output saved before

A static count: it says how much work a build asks of the GPU per element, not how fast it runs
(memory, latency and the issue rate decide that); use it to choose which builds to time.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys

FORMATS = {0: "int8", 1: "int8_dynamic", 2: "fp8_e4m3", 3: "fp8_e5m2", 4: "nf4", 5: "fp4"}
DTYPES = {"f": ("float32", 4), "13__nv_bfloat16": ("bfloat16", 8), "6__half": ("float16", 8)}
# encode_kernel<F, T, VEC, TILE, DIRECT, LB, NT> as the Itanium ABI mangles it.
KERNEL = re.compile(r"encode_kernelILi(\d)E(\w+?)Lb([01])ELi(\d+)ELb([01])ELi(\d+)ELi(\d+)E")
LINE = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
# A load of the next tile into the register set not in use: 16-byte global loads under a negated
# predicate (the last tile has none to load).
NEXT_TILE_LOAD = re.compile(r"@!P\d LDG\.E(\.[A-Z0-9]+)*\.128 ")


def functions(sass: str) -> dict[str, list[tuple[int, str]]]:
    """Each function's instructions as (address, text), from cuobjdump -sass output."""
    out: dict[str, list[tuple[int, str]]] = {}
    cur = None
    for line in sass.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            cur = m.group(1)
            out[cur] = []
            continue
        m = LINE.match(line)
        if m and cur is not None:
            out[cur].append((int(m.group(1), 16), m.group(2)))
    return out


def turn_range(instructions: list[tuple[int, str]]) -> tuple[int, int] | None:
    """Addresses [start, end) of one turn of the loop that takes turns between two register sets:
    from the first group of next-tile loads to the second; None when the kernel has no such loop."""
    starts, prev = [], None
    for addr, text in instructions:
        if NEXT_TILE_LOAD.match(text):
            if prev is None or addr - prev > 16 * 16:  # a new group, not the next load of this one
                starts.append(addr)
            prev = addr
    if len(starts) < 2:
        return None
    return starts[0], starts[1]


def loop_turn(instructions: list[tuple[int, str]]) -> int | None:
    """Instructions in one turn of the main loop (turn_range), or None."""
    r = turn_range(instructions)
    return None if r is None else (r[1] - r[0]) // 16


def opcode(text: str) -> str:
    """An instruction's mnemonic without its predicate and modifiers: '@!P0 LDG.E.128 R4, ...' -> 'LDG'."""
    words = text.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def turn_mix(instructions: list[tuple[int, str]]) -> dict[str, int]:
    """How many of each mnemonic one turn of the main loop holds ({} when there is no such loop)."""
    r = turn_range(instructions)
    mix: dict[str, int] = {}
    if r is None:
        return mix
    for addr, text in instructions:
        if r[0] <= addr < r[1]:
            op = opcode(text)
            mix[op] = mix.get(op, 0) + 1
    return mix


def encoder_rows(sass: str, formats=(1, 4, 5)) -> list[dict]:
    rows = []
    for name, ins in functions(sass).items():
        m = KERNEL.search(name)
        if not m:
            continue
        f, t, vec, tile, direct, lb, nt = m.groups()
        f, tile, lb, nt = int(f), int(tile), int(lb), int(nt)
        if f not in formats or t not in DTYPES or vec != "1":
            continue
        turn = loop_turn(ins)
        elements = tile // nt
        rows.append({"format": FORMATS[f], "dtype": DTYPES[t][0], "table": "direct" if direct == "1" else "buckets",
                     "block": f"2^{lb}" if lb else "any", "tile": tile, "threads": nt, "instructions": turn,
                     "elements": elements, "per_element": turn / elements if turn else None,
                     "mix": turn_mix(ins)})
    rows.sort(key=lambda r: (r["format"], r["dtype"], r["block"], r["table"], r["tile"]))
    return rows


def read_sass(path: str) -> str:
    if path.endswith(".sass") or path.endswith(".txt"):
        with open(path) as f:
            return f.read()
    tool = shutil.which("cuobjdump")
    if not tool:
        raise SystemExit("quant_sass: cuobjdump not found (a CUDA toolkit's, or pip's nvidia-cuda-cuobjdump); "
                         "or pass its -sass output saved as a .sass file")
    r = subprocess.run([tool, "-sass", path], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"quant_sass: cuobjdump -sass {path} failed: {r.stderr.strip() or r.returncode}")
    return r.stdout


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("builds", nargs="+", help="kernel libraries or cubins (cuobjdump reads them), or .sass text")
    ap.add_argument("--formats", default="int8_dynamic,nf4,fp4", help="comma list (default: the table formats)")
    ap.add_argument("--mix", type=int, default=0, metavar="N",
                    help="also list each encoder's N most frequent instructions of a turn, per element")
    a = ap.parse_args(argv)
    names = {v: k for k, v in FORMATS.items()}
    try:
        formats = tuple(names[x] for x in a.formats.split(","))
    except KeyError as e:
        ap.error(f"unknown format {e}; known: {', '.join(FORMATS.values())}")
    print("| build | format | dtype | block | table | tile | threads | instructions a turn | elements a thread | per element |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    found = False
    for path in a.builds:
        for r in encoder_rows(read_sass(path), formats):
            found = True
            per = "-" if r["per_element"] is None else f"{r['per_element']:.2f}"
            print(f"| {path} | {r['format']} | {r['dtype']} | {r['block']} | {r['table']} | {r['tile']} | "
                  f"{r['threads']} | {r['instructions'] or '-'} | {r['elements']} | {per} |")
            if a.mix and r["mix"]:
                top = sorted(r["mix"].items(), key=lambda kv: (-kv[1], kv[0]))[:a.mix]
                print("|  | " + ", ".join(f"{op} {n / r['elements']:.2f}" for op, n in top) + " | | | | | | | | |")
    if not found:
        print("quant_sass: no encoder kernels found", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
