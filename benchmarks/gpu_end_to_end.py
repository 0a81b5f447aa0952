"""vramkit's end-to-end suite: real PyTorch workloads under vramkit and under PyTorch's allocator.

    python3 benchmarks/gpu_end_to_end.py [--workloads gpt2,resnet50,...] [--allocators default,expandable,vramkit]
                                         [--steps 30] [--warmup 2] [--repeat 3] [--json results.json]
                                         [--timeout 150] [--vramkit-conf growth_slack:0.05] [--quick] [--dry-run]

Workloads (models built offline from configs, random weights, fixed seeds; see benchmarks/e2e/workloads.py):
  gpt2       GPT-2 small training, static shapes        resnet50   ResNet-50 training, static shapes
  bert       BERT-base inference, random batch x length t5         T5-base training, random lengths
  moe        Mixtral-style MoE training, routing sizes  vit        ViT-B/16 training, random batch
  llama_gen  Llama-style greedy generation, growing KV cache, random batch x prompt

Allocators: ``default`` (PyTorch's caching allocator), ``expandable``
(``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``), ``vramkit`` (``vramkit.torch.use()`` first,
with ``--vramkit-conf`` passed to it as options), ``vramkit-8mib`` (the same with 8 MiB pages),
``vramkit-cuda`` (the same pool over cudaMalloc segments: no mapped pages),
``vramkit@KEY:VALUE+KEY:VALUE`` (the pool with those options, e.g. ``vramkit@map_ahead:256MiB``; with
``plan_steps`` on, the pool's default, the child marks each step at its top, or, with
``+mark_steps:optimizer``, leaves the marks to the optimizer's steps as a training loop that calls only ``use()`` gets them) and
``vramkit-tracking`` (vramkit plus leak
tracking with Python call sites, for the cost of tracking). ``default-again`` is PyTorch's default
allocator once more under a third name, judged by the suite's targets as vramkit is: a control, an
allocator as fast as PyTorch default by construction, that shows how often the runs' noise alone
fails each target.

Every (workload, allocator, repeat) runs in a fresh process; within each repeat the allocators of a
workload run back to back, in an order rotated from repeat to repeat. Each run times every step
(CUDA-synchronized wall time, inputs made before the clock starts): the first step is the cold one,
the median of the steps after ``--warmup`` the warm one. Peak allocated/reserved come from the
allocator (``torch.cuda.max_memory_*``; ``vramkit.max_memory_*`` under vramkit); the NVML peak is
the device memory the process really took, sampled every 0.5 ms from this (parent) process. Each
step's loss or output sums and the final parameters' sums make a checksum that must be equal
between allocators (deterministic algorithms, fixed seeds). The table shows medians over the
repeats, ratios against the better of ``default``/``expandable`` and the spread of peak memory
over the repeats; ``--json`` keeps every raw number.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e import hostspeed, report  # noqa: E402
from e2e.child import PROFILE_ENV, RESULT_PREFIX, is_vramkit, parse_vramkit_conf, variant_options  # noqa: E402
from e2e.cpus import format_cpu_list, gpu_local_cpus, plan_cpus  # noqa: E402
from e2e.workloads import WORKLOADS  # noqa: E402

ALLOCATORS = ("default", "expandable", "vramkit", "vramkit-tracking", "vramkit-8mib", "vramkit-cuda",
              report.CONTROL)
DEFAULT_ALLOCATORS = "default,expandable,vramkit"


def child_env(alloc: str, deterministic: bool) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    if deterministic:
        env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # what deterministic cuBLAS needs
    # Each allocator gets exactly its own setting, whatever the calling shell has set.
    env.pop("PYTORCH_ALLOC_CONF", None)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if alloc == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    return env


def unique(names: list[str]) -> list[str]:
    return list(dict.fromkeys(names))


def plan(a) -> list[tuple[int, str, str]]:
    """(repeat, workload, allocator) in run order: repeat by repeat, workload by workload, the
    allocators rotated by one place each repeat so none always runs first."""
    out = []
    for rep in range(a.repeat):
        k = rep % len(a.allocators)
        order = a.allocators[k:] + a.allocators[:k]
        out += [(rep, w, al) for w in a.workloads for al in order]
    return out


class Launcher:
    """Starts run processes: fresh interpreters (``--spawn fresh``), or forks of a zygote per
    allocator environment that has imported torch and the model libraries (``--spawn fork``,
    see e2e/zygote.py); either way each run is a new process with a new CUDA context."""

    def __init__(self, a, tmpdir: str):
        self.a, self.tmpdir, self.zygotes, self.mode = a, tmpdir, {}, a.spawn

    def prepare(self, env: dict):
        """The zygote for this environment, started (outside any measurement) if need be."""
        if self.mode != "fork":
            return None
        key = env.get("PYTORCH_CUDA_ALLOC_CONF", "")
        z = self.zygotes.get(key)
        if z is not None and z.alive():
            return z
        from e2e.zygote import Zygote
        log = os.path.join(self.tmpdir, f"zygote-{len(self.zygotes)}.log")
        try:
            z = self.zygotes[key] = Zygote(os.path.abspath(__file__), self.a.workloads, env, log)
        except Exception as e:  # noqa: BLE001 - fall back to fresh interpreters, slower but sure
            print(f"fork mode unavailable ({e}); running fresh interpreters", file=sys.stderr)
            self.mode = "fresh"
            return None
        return z

    def run(self, argv: list[str], env: dict, on_pid) -> tuple:
        """Returns (rc, stdout, stderr, timed_out)."""
        z = self.prepare(env)
        if z is not None:
            out_path = os.path.join(self.tmpdir, "run.out")
            err_path = os.path.join(self.tmpdir, "run.err")
            rc, timed_out = z.run(argv, out_path, err_path, self.a.timeout, on_pid)
            with open(out_path, errors="replace") as f:
                out = f.read()
            with open(err_path, errors="replace") as f:
                err = f.read()
            return rc, out, err, timed_out
        p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child"] + argv, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
        on_pid(p.pid)
        try:
            out, err = p.communicate(timeout=self.a.timeout)
            return p.returncode, out, err, False
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)  # the child's own process group, made for it above
            out, err = p.communicate()
            return p.returncode, out, err, True

    def close(self) -> None:
        for z in self.zygotes.values():
            z.close()


def run_child(rep: int, w: str, alloc: str, a, launcher: Launcher, sampler, floor: int | None,
              check_expandable: bool) -> dict:
    snap = ""
    if a.snapshot and alloc == "default":
        snap = os.path.join(a.snapshot, f"{w}-default.pickle" if rep == 0 else f"{w}-default-{rep}.pickle")
    argv = [w, alloc, str(a.steps), str(a.warmup), str(a.seed), a.determinism, a.vramkit_conf,
            snap, "1" if check_expandable else "0", a.run_cpus]
    env = child_env(alloc, a.determinism != "off")
    rec: dict = {"workload": w, "allocator": alloc, "repeat": rep}
    try:  # the host's load when the run starts: another cause of slow runs
        rec["loadavg_1m"] = os.getloadavg()[0]
    except OSError:
        pass
    holder: dict = {}
    rc, out, err = None, "", ""
    try:
        launcher.prepare(env)
        if sampler is not None:
            if floor is not None:
                sampler.settle(floor)
            sampler.start(lambda: holder.get("pid"))
        t0 = time.perf_counter()
        try:
            rc, out, err, timed_out = launcher.run(argv, env, lambda pid: holder.__setitem__("pid", pid))
            if timed_out:
                rec["error"] = f"timed out after {a.timeout:g} s"
        except Exception as e:  # noqa: BLE001 - reported as this run's failure; the suite goes on
            rec["error"] = f"could not run the child: {type(e).__name__}: {e}"
        rec["process_s"] = time.perf_counter() - t0
    finally:
        if sampler is not None and sampler.running():
            rec.update(sampler.stop())
    rec["rc"] = rc
    rec["pid"] = holder.get("pid")
    rec["spawn"] = launcher.mode
    lines = [ln[len(RESULT_PREFIX):] for ln in out.splitlines() if ln.startswith(RESULT_PREFIX)]
    if lines:
        got = json.loads(lines[-1])
        got.update({k: v for k, v in rec.items() if k not in got or k == "error"})
        rec = got
    elif "error" not in rec:
        tail = [ln for ln in err.strip().splitlines() if ln.strip()]
        rec["error"] = f"rc {rc}: " + (tail[-1][:400] if tail else "no output")
    if rc != 0 or "error" in rec:
        rec["stderr_tail"] = err[-3000:]
    return rec


def describe(r: dict) -> str:
    if "error" in r:
        return "FAILED " + r["error"]
    if "oom" in r:
        return "OUT OF MEMORY " + r["oom"]
    nv = f", NVML {r['nvml_peak'] / report.MiB:,.0f} MiB" if isinstance(r.get("nvml_peak"), int) else ""
    return (f"warm {r['warm_ms']:.1f} ms, cold {r['cold_ms']:.0f} ms, reserved "
            f"{r['peak_reserved'] / report.MiB:,.0f} MiB{nv}")


def write_json(path: str, doc: dict) -> None:
    # Whole file or nothing: written beside the target, then renamed over it.
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".e2e-", suffix=".json", dir=d)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--zygote", help=argparse.SUPPRESS)
    ap.add_argument("--workloads", "--models", dest="workloads", default=",".join(WORKLOADS),
                    help="comma-separated, from: " + ",".join(WORKLOADS) + " (default: all)")
    ap.add_argument("--allocators", default=DEFAULT_ALLOCATORS,
                    help=f"comma-separated, from: {','.join(ALLOCATORS)} (default: {DEFAULT_ALLOCATORS})")
    ap.add_argument("--steps", type=int, help="steps per run, the cold one included (default 30; 6 with --quick)")
    ap.add_argument("--warmup", type=int, default=2,
                    help="leading steps left out of the warm median (default 2; the first is the cold step)")
    ap.add_argument("--repeat", type=int, help="fresh processes per (workload, allocator) (default 3; 1 with --quick)")
    ap.add_argument("--seed", type=int, default=0, help="seed of weights, shapes and data (default 0)")
    ap.add_argument("--timeout", type=float, default=150.0, help="seconds one child may take (default 150)")
    ap.add_argument("--json", metavar="PATH", help="write every raw number and the summary here (rewritten "
                    "after each run, so an interrupted suite keeps what it measured)")
    ap.add_argument("--out", metavar="PATH", help="also append one JSON line per run to this file")
    ap.add_argument("--vramkit-conf", default="", metavar="CONF",
                    help="pool options for vramkit.torch.use(), VRAMKIT_ALLOC_CONF syntax: "
                         "'growth_slack:0.05,upstream=cuda' (default: none, the default pool)")
    ap.add_argument("--determinism", choices=("strict", "warn", "off"), default="strict",
                    help="torch.use_deterministic_algorithms: 'strict' (default: deterministic kernels, flash "
                         "attention's backward included; an op without one fails the run), 'warn' (warn_only=True: "
                         "such ops run anyway, and flash attention's backward is not deterministic), 'off'")
    ap.add_argument("--nvml-interval-ms", type=float, default=0.5, help="NVML sampling period (default 0.5)")
    ap.add_argument("--snapshot", metavar="DIR",
                    help="record PyTorch's allocation history of the 'default' runs into DIR/WORKLOAD-default.pickle "
                         "(slows them: their step times do not compare)")
    ap.add_argument("--spawn", choices=("fork", "fresh"), default="fork",
                    help="how run processes start: forked from a zygote that imported torch and the model "
                         "libraries once (default), or fresh interpreters that import everything each run")
    ap.add_argument("--cpus", default="all", metavar="all|auto|LIST",
                    help="where the runs execute: 'all' (default: where the scheduler puts them), 'auto' (pinned to "
                         "the GPU's CPUs, less one core left to this process and its NVML sampler), or a CPU list "
                         "such as 2-7 (e2e/cpus.py)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 6 steps, one repeat (unless given)")
    ap.add_argument("--profile-step", type=int, default=0, metavar="N",
                    help="after the timed steps, run step N's inputs once more under torch.profiler and report "
                         "the GPU's busy and idle time in it and the host's waits (e2e/profile.py; default 0: off)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and exit (needs no GPU, no torch)")
    a = ap.parse_args(argv)
    if a.child or a.zygote:
        return a
    a.workloads = [w.strip() for w in a.workloads.split(",") if w.strip()]
    a.allocators = [x.strip() for x in a.allocators.split(",") if x.strip()]
    bad = [w for w in a.workloads if w not in WORKLOADS]
    if bad or not a.workloads:
        ap.error(f"unknown workload {bad[0]!r} (known: {', '.join(WORKLOADS)})" if bad else "no workload given")
    bad = [x for x in a.allocators if x not in ALLOCATORS and not is_vramkit(x)]
    if bad or not a.allocators:
        ap.error(f"unknown allocator {bad[0]!r} (known: {', '.join(ALLOCATORS)}, or vramkit@KEY:VALUE+KEY:VALUE)"
                 if bad else "no allocator given")
    for x in a.allocators:
        try:
            variant_options(x)
        except ValueError as e:
            ap.error(f"allocator {x!r}: {e}")
    a.steps = a.steps if a.steps is not None else (6 if a.quick else 30)
    a.repeat = a.repeat if a.repeat is not None else (1 if a.quick else 3)
    if a.warmup < 1:
        ap.error("--warmup must be at least 1 (the first step is the cold one)")
    if a.steps <= a.warmup:
        ap.error(f"--steps ({a.steps}) must be greater than --warmup ({a.warmup})")
    if a.repeat < 1:
        ap.error("--repeat must be at least 1")
    if not 0 <= a.profile_step <= a.steps:
        ap.error(f"--profile-step must be between 1 and --steps ({a.steps}), or 0 for none")
    if not a.timeout > 0:
        ap.error("--timeout must be positive")
    if not 0.05 <= a.nvml_interval_ms <= 1000:
        ap.error("--nvml-interval-ms must be between 0.05 and 1000")
    try:
        parse_vramkit_conf(a.vramkit_conf)
    except ValueError as e:
        ap.error(str(e))
    if a.vramkit_conf and not any(x.startswith("vramkit") for x in a.allocators):
        ap.error("--vramkit-conf given but no vramkit allocator is run")
    if a.snapshot and "default" not in a.allocators:
        ap.error("--snapshot records the 'default' runs: add 'default' to --allocators")
    if a.cpus not in ("auto", "all"):
        from e2e.cpus import parse_cpu_list
        try:
            parse_cpu_list(a.cpus)
        except ValueError as e:
            ap.error(f"--cpus: {e}")
    if a.json and not os.path.isdir(os.path.dirname(os.path.abspath(a.json))):
        ap.error(f"--json {a.json}: no such directory")
    return a


def place_processes(spec: str, sampler) -> dict:
    """Pins this process (and so its sampler thread and the zygotes it starts) per --cpus; returns
    the plan, whose "runs" each run process pins itself to (e2e/cpus.py)."""
    allowed = sorted(os.sched_getaffinity(0))
    local = gpu_local_cpus(sampler.pci_bus_id()) if sampler is not None else None
    placement = plan_cpus(spec, allowed, local)
    if placement["parent"]:
        os.sched_setaffinity(0, placement["parent"])
    return placement


def print_plan(a, runs) -> None:
    print(f"{len(runs)} runs, each a new process: {len(a.workloads)} workloads x {len(a.allocators)} allocators x "
          f"{a.repeat} repeats; {a.steps} steps each (cold = step 1, warm = median of steps {a.warmup + 1}-{a.steps}), "
          f"seed {a.seed}, determinism {a.determinism}, spawn {a.spawn}, timeout {a.timeout:g} s")
    for w in unique(a.workloads):
        wl = WORKLOADS[w]
        print(f"  {w:10s} {wl.mode:5s} {wl.shapes:7s} {wl.summary}")
    for al in unique(a.allocators):
        env = child_env(al, a.determinism != "off")
        if al == "default":
            how = "PyTorch's caching allocator"
        elif al == report.CONTROL:
            how = "PyTorch's caching allocator again (the control: judged by the targets as vramkit is)"
        elif al == "expandable":
            how = f"PYTORCH_CUDA_ALLOC_CONF={env.get('PYTORCH_CUDA_ALLOC_CONF')}"
        else:
            opts = {**parse_vramkit_conf(a.vramkit_conf), **variant_options(al)}
            how = "vramkit.torch.use(" + ", ".join(f"{k}={v!r}" for k, v in opts.items()) + ")"
            if al == "vramkit-tracking":
                how += " + leak tracking with Python call sites"
        print(f"  {al:16s} {how}")
    if a.profile_step:
        print(f"then step {a.profile_step}'s inputs once more in each run, under torch.profiler (not timed with the steps)")
    print("order:")
    for i, (rep, w, al) in enumerate(runs, 1):
        print(f"  {i:3d}. repeat {rep + 1}  {w:10s} {al}")


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.child:
        from e2e import child
        rc = child.main(a.child)
        # Straight out: the interpreter's teardown (modules, CUDA objects) adds a second or more
        # to every run and measures nothing.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    if a.zygote:
        from e2e import zygote
        return zygote.serve(a.zygote.split(","))
    runs = plan(a)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `... | head` ends the output quietly
    if a.dry_run:
        print_plan(a, runs)
        return 0
    if a.snapshot:
        os.makedirs(a.snapshot, exist_ok=True)
    stamp = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    sampler, nvml_note, floor = None, "", None
    try:
        from e2e.nvml import NvmlSampler
        sampler = NvmlSampler(interval=a.nvml_interval_ms / 1e3)
        floor = sampler.used()
    except Exception as e:  # noqa: BLE001 - NVML is optional: the allocators' own figures remain
        nvml_note = f"NVML unavailable ({type(e).__name__}: {str(e)[:120]}): no NVML column"
        print(nvml_note, file=sys.stderr)
    try:
        placement = place_processes(a.cpus, sampler)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    a.run_cpus = format_cpu_list(placement["runs"]) if placement["runs"] else ""
    # The children (and the zygotes they fork from) read it from their environment.
    os.environ[PROFILE_ENV] = str(a.profile_step)
    print(placement["note"], file=sys.stderr)
    meta = {"date": stamp, "spawn": a.spawn, "profile_step": a.profile_step, "argv": sys.argv[1:] if argv is None else argv, "steps": a.steps, "warmup": a.warmup,
            "repeat": a.repeat, "seed": a.seed, "determinism": a.determinism, "vramkit_conf": a.vramkit_conf,
            "workloads": a.workloads, "allocators": a.allocators, "nvml_device": getattr(sampler, "name", None),
            "nvml_interval_ms": a.nvml_interval_ms, "nvml_floor": floor, "cpus": a.cpus,
            "run_cpus": placement["runs"], "parent_cpus": placement["parent"], "cpu_note": placement["note"]}
    records: list[dict] = []
    t_suite = time.perf_counter()

    def document(final: bool) -> dict:
        rows = report.summarize(records, unique(a.workloads), unique(a.allocators))
        meta["wall_s"] = time.perf_counter() - t_suite
        meta["complete"] = final
        return {"meta": meta, "summary": rows, "checksums": report.compare_checksums(records, unique(a.workloads)),
                "runs": records}

    tmpdir = tempfile.mkdtemp(prefix="vramkit-e2e-")
    launcher = Launcher(a, tmpdir)
    checked = False
    try:
        for i, (rep, w, al) in enumerate(runs, 1):
            check = al == "expandable" and not checked
            checked = checked or check
            r = run_child(rep, w, al, a, launcher, sampler, floor, check)
            r["order"] = i
            records.append(r)
            if a.out:
                with open(a.out, "a") as f:
                    f.write(json.dumps(r) + "\n")
            if a.json:
                write_json(a.json, document(False))
            el = time.perf_counter() - t_suite
            eta = el / i * (len(runs) - i)
            print(f"[{i:3d}/{len(runs)} {el / 60:4.1f} min, ~{eta / 60:.1f} left] r{rep + 1} {w:10s} {al:16s} "
                  f"{describe(r)}  ({r['process_s']:.1f} s)", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print("interrupted: reporting the runs made so far", file=sys.stderr)
    finally:
        launcher.close()
        if sampler is not None:
            sampler.close()
        shutil.rmtree(tmpdir, ignore_errors=True)
    doc = document(len(records) == len(runs))
    if a.json:
        write_json(a.json, doc)

    first = next((r for r in records if report.ok(r)), {})
    print(f"\n{stamp}  {first.get('device', '?')}  torch {first.get('torch', '?')}  transformers "
          f"{next((r['transformers'] for r in records if r.get('transformers')), '-')}  "
          f"{a.steps} steps (warm: median of steps {a.warmup + 1}-{a.steps}), medians over {a.repeat} "
          f"repeat(s), {meta['wall_s'] / 60:.1f} min")
    print("ratios (x) against the better of default/expandable: the faster for times, the smaller for memory")
    print(report.table(doc["summary"]))
    print("\nresults equal across allocators (per-step losses/outputs and final parameters):")
    for w, c in doc["checksums"].items():
        extra = f"; nondeterministic ops warned: {'; '.join(c['nondeterministic_ops'])[:300]}" \
            if c.get("nondeterministic_ops") and c["verdict"] != "equal" else ""
        print(f"  {w:10s} {c['verdict']}{extra}")
    failed = [r for r in records if not report.ok(r)]
    for r in failed:
        print(f"  FAILED r{r.get('repeat', 0) + 1} {r['workload']} {r['allocator']}: "
              f"{r.get('error') or 'out of memory: ' + r.get('oom', '?')}")
    wrong = [r for r in records if r.get("allocator") == "expandable" and r.get("expandable_segments") is False]
    if wrong:
        print(f"  WARNING: {len(wrong)} 'expandable' run(s) show no expandable segment: the setting did not take")
    if nvml_note:
        print("  " + nvml_note)
    verdict = report.targets_text(doc["summary"])
    if verdict:  # spread figures in %, the others as ratios
        print("\nthe suite's targets, workloads meeting each (not met: the figure):\n" + verdict)
    rows = {(r["workload"], r["allocator"]): r for r in doc["summary"]}
    shares = [(r["workload"], r["allocator"], r["in_chunks_pct"]) for r in doc["summary"]
              if r.get("in_chunks_pct") is not None]
    if shares:  # kernels streaming over 2 MiB handles run slower than over large ones (BENCHMARKS 5)
        print("\nvramkit pools' mapped pages in chunks at the end of a run (median %): "
              + ", ".join(f"{w} {al} {x:.0f}" for w, al, x in shares))
    plans = [r for r in doc["summary"] if r.get("plans")]
    if plans:  # a plan dropped and made again moves the step's pages each time
        print("\nvramkit pools' step plans made / dropped, each repeat: " + ", ".join(
            f"{r['workload']} {r['allocator']} " + " ".join(f"{m}/{d}" for m, d in r["plans"]) for r in plans))
    calls = [r for r in doc["summary"] if r.get("page_calls_cold_ms") is not None]
    if calls:  # what the driver's page calls cost inside the steps (median over the repeats)
        print("\nvramkit pools' time in page calls (create, map, unmap, destroy), first step / warm step median"
              " / all warm steps, ms:")
        for r in calls:
            warm, total = r.get("page_calls_warm_ms"), r.get("page_calls_warm_sum_ms")
            line = (f"  {r['workload']:10s} {r['allocator']:30s} {r['page_calls_cold_ms']:8.1f} / "
                    + ("-" if warm is None else f"{warm:.2f}") + " / " + ("-" if total is None else f"{total:.0f}"))
            if r.get("cold_ms") and r.get("warm_ms"):
                line += f"   (steps: cold {r['cold_ms']:.0f} ms, warm {r['warm_ms']:.1f} ms)"
            print(line)
    noise = report.noise_text(doc["summary"])
    if noise:  # how often the warm test fails an allocator against two of equal speed
        print("\nthe warm-step test applied to each allocator in turn: its median warm step over the faster of the"
              " other two's\n" + noise)
    steps = report.steps_text(doc["summary"])
    if steps:  # a steady lead smaller than the runs' spread shows here
        print("\neach warm step against PyTorch default's (medians over the repeats of each step): the median "
              "ratio, and the steps faster than PyTorch default's\n" + steps)
    controls = report.control_text(doc["summary"])
    if controls:  # how far the host's speed moved between runs
        print(f"\nthe host-speed control ({hostspeed.CONTROL_OPS} in-place adds on a CPU tensor after each step), "
              "median over each run's steps, then over the runs\n" + controls)
    profiled = report.profile_text(doc["summary"])
    if profiled:
        print(f"\nstep {a.profile_step} once more under torch.profiler (after the timed steps; medians over the "
              "repeats, ms): wall, GPU busy (kernels, copies, fills; overlaps once), GPU idle, host waiting in "
              "synchronize calls (count), host in other CUDA runtime/driver calls (API; the JSON's host_top names "
              "the costliest host events)\n" + profiled)
    for w in unique(a.workloads):
        v, t = rows.get((w, "vramkit")), rows.get((w, "vramkit-tracking"))
        if v and t and v["warm_ms"] and t["warm_ms"]:
            print(f"  {w}: leak tracking with call sites costs {100 * (t['warm_ms'] / v['warm_ms'] - 1):+.1f}% "
                  f"warm step time over vramkit ({t['warm_ms']:.1f} vs {v['warm_ms']:.1f} ms)")
    return 0 if records and not failed and len(records) == len(runs) else 1


if __name__ == "__main__":
    sys.exit(main())
