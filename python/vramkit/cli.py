"""The ``vramkit`` command: info, replay, report, and the monitoring and leak tools."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from ._cli_common import CliError, _load, _parse_capacity, add_import_limit_args  # noqa: F401 (CliError, _load: API)


def _default_allocators() -> list[str]:
    from . import _vramkit
    if _vramkit.backend() == "cuda":
        return ["vramkit", "cuda", "cuda_async", "torch-default", "torch-expandable"]
    return ["vramkit", "host", "torch-default", "torch-expandable"]


def replay_ops(trace):
    """int64 rows ``action, id, size, stream`` with allocations left live freed at the end."""
    import numpy as np
    ops = trace.ops[:, :4]
    base = trace.replay_ops(free_left_live=True)
    if len(base) > len(ops):
        tail = np.concatenate([base[len(ops):], np.zeros((len(base) - len(ops), 1), dtype=np.int64)], axis=1)
        ops = np.concatenate([ops, tail])
    return np.ascontiguousarray(ops, dtype=np.int64)


def _make(spec: str, capacity: int | None):
    from . import _vramkit
    kind = spec.split(":", 1)[0]
    if _vramkit.is_torch_spec(spec):  # PyTorch's allocator, emulated; capacity = the device it sees
        return _vramkit.torch_emulator(spec, capacity or 0)
    if kind in ("vramkit", "pool"):
        if capacity is not None:
            spec = spec + ("," if ":" in spec else ":") + f"reserve_limit:{capacity}"
        r = _vramkit.make_resource(spec, 0)
    else:
        r = _vramkit.make_resource(spec, 0)
        if capacity is not None:
            r = _vramkit.limiting_adaptor(r, capacity)
    return r


def run_replays(trace, specs, capacity, passes, sample_every=0, progress=False):
    from . import _vramkit
    ops = replay_ops(trace)
    results, timelines = [], {}
    for spec in specs:
        try:
            r = _make(spec, capacity)
        except (ValueError, RuntimeError) as e:
            # A bad environment variable is the variable's fault, not the allocator's.
            msg = str(e)
            raise CliError(msg if msg.startswith("VRAMKIT_") else f"--allocator {spec}: {msg}") from None
        cb = None
        if progress:
            def cb(done, total, _s=spec):
                w = 30
                k = int(w * done / max(total, 1))
                sys.stderr.write(f"\r  {trace.name} [{_s}] [{'#' * k}{'.' * (w - k)}] {done}/{total} ops")
                sys.stderr.flush()
        try:
            res = _vramkit.replay(ops, r, passes, sample_every, cb)
        except ValueError as e:
            raise CliError(f"{trace.name}: {e}") from None
        if progress:
            sys.stderr.write("\r" + " " * 90 + "\r")
        name = spec if spec.startswith("vramkit") else spec
        row = {"trace": trace.name, "allocator": name, "ops": res["ops"],
               "peak_live_bytes": res["peak_live_bytes"], "peak_reserved_bytes": res["peak_reserved_bytes"],
               "fragmentation": round(res["fragmentation"], 4),
               "fragmentation_all_passes": round(res["fragmentation_all_passes"], 4), "cold_ns_per_op": round(res["cold_ns_per_op"], 1),
               "warm_ns_per_op": round(res["warm_ns_per_op"], 1), "ooms": res["ooms"],
               "upstream_allocs": res["upstream_allocs"]}
        results.append(row)
        timelines[name] = [tuple(t) for t in res["timeline"]]
    return results, timelines


def _table(results) -> str:
    hdr = ["trace", "allocator", "ops", "peak live", "peak reserved", "frag", "frag all passes", "cold ns/op",
           "warm ns/op", "OOMs"]
    rows = []
    for r in results:
        rows.append([r["trace"], r["allocator"], str(r["ops"]), f"{r['peak_live_bytes'] / 2**20:.1f} MiB",
                     f"{r['peak_reserved_bytes'] / 2**20:.1f} MiB", f"{r['fragmentation']:.3f}",
                     f"{r['fragmentation_all_passes']:.3f}", f"{r['cold_ns_per_op']:.0f}", f"{r['warm_ns_per_op']:.0f}", str(r["ooms"])])
    w = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(hdr)]
    line = "  ".join(h.ljust(w[i]) for i, h in enumerate(hdr))
    out = [line, "  ".join("-" * x for x in w)]
    out += ["  ".join(c.rjust(w[i]) if i >= 2 else c.ljust(w[i]) for i, c in enumerate(row)) for row in rows]
    return "\n".join(out)


def cmd_info(args) -> int:
    from . import info
    try:
        text = info()
    except ValueError as e:  # e.g. VRAMKIT_HOST_CAPACITY=abc
        raise CliError(str(e)) from None
    print(text)
    return 0


def cmd_replay(args) -> int:
    capacity = _parse_capacity(args.capacity)
    _check_passes(args)
    specs = args.allocator or _default_allocators()
    traces = args.trace or [None]
    all_results = []
    for path in traces:
        trace = _load(path)
        progress = not args.json and not args.no_progress and (len(trace) > 50000 or sys.stderr.isatty())
        results, _ = run_replays(trace, specs, capacity, args.passes, progress=progress)
        all_results += results
    if args.json:
        print(json.dumps(all_results, indent=2))
    else:
        print(_table(all_results))
        print("\nfragmentation = peak reserved / peak live requested bytes (1.000 is the floor), in the first "
              "pass; all passes: the peak reserved over every pass; warm = passes 2..N with the pool kept")
    return 0


def _check_passes(args) -> None:
    if args.passes < 1 or args.passes > 1000:
        raise CliError(f"--passes must be between 1 and 1000, not {args.passes}")


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def cmd_report(args) -> int:
    from . import _vramkit
    from .report import render_report
    _check_passes(args)
    for name, given in (("trace", args.trace), ("--recording", args.recording)):
        if given and _same_file(given, args.output):
            raise CliError(f"-o {args.output} is the {name} being read; write the report elsewhere")
    capacity = _parse_capacity(args.capacity)
    specs = args.allocator or _default_allocators()
    trace = _load(args.trace)
    n = len(trace)
    t0 = time.perf_counter()
    results, timelines = run_replays(trace, specs, capacity, args.passes,
                                     sample_every=max(1, n // 1500), progress=not args.no_progress and n > 50000)
    peak_state = None
    try:
        ops = replay_ops(trace)
        r = _make(specs[0] if specs[0].startswith(("vramkit", "pool")) else "vramkit", capacity)
        segs = _vramkit.segments_at(ops, r, int(trace.peak_index()) + 1)
        counters = r.pool_counters() or {}
        peak_state = {"segments": segs, "page_size": counters.get("page_size", 2 << 20)}
    except (ValueError, RuntimeError) as e:
        print(f"vramkit: note: no peak state in the report ({e})", file=sys.stderr)
    extra = []
    if args.recording:
        try:
            from .monitor.sampler import recording_section_html
        except ImportError as e:
            raise CliError(f"--recording needs vramkit.monitor: {e}") from None
        try:
            extra.append(("Memory over time (recording)", recording_section_html(args.recording)))
        except (OSError, ValueError) as e:
            raise CliError(f"--recording {args.recording}: {e}") from None
    from .report.allocators import allocator_section  # PyTorch's allocator, emulated, beside vramkit
    from .advise import DEFAULT_CANDIDATES, progress_printer
    extra.insert(0, allocator_section(trace, trace.ops, args.allocator or DEFAULT_CANDIDATES, capacity,
                                      progress_printer(trace.name, not args.no_progress and sys.stderr.isatty()),
                                      timelines))
    out = args.output
    try:
        render_report(out, trace, results, timelines, peak_state,
                      title=f"vramkit report: {trace.name}", extra_sections=extra)
    except OSError as e:
        raise CliError(f"cannot write {out}: {e}") from None
    print(_table(results))
    best = min(results, key=lambda r: r["peak_reserved_bytes"])
    print(f"\nwrote {out} ({os.path.getsize(out) / 1024:.0f} KiB) in {time.perf_counter() - t0:.1f} s; "
          f"least memory: {best['allocator']} (fragmentation {best['fragmentation']:.3f})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vramkit", description="GPU memory (VRAM) management: replay traces through "
                                "allocators, report where memory went, watch and debug GPU memory.")
    from ._version import __version__
    p.add_argument("--version", action="version", version=f"vramkit {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    s = sub.add_parser("info", help="backend, devices and their memory hierarchy")
    s.set_defaults(func=cmd_info)

    def common(s):
        s.add_argument("--allocator", action="append", metavar="NAME[:OPTIONS]",
                       help="vramkit[:key:value,...], pool:upstream=cuda, host, vmm, cuda, cuda_async, "
                            "torch-default, torch-expandable, torch:OPTIONS (PyTorch's caching allocator, emulated) "
                            "(repeatable; default: vramkit, the plain upstream (cuda and cuda_async on a GPU), "
                            "torch-default and torch-expandable)")
        s.add_argument("--capacity", metavar="SIZE", help="device capacity for the replay, e.g. 16GiB")
        s.add_argument("--passes", type=int, default=3, help="1 cold + N-1 warm passes (default 3)")
        s.add_argument("--no-progress", action="store_true", help="no progress bar")
        add_import_limit_args(s)

    s = sub.add_parser("replay", help="replay traces through allocators and compare them")
    s.add_argument("trace", nargs="*", help="trace files (PyTorch snapshot or trace CSV, RMM log, vramkit v1); "
                   "default: the packaged BERT trace")
    common(s)
    s.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    s.set_defaults(func=cmd_replay)

    s = sub.add_parser("report", help="write a self-contained HTML report of a trace")
    s.add_argument("trace", nargs="?", help="trace file (default: the packaged BERT trace)")
    s.add_argument("-o", "--output", default="vramkit-report.html", help="output HTML file")
    s.add_argument("--recording", metavar="CSV", help="add a plot of a `vramkit smi --watch --csv` recording")
    common(s)
    s.set_defaults(func=cmd_report)

    try:
        from .cli_monitor import add_monitor_commands
        add_monitor_commands(sub)
    except ImportError:
        pass
    from .cli_advise import add_advise_command
    add_advise_command(sub)
    try:
        from .leaks.cli import add_leak_commands
        add_leak_commands(sub)
    except ImportError:
        pass
    try:
        from .checkpoint.cli import add_checkpoint_commands
        add_checkpoint_commands(sub)
    except ImportError:
        pass
    return p


def _undecodable(argv) -> str | None:
    """The first argument that is not valid text (bytes the locale cannot decode reach Python as
    lone surrogates), or None."""
    for a in argv:
        try:
            a.encode("utf-8")
        except UnicodeEncodeError:
            return repr(os.fsencode(a))
    return None


def main(argv=None) -> int:
    parser = build_parser()
    bad = _undecodable(sys.argv[1:] if argv is None else argv)
    if bad is not None:
        print(f"vramkit: error: argument {bad} is not valid UTF-8 text", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        if getattr(args, "max_import_bytes", None) or getattr(args, "max_import_events", None):
            from .trace import limits
            try:
                limits.set_limits(args.max_import_bytes, args.max_import_events)
            except ValueError as e:
                raise CliError(str(e)) from None
        return args.func(args) or 0
    except CliError as e:
        print(f"vramkit {args.command}: error: {e}", file=sys.stderr)
        return 1
    except MemoryError as e:
        print(f"vramkit {args.command}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. `vramkit info | head`
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0


if __name__ == "__main__":
    sys.exit(main())
