"""One run of one workload under one allocator, in a process of its own.

The allocator is chosen before PyTorch touches CUDA: ``vramkit.torch.use()`` first for vramkit,
``PYTORCH_CUDA_ALLOC_CONF`` in the environment (set by the parent) for PyTorch's own. The result
is one JSON line on stdout, prefixed with ``RESULT_PREFIX``.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
import traceback
import warnings

from e2e.cpus import current_cpu, format_cpu_list, host_clocks, parse_cpu_list

RESULT_PREFIX = "E2E-RESULT "
NAMED_VRAMKIT = ("vramkit", "vramkit-tracking", "vramkit-8mib", "vramkit-cuda")
# vramkit-8mib: 8 MiB pages (one driver handle each) instead of 2 MiB: a quarter of the map calls.
# vramkit-cuda: the same pool over cudaMalloc segments instead of mapped pages (no page moves, no
# VMM): what the hooks and the pool cost without the page device.
# vramkit@KEY:VALUE+KEY:VALUE: the pool with those options (VRAMKIT_ALLOC_CONF keys), e.g.
# vramkit@map_ahead:256MiB or vramkit@growth_slack:0.05, to set variants side by side.


PROFILE_ENV = "VRAMKIT_E2E_PROFILE_STEP"  # set by gpu_end_to_end.py --profile-step


def is_vramkit(alloc: str) -> bool:
    return alloc in NAMED_VRAMKIT or (alloc.startswith("vramkit@") and len(alloc) > len("vramkit@"))


def variant_options(alloc: str) -> dict:
    """The pool options an allocator name implies (before --vramkit-conf's). ValueError when malformed."""
    if alloc == "vramkit-8mib":
        return {"page_size": PAGE_8MIB}
    if alloc == "vramkit-cuda":
        return {"upstream": "cuda"}
    if alloc.startswith("vramkit@"):
        return parse_vramkit_conf(alloc[len("vramkit@"):].replace("+", ","))
    return {}
PAGE_8MIB = "8MiB"


def parse_vramkit_conf(text: str) -> dict:
    """``"growth_slack:0.05,upstream=cuda"`` -> ``{"growth_slack": "0.05", "upstream": "cuda"}``
    (the ``VRAMKIT_ALLOC_CONF`` syntax), for ``vramkit.torch.use(**options)``. ValueError when malformed."""
    out: dict = {}
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        if item.startswith("upstream="):
            key, value = "upstream", item[len("upstream="):]
        elif ":" in item:
            key, value = item.split(":", 1)
        else:
            raise ValueError(f"--vramkit-conf item {item!r} is not KEY:VALUE (or upstream=KIND)")
        key, value = key.strip(), value.strip()
        if not key or not value or ":" in value or "=" in key:
            raise ValueError(f"--vramkit-conf item {item!r} is not KEY:VALUE (or upstream=KIND)")
        if key in out:
            raise ValueError(f"--vramkit-conf sets {key!r} twice")
        out[key] = value
    return out


class _Warnings:
    """Collects warnings (first line, count) instead of printing them: the nondeterministic-op
    alerts of ``use_deterministic_algorithms(warn_only=True)`` explain checksum differences."""

    def __init__(self):
        self.seen: dict[str, int] = {}
        warnings.showwarning = self.show

    def show(self, message, category, filename, lineno, file=None, line=None):
        text = f"{category.__name__}: {str(message).strip().splitlines()[0][:240]}" if str(message).strip() \
            else category.__name__
        self.seen[text] = self.seen.get(text, 0) + 1

    def summary(self) -> dict:
        nondet = [t for t in self.seen if "determinis" in t]
        return {"nondeterministic_ops": nondet[:20], "warnings": list(self.seen)[:20]}


def _tracking_summary(tracker, hook_calls0: int) -> dict:
    """What leak tracking with call sites saw: counts, frame walks, sites in the event history."""
    from vramkit import _vramkit
    out = dict(_vramkit.tracking_counts(tracker))
    out["hook_calls"] = _vramkit.site_hook_calls() - hook_calls0
    ev = [e for e in _vramkit.tracked_events(tracker) if e[0] == "alloc"]
    out["history_allocs"] = len(ev)
    out["history_allocs_with_site"] = sum(1 for e in ev if e[5])
    out["sites"] = len({e[5] for e in ev if e[5]})
    return out


def _numbers(d: dict, keys=None) -> dict:
    return {k: v for k, v in d.items() if (keys is None or k in keys) and isinstance(v, (int, float))
            and not isinstance(v, bool)}


PAGE_OP_KEYS = ("pages_created", "pages_mapped", "pages_unmapped", "map_calls", "pages_remapped",
                "mappings_reused", "pages_destroyed", "pages_made_ahead", "pages_ahead_used",
                "pages_taken_early", "early_waits", "pages_past_slack", "plans_made", "plans_dropped",
                "plans_skipped", "plan_placed", "plan_missed",
                "page_create_ns", "page_map_ns", "page_unmap_ns", "page_destroy_ns", "gpu_wait_ns")


def _page_op_reader(alloc: str):
    """A function giving the pool's page-operation counters now, or None (not vramkit, no pool)."""
    if not is_vramkit(alloc):
        return None
    from vramkit import _vramkit
    r = _vramkit.current_resource(None)
    if not r.pool_counters():
        return None

    def read() -> dict:
        c = r.pool_counters()
        return {k: int(c[k]) for k in PAGE_OP_KEYS if k in c}
    return read


def _allocator_stats(torch, alloc: str, check_expandable: bool) -> dict:
    out: dict = {}
    if is_vramkit(alloc):
        import vramkit
        out["peak_allocated"] = vramkit.max_memory_allocated()
        out["peak_reserved"] = vramkit.max_memory_reserved()
        out["stats_source"] = "vramkit"
        st = vramkit.memory_stats()
        out["allocator_stats"] = _numbers(st, None)
        from vramkit import _vramkit
        usage = _vramkit.current_resource(None).pool_page_usage()
        if usage:  # where the pool's memory lies at the end: how much of it in chunks (large handles)
            out["pool_pages"] = {k: int(v) for k, v in usage.items()}
        try:  # through vramkit's PyTorch hooks, when they are loaded; a bare pluggable allocator raises
            out["torch_peak_allocated"] = torch.cuda.max_memory_allocated()
            out["torch_peak_reserved"] = torch.cuda.max_memory_reserved()
        except Exception as e:  # noqa: BLE001 - any failure only means "not available"
            out["torch_stats_error"] = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        return out
    out["peak_allocated"] = torch.cuda.max_memory_allocated()
    out["peak_reserved"] = torch.cuda.max_memory_reserved()
    out["stats_source"] = "torch.cuda"
    st = torch.cuda.memory_stats()
    out["allocator_stats"] = _numbers(st, ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free",
                                           "num_sync_all_streams", "allocation.all.allocated",
                                           "segment.all.peak", "inactive_split_bytes.all.peak"))
    if not check_expandable:
        return out
    # Did PYTORCH_CUDA_ALLOC_CONF take effect? Expandable segments say so in the snapshot, which
    # took ~4 s on the H200 machine: the parent asks for it once per suite, not every run.
    try:
        segs = torch.cuda.memory_snapshot()
        flags = [s["is_expandable"] for s in segs if "is_expandable" in s]
        out["expandable_segments"] = any(flags) if flags else None
        out["segments"] = len(segs)
    except Exception:  # noqa: BLE001
        pass
    return out


