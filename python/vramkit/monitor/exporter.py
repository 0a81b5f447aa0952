"""Prometheus ``/metrics``: DCGM-compatible GPU metrics, per-process GPU memory, and the allocator's own.

* ``vramkit exporter`` (:func:`exporter_main`) serves the device metrics of every GPU on a node, with the
  names and labels of NVIDIA's dcgm-exporter (``DCGM_FI_DEV_FB_USED`` ... in MiB, labels ``gpu``, ``UUID``,
  ``pci_bus_id``, ``device``, ``modelName``, ``Hostname``, ``DCGM_FI_DRIVER_VERSION``), so Grafana dashboard
  12239 and existing alerts work unchanged, plus ``vramkit_process_gpu_memory_bytes`` per process.
* :func:`start_exporter` serves the same from inside a program on a background thread, and adds what only
  the program knows: its vramkit allocator's statistics (``vramkit_memory_allocated_bytes`` ..., labels
  ``device`` and ``pid``). Without a driver the device metrics are left out (a comment line says why).

The text is Prometheus exposition format 0.0.4, written with the standard library (``http.server``).
NVML is sampled at most once per ``interval`` however often it is scraped.
"""
from __future__ import annotations

import argparse
import operator
import os
import queue
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterable

from . import NvmlUnavailableError, Snapshotter, open_monitor, unavailable_message

PROG = "vramkit exporter"
DEFAULT_PORT = 9448  # not dcgm-exporter's 9400 nor nvitop-exporter's 8000: both may run on the same node
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_MIB = 1 << 20

# (name, type, help, value from a device dict) - help texts as dcgm-exporter's default counters.
_DCGM: list[tuple[str, str, str, Callable[[dict], Any]]] = [
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", lambda d: d["free_bytes"] // _MIB),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", lambda d: d["used_bytes"] // _MIB),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).",
     lambda d: None if d["reserved_bytes"] is None else d["reserved_bytes"] // _MIB),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", lambda d: d["temperature_c"]),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", lambda d: d["utilization_gpu"]),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", lambda d: d["utilization_memory"]),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", lambda d: d["power_w"]),
]

# (name, type, help, vramkit.memory_stats key; read through sampler.allocator_stats)
_ALLOCATOR: list[tuple[str, str, str, str]] = [
    ("vramkit_memory_allocated_bytes", "gauge", "Bytes of live vramkit allocations (requested sizes).",
     "allocated_bytes.all.current"),
    ("vramkit_memory_reserved_bytes", "gauge", "Bytes the vramkit allocator holds from the device.",
     "reserved_bytes.all.current"),
    ("vramkit_memory_cached_bytes", "gauge", "Bytes reserved but not allocated (cached for reuse).", "cached_bytes"),
    ("vramkit_memory_fragmentation_ratio", "gauge", "Allocator fragmentation as vramkit.memory_stats reports it.",
     "fragmentation"),
    ("vramkit_largest_free_bytes", "gauge", "Largest free range inside the allocator's reserve.",
     "largest_free_bytes"),
    ("vramkit_oom_total", "counter", "Out-of-memory errors raised by the allocator.", "num_ooms"),
    ("vramkit_alloc_total", "counter", "Allocation calls served by the allocator.", "num_alloc_calls"),
]


def _label(v: Any) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: Iterable[tuple[str, Any]]) -> str:
    return "{" + ",".join(f'{k}="{_label(v)}"' for k, v in pairs) + "}"


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    f = float(v)
    if f != f:
        return "NaN"
    if f in (float("inf"), float("-inf")):
        return "+Inf" if f > 0 else "-Inf"
    return repr(f)


def _family(out: list[str], name: str, kind: str, help_text: str, samples: list[tuple[str, Any]]) -> None:
    if not samples:
        return
    out.append(f"# HELP {name} {help_text}")
    out.append(f"# TYPE {name} {kind}")
    out.extend(f"{name}{labels} {_value(v)}" for labels, v in samples)


