"""``onnxfuse doctor``: is this machine ready to run fused models?

Collects the versions, ONNX Runtime's providers, where the op library is and whether it really works (it
opens a one-node session and checks the result against float64), and the CUDA devices. The report is
plain data; the CLI renders it and exits 2 when the library is missing or does not load.
"""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass, field
from typing import Any

import onnx
import onnxruntime as ort

from .version import __version__
from . import runtime
from .errors import EXIT_BAD_INPUT, EXIT_OK, BadInputError


@dataclass
class DoctorReport:
    onnxfuse_version: str
    onnxruntime_version: str
    onnx_version: str
    python_version: str
    available_providers: list[str]
    library_path: str | None
    library_ok: bool
    library_error: str | None
    # One probe per provider the op should run on here: {"provider", "ok", "max_abs_error", "error"}.
    probes: list[dict[str, Any]] = field(default_factory=list)
    cuda_devices: list[dict[str, Any]] = field(default_factory=list)
    gpu_details: dict[str, Any] | None = None
    cpu_gemm: str | None = None  # "avx512", "avx2" or "blas": the CPU kernel's GEMM on this machine

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.library_ok else EXIT_BAD_INPUT

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["exit_code"] = self.exit_code
        return d


def _library_code_for(major: int, minor: int) -> str:
    """Which of the library's CUDA builds a device of this compute capability runs (cmake/cuda.cmake builds
    sm_90a machine code, sm_80 machine code and compute_80 PTX)."""
    if (major, minor) == (9, 0):
        return "sm_90a (Hopper TMA/wgmma kernels)"
    if major == 8:
        return "sm_80 (portable Tensor-Core kernels)"
    if major > 9 or (major == 9 and minor > 0):
        return "compute_80 PTX, compiled by the driver at load (portable kernels)"
    return "none: the CUDA kernels need compute capability 8.0 or newer"


def _kernel_driver_version() -> str | None:
    """The NVIDIA kernel driver's version (e.g. 580.159.04); pycuda only knows the CUDA version it supports."""
    try:
        with open("/proc/driver/nvidia/version") as f:
            first = f.readline()
    except OSError:
        return None
    for word in first.split():
        if word.count(".") >= 1 and word.replace(".", "").isdigit():
            return word
    return None


def gpu_details() -> dict[str, Any] | None:
    """Driver-level GPU details from pycuda (the ``[gpu]`` extra); None when pycuda is not installed or
    cannot initialise (no driver, no GPU).

    Reads device attributes only: no CUDA context is created, so it is cheap and leaves the GPU alone."""
    try:
        import pycuda.driver as drv
    except Exception:
        return None
    try:
        drv.init()
        a = drv.device_attribute
        devices = []
        for i in range(drv.Device.count()):
            d = drv.Device(i)
            attrs = d.get_attributes()
            major, minor = d.compute_capability()
            mem_clock_khz = attrs.get(a.MEMORY_CLOCK_RATE, 0)
            bus_bits = attrs.get(a.GLOBAL_MEMORY_BUS_WIDTH, 0)
            devices.append(
                {
                    "index": i,
                    "name": d.name(),
                    "compute_capability": f"{major}.{minor}",
                    "multiprocessors": attrs.get(a.MULTIPROCESSOR_COUNT),
                    "clock_mhz": attrs.get(a.CLOCK_RATE, 0) // 1000,
                    "memory_gib": round(d.total_memory() / 2**30, 1),
                    "memory_clock_mhz": mem_clock_khz // 1000,
                    "memory_bus_bits": bus_bits,
                    # double data rate: two transfers per memory clock
                    "peak_memory_bandwidth_gbs": round(2 * mem_clock_khz * 1e3 * bus_bits / 8 / 1e9, 1),
                    "l2_cache_mib": round(attrs.get(a.L2_CACHE_SIZE, 0) / 2**20, 1),
                    "pci_bus_id": d.pci_bus_id(),
                    "library_code": _library_code_for(major, minor),
                }
            )
        if not devices:
            return None
        version = drv.get_driver_version()  # e.g. 13000: the CUDA version the driver supports
        return {
            "driver_version": _kernel_driver_version() or f"{version // 1000}.{(version % 1000) // 10}",
            "cuda_version": f"{version // 1000}.{(version % 1000) // 10}",
            "pycuda_built_for_cuda": ".".join(map(str, drv.get_version())),
            "devices": devices,
        }
    except Exception:
        return None


def run_doctor() -> DoctorReport:
    report = DoctorReport(
        onnxfuse_version=__version__,
        onnxruntime_version=ort.__version__,
        onnx_version=onnx.__version__,
        python_version=platform.python_version(),
        available_providers=ort.get_available_providers(),
        library_path=None,
        library_ok=False,
        library_error=None,
        cuda_devices=runtime.cuda_devices(),
        gpu_details=gpu_details(),
    )
    try:
        report.library_path = runtime.get_library_path()
    except BadInputError as e:
        report.library_error = str(e)
        return report

    report.cpu_gemm = runtime.cpu_gemm_path(report.library_path)
    targets = ["cpu"] + (["cuda"] if runtime.cuda_usable() else [])
    for target in targets:
        probe = runtime.probe_library(report.library_path, providers=target)
        report.probes.append({"provider": target, **probe})
    cpu = report.probes[0]
    report.library_ok = bool(cpu["ok"])
    failed = [p for p in report.probes if not p["ok"]]
    if failed:
        report.library_ok = False
        report.library_error = "; ".join(f"{p['provider']}: {p['error']}" for p in failed)
    return report
