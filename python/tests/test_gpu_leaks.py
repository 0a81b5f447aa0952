"""vramkit's leak and memory-bug tools on a real CUDA device: a deliberate leak in a PyTorch
training loop named by file:line (growth detection and leak_check, with PyTorch's allocations
reaching vramkit without the GIL), guard zones catching kernels that write past a block or after
its free, and compute-sanitizer memcheck on memory from vramkit's plain `cuda` resource.

Run on the GPU machine:  python3 -m pytest python/tests/test_gpu_leaks.py -q -rs

Every test runs its code in a child process, written to a file first so that the lines the
tools must name are known: vramkit.torch.use() must come before PyTorch allocates, and
compute-sanitizer has to start the process. Children print one JSON line; failures show it.
"""
from __future__ import annotations

import json
import re
import shutil
import sys
import textwrap

import pytest

import vramkit

from gpu_child import GPU_MARKS, ON_GPU, needs, run, run_json, show

pytestmark = GPU_MARKS

MiB = 1 << 20


def script(tmp_path, name: str, code: str) -> tuple[str, str]:
    """Writes code (dedented) to tmp_path/name; returns (path, text)."""
    text = textwrap.dedent(code).lstrip("\n")
    path = str(tmp_path / name)
    with open(path, "w") as f:
        f.write(text)
    return path, text


def line_of(path: str, text: str, marker: str) -> str:
    """``path:line`` of the one line of text that holds marker."""
    hits = [i for i, ln in enumerate(text.splitlines(), 1) if marker in ln]
    assert len(hits) == 1, (marker, hits)
    return f"{path}:{hits[0]}"


def child(path: str, *args: str, timeout: float = 300) -> dict:
    """Runs the script in a fresh interpreter; returns the last JSON object it printed."""
    return run_json([sys.executable, path, *args], timeout=timeout)


# ============================================================ (1) a leak in a PyTorch training loop

TRAIN_CHILD = r"""
import gc, json
import vramkit, vramkit.torch
vramkit.torch.use()
import torch
from vramkit import _vramkit
from vramkit.leaks import leak_check, watch

torch.manual_seed(0)
dev = torch.device("cuda", 0)
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                            torch.nn.ReLU(), torch.nn.Linear(1024, 1024)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
x = torch.randn(256, 1024, device=dev)
y = torch.randn(256, 1024, device=dev)
history, leaky, warm = [], [], {}


def train_step():
    out = model(x)  # FORWARD
    loss = torch.nn.functional.mse_loss(out, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return out, loss


def leaky_step():
    out, loss = train_step()
    history.append(out.detach().clone())  # LEAK-CLONE
    leaky.append(torch.empty(16384, dtype=torch.float32, device=dev))  # LEAK-EMPTY


def clean_step():
    out, loss = train_step()
    float(loss.detach())


def warm_step():
    train_step()
    if "buf" not in warm:
        warm["buf"] = torch.empty(4 << 20, dtype=torch.uint8, device=dev)  # WARM-ONCE


def brief(v):
    return {"growing": [{k: g[k] for k in ("site", "function", "bytes_per_step", "live_bytes", "count")}
                        for g in v.growing], "report": v.report(), "total": v.total}


for _ in range(3):  # warm-up: momentum buffers, cuBLAS workspaces (fill once)
    train_step()
torch.cuda.synchronize()
res = {"torch": torch.__version__, "resource": vramkit.get_current_resource().name}
calls0 = _vramkit.site_hook_calls()
res["leaky"] = brief(watch(leaky_step, steps=10))
res["hook_calls"] = _vramkit.site_hook_calls() - calls0
res["clean"] = brief(watch(clean_step, steps=10))
res["warm"] = brief(watch(warm_step, steps=10))

with leak_check() as lc:
    for _ in range(3):
        leaky_step()
    opt.zero_grad(set_to_none=True)  # gradients made inside the block are not a leak
    torch.cuda.synchronize()
    t = vramkit.get_current_resource()
    sites = _vramkit.site_frames()
    ev = _vramkit.tracked_events(t)
    res["event_sites"] = sorted({"%s:%s" % sites[e[5]][:2] if e[5] else "<unknown>" for e in ev if e[0] == "alloc"})
    res["events"] = len(ev)
    res["events_without_site"] = sum(1 for e in ev if e[0] == "alloc" and not e[5])
res["lc"] = [{k: g[k] for k in ("site", "count", "bytes")} for g in lc.leaks]
res["lc_report"] = lc.report()
with leak_check() as lc2:
    for _ in range(3):
        clean_step()
    opt.zero_grad(set_to_none=True)
res["lc_clean"] = [{k: g[k] for k in ("site", "count", "bytes")} for g in lc2.leaks]
res["resource_after"] = vramkit.get_current_resource().name
del model, opt, x, y, history, leaky, warm, lc, lc2
gc.collect()
torch.cuda.synchronize()  # every tensor goes back to the pool before vramkit's exit handler runs
print(json.dumps(res))
"""


