"""The exporter under a burst: 200 concurrent scrapes on loopback, a quarter of them hanging up
early, must all be answered fast and leave no traceback on the serving program's stderr.

The clients are non-blocking sockets driven by one selector, so that what is measured is the
server (200 client threads would mostly measure their own contention for the GIL)."""
from __future__ import annotations

import selectors
import socket
import struct
import subprocess
import sys
import time

SERVER = r"""
import sys
from vramkit.monitor.exporter import start_exporter
exp = start_exporter(nvml=False)
exp.collector.render()  # the first render imports the sampler: a steady state is what is measured
print(exp.port, flush=True)
sys.stdin.readline()   # serve until the test closes our stdin
exp.stop()
"""
CLIENTS = 200
REQUEST = b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


def _burst(port: int) -> tuple[list[float], list[str]]:
    sel = selectors.DefaultSelector()
    t0 = time.perf_counter()
    for i in range(CLIENTS):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        sel.register(s, selectors.EVENT_WRITE, {"early": i % 4 == 0, "data": b""})
    times: list[float] = []
    errors: list[str] = []
    deadline = time.monotonic() + 30
    while sel.get_map() and time.monotonic() < deadline:
        for key, ev in sel.select(timeout=1):
            s, st = key.fileobj, key.data
            if ev & selectors.EVENT_WRITE:
                s.sendall(REQUEST)
                if st["early"]:
                    # RST instead of FIN: the server's write then fails with ECONNRESET / EPIPE.
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    sel.unregister(s)
                    s.close()
                else:
                    sel.modify(s, selectors.EVENT_READ, st)
                continue
            try:
                chunk = s.recv(65536)
            except OSError as e:
                chunk, st["data"] = b"", repr(e).encode()
            if chunk:
                st["data"] += chunk
                continue
            sel.unregister(s)
            s.close()
            if st["data"].startswith(b"HTTP/1.1 200") and b"vramkit_" in st["data"]:
                times.append(time.perf_counter() - t0)
            else:
                errors.append(st["data"][:80].decode(errors="replace"))
    errors += [f"no answer in 30 s ({len(sel.get_map())} sockets)"] if sel.get_map() else []
    return times, errors


def test_burst_with_early_disconnects():
    proc = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    p99s = []
    try:
        port = int(proc.stdout.readline())
        # The best of three bursts: this machine's other work (a build, another test) can stall one;
        # a backlog of 5 stalls every one by a SYN retransmit (a second or more).
        for _ in range(3):
            times, errors = _burst(port)
            assert not errors, errors[:3]
            assert len(times) == CLIENTS - CLIENTS // 4
            times.sort()
            p99s.append(times[int(0.99 * (len(times) - 1))])
            print(f"{CLIENTS} concurrent scrapes: p50 {times[len(times) // 2] * 1000:.1f} ms, "
                  f"p99 {p99s[-1] * 1000:.1f} ms")
            if p99s[-1] < 0.100:
                break
        time.sleep(0.2)  # let the server notice the resets before it is stopped
    finally:
        _, err = proc.communicate(input="\n", timeout=30)
    assert "Traceback" not in err and "Error" not in err, err[:2000]
    assert min(p99s) < 0.100, f"p99 of each burst: {[round(p * 1000) for p in p99s]} ms"
