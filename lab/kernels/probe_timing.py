"""The two readings the torch-only lab probes take of one call (swap_ab_probe.py, staged_fp32_probe.py), µs:

  warm  CUPTI kernel time with the calls back to back (bench/cupti.py): W may stay in L2 from the call before;
  cold  CUDA events around each call made after a write of FLUSH_BYTES, which leaves L2 full of other data, as a
        model's other layers do (events include the launch gap, so cold is not comparable to warm);
each the median (cold) or the mean (warm, CUPTI's) of `reps` calls.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from cupti import kernel_times_us, require_kernels  # noqa: E402  (bench/cupti.py)

FLUSH_BYTES = 1 << 30


class ProbeTimer:
    def __init__(self, torch, reps: int):
        self.torch = torch
        self.reps = reps
        self.flush = torch.empty(FLUSH_BYTES // 4, device="cuda", dtype=torch.float32)

    def warm_us(self, fn) -> float:
        return sum(require_kernels(kernel_times_us(fn, reps=self.reps, warmup=3)).values())

    def cold_us(self, fn) -> float:
        cuda = self.torch.cuda
        start, stop = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        times = []
        for _ in range(self.reps):
            self.flush.add_(1.0)
            start.record()
            fn()
            stop.record()
            cuda.synchronize()
            times.append(start.elapsed_time(stop) * 1e3)
        return statistics.median(times)
