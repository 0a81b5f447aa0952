"""``vramkit checkpoint-plan CHAIN.json``: plans for a sweep of budgets, against the baselines."""
from __future__ import annotations

import json

from .model import BudgetError, Chain, fmt_bytes
from .planner import baselines, minimum_budget, no_checkpoint, plan


def _row(label, budget, p, step_time):
    if p is None:
        return [label, fmt_bytes(budget) if budget is not None else "-", "does not fit", "-", "-", "-"]
    extra = f"{p.extra_time * 1e3:.2f} ms"
    pct = f"+{100 * p.extra_time / step_time:.1f} %" if step_time else "-"
    return [label, fmt_bytes(budget) if budget is not None else "-", fmt_bytes(p.peak), extra, pct,
            f"{len(p.checkpointed)}: {p.describe()}"]


def table(rows) -> str:
    hdr = ["plan", "budget", "predicted peak", "extra time", "of step", "blocks checkpointed"]
    w = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(hdr)]
    out = ["  ".join(h.ljust(w[i]) for i, h in enumerate(hdr)), "  ".join("-" * x for x in w)]
    out += ["  ".join(c.rjust(w[i]) if 1 <= i <= 4 else c.ljust(w[i]) for i, c in enumerate(r)) for r in rows]
    return "\n".join(out)


def budgets_for(ch: Chain, count: int, max_segment=None) -> list:
    """``count`` budgets from the least any plan needs to the peak without checkpointing."""
    lo, hi = minimum_budget(ch, max_segment=max_segment), no_checkpoint(ch).peak
    if count == 1 or hi <= lo:
        return [hi]
    return [lo + (hi - lo) * k // (count - 1) for k in range(count)]


def cmd_checkpoint_plan(args) -> int:
    from .._cli_common import CliError
    try:
        ch = Chain.load(args.chain)
    except FileNotFoundError:
        raise CliError(f"no such chain file: {args.chain}") from None
    except IsADirectoryError:
        raise CliError(f"{args.chain} is a directory, not a chain file") from None
    except (ValueError, TypeError) as e:  # Chain.load names the file
        raise CliError(str(e)) from None
    if args.sweep < 1 or args.sweep > 100:
        raise CliError(f"--sweep must be between 1 and 100, not {args.sweep}")
    if args.max_segment is not None and args.max_segment < 1:
        raise CliError(f"--max-segment must be at least 1, not {args.max_segment}")
    try:
        budgets = [b for b in args.budget] if args.budget else budgets_for(ch, args.sweep, args.max_segment)
        from .model import parse_budget
        budgets = [parse_budget(b) for b in budgets]
    except BudgetError as e:
        raise CliError(f"--budget: {e}") from None
    step_time = ch.meta.get("step_time") or None
    results = []
    for b in budgets:
        try:
            results.append((b, plan(ch, b, max_segment=args.max_segment), None))
        except BudgetError as e:
            results.append((b, None, str(e)))
    base = baselines(ch)
    if args.json:
        print(json.dumps({"chain": args.chain, "blocks": len(ch), "least_budget": minimum_budget(
            ch, max_segment=args.max_segment), "plans": [dict(p.to_dict(), budget=b) if p else
                                                           {"budget": b, "error": err} for b, p, err in results],
            "baselines": [p.to_dict() for p in base]}, indent=1))
        return 0
    rows = [_row("optimal", b, p, step_time) for b, p, _ in results]
    rows += [_row(p.name, None, p, step_time) for p in base]
    print(f"{args.chain}: {len(ch)} blocks ({ch.meta.get('model', 'chain')}), least feasible peak "
          f"{fmt_bytes(minimum_budget(ch, max_segment=args.max_segment))}")
    print(table(rows))
    for b, p, err in results:
        if err:
            print(f"budget {fmt_bytes(b)}: {err}")
    return 0


def add_checkpoint_commands(sub) -> None:
    s = sub.add_parser("checkpoint-plan", help="gradient-checkpoint plans of a profiled model for a sweep of budgets")
    s.add_argument("chain", help="chain JSON written by vramkit.checkpoint.profile(...).save(path)")
    s.add_argument("--budget", action="append", metavar="SIZE",
                   help="memory budget, e.g. 12GiB (repeatable; default: a sweep from the least feasible peak "
                        "to the peak without checkpointing)")
    s.add_argument("--sweep", type=int, default=6, help="number of budgets in the default sweep (default 6)")
    s.add_argument("--max-segment", type=int, metavar="N", help="at most N blocks per checkpoint call")
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    s.set_defaults(func=cmd_checkpoint_plan)
