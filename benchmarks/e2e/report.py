"""Medians over repeats, ratios against PyTorch's allocators, the checksum verdict, the table.

Pure Python on the runs' JSON records: no torch, so it is tested without a GPU.
"""
from __future__ import annotations

import hashlib
import json
import random
import statistics

MiB = 1 << 20
BASELINES = ("default", "expandable")  # PyTorch's allocator without and with expandable segments
MEASURES = ("cold_ms", "warm_ms", "peak_allocated", "peak_reserved", "nvml_peak")
# PyTorch default run again under another name (gpu_end_to_end.py --allocators ...,default-again):
# judged by the targets as vramkit is, it shows what the runs' noise alone makes of each target.
CONTROL = "default-again"
TRIO = BASELINES + ("vramkit",)  # the suite's three allocators, for the test applied to each in turn
# Per-step figures over the repeats (see step_minimum): noise only adds time, so each step's
# fastest repeat is the best estimate of what the allocator costs in it.
STEP_MEASURES = ("warm_min_ms", "warm_total_min_ms")
# The whole run (every step's time summed, the first included): the median over the repeats.
RUN_MEASURES = ("run_ms",)
# The warm-time ratio's interval: repeats resampled with replacement, a fixed seed (the same
# records always give the same interval).
CI_RESAMPLES = 2000
CI_LEVEL = 0.90


def ok(run: dict) -> bool:
    return "warm_ms" in run and "error" not in run and "oom" not in run


