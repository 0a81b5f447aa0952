"""vramkit under PyTorch in production: CUDA graphs, torch.compile's CUDA graphs, scoped pools,
CUDA IPC, memory_stats and record_stream through the hooks, and a clean exit.

Every case runs in a fresh interpreter (vramkit.torch.use() must come before PyTorch allocates)
and prints one JSON line that the test checks.
"""
from __future__ import annotations

import sys
import textwrap

import pytest

from gpu_child import GPU_MARKS, have, run, run_json, show

pytestmark = GPU_MARKS + [pytest.mark.skipif(not have("torch"), reason="needs torch (not installed)")]


def child(code: str, *, env: dict | None = None, timeout: float = 300) -> dict:
    return run_json([sys.executable, "-c", textwrap.dedent(code)], env=env, timeout=timeout)


def test_hooks_are_built_for_this_torch():
    r = child("""
        import json, vramkit.torch
        ok, why = vramkit.torch.hooks_available()
        print(json.dumps({"ok": ok, "why": why}))
    """)
    assert r["ok"], r["why"]


GRAPH_CHILD = """
import gc, json, torch, vramkit, vramkit.torch
vramkit.torch.use()
torch.manual_seed(0)
dev = "cuda"
N = 1 << 22                                   # 16 MiB of float32 per tensor

def f(x):
    a = x * 2.0                               # intermediates freed inside the capture
    b = torch.sin(a)
    del a
    c = b + 1.0
    del b
    d = torch.cos(c) * x
    del c
    return d

static_in = torch.randn(N, device=dev)
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    for _ in range(3):
        f(static_in)
torch.cuda.current_stream().wait_stream(side)
torch.cuda.synchronize()
res = {}
before = torch.randn(N, device=dev)           # alive before the capture, freed during it
reserved_before = torch.cuda.memory_stats()["reserved_bytes.all.current"]

g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    out = f(static_in)
    del before
pools = vramkit.torch.graph_pools()
res["pools_after_capture"] = pools

# After capture: many tensors allocated and written outside the graph, between replays.
outside, bad_out, bad_outside = [], 0, 0
for i in range(200):
    static_in.copy_(torch.randn(N, device=dev))
    g.replay()
    t = torch.full((N,), float(i), device=dev)
    t2 = torch.empty(N // 3, device=dev).fill_(-float(i))
    outside.append((i, t, t2))
    if len(outside) > 40:
        outside.pop(0)
    ref = f(static_in)
    bad_out += int((out != ref).sum())
    for j, u, u2 in outside:
        bad_outside += int((u != float(j)).sum()) + int((u2 != -float(j)).sum())
torch.cuda.synchronize()
res["bad_graph_outputs"] = bad_out
res["bad_outside_elements"] = bad_outside

# A second graph sharing the first graph's pool.
g2 = torch.cuda.CUDAGraph()
with torch.cuda.graph(g2, pool=g.pool()):
    out2 = f(out)
bad2 = 0
for i in range(20):
    static_in.copy_(torch.randn(N, device=dev))
    g.replay()
    g2.replay()
    bad2 += int((out2 != f(f(static_in))).sum())
torch.cuda.synchronize()
res["bad_shared_pool_outputs"] = bad2
res["pools_with_two_graphs"] = vramkit.torch.graph_pools()

# Destroying both graphs and their outputs returns the memory.
del g, g2, out, out2, outside, ref, t, t2
gc.collect()
torch.cuda.synchronize()
res["pools_after_destroy"] = vramkit.torch.graph_pools()
torch.cuda.empty_cache()
res["reserved_before"] = reserved_before
res["reserved_after"] = torch.cuda.memory_stats()["reserved_bytes.all.current"]
res["allocated_after"] = torch.cuda.memory_allocated()
res["vramkit_allocated_after"] = vramkit.memory_allocated()
print(json.dumps(res))
"""


@pytest.fixture(scope="module")
def graph_result():
    return child(GRAPH_CHILD)


def test_graph_capture_with_frees_replays_right(graph_result):
    r = graph_result
    assert len(r["pools_after_capture"]) == 1, show(r)
    p = r["pools_after_capture"][0]
    assert p["captured"] and p["live_bytes"] >= 4 * (1 << 22), show(r)
    assert p["set_aside_bytes"] >= 4 * (1 << 22), f"the tensor freed during capture was not held back\n{show(r)}"
    assert r["bad_graph_outputs"] == 0, show(r)