def render_device_metrics(snap: dict[str, Any]) -> list[str]:
    """Exposition lines of one :meth:`Snapshotter.take`: DCGM device families and per-process memory."""
    out: list[str] = []
    host = snap["hostname"]
    devs = snap["devices"]
    base = {d["index"]: [("gpu", d["index"]), ("UUID", d["uuid"]), ("pci_bus_id", d["pci_bus_id"]),
                         ("device", f"nvidia{d['index']}"), ("modelName", d["name"]), ("Hostname", host),
                         ("DCGM_FI_DRIVER_VERSION", snap["driver_version"])]
            for d in devs}
    for name, kind, help_text, get in _DCGM:
        samples = []
        for d in devs:
            v = get(d)
            if v is not None:
                samples.append((_labels(base[d["index"]]), v))
        _family(out, name, kind, help_text, samples)
    procs = []
    for d in devs:
        for p in d.get("processes", ()):
            if p["used_bytes"] is not None:
                lab = [("gpu", d["index"]), ("UUID", d["uuid"]), ("pid", p["pid"]), ("process_name", p["name"]),
                       ("Hostname", host)]
                procs.append((_labels(lab), p["used_bytes"]))
    _family(out, "vramkit_process_gpu_memory_bytes", "gauge",
            "GPU memory used by a process (NVML, host PID).", procs)
    return out


def render_allocator_metrics(devices: Iterable[int], pid: int | None = None) -> list[str]:
    """Exposition lines of this process's vramkit allocator statistics on ``devices``."""
    from .sampler import allocator_stats
    pid = os.getpid() if pid is None else pid
    stats = [(dev, allocator_stats(dev)) for dev in devices]
    out: list[str] = []
    for name, kind, help_text, key in _ALLOCATOR:
        samples = [(_labels([("device", dev), ("pid", pid)]), s[key]) for dev, s in stats if key in s]
        _family(out, name, kind, help_text, samples)
    return out


class Collector:
    """Builds the ``/metrics`` text. NVML is asked at most once per ``interval`` s (scrapes in between get
    the cached device sample); the allocator statistics are read on every scrape (they are cheap)."""

    def __init__(self, snapper: Snapshotter | None, *, interval: float = 1.0, processes: bool = True,
                 allocator_devices: list[int] | None = None, nvml_error: str | None = None):
        self.snapper = snapper
        self.interval = interval
        self.processes = processes
        self.allocator_devices = allocator_devices
        self.nvml_error = nvml_error
        self._lock = threading.Lock()
        self._device_lines: list[str] = []
        self._taken = -float("inf")

    def _devices(self) -> list[str]:
        with self._lock:  # concurrent scrapes share one NVML sample
            now = time.monotonic()
            if now - self._taken >= self.interval:
                try:
                    self._device_lines = render_device_metrics(self.snapper.take(self.processes))
                except Exception as e:  # a lost GPU must not take the allocator metrics down with it
                    self._device_lines = [f"# vramkit: device metrics failed: {' '.join(str(e).split())}"]
                self._taken = now
            return self._device_lines

    def render(self) -> str:
        t0 = time.perf_counter()
        lines: list[str] = []
        if self.snapper is not None:
            lines += self._devices()
        elif self.nvml_error:
            lines.append(f"# vramkit: device metrics omitted: {' '.join(self.nvml_error.split())}")
        if self.allocator_devices:
            lines += render_allocator_metrics(self.allocator_devices)
        _family(lines, "vramkit_exporter_render_seconds", "gauge",
                "Time this exporter spent building the previous lines of this scrape.",
                [("", time.perf_counter() - t0)])
        return "\n".join(lines) + "\n"