@needs("torch")
def test_torch_training_leak_is_named_by_line(tmp_path):
    path, text = script(tmp_path, "train_leak.py", TRAIN_CHILD)
    clone, empty = line_of(path, text, "# LEAK-CLONE"), line_of(path, text, "# LEAK-EMPTY")
    r = child(path)
    g = r["leaky"]["growing"]
    assert [x["site"] for x in g] == [clone, empty], (
        f"watch() should name exactly the two leaking lines\n{r['leaky']['report']}\n{show(r)}")
    assert g[0]["bytes_per_step"] == 256 * 1024 * 4 and g[0]["count"] == 10, show(g)
    assert g[1]["bytes_per_step"] == 16384 * 4 and g[1]["count"] == 10, show(g)
    assert all(x["function"] == "leaky_step" for x in g), show(g)
    assert clone in r["leaky"]["report"] and empty in r["leaky"]["report"]
    # The hook named PyTorch's allocations made without the GIL: the forward pass's line shows up.
    assert line_of(path, text, "# FORWARD") in r["event_sites"], show(r)
    assert r["hook_calls"] > 0, show(r)
    for name in ("clean", "warm"):
        assert r[name]["growing"] == [], f"false alarm on the {name} loop\n{r[name]['report']}"
    # leak_check names the lines too; anything else alive must be unnamed (no line of this script).
    lc = {x["site"]: x for x in r["lc"]}
    assert lc.get(clone, {}).get("count") == 3 and lc[clone]["bytes"] == 3 * 256 * 1024 * 4, show(r["lc"])
    assert lc.get(empty, {}).get("count") == 3 and lc[empty]["bytes"] == 3 * 16384 * 4, show(r["lc"])
    others = [s for s in lc if s not in (clone, empty) and s.startswith(path)]
    assert others == [], f"leak_check named lines that do not leak: {others}\n{r['lc_report']}"
    assert clone in r["lc_report"]
    assert [x for x in r["lc_clean"] if x["site"].startswith(path)] == [], show(r["lc_clean"])
    assert not r["resource_after"].startswith("tracking("), show(r)


# ============================================================ (2) guard zones against real kernels

POKE = r'''
extern "C" __global__ void poke(unsigned long long base, long long offset, int n, unsigned char v) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) reinterpret_cast<unsigned char*>(base)[offset + i] = v;
}
'''

GUARD_CHILD = r"""
import json
import numpy as np
import cupy as cp
import vramkit
from vramkit import _vramkit, leaks

kern = cp.RawKernel(POKE_SRC, "poke")


def poke(ptr, offset, n, v):
    # A real kernel writes n bytes at ptr + offset; vramkit is not told.
    kern((1,), (max(n, 1),), (np.uint64(ptr), np.int64(offset), np.int32(n), np.uint8(v)))
    cp.cuda.runtime.deviceSynchronize()


base = vramkit.get_current_resource()
g = _vramkit.guard_adaptor(base, redzone=256, quarantine=4)
vramkit.set_current_resource(g)
res = {"resource": g.name}
b = vramkit.alloc(1000)  # GUARDED
res["aligned"] = b.ptr % 256 == 0
poke(b.ptr, 0, 1000, 1)  # in bounds
res["in_bounds"] = leaks.check_guards()
res["data_ok"] = b.copy_to_host() == b"\x01" * 1000
poke(b.ptr, 1000, 3, 7)  # 3 bytes past the end
res["overrun"] = leaks.check_guards()
res["overrun_again"] = leaks.check_guards()
poke(b.ptr, -8, 1, 7)  # 8 bytes before the start
res["underrun"] = leaks.check_guards()
p = b.ptr
b.free()  # into the quarantine, poisoned
poke(p, 10, 1, 9)  # use after free
try:
    leaks.check_guards(strict=True)
    res["uaf"] = None
except leaks.GuardError as e:
    res["uaf"] = e.violations
c = vramkit.alloc(64)  # AT-FREE
poke(c.ptr, 64, 1, 1)
c.free()  # checked at the free, reported at the next check
res["at_free"] = leaks.check_guards()
for _ in range(8):  # the quarantine cycles without false alarms
    d = vramkit.alloc(300)
    poke(d.ptr, 0, 300, 5)
    d.free()
res["cycled"] = leaks.check_guards()
vramkit.set_current_resource(base)
print(json.dumps(res))
"""


