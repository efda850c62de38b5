"""bench/cuda_kernel.py's grid timing: the GPU time of a segment is the sum of the kernels it launched, per call.
torch.profiler also mirrors each labelled host range on the GPU timeline as a device-side annotation spanning
those kernels; counting it as a kernel doubled long segments and added the launch gaps to short ones."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(_BENCH))  # cuda_kernel.py imports its sibling cupti.py
_spec = importlib.util.spec_from_file_location("onnxfuse_bench_cuda_kernel", _BENCH / "cuda_kernel.py")
cuda_kernel = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cuda_kernel)


class _Range:
    def __init__(self, start, end):
        self.start, self.end = start, end


class _Event:
    def __init__(self, name, device_type, start, end):
        self.name, self.device_type, self.time_range = name, device_type, _Range(start, end)


def test_segment_time_counts_kernels_only_and_divides_by_calls():
    labels = ["seg_0", "seg_1"]
    events = [
        _Event("seg_0", "DeviceType.CPU", 0, 100),  # host range of segment 0
        _Event("seg_0", "DeviceType.CUDA", 10, 90),  # its GPU-side mirror: not a kernel
        _Event("gemm", "DeviceType.CUDA", 10, 30),
        _Event("gelu", "DeviceType.CUDA", 40, 45),
        _Event("gemm", "DeviceType.CUDA", 60, 80),
        _Event("gelu", "DeviceType.CUDA", 85, 90),
        _Event("cudaLaunchKernel", "DeviceType.CPU", 12, 13),  # host work is never GPU time
        _Event("seg_1", "DeviceType.CPU", 200, 300),
        _Event("seg_1", "DeviceType.CUDA", 210, 260),
        _Event("gemm", "DeviceType.CUDA", 210, 260),
    ]
    assert cuda_kernel._segment_gpu_us(events, labels, calls=2) == pytest.approx([25.0, 25.0])
