"""Prometheus ``/metrics``: DCGM-compatible GPU metrics, per-process GPU memory, and the allocator's own.

* ``vramkit exporter`` (:func:`exporter_main`) serves the device metrics of every GPU on a node, with the
  names and labels of NVIDIA's dcgm-exporter (``DCGM_FI_DEV_FB_USED`` ... in MiB, labels ``gpu``, ``UUID``,
  ``pci_bus_id``, ``device``, ``modelName``, ``Hostname``, ``DCGM_FI_DRIVER_VERSION``), so Grafana dashboard
  12239 and existing alerts work unchanged, plus ``vramkit_process_gpu_memory_bytes`` per process.
* :func:`start_exporter` serves the same from inside a program on a background thread, and adds what only
  the program knows: its vramkit allocator's statistics (``vramkit_memory_allocated_bytes`` ..., labels
  ``device`` and ``pid``). Without a driver the device metrics are left out (a comment line says why).

The text is Prometheus exposition format 0.0.4, served by a small HTTP/1.1 server on one thread (standard
library only).
NVML is sampled at most once per ``interval`` however often it is scraped.
"""
from __future__ import annotations

import argparse
import email.utils
import operator
import os
import re
import selectors
import signal
import socket
import sys
import threading
import time
from typing import Any, Callable, Iterable

