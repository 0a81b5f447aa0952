"""Text views of the allocator: memory_summary() and `vramkit info`."""
from __future__ import annotations

from . import _vramkit
from ._units import format_bytes


def memory_summary(device=None, abbreviated: bool = False) -> str:
    import vramkit
    r = _vramkit.current_resource(device)
    s = vramkit.memory_stats(device)
    st = r.state()
    dev = _vramkit.to_device(device)
    w = 78
    line = "=" * w
    rows = [
        ("Allocated memory", "allocated_bytes", True),
        ("Active memory", "active_bytes", True),
        ("Reserved memory", "reserved_bytes", True),
        ("Cached (reserved, not allocated)", "inactive_split_bytes", True),
        ("Allocations", "allocation", False),
    ]
    out = [line, f"|{'vramkit memory summary, device ' + str(dev) + ' (' + _vramkit.backend() + ')':^{w-2}}|", line,
           f"| {'Metric':<34}| {'Cur Usage':>12} | {'Peak Usage':>12} | {'Tot Alloc':>10} |", "-" * w]
    for title, key, is_bytes in rows:
        g = lambda k: s.get(f"{key}.all.{k}", 0)  # noqa: E731
        f = format_bytes if is_bytes else str
        tot = g("allocated")
        out.append(f"| {title:<34}| {f(g('current')):>12} | {f(g('peak')):>12} | {(f(tot) if is_bytes else str(tot)):>10} |")
    out.append("-" * w)
    frag = s.get("fragmentation", 0.0)
    extra = [
        ("Largest free range", format_bytes(st["largest_free_bytes"])),
        ("Capacity / limit", format_bytes(st["capacity_bytes"])),
        ("Fragmentation (reserved / allocated)", f"{frag:.3f}" if frag else "-"),
        ("Device allocations / frees", f"{s.get('num_device_alloc', 0)} / {s.get('num_device_free', 0)}"),
        ("Out-of-memory errors", str(s.get("num_ooms", 0))),
        ("Retries (cache released first)", str(s.get("num_alloc_retries", 0))),
        ("Refused frees", str(s.get("num_bad_frees", 0))),
    ]
    if "pool.pages_remapped" in s:
        extra.append(("Pages mapped / remapped", f"{s['pool.pages_mapped']} / {s['pool.pages_remapped']}"))
    if not abbreviated:
        for k, v in extra:
            out.append(f"| {k:<40}| {v:>33} |")
        out.append(line)
    out.append(f"Allocator: {r.name}")
    return "\n".join(out)


def info_text() -> str:
    import vramkit
    lines = [f"vramkit {vramkit.__version__}", f"backend: {_vramkit.backend()}"]
    if not _vramkit.built_with_cuda():
        lines.append("CUDA: not compiled in")
    elif _vramkit.cuda_device_count() == 0:
        lines.append(f"CUDA: {_vramkit.cuda_unavailable_reason()}")
    for d in range(_vramkit.device_count()):
        p = _vramkit.device_properties(d)
        free, total = _vramkit.mem_get_info(d)
        lines.append(f"device {d}: {p['name']}{' (simulated)' if p['simulated'] else ''}")
        cc = p["compute_capability"]
        items = [
            ("global memory", format_bytes(p["global_memory_bytes"])),
            ("free / total", f"{format_bytes(free)} / {format_bytes(total)}"),
            ("constant memory", format_bytes(p["constant_memory_bytes"])),
            ("shared memory per block", format_bytes(p["shared_memory_per_block_bytes"])),
            ("shared memory per SM", format_bytes(p["shared_memory_per_sm_bytes"])),
            ("L2 cache", format_bytes(p["l2_cache_bytes"])),
            ("SMs", str(p["sm_count"])),
            ("memory bus width", f"{p['memory_bus_width_bits']} bit"),
            ("memory clock", f"{p['memory_clock_khz'] / 1000:.0f} MHz"),
            ("theoretical bandwidth", f"{p['theoretical_bandwidth_bytes_per_s'] / 1e9:.0f} GB/s"),
            ("allocation granularity", format_bytes(p["allocation_granularity"])),
        ]
        if not p["simulated"]:
            items.insert(0, ("compute capability", f"{cc[0]}.{cc[1]}"))
        lines += [f"  {k:<26}{v}" for k, v in items]
    return "\n".join(lines)