def checksum(run: dict) -> str:
    """What must be equal between allocators: every step's checksum values and the final digest."""
    text = json.dumps([run.get("values"), run.get("digest")], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _spread(xs: list) -> float | None:
    xs = [x for x in xs if isinstance(x, (int, float))]
    if len(xs) < 2:
        return None
    m = statistics.median(xs)
    return 100.0 * (max(xs) - min(xs)) / m if m else None


def step_minimum(good: list[dict]) -> tuple[float | None, float | None]:
    """Over the repeats of one (workload, allocator): each step's fastest time (the steps of a
    workload have the same shapes in every run), then the median and the sum of those minima
    over the warm steps. The sum counts the steps where an allocator pays for growth, which the
    median of a run's steps leaves out."""
    series = [r["step_ms"] for r in good if isinstance(r.get("step_ms"), list) and r["step_ms"]]
    if not series:
        return None, None
    n = min(len(t) for t in series)
    warmup = min(max(int(good[0].get("warmup", 0) or 0), 0), n - 1)
    mins = [min(t[i] for t in series) for i in range(warmup, n)]
    return statistics.median(mins), sum(mins)


def step_medians(good: list[dict]) -> list[float]:
    """Over the repeats of one (workload, allocator): each step's median time, for the steps
    every repeat has (the steps of a workload have the same shapes in every run)."""
    return _per_step_median([r["step_ms"] for r in good if isinstance(r.get("step_ms"), list) and r["step_ms"]])


def _per_step_median(series: list[list[float]]) -> list[float]:
    """Each index's median over the series, for the indices every series has."""
    if not series:
        return []
    return [statistics.median(t[i] for t in series) for i in range(min(len(t) for t in series))]


def control_medians(good: list[dict]) -> list[float]:
    """Each run's median host-speed control (ms), for the runs that have one."""
    return [statistics.median(r["step_control_ms"]) for r in good
            if isinstance(r.get("step_control_ms"), list) and r["step_control_ms"]]


def step_ratios(own: list[float], base: list[float], warmup: int) -> tuple[float | None, int, int]:
    """Step by step, own's median time over base's (``step_medians`` of each) after the warm-up:
    the median of those ratios, how many steps own was faster in, and how many were compared.
    Where two allocators differ by less than the runs' spread, a steady lead of one shows here
    as a count near all or none of the steps, which medians of whole runs do not show."""
    n = min(len(own), len(base))
    ratios = [own[i] / base[i] for i in range(max(warmup, 0), n) if base[i] > 0]
    if not ratios:
        return None, 0, 0
    return statistics.median(ratios), sum(1 for x in ratios if x < 1.0), len(ratios)


def steps_text(rows: list[dict]) -> str:
    """One line per (workload, allocator) but PyTorch default: each warm step's median time over
    PyTorch default's, the median of those ratios and the steps it was faster in; "" when no row
    has the figures."""
    lines = []
    for r in rows:
        if r.get("steps_vs_default") is None:
            continue
        lines.append(f"  {r['workload']:10s} {r['allocator']:30s} {r['steps_vs_default']:.3f}   "
                     f"faster in {r['steps_faster_than_default']} of {r['steps_compared']}")
    return "\n".join(lines)


def noise_text(rows: list[dict]) -> str:
    """The warm-step test applied to each of PyTorch default, expandable_segments and vramkit in
    turn (its median warm step over the faster of the other two's): one line per workload, then
    how many workloads each would pass; "" when no workload ran all three."""
    by: dict[str, dict[str, float]] = {}
    for r in rows:
        if r.get("warm_ms_vs_others") is not None:
            by.setdefault(r["workload"], {})[r["allocator"]] = r["warm_ms_vs_others"]
    if not by:
        return ""
    lines = [f"  {w:10s} " + "  ".join(f"{a} {x[a]:.3f}" for a in TRIO) for w, x in by.items()]
    lines.append("  at or under 1.00: " + ", ".join(
        f"{a} {sum(x[a] <= 1.0 for x in by.values())} of {len(by)}" for a in TRIO))
    return "\n".join(lines)


def control_text(rows: list[dict]) -> str:
    """One line per (workload, allocator) whose runs timed the host-speed control: its median
    over the runs (ms) and their spread (%); "" when none did."""
    lines = []
    for r in rows:
        if r.get("control_ms") is None:
            continue
        spread = r.get("spread_control_pct")
        lines.append(f"  {r['workload']:10s} {r['allocator']:30s} {r['control_ms']:.3f} ms"
                     + ("" if spread is None else f"   spread over runs {spread:.1f} %"))
    return "\n".join(lines)


def ratio_interval(own: list[float], baselines: list[list[float]], level: float = CI_LEVEL,
                   resamples: int = CI_RESAMPLES, seed: int = 0) -> tuple[float, float] | None:
    """A bootstrap interval for median(own) / min(median of each baseline): each resample draws
    every allocator's repeats anew, with replacement. With a few repeats of a noisy workload the
    interval is wide, and a ratio of 0.97 whose interval reaches past 1 is not a win."""
    own = [x for x in own if isinstance(x, (int, float))]
    baselines = [[x for x in b if isinstance(x, (int, float))] for b in baselines]
    baselines = [b for b in baselines if b]
    if not own or not baselines:
        return None
    rng = random.Random(seed)
    draw = lambda xs: statistics.median(rng.choices(xs, k=len(xs)))  # noqa: E731
    ratios = []
    for _ in range(resamples):
        best = min(draw(b) for b in baselines)
        if best > 0:
            ratios.append(draw(own) / best)
    if not ratios:
        return None
    ratios.sort()
    tail = (1.0 - level) / 2.0
    return ratios[int(tail * (len(ratios) - 1))], ratios[int(round((1.0 - tail) * (len(ratios) - 1)))]


def chunk_share(run: dict) -> float | None:
    """Of the pages a vramkit pool held mapped at the end of a run, the share in chunks (large
    driver handles), in %; None without the figures (PyTorch's allocators, non-paged pools)."""
    u = run.get("pool_pages")
    if not isinstance(u, dict):
        return None
    mapped = u.get("mapped_large", 0) + u.get("mapped_small", 0)
    return 100.0 * u.get("in_chunks", 0) / mapped if mapped else None


def plan_counts(run: dict) -> tuple[int, int] | None:
    """A vramkit pool's step plans over a run, (made, dropped), from its counters; None without
    them (PyTorch's allocators). A plan dropped and made again moves the step's pages each time."""
    st = run.get("allocator_stats")
    if not isinstance(st, dict) or not isinstance(st.get("pool.plans_made"), (int, float)):
        return None
    return int(st["pool.plans_made"]), int(st.get("pool.plans_dropped") or 0)


def pages_past_slack(run: dict) -> int | None:
    """Pages a vramkit pool created past its slack over the run (``pool.pages_past_slack``: no
    whole free page was left to move); None without the counter (PyTorch's allocators, older
    records)."""
    st = run.get("allocator_stats")
    x = st.get("pool.pages_past_slack") if isinstance(st, dict) else None
    return int(x) if isinstance(x, (int, float)) else None


PAGE_CALL_KEYS = ("page_create_ns", "page_map_ns", "page_unmap_ns", "page_destroy_ns")


def _page_call_ms_per_step(run: dict, keys: tuple[str, ...] = PAGE_CALL_KEYS) -> list[float] | None:
    """Each step's time inside the pool's page device calls (or the pool's other timed counters:
    ``keys``), in ms; None without the figures."""
    steps = run.get("step_page_ops")
    if not isinstance(steps, list) or not steps or not all(isinstance(s, dict) for s in steps):
        return None
    if not any(k in steps[0] for k in keys):
        return None
    return [sum(s.get(k, 0) for k in keys) / 1e6 for s in steps]


def _warm(run: dict, per: list[float]) -> list[float]:
    return per[max(int(run.get("warmup", 0) or 0), 1):]  # as the warm step time: the steps after the warm-up


def page_call_ms(run: dict) -> tuple[float | None, float | None]:
    """Time inside the pool's page device calls (create, map with access rights, unmap, destroy)
    in the first step and, as a median, in the warm steps (after ``warmup``), in ms; None without
    the figures (PyTorch's allocators, older records)."""
    per = _page_call_ms_per_step(run)
    if per is None:
        return None, None
    warm = _warm(run, per)
    return per[0], (statistics.median(warm) if warm else None)


def gpu_wait_ms(run: dict) -> tuple[float | None, float | None]:
    """Time the pool waited for the GPU (``gpu_wait_ns``: events, a stream's queued work, the
    whole device before chunks were split) in the first step and, as a median, in the warm steps,
    in ms; None without the figures."""
    per = _page_call_ms_per_step(run, ("gpu_wait_ns",))
    if per is None:
        return None, None
    warm = _warm(run, per)
    return per[0], (statistics.median(warm) if warm else None)


def page_call_warm_sum_ms(run: dict) -> float | None:
    """The page calls' time summed over the warm steps, in ms: the bursts (a step that makes a
    plan, a new largest shape) that the warm median passes over; None without the figures or
    without a warm step."""
    per = _page_call_ms_per_step(run)
    warm = _warm(run, per) if per is not None else []
    return sum(warm) if warm else None


PROFILE_KEYS = ("wall_ms", "gpu_busy_ms", "gpu_idle_ms", "host_wait_ms", "host_waits", "host_api_ms")


def profile_text(rows: list[dict]) -> str:
    """One line per (workload, allocator) with a profiled step (``--profile-step``): wall, GPU
    busy, GPU idle and host-wait ms (and the waits' count), then the host's other CUDA API ms,
    medians over the repeats; "" when no run was profiled."""
    lines = []
    for r in rows:
        if r.get("profile_wall_ms") is None:
            continue
        vals = [r.get("profile_" + k) for k in PROFILE_KEYS]
        txt = " / ".join("-" if v is None else f"{v:.1f}" for v in vals[:4])
        n = "" if vals[4] is None else f" ({vals[4]:.0f})"
        api = "" if vals[5] is None else f", API {vals[5]:.1f}"
        lines.append(f"  {r['workload']:10s} {r['allocator']:30s} {txt}{n}{api}")
    return "\n".join(lines)


def _median_or_none(xs: list) -> float | None:
    xs = [x for x in xs if isinstance(x, (int, float))]
    return statistics.median(xs) if xs else None


def summarize(runs: list[dict], workloads: list[str], allocators: list[str]) -> list[dict]:
    """One row per (workload, allocator): medians over its successful runs, the spread of its peak
    memory over the repeats in %, and ratios against the better of PyTorch's two allocators (the
    faster for times, the smaller for each memory figure)."""
    rows = []
    for w in workloads:
        group, steps = {}, {}
        for a in allocators:
            rs = [r for r in runs if r.get("workload") == w and r.get("allocator") == a]
            good = [r for r in rs if ok(r)]
            row = {"workload": w, "allocator": a, "runs": len(good), "failed": len(rs) - len(good),
                   "failures": sorted({(r.get("error") or r.get("oom") or "no result")[:200]
                                       for r in rs if not ok(r)})}
            for m in MEASURES:
                xs = [r[m] for r in good if isinstance(r.get(m), (int, float))]
                row[m] = statistics.median(xs) if xs else None
            row["reserved_per_allocated"] = (row["peak_reserved"] / row["peak_allocated"]
                                             if row["peak_reserved"] and row["peak_allocated"] else None)
            row["spread_reserved_pct"] = _spread([r.get("peak_reserved") for r in good])
            row["spread_nvml_pct"] = _spread([r.get("nvml_peak") for r in good])
            row["spread_warm_pct"] = _spread([r.get("warm_ms") for r in good])
            row["warm_min_ms"], row["warm_total_min_ms"] = step_minimum(good)
            row["run_ms"] = _median_or_none([sum(r["step_ms"]) for r in good
                                             if isinstance(r.get("step_ms"), list) and r["step_ms"]])
            row["in_chunks_pct"] = _median_or_none([chunk_share(r) for r in good])
            plans = [c for c in (plan_counts(r) for r in sorted(good, key=lambda r: r.get("repeat", 0))) if c]
            row["plans"] = [list(c) for c in plans] if plans else None  # (made, dropped) per repeat
            row["pages_past_slack"] = _median_or_none([pages_past_slack(r) for r in good])
            calls = [page_call_ms(r) for r in good]
            row["page_calls_cold_ms"] = _median_or_none([c[0] for c in calls])
            row["page_calls_warm_ms"] = _median_or_none([c[1] for c in calls])
            row["page_calls_warm_sum_ms"] = _median_or_none([page_call_warm_sum_ms(r) for r in good])
            waits = [gpu_wait_ms(r) for r in good]
            row["gpu_wait_cold_ms"] = _median_or_none([x[0] for x in waits])
            row["gpu_wait_warm_ms"] = _median_or_none([x[1] for x in waits])
            for k in PROFILE_KEYS:  # --profile-step: the extra step under torch.profiler
                row["profile_" + k] = _median_or_none([(r.get("profile") or {}).get(k) for r in good])
            controls = control_medians(good)
            row["control_ms"] = statistics.median(controls) if controls else None
            row["spread_control_pct"] = _spread(controls)
            steps[a] = step_medians(good), (int(good[0].get("warmup", 0) or 0) if good else 0)
            group[a] = row
            rows.append(row)
        for a, row in group.items():  # step by step against PyTorch default's
            base = steps["default"][0] if "default" in steps and a != "default" else []
            ratio, faster, n = step_ratios(steps[a][0], base, steps[a][1])
            row["steps_vs_default"], row["steps_faster_than_default"], row["steps_compared"] = ratio, faster, n
        warm = {a: [r["warm_ms"] for r in runs if r.get("workload") == w and r.get("allocator") == a and ok(r)]
                for a in group}
        for a, row in group.items():
            for m in MEASURES + STEP_MEASURES + RUN_MEASURES:
                base = [group[b][m] for b in BASELINES if b in group and group[b][m]]
                row[m + "_vs_best"] = row[m] / min(base) if base and row[m] is not None else None
            ci = ratio_interval(warm[a], [warm[b] for b in BASELINES if b in warm])
            row["warm_ms_vs_best_ci"] = list(ci) if ci else None
        # The warm-step test applied to each of the three in turn: its median over the faster of
        # the other two's. Where two allocators run at one speed, the faster of two noisy medians
        # lies under either on average, so this shows how often PyTorch's own settings would fail
        # the test the runs' noise sets.
        trio = [a for a in TRIO if a in group and group[a]["warm_ms"]]
        for a in group:
            others = [group[b]["warm_ms"] for b in trio if b != a]
            group[a]["warm_ms_vs_others"] = (group[a]["warm_ms"] / min(others)
                                             if a in trio and len(trio) == len(TRIO) else None)
    return rows


def compare_checksums(runs: list[dict], workloads: list[str]) -> dict:
    """Per workload: ``equal`` when every successful run gave the same checksum; else which
    allocators disagree, and whether one allocator's own repeats already differ (then the
    workload is not deterministic, whatever the allocator)."""
    out = {}
    for w in workloads:
        good = [r for r in runs if r.get("workload") == w and ok(r)]
        if not good:
            out[w] = {"verdict": "no runs", "by_allocator": {}}
            continue
        by: dict[str, list[str]] = {}
        for r in good:
            by.setdefault(r["allocator"], []).append(checksum(r))
        distinct = {c for cs in by.values() for c in cs}
        within = sorted(a for a, cs in by.items() if len(set(cs)) > 1)
        if len(distinct) == 1:
            verdict = "equal"
        elif within:
            verdict = "different (also between repeats of " + ", ".join(within) + ": not deterministic)"
        else:
            ref_name = "default" if "default" in by else next(iter(by))
            odd = sorted(a for a, cs in by.items() if cs[0] != by[ref_name][0])
            repeated = all(len(cs) > 1 for cs in by.values())
            verdict = (f"different ({', '.join(odd)} differ from {ref_name}; "
                       + ("each allocator's repeats agree)" if repeated else "repeats not compared: one run each)"))
        nondet = sorted({t for r in good for t in r.get("nondeterministic_ops", [])})
        out[w] = {"verdict": verdict, "runs": len(good),
                  "by_allocator": {a: sorted(set(cs)) for a, cs in by.items()}, "nondeterministic_ops": nondet}
    return out


# The suite's targets for a vramkit pool, each as (name, the row's figure, passes when).
RESERVED_PER_ALLOCATED_GOAL = 1.03
SPREAD_GOAL_PCT = 1.0


def targets(rows: list[dict]) -> dict:
    """For every allocator other than PyTorch's two, which workloads meet each of the suite's
    targets: device memory (NVML peak) at or under the smaller of PyTorch default's and
    expandable_segments', reserved at most 1.03x allocated, the warm step at or under 1.00x the
    faster of the two, the first step no slower than PyTorch default's, the whole run (every step,
    the first included) at or under 1.00x the faster of the two, and repeats within 1 % on peak
    reserved. Returns {allocator: {target: {"met": [workloads], "not": [(workload, figure)]}}};
    a workload without the figures (failed runs, no baseline) counts as not met, with None."""
    by_key = {(r["workload"], r["allocator"]): r for r in rows}
    out: dict = {}
    for r in rows:
        a, w = r["allocator"], r["workload"]
        if a in BASELINES:
            continue
        d = by_key.get((w, "default"))
        cold_vs_default = (r["cold_ms"] / d["cold_ms"] if r.get("runs") and r.get("cold_ms") and d
                           and d.get("runs") and d.get("cold_ms") else None)
        checks = {
            "device memory <= PyTorch's smaller": (r.get("nvml_peak_vs_best"), lambda x: x <= 1.0),
            f"reserved <= {RESERVED_PER_ALLOCATED_GOAL:.2f}x allocated":
                (r.get("reserved_per_allocated"), lambda x: x <= RESERVED_PER_ALLOCATED_GOAL),
            "warm step <= 1.00x PyTorch's faster": (r.get("warm_ms_vs_best"), lambda x: x <= 1.0),
            "first step <= PyTorch default's": (cold_vs_default, lambda x: x <= 1.0),
            "whole run (every step) <= 1.00x PyTorch's faster": (r.get("run_ms_vs_best"), lambda x: x <= 1.0),
            f"repeats within {SPREAD_GOAL_PCT:.0f} % on peak reserved":
                (r.get("spread_reserved_pct") if (r.get("runs") or 0) >= 2 else None,
                 lambda x: x <= SPREAD_GOAL_PCT),
        }
        per = out.setdefault(a, {})
        for name, (x, good) in checks.items():
            t = per.setdefault(name, {"met": [], "not": []})
            if x is not None and r.get("runs") and good(x):
                t["met"].append(w)
            else:
                t["not"].append((w, x))
                if name.startswith("reserved") and r.get("pages_past_slack") is not None:
                    t.setdefault("past_slack", {})[w] = r["pages_past_slack"]
        # What the repeats can tell about the warm step: faster where the whole 90 % interval of
        # the ratio lies at or under 1.00, slower where it lies over, else not told apart.
        ci = r.get("warm_ms_vs_best_ci") if r.get("runs") else None
        t = per["warm step <= 1.00x PyTorch's faster"]
        sides = t.setdefault("interval", {"faster": [], "slower": [], "not told apart": []})
        if ci:
            sides["faster" if ci[1] <= 1.0 else "slower" if ci[0] > 1.0 else "not told apart"].append(w)
    return out


def targets_text(rows: list[dict]) -> str:
    """targets() as lines: per allocator and target, how many workloads meet it and the others' figures."""
    lines = []
    for a, per in targets(rows).items():
        lines.append(f"  {a}" + (" (the control: PyTorch default run again)" if a == CONTROL else ""))
        for name, t in per.items():
            n = len(t["met"]) + len(t["not"])
            unit = " %" if "%" in name else ""  # the spread is in %, the others are ratios
            past = t.get("past_slack", {})  # the reserved target: pages the pool created past its slack
            miss = ", ".join(f"{w} {'-' if x is None else f'{x:.3f}{unit}'}"
                             + (f" ({past[w]:,.0f} pages past the slack)" if w in past else "")
                             for w, x in t["not"])
            lines.append(f"    {name}: {len(t['met'])} of {n}" + (f" (not: {miss})" if miss else ""))
            if t.get("interval"):
                lines.append("      by the 90 % interval of the repeats: " + "; ".join(
                    f"{side} {len(ws)}" + (f" ({', '.join(ws)})" if ws else "") for side, ws in t["interval"].items()))
    return "\n".join(lines)


def _mib(x) -> str:
    return f"{x / MiB:,.0f}" if isinstance(x, (int, float)) else "-"


def _ms(x) -> str:
    return "-" if x is None else (f"{x:,.0f}" if x >= 100 else f"{x:.1f}")


def _ratio(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def _interval(ci) -> str:
    return "-" if not ci else f"{ci[0]:.2f}-{ci[1]:.2f}"


def _pct(x) -> str:
    return "-" if x is None else f"{x:.1f}"


def table(rows: list[dict]) -> str:
    head = ("| workload | allocator | runs | cold ms | warm ms | peak alloc MiB | peak reserved MiB | reserved/alloc "
            "| NVML peak MiB | warm x | cold x | reserved x | NVML x | spread reserved % | spread NVML % "
            "| spread warm % | warm x, 90 % interval | warm min x | warm total x | run ms | run x |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        runs = f"{r['runs']}" + (f" ({r['failed']} failed)" if r["failed"] else "")
        if not r["runs"]:
            lines.append(f"| {r['workload']} | {r['allocator']} | {runs} | "
                         + "; ".join(r["failures"])[:160].replace("|", "/") + " |" + " |" * 17)
            continue
        lines.append(
            f"| {r['workload']} | {r['allocator']} | {runs} | {_ms(r['cold_ms'])} | {_ms(r['warm_ms'])} | "
            f"{_mib(r['peak_allocated'])} | {_mib(r['peak_reserved'])} | {_ratio(r['reserved_per_allocated'])} | "
            f"{_mib(r['nvml_peak'])} | {_ratio(r['warm_ms_vs_best'])} | {_ratio(r['cold_ms_vs_best'])} | "
            f"{_ratio(r['peak_reserved_vs_best'])} | {_ratio(r['nvml_peak_vs_best'])} | "
            f"{_pct(r['spread_reserved_pct'])} | {_pct(r['spread_nvml_pct'])} | {_pct(r['spread_warm_pct'])} | "
            f"{_interval(r.get('warm_ms_vs_best_ci'))} | "
            f"{_ratio(r['warm_min_ms_vs_best'])} | {_ratio(r['warm_total_min_ms_vs_best'])} | "
            f"{_ms(r['run_ms'])} | {_ratio(r['run_ms_vs_best'])} |")
    return "\n".join(lines)
