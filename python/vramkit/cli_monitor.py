"""The monitoring subcommands of ``vramkit``: ``smi``, ``top`` and ``exporter``.

:func:`add_monitor_commands` registers them on the CLI's subparsers; each sets ``func`` to a handler that
takes the parsed arguments and returns the exit code (2 when there is no NVIDIA driver).
"""
from __future__ import annotations

import argparse


def _smi(args: argparse.Namespace) -> int:
    from .monitor import smi
    return smi.run(args)


def _top(args: argparse.Namespace) -> int:
    from .monitor import top
    return top.run(args)


def _exporter(args: argparse.Namespace) -> int:
    from .monitor import exporter
    return exporter.run(args)


def add_monitor_commands(subparsers) -> None:
    """Add ``smi``, ``top`` and ``exporter`` to ``subparsers`` (from ``ArgumentParser.add_subparsers``)."""
    from .monitor import exporter, smi, top

    p = subparsers.add_parser("smi", help="GPU memory per device and process (table, --json, --csv, --watch)",
                              description=smi.DESCRIPTION)
    smi.add_arguments(p)
    p.set_defaults(func=_smi)

    p = subparsers.add_parser("top", help="live terminal view of GPU memory with history", description=top.DESCRIPTION)
    top.add_arguments(p)
    p.set_defaults(func=_top)

    p = subparsers.add_parser("exporter", help="serve GPU metrics for Prometheus (DCGM-compatible names)",
                              description=exporter.__doc__.splitlines()[0] if exporter.__doc__ else None)
    exporter.add_arguments(p)
    p.set_defaults(func=_exporter)
