"""`vramkit advise`: would this run fit, and with which allocator?"""
from __future__ import annotations

import json
import sys


def cmd_advise(args) -> int:
    from .advise import DEFAULT_CANDIDATES, advise, make_resource, plans_steps, progress_printer, table
    import numpy as np
    from ._cli_common import CliError, _load, _parse_capacity
    capacity = _parse_capacity(args.capacity)
    specs = args.allocator or list(DEFAULT_CANDIDATES)
    for spec in specs:  # every name and option checked before any replay: a typo costs nothing
        try:
            make_resource(spec, capacity)
        except (ValueError, RuntimeError) as e:
            raise CliError(f"--allocator {spec}: {e}") from None
    trace = _load(args.trace)
    # the trace's own rows (action, id, size, stream, site): no copy; what is left live at the
    # end changes no peak
    ops = np.ascontiguousarray(trace.ops, dtype=np.int64)
    show = not args.json and not args.no_progress and sys.stderr.isatty()
    try:
        result = advise(ops, specs, capacity, progress_printer(trace.name, show), add_plans=not args.allocator)
    except (ValueError, RuntimeError) as e:
        raise CliError(f"{trace.name}: {e}") from None
    if show:
        sys.stderr.write("\r" + " " * 100 + "\r")
    result["trace"] = trace.name
    result["ops"] = len(ops)
    if args.json:
        print(json.dumps(result, indent=2, default=lambda a: a.tolist()))
        return 0
    cap = f" on {args.capacity}" if capacity else " (no --capacity: unlimited device)"
    print(f"{trace.name}: {len(ops)} ops{cap}; floor (peak of live requested bytes): "
          f"{result['rows'][0]['peak_live_bytes'] / 2**30:.2f} GiB\n")
    print(table(result))
    steps = result["steps"]
    planned = [r["allocator"] for r in result["rows"] if plans_steps(r["allocator"])]
    if steps is not None and planned:
        print(f"\nsteps: the trace repeats a step of {steps['period']} large allocation requests; {', '.join(planned)} "
              f"marked {steps['marks']} steps there, as vramkit.torch.use() marks one at each "
              "optimizer step")
    elif planned:
        print(f"\nsteps: no repeating step found in the trace; {', '.join(planned)} ran with no marks (the pool "
              "looks for steps itself, by the same rule, and finds none unless its large requests repeat)")
    print(f"\nrecommendation: {result['recommendation']}")
    return 0


def add_advise_command(sub) -> None:
    s = sub.add_parser("advise", help="would this trace fit a device, and with which allocator (PyTorch's "
                       "caching allocator emulated with several PYTORCH_CUDA_ALLOC_CONF settings, and vramkit)")
    s.add_argument("trace", nargs="?", help="trace file (default: the packaged BERT trace)")
    s.add_argument("--capacity", metavar="SIZE", help="device memory the process may use, e.g. 80GiB")
    s.add_argument("--allocator", action="append", metavar="SPEC",
                   help="torch-default, torch-expandable, torch:max_split_size_mb=128,roundup_power2_divisions=4,"
                        "garbage_collection_threshold=0.8,per_process_memory_fraction=0.9,...; vramkit[:options] "
                        "(repeatable; default: a set of each)")
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    from ._cli_common import add_import_limit_args
    add_import_limit_args(s)
    s.set_defaults(func=cmd_advise)
