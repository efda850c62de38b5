"""The CPU GEMM's tile loop with four panels per micro-kernel call, as the AVX-512 build runs it, checked on
any x86-64 machine with AVX2: tests/native/tile_loop_check.cc is compiled with the sources it tests and run.
(The AVX-512 instantiation itself runs only where the CPU has AVX-512; its loop is this one.)"""

from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "custom_ops" / "src"


def _compiler() -> str | None:
    return shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the packed GEMM is x86-64 only")
@pytest.mark.skipif(_compiler() is None, reason="no C++ compiler on PATH to build the native check")
def test_four_panel_tile_loop_matches_one_panel_and_float64(tmp_path):
    exe = tmp_path / "tile_loop_check"
    build = subprocess.run(
        [_compiler(), "-std=c++17", "-O2", "-mavx2", "-mfma", "-mf16c", f"-I{SRC}",
         str(ROOT / "tests" / "native" / "tile_loop_check.cc"), str(SRC / "cpu" / "gemm" / "packed_gemm_avx2.cc"),
         "-o", str(exe)],
        capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-2000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    if run.returncode == 77:
        pytest.skip("this CPU has no AVX2+FMA")
    assert run.returncode == 0, run.stdout[-2000:]
    assert run.stdout.strip().endswith(", 0 bad"), run.stdout
