"""bench/cupti.py, the GPU-time reading every GPU benchmark shares: per-kernel sums divided by the number
of profiled calls, warm-up calls left out, CPU events ignored, no kernel at all reported as an error where a
benchmark requires one. torch's profiler is replaced by a stand-in that records what the calls launch."""

from __future__ import annotations

import sys
import types

import pytest

from tests.bench_scripts import load_bench_script

cupti = load_bench_script("cupti")


class _Event:
    def __init__(self, name, device_type, us):
        self.name, self.device_type, self.device_time = name, device_type, us


@pytest.fixture
def fake_torch(monkeypatch):
    """A torch whose profiler sees the events the profiled calls append to ``launched``."""
    launched: list[_Event] = []
    state = {"profiling": False}

    class _Profile:
        def __init__(self, activities):
            self.seen: list[_Event] = []

        def __enter__(self):
            state["profiling"] = True
            launched.clear()
            return self

        def __exit__(self, *exc):
            state["profiling"] = False
            self.seen = list(launched)

        def events(self):
            return self.seen

    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(synchronize=lambda: None)
    profiler = types.ModuleType("torch.profiler")
    profiler.ProfilerActivity = types.SimpleNamespace(CUDA="cuda")
    profiler.profile = _Profile
    torch.profiler = profiler
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.profiler", profiler)
    return launched, state


def test_per_kernel_time_per_call(fake_torch):
    launched, state = fake_torch
    calls = {"warm": 0}

    def run():
        if not state["profiling"]:
            calls["warm"] += 1
            return
        launched.extend([_Event("gemm", "DeviceType.CUDA", 30.0), _Event("gelu", "DeviceType.CUDA", 8.0),
                         _Event("cudaLaunchKernel", "DeviceType.CPU", 5.0)])

    times = cupti.kernel_times_us(run, reps=4, warmup=3)
    assert calls["warm"] == 3
    assert times == {"gemm": 30.0, "gelu": 8.0}


def test_no_kernel_is_empty_and_required_kernels_raise(fake_torch):
    times = cupti.kernel_times_us(lambda: None, reps=2, warmup=1)
    assert times == {}
    with pytest.raises(RuntimeError, match="CUPTI saw no kernel"):
        cupti.require_kernels(times)
    assert cupti.require_kernels({"k": 1.0}) == {"k": 1.0}
