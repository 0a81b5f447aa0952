"""The HTML report: content, self-containment, atomic writing, and a real headless-Chromium load."""
from __future__ import annotations

import os
import re
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import conftest_trace as ct  # noqa: E402

ct.import_vramkit_pure()

from vramkit.report import SECTION_TITLES, analyze_peak_state, build_report_html, render_report  # noqa: E402
from vramkit.trace import Trace, default_trace_path, load_trace  # noqa: E402

MiB = 1 << 20
ARTIFACTS = ct.REPO_DIR / "build" / "test-artifacts"


@pytest.fixture(scope="module")
def trace():
    return load_trace(default_trace_path())


@pytest.fixture(scope="module")
def report_inputs(trace):
    """Results computed from the trace itself with two simple, honest allocator models."""
    r1, tl1, state = ct.packed_pages_model(trace)
    r2, tl2 = ct.segment_per_alloc_model(trace)
    return [r1, r2], {r1["allocator"]: tl1, r2["allocator"]: tl2}, state


def test_models_are_consistent(trace, report_inputs):
    results, timelines, state = report_inputs
    peak = trace.peak_live_bytes()
    for r in results:
        assert r["peak_live_bytes"] == peak == 755556864
        assert r["peak_reserved_bytes"] >= peak
        tl = np.asarray(timelines[r["allocator"]])
        assert (tl[:, 2] >= tl[:, 1]).all() and tl[:, 2].max() == r["peak_reserved_bytes"]
    a = analyze_peak_state(state)
    assert a["requested_bytes"] == peak and a["consistent"]
    assert a["mapped_bytes"] == a["requested_bytes"] + a["rounding_bytes"] + a["partial_page_free_bytes"] \
        + a["cached_free_bytes"]


def test_analyze_peak_state_by_hand():
    state = {"page_size": 2 * MiB, "segments": [
        {"base": 0, "size": 8 * MiB, "mapped_bytes": 6 * MiB, "small": False, "blocks": [
            {"addr": 0, "size": MiB, "requested": MiB - 100, "allocated": True},
            {"addr": MiB, "size": MiB, "requested": 0, "allocated": False},
            {"addr": 2 * MiB, "size": 3 * MiB, "requested": 3 * MiB, "allocated": True},
            {"addr": 5 * MiB, "size": 3 * MiB, "requested": 0, "allocated": False},
        ]},
        {"base": 64 * MiB, "size": 2 * MiB, "mapped_bytes": 2 * MiB, "small": True, "blocks": [
            {"addr": 64 * MiB + 512, "size": 512, "requested": 500, "allocated": True},  # gap before: free
        ]},
    ]}
    a = analyze_peak_state(state)
    assert a["segments"] == 2 and a["small_segments"] == 1
    assert a["allocated_bytes"] == 4 * MiB + 512
    assert a["requested_bytes"] == 4 * MiB - 100 + 500
    assert a["rounding_bytes"] == 100 + 12
    assert a["free_ranges"] == sorted([MiB, 3 * MiB, 512, 2 * MiB - 1024], reverse=True)
    assert a["largest_free_range"] == 3 * MiB
    # partly used pages: [0, 2M) holds 1 MiB, [4M, 6M) holds 1 MiB, the small page holds 512 B
    assert a["partial_pages"] == 3
    assert a["partial_page_free_bytes"] == MiB + MiB + (2 * MiB - 512)
    assert a["cached_free_bytes"] == 8 * MiB - (4 * MiB + 512) - a["partial_page_free_bytes"]
    assert a["fragmentation_cost"] == a["mapped_bytes"] - a["requested_bytes"]
    assert a["mapped_bytes"] == a["requested_bytes"] + a["rounding_bytes"] + a["partial_page_free_bytes"] \
        + a["cached_free_bytes"]


def test_page_content_and_self_contained(trace, report_inputs):
    results, timelines, state = report_inputs
    page = build_report_html(trace, results, timelines, state, "Replay <bert>",
                             extra_sections=[("Leak report", "<p id='leaks'>no leaks</p>")])
    for title in SECTION_TITLES.values():
        assert f">{title}</h2>" in page.replace("&#x27;", "'")
    assert "<p id='leaks'>no leaks</p>" in page and ">Leak report</h2>" in page
    assert "<title>Replay &lt;bert&gt;</title>" in page
    # nothing is loaded from outside the page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//|file:)""", page, flags=re.IGNORECASE)
    assert "<link" not in page and "@import" not in page and "url(" not in page
    assert "<svg" in page and "<script>" in page
    # the verdict names the model that needs least memory
    assert "needs the least memory" in page
    assert "ideal packing, 2 MiB pages (model)</b> needs the least memory" in page


def test_user_strings_are_escaped(tmp_path):
    ops = np.array([[0, 0, 4096, 0, 1], [1, 0, 4096, 0, 1]], dtype=np.int64)
    tr = Trace("<img src=x onerror=alert(1)>", "memory", ops, [0], ["", "</script><script>alert(2)</script>:1"])
    results = [{"allocator": "<b>evil</b>", "peak_reserved_bytes": 8192, "ops": 2, "ooms": 0}]
    page = build_report_html(tr, results, {"<b>evil</b>": [(0, 4096, 8192), (1, 0, 8192)]}, None,
                             "<script>alert(3)</script>")
    assert "<img src=x" not in page and "<b>evil</b>" not in page
    assert "<script>alert" not in page and "</script><script>alert(2)" not in page
    assert "&lt;b&gt;evil&lt;/b&gt;" in page


