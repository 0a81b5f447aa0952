"""Ctrl-C during a long C++ replay stops it within a poll (16k ops), not when the replay ends."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from vramkit import _vramkit

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


def _ops(n: int) -> np.ndarray:
    """n allocations live at once, then their frees: int64 rows action, id, size, stream."""
    ids = np.arange(n, dtype=np.int64)
    allocs = np.stack([np.zeros(n, np.int64), ids, 4096 + 256 * (ids % 7), np.zeros(n, np.int64)], axis=1)
    frees = np.stack([np.ones(n, np.int64), ids, np.zeros(n, np.int64), np.zeros(n, np.int64)], axis=1)
    return np.ascontiguousarray(np.concatenate([allocs, frees]))


@pytest.fixture
def sigint_raises():
    """Python's own SIGINT handler, as in an interactive session: a shell that starts the tests in the
    background without job control starts them with SIGINT ignored, and then no Ctrl-C reaches them."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def test_sigint_in_process_raises_and_frees(sigint_raises):
    r = _vramkit.host_pool(1 << 30)
    ops = _ops(100_000)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    t0 = time.perf_counter()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        _vramkit.replay(ops, r, 1000)  # minutes without the interrupt
    assert time.perf_counter() - t0 < 5
    assert r.state()["live_bytes"] == 0
    r.check_invariants()


CHILD = r"""
import signal, sys, numpy as np
signal.signal(signal.SIGINT, signal.default_int_handler)  # as an interactive session has it
sys.path.insert(0, sys.argv[1])
from test_interrupt import _ops
from vramkit import _vramkit
ops = _ops(100_000)
r = _vramkit.host_pool(1 << 30)
print("replaying", flush=True)
_vramkit.replay(ops, r, 1000)
print("finished", flush=True)
"""


def test_sigint_stops_a_long_replay_in_a_subprocess():
    here = os.path.dirname(os.path.abspath(__file__))
    p = subprocess.Popen([sys.executable, "-c", CHILD, here], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout.readline().strip() == "replaying"
        time.sleep(0.5)
        t0 = time.perf_counter()
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=20)
        elapsed = time.perf_counter() - t0
    finally:
        if p.poll() is None:
            p.kill()
    assert "finished" not in out
    assert p.returncode != 0 and "KeyboardInterrupt" in err.strip().splitlines()[-1], err[-500:]
    assert elapsed < 2.0, f"exited {elapsed:.1f} s after SIGINT"
