"""The parts of benchmarks/gpu_end_to_end.py: workloads, the child run, NVML sampling, the report."""
