"""vramkit's helper threads, started so that they take no asynchronous signal.

Python runs signal handlers in the main thread only. A process-directed signal (SIGTERM from a
cluster stopping a pod, SIGINT from Ctrl-C) that the kernel hands to a helper thread sets a flag
but does not wake a main thread blocked on a lock or a long wait: ``vramkit exporter``, whose main
thread waited an hour at a time for its stop event, was once seen serving on for the test's 10 s
after a SIGTERM. Helper threads started here block those signals, so the kernel delivers them to
the main thread.
"""
from __future__ import annotations

import signal
import threading
from typing import Callable

# Faults are raised in the thread that caused them and cannot be deferred: never blocked.
_SYNCHRONOUS = {getattr(signal, n) for n in ("SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGTRAP", "SIGSYS", "SIGABRT")
                if hasattr(signal, n)}


def start_daemon(target: Callable[[], None], name: str) -> threading.Thread:
    """Start ``target`` on a daemon thread called ``name`` with every asynchronous signal blocked
    in it (where the platform has ``pthread_sigmask``); the caller's own signal mask is unchanged."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    mask = getattr(signal, "pthread_sigmask", None)
    if mask is None:
        thread.start()
        return thread
    # A new thread inherits its creator's mask: block around start() and restore at once.
    old = mask(signal.SIG_BLOCK, signal.valid_signals() - _SYNCHRONOUS)
    try:
        thread.start()
    finally:
        mask(signal.SIG_SETMASK, old)
    return thread
