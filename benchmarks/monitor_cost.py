"""What watching GPU memory costs: CPU per sample of the monitor, and the exporter's scrape time.

    python3 benchmarks/monitor_cost.py [--samples 500] [--scrapes 200] [--live SECONDS] [--fake FILE]

Rows:

* ``sample: devices``              - one NVML read of every device (memory, utilization, temperature, power)
* ``sample: devices + processes``  - what ``vramkit smi`` / ``top`` / the Sampler do per sample: devices, one
                                     process list per device, process names from /proc
* ``top: render``                  - building ``vramkit top``'s screen from a sample (no curses I/O)
* ``Sampler.sample``               - a full sample written to the CSV recording (with allocator rows)
* ``exporter: render``             - building the ``/metrics`` text (NVML cached, allocator read)
* ``exporter: scrape``             - an HTTP GET of ``/metrics`` over a kept-alive connection (client wall time)
* ``live Sampler at 1 Hz``         - (``--live S``) the process's CPU time over S seconds of a real 1 Hz Sampler

CPU is ``time.process_time()`` (user + system, all threads of this process); "% of a core at 1 Hz" is CPU
seconds per sample x 100. Uses NVML when a driver is there, else ``--fake`` / ``$VRAMKIT_FAKE_NVML``, else a
generated fake with 8 GPUs x 16 processes (said in the output).
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import vramkit
from vramkit.monitor import NvmlUnavailableError, Snapshotter, open_monitor
from vramkit.monitor.exporter import start_exporter
from vramkit.monitor.sampler import Sampler
from vramkit.monitor.top import render_lines


def generated_fake(devices: int = 8, procs: int = 16) -> str:
    doc = {"driver_version": "fake", "devices": [
        {"name": "NVIDIA H200", "uuid": f"GPU-{i:08d}", "total_bytes": 150754820096, "used_bytes": (i + 1) << 30,
         "reserved_bytes": 597688320, "utilization_gpu": 50, "utilization_memory": 20, "temperature_c": 40,
         "power_w": 300.0,
         "processes": [{"pid": os.getpid() if j == 0 else 4000000 + j, "used_bytes": (j + 1) << 26,
                        "name": "" if j == 0 else f"worker{j}"} for j in range(procs)]}
        for i in range(devices)]}
    fd, path = tempfile.mkstemp(suffix=".json", prefix="vramkit_fake_")
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f)
    return path


def cpu_per_call(fn, n: int) -> tuple[float, float]:
    """(CPU s, wall s) per call, after a warm-up call."""
    fn()
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(n):
        fn()
    return (time.process_time() - c0) / n, (time.perf_counter() - w0) / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=500, help="samples per row (default 500)")
    ap.add_argument("--scrapes", type=int, default=200, help="HTTP scrapes (default 200)")
    ap.add_argument("--live", type=float, default=0.0, metavar="SECONDS",
                    help="also run a 1 Hz Sampler for SECONDS and report its CPU share")
    ap.add_argument("--fake", metavar="FILE", help="use this simulated driver even if NVML is there")
    args = ap.parse_args()

    fake = args.fake
    note = ""
    if fake is None:
        try:
            open_monitor()
        except NvmlUnavailableError:
            fake = generated_fake()
            note = " (no driver: generated fake, 8 GPUs x 16 processes)"
    monitor = open_monitor(fake)
    snap = Snapshotter(monitor)
    ndev = monitor.device_count()
    nproc = sum(len(monitor.processes(i)) for i in range(ndev))
    print(f"# monitor_cost  {time.strftime('%Y-%m-%d %H:%M')}  {platform.node()}  {platform.processor() or platform.machine()}"
          f"  python {platform.python_version()}  vramkit backend {vramkit.backend()}")
    print(f"# command: {' '.join([os.path.basename(sys.executable)] + sys.argv)}")
    print(f"# monitor: {snap.backend} driver {snap.driver_version}{note}; {ndev} device(s), {nproc} process(es)\n")
    rows = []

    c, w = cpu_per_call(lambda: monitor.devices(), args.samples)
    rows.append(("sample: devices", c, w))
    c, w = cpu_per_call(lambda: snap.take(), args.samples)
    rows.append(("sample: devices + processes", c, w))
    s0 = snap.take()
    hist = {d["index"]: [0.5] * 200 for d in s0["devices"]}
    c, w = cpu_per_call(lambda: render_lines(s0, hist, 160, interval=1.0), args.samples)
    rows.append(("top: render", c, w))
    with tempfile.TemporaryDirectory() as tmp:
        sampler = Sampler(3600, os.path.join(tmp, "rec.csv"), monitor=monitor)
        sampler.start()
        c, w = cpu_per_call(sampler.sample, args.samples)
        sampler.stop()
        rows.append(("Sampler.sample (CSV row write)", c, w))

    buf = vramkit.alloc(1 << 20)
    exp = start_exporter(fake_json=fake, interval=1.0)
    c, w = cpu_per_call(exp.collector.render, args.samples)
    rows.append(("exporter: render", c, w))
    conn = http.client.HTTPConnection("127.0.0.1", exp.port, timeout=10)
    times = []
    c0 = time.process_time()
    for _ in range(args.scrapes):
        t0 = time.perf_counter()
        conn.request("GET", "/metrics")
        body = conn.getresponse().read()
        times.append(time.perf_counter() - t0)
    cpu_scrape = (time.process_time() - c0) / args.scrapes
    conn.close()
    exp.stop()
    buf.free()
    rows.append(("exporter: scrape (HTTP, keep-alive)", cpu_scrape, statistics.median(times)))

    print(f"{'row':<38} {'CPU/sample':>12} {'wall/sample':>12} {'% core @1Hz':>12}")
    for name, c, w in rows:
        print(f"{name:<38} {c * 1e3:>9.3f} ms {w * 1e3:>9.3f} ms {c * 100:>11.3f}%")
    times.sort()
    p95 = times[int(0.95 * (len(times) - 1))]
    print(f"\nscrape wall time over {len(times)} scrapes ({len(body)} bytes): median {statistics.median(times) * 1e3:.3f} ms, "
          f"p95 {p95 * 1e3:.3f} ms, max {times[-1] * 1e3:.3f} ms")

    if args.live > 0:
        with tempfile.TemporaryDirectory() as tmp:
            c0, w0 = time.process_time(), time.perf_counter()
            with Sampler(1.0, os.path.join(tmp, "live.csv"), monitor=monitor) as s:
                time.sleep(args.live)
            cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        print(f"live Sampler at 1 Hz: {s.samples} samples in {wall:.1f} s, CPU {cpu * 1e3:.1f} ms "
              f"= {cpu / wall * 100:.3f}% of a core")
    if fake and note:
        os.unlink(fake)
    return 0


if __name__ == "__main__":
    sys.exit(main())
