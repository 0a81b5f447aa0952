"""Fresh run processes without paying the imports every time: fork them from a process that has
imported torch and the model libraries but never touched CUDA.

Importing torch and transformers and building a model from a config took 7-9 s per process on the
H200 machine, most of it imports: over 63 runs that alone is the whole time budget. A zygote
imports them once; each run is ``os.fork()`` of it, so a run is still a new process with its own
CUDA context and a PyTorch allocator (or vramkit pool) that starts empty, chosen before CUDA is
initialized. A zygote never initializes CUDA (forked children could not use it), and each one is
started with one allocator environment (``PYTORCH_CUDA_ALLOC_CONF``), since PyTorch may read that
variable once per process.

Protocol, one line each: the parent writes ``{"argv": [...], "out": PATH, "err": PATH}``; the
zygote forks, answers ``PID n``, and when the run has ended ``EXIT n rc``. EOF on stdin ends it.
"""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time


def _forked_cuda_works() -> str:
    """Forks a probe that initializes CUDA and allocates: '' when it can, else why not. A CUDA
    call made while importing (cuInit through cudaGetDeviceCount, say) would leave every forked
    run a driver it cannot use; the probe finds out before any run is forked."""
    pid = os.fork()
    if pid == 0:
        rc = 1
        try:
            import torch
            # As a run starts: vramkit.torch.use() asks is_available() (NVML-based here, see
            # serve()), then the first tensor creates the context.
            if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
                raise RuntimeError("no CUDA device visible after the fork")
            torch.zeros(1, device="cuda").add_(1)
            torch.cuda.synchronize()
            rc = 0
        finally:
            os._exit(rc)
    _, status = os.waitpid(pid, 0)
    rc = os.waitstatus_to_exitcode(status)
    return "" if rc == 0 else f"a forked probe could not use CUDA (exit {rc})"


def serve(workloads: list[str]) -> int:
    # torch.cuda.is_available() through NVML rather than cuInit, should an import ask it: a
    # cuInit here would leave the forked runs without a usable driver.
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    from e2e.workloads import preload
    preload(workloads)
    import torch
    why = "importing the libraries initialized CUDA" if torch.cuda.is_initialized() else _forked_cuda_works()
    if why:
        print(f"ERROR {why}: runs cannot be forked", flush=True)
        return 1
    print("READY", flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:  # the run
            rc = 70
            try:
                os.setsid()  # its own process group, which the parent may kill on a timeout
                for fd, path in ((1, req["out"]), (2, req["err"])):
                    f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    os.dup2(f, fd)
                    os.close(f)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                from e2e import child
                rc = child.main(req["argv"])
            except BaseException:  # noqa: BLE001 - whatever happens, the run process must end here
                import traceback
                traceback.print_exc()
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(rc)
        print(f"PID {pid}", flush=True)
        _, status = os.waitpid(pid, 0)
        print(f"EXIT {pid} {os.waitstatus_to_exitcode(status)}", flush=True)
    return 0


class Zygote:
    """The parent's handle on one zygote process."""

    def __init__(self, script: str, workloads: list[str], env: dict, log_path: str, start_timeout: float = 180):
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen([sys.executable, script, "--zygote", ",".join(workloads)], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True,
                                     bufsize=1)
        self._lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        first = self._next(start_timeout)
        if first != "READY":
            self.close()
            with open(log_path, errors="replace") as f:
                tail = [ln.strip() for ln in f if ln.strip()][-1:]
            raise RuntimeError(f"the zygote did not start: {first or (tail[0] if tail else 'no answer')}")

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(line.strip())
        self._lines.put(None)  # EOF: the zygote is gone

    def _next(self, timeout: float):
        try:
            return self._lines.get(timeout=timeout)
        except queue.Empty:
            return ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def run(self, argv: list[str], out: str, err: str, timeout: float, on_pid) -> tuple[int | None, bool]:
        """Runs one child; returns (exit code or None, timed out)."""
        self.proc.stdin.write(json.dumps({"argv": argv, "out": out, "err": err}) + "\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        line = self._next(timeout)
        if not line or not line.startswith("PID "):
            raise RuntimeError(f"the zygote did not fork a run: {line or 'no answer'}")
        pid = int(line.split()[1])
        on_pid(pid)
        line = self._next(max(0.0, deadline - time.monotonic()))
        timed_out = False
        if not line:
            timed_out = True
            try:
                os.killpg(pid, signal.SIGKILL)  # the run's own process group (it called setsid)
            except ProcessLookupError:
                pass
            line = self._next(30)
        if not line or not line.startswith("EXIT "):
            raise RuntimeError(f"the zygote lost the run: {line or 'no answer'}")
        return int(line.split()[2]), timed_out

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except Exception:  # noqa: BLE001 - a zygote that does not end on EOF is killed
            self.proc.kill()
            self.proc.wait()
        self._log.close()
