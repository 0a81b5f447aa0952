"""The exporter's HTTP/1.1 server at its edges: keep-alive, pipelining, HTTP/1.0, bad requests, slow
readers, idle connections, and a stop that closes what is open. Each answer is checked on the wire."""
from __future__ import annotations

import http.client
import socket
import threading
import time

import pytest

from vramkit.monitor.exporter import start_exporter


def _read_all(s: socket.socket, size: int = 65536, pause: float = 0.0) -> bytes:
    """Read until the server closes (``pause`` s after each read: a slow reader)."""
    out = bytearray()
    while chunk := s.recv(size):
        out += chunk
        if pause:
            time.sleep(pause)
    return bytes(out)


def _small_window(port: int, timeout: float) -> socket.socket:
    """A client connection with a 4 KiB receive buffer: the server's writes to it are partial."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(timeout)
    s.connect(("127.0.0.1", port))
    return s


def _raw(port: int, data: bytes, *, timeout: float = 5.0) -> bytes:
    """Send ``data``, half-close, and read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        return _read_all(s)


def _responses(raw: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """Split a byte stream of HTTP responses (each with a Content-Length)."""
    out = []
    while raw:
        head, _, rest = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        code = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
        n = int(headers["content-length"])
        out.append((code, headers, rest[:n]))
        raw = rest[n:]
    return out


@pytest.fixture()
def exp():
    e = start_exporter(nvml=False)
    yield e
    e.stop()


def test_keep_alive_serves_many_requests_on_one_connection(exp):
    conn = http.client.HTTPConnection("127.0.0.1", exp.port, timeout=5)
    for _ in range(5):
        conn.request("GET", "/metrics?x=1")
        r = conn.getresponse()
        body = r.read()
        assert r.status == 200 and r.getheader("Content-Type").startswith("text/plain; version=0.0.4")
        assert b"vramkit_memory_allocated_bytes" in body and r.getheader("Connection") is None
    conn.request("GET", "/")
    r = conn.getresponse()
    assert r.status == 200 and b'href="/metrics"' in r.read()
    conn.close()


def test_pipelined_requests_are_answered_in_order(exp):
    req = (b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
           b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n" b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    got = _raw(exp.port, req)
    # HEAD carries the GET's headers without its body; the parser below would misread it, so split by hand.
    first, _, rest = got.partition(b"\r\n\r\n")
    n = int([ln for ln in first.split(b"\r\n") if ln.lower().startswith(b"content-length")][0].split(b":")[1])
    head_resp, _, rest2 = rest[n:].partition(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 200") and head_resp.startswith(b"HTTP/1.1 200")
    (c404, _, _), (c200, h200, body) = _responses(rest2)
    assert c404 == 404 and c200 == 200 and h200.get("connection") == "close" and b"/metrics" in body


def test_http_1_0_closes_unless_keep_alive(exp):
    (code, headers, body), = _responses(_raw(exp.port, b"GET /metrics HTTP/1.0\r\n\r\n"))
    assert code == 200 and headers["connection"] == "close" and b"vramkit_" in body
    with socket.create_connection(("127.0.0.1", exp.port), timeout=5) as s:
        s.sendall(b"GET /metrics HTTP/1.0\r\nConnection: keep-alive\r\n\r\n" * 2)
        time.sleep(0.3)
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        s.shutdown(socket.SHUT_WR)
        data = _read_all(s)
    assert [c for c, _, _ in _responses(data)] == [200, 200, 200]


@pytest.mark.parametrize("request_bytes, code", [
    (b"BOGUS\r\n\r\n", 400),
    (b"GET /metrics HTTP/2.0\r\n\r\n", 505),
    (b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n", 400),
    (b"GET /metrics HTTP/1.1\r\nContent-Length: ten\r\n\r\n", 400),
    (b"GET /metrics HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n", 413),
    (b"GET /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 501),
    (b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc", 405),
    (b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * (70 << 10), 431),
    (b"GET /metrics HTTP/1.1\r\nContent-Length: \xb2\r\n\r\n", 400),  # "\u00b2".isdigit(), int() fails
    (b"GET /metrics HTTP/1.1\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n", 413),  # int() limit
], ids=["request-line", "version", "header", "length-text", "length-huge", "chunked", "post", "huge-head",
        "length-superscript", "length-5000-digits"])
def test_bad_requests_get_a_status_and_the_server_keeps_serving(exp, request_bytes, code):
    got = _responses(_raw(exp.port, request_bytes))
    assert [c for c, _, _ in got] == [code]
    if code == 405:
        assert got[0][1]["allow"] == "GET, HEAD"
    (c, _, body), = _responses(_raw(exp.port, b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n"))
    assert c == 200 and b"vramkit_" in body


def test_a_request_body_is_skipped_and_the_next_request_answered(exp):
    req = b"GET /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nHELLOGET / HTTP/1.1\r\nConnection: close\r\n\r\n"
    assert [c for c, _, _ in _responses(_raw(exp.port, req))] == [200, 200]


def test_a_request_split_across_many_writes(exp):
    req = b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    with socket.create_connection(("127.0.0.1", exp.port), timeout=5) as s:
        for i in range(len(req)):
            s.sendall(req[i:i + 1])
            if i % 8 == 0:
                time.sleep(0.005)
        data = _read_all(s)
    assert [c for c, _, _ in _responses(data)] == [200]


def test_a_slow_reader_gets_every_byte_and_others_are_served_meanwhile(exp):
    # Many pipelined scrapes with a tiny receive buffer: the server's writes are partial and it must
    # keep the rest, while a second client is answered without waiting for the first.
    n = 400
    slow = _small_window(exp.port, 10)
    slow.sendall(b"GET /metrics HTTP/1.1\r\n\r\n" * (n - 1) + b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n")
    time.sleep(0.3)
    t0 = time.monotonic()
    (c, _, _), = _responses(_raw(exp.port, b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n"))
    assert c == 200 and time.monotonic() - t0 < 2
    data = _read_all(slow, 1024)
    slow.close()
    got = _responses(data)
    assert len(got) == n and all(c == 200 and b"vramkit_" in body for c, _, body in got)


def test_a_client_that_does_not_read_holds_back_its_requests_not_memory(exp):
    # 4,000 pipelined scrapes (about 6 MB of answers), then the client's end of sending, and no
    # reading for a while: the server keeps at most a few MiB pending for it, answers the rest as
    # it reads, and only closes once everything asked for was sent.
    from vramkit.monitor.exporter import _MAX_OUT
    n = 4000
    s = _small_window(exp.port, 20)
    s.sendall(b"GET /metrics HTTP/1.1\r\n\r\n" * n)
    s.shutdown(socket.SHUT_WR)
    time.sleep(0.5)
    conns = list(exp._server._conns.values())
    assert len(conns) == 1 and len(conns[0].out) < _MAX_OUT + (64 << 10)
    data = _read_all(s)
    s.close()
    got = _responses(data)
    assert len(got) == n and all(c == 200 for c, _, _ in got)


def test_idle_connections_are_closed(exp, monkeypatch):
    exp._server.idle_timeout = 0.5
    with socket.create_connection(("127.0.0.1", exp.port), timeout=5) as s:
        t0 = time.monotonic()
        assert s.recv(1) == b""  # closed by the server, not timed out here
        assert 0.4 < time.monotonic() - t0 < 4


def test_stop_closes_open_connections_and_the_port():
    exp = start_exporter(nvml=False)
    s = socket.create_connection(("127.0.0.1", exp.port), timeout=5)
    s.sendall(b"GET /metrics HTTP/1.1\r\n")  # half a request
    time.sleep(0.1)
    exp.stop()
    assert s.recv(1) == b""
    s.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", exp.port), timeout=1).close()


def test_an_absolute_form_target_is_served(exp):
    req = b"GET http://127.0.0.1/metrics?a=1 HTTP/1.1\r\nConnection: close\r\n\r\n"
    (c, _, body), = _responses(_raw(exp.port, req))
    assert c == 200 and b"vramkit_" in body


def test_a_slow_but_steady_reader_is_not_closed_as_idle(exp):
    # Idle means no traffic either way: a client still reading a long pipelined answer (more than
    # the kernel's buffers hold, read a little at a time for several idle timeouts) keeps its
    # connection and gets every answer.
    exp._server.idle_timeout = 0.5
    n = 3000
    s = _small_window(exp.port, 10)
    s.sendall(b"GET /metrics HTTP/1.1\r\n\r\n" * (n - 1) + b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n")
    t0 = time.monotonic()
    data = _read_all(s, 4096, pause=0.002)
    s.close()
    assert time.monotonic() - t0 > 2 * exp._server.idle_timeout  # the test read slowly enough to mean it
    assert len(_responses(data)) == n


def test_stop_while_a_scrape_renders_leaves_the_loop_its_sockets(capsys):
    # A render that outlasts shutdown()'s wait (NVML hanging on a lost GPU): stop() must not close the
    # selector and the sockets under the loop; the loop answers, then closes them itself.
    exp = start_exporter(nvml=False)
    release = threading.Event()
    render = exp.collector.render
    exp.collector.render = lambda: (release.wait(5), render())[1]
    stopped = exp._server._stopped
    stopped.wait = lambda timeout=None: threading.Event.wait(stopped, 0.2)  # shutdown() gives up early
    s = socket.create_connection(("127.0.0.1", exp.port), timeout=5)
    s.sendall(b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n")
    time.sleep(0.2)
    threading.Timer(1.0, release.set).start()
    exp.stop()
    data = _read_all(s)
    s.close()
    assert [c for c, _, _ in _responses(data)] == [200]
    assert "request failed" not in capsys.readouterr().err
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", exp.port), timeout=1).close()


def test_bare_lf_line_ends_blank_lines_and_repeated_headers(exp):
    # A bare LF ends a line (RFC 9112 2.2); empty lines before a request are skipped; a repeated
    # Connection header combines; two different Content-Lengths are refused.
    got = _responses(_raw(exp.port, b"\r\n\r\nGET /metrics HTTP/1.1\nHost: x\n\nGET / HTTP/1.1\n"
                                    b"Connection: keep-alive\nConnection: close\n\n"))
    assert [c for c, _, _ in got] == [200, 200] and got[1][1]["connection"] == "close"
    got = _responses(_raw(exp.port, b"GET /metrics HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"))
    assert [c for c, _, _ in got] == [400]
    got = _responses(_raw(exp.port, b"GET /metrics HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n"
                                    b"Connection: close\r\n\r\nab"))
    assert [c for c, _, _ in got] == [200]


def test_connections_beyond_the_cap_wait_in_the_accept_queue(exp):
    exp._server.max_connections = 8
    idle = [socket.create_connection(("127.0.0.1", exp.port), timeout=5) for _ in range(12)]
    time.sleep(0.3)
    assert len(exp._server._conns) == 8  # the other 4 are queued by the kernel, not accepted
    for s in idle[:6]:
        s.close()
    time.sleep(0.3)
    # The queued ones are taken as others close, and each is answered.
    for s in idle[6:]:
        s.sendall(b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n")
    for s in idle[6:]:
        data = _read_all(s)
        s.close()
        assert [c for c, _, _ in _responses(data)] == [200]