def test_graph_memory_never_reaches_a_tensor_outside(graph_result):
    assert graph_result["bad_outside_elements"] == 0, show(graph_result)


def test_two_graphs_share_a_pool(graph_result):
    r = graph_result
    assert r["bad_shared_pool_outputs"] == 0, show(r)
    assert len(r["pools_with_two_graphs"]) == 1 and r["pools_with_two_graphs"][0]["users"] == 2, show(r)


def test_destroyed_graphs_return_their_memory(graph_result):
    r = graph_result
    assert r["pools_after_destroy"] == [], show(r)
    assert r["allocated_after"] == r["vramkit_allocated_after"], show(r)
    # static_in is all that is left; the pool's cache may keep a little.
    assert r["reserved_after"] <= r["reserved_before"] + (64 << 20), show(r)


def test_make_graphed_callables_training_matches_eager():
    r = child("""
        import copy, json, torch, vramkit, vramkit.torch
        vramkit.torch.use()
        torch.manual_seed(0)
        dev = "cuda"
        model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Dropout(0.0),
                                    torch.nn.Linear(1024, 512)).to(dev)
        eager = copy.deepcopy(model)
        x0 = torch.randn(64, 512, device=dev, requires_grad=True)
        graphed = torch.cuda.make_graphed_callables(model, (x0,))
        opt_g = torch.optim.SGD(model.parameters(), lr=0.01)
        opt_e = torch.optim.SGD(eager.parameters(), lr=0.01)
        diffs = []
        for step in range(20):
            x = torch.randn(64, 512, device=dev, requires_grad=True)
            tgt = torch.randn(64, 512, device=dev)
            lg = torch.nn.functional.mse_loss(graphed(x), tgt)
            le = torch.nn.functional.mse_loss(eager(x.detach().requires_grad_()), tgt)
            opt_g.zero_grad(set_to_none=True); lg.backward(); opt_g.step()
            opt_e.zero_grad(set_to_none=True); le.backward(); opt_e.step()
            diffs.append(abs(lg.item() - le.item()))
        pmax = max(float((a - b).abs().max()) for a, b in zip(model.parameters(), eager.parameters()))
        print(json.dumps({"max_loss_diff": max(diffs), "max_param_diff": pmax,
                          "pools": len(vramkit.torch.graph_pools())}))
    """)
    assert r["max_loss_diff"] <= 1e-6 and r["max_param_diff"] <= 1e-6, show(r)
    assert r["pools"] >= 1, show(r)


COMPILE_CHILD = """
import json, os, sys, time, torch
if os.environ.get("USE_VRAMKIT") == "1":
    import vramkit.torch
    vramkit.torch.use()
torch.manual_seed(0)
dev = "cuda"
layer = torch.nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048, batch_first=True,
                                         dropout=0.0)
model = torch.nn.TransformerEncoder(layer, num_layers=4).to(dev).eval()
compiled = torch.compile(model, mode="reduce-overhead")
g = torch.Generator(device=dev).manual_seed(1)
inputs = [torch.randn(16, 128, 512, device=dev, generator=g) for _ in range(6)]
outs = []
with torch.no_grad():
    for x in inputs[:3]:                       # warm-up and recording
        compiled(x)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(10):
        for x in inputs:
            y = compiled(x)
            outs.append(y.clone())
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / (10 * len(inputs))
stack = torch.stack(outs[-len(inputs):]).float().cpu()
torch.save(stack, sys.argv[1])
print(json.dumps({"step_ms": dt * 1e3, "peak_allocated": torch.cuda.max_memory_allocated(),
                  "peak_reserved": torch.cuda.max_memory_reserved()}))
"""