@needs("cupy")
def test_guard_zones_catch_kernel_overrun_underrun_and_use_after_free(tmp_path):
    path, text = script(tmp_path, "guard_kernels.py", GUARD_CHILD.replace("POKE_SRC", repr(POKE)))
    site, at_free = line_of(path, text, "# GUARDED"), line_of(path, text, "# AT-FREE")
    r = child(path)
    assert r["resource"].startswith("guard(") and r["aligned"], show(r)
    assert r["in_bounds"] == [] and r["data_ok"], show(r)
    ov = r["overrun"]
    assert len(ov) == 1 and ov[0]["where"] == "after" and ov[0]["offset"] == 1000 and ov[0]["size"] == 1000, show(r)
    assert ov[0]["site"] == site and "overrun" in ov[0]["message"], show(ov)
    assert r["overrun_again"] == [], "one overrun must be reported once"
    un = r["underrun"]
    assert len(un) == 1 and un[0]["where"] == "before" and un[0]["offset"] == -8 and un[0]["site"] == site, show(un)
    uaf = r["uaf"]
    assert uaf and len(uaf) == 1 and uaf[0]["where"] == "use_after_free" and uaf[0]["offset"] == 10, show(r)
    assert uaf[0]["site"] == site and "use after free" in uaf[0]["message"], show(uaf)
    af = r["at_free"]
    assert [(v["where"], v["offset"], v["site"]) for v in af] == [("after", 64, at_free)], show(af)
    assert r["cycled"] == [], show(r)


# ============================================================ (3) compute-sanitizer memcheck

SANITIZER_CHILD = r"""
import json, sys
import numpy as np
import cupy as cp
import vramkit
from vramkit import _vramkit, leaks

mode = sys.argv[1]
n = 1024  # float32 elements, 4096 bytes: a whole number of cudaMalloc's 256-byte units
fill = cp.RawKernel(r'''
extern "C" __global__ void fill(unsigned long long base, int count) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < count) reinterpret_cast<float*>(base)[i] = 1.0f;
}
''', "fill")
res = {"mode": mode}
if mode == "pool":
    # The default pool (over vmm pages) with a guard adaptor: the block sits inside a pool
    # segment, so one element past its end is still mapped memory of the same segment.
    base = vramkit.get_current_resource()
    g = _vramkit.guard_adaptor(base, redzone=256, quarantine=4)
    vramkit.set_current_resource(g)
    buf = vramkit.alloc(4 * n)
    p = buf.ptr
else:
    r = vramkit.make_resource("cuda")  # plain cudaMalloc/cudaFree: memcheck sees each allocation's bounds
    p = r.allocate(4 * n)
count = n if mode == "clean" else n + 1  # one element past the end
fill(((count + 255) // 256,), (256,), (np.uint64(p), np.int32(count)))
try:
    cp.cuda.runtime.deviceSynchronize()
    res["synced"] = True
except Exception as e:  # memcheck may turn the bad write into a launch failure
    res["synced"] = str(e)[:200]
if mode == "pool":
    res["guards"] = [{k: v[k] for k in ("where", "offset", "size")} for v in leaks.check_guards()]
    buf.free()
    vramkit.set_current_resource(base)
    g.release_cached()  # the quarantine goes back to the pool
    vramkit.empty_cache()  # and the pool's pages to the device
    del buf, g, base
else:
    r.deallocate(p, 4 * n)
print(json.dumps(res))
"""

SANITIZER = shutil.which("compute-sanitizer")


@pytest.mark.skipif(SANITIZER is None, reason="needs compute-sanitizer on PATH (CUDA toolkit)")
@needs("cupy")
@pytest.mark.parametrize("mode", ["overrun", "clean", "pool"])
def test_compute_sanitizer_memcheck_on_vramkit_memory(tmp_path, mode):
    """overrun/clean: memory from vramkit's `cuda` resource (cudaMalloc per allocation), a CuPy
    kernel writes one element past the end or stays inside. pool: the same overrun on a block of
    the caching pool, inside its segment, where memcheck has no bounds to check and the guard
    adaptor catches it (docs/leaks.md)."""
    path, _ = script(tmp_path, "memcheck_child.py", SANITIZER_CHILD)
    cmd = [SANITIZER, "--tool", "memcheck", "--leak-check", "full", "--error-exitcode", "9",
           sys.executable, path, mode]
    p = run(cmd, timeout=300)
    out = p.stdout + p.stderr
    tail = f"rc {p.returncode}\n--- output (head) ---\n{out[:3000]}\n--- output (tail) ---\n{out[-3000:]}"
    if "Device not supported" in out:
        pytest.skip(f"compute-sanitizer cannot instrument this device: {tail}")
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"the child printed no result\n{tail}"
    res = json.loads(lines[-1])
    if mode == "overrun":
        assert "Invalid __global__ write of size 4 bytes" in out, tail
        # memcheck names the allocation the write missed: the 4096 bytes vramkit's cuda resource got
        assert re.search(r"after the nearest allocation at 0x[0-9a-f]+ of size 4,?096 bytes", out), tail
        assert p.returncode == 9, tail
    elif mode == "clean":
        assert "ERROR SUMMARY: 0 errors" in out and p.returncode == 0, tail
        assert "Invalid" not in out, tail
    else:
        assert res["guards"] == [{"where": "after", "offset": 4 * 1024, "size": 4 * 1024}], f"{res}\n{tail}"
        assert "Invalid __global__ write" not in out, (
            "memcheck now reports an overrun inside a pool segment: docs/leaks.md says it cannot\n" + tail)


def teardown_module(module):
    if ON_GPU:
        vramkit.empty_cache()