class _Handler(BaseHTTPRequestHandler):
    server_version = "vramkit-exporter"
    protocol_version = "HTTP/1.1"
    timeout = 60  # idle keep-alive connections are closed after this
    # Headers and body go out in two writes; with Nagle's algorithm the second waits for the client's
    # delayed ACK (~40 ms) on a kept-alive connection, which is how Prometheus scrapes.
    disable_nagle_algorithm = True

    def _send(self, code: int, body: bytes, ctype: str, head: bool = False) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _handle(self, head: bool) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            try:
                body = self.server.collector.render().encode("utf-8")  # type: ignore[attr-defined]
            except Exception as e:
                self._send(500, f"vramkit exporter: {e}\n".encode(), "text/plain; charset=utf-8", head)
                return
            self._send(200, body, CONTENT_TYPE, head)
        elif path == "/":
            self._send(200, b'<html><head><title>vramkit exporter</title></head><body><h1>vramkit exporter</h1>'
                       b'<p><a href="/metrics">Metrics</a></p></body></html>\n', "text/html; charset=utf-8", head)
        else:
            self._send(404, b"not found; metrics are at /metrics\n", "text/plain; charset=utf-8", head)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._handle(False)

    def do_HEAD(self) -> None:  # noqa: N802
        self._handle(True)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - silence per-request logging
        pass

    def handle(self) -> None:
        # A scraper that hangs up early is normal (a timeout, a killed curl): not worth a traceback
        # on the user's stderr, and nothing is left to answer.
        try:
            super().handle()
        except (ConnectionError, TimeoutError):
            self.close_connection = True


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # socketserver's default listen backlog is 5: a burst of scrapes (many Prometheus servers, or
    # a dashboard fanning out) then waits for SYN retransmits, which take a second or more.
    request_queue_size = 1024

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Disconnects are answered in _Handler.handle; anything else is one line, not a traceback.
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return
        print(f"{PROG}: request from {client_address[0]} failed: {exc!r}", file=sys.stderr)

    # Connections go to a few kept threads while one of them is idle: starting a thread per
    # connection was most of the cost of a burst of scrapes. Beyond them each connection still gets
    # a new thread, since a kept-alive scraper holds its thread until the idle timeout.
    pooled_threads = 8

    def __init__(self, address: tuple[str, int], collector: Collector):
        self.collector = collector
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._pool_lock = threading.Lock()
        self._idle = self._pooled = 0
        if ":" in address[0]:
            import socket
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._pool_lock:
            pooled = self._idle > 0 or self._pooled < self.pooled_threads
            if self._idle > 0:
                self._idle -= 1
            elif pooled:
                self._pooled += 1
                threading.Thread(target=self._pool_worker, name="vramkit-exporter-worker", daemon=True).start()
        if pooled:
            self._jobs.put((request, client_address))
        else:
            super().process_request(request, client_address)

    def _pool_worker(self) -> None:
        while (job := self._jobs.get()) is not None:
            self.process_request_thread(*job)  # ThreadingMixIn's: handle, report errors, close
            with self._pool_lock:
                self._idle += 1

    def server_close(self) -> None:
        super().server_close()
        with self._pool_lock:
            for _ in range(self._pooled):
                self._jobs.put(None)
            self._pooled = self._idle = 0


class Exporter:
    """A running exporter (from :func:`start_exporter`): ``port``, ``url``, ``stop()``; a context manager."""

    def __init__(self, server: _Server, thread: threading.Thread):
        self._server = server
        self._thread = thread
        host = server.server_address[0]
        self.address = host
        self.port = server.server_address[1]
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{self.port}/metrics"
        self.collector = server.collector

    def stop(self) -> None:
        """Stop serving and close the socket (idempotent)."""
        if self._thread is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        self._thread = None

    def __enter__(self) -> "Exporter":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<vramkit.monitor.Exporter {self.url}{'' if self._thread else ' (stopped)'}>"


def _serve(collector: Collector, port: int, address: str) -> Exporter:
    try:  # 80.5 or "80" would otherwise be truncated or parsed; True is no port either
        if isinstance(port, bool):
            raise TypeError
        port = operator.index(port)
    except TypeError:
        raise ValueError(f"port must be an integer in 0..65535, not {port!r}") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"port must be an integer in 0..65535, not {port!r}")
    if address in ("0.0.0.0", "::", ""):
        print(f"{PROG}: warning: listening on every interface ({address or '0.0.0.0'}:{port}): any machine "
              "that reaches this one can read the metrics (there is no authentication)", file=sys.stderr)
    server = _Server((address, port), collector)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.25},
                              name="vramkit-exporter", daemon=True)
    thread.start()
    return Exporter(server, thread)


