"""GPU kernel time read by CUPTI through torch.profiler: every CUDA kernel the process launches (ONNX
Runtime's, torch's, the op library's), host overhead excluded. The one measurement the GPU benchmarks share
(cuda_kernel.py, e2e_kernels.py, host_overhead.py; the kernel lab's lab/kernels/run_device.py and ab_builds.py);
needs torch with CUDA, so it runs on the GPU machine."""

from __future__ import annotations

from typing import Callable


def kernel_times_us(fn: Callable[[], object], reps: int, warmup: int) -> dict[str, float]:
    """µs of GPU time per call of ``fn``, by kernel name, over ``reps`` profiled calls after ``warmup``
    unprofiled ones. Empty when ``fn`` launched no kernel."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    per_kernel: dict[str, float] = {}
    for event in p.events():
        if str(getattr(event, "device_type", "")).endswith("CUDA"):
            us = getattr(event, "device_time", None) or getattr(event, "cuda_time", 0.0) or 0.0
            per_kernel[event.name] = per_kernel.get(event.name, 0.0) + us / reps
    return per_kernel


def require_kernels(per_kernel: dict[str, float]) -> dict[str, float]:
    """``per_kernel`` itself; an error when it is empty, i.e. when the profiler saw no GPU work at all."""
    if not per_kernel:
        raise RuntimeError("CUPTI saw no kernel: the profiler is not tracing this process's GPU work")
    return per_kernel
