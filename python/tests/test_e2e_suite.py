"""The end-to-end suite's parts that need no GPU: arguments, plan, failure reporting, the report."""
import json
import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks")
SCRIPT = os.path.join(BENCH, "gpu_end_to_end.py")
sys.path.insert(0, BENCH)

from e2e import cpus, report  # noqa: E402
from e2e.child import parse_vramkit_conf, variant_options  # noqa: E402
from e2e.workloads import WORKLOADS  # noqa: E402


def suite(*args, env=None, timeout=120):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


def test_help_and_dry_run_need_no_torch():
    assert suite("--help").returncode == 0
    p = suite("--dry-run")
    assert p.returncode == 0, p.stderr
    runs = [ln.split() for ln in p.stdout.splitlines() if ln.split()[1:2] == ["repeat"]]
    assert len(runs) == 7 * 3 * 3
    assert {r[4] for r in runs} == {"default", "expandable", "vramkit"}
    assert {r[3] for r in runs} == set(WORKLOADS)
    # Within a repeat, each workload's allocators run back to back; the order rotates per repeat.
    first = [r[4] for r in runs if r[3] == "gpt2"]
    assert first[:3] == ["default", "expandable", "vramkit"]
    assert first[3:6] == ["expandable", "vramkit", "default"]
    assert first[6:9] == ["vramkit", "default", "expandable"]


@pytest.mark.parametrize("args, message", [
    (["--workloads", "gpt2,nope"], "unknown workload 'nope'"),
    (["--allocators", "default,tcmalloc"], "unknown allocator 'tcmalloc'"),
    (["--steps", "2", "--warmup", "2"], "must be greater than --warmup"),
    (["--repeat", "0"], "--repeat must be at least 1"),
    (["--vramkit-conf", "growth_slack"], "is not KEY:VALUE"),
    (["--vramkit-conf", "a:1", "--allocators", "default"], "no vramkit allocator"),
    (["--allocators", "vramkit@"], "unknown allocator 'vramkit@'"),
    (["--allocators", "vramkit@remap_budget"], "allocator 'vramkit@remap_budget'"),
    (["--cpus", "3-1"], "the range runs backwards"),
    (["--cpus", "two"], "not a CPU list"),
    (["--steps", "6", "--profile-step", "7"], "--profile-step must be between 1 and --steps (6)"),
    (["--profile-step", "-1"], "--profile-step must be between"),
])
def test_bad_arguments_fail_with_one_line(args, message):
    p = suite(*args, "--dry-run")
    assert p.returncode == 2
    assert message in p.stderr.strip().splitlines()[-1]


def test_an_allocator_named_twice_runs_twice_per_repeat():
    p = suite("--dry-run", "--workloads", "gpt2", "--allocators", "vramkit,vramkit-tracking,vramkit", "--repeat", "1")
    assert p.returncode == 0
    assert [ln.split()[4] for ln in p.stdout.splitlines() if ln.split()[1:2] == ["repeat"]] == \
        ["vramkit", "vramkit-tracking", "vramkit"]


def test_variant_allocators_carry_their_options():
    assert variant_options("vramkit@map_ahead:256MiB+growth_slack:0.05") == {"map_ahead": "256MiB",
                                                                              "growth_slack": "0.05"}
    assert variant_options("vramkit-8mib") == {"page_size": "8MiB"}
    assert variant_options("vramkit-cuda") == {"upstream": "cuda"}
    assert variant_options("vramkit") == {}
    p = suite("--dry-run", "--workloads", "bert", "--allocators", "default,vramkit@map_ahead:256MiB", "--repeat", "1")
    assert p.returncode == 0, p.stderr
    assert "vramkit.torch.use(map_ahead='256MiB')" in p.stdout


def test_parse_vramkit_conf():
    assert parse_vramkit_conf("") == {}
    assert parse_vramkit_conf("growth_slack:0.05, upstream=cuda") == {"growth_slack": "0.05", "upstream": "cuda"}
    for bad in ("x", "a:", ":1", "a:1,a:2", "a:b:c"):
        with pytest.raises(ValueError):
            parse_vramkit_conf(bad)


