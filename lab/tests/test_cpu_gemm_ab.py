"""lab/cpu_gemm_ab, the in-process A/B harness behind the CPU kernel's tuning numbers: a library of two
variants builds from the project's own sources, each variant computes act(X·Wᵀ + b) over a whole problem with
several threads, and ab.py's report runs against ORT in the same process."""

from __future__ import annotations

import importlib.util
import math
import platform
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from onnxfuse import runtime

ROOT = Path(__file__).resolve().parents[2]
AB = ROOT / "lab" / "cpu_gemm_ab"

pytestmark = [
    pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the packed GEMM is x86-64 only"),
    pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ on PATH to build the A/B library"),
]


@pytest.fixture(scope="module")
def ab(tmp_path_factory, library_path):
    if runtime.cpu_gemm_path(library_path) not in ("avx2", "avx512"):
        pytest.skip("this CPU has no AVX2+FMA: the A/B variants run the AVX2 kernel")
    lib_path = tmp_path_factory.mktemp("ab") / "ab.so"
    src = ROOT / "custom_ops" / "src"
    build = subprocess.run(["bash", str(AB / "build.sh"), str(lib_path), f"cur:{src}:256:144:128",
                            f"kc64:{src}:64:12:32"], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-2000:]
    spec = importlib.util.spec_from_file_location("onnxfuse_lab_cpu_gemm_ab", AB / "ab.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, lib_path


def test_each_variant_computes_the_fused_op(ab):
    module, lib_path = ab
    lib = module.load(str(lib_path))
    rng = np.random.default_rng(5)
    M, K, N = 37, 300, 100  # ragged rows, K over one slice, a ragged last panel
    x = rng.standard_normal((M, K)).astype(np.float32)
    w_nk = (rng.standard_normal((N, K)) / math.sqrt(K)).astype(np.float32)
    b = (0.1 * rng.standard_normal(N)).astype(np.float32)
    packed = module.aligned(lib.ab_packed_floats(K, N))
    lib.ab_pack(w_nk.ctypes.data, K, N, packed.ctypes.data)
    pre = x.astype(np.float64) @ w_nk.astype(np.float64).T + b
    ref = 0.5 * pre * (1.0 + np.vectorize(math.erf)(pre / math.sqrt(2.0)))
    assert [lib.ab_name(i).decode() for i in range(lib.ab_count())] == ["cur", "kc64"]
    for i in range(lib.ab_count()):
        y = np.full((M, N), np.nan, np.float32)
        assert lib.ab_run(i, 2, M, K, N, x.ctypes.data, packed.ctypes.data, b.ctypes.data, y.ctypes.data) > 0
        assert np.abs(y - ref).max() < 1e-5


def test_report_runs_against_ort(ab, capsys):
    module, lib_path = ab
    assert module.main([str(lib_path), "40x64x48", "--reps", "2", "--warmup", "1"]) == 0
    out = capsys.readouterr().out
    for column in ("MLAS MatMul", "ORT unfused", "cur", "kc64"):
        assert column in out
    diffs = [float(line.rsplit(" ", 1)[1]) for line in out.splitlines() if "max |diff| vs ORT" in line]
    assert len(diffs) == 2 and max(diffs) < 1e-5
