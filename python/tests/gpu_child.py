"""What the GPU test files share: the GPU skip marks, and running a case in a fresh interpreter.

vramkit.torch.use() and Numba's memory manager must be set before the framework touches CUDA,
and compute-sanitizer has to start the process, so GPU cases run in children that print one
JSON line of measurements; a failure shows the child's output.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess

import pytest

import vramkit
from vramkit import _vramkit

ON_GPU = vramkit.backend() == "cuda"
GPU_MARKS = [
    pytest.mark.gpu,
    pytest.mark.skipif(not ON_GPU, reason=f"needs a CUDA GPU (vramkit backend is {vramkit.backend()!r}: "
                                          f"{_vramkit.cuda_unavailable_reason() or 'VRAMKIT_BACKEND=host'})"),
]


def have(*modules: str) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in modules)


def needs(*modules: str):
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    return pytest.mark.skipif(bool(missing), reason=f"needs {', '.join(missing)} (not installed)")


def run(cmd: list[str], *, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """Runs cmd with the environment plus env (unbuffered, Hugging Face offline)."""
    e = dict(os.environ)
    e.setdefault("PYTHONUNBUFFERED", "1")
    e.setdefault("HF_HUB_OFFLINE", "1")
    e.setdefault("TRANSFORMERS_OFFLINE", "1")
    e.update(env or {})
    return subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=timeout)


def run_json(cmd: list[str], *, timeout: float = 300, env: dict | None = None) -> dict:
    """Runs cmd; returns the last JSON object it printed, or fails the test with its output."""
    p = run(cmd, timeout=timeout, env=env)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        pytest.fail(f"child process failed (rc {p.returncode})\n--- stdout (tail) ---\n{p.stdout[-6000:]}"
                    f"\n--- stderr (tail) ---\n{p.stderr[-6000:]}", pytrace=False)
    return json.loads(lines[-1])


def show(d: dict) -> str:
    return json.dumps(d, indent=1, sort_keys=True, default=str)
