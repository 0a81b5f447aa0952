"""vramkit smi / top / exporter / Sampler against the simulated driver (VRAMKIT_FAKE_NVML), a real
Prometheus server and, on the GPU machine (``-m gpu``), against nvidia-smi.

Run:  python3 -m pytest python/tests/test_monitor.py -q
"""
from __future__ import annotations

import csv
import ctypes
import http.client
import json
import os
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

import vramkit
from vramkit.monitor import NvmlUnavailableError, Snapshotter, open_monitor, process_name
from vramkit.monitor.exporter import start_exporter
from vramkit.monitor.sampler import Sampler, load_recording, recording_section_html
from vramkit.monitor.smi import smi_main

GiB = 1 << 30
MiB = 1 << 20
OTHER_PID = 4194000  # above any real PID here: its name comes from the fake file


def _driver_present() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
        return True
    except OSError:
        return False


HAVE_DRIVER = _driver_present()


def fake_doc(used0: int = 10 * GiB) -> dict:
    return {"driver_version": "550.54.15", "devices": [
        {"name": "NVIDIA H200", "uuid": "GPU-11111111-2222-3333-4444-555555555555",
         "pci_bus_id": "00000000:19:00.0", "total_bytes": 150754820096, "used_bytes": used0,
         "reserved_bytes": 597688320, "utilization_gpu": 35, "utilization_memory": 12, "temperature_c": 41,
         "power_w": 120.5,
         "processes": [{"pid": os.getpid(), "used_bytes": 8 * GiB},
                       {"pid": OTHER_PID, "used_bytes": 2 * GiB, "name": "trainer \"x\""}]},
        {"name": "Tesla T4", "uuid": "GPU-66666666-7777-8888-9999-000000000000", "pci_bus_id": "00000000:2A:00.0",
         "total_bytes": 16 * GiB, "used_bytes": 0, "processes": []},
    ]}


def write_fake(path, doc) -> str:
    tmp = str(path) + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)  # atomic: a monitor re-reading it never sees half a file
    return str(path)


@pytest.fixture
def fake(tmp_path, monkeypatch):
    path = write_fake(tmp_path / "fake_nvml.json", fake_doc())
    monkeypatch.setenv("VRAMKIT_FAKE_NVML", path)
    return path


def env_without_fake() -> dict:
    env = dict(os.environ)
    env.pop("VRAMKIT_FAKE_NVML", None)
    return env


