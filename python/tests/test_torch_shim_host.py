"""The PyTorch shim's C functions on the simulated device (no GPU, no PyTorch needed): routing to
graph pools as PyTorch's hooks drive it, and the exit path."""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap

import pytest

import vramkit
import vramkit.torch as vt

pytestmark = pytest.mark.skipif(not os.path.exists(vt.library_path()), reason="the PyTorch shim is not installed")

FILTER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
DROP = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _lib():
    lib = ctypes.CDLL(vt.library_path())
    lib.vramkit_torch_alloc.restype = ctypes.c_void_p
    lib.vramkit_torch_alloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    lib.vramkit_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    lib.vramkit_torch_begin_allocate_to_pool.argtypes = [ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64, FILTER,
                                                         DROP, ctypes.c_void_p]
    lib.vramkit_torch_end_allocate_to_pool.argtypes = [ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64]
    lib.vramkit_torch_release_pool.argtypes = [ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64]
    return lib


def test_shim_routes_a_scoped_window_to_its_pool_and_lets_go():
    if vramkit.backend() != "host":
        pytest.skip("the host case; the GPU tests drive the same functions through PyTorch")
    lib = _lib()
    accepted = []
    dropped = []
    take = {"on": True}

    @FILTER
    def filt(ctx, stream):
        accepted.append(stream)
        return 1 if take["on"] else 0

    @DROP
    def drop(ctx):
        dropped.append(ctx)

    base = vramkit.memory_allocated()
    assert lib.vramkit_torch_begin_allocate_to_pool(0, 0, 77, filt, drop, ctypes.c_void_p(1234)) == 0
    p = lib.vramkit_torch_alloc(3 << 20, 0, None)
    take["on"] = False
    q = lib.vramkit_torch_alloc(1 << 20, 0, None)
    pools = vt.graph_pools(0)
    assert len(pools) == 1 and pools[0]["id"] == (0, 77), pools
    assert pools[0]["live_bytes"] >= 3 << 20 and pools[0]["open"] == 1, pools
    assert vramkit.memory_allocated() - base == 1 << 20  # only q is the main pool's
    lib.vramkit_torch_end_allocate_to_pool(0, 0, 77)
    lib.vramkit_torch_free(p, 3 << 20, 0, None)
    lib.vramkit_torch_free(q, 1 << 20, 0, None)
    assert vt.graph_pools(0)[0]["live_bytes"] == 0
    lib.vramkit_torch_release_pool(0, 0, 77)
    assert vt.graph_pools(0) == []
    assert len(accepted) == 2 and dropped == [1234]


EXIT_CHILD = """
import ctypes, sys, vramkit.torch as vt
lib = ctypes.CDLL(vt.library_path())
lib.vramkit_torch_alloc.restype = ctypes.c_void_p
lib.vramkit_torch_alloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
lib.vramkit_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
ptrs = [lib.vramkit_torch_alloc(1 << 20, 0, None) for _ in range(20)]
if sys.argv[1] == "during_run":
    lib.vramkit_torch_free(ptrs[0], 1 << 20, 0, None)
    lib.vramkit_torch_free(ptrs[0], 1 << 20, 0, None)     # a real double free: reported
else:
    vt._at_exit()                                        # what atexit runs
    for p in ptrs + ptrs:                                 # late frees, twice over
        lib.vramkit_torch_free(p, 1 << 20, 0, None)
sys.exit(3)
"""


@pytest.mark.parametrize("mode,lines", [("during_run", 1), ("at_exit", 0)])
def test_frees_after_exit_are_silent_and_a_double_free_before_is_not(mode, lines):
    if vramkit.backend() != "host":
        pytest.skip("the host case; test_gpu_torch_graphs.py::test_clean_exit is the GPU one")
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(EXIT_CHILD), mode], capture_output=True, text=True,
                       timeout=60)
    said = [ln for ln in p.stderr.splitlines() if "vramkit" in ln]
    assert p.returncode == 3, p.stderr
    assert len(said) == lines, p.stderr


def test_shim_allocations_reach_a_tracker_put_over_the_pool_later():
    """PyTorch allocates through the shim; leak_check()/watch() put a tracking adaptor over the
    device's resource after the shim's router was made. The router must follow it (and go back)."""
    if vramkit.backend() != "host":
        pytest.skip("the host case; test_gpu_leaks.py drives the same path through PyTorch")
    from vramkit.leaks import leak_check
    lib = _lib()
    first = lib.vramkit_torch_alloc(1 << 20, 0, None)  # the router exists before tracking starts
    base = vramkit.memory_allocated()
    with leak_check() as lc:
        kept = lib.vramkit_torch_alloc(3 << 20, 0, None)
        brief = lib.vramkit_torch_alloc(2 << 20, 0, None)
        lib.vramkit_torch_free(brief, 2 << 20, 0, None)
        lib.vramkit_torch_free(first, 1 << 20, 0, None)  # made before tracking: passes through
        assert vramkit.memory_allocated() - base == (3 << 20) - (1 << 20)  # statistics seen through the tracker
    assert [(g["count"], g["bytes"]) for g in lc.leaks] == [(1, 3 << 20)], lc.report()
    from vramkit.leaks import _tracking
    assert _tracking.active_tracker() is None  # the tracker is off again
    lib.vramkit_torch_free(kept, 3 << 20, 0, None)  # after tracking: straight to the pool
    assert vramkit.memory_allocated() == base - (1 << 20)
    after = lib.vramkit_torch_alloc(1 << 20, 0, None)
    lib.vramkit_torch_free(after, 1 << 20, 0, None)
    assert vramkit.memory_allocated() == base - (1 << 20)


def test_shim_keeps_its_pool_when_another_resource_is_made_current():
    """Only trackers over the shim's own pool are followed. Another pool made current while
    PyTorch holds memory (or a guard adaptor, whose pointers are shifted) would strand that
    memory: the shim keeps allocating from, and freeing to, the pool it started with."""
    if vramkit.backend() != "host":
        pytest.skip("the host case")
    from vramkit import _vramkit
    lib = _lib()
    held = lib.vramkit_torch_alloc(2 << 20, 0, None)
    own = _vramkit.current_resource(0)
    other = vramkit.make_resource("pool", 0)
    base = own.state()["live_bytes"]
    _vramkit.set_current_resource(other, 0)
    try:
        p = lib.vramkit_torch_alloc(1 << 20, 0, None)
        assert other.state()["live_bytes"] == 0                 # not the new current resource
        assert own.state()["live_bytes"] == base + (1 << 20)    # still its own pool
        lib.vramkit_torch_free(p, 1 << 20, 0, None)
        lib.vramkit_torch_free(held, 2 << 20, 0, None)          # made before the switch: freed where it lives
        assert own.state()["live_bytes"] == base - (2 << 20)
    finally:
        _vramkit.set_current_resource(own, 0)
    q = lib.vramkit_torch_alloc(1 << 20, 0, None)               # and after switching back
    assert own.state()["live_bytes"] == base - (1 << 20)
    lib.vramkit_torch_free(q, 1 << 20, 0, None)