def test_degenerate_inputs():
    empty = Trace("empty", "memory", np.zeros((0, 5), dtype=np.int64), [], [""])
    page = build_report_html(empty, [], {}, None, "empty")
    assert "No allocator results" in page and "The trace is empty" in page
    one = Trace("one", "memory", np.array([[0, 0, 100, 0, 0]], dtype=np.int64), [0], [""], left_live=1)
    res = [{"allocator": "pool", "peak_reserved_bytes": None, "ooms": 1}]
    page = build_report_html(one, res, {"pool": []}, None, "one")
    assert ">Verdict</h2>" in page


def test_verdict_when_another_allocator_wins(trace, report_inputs):
    results, timelines, state = report_inputs
    worse = dict(results[1], allocator="vramkit pool (pretend)", warm_ns_per_op=400.0)
    better = dict(results[0], warm_ns_per_op=300.0)
    page = build_report_html(trace, [worse, better], timelines, None, "t")
    assert "vramkit pool (pretend) needs" in page and "more</b>" in page
    assert "(ideal packing, 2 MiB pages (model): 300 ns)" in page


def test_all_passes_column_only_where_the_peak_grew(trace, report_inputs):
    results, timelines, state = report_inputs
    flat = [dict(r, fragmentation=1.02, fragmentation_all_passes=1.02) for r in results]
    page = build_report_html(trace, flat, timelines, None, "t")
    assert "all passes</th>" not in page and "Replayed again" not in page
    grew = [dict(flat[0], fragmentation_all_passes=1.137)] + flat[1:]
    page = build_report_html(trace, grew, timelines, None, "t")
    assert "live floor, all passes</th>" in page
    assert "over all passes it reaches <b>1.137\u00d7</b> the live floor, against 1.020\u00d7 in the first" in page
    cells = re.findall(r'<td class="num[^"]*">([0-9.]+)\u00d7</td>', page)
    assert cells == ["1.137", "1.020"]  # one all-passes cell per allocator, in order


def test_cli_report_shows_the_creep_over_passes(tmp_path):
    """On the bundled BERT trace the default pool's peak grows over 12 passes; the page says so, with
    the same figure as `vramkit replay --json`."""
    import json
    import subprocess
    args = ["--passes", "12", "--allocator", "vramkit"]
    html = tmp_path / "r.html"
    p = subprocess.run([sys.executable, "-m", "vramkit", "report", "-o", str(html), "--no-progress", *args],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    q = subprocess.run([sys.executable, "-m", "vramkit", "replay", "--json", *args],
                       capture_output=True, text=True, timeout=600)
    assert q.returncode == 0, q.stderr
    row = json.loads(q.stdout)[0]
    assert row["fragmentation_all_passes"] > row["fragmentation"] + 0.01
    page = html.read_text(encoding="utf-8")
    assert "live floor, all passes</th>" in page
    assert f"reaches <b>{row['fragmentation_all_passes']:.3f}\u00d7</b>" in page


def test_render_is_atomic(tmp_path, monkeypatch, trace, report_inputs):
    import vramkit.report.html as report_html
    results, timelines, state = report_inputs
    out = tmp_path / "r.html"
    out.write_text("old report")

    def failing_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(report_html.os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        render_report(out, trace, results, timelines, state, "t")
    monkeypatch.undo()
    assert out.read_text() == "old report" and sorted(os.listdir(tmp_path)) == ["r.html"]
    assert render_report(out, trace, results, timelines, state, "t") == str(out)
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert sorted(os.listdir(tmp_path)) == ["r.html"]


def _browser():
    bc = ct.load_browser_check()
    if bc.find_chromium() is None:
        pytest.skip("headless Chromium is not installed (Debian: apt-get install chromium)")
    return bc


def test_report_in_headless_chromium(tmp_path, trace, report_inputs):
    bc = _browser()
    results, timelines, state = report_inputs
    html_path = tmp_path / "report.html"
    render_report(html_path, trace, results, timelines, state, "vramkit replay: bert_dynamic_infer",
                  extra_sections=[("Extra section", "<p>added by another tool</p>")])
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "report.png"
    res = bc.check_page(str(html_path), str(shot), window_size=(1400, 2000))
    assert res["errors"] == [], res["errors"]
    assert res["resources"] == [], "the report loaded something from outside the page"
    assert res["exercised"] > 50  # the tooltips and legend handlers ran
    h2 = [h["text"] for h in res["headings"] if h["level"] == "h2"]
    assert h2 == list(SECTION_TITLES.values()) + ["Extra section"]
    assert res["title"] == "vramkit replay: bert_dynamic_infer"
    assert res["screenshot"] == str(shot) and shot.stat().st_size > 20_000
    with open(shot, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_minimal_report_in_headless_chromium(tmp_path, trace):
    bc = _browser()
    html_path = tmp_path / "minimal.html"
    render_report(html_path, trace, [], {}, None, "trace only")
    res = bc.check_page(str(html_path))
    assert res["errors"] == [] and res["resources"] == []
    assert [h["text"] for h in res["headings"] if h["level"] == "h2"] == list(SECTION_TITLES.values())


def test_browser_check_catches_errors(tmp_path):
    bc = _browser()
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><html><head><title>x</title></head><body><h1>x</h1>"
                    "<img src='https://example.invalid/a.png'><div data-tip='x'>hover me</div>"
                    "<script>document.body.addEventListener('mousemove', function () { nope(); });"
                    "undefinedFunction();</script></body></html>")
    res = bc.check_page(str(page))
    joined = "\n".join(res["errors"])
    assert "undefinedFunction" in joined and "nope" in joined
    assert "example.invalid" in joined or any("example.invalid" in r for r in res["resources"])
    assert not res["ok"]