def start_exporter(port: int = 0, address: str = "127.0.0.1", *, devices: list[int] | None = None,
                   nvml: bool = True, processes: bool = True, interval: float = 1.0,
                   fake_json: str | None = None) -> Exporter:
    """Serve ``/metrics`` from this process on a background thread.

    Parameters
    ----------
    port : int
        TCP port; 0 picks a free one (read it back from ``.port``).
    address : str
        Interface to bind: loopback by default; ``"0.0.0.0"`` to let other machines scrape.
    devices : list of int, optional
        vramkit devices whose allocator metrics to export (default: every simulated device on the host
        backend, the current device on CUDA).
    nvml : bool
        Also export the DCGM-compatible device metrics and per-process memory (when a driver is there).
    interval : float
        Minimum seconds between two NVML samples.
    fake_json : str, optional
        Simulated driver for the device metrics.

    >>> exp = vramkit.monitor.start_exporter(port=9448)   # doctest: +SKIP
    >>> exp.url                                          # doctest: +SKIP
    'http://127.0.0.1:9448/metrics'
    >>> exp.stop()                                       # doctest: +SKIP
    """
    from .sampler import allocator_stats, default_allocator_devices
    snapper, err = None, None
    if nvml:
        try:
            snapper = Snapshotter(open_monitor(fake_json))
        except NvmlUnavailableError as e:
            err = str(e)
    else:
        err = "disabled (nvml=False)"
    alloc = list(devices) if devices is not None else default_allocator_devices()
    for dev in alloc:  # an unknown device fails here, in the caller, not in every scrape
        allocator_stats(dev)
    collector = Collector(snapper, interval=interval, processes=processes, allocator_devices=alloc,
                          nvml_error=err)
    return _serve(collector, port, address)


# ---- command line --------------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"TCP port (default {DEFAULT_PORT}; 0: any free)")
    p.add_argument("--address", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1, loopback only; 0.0.0.0 for every interface)")
    p.add_argument("--interval", type=float, default=1.0, metavar="SECONDS",
                   help="minimum seconds between two NVML samples, however often it is scraped (default 1.0)")
    p.add_argument("--no-processes", action="store_true", help="leave out per-process GPU memory")


def run(args: argparse.Namespace) -> int:
    """The ``vramkit exporter`` command: serve until interrupted."""
    if not (args.interval >= 0):
        print(f"{PROG}: --interval must be >= 0", file=sys.stderr)
        return 2
    try:
        snapper = Snapshotter(open_monitor())
    except NvmlUnavailableError as e:
        print(f"{PROG}: {unavailable_message(e)}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"{PROG}: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    collector = Collector(snapper, interval=args.interval, processes=not args.no_processes)
    try:
        exp = _serve(collector, args.port, args.address)
    except (OSError, ValueError, OverflowError) as e:
        print(f"{PROG}: cannot listen on {args.address}:{args.port}: {getattr(e, 'strerror', None) or e}",
              file=sys.stderr)
        return 1
    # SIGINT (Ctrl-C) and SIGTERM (a cluster stopping the pod) end the loop; the handlers are in
    # place before the "serving" line, so a signal right after it still stops cleanly.
    stop = threading.Event()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda signum, frame: stop.set())
    try:
        n = snapper.monitor.device_count()
        print(f"{PROG}: serving {exp.url} ({snapper.backend}, {n} GPU(s)); Ctrl-C stops", file=sys.stderr,
              flush=True)
        while not stop.wait(3600):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        exp.stop()
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Serve GPU metrics (DCGM-compatible names) for Prometheus.")
    add_arguments(p)
    return p


def exporter_main(argv: list[str] | None = None) -> int:
    """``vramkit exporter`` with ``argv``; returns the exit code."""
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(exporter_main())
