"""`onnxfuse doctor`: a report on a working install, and exit 2 with one line when the library is
missing or unloadable."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

from click.testing import CliRunner

from onnxfuse import runtime
from onnxfuse.cli import main
from onnxfuse.doctor import gpu_details, run_doctor


def test_doctor_json_on_a_working_install(library_path):
    result = CliRunner().invoke(main, ["doctor", "--json", "-"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["library_ok"] is True and report["exit_code"] == 0
    assert report["library_path"] == library_path
    assert "CPUExecutionProvider" in report["available_providers"]
    cpu = report["probes"][0]
    assert cpu["provider"] == "cpu" and cpu["ok"] and cpu["max_abs_error"] < 1e-6
    assert len(report["probes"]) == (2 if runtime.cuda_usable() else 1)
    assert len(report["cuda_devices"]) == runtime.cuda_device_count()


def test_doctor_table_names_the_essentials(library_path):
    result = CliRunner().invoke(main, ["doctor"])
    assert result.exit_code == 0, result.output
    for text in ("onnxruntime", "providers", "op library", "FusedLinearGelu on cpu", "ok"):
        assert text in result.output
    assert "libonnxfuse_ops.so" in result.output


def _cpu_gemm_in_fresh_process(cap: str | None) -> str:
    """The library picks its CPU GEMM once per process: ask a new one, with ONNXFUSE_CPU_ISA set or not."""
    env = {k: v for k, v in os.environ.items() if k != "ONNXFUSE_CPU_ISA"}
    if cap is not None:
        env["ONNXFUSE_CPU_ISA"] = cap
    out = subprocess.run([sys.executable, "-c", "from onnxfuse import runtime; print(runtime.cpu_gemm_path())"],
                         env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_doctor_names_the_cpu_gemm_and_the_cap_changes_it(library_path):
    result = CliRunner().invoke(main, ["doctor", "--json", "-"])
    chosen = json.loads(result.output)["cpu_gemm"]
    assert chosen in ("avx512", "avx2", "blas")
    table = CliRunner().invoke(main, ["doctor"]).output
    assert "CPU GEMM" in table and chosen in table
    # ONNXFUSE_CPU_ISA=scalar turns the packed GEMM off; =avx2 caps an AVX-512 machine at AVX2.
    assert _cpu_gemm_in_fresh_process("scalar") == "blas"
    if platform.machine() in ("x86_64", "AMD64") and chosen != "blas":
        assert _cpu_gemm_in_fresh_process("avx2") == "avx2"
        assert _cpu_gemm_in_fresh_process(None) == chosen


def test_cpu_gemm_path_is_none_for_a_library_that_cannot_say(tmp_path):
    assert runtime.cpu_gemm_path(str(tmp_path / "missing.so")) is None
    assert runtime.describe_cpu_gemm(None).startswith("unknown")


def test_missing_library_is_exit_2_without_traceback(monkeypatch, tmp_path):
    monkeypatch.setenv(runtime.LIBRARY_ENV, str(tmp_path / "missing.so"))
    result = CliRunner().invoke(main, ["doctor"])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert result.output.strip().splitlines()[-1].startswith("onnxfuse: error: ONNXFUSE_LIBRARY=")


def test_unloadable_library_is_exit_2(monkeypatch, tmp_path):
    junk = tmp_path / "libjunk.so"
    junk.write_bytes(b"\x7fELF but not really")
    monkeypatch.setenv(runtime.LIBRARY_ENV, str(junk))
    result = CliRunner().invoke(main, ["doctor", "--json", "-"])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("onnxfuse: error: cpu: cannot load the op library")
    report = run_doctor()
    assert report.library_ok is False and report.exit_code == 2 and "cannot load" in report.library_error


def test_gpu_details_is_none_without_pycuda_or_gpu():
    details = gpu_details()
    try:
        import pycuda.driver  # noqa: F401
    except Exception:
        assert details is None
        return
    if runtime.cuda_device_count() == 0:
        assert details is None
    else:
        assert details["devices"]