from . import NvmlUnavailableError, Snapshotter, open_monitor, unavailable_message
from .._threads import start_daemon

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
    the cached device sample); the allocator statistics are read on every scrape (they are cheap), except
    that scrapes the server answers in one pass of its loop (a burst) share one rendering."""

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


_INDEX = (b'<html><head><title>vramkit exporter</title></head><body><h1>vramkit exporter</h1>'
          b'<p><a href="/metrics">Metrics</a></p></body></html>\n')
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            413: "Content Too Large", 431: "Request Header Fields Too Large", 500: "Internal Server Error",
            501: "Not Implemented", 505: "HTTP Version Not Supported"}
_MAX_HEAD = 64 << 10   # request line and headers
_MAX_BODY = 1 << 20    # a GET with a body is odd but legal: read and dropped up to this size
_MAX_OUT = 4 << 20     # unsent response bytes of one connection before its requests wait
_HEAD_END = re.compile(rb"\r?\n\r?\n")
_LEAD = re.compile(rb"[\r\n]*")


class _Conn:
    __slots__ = ("sock", "inbuf", "out", "last", "closing", "body_left", "mask")

    def __init__(self, sock: socket.socket, now: float):
        self.sock = sock
        self.inbuf = bytearray()
        self.out = bytearray()
        self.last = now
        self.closing = False  # close once ``out`` is sent
        self.body_left = 0    # bytes of a request body still to drop
        self.mask = selectors.EVENT_READ  # what the selector watches for


class _Server:
    """HTTP/1.1 on one thread with a selector: every connection is non-blocking and each request is
    answered as soon as it is complete. A burst of scrapes then costs a parse and a render each,
    with no thread started or woken per connection (the thread-per-request servers of the standard
    library spent most of a burst there). Keep-alive (how Prometheus scrapes), HEAD, pipelined
    requests, partial writes to slow readers and clients that hang up early are handled; a
    connection idle for ``idle_timeout`` s is closed."""

    idle_timeout = 60.0
    # Open connections at most: past it new ones wait in the kernel's accept queue, so a crowd of
    # idle or non-reading clients cannot take every file descriptor of the program serving.
    max_connections = 256
    # The kernel's accept queue: with the usual 5, a burst of scrapes (many Prometheus servers, or a
    # dashboard fanning out) waits for SYN retransmits, which take a second or more.
    backlog = 1024

    def __init__(self, address: tuple[str, int], collector: Collector):
        self.collector = collector
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind(address)
            self._listener.listen(self.backlog)
            self._listener.setblocking(False)
        except BaseException:
            self._listener.close()
            raise
        self.server_address = self._listener.getsockname()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, "listen")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._conns: dict[int, _Conn] = {}
        self._stopping = False
        self._stopped = threading.Event()
        self._accept_paused_until = 0.0
        self._listening = True
        self._batch_body: bytes | None = None
        self._swept = 0.0

    # -- the loop ---------------------------------------------------------------------------
    def serve_forever(self) -> None:
        try:
            while not self._stopping:
                now = time.monotonic()
                if self._accept_paused_until and now >= self._accept_paused_until:
                    self._accept_paused_until = 0.0
                    self._listen(len(self._conns) < self.max_connections)
                self._batch_body = None  # scrapes that arrived together share one render
                for key, events in self._sel.select(timeout=1.0):
                    if key.data == "listen":
                        self._accept()
                    elif key.data == "wake":
                        try:
                            self._wake_r.recv(64)
                        except OSError:
                            pass
                    else:
                        self._service(key.data, events)
                now = time.monotonic()
                if now - self._swept >= 0.25:
                    self._swept = now
                    self._sweep(now)
        finally:
            if self._stopping:  # the loop closes its own sockets: never under it, from another thread
                self.server_close()
            self._stopped.set()

    def _accept(self) -> None:
        now = time.monotonic()
        for _ in range(256):  # then let the connections already accepted be served
            if len(self._conns) >= self.max_connections:
                self._listen(False)  # until one closes
                return
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # out of file descriptors: stop accepting for a moment, do not spin
                print(f"{PROG}: cannot accept a connection: {e.strerror or e}", file=sys.stderr)
                self._listen(False)
                self._accept_paused_until = now + 0.5
                return
            sock.setblocking(False)
            # A response that needs several writes (a slow reader) must not wait on delayed ACKs.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(sock, now)
            self._conns[sock.fileno()] = conn
            self._sel.register(sock, selectors.EVENT_READ, conn)

    def _service(self, conn: _Conn, events: int) -> None:
        try:
            if events & selectors.EVENT_READ:
                data = conn.sock.recv(65536)
                if not data:  # the client is done sending; what it asked for is still answered
                    conn.closing = True
                    conn.inbuf.clear()
                else:
                    conn.last = time.monotonic()
                    if not conn.closing:
                        conn.inbuf += data
                        self._answer(conn)
            self._flush(conn)
        except (ConnectionError, TimeoutError):
            self._close(conn)  # a scraper that hangs up early is normal: nothing to report
        except Exception as e:  # one bad connection must not stop the exporter
            print(f"{PROG}: request failed: {e!r}", file=sys.stderr)
            self._close(conn)

    def _flush(self, conn: _Conn) -> None:
        """Send what is pending; answer requests held back while too much was pending; close a
        finished connection; watch the socket for what it can do next."""
        if conn.out:
            try:
                sent = conn.sock.send(conn.out)
            except (BlockingIOError, InterruptedError):
                sent = 0
            del conn.out[:sent]
            if sent:  # a client still reading a long answer is not idle
                conn.last = time.monotonic()
            if conn.inbuf and not conn.closing and len(conn.out) < _MAX_OUT:
                self._answer(conn)  # a pipelining client that reads slowly: its next requests
        if not conn.out and conn.closing:
            self._close(conn)
            return
        # Reading stops while a client leaves a lot unread (no memory grows for it) and after it
        # is done sending (an end of file would otherwise be reported again and again).
        mask = (selectors.EVENT_WRITE if conn.out else 0) | \
            (selectors.EVENT_READ if not conn.closing and len(conn.out) < _MAX_OUT else 0)
        if mask != conn.mask:
            self._sel.modify(conn.sock, mask, conn)
            conn.mask = mask

    def _listen(self, on: bool) -> None:
        if on != self._listening:
            if on:
                self._sel.register(self._listener, selectors.EVENT_READ, "listen")
            else:
                self._sel.unregister(self._listener)
            self._listening = on

    def _close(self, conn: _Conn) -> None:
        if self._conns.pop(conn.sock.fileno(), None) is not None:
            self._sel.unregister(conn.sock)
        conn.sock.close()
        if not self._listening and not self._stopping and not self._accept_paused_until \
                and len(self._conns) < self.max_connections:
            self._listen(True)

    def _sweep(self, now: float) -> None:
        for conn in [c for c in self._conns.values() if now - c.last > self.idle_timeout]:
            self._close(conn)

    # -- HTTP -------------------------------------------------------------------------------
    def _answer(self, conn: _Conn) -> None:
        """Answer the complete requests in ``conn.inbuf``, in order, while not too much is pending."""
        while not conn.closing and len(conn.out) < _MAX_OUT:
            if conn.body_left:
                drop = min(conn.body_left, len(conn.inbuf))
                del conn.inbuf[:drop]
                conn.body_left -= drop
                if conn.body_left:
                    return
            lead = _LEAD.match(conn.inbuf).end()
            if lead:  # empty lines before a request are allowed
                del conn.inbuf[:lead]
            end = _HEAD_END.search(conn.inbuf)  # a blank line; a bare LF ends a line too
            if end is None:
                if len(conn.inbuf) > _MAX_HEAD:
                    self._respond(conn, 431, b"request headers too large\n", close=True)
                return
            head = bytes(conn.inbuf[:end.start()])
            del conn.inbuf[:end.end()]
            self._request(conn, head)

    def _request(self, conn: _Conn, head: bytes) -> None:
        lines = [ln[:-1] if ln.endswith("\r") else ln for ln in head.decode("latin-1").split("\n")]
        parts = lines[0].split() if lines else []
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            self._respond(conn, 400, b"bad request line\n", close=True)
            return
        method, target, version = parts
        if version not in ("HTTP/1.0", "HTTP/1.1"):
            self._respond(conn, 505, b"HTTP/1.0 and HTTP/1.1 only\n", close=True)
            return
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                self._respond(conn, 400, b"bad header line\n", close=True)
                return
            name, value = name.lower(), value.strip()
            if name in headers and name == "content-length" and headers[name] != value:
                self._respond(conn, 400, b"conflicting Content-Length headers\n", close=True)
                return
            # Repeated list headers (Connection: a, then Connection: b) combine (RFC 9110 5.3).
            headers[name] = f"{headers[name]}, {value}" if name in headers and name != "content-length" else value
        tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
        close = "close" in tokens if version == "HTTP/1.1" else "keep-alive" not in tokens
        if "transfer-encoding" in headers:
            self._respond(conn, 501, b"request bodies with a transfer-encoding are not accepted\n", close=True)
            return
        length = headers.get("content-length", "0")
        if not (length.isascii() and length.isdigit()):  # "\u00b2".isdigit() is true, and int() fails on it
            self._respond(conn, 400, b"bad Content-Length\n", close=True)
            return
        length = length.lstrip("0") or "0"
        if len(length) > 18 or int(length) > _MAX_BODY:  # int() refuses over 4,300 digits
            self._respond(conn, 413, b"request body too large\n", close=True)
            return
        conn.body_left = int(length)
        if method not in ("GET", "HEAD"):
            self._respond(conn, 405, b"GET or HEAD only\n", close=close, extra="Allow: GET, HEAD\r\n")
            return
        head_only = method == "HEAD"
        path = target.split("?", 1)[0]
        if path[:7].lower() == "http://" or path[:8].lower() == "https://":  # absolute-form (RFC 9112 3.2.2)
            path = "/" + path.split("/", 3)[3] if path.count("/") >= 3 else "/"
        if path == "/metrics":
            try:
                if self._batch_body is None:
                    self._batch_body = self.collector.render().encode("utf-8")
                body = self._batch_body
            except Exception as e:
                self._respond(conn, 500, f"vramkit exporter: {e}\n".encode(), close=close, head_only=head_only)
                return
            self._respond(conn, 200, body, close=close, ctype=CONTENT_TYPE, head_only=head_only)
        elif path == "/":
            self._respond(conn, 200, _INDEX, close=close, ctype="text/html; charset=utf-8", head_only=head_only)
        else:
            self._respond(conn, 404, b"not found; metrics are at /metrics\n", close=close, head_only=head_only)

    def _respond(self, conn: _Conn, code: int, body: bytes, *, close: bool, ctype: str = "text/plain; charset=utf-8",
                 head_only: bool = False, extra: str = "") -> None:
        connection = "Connection: close\r\n" if close else ""
        head = (f"HTTP/1.1 {code} {_REASONS[code]}\r\nServer: vramkit-exporter\r\n"
                f"Date: {email.utils.formatdate(usegmt=True)}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\n{extra}{connection}\r\n")
        conn.out += head.encode("latin-1")
        if not head_only:
            conn.out += body
        if close:
            conn.closing = True
            conn.inbuf.clear()

    # -- stopping ---------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop the loop (from another thread) and wait for it."""
        self._stopping = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._stopped.wait(5)

    def server_close(self) -> None:
        for conn in list(self._conns.values()):
            self._close(conn)
        for s in (self._listener, self._wake_r, self._wake_w):
            s.close()
        self._sel.close()


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
        self._thread.join(timeout=5)
        if not self._thread.is_alive():  # else the loop closes its sockets itself once it gets out
            self._server.server_close()
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
    return Exporter(server, start_daemon(server.serve_forever, "vramkit-exporter"))


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
        while not stop.wait(1.0):  # short waits: a signal's handler runs within a second whatever thread got it
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
