"""What async_map could hide, estimated from the real traces' own timing (host model).

Each trace (``t_us,action,addr,size,stream``, recorded under PyTorch's default allocator) is replayed
through the default pool on the host device; after every operation the pool's counters give the
page calls it made (pages created, mapped, unmapped, destroyed). Each call is given the driver's
cost per 2 MiB page measured on an H100 (issue 12: create 8.7 us, map 1.05 + set access 28.2,
unmap 19.3, release 13.1; override with --cost) and the operation the trace's time stamp. Then:

- ``calls at once``: the page calls on the allocating thread, as the pool makes them today: the
  time they add to the host's run.
- ``async_map``: creations stay on the allocating thread (the time they add), the rest go to one
  worker in order, each starting when its operation happened (the trace's time plus what the host
  spent so far) or when the worker is free. A block's pages are mapped when the worker has made
  its calls; "worker behind" is how far the worker's finish time lies past the operation that
  needed it, at the worst moment and at the trace's end. The GPU runs behind the host by some lag
  the trace does not record, so the worst case assumed here is a GPU with no lag at all: a kernel
  using a block runs the moment the block is allocated, and waits for the worker for as long as
  the worker is behind.
- ``async_create``: the same with creations on the worker too.

    python3 benchmarks/async_map_model.py /path/to/traces [--cost create:8.7,map:29.25,unmap:19.3,destroy:13.1]

A model, not a measurement: the GPU suite decides (docs/BENCHMARKS.md section 5).
"""
from __future__ import annotations

import argparse
import csv
import gzip
import os
import sys

COSTS = {"create": 8.7, "map": 1.05 + 28.2, "unmap": 19.3, "destroy": 13.1}  # us per 2 MiB page, H100
KEYS = {"create": "pages_created", "map": "pages_mapped", "unmap": "pages_unmapped", "destroy": "pages_destroyed"}


def parse_costs(text: str) -> dict:
    out = dict(COSTS)
    for item in filter(None, text.split(",")):
        k, _, v = item.partition(":")
        if k not in out:
            raise SystemExit(f"--cost: unknown call {k!r} (known: {', '.join(out)})")
        try:
            out[k] = float(v)
        except ValueError:
            raise SystemExit(f"--cost: {k} needs a number of microseconds, not {v!r}") from None
    return out


def model(path: str, costs: dict) -> dict:
    import vramkit
    r = vramkit.make_resource("pool", 0)
    live, streams = {}, {}
    prev = {k: 0 for k in KEYS.values()}
    host_sync = host_async_map = 0.0            # us added to the allocating thread
    worker_map = worker_create = 0.0            # when each worker is free (us, trace time)
    behind_map = behind_create = 0.0            # the worst lag of each worker behind the op that needed it
    last_map = last_create = 0.0                # the lag at the trace's end
    t0 = None
    ops = 0
    with gzip.open(path, "rt") as f:
        for row in csv.DictReader(f):
            a = row["action"]
            if a not in ("alloc", "free_requested"):
                continue
            t = float(row["t_us"])
            t0 = t if t0 is None else t0
            t -= t0
            s = streams.setdefault(row["stream"], len(streams))
            if a == "alloc":
                size = max(1, int(row["size"]))
                live[row["addr"]] = (r.allocate(size, s), size, s)
            else:
                got = live.pop(row["addr"], None)
                if got is None:
                    continue
                r.deallocate(got[0], got[1], got[2])
            ops += 1
            c = r.pool_counters()
            d = {k: c[v] - prev[v] for k, v in KEYS.items()}
            prev = {v: c[v] for v in KEYS.values()}
            cost = {k: d[k] * costs[k] for k in KEYS}
            if not any(d.values()):
                continue
            # async_map: creations on the host, the rest on the worker
            host_sync += sum(cost.values())
            host_async_map += cost["create"]
            arrive = t + host_async_map
            worker_map = max(worker_map, arrive) + cost["map"] + cost["unmap"] + cost["destroy"]
            if d["map"] or d["create"]:  # a block whose pages the GPU needs now
                last_map = worker_map - arrive
                behind_map = max(behind_map, last_map)
            # async_create: everything on the worker
            worker_create = max(worker_create, t) + sum(cost.values())
            if d["map"] or d["create"]:
                last_create = worker_create - t
                behind_create = max(behind_create, last_create)
    span = t if t0 is not None else 0.0
    return {"trace": os.path.basename(path).split(".")[0], "ops": ops, "span_ms": span / 1e3,
            "pages_created": prev["pages_created"], "pages_mapped": prev["pages_mapped"],
            "sync_ms": host_sync / 1e3, "map_host_ms": host_async_map / 1e3,
            "map_behind_max_ms": behind_map / 1e3, "map_behind_end_ms": max(0.0, worker_map - span - host_async_map) / 1e3,
            "create_behind_max_ms": behind_create / 1e3, "create_behind_end_ms": max(0.0, worker_create - span) / 1e3}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", help="folder with the *.trace.csv.gz files")
    ap.add_argument("--cost", default="", help="us per page: create:X,map:X,unmap:X,destroy:X (H100's by default)")
    a = ap.parse_args(argv)
    costs = parse_costs(a.cost)
    files = sorted(f for f in os.listdir(a.traces) if f.endswith(".trace.csv.gz")) if os.path.isdir(a.traces) else []
    if not files:
        print(f"error: no *.trace.csv.gz in {a.traces}", file=sys.stderr)
        return 2
    print("us per page: " + ", ".join(f"{k} {v:g}" for k, v in costs.items()))
    print("| trace | ops | span ms | pages created / mapped | calls at once: host + ms | async_map: host + ms "
          "| worker behind, worst / at the end ms | async_create: worker behind, worst / at the end ms |")
    print("|---|---|---|---|---|---|---|---|")
    for f in files:
        m = model(os.path.join(a.traces, f), costs)
        print(f"| {m['trace']} | {m['ops']:,} | {m['span_ms']:,.0f} | {m['pages_created']:,} / {m['pages_mapped']:,} "
              f"| {m['sync_ms']:,.1f} | {m['map_host_ms']:,.1f} | {m['map_behind_max_ms']:,.1f} / {m['map_behind_end_ms']:,.1f} "
              f"| {m['create_behind_max_ms']:,.1f} / {m['create_behind_end_ms']:,.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
