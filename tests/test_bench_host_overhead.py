"""bench/host_overhead.py: its two chains must compute the same thing (or the comparison means nothing), its
profile reading must count each op's calls per run, and a run must report the per-layer ratios. On the CPU
provider with tiny layers; the numbers that matter come from the GPU (bench/results/host_overhead_h200.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.bench_scripts import load_bench_script

ho = load_bench_script("host_overhead")


@pytest.fixture(autouse=True)
def _library(library_path):
    """Both chains run through ORT with the op library (conftest: skips outside CI when it is not built)."""


@pytest.mark.parametrize("rows", [1, 5])
def test_fused_and_unfused_chains_compute_the_same_thing(rows):
    from onnxfuse.runtime import create_session

    fused, unfused = ho.chain_models(layers=3, width=24, dtype="fp32", seed=1)
    x = np.random.default_rng(rows).standard_normal((rows, 24)).astype(np.float32)
    (y_fused,) = create_session(fused, providers="cpu").run(None, {"X": x})
    (y_unfused,) = create_session(unfused, providers="cpu").run(None, {"X": x})
    assert y_fused.shape == (rows, 24)
    np.testing.assert_allclose(y_fused, y_unfused, rtol=1e-4, atol=1e-5)
    assert sum(n.op_type == "FusedLinearGelu" for n in fused.graph.node) == 3
    assert [n.op_type for n in unfused.graph.node] == ["MatMul", "Add", "Gelu"] * 3


def test_profile_reading_keeps_node_calls_by_op(tmp_path):
    events = [
        {"cat": "Node", "name": "fused0_kernel_time", "dur": 12, "args": {"op_name": "FusedLinearGelu"}},
        {"cat": "Node", "name": "fused1_kernel_time", "dur": 14, "args": {"op_name": "FusedLinearGelu"}},
        {"cat": "Node", "name": "fused0_fence_before", "dur": 1, "args": {"op_name": "FusedLinearGelu"}},
        {"cat": "Session", "name": "model_run", "dur": 100, "args": {}},
    ]
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(events))
    assert ho.node_host_us(str(profile)) == {"FusedLinearGelu": [12.0, 14.0]}


def test_a_cpu_run_reports_per_layer_times_and_ratios(tmp_path, capsys):
    out = tmp_path / "host.json"
    assert ho.main(["--provider", "cpu", "--layers", "2", "--width", "16", "--rows", "1,4", "--budget", "0.05",
                    "--profile-runs", "5", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["M"] for r in rows] == [1, 4]
    for r in rows:
        for side in ("fused", "unfused"):
            assert r[side]["wall_us_per_layer"] > 0 and r[side]["host_us_per_layer"] > 0
        assert r["fused"]["host_us_by_op"]["FusedLinearGelu"]["calls_per_run"] == 2
        assert r["wall_ratio"] == pytest.approx(r["fused"]["wall_us_per_layer"] / r["unfused"]["wall_us_per_layer"])
    assert "M=4" in capsys.readouterr().out


def test_a_second_build_of_the_library_joins_the_same_timing(tmp_path, library_path):
    other = tmp_path / "libonnxfuse_ops_other.so"  # a second file: ORT loads it as a library of its own
    other.write_bytes(Path(library_path).read_bytes())
    out = tmp_path / "ab.json"
    assert ho.main(["--provider", "cpu", "--layers", "2", "--width", "16", "--rows", "3", "--budget", "0.05",
                    "--profile-runs", "3", "--other-library", str(other), "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["other_library"] == str(other)
    assert row["fused_other"]["host_us_by_op"]["FusedLinearGelu"]["calls_per_run"] == 2
    assert row["wall_ratio_to_other"] == pytest.approx(
        row["fused"]["wall_us_per_layer"] / row["fused_other"]["wall_us_per_layer"])
