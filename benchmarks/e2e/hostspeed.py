"""A control for the host's speed, timed after each step of a run.

On the GPU machines the host's speed drifts between the suite's processes and within one: in one
call the host's own time in the same 1,710 ``aten::mm`` calls of a profiled Llama-generation step
ranged over 90.5-104.6 ms across twelve runs and followed each run's warm step (correlation 0.85;
docs/BENCHMARKS.md section 5, thirteenth session). A host-bound step then moves by more than the
allocators differ. After each step, outside its timed region, the child times a fixed piece of
host work of the kind such steps are made of: PyTorch's dispatch of ``CONTROL_OPS`` small
in-place adds on a CPU tensor (no GPU, no allocation), the fastest of ``TRIES`` rounds. The
report prints each allocator's median control and its spread over the runs: how far the host's
speed moved between them. Dividing the steps by their controls did not help order allocators: on
an H100 (section 5, fourteenth session) the control ran 3-5 % slower in every expandable_segments
process of two calls while their steps did not, so that ratio was dropped.
"""
from __future__ import annotations

import time

CONTROL_OPS = 256
TRIES = 3


def make(torch):
    """The control's tensor (64 float32 on the CPU)."""
    return torch.zeros(64)


def control_ms(x, ops: int = CONTROL_OPS, tries: int = TRIES) -> float:
    """ms for ``ops`` in-place adds on ``x``, the fastest of ``tries`` rounds (a round the
    scheduler interrupted is left out)."""
    if ops < 1 or tries < 1:
        raise ValueError("control_ms needs ops >= 1 and tries >= 1")
    best = float("inf")
    for _ in range(tries):
        t = time.perf_counter()
        for _ in range(ops):
            x.add_(1.0)
        best = min(best, time.perf_counter() - t)
    return best * 1e3