def test_torch_compile_reduce_overhead_matches_pytorch(tmp_path):
    import torch
    script = tmp_path / "compile_child.py"
    script.write_text(COMPILE_CHILD)
    results = {}
    for name, flag in (("pytorch", "0"), ("vramkit", "1")):
        results[name] = run_json([sys.executable, str(script), str(tmp_path / f"{name}.pt")],
                                 env={"USE_VRAMKIT": flag}, timeout=600)
    a = torch.load(tmp_path / "pytorch.pt")
    b = torch.load(tmp_path / "vramkit.pt")
    diff = float((a - b).abs().max())
    print(f"torch.compile reduce-overhead: step {results['vramkit']['step_ms']:.3f} ms (vramkit) vs "
          f"{results['pytorch']['step_ms']:.3f} ms (PyTorch); peak reserved "
          f"{results['vramkit']['peak_reserved'] >> 20} MiB vs {results['pytorch']['peak_reserved'] >> 20} MiB; "
          f"max |diff| {diff:g}")
    assert diff <= 1e-5, f"outputs differ by {diff}\n{show(results)}"


def test_scoped_pool_routes_only_its_allocations():
    r = child("""
        import json, torch, vramkit, vramkit.torch
        x = torch.ones(1 << 20, device="cuda")                # PyTorch's allocator
        v0 = vramkit.memory_allocated()
        with vramkit.torch.pool() as p:
            inside = torch.full((16 << 20,), 2.0, device="cuda")   # 64 MiB through vramkit
        v1 = vramkit.memory_allocated()
        outside = torch.full((16 << 20,), 3.0, device="cuda")
        v2 = vramkit.memory_allocated()
        ok = bool((inside == 2.0).all()) and bool((outside == 3.0).all())
        print(json.dumps({"v0": v0, "v1": v1, "v2": v2, "ok": ok, "active": vramkit.torch.is_active(),
                          "stats_reserved": p.stats()["reserved_bytes.all.current"]}))
    """)
    assert not r["active"] and r["ok"], show(r)
    assert r["v1"] - r["v0"] >= 64 << 20, f"the scope's tensor did not come from vramkit\n{show(r)}"
    assert r["v2"] == r["v1"], f"a tensor outside the scope came from vramkit\n{show(r)}"
    assert r["stats_reserved"] >= 64 << 20, show(r)


def test_scoped_pool_under_use_is_a_private_pool():
    r = child("""
        import json, gc, torch, vramkit, vramkit.torch
        vramkit.torch.use()
        with vramkit.torch.pool() as p:
            a = torch.full((8 << 20,), 1.0, device="cuda")
        b = torch.full((8 << 20,), 2.0, device="cuda")
        pools = vramkit.torch.graph_pools()
        s = p.stats()
        del a, p
        gc.collect()
        print(json.dumps({"pools": pools, "stats": s, "after": vramkit.torch.graph_pools(),
                          "b_ok": bool((b == 2.0).all())}))
    """)
    assert len(r["pools"]) == 1 and r["pools"][0]["live_bytes"] >= 32 << 20, show(r)
    assert r["stats"]["allocated_bytes.all.current"] >= 32 << 20, show(r)
    assert r["after"] == [] and r["b_ok"], show(r)


def test_cuda_ipc_of_vramkit_memory_fails_clearly():
    r = child("""
        import json, torch, vramkit.torch
        vramkit.torch.use()
        from torch.multiprocessing.reductions import reduce_tensor
        t = torch.ones(1 << 20, device="cuda")
        try:
            reduce_tensor(t)
            out = {"raised": None}
        except Exception as e:
            out = {"raised": type(e).__name__, "msg": str(e)}
        out["t_ok"] = bool((t == 1).all())
        print(json.dumps(out))
    """)
    assert r["raised"] == "RuntimeError" and "CUDA IPC" in r["msg"] and "vramkit" in r["msg"], show(r)
    assert r["t_ok"], show(r)


def test_memory_stats_cache_info_and_cudnn_benchmark():
    r = child("""
        import json, torch, vramkit, vramkit.torch
        vramkit.torch.use()
        torch.backends.cudnn.benchmark = True
        conv = torch.nn.Conv2d(64, 128, 3, padding=1).cuda()
        y = conv(torch.randn(32, 64, 56, 56, device="cuda"))
        torch.cuda.synchronize()
        s = torch.cuda.memory_stats()
        print(json.dumps({"torch_allocated": torch.cuda.memory_allocated(), "vramkit": vramkit.memory_allocated(),
                          "reserved": torch.cuda.memory_reserved(), "peak": torch.cuda.max_memory_allocated(),
                          "finite": bool(torch.isfinite(y).all()), "keys": len(s)}))
    """)
    assert r["finite"], show(r)
    assert r["torch_allocated"] == r["vramkit"] > 0 and r["reserved"] >= r["torch_allocated"], show(r)
    assert r["peak"] >= r["torch_allocated"], show(r)