def test_failing_children_are_reported_and_the_suite_goes_on(tmp_path):
    # A stand-in torch without CUDA: every run fails inside its child (the fork probe fails too,
    # so the suite falls back to fresh interpreters); the parent reports each and finishes.
    stub = tmp_path / "stub" / "torch"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text(
        "__version__ = 'stub'\nclass cuda:\n    @staticmethod\n    def is_initialized():\n        return False\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "stub"))
    out = tmp_path / "r.json"
    p = suite("--quick", "--workloads", "gpt2,bert", "--allocators", "default,expandable", "--json", str(out),
              env=env)
    assert p.returncode == 1
    doc = json.loads(out.read_text())
    assert doc["meta"]["complete"] and len(doc["runs"]) == 4
    assert all("error" in r and r["rc"] not in (0, None) for r in doc["runs"])
    assert p.stdout.count("FAILED") == 4
    assert "| gpt2 | default | 0 (1 failed) |" in p.stdout


def _fake_sysfs(root, siblings):
    """A sysfs with one GPU at 0000:19:00.0 on CPUs 0-7 and the given sibling lists."""
    dev = root / "bus" / "pci" / "devices" / "0000:19:00.0"
    dev.mkdir(parents=True)
    (dev / "local_cpulist").write_text("0-7\n")
    for cpu, sib in siblings.items():
        top = root / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology"
        top.mkdir(parents=True)
        top.joinpath("thread_siblings_list").write_text(sib + "\n")
    return str(root)


def test_cpu_lists_parse_and_print():
    assert cpus.parse_cpu_list("0-3,8, 10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert cpus.format_cpu_list([5, 0, 1, 2, 10, 11]) == "0-2,5,10-11"
    for bad in ("", "a", "3-", "-3", "4-2", ","):
        with pytest.raises(ValueError):
            cpus.parse_cpu_list(bad)


def test_runs_are_placed_on_the_gpus_cpus_away_from_the_parents_core(tmp_path):
    sysfs = _fake_sysfs(tmp_path, {0: "0,4"})
    # NVML's bus id has an 8-digit domain; sysfs a 4-digit one.
    local = cpus.gpu_local_cpus("00000000:19:00.0", sysfs)
    assert local == list(range(8))
    plan = cpus.plan_cpus("auto", list(range(16)), local, sysfs)
    assert plan["parent"] == [0, 4] and plan["runs"] == [1, 2, 3, 5, 6, 7]
    # Unknown GPU placement: every allowed CPU, still one core left to the parent.
    plan = cpus.plan_cpus("auto", [0, 1, 2, 3], None, sysfs)
    assert plan["parent"] == [0] and plan["runs"] == [1, 2, 3]
    assert cpus.plan_cpus("auto", [0, 1], None, sysfs)["runs"] is None  # too few CPUs: not pinned
    assert cpus.plan_cpus("all", list(range(16)), local, sysfs) == {
        "parent": None, "runs": None, "note": "runs not pinned (--cpus all)"}
    plan = cpus.plan_cpus("2-3", [0, 1, 2, 3], local, sysfs)
    assert plan["runs"] == [2, 3] and plan["parent"] == [0, 1]
    with pytest.raises(ValueError, match="CPU 9 is not one"):
        cpus.plan_cpus("8-9", list(range(9)), local, sysfs)
    assert cpus.gpu_local_cpus("00000000:3b:00.0", sysfs) is None
    assert cpus.current_cpu() in os.sched_getaffinity(0)
    h0 = cpus.host_clocks()
    sum(i * i for i in range(200_000))
    h1 = cpus.host_clocks()
    assert h1["thread_cpu_ms"] > h0["thread_cpu_ms"] and h1["cpu_ms"] > h0["cpu_ms"]


def _run(w, a, warm, reserved, nvml, values=((1.0,),), rep=0):
    return {"workload": w, "allocator": a, "repeat": rep, "cold_ms": 10 * warm, "warm_ms": warm,
            "step_ms": [10 * warm, warm, warm],
            "peak_allocated": 100, "peak_reserved": reserved, "nvml_peak": nvml,
            "values": [[float(x).hex() for x in v] for v in values], "digest": []}


def test_summary_medians_ratios_and_spread():
    runs = [_run("m", "default", 10.0, 150, 200), _run("m", "default", 12.0, 150, 200, rep=1),
            _run("m", "default", 11.0, 150, 200, rep=2),
            _run("m", "expandable", 12.0, 120, 170), _run("m", "expandable", 12.0, 120, 170, rep=1),
            _run("m", "vramkit", 9.9, 110, 160), _run("m", "vramkit", 11.0, 132, 170, rep=1),
            {"workload": "m", "allocator": "vramkit", "error": "boom"}]
    rows = {r["allocator"]: r for r in report.summarize(runs, ["m"], ["default", "expandable", "vramkit"])}
    d, e, v = rows["default"], rows["expandable"], rows["vramkit"]
    assert d["warm_ms"] == 11.0 and d["runs"] == 3
    assert v["runs"] == 2 and v["failed"] == 1 and v["failures"] == ["boom"]
    assert v["warm_ms"] == pytest.approx(10.45)
    assert v["warm_ms_vs_best"] == pytest.approx(10.45 / 11.0)      # the faster baseline: default
    assert v["peak_reserved_vs_best"] == pytest.approx(121 / 120)   # the smaller baseline: expandable
    assert e["peak_reserved_vs_best"] == 1.0 and d["peak_reserved_vs_best"] == pytest.approx(1.25)
    assert v["spread_reserved_pct"] == pytest.approx(100 * 22 / 121)
    assert e["spread_nvml_pct"] == 0.0 and v["reserved_per_allocated"] == pytest.approx(1.21)
    text = report.table(report.summarize(runs, ["m"], ["default", "expandable", "vramkit"]))
    assert text.splitlines()[0].count("|") == text.splitlines()[-1].count("|")


def test_targets_name_the_workloads_that_miss_each_one():
    """The suite's targets per vramkit pool: device memory at or under PyTorch's smaller, reserved
    at most 1.03x allocated, warm at or under the faster, first step no slower than PyTorch
    default's, repeats within 1 %; a workload whose runs all failed misses every one."""
    runs = []
    for rep in range(2):
        runs += [_run("a", "default", 10.0, 150, 200, rep=rep), _run("a", "expandable", 12.0, 120, 170, rep=rep),
                 _run("b", "default", 10.0, 150, 200, rep=rep), _run("b", "expandable", 12.0, 120, 170, rep=rep)]
    # a: meets everything (reserved 102 of 100 allocated, the same in both repeats)
    runs += [_run("a", "vramkit", 9.0, 102, 160), _run("a", "vramkit", 9.0, 102, 160, rep=1)]
    # b: more device memory, 1.10x allocated, slower warm and first step, repeats 1.8 % apart
    runs += [_run("b", "vramkit", 11.0, 109, 175), _run("b", "vramkit", 11.0, 111, 175, rep=1)]
    runs += [{"workload": "c", "allocator": "vramkit", "error": "boom"},
             _run("c", "default", 10.0, 150, 200), _run("c", "expandable", 12.0, 120, 170)]
    rows = report.summarize(runs, ["a", "b", "c"], ["default", "expandable", "vramkit"])
    t = report.targets(rows)
    assert list(t) == ["vramkit"]  # PyTorch's own allocators are the baselines, not judged
    v = t["vramkit"]
    assert len(v) == 6
    for name, r in v.items():
        assert r["met"] == ["a"], name
        assert [w for w, _ in r["not"]] == ["b", "c"], name
        assert r["not"][1][1] is None  # no runs: no figure
    assert dict(v["device memory <= PyTorch's smaller"]["not"])["b"] == pytest.approx(175 / 170)
    assert dict(v["first step <= PyTorch default's"]["not"])["b"] == pytest.approx(1.1)
    # the whole run: every step, the first included (12x the warm step here), against the faster
    assert dict(v["whole run (every step) <= 1.00x PyTorch's faster"]["not"])["b"] == pytest.approx(132 / 120)
    assert dict(v["repeats within 1 % on peak reserved"]["not"])["b"] == pytest.approx(100 * 2 / 110)
    text = report.targets_text(rows)
    assert "reserved <= 1.03x allocated: 1 of 3 (not: b 1.100, c -)" in text
    assert "repeats within 1 % on peak reserved: 1 of 3 (not: b 1.818 %, c -)" in text


def test_reserved_target_names_the_pages_created_past_the_slack():
    """Where a pool misses the reserved target, the line says how many pages it created past its
    slack (the pool's pages_past_slack counter, median over the repeats); PyTorch's runs and
    records without the counter add nothing."""
    runs = []
    for rep in range(3):
        runs += [_run("b", "default", 10.0, 150, 200, rep=rep), _run("b", "expandable", 12.0, 120, 170, rep=rep)]
        r = _run("b", "vramkit", 11.0, 110, 175, rep=rep)
        r["allocator_stats"] = {"pool.pages_past_slack": [40, 52, 61][rep], "pool.pages_created": 7000}
        runs.append(r)
        runs.append(_run("a", "vramkit", 9.0, 110, 160, rep=rep))  # no counter (an older record)
        runs += [_run("a", "default", 10.0, 150, 200, rep=rep), _run("a", "expandable", 12.0, 120, 170, rep=rep)]
    rows = report.summarize(runs, ["a", "b"], ["default", "expandable", "vramkit"])
    by = {(r["workload"], r["allocator"]): r for r in rows}
    assert by[("b", "vramkit")]["pages_past_slack"] == 52
    assert by[("a", "vramkit")]["pages_past_slack"] is None and by[("b", "default")]["pages_past_slack"] is None
    text = report.targets_text(rows)
    assert "reserved <= 1.03x allocated: 0 of 2 (not: a 1.100, b 1.100 (52 pages past the slack))" in text


def test_warm_target_says_what_the_repeats_can_tell():
    """Beside the count, the warm target sorts the workloads by the 90 % interval of the ratio:
    faster (all of it at or under 1.00), slower (all of it over), or not told apart."""
    runs = []
    for rep in range(3):
        for w in ("a", "b", "d"):
            runs += [_run(w, "default", 10.0, 150, 200, rep=rep), _run(w, "expandable", 12.0, 120, 170, rep=rep)]
    runs += [_run("a", "vramkit", 9.0, 102, 160, rep=rep) for rep in range(3)]
    runs += [_run("b", "vramkit", 11.0, 102, 160, rep=rep) for rep in range(3)]
    # d: median 9.5 (met), but one repeat at 12: the interval reaches past 1.00
    runs += [_run("d", "vramkit", x, 102, 160, rep=rep) for rep, x in enumerate((9.0, 9.5, 12.0))]
    rows = report.summarize(runs, ["a", "b", "d"], ["default", "expandable", "vramkit"])
    warm = report.targets(rows)["vramkit"]["warm step <= 1.00x PyTorch's faster"]
    assert warm["met"] == ["a", "d"] and [w for w, _ in warm["not"]] == ["b"]
    assert warm["interval"] == {"faster": ["a"], "slower": ["b"], "not told apart": ["d"]}
    text = report.targets_text(rows)
    assert "by the 90 % interval of the repeats: faster 1 (a); slower 1 (b); not told apart 1 (d)" in text


def test_the_control_is_pytorch_default_judged_as_vramkit_is():
    """default-again runs PyTorch's allocator (no vramkit options, no PYTORCH_CUDA_ALLOC_CONF) and
    the targets judge it beside vramkit, named as the control."""
    p = suite("--dry-run", "--workloads", "bert", "--allocators", "default,expandable,vramkit,default-again",
              "--repeat", "1")
    assert p.returncode == 0, p.stderr
    assert [ln.split()[4] for ln in p.stdout.splitlines() if ln.split()[1:2] == ["repeat"]] == \
        ["default", "expandable", "vramkit", "default-again"]
    assert "default-again    PyTorch's caching allocator again" in p.stdout
    runs = []
    for rep in range(2):
        runs += [_run("a", "default", 10.0, 150, 200, rep=rep), _run("a", "expandable", 12.0, 120, 170, rep=rep),
                 _run("a", "vramkit", 9.0, 102, 160, rep=rep), _run("a", report.CONTROL, 10.5, 150, 200, rep=rep)]
    rows = report.summarize(runs, ["a"], ["default", "expandable", "vramkit", report.CONTROL])
    t = report.targets(rows)
    assert list(t) == ["vramkit", report.CONTROL]
    warm = t[report.CONTROL]["warm step <= 1.00x PyTorch's faster"]
    assert warm["met"] == [] and warm["not"] == [("a", pytest.approx(1.05))]
    assert t[report.CONTROL]["device memory <= PyTorch's smaller"]["not"] == [("a", pytest.approx(200 / 170))]
    assert "  default-again (the control: PyTorch default run again)" in report.targets_text(rows)


def test_share_of_pages_in_chunks():
    runs = [_run("m", "default", 10.0, 150, 200), _run("m", "vramkit", 9.9, 110, 160),
            _run("m", "vramkit", 11.0, 132, 170, rep=1), _run("m", "vramkit", 10.0, 120, 165, rep=2)]
    runs[1]["pool_pages"] = {"mapped_large": 900, "mapped_small": 100, "in_chunks": 800}
    runs[2]["pool_pages"] = {"mapped_large": 190, "mapped_small": 10, "in_chunks": 100}
    runs[3]["pool_pages"] = {"mapped_large": 0, "mapped_small": 0, "in_chunks": 0}  # nothing mapped: no figure
    assert report.chunk_share(runs[1]) == pytest.approx(80.0)
    assert report.chunk_share(runs[0]) is None and report.chunk_share(runs[3]) is None
    rows = {r["allocator"]: r for r in report.summarize(runs, ["m"], ["default", "vramkit"])}
    assert rows["vramkit"]["in_chunks_pct"] == pytest.approx(65.0)  # median of 80 and 50
    assert rows["default"]["in_chunks_pct"] is None


def test_step_plans_made_and_dropped_per_repeat():
    runs = [_run("m", "default", 10.0, 150, 200), _run("m", "vramkit", 9.9, 110, 160, rep=1),
            _run("m", "vramkit", 11.0, 132, 170), _run("m", "vramkit", 10.0, 120, 165, rep=2)]
    runs[0]["allocator_stats"] = {"num_ooms": 0}  # PyTorch's counters: no plans
    runs[1]["allocator_stats"] = {"pool.plans_made": 2, "pool.plans_dropped": 1}
    runs[2]["allocator_stats"] = {"pool.plans_made": 1, "pool.plans_dropped": 0}
    runs[3]["allocator_stats"] = {"pool.plans_made": 0.0}
    assert report.plan_counts(runs[1]) == (2, 1) and report.plan_counts(runs[3]) == (0, 0)
    assert report.plan_counts(runs[0]) is None and report.plan_counts({"workload": "m"}) is None
    rows = {r["allocator"]: r for r in report.summarize(runs, ["m"], ["default", "vramkit"])}
    assert rows["vramkit"]["plans"] == [[1, 0], [2, 1], [0, 0]]  # in repeat order
    assert rows["default"]["plans"] is None


def test_warm_test_applied_to_each_allocator_in_turn():
    """Each of the three allocators' median warm step over the faster of the other two's, and how
    many workloads each would pass; nothing for a workload that lacks one of the three."""
    runs = [_run("a", "default", 10.0, 150, 200), _run("a", "default", 12.0, 150, 200, rep=1),
            _run("a", "expandable", 10.5, 120, 170), _run("a", "vramkit", 11.5, 110, 160),
            _run("b", "default", 20.0, 150, 200), _run("b", "expandable", 18.0, 120, 170),
            _run("b", "vramkit", 19.0, 110, 160), _run("c", "default", 5.0, 150, 200),
            _run("c", "vramkit", 4.0, 110, 160)]
    rows = {(r["workload"], r["allocator"]): r
            for r in report.summarize(runs, ["a", "b", "c"], ["default", "expandable", "vramkit"])}
    assert rows[("a", "default")]["warm_ms_vs_others"] == pytest.approx(11.0 / 10.5)
    assert rows[("a", "expandable")]["warm_ms_vs_others"] == pytest.approx(10.5 / 11.0)
    assert rows[("a", "vramkit")]["warm_ms_vs_others"] == pytest.approx(11.5 / 10.5)
    assert rows[("b", "expandable")]["warm_ms_vs_others"] == pytest.approx(18.0 / 19.0)
    assert rows[("c", "vramkit")]["warm_ms_vs_others"] is None  # no expandable run on c
    text = report.noise_text(list(rows.values()))
    assert "a          default 1.048  expandable 0.955  vramkit 1.095" in text
    assert "c " not in text
    assert text.splitlines()[-1] == "  at or under 1.00: default 0 of 2, expandable 2 of 2, vramkit 0 of 2"
    assert report.noise_text([rows[("c", "vramkit")]]) == ""


def test_time_in_page_calls_first_step_and_warm_median():
    """The pool's page-call times per step (ns, from pool_counters): the first step's sum and the
    median over the warm steps, in ms; medians over the repeats; nothing for runs without them."""
    def ops(*ms):
        return [{"page_create_ns": int(x * 0.25e6), "page_map_ns": int(x * 0.5e6), "page_unmap_ns": int(x * 0.25e6),
                 "page_destroy_ns": 0, "pages_created": 1} for x in ms]
    runs = [_run("m", "default", 10.0, 150, 200), _run("m", "vramkit", 9.9, 110, 160),
            _run("m", "vramkit", 11.0, 132, 170, rep=1), _run("m", "vramkit", 10.0, 120, 165, rep=2)]
    for r in runs:
        r["warmup"] = 1
    runs[1]["step_page_ops"] = ops(40, 2, 0, 4)       # warm steps 2, 0, 4: median 2
    runs[2]["step_page_ops"] = ops(60, 1, 1, 1)
    runs[3]["step_page_ops"] = [{"pages_created": 3}]  # recorded before the timings existed: no figure
    assert report.page_call_ms(runs[1]) == (pytest.approx(40.0), pytest.approx(2.0))
    assert report.page_call_ms(runs[0]) == (None, None) and report.page_call_ms(runs[3]) == (None, None)
    assert report.page_call_ms(dict(runs[1], step_page_ops=ops(7))) == (pytest.approx(7.0), None)  # no warm step
    rows = {r["allocator"]: r for r in report.summarize(runs, ["m"], ["default", "vramkit"])}
    assert rows["vramkit"]["page_calls_cold_ms"] == pytest.approx(50.0)
    assert rows["vramkit"]["page_calls_warm_ms"] == pytest.approx(1.5)
    assert rows["default"]["page_calls_cold_ms"] is None


def test_time_waiting_for_the_gpu_first_step_and_warm_median():
    """gpu_wait_ns per step (the pool's waits for events, streams, the device): the first step's
    and the warm steps' median in ms, kept apart from the page calls; nothing without the counter."""
    def ops(*ms):
        return [{"page_map_ns": 1_000_000, "gpu_wait_ns": int(x * 1e6)} for x in ms]
    runs = [_run("m", "default", 10.0, 150, 200), _run("m", "vramkit", 9.9, 110, 160),
            _run("m", "vramkit", 11.0, 132, 170, rep=1)]
    for r in runs:
        r["warmup"] = 1
    runs[1]["step_page_ops"] = ops(30, 0, 5, 1)
    runs[2]["step_page_ops"] = [{"page_map_ns": 2_000_000}] * 4  # recorded before the counter
    assert report.gpu_wait_ms(runs[1]) == (pytest.approx(30.0), pytest.approx(1.0))
    assert report.page_call_ms(runs[1]) == (pytest.approx(1.0), pytest.approx(1.0))
    assert report.gpu_wait_ms(runs[2]) == (None, None) and report.gpu_wait_ms(runs[0]) == (None, None)
    rows = {r["allocator"]: r for r in report.summarize(runs, ["m"], ["default", "vramkit"])}
    assert rows["vramkit"]["gpu_wait_cold_ms"] == pytest.approx(30.0)
    assert rows["default"]["gpu_wait_cold_ms"] is None


def test_time_in_page_calls_over_all_warm_steps():
    """The warm steps' page-call times summed (the bursts the warm median passes over: a step
    that makes a plan, a new largest shape), medians over the repeats; nothing without figures
    or without a warm step."""
    def ops(*ms):
        return [{"page_map_ns": int(x * 1e6), "pages_created": 1} for x in ms]
    runs = [_run("m", "default", 10.0, 150, 200), _run("m", "vramkit", 9.9, 110, 160),
            _run("m", "vramkit", 11.0, 132, 170, rep=1), _run("m", "vramkit", 10.0, 120, 165, rep=2)]
    for r in runs:
        r["warmup"] = 2
    runs[1]["step_page_ops"] = ops(40, 30, 0, 25, 0, 0)  # warm steps (from the third): 0, 25, 0, 0
    runs[2]["step_page_ops"] = ops(60, 5, 1, 1, 1, 1)
    runs[3]["step_page_ops"] = ops(50, 9)                # no warm step
    assert report.page_call_warm_sum_ms(runs[1]) == pytest.approx(25.0)
    assert report.page_call_ms(runs[1])[1] == pytest.approx(0.0)  # the median sees none of it
    assert report.page_call_warm_sum_ms(runs[2]) == pytest.approx(4.0)
    assert report.page_call_warm_sum_ms(runs[3]) is None
    assert report.page_call_warm_sum_ms(runs[0]) is None
    rows = {r["allocator"]: r for r in report.summarize(runs, ["m"], ["default", "vramkit"])}
    assert rows["vramkit"]["page_calls_warm_sum_ms"] == pytest.approx(14.5)  # median of 25 and 4
    assert rows["default"].get("page_calls_warm_sum_ms") is None


def test_profiled_step_busy_idle_and_host_waits():
    """--profile-step: the GPU's intervals are joined where they overlap, the rest of the wall
    time is idle, only the host's synchronize calls count as waits; medians over the repeats in
    the summary and one line per profiled (workload, allocator)."""
    from e2e import profile
    assert profile.union_ms([]) == 0.0
    assert profile.union_ms([(0, 1000), (500, 1500), (3000, 3500), (3100, 3200), (4000, 4000)]) == pytest.approx(2.0)
    events = [{"device": "cuda", "name": "gemm", "start": 100.0, "end": 2100.0},
              {"device": "cuda", "name": "Memcpy DtoH", "start": 2000.0, "end": 2500.0},  # overlaps the gemm
              {"device": "cpu", "name": "cudaStreamSynchronize", "start": 2050.0, "end": 2600.0},
              {"device": "cpu", "name": "cudaLaunchKernel", "start": 0.0, "end": 20.0},
              {"device": "cpu", "name": "cuLaunchKernel", "start": 30.0, "end": 40.0},
              {"device": "cpu", "name": "cub::DeviceScan", "start": 50.0, "end": 60.0},  # a library's name, no API call
              {"device": "cpu", "name": "aten::nonzero", "start": 1900.0, "end": 2700.0, "self": 200.0}]
    got = profile.summarize_events(events, wall_ms=4.0)
    assert got == {"wall_ms": 4.0, "gpu_busy_ms": 2.4, "gpu_idle_ms": 1.6, "kernel_ms": 2.5, "gpu_ops": 2,
                   "host_wait_ms": 0.55, "host_waits": 1, "host_api_ms": 0.03, "host_api_calls": 2,
                   "host_api": {"cuLaunchKernel": [0.01, 1], "cudaLaunchKernel": [0.02, 1]},
                   "host_top": [["cudaStreamSynchronize", 0.55, 1], ["aten::nonzero", 0.2, 1],
                                ["cudaLaunchKernel", 0.02, 1], ["cuLaunchKernel", 0.01, 1],
                                ["cub::DeviceScan", 0.01, 1]]}
    runs = [_run("m", "default", 10.0, 150, 200), _run("m", "vramkit", 10.5, 150, 200),
            _run("m", "vramkit", 10.7, 150, 200, rep=1)]
    runs[0]["profile"] = dict(got)
    runs[1]["profile"] = dict(got, wall_ms=5.0, gpu_idle_ms=2.6)
    runs[2]["profile"] = dict(got, wall_ms=7.0, gpu_idle_ms=4.6, host_waits=3)
    rows = report.summarize(runs, ["m"], ["default", "vramkit"])
    by = {r["allocator"]: r for r in rows}
    assert by["vramkit"]["profile_wall_ms"] == pytest.approx(6.0)
    assert by["vramkit"]["profile_gpu_idle_ms"] == pytest.approx(3.6)
    assert by["vramkit"]["profile_host_waits"] == pytest.approx(2.0)
    text = report.profile_text(rows).splitlines()
    assert len(text) == 2 and text[1].split() == ["m", "vramkit", "6.0", "/", "2.4", "/", "3.6", "/", "0.6", "(2),",
                                                  "API", "0.0"]
    assert report.profile_text(report.summarize(runs[:1] + [_run("m", "vramkit", 10.0, 150, 200)], ["m"],
                                                ["vramkit"])) == ""


def test_step_minimum_takes_each_steps_fastest_repeat():
    """The per-step statistics: each step's fastest repeat, then the median and the sum over the
    warm steps; a slow repeat does not move them, a step that is slow in every repeat does."""
    def run(a, steps, rep):
        return {"workload": "s", "allocator": a, "repeat": rep, "warmup": 1, "step_ms": steps, "cold_ms": steps[0],
                "warm_ms": sorted(steps[1:])[len(steps[1:]) // 2], "peak_allocated": 1, "peak_reserved": 1,
                "nvml_peak": 1, "values": [], "digest": []}
    runs = [run("default", [50, 10, 20, 10], 0), run("default", [60, 15, 30, 15], 1),      # repeat 1 slow
            run("expandable", [55, 11, 21, 11], 0), run("expandable", [50, 11, 21, 11], 1),
            run("vramkit", [80, 10, 40, 10], 0), run("vramkit", [90, 30, 40, 30], 1)]     # step 2 slow in both
    rows = {r["allocator"]: r for r in report.summarize(runs, ["s"], ["default", "expandable", "vramkit"])}
    d, v = rows["default"], rows["vramkit"]
    assert d["warm_min_ms"] == 10 and d["warm_total_min_ms"] == 40
    assert v["warm_min_ms"] == 10 and v["warm_total_min_ms"] == 60
    assert v["warm_total_min_ms_vs_best"] == pytest.approx(60 / 40)
    assert v["warm_min_ms_vs_best"] == pytest.approx(1.0)
    assert d["spread_warm_pct"] == pytest.approx(100 * 5 / 12.5)
    assert report.step_minimum([]) == (None, None)
    line = report.table(report.summarize(runs, ["s"], ["default", "expandable", "vramkit"])).splitlines()[-1]
    # warm min x, warm total x, then the whole run: the median repeat of all its steps (140 and 190
    # ms: 165) against the faster PyTorch setting's (default 90 and 120, expandable 98 and 93: 95.5)
    assert line.endswith("| 1.000 | 1.500 | 165 | 1.728 |"), line


def test_steps_against_pytorch_default_show_a_steady_lead():
    """Each warm step's median over the repeats against PyTorch default's: the median ratio and
    the steps faster; a lead in every step shows though the runs' medians overlap."""
    def run(a, steps, rep):
        return {"workload": "s", "allocator": a, "repeat": rep, "warmup": 1, "step_ms": steps, "cold_ms": steps[0],
                "warm_ms": sorted(steps[1:])[len(steps[1:]) // 2], "peak_allocated": 1, "peak_reserved": 1,
                "nvml_peak": 1, "values": [], "digest": []}
    runs = [run("default", [50, 10, 20, 40], 0), run("default", [50, 12, 22, 44], 1), run("default", [50, 14, 24, 48], 2),
            run("expandable", [90, 9.5, 19, 38], 0), run("expandable", [90, 13, 23, 46], 1),
            run("vramkit", [60, 12, 22, 40], 0), run("vramkit", [60, 12, 22, 50], 1), run("vramkit", [60, 12, 22, 60], 2)]
    rows = {r["allocator"]: r for r in report.summarize(runs, ["s"], ["default", "expandable", "vramkit"])}
    d, e, v = rows["default"], rows["expandable"], rows["vramkit"]
    assert d["steps_vs_default"] is None and d["steps_compared"] == 0
    # expandable: step medians 11.25, 21, 42 against 12, 22, 44
    assert e["steps_vs_default"] == pytest.approx(21 / 22)
    assert (e["steps_faster_than_default"], e["steps_compared"]) == (3, 3)
    # vramkit: 12, 22, 50 against 12, 22, 44: no step faster, the cold step left out
    assert v["steps_vs_default"] == pytest.approx(1.0)
    assert (v["steps_faster_than_default"], v["steps_compared"]) == (0, 3)
    lines = report.steps_text(list(rows.values())).splitlines()
    assert [x.split() for x in lines] == [["s", "expandable", "0.955", "faster", "in", "3", "of", "3"],
                                          ["s", "vramkit", "1.000", "faster", "in", "0", "of", "3"]]
    assert report.step_medians([]) == [] and report.step_ratios([], [1.0], 0) == (None, 0, 0)
    # without PyTorch default in the run there is nothing to compare with
    alone = report.summarize([r for r in runs if r["allocator"] != "default"], ["s"], ["expandable", "vramkit"])
    assert all(r["steps_vs_default"] is None for r in alone) and report.steps_text(alone) == ""


def test_checksum_verdicts():
    same = [_run("a", x, 1, 1, 1, rep=r) for x in ("default", "vramkit") for r in (0, 1)]
    assert report.compare_checksums(same, ["a"])["a"]["verdict"] == "equal"
    odd = [_run("b", "default", 1, 1, 1, rep=r) for r in (0, 1)] + \
          [_run("b", "vramkit", 1, 1, 1, values=((2.0,),), rep=r) for r in (0, 1)]
    v = report.compare_checksums(odd, ["b"])["b"]["verdict"]
    assert v.startswith("different (vramkit differ from default") and "repeats agree" in v
    noisy = [_run("c", "default", 1, 1, 1, values=((r + 1.0,),), rep=r) for r in (0, 1)] + \
            [_run("c", "vramkit", 1, 1, 1)]
    assert "not deterministic" in report.compare_checksums(noisy, ["c"])["c"]["verdict"]
    assert report.compare_checksums([], ["d"])["d"]["verdict"] == "no runs"


def test_warm_ratio_interval_follows_the_repeats():
    """The bootstrap interval holds the point ratio, is one point when every repeat agrees, widens
    with the repeats' spread, is the same on every call, and is left out without a baseline."""
    steady = [_run("i", "default", 10.0, 1, 1, rep=r) for r in range(4)] + \
             [_run("i", "vramkit", 9.0, 1, 1, rep=r) for r in range(4)]
    v = {r["allocator"]: r for r in report.summarize(steady, ["i"], ["default", "vramkit"])}["vramkit"]
    assert v["warm_ms_vs_best_ci"] == [pytest.approx(0.9), pytest.approx(0.9)]
    noisy = [_run("j", "default", t, 1, 1, rep=r) for r, t in enumerate((8.0, 10.0, 12.0, 14.0))] + \
            [_run("j", "expandable", t, 1, 1, rep=r) for r, t in enumerate((11.0, 11.5, 12.0, 12.5))] + \
            [_run("j", "vramkit", t, 1, 1, rep=r) for r, t in enumerate((8.5, 10.0, 11.0, 13.0))]
    rows = report.summarize(noisy, ["j"], ["default", "expandable", "vramkit"])
    v = {r["allocator"]: r for r in rows}["vramkit"]
    lo, hi = v["warm_ms_vs_best_ci"]
    assert lo <= v["warm_ms_vs_best"] <= hi and lo < 1.0 < hi
    assert report.summarize(noisy, ["j"], ["default", "expandable", "vramkit"])[2]["warm_ms_vs_best_ci"] == [lo, hi]
    assert report.ratio_interval([1.0], []) is None and report.ratio_interval([], [[1.0]]) is None
    line = report.table(rows).splitlines()[-1]
    assert f"| {lo:.2f}-{hi:.2f} |" in line


def test_torch_alloc_cost_plan_errors_and_table():
    """benchmarks/torch_alloc_cost.py without a GPU: the run order rotates per repeat, bad
    allocators and counts are refused by name, the table gives medians and ratios to default's."""
    import torch_alloc_cost as tac
    script = os.path.join(BENCH, "torch_alloc_cost.py")
    assert tac.plan(["a", "b", "c"], 2) == [(0, "a"), (0, "b"), (0, "c"), (1, "b"), (1, "c"), (1, "a")]
    p = subprocess.run([sys.executable, script, "--dry-run", "--allocators", "default,vramkit@remap:false",
                        "--repeat", "2"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split("\n")[:4] == ["repeat 0: default", "repeat 0: vramkit@remap:false",
                                        "repeat 1: vramkit@remap:false", "repeat 1: default"]
    for args, msg in ((["--allocators", "default,nope"], "unknown allocator 'nope'"),
                      (["--allocators", "vramkit@bad"], "not KEY:VALUE"),
                      (["--count", "0"], "at least 1")):
        p = subprocess.run([sys.executable, script, "--dry-run", *args], capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and msg in p.stderr, (args, p.stderr)
    res = {"default": [{"temp": 2.0, "window8": 3.0, "window64": 4.0}, {"temp": 4.0, "window8": 3.0, "window64": 4.0},
                       {"temp": 3.0, "window8": 3.0, "window64": 4.0}],
           "vramkit": [{"temp": 6.0, "window8": 3.0, "window64": 2.0}], "x": []}
    rows = tac.table(res, ["default", "vramkit", "x"]).splitlines()
    assert len(rows) == 4  # header, rule, the two allocators that ran
    assert rows[2].split("|")[1:-1] == [" default ", " 3.00 ", " 3.00 ", " 4.00 ", " 1.00 ", " 1.00 ", " 1.00 "]
    assert rows[3].split("|")[1:-1] == [" vramkit ", " 6.00 ", " 3.00 ", " 2.00 ", " 2.00 ", " 1.00 ", " 0.50 "]
    assert "/ default" not in tac.table({"vramkit": res["vramkit"]}, ["vramkit"])


def test_decode_trace_is_a_valid_generation_loop():
    """benchmarks/decode_trace.py: every allocation freed once, after it was made; the caches grow
    a token at a time; the same seed gives the same lines; bad arguments fail."""
    import decode_trace
    ops = decode_trace.ops(steps=2, seed=3)
    assert ops == decode_trace.ops(steps=2, seed=3) and ops != decode_trace.ops(steps=2, seed=4)
    live = {}
    for op, i, size, stream in ops:
        assert stream == 0
        if op == 0:
            assert i not in live and size > 0
            live[i] = size
        else:
            assert op == 1 and i in live
            del live[i]
    assert not live
    # the first step's draws: keys and values of every layer made anew at each length prompt+1..prompt+new
    import random
    from collections import Counter
    rng = random.Random(3)
    batch, prompt, new = rng.randint(8, 64), rng.randint(64, 1024), rng.randint(16, 32)
    per_token = batch * decode_trace.KV_HEADS * decode_trace.HEAD_DIM * decode_trace.BF16
    made = Counter(s for o, _, s, _ in ops if o == 0)
    assert all(made[per_token * (prompt + t)] >= 2 * decode_trace.LAYERS for t in range(1, new + 1))
    assert made[per_token * (prompt + new + 1)] == 0 or new == 32  # (the second step may draw it)
    out = subprocess.run([sys.executable, os.path.join(BENCH, "decode_trace.py"), "--steps", "1"],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert len(out) == len(decode_trace.ops(steps=1)) and out[0].split()[0] == "0"
    bad = subprocess.run([sys.executable, os.path.join(BENCH, "decode_trace.py"), "--steps", "0"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "--steps must be at least 1" in bad.stderr


def test_vmm_access_bench_host_views_and_bad_arguments():
    """benchmarks/vmm_access_bench.py: the host table's views lie a 2 MiB page apart, as many as
    fit; bad arguments fail before PyTorch is needed."""
    import vmm_access_bench as vab

    class Flat:  # the part of a flat fp16 tensor host_views uses
        def __init__(self, n):
            self.n = n

        def view(self, *_):
            return self

        def element_size(self):
            return 2

        def numel(self):
            return self.n

        def __getitem__(self, sl):
            return (sl.start, sl.stop)

    page = (2 << 20) // 2  # fp16 elements in 2 MiB
    assert vab.host_views(Flat(2 * page + 512)) == [(0, 512), (page, page + 512), (2 * page, 2 * page + 512)]
    assert vab.host_views(Flat(2 * page + 511)) == [(0, 512), (page, page + 512)]  # the third would run past the end
    assert len(vab.host_views(Flat(1000 * page))) == vab.HOST_VIEWS
    for args, message in ((["--host-ops", "-1"], "--host-ops must be >= 0"),
                          (["--gib", "0.001"], "--gib must be at least one 2 MiB page"),
                          (["--rounds", "0"], "--rounds >= 1")):
        r = subprocess.run([sys.executable, os.path.join(BENCH, "vmm_access_bench.py")] + args,
                           capture_output=True, text=True)
        assert r.returncode == 2 and message in r.stderr, (args, r.stderr)


def test_pool_lag_study_reads_quick_replays_pass_lines():
    """benchmarks/pool_lag_study.py parses the pass lines cpp/bench/quick_replay prints (the chunk
    and early counts between waits and driver_ms included)."""
    import pool_lag_study
    line = ("pass 2: created 6 mapped 8 unmapped 0 remapped 2 reused 0 destroyed 0 reserved 13884 MiB waits 3 "
            "chunks 0/0 early 5/1 driver_ms 0.3\npass 3: created 0 mapped 0 unmapped 0 remapped 0 reused 0 "
            "destroyed 0 reserved 13884 MiB waits 0 driver_ms 12.5\n")
    got = [tuple(float(x) for x in m.groups()) for m in pool_lag_study.PASS.finditer(line)]
    assert got == [(2, 6, 8, 0, 2, 0, 0, 13884, 3, 0.3), (3, 0, 0, 0, 0, 0, 0, 13884, 0, 12.5)]


def test_host_control_medians_and_spread_per_allocator():
    """Each allocator's median host-speed control over its runs, and their spread; runs without
    controls (older JSON) leave the figures out, and the step ratios stay the raw times'."""
    def run(a, steps, control, rep):
        r = {"workload": "h", "allocator": a, "repeat": rep, "warmup": 1, "step_ms": steps, "cold_ms": steps[0],
             "warm_ms": sorted(steps[1:])[len(steps[1:]) // 2], "peak_allocated": 1, "peak_reserved": 1,
             "nvml_peak": 1, "values": [], "digest": []}
        if control is not None:
            r["step_control_ms"] = control
        return r
    runs = [run("default", [50, 10, 20, 40], [1.0, 1.0, 1.0, 1.0], 0),
            run("default", [50, 10, 20, 40], [1.0, 1.0, 1.0, 1.0], 1),
            run("vramkit", [55, 11, 22, 44], [1.1, 1.1, 1.1, 1.1], 0),
            run("vramkit", [55, 11, 22, 44], [1.2, 1.0, 1.2, 1.2], 1),
            run("slow", [52.5, 10.5, 21, 42], [1.0, 1.0, 1.0, 1.0], 0)]
    rows = {r["allocator"]: r for r in report.summarize(runs, ["h"], ["default", "vramkit", "slow"])}
    d, v, s = rows["default"], rows["vramkit"], rows["slow"]
    assert v["steps_vs_default"] == pytest.approx(1.1) and s["steps_vs_default"] == pytest.approx(1.05)
    assert d["control_ms"] == 1.0 and d["spread_control_pct"] == 0.0
    assert v["control_ms"] == pytest.approx(1.15) and v["spread_control_pct"] == pytest.approx(100 * 0.1 / 1.15)
    assert s["spread_control_pct"] is None  # one run
    lines = [x.split() for x in report.steps_text(list(rows.values())).splitlines()]
    assert lines[0] == ["h", "vramkit", "1.100", "faster", "in", "0", "of", "3"]
    ctl = report.control_text(list(rows.values())).splitlines()
    assert ctl[0].split() == ["h", "default", "1.000", "ms", "spread", "over", "runs", "0.0", "%"]
    assert ctl[2].split() == ["h", "slow", "1.000", "ms"]
    old = report.summarize([run("default", [5, 5], None, 0), run("vramkit", [5, 5], None, 0)], ["h"],
                           ["default", "vramkit"])
    assert all(r["control_ms"] is None for r in old) and report.control_text(old) == ""


def test_host_control_times_in_place_adds():
    """e2e/hostspeed.py: the fastest of its rounds, in ms, of the given number of adds."""
    from e2e import hostspeed

    class Counter:
        n = 0

        def add_(self, v):
            self.n += 1

    c = Counter()
    ms = hostspeed.control_ms(c, ops=10, tries=3)
    assert c.n == 30 and 0 < ms < 1000
    with pytest.raises(ValueError):
        hostspeed.control_ms(c, ops=0)