def cli(*args: str, env=None, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vramkit", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


# ---- the native monitor ------------------------------------------------------------------------

def test_fake_monitor_devices_and_processes(fake):
    m = open_monitor()
    assert m.backend_name() == "fake"
    assert m.driver_version() == "550.54.15"
    devs = m.devices()
    assert [d["name"] for d in devs] == ["NVIDIA H200", "Tesla T4"]
    d = devs[0]
    assert d["free_bytes"] == d["total_bytes"] - d["used_bytes"] - d["reserved_bytes"]
    assert devs[1]["reserved_bytes"] is None and devs[1]["temperature_c"] is None
    ps = m.processes(0)
    assert [p["pid"] for p in ps] == [os.getpid(), OTHER_PID]  # largest first
    assert m.processes(1) == []
    with pytest.raises(ValueError, match="unknown device 2"):
        m.processes(2)


def test_bad_fake_file_is_a_value_error(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('{"devices": [{"total_bytes": 10, "used_bytes": 20}]}')
    with pytest.raises(ValueError, match="exceeds total_bytes"):
        open_monitor(str(p))
    with pytest.raises(ValueError, match="cannot read"):
        open_monitor(str(tmp_path / "missing.json"))


@pytest.mark.skipif(HAVE_DRIVER, reason="an NVIDIA driver is installed here")
def test_no_driver_raises_nvml_unavailable(monkeypatch):
    monkeypatch.delenv("VRAMKIT_FAKE_NVML", raising=False)
    with pytest.raises(NvmlUnavailableError, match="libnvidia-ml.so.1 not found"):
        open_monitor()
    assert issubclass(NvmlUnavailableError, RuntimeError)


def test_fake_file_changes_are_seen(tmp_path):
    path = write_fake(tmp_path / "f.json", fake_doc(used0=1 * GiB))
    m = open_monitor(path)
    assert m.device(0)["used_bytes"] == 1 * GiB
    time.sleep(0.02)
    write_fake(path, fake_doc(used0=3 * GiB))
    assert m.device(0)["used_bytes"] == 3 * GiB


# ---- vramkit smi -------------------------------------------------------------------------------

def test_smi_table(fake, capsys):
    assert smi_main([]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA H200" in out and "Tesla T4" in out
    assert "140.40 GiB" in out and "10.00 GiB" in out and "570.00 MiB" in out  # total, used, reserved
    assert "35%" in out and "41C" in out and "120W" in out
    me = process_name(os.getpid())
    assert me
    assert re.search(rf"^\s*0\s+{os.getpid()}\s+{re.escape(me)}\s+8\.00 GiB$", out, re.M), out
    assert "trainer" in out


def test_smi_json(fake, capsys):
    assert smi_main(["--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["backend"] == "fake" and doc["driver_version"] == "550.54.15"
    d0, d1 = doc["devices"]
    assert d0["used_bytes"] == 10 * GiB and d0["reserved_bytes"] == 597688320 and d0["power_w"] == 120.5
    assert d0["processes"][0] == {"pid": os.getpid(), "used_bytes": 8 * GiB, "name": process_name(os.getpid())}
    assert d0["processes"][1]["name"] == 'trainer "x"'
    assert d1["processes"] == [] and d1["utilization_gpu"] is None
    assert smi_main(["--json", "--id", "1", "--no-processes"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [d["index"] for d in doc["devices"]] == [1] and doc["devices"][0]["processes"] == []


def test_smi_unknown_gpu_is_an_error(fake, capsys):
    assert smi_main(["--id", "0,7"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "vramkit smi: no GPU 7 (fake reports 2 GPU(s))"


def test_smi_json_watch_is_one_object_per_line(fake, capsys):
    assert smi_main(["--json", "--watch", "0.05", "--count", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    stamps = [json.loads(x)["timestamp"] for x in lines]
    assert stamps == sorted(stamps) and stamps[-1] - stamps[0] >= 0.08


def test_smi_csv_watch_to_file(fake, tmp_path, capsys):
    out = tmp_path / "rec.csv"
    assert smi_main(["--csv", "--watch", "0.05", "--count", "3", "--output", str(out)]) == 0
    assert capsys.readouterr().out == ""
    text = out.read_text()
    assert text.count("timestamp,kind,") == 1  # one header
    rows = list(csv.DictReader(text.splitlines()))
    assert len({r["timestamp"] for r in rows}) == 3
    assert len(rows) == 3 * (2 + 2)  # per sample: 2 devices + 2 processes
    dev = [r for r in rows if r["kind"] == "device" and r["gpu"] == "0"][0]
    assert int(dev["used_bytes"]) == 10 * GiB and dev["name"] == "NVIDIA H200"
    rec = load_recording(out)
    assert rec.samples == 3 and len(rec.devices) == 2 and len(rec.processes) == 2


def test_smi_output_that_fails_keeps_the_old_file(fake, tmp_path, capsys, monkeypatch):
    """--output is written whole or not at all: a write that fails (a full disk) leaves an existing
    file as it was, with one line on stderr and no temporary file behind."""
    out = tmp_path / "rec.csv"
    out.write_text("an older recording\n")
    import vramkit.monitor.smi as smi
    real = smi._to_csv
    calls = []

    def failing(rows, header):
        calls.append(header)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(rows, header=header)
    monkeypatch.setattr(smi, "_to_csv", failing)
    assert smi_main(["--csv", "--watch", "0.01", "--count", "5", "--output", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No space left on device" in err and "Traceback" not in err
    assert out.read_text() == "an older recording\n"
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    monkeypatch.setattr(smi, "_to_csv", real)
    assert smi_main(["--csv", "--count", "1", "--output", str(out)]) == 0  # and then it is replaced whole
    assert out.read_text().startswith("timestamp,kind,")


def test_smi_watch_ended_by_sigterm_publishes_the_recording(fake, tmp_path):
    """A --watch recording ended by SIGTERM (a job scheduler's stop) is published whole, like Ctrl-C;
    one killed hard leaves nothing at the destination."""
    import signal
    import subprocess
    import time
    out = tmp_path / "rec.csv"
    env = dict(os.environ, VRAMKIT_FAKE_NVML=os.environ["VRAMKIT_FAKE_NVML"])
    for sig, published in ((signal.SIGTERM, True), (signal.SIGKILL, False)):
        p = subprocess.Popen([sys.executable, "-m", "vramkit", "smi", "--csv", "--watch", "0.05", "-o", str(out)],
                             env=env, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 30
        while time.time() < deadline and not any(x.name.endswith(".tmp") for x in tmp_path.iterdir()):
            time.sleep(0.05)
        time.sleep(0.5)  # some samples
        p.send_signal(sig)
        p.wait(timeout=30)
        if published:
            assert p.returncode == 0, p.stderr.read()
            assert load_recording(out).samples >= 2
            assert not [x.name for x in tmp_path.iterdir() if x.name.endswith(".tmp")]
            out.unlink()
        else:
            assert not out.exists()  # killed hard: nothing half-written at the destination
        p.stderr.close()


def test_smi_without_driver_exits_2_with_one_line(tmp_path):
    if HAVE_DRIVER:
        pytest.skip("an NVIDIA driver is installed here")
    r = cli("smi", env=env_without_fake())
    assert r.returncode == 2, r
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("vramkit smi: no NVIDIA driver found")
    assert "VRAMKIT_FAKE_NVML" in lines[0]


def test_smi_bad_fake_exits_2_with_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    r = cli("smi", env={**os.environ, "VRAMKIT_FAKE_NVML": str(bad)})
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.splitlines()) == 1 and "invalid JSON" in r.stderr


def test_smi_cli_through_python_m(fake):
    r = cli("smi", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["devices"][0]["name"] == "NVIDIA H200"


def test_sampling_cost_against_the_fake(fake):
    snap = Snapshotter()
    snap.take()
    n = 200
    t0 = time.process_time()
    for _ in range(n):
        snap.take()
    per_sample = (time.process_time() - t0) / n
    # 1 % of a core at 1 Hz is 10 ms per sample; the fake costs far less.
    assert per_sample < 0.002, f"{per_sample * 1e3:.3f} ms CPU per sample"


# ---- exporter ----------------------------------------------------------------------------------

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(,|$)')


def parse_exposition(text: str) -> dict[str, dict]:
    """A strict reader of the text format: families with HELP and TYPE before their samples."""
    fams: dict[str, dict] = {}
    current = None
    assert text.endswith("\n")
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            assert name not in fams, f"family {name} twice"
            current = fams[name] = {"help": help_text, "type": None, "samples": []}
            continue
        if line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            assert current is fams.get(name) and kind in ("gauge", "counter"), line
            current["type"] = kind
            continue
        if line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        assert m, f"bad sample line: {line!r}"
        name, _, body, value = m.groups()
        assert current is fams.get(name) and current["type"], f"sample before its HELP/TYPE: {line}"
        labels = {}
        if body:
            pos = 0
            while pos < len(body):
                lm = _LABEL.match(body, pos)
                assert lm, f"bad labels: {body!r}"
                labels[lm.group(1)] = re.sub(r"\\(.)", lambda x: {"n": "\n"}.get(x.group(1), x.group(1)), lm.group(2))
                pos = lm.end()
        current["samples"].append((labels, float(value)))
    return fams


def scrape(url: str) -> tuple[int, dict, str]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, dict(r.headers), r.read().decode()


def test_exporter_text_format(fake):
    buf = vramkit.alloc(3 * MiB + 17)
    try:
        expected = vramkit.memory_allocated()
        with start_exporter() as exp:
            assert exp.url == f"http://127.0.0.1:{exp.port}/metrics"
            status, headers, text = scrape(exp.url)
    finally:
        buf.free()
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    fams = parse_exposition(text)
    used = fams["DCGM_FI_DEV_FB_USED"]
    assert used["type"] == "gauge" and "MiB" in used["help"]
    labels, value = used["samples"][0]
    assert labels == {"gpu": "0", "UUID": "GPU-11111111-2222-3333-4444-555555555555",
                      "pci_bus_id": "00000000:19:00.0", "device": "nvidia0", "modelName": "NVIDIA H200",
                      "Hostname": socket.gethostname(), "DCGM_FI_DRIVER_VERSION": "550.54.15"}
    assert value == 10 * 1024
    assert fams["DCGM_FI_DEV_FB_RESERVED"]["samples"][0][1] == 597688320 // MiB
    assert len(fams["DCGM_FI_DEV_FB_RESERVED"]["samples"]) == 1  # the T4 reports no reserve
    assert len(fams["DCGM_FI_DEV_FB_FREE"]["samples"]) == 2
    assert fams["DCGM_FI_DEV_GPU_TEMP"]["samples"][0][1] == 41
    assert fams["DCGM_FI_DEV_GPU_UTIL"]["samples"][0][1] == 35
    procs = {s[0]["pid"]: s for s in fams["vramkit_process_gpu_memory_bytes"]["samples"]}
    assert procs[str(OTHER_PID)][0]["process_name"] == 'trainer "x"'  # escaped and read back
    assert procs[str(os.getpid())][1] == 8 * GiB
    alloc = fams["vramkit_memory_allocated_bytes"]["samples"]
    assert alloc[0][0] == {"device": "0", "pid": str(os.getpid())} and alloc[0][1] == expected
    for name in ("vramkit_memory_reserved_bytes", "vramkit_memory_cached_bytes",
                 "vramkit_memory_fragmentation_ratio", "vramkit_largest_free_bytes"):
        assert fams[name]["type"] == "gauge" and fams[name]["samples"]
    assert fams["vramkit_oom_total"]["type"] == "counter"
    assert fams["vramkit_alloc_total"]["type"] == "counter" and fams["vramkit_alloc_total"]["samples"][0][1] >= 1
    try:  # the reference parser too, when installed
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        return
    names = {f.name for f in text_string_to_metric_families(text)}
    assert "DCGM_FI_DEV_FB_USED" in names and "vramkit_memory_allocated_bytes" in names


@pytest.mark.skipif(vramkit.backend() != "host", reason="swaps device 0's resource for a plain host one")
def test_allocator_stats_without_a_statistics_adaptor():
    from vramkit.monitor.sampler import allocator_stats
    old = vramkit.get_current_resource(0)
    vramkit.set_current_resource(vramkit.make_resource("host", 0), 0)
    buf = None
    try:
        buf = vramkit.alloc(3 * MiB)
        s = allocator_stats(0)
        assert s["allocated_bytes.all.current"] == 3 * MiB and s["reserved_bytes.all.current"] >= 3 * MiB
        assert s["cached_bytes"] >= 0 and s["fragmentation"] >= 1.0
        with start_exporter(nvml=False) as exp:
            fams = parse_exposition(scrape(exp.url)[2])
        assert fams["vramkit_memory_allocated_bytes"]["samples"][0][1] == 3 * MiB
        assert "vramkit_alloc_total" not in fams  # a plain resource does not count calls
    finally:
        if buf is not None:
            buf.free()
        vramkit.set_current_resource(old, 0)


def test_exporter_without_nvml_omits_device_metrics_with_a_comment():
    with start_exporter(nvml=False) as exp:
        _, _, text = scrape(exp.url)
    assert "# vramkit: device metrics omitted" in text
    fams = parse_exposition(text)
    assert not any(n.startswith("DCGM_") for n in fams)
    assert "vramkit_memory_allocated_bytes" in fams


def test_exporter_paths_and_stop(fake):
    exp = start_exporter()
    conn = http.client.HTTPConnection("127.0.0.1", exp.port, timeout=5)
    conn.request("GET", "/nope")
    r = conn.getresponse()
    assert r.status == 404 and r.read()
    conn.request("HEAD", "/metrics")
    r = conn.getresponse()
    assert r.status == 200 and int(r.getheader("Content-Length")) > 100 and r.read() == b""
    conn.close()
    exp.stop()
    exp.stop()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", exp.port), timeout=1).close()


def test_exporter_scrape_under_5_ms(fake):
    with start_exporter(interval=1.0) as exp:
        conn = http.client.HTTPConnection("127.0.0.1", exp.port, timeout=5)
        times = []
        for _ in range(60):
            t0 = time.perf_counter()
            conn.request("GET", "/metrics")
            body = conn.getresponse().read()
            times.append(time.perf_counter() - t0)
            assert body
        conn.close()
    median = statistics.median(times)
    assert median < 0.005, f"median scrape {median * 1e3:.2f} ms"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_exporter_command_serves_and_stops_on_a_signal(fake, sig):
    p = subprocess.Popen([sys.executable, "-m", "vramkit", "exporter", "--port", "0"], stderr=subprocess.PIPE,
                         stdout=subprocess.DEVNULL, text=True)
    try:
        line = p.stderr.readline()
        m = re.search(r"(http://127\.0\.0\.1:\d+/metrics)", line)
        assert m, line
        _, _, text = scrape(m.group(1))
        fams = parse_exposition(text)
        assert fams["DCGM_FI_DEV_FB_USED"]["samples"][0][1] == 10 * 1024
        assert not any(n.startswith("vramkit_memory_") for n in fams)  # no allocator in a standalone exporter
        p.send_signal(sig)
        assert p.wait(timeout=10) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def _blocked_signals(native_id: int) -> set[int]:
    """The signals a thread of this process blocks, from /proc (Linux)."""
    with open(f"/proc/self/task/{native_id}/status") as f:
        mask = int(next(line for line in f if line.startswith("SigBlk:")).split()[1], 16)
    return {n for n in range(1, 65) if mask >> (n - 1) & 1}


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="reads thread signal masks from /proc")
def test_helper_threads_leave_signals_to_the_main_thread(fake, tmp_path):
    """The exporter's and the sampler's threads block SIGINT and SIGTERM (a signal the kernel gave
    them would not wake the main thread: `vramkit exporter` once served on after a SIGTERM), keep
    faults unblocked, and leave the caller's own mask as it was."""
    import threading
    before = _blocked_signals(threading.get_native_id())
    with start_exporter() as exp:
        blocked = _blocked_signals(exp._thread.native_id)
        assert {signal.SIGINT, signal.SIGTERM, signal.SIGHUP} <= blocked
        assert signal.SIGSEGV not in blocked and signal.SIGBUS not in blocked
    with Sampler(0.05, tmp_path / "rec.csv") as s:
        assert {signal.SIGINT, signal.SIGTERM} <= _blocked_signals(s._thread.native_id)
    assert _blocked_signals(threading.get_native_id()) == before
    assert signal.SIGTERM not in before


# ---- Sampler and recordings --------------------------------------------------------------------

def test_sampler_records_devices_processes_and_allocator(tmp_path):
    fake_path = write_fake(tmp_path / "fake.json", fake_doc(used0=1 * GiB))
    out = tmp_path / "rec.csv"
    before = vramkit.memory_allocated()
    s = Sampler(0.05, out, fake_json=fake_path)
    with s:
        time.sleep(0.2)
        write_fake(fake_path, fake_doc(used0=5 * GiB))
        buf = vramkit.alloc(6 * MiB)
        time.sleep(0.25)
    buf.free()
    assert s.samples >= 4
    rec = load_recording(out)
    dev0 = rec.devices[0]
    assert dev0.name == "NVIDIA H200" and dev0.total_bytes == 150754820096
    assert dev0.used_bytes[0] == 1 * GiB and dev0.used_bytes[-1] == 5 * GiB
    assert dev0.t == sorted(dev0.t) and dev0.t[0] == 0.0
    assert {(p.gpu, p.pid) for p in rec.processes} == {(0, os.getpid()), (0, OTHER_PID)}
    (a,) = rec.allocator
    assert a.pid == os.getpid() and a.allocated_bytes[0] == before
    assert a.allocated_bytes[-1] == before + 6 * MiB
    page = recording_section_html(out)
    assert page.count("<svg") == 3  # two GPUs and the allocator
    assert "<polyline" in page and "NVIDIA H200" in page and "trainer &quot;x&quot;" in page
    assert "<script" not in page and "src=" not in page and "href=" not in page


def test_sampler_without_driver_records_the_allocator(tmp_path, monkeypatch):
    if HAVE_DRIVER:
        pytest.skip("an NVIDIA driver is installed here")
    monkeypatch.delenv("VRAMKIT_FAKE_NVML", raising=False)
    out = tmp_path / "rec.csv"
    with Sampler(0.05, out) as s:
        time.sleep(0.1)
    assert s.nvml_error and "libnvidia-ml.so.1" in s.nvml_error
    rec = load_recording(out)
    assert rec.devices == [] and rec.allocator and rec.samples >= 2
    with pytest.raises(NvmlUnavailableError):
        Sampler(1.0, out, allocator=False)


def test_load_recording_rejects_bad_files(tmp_path):
    p = tmp_path / "x.csv"
    p.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not a vramkit recording"):
        load_recording(p)
    p.write_text("timestamp,kind,gpu,used_bytes\n1.0,device,0,5\nzzz,device,0,5\n")
    with pytest.raises(ValueError, match="line 3"):
        load_recording(p)
    p.write_text("timestamp,kind,gpu,used_bytes\n1.0,device,0,-5\n")
    with pytest.raises(ValueError, match="out of range"):
        load_recording(p)
    p.write_text("timestamp,kind,gpu,used_bytes\n")
    assert "no samples" in recording_section_html(p)
    with pytest.raises(ValueError):
        Sampler(0, tmp_path / "y.csv")


# ---- vramkit top under tmux --------------------------------------------------------------------

def test_top_under_tmux(fake, tmp_path):
    if not shutil.which("tmux"):
        pytest.skip("tmux is not installed (apt-get install -y tmux)")
    sock = f"vramkit-test-{os.getpid()}"
    status = tmp_path / "status"
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in (
        ("VRAMKIT_FAKE_NVML", fake), ("PYTHONPATH", os.environ.get("PYTHONPATH", "")),
        ("LANG", "C.UTF-8"), ("LC_ALL", "C.UTF-8"), ("TERM", "tmux-256color")))
    cmd = (f"env {env} {shlex.quote(sys.executable)} -m vramkit top --interval 0.2; "
           f"echo $? > {shlex.quote(str(status))}")
    tmux = ["tmux", "-L", sock, "-f", "/dev/null"]
    try:
        subprocess.run(tmux + ["new-session", "-d", "-s", "top", "-x", "120", "-y", "40", "sh", "-c", cmd],
                       check=True, timeout=20)
        deadline = time.monotonic() + 30
        screen = ""
        while time.monotonic() < deadline:
            r = subprocess.run(tmux + ["capture-pane", "-p", "-t", "top"], capture_output=True, text=True, timeout=10)
            screen = r.stdout
            if "Tesla T4" in screen and str(OTHER_PID) in screen and str(os.getpid()) in screen:
                break
            time.sleep(0.2)
        assert "vramkit top" in screen and "NVIDIA H200" in screen and "Tesla T4" in screen, screen
        assert re.search(rf"^\s*0\s+{os.getpid()}\s+8\.00 GiB\s+\S", screen, re.M), screen
        assert "hist" in screen
        subprocess.run(tmux + ["send-keys", "-t", "top", "q"], check=True, timeout=10)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not (status.exists() and status.read_text().strip()):
            time.sleep(0.1)
        assert status.exists(), "vramkit top did not exit after q"
        assert status.read_text().strip() == "0"
    finally:
        subprocess.run(tmux + ["kill-server"], capture_output=True, timeout=10)


def test_top_needs_a_terminal(fake):
    r = subprocess.run([sys.executable, "-m", "vramkit", "top"], capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=60)
    assert r.returncode == 2 and "needs a terminal" in r.stderr


# ---- a real Prometheus -------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_real_prometheus_scrapes_the_in_process_exporter(tmp_path):
    prom = shutil.which("prometheus")
    if not prom:
        pytest.skip("the prometheus binary is not installed (apt-get install -y prometheus)")
    n = 7 * MiB + 12345
    buf = vramkit.alloc(n)
    expected = vramkit.memory_allocated()
    exp = start_exporter(nvml=False)
    port = _free_port()
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                   "scrape_configs:\n  - job_name: vramkit\n    scrape_interval: 1s\n    scrape_timeout: 1s\n"
                   f"    static_configs:\n      - targets: ['127.0.0.1:{exp.port}']\n")
    log = open(tmp_path / "prometheus.log", "w")
    p = subprocess.Popen([prom, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'data'}",
                          f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                         stdout=log, stderr=subprocess.STDOUT)
    query = urllib.parse.quote(f'vramkit_memory_allocated_bytes{{pid="{os.getpid()}"}}')
    url = f"http://127.0.0.1:{port}/api/v1/query?query={query}"
    got = None
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert p.poll() is None, (tmp_path / "prometheus.log").read_text()
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    doc = json.loads(r.read())
                result = doc["data"]["result"]
                if result:
                    got = result[0]
                    if float(got["value"][1]) == expected:
                        break
            except (OSError, ValueError, KeyError):
                pass  # not up yet
            time.sleep(0.5)
    finally:
        p.terminate()
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        log.close()
        exp.stop()
        buf.free()
    assert got is not None, "Prometheus returned no vramkit_memory_allocated_bytes within 60 s:\n" + \
        (tmp_path / "prometheus.log").read_text()[-2000:]
    assert float(got["value"][1]) == expected
    assert got["metric"]["device"] == str(vramkit._vramkit.to_device(None)) and got["metric"]["job"] == "vramkit"


# ---- on the GPU machine ------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_DRIVER or not shutil.which("nvidia-smi"), reason="needs an NVIDIA driver and nvidia-smi")
def test_smi_json_matches_nvidia_smi():
    r = cli("smi", "--json", env=env_without_fake())
    assert r.returncode == 0, r.stderr
    ours = json.loads(r.stdout)
    assert ours["backend"] == "nvml" and ours["driver_version"]
    q = subprocess.run(["nvidia-smi", "--query-gpu=index,name,memory.total,memory.used,memory.free",
                        "--format=csv,noheader,nounits"], capture_output=True, text=True, check=True, timeout=60)
    theirs = [[c.strip() for c in line.split(",")] for line in q.stdout.strip().splitlines()]
    assert len(theirs) == len(ours["devices"])
    for (idx, name, total, used, free), d in zip(theirs, ours["devices"]):
        assert int(idx) == d["index"] and name == d["name"]
        assert abs(int(total) - d["total_bytes"] / MiB) <= 1
        reserved = (d["reserved_bytes"] or 0) / MiB
        assert abs(int(used) - d["used_bytes"] / MiB) <= 8, (
            f"GPU {idx}: nvidia-smi used {used} MiB, vramkit {d['used_bytes'] / MiB:.0f} MiB "
            f"(+ reserved {reserved:.0f} MiB = {d['used_bytes'] / MiB + reserved:.0f})")
        assert abs(int(free) - d["free_bytes"] / MiB) <= 8
        assert d["uuid"].startswith("GPU-") and re.match(r"^[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.\d$", d["pci_bus_id"])


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_DRIVER or vramkit.backend() != "cuda", reason="needs a CUDA GPU")
def test_own_allocation_shows_in_the_process_list(monkeypatch):
    monkeypatch.delenv("VRAMKIT_FAKE_NVML", raising=False)
    buf = vramkit.alloc(512 * MiB)
    try:
        snap = Snapshotter().take()
        mine = [p for d in snap["devices"] for p in d["processes"] if p["pid"] == os.getpid()]
        if not mine:
            pytest.skip("this process is not in NVML's list: NVML reports host PIDs (a PID namespace?)")
        assert max(p["used_bytes"] or 0 for p in mine) >= 512 * MiB
    finally:
        buf.free()


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_DRIVER, reason="needs an NVIDIA driver")
def test_exporter_with_real_nvml(monkeypatch):
    monkeypatch.delenv("VRAMKIT_FAKE_NVML", raising=False)
    with start_exporter() as exp:
        conn = http.client.HTTPConnection("127.0.0.1", exp.port, timeout=10)
        times = []
        for _ in range(30):
            t0 = time.perf_counter()
            conn.request("GET", "/metrics")
            text = conn.getresponse().read().decode()
            times.append(time.perf_counter() - t0)
        conn.close()
    fams = parse_exposition(text)
    n = open_monitor().device_count()
    assert len(fams["DCGM_FI_DEV_FB_USED"]["samples"]) == n
    assert len(fams["DCGM_FI_DEV_GPU_TEMP"]["samples"]) == n
    print(f"scrape with real NVML: median {statistics.median(times) * 1e3:.2f} ms, max {max(times) * 1e3:.2f} ms")
    assert statistics.median(times) < 0.005


def test_exporter_one_series_per_gpu_and_process(tmp_path, monkeypatch):
    """Two GPUs, one process on both and one on each: a DCGM series per GPU and a process series
    per (GPU, process), each labelled with its GPU."""
    doc = fake_doc()
    doc["devices"][0]["processes"] = [{"pid": 501, "used_bytes": 3 * GiB, "name": "rank0"},
                                      {"pid": 777, "used_bytes": 1 * GiB, "name": "both"}]
    doc["devices"][1]["used_bytes"] = 5 * GiB
    doc["devices"][1]["processes"] = [{"pid": 502, "used_bytes": 4 * GiB, "name": "rank1"},
                                      {"pid": 777, "used_bytes": 1 * GiB, "name": "both"}]
    monkeypatch.setenv("VRAMKIT_FAKE_NVML", write_fake(tmp_path / "two.json", doc))
    with start_exporter() as exp:
        _, _, text = scrape(exp.url)
    fams = parse_exposition(text)
    used = {s[0]["gpu"]: s[1] for s in fams["DCGM_FI_DEV_FB_USED"]["samples"]}
    assert used == {"0": 10 * 1024, "1": 5 * 1024}
    procs = {(s[0]["gpu"], s[0]["pid"]): s[1] for s in fams["vramkit_process_gpu_memory_bytes"]["samples"]}
    assert procs == {("0", "501"): 3 * GiB, ("0", "777"): GiB, ("1", "502"): 4 * GiB, ("1", "777"): GiB}
    uuids = {s[0]["gpu"]: s[0]["UUID"] for s in fams["vramkit_process_gpu_memory_bytes"]["samples"]}
    assert uuids["1"] == "GPU-66666666-7777-8888-9999-000000000000"


def test_peer_devices_on_the_simulated_device_is_empty():
    if vramkit.backend() != "host":
        pytest.skip("the GPU case is in test_gpu_multi.py")
    assert vramkit.peer_devices() == [] and vramkit.peer_devices(0) == []
