"""Prints the caching pool's counters per trace and pool configuration, one table row each, so
two builds of the pool can be compared line by line (a refactor must leave every figure equal).

    python3 benchmarks/pool_counters.py TRACE_DIR [ANCHORS_DIR] [--passes N] [--quick-replay BIN]

TRACE_DIR holds the *.trace.csv.gz files; ANCHORS_DIR (optional) the anchors' anchors.py for the
two synthetic traces (as in host_replay.py). Each trace is replayed on the simulated (host) device
under several pool configurations that take different paths through the pool (remapping off,
mappings not kept, waiting before growing, a reserve limit near the peak). With --quick-replay
(the cpp/bench quick_replay program) each trace is also replayed with a GPU that lags the host by
64 operations, so frees on one stream wait for their events (cross-stream reuse, stream reclaims). Timings are left out: they differ run to run.
"""
import argparse
import glob
import os
import subprocess
import sys

from vramkit import _vramkit
from vramkit.cli import replay_ops
from vramkit.trace import load_trace

CONFIGS = ["", "keep_mappings:false",
           "remap:false", "wait_to_remap:true", "growth_slack:0", "page_size:8388608", "small_threshold:0"]
COUNTERS = ["pages_created", "pages_destroyed", "pages_mapped", "pages_unmapped", "pages_remapped",
            "mappings_reused", "map_calls", "stream_reclaims"]
SHORT = ["created", "destroyed", "mapped", "unmapped", "remapped", "reused", "map calls", "reclaims"]


def traces(trace_dir, anchors_dir):
    for f in sorted(glob.glob(os.path.join(trace_dir, "*.trace.csv*"))):
        t = load_trace(f)
        yield t.name, replay_ops(t)
    if anchors_dir:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from host_replay import synthetic_traces
        yield from synthetic_traces(anchors_dir)


def quick_replay_text(ops) -> str:
    """Replay operations as quick_replay reads them: "action id size stream" lines."""
    return "".join(f"{int(o[0])} {int(o[1])} {int(o[2])} {int(o[3]) if len(o) > 3 else 0}\n" for o in ops)


def row(name, conf, peak_live, peak_reserved, frag, ooms, c):
    cells = [name, conf or "default", str(peak_live), str(peak_reserved), frag, str(ooms)]
    cells += [str(c.get(k, "")) for k in COUNTERS]
    print("| " + " | ".join(cells) + " |", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace_dir")
    ap.add_argument("anchors_dir", nargs="?")
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--quick-replay", help="path of the quick_replay program (adds lagging-GPU rows)")
    ap.add_argument("--lag", type=int, default=64)
    a = ap.parse_args()
    if not os.path.isdir(a.trace_dir):
        ap.error(f"{a.trace_dir} is not a directory")
    items = list(traces(a.trace_dir, a.anchors_dir))
    if not items:
        ap.error(f"no *.trace.csv* files in {a.trace_dir}")
    print(f"passes {a.passes}, backend {_vramkit.backend()}")
    print("| trace | config | peak live | peak reserved | fragmentation | ooms | " + " | ".join(SHORT) + " |")
    print("|" + "---|" * (6 + len(SHORT)))
    for name, ops in items:
        default_peak = 0
        for conf in CONFIGS:
            r = _vramkit.make_resource("vramkit:" + conf if conf else "vramkit", 0)
            res = _vramkit.replay(ops, r, a.passes)
            row(name, conf, res["peak_live_bytes"], res["peak_reserved_bytes"], f"{res['fragmentation']:.6f}",
                res["ooms"], r.pool_counters())
            default_peak = default_peak or res["peak_reserved_bytes"]
            del r
        # Half the peak a default pool reserved: the pool trims, waits and runs out of memory.
        limit = default_peak // 2
        if limit:
            conf = f"reserve_limit:{limit},release_threshold:0"
            r = _vramkit.make_resource("vramkit:" + conf, 0)
            res = _vramkit.replay(ops, r, 2)
            row(name, "reserve_limit:half,release_threshold:0", res["peak_live_bytes"], res["peak_reserved_bytes"],
                f"{res['fragmentation']:.6f}", res["ooms"], r.pool_counters())
            del r
        if a.quick_replay:
            text = quick_replay_text(ops)
            for conf in ["", "keep_mappings:false"]:
                env = dict(os.environ, VKLAG=str(a.lag), VKPASSES=str(a.passes))
                out = subprocess.run([a.quick_replay] + ([conf] if conf else []), input=text, text=True,
                                     capture_output=True, env=env, check=True).stdout.strip()
                print(f"| {name} | lag {a.lag} {conf or 'default'} | {out} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
