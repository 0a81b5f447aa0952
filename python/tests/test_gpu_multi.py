"""vramkit on several GPUs: peer access of the pool's pages, peer copies, NCCL all-reduce and DDP
on vramkit memory. The several-GPU cases skip on a machine with one GPU; the one-GPU cases check
that peer access changes nothing there."""
from __future__ import annotations

import sys
import textwrap

import pytest

import vramkit
from vramkit import _vramkit

from gpu_child import GPU_MARKS, have, run, run_json, show

pytestmark = GPU_MARKS
N_GPUS = _vramkit.cuda_device_count()
needs_two = pytest.mark.skipif(N_GPUS < 2, reason=f"needs two or more GPUs ({N_GPUS} here)")
needs_torch = pytest.mark.skipif(not have("torch"), reason="needs torch (not installed)")
# NVLink multicast stays off: a program that uses it can take a shared host's GPUs down.
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def child(code: str, *, env: dict | None = None, timeout: float = 300) -> dict:
    return run_json([sys.executable, "-c", textwrap.dedent(code)], env={**NCCL_ENV, **(env or {})}, timeout=timeout)


def test_peers_are_every_device_that_can_reach_this_one():
    peers = vramkit.peer_devices(0)
    assert 0 not in peers and all(0 < p < N_GPUS for p in peers), peers
    if N_GPUS == 1:
        assert peers == []


def test_peer_access_off_and_a_bad_value():
    r = child("""
        import json, os, vramkit
        out = {"peers": vramkit.peer_devices(0)}
        b = vramkit.alloc(8 << 20)
        b.free()
        out["ok"] = True
        print(json.dumps(out))
    """, env={"VRAMKIT_PEER_ACCESS": "off"})
    assert r["peers"] == [] and r["ok"], show(r)
    p = run([sys.executable, "-c", "import vramkit; vramkit.alloc(1 << 20)"], env={"VRAMKIT_PEER_ACCESS": "sometimes"})
    assert p.returncode != 0 and "VRAMKIT_PEER_ACCESS='sometimes'" in p.stderr, p.stderr[-2000:]


@needs_two
@needs_torch
def test_peer_copy_and_cross_device_kernel_on_vramkit_memory():
    r = child("""
        import json, torch, vramkit, vramkit.torch
        vramkit.torch.use()
        x = torch.arange(1 << 24, device="cuda:0", dtype=torch.float32)
        y = x.to("cuda:1")                                  # peer copy
        z = torch.empty_like(y).copy_(y * 2)
        back = z.to("cuda:0")
        print(json.dumps({"peers": vramkit.peer_devices(0), "ok": bool((back == x * 2).all()),
                          "allocated": [vramkit.memory_allocated(d) for d in range(2)]}))
    """)
    assert 1 in r["peers"] and r["ok"], show(r)
    assert all(a >= 64 << 20 for a in r["allocated"]), show(r)


DDP_CHILD = """
import json, os, sys, torch, torch.distributed as dist

def main(rank, world, use_vramkit, out):
    if use_vramkit:
        import vramkit.torch
        vramkit.torch.use()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("PORT", "29531"))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    t = torch.full((1 << 22,), float(rank + 1), device="cuda")
    dist.all_reduce(t)
    ok = bool((t == world * (world + 1) / 2).all())
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    g = torch.Generator(device="cuda").manual_seed(100 + rank)
    losses = []
    for _ in range(5):
        x = torch.randn(64, 1024, device="cuda", generator=g)
        loss = ddp(x).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        losses.append(loss.item())
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"allreduce_ok": ok, "losses": losses}, f)
    dist.destroy_process_group()

if __name__ == "__main__":
    import torch.multiprocessing as mp
    world = torch.cuda.device_count()
    mp.spawn(main, args=(world, sys.argv[1] == "vramkit", sys.argv[2]), nprocs=world)
    print(open(sys.argv[2]).read())
"""


@needs_two
@needs_torch
def test_ddp_with_nccl_matches_pytorchs_allocator(tmp_path):
    script = tmp_path / "ddp.py"
    script.write_text(DDP_CHILD)
    res = {}
    for i, name in enumerate(("pytorch", "vramkit")):
        res[name] = run_json([sys.executable, str(script), name, str(tmp_path / f"{name}.json")],
                             env={**NCCL_ENV, "PORT": str(29531 + i)}, timeout=300)
    assert res["vramkit"]["allreduce_ok"], show(res)
    assert res["vramkit"]["losses"] == res["pytorch"]["losses"], show(res)
