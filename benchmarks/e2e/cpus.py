"""Where the suite's processes run on the host's CPUs.

Runs whose steps are bound by kernel launches (Llama's token-by-token decoding, BERT's small
batches) take as long as the host thread that launches them: a run placed on the CPUs of the other
socket, or on the hyperthread sibling of the parent's NVML sampler (which wakes every 0.5 ms), is
slower for reasons that have nothing to do with its allocator. ``--cpus auto`` keeps every run on
the same CPUs: those attached to the GPU (sysfs ``local_cpulist`` of its PCI device), less one core
(and its siblings) left to the parent and its sampler.
"""
from __future__ import annotations

import os
import time


def parse_cpu_list(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]; ValueError on anything else."""
    out: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"not a CPU list: {text!r} (e.g. 0-7,16-23)")
        a, b = int(lo), int(hi) if sep else int(lo)
        if b < a:
            raise ValueError(f"not a CPU list: {text!r} ({part}: the range runs backwards)")
        out.update(range(a, b + 1))
    if not out:
        raise ValueError(f"not a CPU list: {text!r} (no CPU in it)")
    return sorted(out)


def format_cpu_list(cpus) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    cpus = sorted(set(cpus))
    parts, i = [], 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        parts.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(parts)


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def gpu_local_cpus(pci_bus_id: str | None, sysfs: str = "/sys") -> list[int] | None:
    """The CPUs sysfs says are attached to the PCI device (NVML's bus id, '00000000:19:00.0')."""
    if not pci_bus_id:
        return None
    bus = pci_bus_id.lower()
    # NVML writes the domain with 8 digits, sysfs with 4.
    domain, _, rest = bus.partition(":")
    names = [bus, f"{domain[-4:]}:{rest}"] if rest else [bus]
    for name in names:
        text = _read(os.path.join(sysfs, "bus", "pci", "devices", name, "local_cpulist"))
        if text:
            try:
                return parse_cpu_list(text)
            except ValueError:
                return None
    return None


def siblings(cpu: int, sysfs: str = "/sys") -> list[int]:
    text = _read(os.path.join(sysfs, "devices", "system", "cpu", f"cpu{cpu}", "topology", "thread_siblings_list"))
    try:
        return parse_cpu_list(text) if text else [cpu]
    except ValueError:
        return [cpu]


def plan_cpus(spec: str, allowed: list[int], local: list[int] | None, sysfs: str = "/sys") -> dict:
    """Which CPUs the parent and the runs get.

    ``spec``: 'all' (no pinning: the runs go where the scheduler puts them), 'auto' (the GPU's
    CPUs, or every allowed one when sysfs does not say, less one core for the parent) or a CPU list
    for the runs (the parent then keeps the allowed CPUs outside it, or all when none is left).
    Returns {"parent": [...] or None, "runs": [...] or None, "note": str}; None means unpinned.
    """
    allowed = sorted(set(allowed))
    if spec == "all":
        return {"parent": None, "runs": None, "note": "runs not pinned (--cpus all)"}
    if spec == "auto":
        pool = [c for c in (local or []) if c in allowed] or allowed
        where = "the GPU's CPUs" if local and pool != allowed else "every allowed CPU"
        if len(pool) < 3:
            return {"parent": None, "runs": None, "note": f"runs not pinned: {where} are only {format_cpu_list(pool)}"}
        parent_core = [c for c in siblings(pool[0], sysfs) if c in pool] or [pool[0]]
        runs = [c for c in pool if c not in parent_core]
        if len(runs) < 2:  # a core of many threads: give the parent one thread only
            parent_core = [pool[0]]
            runs = pool[1:]
        return {"parent": parent_core, "runs": runs,
                "note": f"runs on CPUs {format_cpu_list(runs)} ({where}), the parent and its sampler on "
                        f"{format_cpu_list(parent_core)}"}
    runs = parse_cpu_list(spec)
    bad = [c for c in runs if c not in allowed]
    if bad:
        raise ValueError(f"--cpus {spec}: CPU {bad[0]} is not one this process may use "
                         f"({format_cpu_list(allowed)})")
    rest = [c for c in allowed if c not in runs]
    return {"parent": rest or None, "runs": runs,
            "note": f"runs on CPUs {format_cpu_list(runs)}, the parent on {format_cpu_list(rest) if rest else 'the same'}"}


def current_cpu() -> int | None:
    """The CPU this process's main thread last ran on (field 39 of /proc/self/stat)."""
    text = _read("/proc/self/stat")
    if not text:
        return None
    try:
        return int(text.rsplit(")", 1)[1].split()[36])
    except (IndexError, ValueError):
        return None


def host_clocks() -> dict:
    """Counters that say whether the host, not the GPU, slowed a step: this process's CPU time
    (all threads, user + system) and its calling thread's, the time its main thread waited for a CPU (/proc/self/schedstat) and the
    machine's steal time (/proc/stat: time the hypervisor ran something else on our vCPUs), in ms."""
    out = {"cpu_ms": time.process_time() * 1e3, "thread_cpu_ms": time.thread_time() * 1e3}
    text = _read("/proc/self/schedstat")
    if text:
        try:
            out["runq_wait_ms"] = int(text.split()[1]) / 1e6
        except (IndexError, ValueError):
            pass
    text = _read("/proc/stat")
    if text and text.startswith("cpu "):
        try:
            out["steal_ms"] = int(text.split()[8]) * 1e3 / os.sysconf("SC_CLK_TCK")
        except (IndexError, ValueError):
            pass
    return out
