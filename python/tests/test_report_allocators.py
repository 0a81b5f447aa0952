"""The report's PyTorch-vs-vramkit section and long synthetic traces through the CLI."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import conftest_trace as ct  # noqa: E402
from vramkit.trace import load_trace  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def _long_trace_module():
    spec = importlib.util.spec_from_file_location("vk_long_trace", REPO / "benchmarks" / "long_trace.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "vramkit", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def long_traces(tmp_path_factory):
    mk = _long_trace_module().make_trace
    d = tmp_path_factory.mktemp("long")
    out = {}
    for n in (60_000, 240_000):
        p = d / f"syn{n}.vktrace"
        assert mk(str(p), n) >= n
        out[n] = p
    return out


def test_synthetic_trace_is_valid_and_reads_back(long_traces):
    tr = load_trace(long_traces[60_000])
    tr.validate()
    assert len(tr) >= 60_000 and tr.left_live == 0 and tr.skipped_frees == 0
    assert set(np.unique(tr.ops[:, 3]).tolist()) == {0, 1}  # a side stream is used


def test_advise_json_on_v1(long_traces):
    p = _cli("advise", str(long_traces[60_000]), "--capacity", "8GiB", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    names = [r["allocator"] for r in d["rows"]]
    assert names[:2] == ["torch-default", "torch-expandable"] and "vramkit" in names
    for r in d["rows"]:
        assert r["peak_reserved_bytes"] >= r["peak_live_bytes"] and r["fits"]
        assert r["allocated_at_peak"] >= r["requested_at_peak"]
    assert "recommendation" in d and d["recommendation"]


def test_replay_compares_torch_by_default():
    p = _cli("replay", "--passes", "1", "--json")
    assert p.returncode == 0, p.stderr
    names = [r["allocator"] for r in json.loads(p.stdout)]
    assert "torch-default" in names and "torch-expandable" in names and "vramkit" in names


def test_report_section_is_small_and_opens(long_traces, tmp_path):
    sizes = {}
    for n, path in long_traces.items():
        html = tmp_path / f"r{n}.html"
        p = _cli("report", str(path), "-o", str(html), "--passes", "1", "--no-progress",
                 "--allocator", "vramkit", "--allocator", "torch-default", "--allocator", "torch-expandable")
        assert p.returncode == 0, p.stderr
        text = html.read_text(encoding="utf-8")
        assert "Would it fit? PyTorch" in text and "Recommendation:" in text
        assert "What each allocator" in text and "live blocks" in text
        sizes[n] = html.stat().st_size
    # the page does not grow with the trace: its series are downsampled (peaks kept)
    assert sizes[240_000] < 1.3 * sizes[60_000] and sizes[240_000] < 10_000_000
    bc = ct.load_browser_check()
    if bc.find_chromium() is None:
        pytest.skip("headless Chromium is not installed (Debian: apt-get install chromium)")
    res = bc.check_page(str(tmp_path / "r240000.html"))
    assert res["errors"] == [] and res["resources"] == []
    assert "Would it fit? PyTorch's allocator and vramkit" in [h["text"] for h in res["headings"]]


def test_report_rejects_bad_torch_option(tmp_path):
    p = _cli("report", "-o", str(tmp_path / "x.html"), "--allocator", "torch:max_split_size_mb=5")
    assert p.returncode == 1 and "more than 20" in p.stderr and p.stderr.count("\n") == 1
    assert not (tmp_path / "x.html").exists()


def test_report_passes_are_bounded_like_replay(tmp_path):
    for n in ("0", "1001"):
        p = _cli("report", "-o", str(tmp_path / "x.html"), "--passes", n)
        assert p.returncode == 1 and f"--passes must be between 1 and 1000, not {n}" in p.stderr, p.stderr
        assert p.stderr.count("\n") == 1 and not (tmp_path / "x.html").exists()


def test_report_refuses_to_write_over_its_input(tmp_path):
    """-o naming the trace being read (or through a symlink to it) is refused before anything is
    written: the trace stays as it was."""
    trace = tmp_path / "t.csv"
    text = "action,addr,size\nalloc,1,10\nalloc,2,20\nfree_requested,1,10\n"
    trace.write_text(text)
    (tmp_path / "link.html").symlink_to(trace)
    for out in (trace, tmp_path / "link.html"):
        p = _cli("report", str(trace), "-o", str(out), "--no-progress")
        assert p.returncode == 1 and "is the trace being read" in p.stderr and p.stderr.count("\n") == 1, p.stderr
    assert trace.read_text() == text


CSV_CASES = {
    # free of an unknown address (skipped), address reuse, an alloc of a live address (implicit
    # free), two streams, other events, a free_completed after its free_requested
    "mixed": ("t_us,action,addr,size,stream\n1,free_requested,4096,100,0\n2,segment_alloc,4096,2097152,0\n"
              "3,alloc,4096,100,0\n4,alloc,8192,300,7\n5,free_requested,4096,100,0\n6,free_completed,4096,100,0\n"
              "7,alloc,4096,50,7\n8,alloc,4096,60,0\n9,free_requested,8192,300,7\n10,oom,0,0,0\n"),
    "no_time_no_stream": "action,addr,size\nalloc,1,10\nalloc,2,20\nfree_requested,1,10\n",
}


@pytest.mark.parametrize("case", sorted(CSV_CASES))
@pytest.mark.parametrize("gz", [False, True])
def test_columnar_csv_reader_matches_row_reader(tmp_path, monkeypatch, case, gz):
    import gzip
    from vramkit.trace import fast_csv
    from vramkit.trace.importers import read_pytorch_trace_csv
    p = tmp_path / ("t.csv.gz" if gz else "t.csv")
    data = CSV_CASES[case].encode()
    p.write_bytes(gzip.compress(data) if gz else data)
    monkeypatch.setattr(fast_csv, "FAST_MIN_BYTES", 1 << 60)
    slow = read_pytorch_trace_csv(p)
    monkeypatch.setattr(fast_csv, "FAST_MIN_BYTES", 0)
    from vramkit.trace.importers import _display
    fast = fast_csv.read_fast(p, slow.name, _display(p))
    assert fast is not None
    assert np.array_equal(fast.ops, slow.ops) and fast.streams == slow.streams
    assert (fast.t_us is None) == (slow.t_us is None)
    if fast.t_us is not None:
        assert np.array_equal(fast.t_us, slow.t_us)
    assert (fast.skipped_frees, fast.left_live, fast.metadata) == (slow.skipped_frees, slow.left_live,
                                                                   slow.metadata)


@pytest.mark.parametrize("text", [
    "t_us,action,addr,size,stream\n1,alloc,0x10,5,0\n",          # hex address
    't_us,action,addr,size,stream\n1,"alloc",16,5,0\n',          # quoted field
    "t_us,action,addr,size,stream\n1,alloc,16,5\n",              # short row
    "t_us,action,addr,size,stream\n1,grow,16,5,0\n",             # unknown action
])
def test_columnar_csv_reader_declines_what_it_does_not_handle(tmp_path, monkeypatch, text):
    from vramkit.trace import fast_csv
    from vramkit.trace.importers import read_pytorch_trace_csv
    p = tmp_path / "t.csv"
    p.write_text(text)
    assert fast_csv.read_fast(p, "t", str(p)) is None
    monkeypatch.setattr(fast_csv, "FAST_MIN_BYTES", 1 << 60)
    try:
        expected = read_pytorch_trace_csv(p)
    except ValueError as e:
        expected = str(e)
    monkeypatch.setattr(fast_csv, "FAST_MIN_BYTES", 0)
    try:
        got = read_pytorch_trace_csv(p)
    except ValueError as e:
        got = str(e)
    if isinstance(expected, str):
        assert got == expected  # the row-by-row reader words the error, whichever path
    else:
        assert np.array_equal(got.ops, expected.ops)


@pytest.mark.parametrize("seed", range(5))
def test_columnar_csv_reader_matches_on_random_events(tmp_path, monkeypatch, seed):
    """Few addresses, random actions: skipped frees, reuse and implicit frees in every mix."""
    from vramkit.trace import fast_csv
    from vramkit.trace.importers import _display, read_pytorch_trace_csv
    rng = np.random.default_rng(seed)
    acts = np.array(["alloc", "free_requested", "free_completed", "segment_alloc"])
    lines = ["t_us,action,addr,size,stream"]
    for t in range(3000):
        lines.append(f"{t},{acts[rng.choice(4, p=[.45, .4, .1, .05])]},{int(rng.integers(0, 40)) * 512},"
                     f"{int(rng.integers(1, 1 << 20))},{int(rng.choice([0, 93, 17]))}")
    p = tmp_path / "r.csv"
    p.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(fast_csv, "FAST_MIN_BYTES", 1 << 60)
    slow = read_pytorch_trace_csv(p)
    fast = fast_csv.read_fast(p, slow.name, _display(p))
    assert slow.metadata.get("implicit_frees", 0) > 10 and slow.skipped_frees > 10
    assert np.array_equal(fast.ops, slow.ops) and np.array_equal(fast.t_us, slow.t_us)
    assert (fast.streams, fast.skipped_frees, fast.left_live, fast.metadata) == \
        (slow.streams, slow.skipped_frees, slow.left_live, slow.metadata)


def test_section_replaces_sampled_series_with_exact_peaks():
    from vramkit.advise import profile
    from vramkit.report.allocators import allocator_section
    from vramkit.trace import default_trace_path
    tr = load_trace(default_trace_path())
    timelines = {"torch-default": [(0, 0, 1)], "host": [(0, 0, 7)]}
    title, html = allocator_section(tr, tr.ops, ["torch-default", "torch-expandable"], None, None, timelines)
    peak = profile(np.ascontiguousarray(tr.ops), "torch-default", None)["peak_reserved_bytes"]
    assert max(p[2] for p in timelines["torch-default"]) == peak
    assert timelines["host"] == [(0, 0, 7)] and "torch-expandable" not in timelines
    assert "Would it fit" in title and "torch-expandable" in html
