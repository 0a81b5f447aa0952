"""The device memory a run really takes, as NVML sees it, sampled from the parent process.

The sampler runs in the parent, which only waits on the child: a sampling thread inside the child
would take the child's GIL every half millisecond and slow the very steps being timed. NVML's
device "used" figure is read every ``interval`` seconds (about 20 us a read); the run's peak minus
the figure just before the child started is the memory the child's process took from the device
(its CUDA context included, the same for every allocator). Every ``proc_every``-th sample also
reads the per-process figure for the child's pid (``nvmlDeviceGetComputeRunningProcesses``),
when NVML reports pids this process can match, and the SM clock: runs of one workload differ in
time far more than allocators do (docs/BENCHMARKS.md section 5), and the clock tells whether the
GPU or the host was slow.
"""
from __future__ import annotations

import os
import statistics
import threading
import time


def nvml_device_index() -> int:
    """NVML's index of the GPU the children use: the first of CUDA_VISIBLE_DEVICES when it is a
    number, else 0 (NVML counts in PCI order, CUDA fastest first: the same on one-GPU machines)."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return int(first) if first.isdigit() else 0


class NvmlSampler:
    def __init__(self, index: int | None = None, interval: float = 0.0005, proc_every: int = 20):
        import pynvml  # nvidia-ml-py; ImportError tells the caller NVML figures are unavailable
        self._nvml = pynvml
        pynvml.nvmlInit()
        self.index = nvml_device_index() if index is None else index
        self._h = pynvml.nvmlDeviceGetHandleByIndex(self.index)
        self.name = pynvml.nvmlDeviceGetName(self._h)
        if isinstance(self.name, bytes):
            self.name = self.name.decode()
        self.interval = interval
        self.proc_every = max(1, proc_every)
        self._thread = None
        self._stop = threading.Event()

    def used(self) -> int:
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self._h).used)

    def pci_bus_id(self) -> str | None:
        """The GPU's PCI address ('00000000:19:00.0'), for the CPUs attached to it."""
        try:
            bus = self._nvml.nvmlDeviceGetPciInfo(self._h).busId
        except self._nvml.NVMLError:
            return None
        return bus.decode() if isinstance(bus, bytes) else str(bus)

    def sm_clock(self) -> int | None:
        try:
            return int(self._nvml.nvmlDeviceGetClockInfo(self._h, self._nvml.NVML_CLOCK_SM))
        except self._nvml.NVMLError:
            return None

    def _proc_used(self, pid: int) -> int | None:
        try:
            procs = self._nvml.nvmlDeviceGetComputeRunningProcesses(self._h)
        except self._nvml.NVMLError:
            return None
        for p in procs:
            if p.pid == pid and p.usedGpuMemory is not None:
                return int(p.usedGpuMemory)
        return None

    def settle(self, floor: int, slack: int = 256 << 20, timeout: float = 5.0) -> int:
        """Waits (up to ``timeout``) until the device's used memory is back within ``slack`` of
        ``floor`` (the driver frees an exited process's memory shortly after it exits); returns it."""
        deadline = time.monotonic() + timeout
        u = self.used()
        while u > floor + slack and time.monotonic() < deadline:
            time.sleep(0.05)
            u = self.used()
        return u

    def start(self, pid_getter) -> None:
        """Starts sampling; ``pid_getter()`` returns the child's pid once it exists (or None)."""
        self._stop.clear()
        self.baseline = self.used()
        self.peak = self.baseline
        self.proc_peak = None
        self.samples = 0
        self.clocks = []
        self._pid_getter = pid_getter
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            u = self.used()
            if u > self.peak:
                self.peak = u
            n += 1
            if n % self.proc_every == 0:
                c = self.sm_clock()
                if c is not None:
                    self.clocks.append(c)
                pid = self._pid_getter()
                if pid:
                    pu = self._proc_used(pid)
                    if pu is not None and (self.proc_peak is None or pu > self.proc_peak):
                        self.proc_peak = pu
            self.samples = n
            time.sleep(self.interval)

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> dict:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None
        out = {"nvml_baseline": self.baseline, "nvml_peak_used": self.peak,
               "nvml_peak": self.peak - self.baseline, "nvml_proc_peak": self.proc_peak,
               "nvml_samples": self.samples}
        if self.clocks:
            out["sm_clock_mhz"] = {"min": min(self.clocks), "median": statistics.median(self.clocks),
                                   "max": max(self.clocks), "samples": len(self.clocks)}
        return out

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down at exit; nothing left to do
            pass
