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

from . import __version__
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

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.library_ok else EXIT_BAD_INPUT

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["exit_code"] = self.exit_code
        return d


def gpu_details() -> dict[str, Any] | None:
    """Driver-level GPU details from pycuda (the ``[gpu]`` extra); None when pycuda is not installed or
    cannot initialise (no driver, no GPU)."""
    try:
        import pycuda.driver as drv
    except Exception:
        return None
    try:
        drv.init()
        devices = []
        for i in range(drv.Device.count()):
            d = drv.Device(i)
            attrs = d.get_attributes()
            devices.append(
                {
                    "name": d.name(),
                    "compute_capability": "%d.%d" % d.compute_capability(),
                    "multiprocessors": attrs.get(drv.device_attribute.MULTIPROCESSOR_COUNT),
                    "clock_mhz": attrs.get(drv.device_attribute.CLOCK_RATE, 0) // 1000,
                    "memory_gib": round(d.total_memory() / 2**30, 1),
                }
            )
        return {"driver_version": drv.get_driver_version(), "cuda_version": ".".join(map(str, drv.get_version())), "devices": devices}
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
