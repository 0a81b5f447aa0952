"""Replays the real traces and the anchors' two synthetic traces through vramkit on the
simulated (host) device: fragmentation (in the first pass and over every pass) and cold/warm ns per
op, as a table.

    python3 benchmarks/host_replay.py TRACE_DIR ANCHORS_DIR [--passes N]

TRACE_DIR holds the *.trace.csv.gz files; ANCHORS_DIR the anchors' anchors.py, whose
`synthetic()` generator (same parameters and seeds as its table) makes synth_mixed and synth_small.
"""
import argparse
import glob
import importlib.util
import os
import sys

import numpy as np

import vramkit
from vramkit import _vramkit
from vramkit.cli import replay_ops
from vramkit.trace import load_trace


def synthetic_traces(anchors_dir):
    spec = importlib.util.spec_from_file_location("anchors", os.path.join(anchors_dir, "anchors.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for name, args in {"synth_mixed": (200_000, 512, 32 << 20, 512, 1),
                       "synth_small": (400_000, 256, 64 << 10, 1000, 2)}.items():
        ops = mod.synthetic(name, *args)
        ops[ops[:, 0] == 0, 2] = np.maximum(ops[ops[:, 0] == 0, 2], 1)
        yield name, np.ascontiguousarray(np.concatenate([ops, np.zeros((len(ops), 1), np.int64)], axis=1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace_dir")
    ap.add_argument("anchors_dir")
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--allocator", action="append")
    a = ap.parse_args()
    specs = a.allocator or ["vramkit", "host"]
    items = []
    for f in sorted(glob.glob(os.path.join(a.trace_dir, "*.trace.csv*"))):
        t = load_trace(f)
        items.append((t.name, replay_ops(t)))
    items += list(synthetic_traces(a.anchors_dir))
    print(f"vramkit {vramkit.__version__}, backend {_vramkit.backend()}, passes {a.passes}")
    print("| trace | ops | peak live MB | allocator | fragmentation | all passes | cold ns/op | warm ns/op |")
    print("|---|---|---|---|---|---|---|---|")
    for name, ops in items:
        for spec in specs:
            r = _vramkit.make_resource(spec, 0)
            res = _vramkit.replay(ops, r, a.passes)
            print(f"| {name} | {res['ops']} | {res['peak_live_bytes'] / 1e6:.0f} | {spec} | "
                  f"{res['fragmentation']:.3f} | {res['fragmentation_all_passes']:.3f} | {res['cold_ns_per_op']:.0f} | {res['warm_ns_per_op']:.0f} |",
                  flush=True)


if __name__ == "__main__":
    sys.exit(main())
