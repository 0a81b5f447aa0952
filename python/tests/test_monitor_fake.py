"""The simulated driver of the monitoring tools (vramkit.monitor.fake): what it reads, what it
refuses, and how it follows its file. It is Python, outside the C++ library."""
from __future__ import annotations

import json
import os
import threading

import pytest

from vramkit.monitor import open_monitor
from vramkit.monitor.fake import FakeMonitor, parse


def test_devices_and_processes():
    driver, devs = parse(json.dumps({"driver_version": "550.1", "devices": [
        {"name": "NVIDIA H200", "uuid": "GPU-a", "total_bytes": 1000, "used_bytes": 300, "reserved_bytes": 100,
         "utilization_gpu": 5, "temperature_c": 40, "power_w": 99.5,
         "processes": [{"pid": 7, "used_bytes": 100}, {"pid": 8, "used_bytes": 200, "name": "tr\u00e4in"}]},
        {"total_bytes": 2000}]}))
    assert driver == "550.1"
    d0, p0 = devs[0]
    assert d0["free_bytes"] == 600 and d0["reserved_bytes"] == 100 and d0["utilization_memory"] is None
    assert [p["name"] for p in p0] == ["", "tr\u00e4in"]
    d1, p1 = devs[1]
    assert d1["name"] == "Fake GPU 1" and d1["free_bytes"] == 2000 and d1["pci_bus_id"] == "00000000:02:00.0"
    assert d1["reserved_bytes"] is None and p1 == []


@pytest.mark.parametrize("doc", [
    "", "[]", '{"devices": 3}', '{"devices": [{}]}', '{"devices": [{"total_bytes": -1}]}',
    '{"devices": [{"total_bytes": 10, "used_bytes": 11}]}',
    '{"devices": [{"total_bytes": 10, "processes": [{"pid": 0}]}]}',
    '{"devices": [{"total_bytes": 1e3}]}', '{"devices": [] ', '{"devices": ["x"]}',
    '{"devices": []} trailing', "[" * 100000, '{"devices": [{"total_bytes": NaN}]}',
    '{"devices": [{"total_bytes": true}]}', '{"devices": [{"total_bytes": 10, "power_w": -1}]}',
])
def test_bad_documents_are_value_errors(doc):
    with pytest.raises(ValueError):
        parse(doc)


def test_decimal_points_whatever_the_locale(tmp_path, monkeypatch):
    # The C++ fake read numbers with strtod, which follows LC_NUMERIC; json does not.
    import locale
    before = locale.setlocale(locale.LC_ALL)  # restored after: text I/O of later tests decodes by it
    try:
        locale.setlocale(locale.LC_ALL, "de_DE.UTF-8")
    except locale.Error:
        pytest.skip("locale de_DE.UTF-8 is not installed (scripts/setup.sh generates it)")
    try:
        p = tmp_path / "f.json"
        p.write_text('{"devices": [{"total_bytes": 10, "power_w": 120.5}]}')
        assert open_monitor(p).device(0)["power_w"] == 120.5
    finally:
        locale.setlocale(locale.LC_ALL, before)


def test_environment_and_reload(tmp_path, monkeypatch):
    path = tmp_path / "env.json"

    def write(used):
        tmp = tmp_path / "env.json.tmp"
        tmp.write_text(json.dumps({"devices": [{"name": "From Env", "total_bytes": 10**6, "used_bytes": used,
                                                "processes": [{"pid": 5, "used_bytes": used}]}]}))
        os.replace(tmp, path)

    write(1)
    monkeypatch.setenv("VRAMKIT_FAKE_NVML", str(path))
    m = open_monitor()
    assert m.backend_name() == "fake" and m.device(0)["name"] == "From Env"
    st = path.stat()
    write(123456)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a coarse clock must not hide the change
    assert m.device(0)["used_bytes"] == 123456
    path.unlink()
    assert m.device(0)["used_bytes"] == 123456  # a vanished file keeps the last state
    with pytest.raises(ValueError, match="cannot read fake NVML file"):
        FakeMonitor(path)
    with pytest.raises(ValueError, match="unknown device 1"):
        m.processes(1)


def test_concurrent_readers_while_the_file_changes(tmp_path):
    path = tmp_path / "threads.json"

    def write(i):
        tmp = tmp_path / "threads.json.tmp"
        tmp.write_text(json.dumps({"devices": [{"total_bytes": 10**6, "used_bytes": i,
                                                "processes": [{"pid": 5, "used_bytes": i}]}]}))
        os.replace(tmp, path)

    write(0)
    m = open_monitor(path)
    stop = threading.Event()
    errors = []

    def reader():
        while not stop.is_set():
            d = m.devices()[0]
            p = m.processes(0)[0]
            if not (0 <= d["used_bytes"] <= 200 and 0 <= p["used_bytes"] <= 200):
                errors.append((d, p))

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    for i in range(1, 201):
        write(i)
    stop.set()
    for t in threads:
        t.join()
    assert not errors
    assert m.device(0)["used_bytes"] in range(0, 201)
