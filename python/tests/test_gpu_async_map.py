"""async_map and async_create under PyTorch: the pool's page calls on its worker thread, each
allocation's stream made to wait for its pages. A training loop on the default stream and on a
side stream, with tensors that grow and shrink every step (so the pool keeps mapping and moving
pages), must give the same numbers bit for bit as the pool with its calls made at once, and the
host must not have waited for the worker. Each case runs in a fresh interpreter.
"""
from __future__ import annotations

import sys
import textwrap

import pytest

from gpu_child import GPU_MARKS, have, run_json

pytestmark = GPU_MARKS + [pytest.mark.skipif(not have("torch"), reason="needs torch (not installed)")]

TRAIN = """
import json, sys, torch, vramkit, vramkit.torch
from vramkit import _vramkit
conf = sys.argv[1]
vramkit.torch.use(**dict(kv.split("=") for kv in conf.split(",") if kv))
torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
dev = "cuda"
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
side = torch.cuda.Stream()
g = torch.Generator().manual_seed(1)
sums = []
for step in range(12):
    rows = int(torch.randint(512, 8192, (1,), generator=g))          # a new shape every step
    x = torch.randn(rows, 1024, generator=g).to(dev, non_blocking=True)
    loss = model(x).float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                                    # allocated and used on the side stream
        y = torch.empty(rows, 2048, device=dev).fill_(float(step))
        z = (y * 2).sum()
    torch.cuda.current_stream().wait_stream(side)
    sums.append([float(loss), float(z)])
    del x, y, z
    if step == 6:
        torch.cuda.empty_cache()                                      # pages destroyed, then made again
torch.cuda.synchronize()
params = float(sum(p.double().sum() for p in model.parameters()))
c = _vramkit.current_resource(None).pool_counters()
print(json.dumps({"sums": sums, "params": params,
                  "counters": {k: int(c[k]) for k in ("async_calls", "async_stream_waits", "async_host_waits",
                                                      "pages_created", "pages_mapped", "pages_unmapped")},
                  "options": c["options"]}))
"""


def child(conf: str) -> dict:
    return run_json([sys.executable, "-c", textwrap.dedent(TRAIN), conf], timeout=300,
                    env={"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "VRAMKIT_ALLOC_CONF": ""})


@pytest.mark.parametrize("conf", ["async_map=true", "async_create=true"])
def test_training_under_async_map_gives_the_same_numbers_and_the_host_does_not_wait(conf):
    ref = child("")
    got = child(conf)
    key = conf.split("=")[0]
    assert f"{key}:true" in got["options"], got["options"]
    assert got["sums"] == ref["sums"], (got["sums"], ref["sums"])
    assert got["params"] == ref["params"]
    c = got["counters"]
    assert c["async_calls"] > 0 and c["async_stream_waits"] > 0, c
    # The host waits for the worker only where the device's free memory is low (not here).
    assert c["async_host_waits"] == 0, c
    assert ref["counters"]["async_calls"] == 0, ref["counters"]
