"""The pool on the simulated device with a GPU that lags the host: memory, page operations and a
model of the driver time, per trace, lag and pool configuration.

    python3 benchmarks/pool_lag_study.py TRACE_DIR --quick-replay build/default/cpp/bench/quick_replay \
        [--lags 64,500,3000] [--configs "default;wait_to_remap:true;page_size:8MiB"] [--passes 6]

A real GPU runs behind the host: pages a stream freed can be moved elsewhere only once its queued
work is done (or after waiting for it), and that changes what the pool does. quick_replay replays a
trace's operations several times with an event completing L operations after it is recorded.
Columns: reserved/live at the peak; the driver time of the first pass (the cold step) and the
median of the last three passes (steady state) under a per-handle cost model (an H100's create
8.7 us, map + set access 29.25 us, unmap 19.3 us, release 13.1 us, the same for any handle size);
page moves and host waits a pass in steady state. Modelled, not timed: it ranks configurations
for a GPU run, it does not replace one.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pool_counters import quick_replay_text, traces  # noqa: E402

PASS = re.compile(r"pass (\d+): created (\d+) mapped (\d+) unmapped (\d+) remapped (\d+) reused (\d+) destroyed (\d+) "
                  r"reserved (\d+) MiB waits (\d+)[^\n]*? driver_ms ([\d.]+)")  # chunk/early counts between
RATIO = re.compile(r"peak_reserved/peak_live ([\d.]+)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace_dir")
    ap.add_argument("--quick-replay", required=True, help="the cpp/bench quick_replay program")
    ap.add_argument("--lags", default="64,500,3000")
    ap.add_argument("--configs", default="default;wait_to_remap:true;page_size:8MiB;"
                    "page_size:32MiB;wait_to_remap:true,page_size:8MiB")
    ap.add_argument("--passes", type=int, default=6)
    a = ap.parse_args()
    if a.passes < 4:
        ap.error("--passes must be at least 4 (steady state is the median of the last three)")
    lags = [int(x) for x in a.lags.split(",")]
    configs = a.configs.split(";")
    items = list(traces(a.trace_dir, None))
    if not items:
        print(f"no *.trace.csv* files in {a.trace_dir}", file=sys.stderr)
        return 2
    print("| trace | lag | config | reserved/live | cold driver ms | steady driver ms/pass | steady moves/pass | steady waits/pass |")
    print("|---|---|---|---|---|---|---|---|")
    for name, ops in items:
        text = quick_replay_text(ops)
        for lag in lags:
            for conf in configs:
                args = [a.quick_replay] + ([] if conf == "default" else [_bytes(conf)])
                env = dict(os.environ, VKLAG=str(lag), VKPASSES=str(a.passes))
                out = subprocess.run(args, input=text, text=True, capture_output=True, env=env)
                if out.returncode != 0:
                    print(f"| {name} | {lag} | {conf} | failed: {out.stderr.strip().splitlines()[-1][:80]} | | | | |")
                    continue
                passes = [tuple(float(x) for x in m.groups()) for m in PASS.finditer(out.stdout)]
                ratio = float(RATIO.search(out.stdout).group(1))
                tail = passes[-3:]
                print(f"| {name} | {lag} | {conf} | {ratio:.3f} | {passes[0][9]:.0f} | "
                      f"{statistics.median(p[9] for p in tail):.1f} | {statistics.median(p[4] for p in tail):.0f} | "
                      f"{statistics.median(p[8] for p in tail):.0f} |", flush=True)
    return 0


def _bytes(conf: str) -> str:
    """page_size:8MiB -> page_size:8388608 (quick_replay takes bytes)."""
    return re.sub(r"(\d+)MiB", lambda m: str(int(m.group(1)) << 20), conf)


if __name__ == "__main__":
    sys.exit(main())