def run(workload: str, alloc: str, steps: int, warmup: int, seed: int, vramkit_conf: str,
        determinism: str, snapshot: str = "", check_expandable: bool = False, cpus: str = "") -> dict:
    t_start = time.perf_counter()
    if cpus:  # before CUDA and PyTorch start their threads, which inherit it
        os.sched_setaffinity(0, parse_cpu_list(cpus))
    res: dict = {"workload": workload, "allocator": alloc, "steps": steps, "warmup": warmup, "seed": seed,
                 "determinism": determinism, "pid": os.getpid(), "cpus": format_cpu_list(os.sched_getaffinity(0))}
    if determinism not in ("strict", "warn", "off"):
        raise SystemExit(f"unknown determinism {determinism!r} (strict, warn, off)")
    caught = _Warnings()
    tracking = None
    mark_step = None
    if is_vramkit(alloc):
        import vramkit
        import vramkit.torch
        options = parse_vramkit_conf(vramkit_conf)
        for k, v in variant_options(alloc).items():
            options.setdefault(k, v)
        # With plan_steps the child marks each step itself (every workload, inference too), unless
        # the variant says mark_steps:optimizer: then only the optimizer's steps mark, as in a user's
        # training loop that calls nothing but use().
        marks = options.pop("mark_steps", "manual")
        vramkit.torch.use(mark_steps=marks, **options)  # first: before PyTorch initializes CUDA
        # plan_steps as the pool reads it: its defaults, then VRAMKIT_ALLOC_CONF, then the variant
        from vramkit._pool_conf import plans_steps
        if marks == "manual" and plans_steps(os.environ.get("VRAMKIT_ALLOC_CONF", "") + ","
                                             + vramkit.torch.pool_conf(**options)):
            mark_step = vramkit.torch.mark_step  # each step begins there (its time counts in the step's)
        res["vramkit_conf"] = vramkit.torch.pool_conf(**options) or os.environ.get("VRAMKIT_ALLOC_CONF", "")
        res["vramkit_version"] = getattr(vramkit, "__version__", "?")
        if alloc == "vramkit-tracking":
            from vramkit import _vramkit
            from vramkit.leaks import _tracking
            hook_calls0 = _vramkit.site_hook_calls()
            tracking = _tracking.acquire(None, python_stacks=True)  # (device, tracker), until the end
    elif alloc not in ("default", "expandable", "default-again"):
        raise SystemExit(f"unknown allocator {alloc!r}")
    res["alloc_conf"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")

    import torch
    from e2e import hostspeed
    from e2e.workloads import WORKLOADS
    res["import_s"] = time.perf_counter() - t_start
    res["torch"] = torch.__version__
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    # cuDNN's benchmark mode picks algorithms by timing them, run to run differently: off for
    # every allocator, so results compare bit for bit and no run's choice differs by luck.
    torch.backends.cudnn.benchmark = False
    # cuDNN's attention builds an execution plan for every new shape (tens of ms each, measured on
    # the H200: a decode loop whose KV length grows by one per token spent over a second a step)
    # and its backward is not deterministic. Off: attention runs on PyTorch's flash and
    # memory-efficient kernels, and the dynamic-shape workloads time the model, not cuDNN planning.
    torch.backends.cuda.enable_cudnn_sdp(False)
    if determinism != "off":
        import torch.utils.deterministic
        # 'strict' (warn_only=False) is what makes flash and memory-efficient attention run their
        # deterministic backward; with warn_only=True they warn and stay nondeterministic.
        torch.use_deterministic_algorithms(True, warn_only=determinism == "warn")
        # Deterministic mode would also fill every torch.empty with NaN, a kernel per allocation
        # that real workloads do not run: left out, the timings stay those of the real loop.
        torch.utils.deterministic.fill_uninitialized_memory = False
    torch.manual_seed(seed)
    if snapshot:
        if alloc != "default":
            raise SystemExit("--snapshot records PyTorch's own allocator's history: use it with 'default'")
        torch.cuda.memory._record_memory_history(max_entries=1_000_000, context=None, stacks="python")

    try:
        t = time.perf_counter()
        res["setup_s"] = t - t_start - res["import_s"]
        runner = WORKLOADS[workload].build(torch, seed)
        torch.cuda.synchronize()
        res["build_s"] = time.perf_counter() - t
        res["device"] = torch.cuda.get_device_name(0)
        tf = sys.modules.get("transformers")
        if tf is not None:
            res["transformers"] = getattr(tf, "__version__", "?")
        res["info"] = runner.info
        times, values = [], []
        # Under vramkit, the pool's page operations per step (read outside the timed region):
        # the driver calls a warm step still makes.
        page_ops = _page_op_reader(alloc)
        step_page_ops = []
        step_cpus = []  # the CPU the launching thread was on after each step
        step_host = []  # host counters over each step (e2e/cpus.py host_clocks)
        step_control = []  # the host-speed control timed after each step (e2e/hostspeed.py)
        ctl = hostspeed.make(torch)
        t_loop = time.perf_counter()
        step_op_index = []  # --snapshot: where each step begins in the recorded history (allocations + frees so far)
        for i in range(steps):
            if snapshot:
                st = torch.cuda.memory_stats()
                step_op_index.append(int(st.get("allocation.all.allocated", 0) + st.get("allocation.all.freed", 0)))
            mark_ms = 0.0
            if mark_step:  # before the inputs, which belong to the step; its time is the step's
                tm = time.perf_counter()
                mark_step()
                mark_ms = (time.perf_counter() - tm) * 1e3
            batch = runner.inputs(i)
            torch.cuda.synchronize()
            before = page_ops() if page_ops else None
            h0 = host_clocks()
            t = time.perf_counter()
            v = runner.step(batch).tolist()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t) * 1e3 + mark_ms)
            h1 = host_clocks()
            step_cpus.append(current_cpu())
            step_host.append({k: round(h1[k] - h0[k], 3) for k in h1 if k in h0})
            step_control.append(round(hostspeed.control_ms(ctl), 4))
            if page_ops:
                after = page_ops()
                step_page_ops.append({k: after[k] - before[k] for k in after})
            values.append([float(x).hex() for x in v])
            del batch
        if step_page_ops:
            res["step_page_ops"] = step_page_ops
        if step_op_index:
            res["step_op_index"] = step_op_index
        res["step_cpus"] = step_cpus
        res["step_host"] = step_host
        res["step_control_ms"] = step_control
        res["loop_s"] = time.perf_counter() - t_loop  # steps and their inputs
        res["digest"] = [float(x).hex() for x in runner.digest()]
        if is_vramkit(alloc):
            res["step_marks"] = vramkit.torch.step_marks()
    except torch.cuda.OutOfMemoryError as e:
        res["oom"] = str(e).splitlines()[0][:300]
        res.update(caught.summary())
        return res
    res["step_ms"] = times
    res["cold_ms"] = times[0]
    res["warm_ms"] = statistics.median(times[warmup:])
    res["values"] = values
    if snapshot:
        torch.cuda.memory._dump_snapshot(snapshot)
        torch.cuda.memory._record_memory_history(enabled=None)
        res["snapshot"] = snapshot
    if tracking is not None:
        res["tracking"] = _tracking_summary(tracking[1], hook_calls0)
        _tracking.release(tracking[0])  # the statistics below read the pool's own adaptor
    res.update(_allocator_stats(torch, alloc, check_expandable))
    # --profile-step N: one more step on step N's inputs under torch.profiler, after every figure
    # above was read (its time and memory count in none of them).
    prof_step = int(os.environ.get(PROFILE_ENV, "0") or 0)
    if 0 < prof_step <= steps:
        from e2e.profile import profile_step
        try:
            res["profile"] = profile_step(torch, runner, prof_step - 1)
        except Exception as e:  # noqa: BLE001 - the run's figures stand without it
            res["profile_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    res.update(caught.summary())
    res["child_s"] = time.perf_counter() - t_start
    return res


def main(argv: list[str]) -> int:
    """``WORKLOAD ALLOC STEPS WARMUP SEED DETERMINISM VRAMKIT_CONF SNAPSHOT CHECK_EXPANDABLE(0/1) CPUS``"""
    workload, alloc, steps, warmup, seed, det, conf, snap, check, cpus = (argv + [""] * 10)[:10]
    try:
        res = run(workload, alloc, int(steps), int(warmup), int(seed), conf, det, snap, check == "1", cpus)
    except BaseException as e:  # noqa: BLE001 - report every failure to the parent, then fail
        traceback.print_exc()
        msg = str(e).strip().splitlines()
        res = {"workload": workload, "allocator": alloc,
               "error": f"{type(e).__name__}: {msg[0][:400] if msg else ''}".rstrip(": ")}
        print(RESULT_PREFIX + json.dumps(res), flush=True)
        return 1
    print(RESULT_PREFIX + json.dumps(res), flush=True)
    return 3 if "oom" in res else 0