def test_capture_beside_the_map_ahead_helper():
    """One thread captures a graph (PyTorch's default, global capture mode) while another grows
    the pool, so that map_ahead's helper thread creates and maps pages during the capture: the
    helper's calls must neither fail nor break the capture, and the graphs replay right."""
    r = child("""
        import json, threading, time, torch, vramkit, vramkit.torch
        vramkit.torch.use(map_ahead="1GiB")
        dev = "cuda"
        x = torch.randn(1 << 22, device=dev)

        def f(x):
            return torch.cos(torch.sin(x * 2.0) + 1.0)

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                f(x)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        res = {"errors": [], "made_in_capture": []}
        kept = []

        def made():
            return vramkit.get_current_resource(0).pool_counters()["pages_made_ahead"]

        def grow(start, done):
            s = torch.cuda.Stream()
            start.wait()
            try:
                with torch.cuda.stream(s):  # not the capturing stream: the main pool grows, its helper wakes
                    kept.append(torch.empty(2 << 30, dtype=torch.uint8, device=dev))
            except Exception as e:
                res["errors"].append("growing thread: " + repr(e))
            done.set()

        graphs = []
        for i in range(6):
            start, done = threading.Event(), threading.Event()
            t = threading.Thread(target=grow, args=(start, done))
            t.start()
            g = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(g):
                    before = made()
                    start.set()
                    done.wait(30)
                    time.sleep(0.05)  # the helper makes the pool's lead while this thread captures
                    out = f(x)
                    res["made_in_capture"].append(made() - before)
                graphs.append((g, out))
            except Exception as e:
                res["errors"].append(f"capture {i}: {e!r}")
            t.join()
        bad = 0
        for i in range(20):
            x.copy_(torch.randn(1 << 22, device=dev))
            for g, out in graphs:
                g.replay()
                bad += int((out != f(x)).sum())
        torch.cuda.synchronize()
        res["graphs"] = len(graphs)
        res["bad_outputs"] = bad
        res["pages_made_ahead"] = made()
        print(json.dumps(res))
    """)
    assert r["errors"] == [] and r["graphs"] == 6, show(r)
    assert r["bad_outputs"] == 0, show(r)
    # The helper made pages inside every capture (a call refused there would end its batch).
    assert len(r["made_in_capture"]) == 6 and min(r["made_in_capture"]) > 0, show(r)


EXIT_CHILD = """
import sys, torch, vramkit.torch
vramkit.torch.use()
keep = [torch.ones(1 << 18, device="cuda") for _ in range(50)]
mode = sys.argv[1]
if mode == "exit":
    sys.exit(3)
if mode == "raise":
    raise ValueError("boom")
if mode == "double_free":
    import ctypes
    lib = ctypes.CDLL(vramkit.torch.library_path())
    lib.vramkit_torch_alloc.restype = ctypes.c_void_p
    lib.vramkit_torch_alloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    lib.vramkit_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    p = lib.vramkit_torch_alloc(4096, 0, None)
    lib.vramkit_torch_free(p, 4096, 0, None)
    lib.vramkit_torch_free(p, 4096, 0, None)
"""


@pytest.mark.parametrize("mode,rc", [("exit", 3), ("raise", 1), ("double_free", 0)])
def test_clean_exit(tmp_path, mode, rc):
    script = tmp_path / "exit_child.py"
    script.write_text(EXIT_CHILD)
    p = run([sys.executable, str(script), mode], timeout=120)
    vk_lines = [ln for ln in p.stderr.splitlines() if "vramkit" in ln]
    assert p.returncode == rc, p.stderr[-3000:]
    if mode == "double_free":
        assert len(vk_lines) == 1 and "ignored deallocate" in vk_lines[0], p.stderr[-3000:]
    else:
        assert vk_lines == [], f"{len(vk_lines)} vramkit lines at exit:\n" + "\n".join(vk_lines[:10])
    if mode == "raise":
        assert "ValueError: boom" in p.stderr
