"""onnxfuse bench: the timing engine, placement from ORT's profiler, the op-level and model modes, the
JSON report, the chart, and every way to call it wrongly. On the CPU provider, tiny shapes, small budgets:
these tests check that the numbers are made and reported right, not how fast anything is."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from onnxfuse.measure import placement as placement_module
from onnxfuse.measure.environment import SCHEMA
from onnxfuse.measure.model_bench import batch_shapes, bench_models
from onnxfuse.measure.op_bench import measure_ceilings, op_models
from onnxfuse.measure.placement import read_placement
from onnxfuse.measure.timing import TimingPolicy, measure
from onnxfuse.cli import main
from onnxfuse.plots import plot_model_bench
from onnxfuse.domain import OP_TYPE
from onnxfuse.errors import ProviderPlacementError

K, N = 32, 48
QUICK = ["--budget", "0.05", "--no-progress"]



@pytest.fixture(autouse=True)
def _library(library_path):
    """Every bench test runs the op library (conftest: skips outside CI when it is not built)."""


def linear_gelu_model(batch="batch") -> onnx.ModelProto:
    """x[batch, 8, K] -> MatMul -> Add -> Gelu: what an exporter writes and onnxfuse fuses."""
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array((rng.standard_normal((K, N)) / math.sqrt(K)).astype(np.float32), "W")
    b = numpy_helper.from_array((rng.standard_normal(N) * 0.1).astype(np.float32), "B")
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["mm"], name="mm"),
        helper.make_node("Add", ["mm", "B"], ["pre"], name="add"),
        helper.make_node("Gelu", ["pre"], ["y"], name="gelu"),
    ]
    graph = helper.make_graph(
        nodes, "linear_gelu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 8, K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 8, N])], [w, b],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(original, fused) paths: the fused one made by onnxfuse's own optimizer."""
    from onnxfuse.pipeline import optimize_file

    folder = tmp_path_factory.mktemp("bench_models")
    original, fused = folder / "original.onnx", folder / "fused.onnx"
    onnx.save(linear_gelu_model(), original)
    report = optimize_file(str(original), str(fused))
    assert len(report.fused) == 1
    return str(original), str(fused)


def run_cli(*args: str):
    result = CliRunner().invoke(main, ["bench", *args])
    return result.exit_code, result.stdout, result.stderr


# --- the timing engine -----------------------------------------------------------------------------


def test_measure_times_each_callable_and_keeps_them_apart():
    calls = {"fast": 0, "slow": 0}

    def fast():
        calls["fast"] += 1
        time.sleep(0.001)

    def slow():
        calls["slow"] += 1
        time.sleep(0.004)

    policy = TimingPolicy(warmup_runs=3, warmup_s=0.0, min_reps=10, budget_s=0.3, block_s=0.01)
    t_fast, t_slow = measure([fast, slow], policy, items=8)
    # a sleep lasts at least what it asks for, so these bounds hold on any machine
    assert t_fast.median_ms >= 1.0 and t_slow.median_ms >= 4.0
    assert t_slow.median_ms > t_fast.median_ms
    assert t_fast.min_ms <= t_fast.median_ms <= t_fast.p90_ms
    assert t_fast.reps >= 10 and t_slow.reps >= 10
    assert calls["fast"] > t_fast.reps  # warm-up runs happened and are not in the statistics
    assert t_fast.throughput == pytest.approx(8 / (t_fast.median_ms / 1e3))


def test_measure_stops_at_the_budget_and_says_unstable():
    samples = iter([0.001, 0.006] * 10_000)

    def alternating():  # two very different durations: the halves' medians cannot agree within 1 %
        time.sleep(next(samples))

    policy = TimingPolicy(warmup_runs=1, warmup_s=0.0, min_reps=4, budget_s=0.1, block_s=0.0, rel_tol=0.0)
    start = time.perf_counter()
    (t,) = measure([alternating], policy)
    assert time.perf_counter() - start < 2.0
    assert t.stable is False


# --- placement from the profiler ---------------------------------------------------------------------


def _profile(tmp_path, events) -> str:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(events))
    return str(path)


def _node(name, op, provider):
    return {"cat": "Node", "name": f"{name}_kernel_time", "args": {"op_name": op, "provider": provider}}


def test_placement_counts_each_node_once_and_lists_the_ones_elsewhere(tmp_path):
    events = [
        {"cat": "Session", "name": "model_run", "args": {}},
        _node("fused_0", OP_TYPE, "CUDAExecutionProvider"),
        _node("fused_0", OP_TYPE, "CUDAExecutionProvider"),  # a second run of the same node
        _node("shape_0", "Shape", "CPUExecutionProvider"),
        _node("norm", "LayerNormalization", "CUDAExecutionProvider"),  # an op no rule writes
    ]
    placement = read_placement(_profile(tmp_path, events), "CUDAExecutionProvider")
    assert placement.by_provider == {"CUDAExecutionProvider": 2, "CPUExecutionProvider": 1}
    assert placement.fused_nodes == 1
    assert placement.elsewhere == [{"node": "shape_0", "op": "Shape", "provider": "CPUExecutionProvider"}]
    assert "3 nodes: 2 CUDA, 1 CPU" in placement.summary() and "Shape×1" in placement.summary()
    placement.check_fused()  # a shape op on the CPU is normal


def test_fused_node_on_another_provider_fails(tmp_path):
    events = [_node("fused_0", OP_TYPE, "CUDAExecutionProvider"), _node("fused_1", OP_TYPE, "CPUExecutionProvider")]
    placement = read_placement(_profile(tmp_path, events), "CUDAExecutionProvider")
    with pytest.raises(ProviderPlacementError, match=r"1 of 2 FusedLinearGelu nodes ran on CPU instead of CUDA") as e:
        placement.check_fused()
    assert e.value.exit_code == 4


def test_cli_exit_code_4_when_the_fused_node_runs_elsewhere(models, monkeypatch):
    """Exit 4 and one line when ORT placed the fused node on another provider (simulated here: on a
    CPU-only machine it cannot happen for real)."""
    real = placement_module.read_placement

    def moved(profile_file, requested, fused_ops=None):
        placement = real(profile_file, requested, fused_ops)
        placement.elsewhere.append({"node": "fused", "op": OP_TYPE, "provider": "XnnpackExecutionProvider"})
        return placement

    monkeypatch.setattr(placement_module, "read_placement", moved)
    code, _, err = run_cli(models[1], "--provider", "cpu", "--budget", "0.05")  # progress bar left on
    assert code == 4
    assert err.count("\n") == 1 and "ran on Xnnpack instead of CPU" in err


# --- model mode ------------------------------------------------------------------------------------------


def test_model_against_baseline_json_and_plot(models, tmp_path):
    original, fused = models
    report_path, plot_path = tmp_path / "bench.json", tmp_path / "bench.png"
    code, out, err = run_cli(fused, "--baseline", original, "--provider", "cpu", "--batch", "1,3",
                             "--shape", "x=2,8,32", "--json", str(report_path), "--plot", str(plot_path), *QUICK)
    assert code == 0, err
    assert "speedup" in out and "FusedLinearGelu" in out
    data = json.loads(report_path.read_text())
    assert data["schema"] == SCHEMA and data["mode"] == "model"
    assert data["provider"] == "cpu" and data["cuda_graph"] is False
    assert data["models"] == {"optimized": fused, "baseline": original}
    assert [r["batch"] for r in data["results"]] == [1, 3]
    for r in data["results"]:
        assert r["shapes"] == {"x": [r["batch"], 8, K]}  # --batch replaces the batch axis of --shape
        for role in ("optimized", "baseline"):
            t = r[role]
            assert set(t) >= {"median_ms", "p90_ms", "mean_ms", "min_ms", "reps", "stable", "throughput_per_s"}
            assert 0 < t["min_ms"] <= t["median_ms"] <= t["p90_ms"]
            assert t["throughput_per_s"] == pytest.approx(r["batch"] / (t["median_ms"] / 1e3))
        assert r["speedup"] == pytest.approx(r["baseline"]["median_ms"] / r["optimized"]["median_ms"])
    opt, base = data["placement"]["optimized"], data["placement"]["baseline"]
    assert opt["fused_nodes"] == 1 and opt["by_op"][OP_TYPE] == {"CPUExecutionProvider": 1}
    assert base["fused_nodes"] == 0 and opt["elsewhere"] == [] and base["elsewhere"] == []
    png = plot_path.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_model_alone_json_on_stdout(models):
    code, out, _ = run_cli(models[1], "--provider", "cpu", "--json", "-", *QUICK)
    assert code == 0
    data = json.loads(out)  # nothing but the JSON on stdout
    assert data["models"]["baseline"] is None
    (result,) = data["results"]
    assert result["batch"] == 1 and result["baseline"] is None and result["speedup"] is None
    assert result["shapes"] == {"x": [1, 8, K]}


def test_plot_without_baseline_is_written(models, tmp_path):
    report = bench_models(models[1], provider="cpu", batches=[1, 2],
                          policy=TimingPolicy(warmup_runs=2, warmup_s=0.0, min_reps=3, budget_s=0.02))
    path = plot_model_bench(report, tmp_path / "alone.png")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_batch_shapes_replace_only_dynamic_batch_axes():
    model = linear_gelu_model()
    plan = batch_shapes(model, {"x": (4, 8, K)}, [2, 2, 5])
    assert plan == [(2, {"x": (2, 8, K)}), (5, {"x": (5, 8, K)})]
    assert batch_shapes(model, {}, None) == [(1, {"x": (1, 8, K)})]


# --- op mode ----------------------------------------------------------------------------------------------


def test_op_mode_reports_time_flops_bytes_against_ceilings():
    code, out, err = run_cli("--op", "16,32,24", "--provider", "cpu", "--peak-tflops", "0.5", "--peak-gbps", "20",
                             "--json", "-", *QUICK)
    assert code == 0, err
    data = json.loads(out)
    assert data["mode"] == "op" and data["op"] == {"M": 16, "K": 32, "N": 24, "dtype": "fp32", "approximate": "none"}
    assert data["flops"] == 2 * 16 * 32 * 24
    assert data["bytes"] == (16 * 32 + 24 * 32 + 24 + 16 * 24) * 4
    assert data["ceilings"]["tflops"] == 0.5 and data["ceilings"]["tflops_source"] == "given (--peak-tflops)"
    for role in ("fused", "unfused"):
        point = data[role]
        seconds = point["median_ms"] / 1e3
        assert point["tflops"] == pytest.approx(data["flops"] / seconds / 1e12)
        assert point["gbps"] == pytest.approx(data["bytes"] / seconds / 1e9)
        best = max(data["flops"] / 0.5e12, data["bytes"] / 20e9)
        assert point["roofline_fraction"] == pytest.approx(best / seconds)
    assert data["placement"]["by_op"][OP_TYPE] == {"CPUExecutionProvider": 1}
    assert data["speedup"] == pytest.approx(data["unfused"]["median_ms"] / data["fused"]["median_ms"])


def test_op_models_compute_the_same_thing():
    from onnxfuse.runtime import create_session

    fused, unfused = op_models(8, 16, 12, "fp32", "tanh")
    x = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    (y_fused,) = create_session(fused, providers="cpu").run(None, {"X": x})
    (y_unfused,) = create_session(unfused, providers="cpu").run(None, {"X": x})
    np.testing.assert_allclose(y_fused, y_unfused, rtol=1e-4, atol=1e-5)


def test_ceilings_are_measured_when_not_given():
    policy = TimingPolicy(warmup_runs=2, warmup_s=0.0, min_reps=3, budget_s=0.05)
    c = measure_ceilings("cpu", "fp32", policy, gemm_size=64, copy_bytes=1 << 20)
    assert c.tflops > 0 and c.gbps > 0
    assert c.tflops_source.startswith("measured: MatMul 64×64×64") and c.gbps_source.startswith("measured: copy of 1 MiB")


# --- refusals: exit 2, one line ---------------------------------------------------------------------------


def test_cuda_missing_is_exit_2_with_one_line(models):
    from onnxfuse.runtime import cuda_usable

    if cuda_usable():
        pytest.skip("CUDA is usable here")
    code, _, err = run_cli(models[1], "--provider", "cuda", "--budget", "0.05")  # progress bar left on
    assert code == 2
    assert err.count("\n") == 1 and "--provider cpu" in err


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "give the OPTIMIZED model"),
        (["missing.onnx", "--provider", "cpu"], "missing.onnx: no such file"),
        (["--op", "16,32"], "expected M,K,N"),
        (["--op", "16,0,8"], "expected M,K,N"),
        (["MODEL", "--op", "16,32,8"], "--op builds its own model"),
        (["MODEL", "--provider", "cpu", "--batch", "0,2"], "--batch"),
        (["MODEL", "--provider", "cpu", "--batch", "one"], "--batch"),
        (["MODEL", "--provider", "cpu", "--plot", "chart.jpg"], "PNG"),
        (["MODEL", "--provider", "cpu", "--cuda-graph"], "--cuda-graph needs --provider cuda"),
        (["MODEL", "--provider", "cpu", "--shape", "nope=1,2"], "does not take as input"),
        (["MODEL", "--provider", "cpu", "--peak-gbps", "10"], "op-level mode"),
        (["FIXED", "--provider", "cpu", "--batch", "1,2"], "no input of the model has a dynamic axis 0"),
        (["MODEL", "--baseline", "OTHER", "--provider", "cpu"], "other inputs"),
        (["MODEL", "--baseline", "EMPTY", "--provider", "cpu"], "empty file"),
        (["MODEL", "--provider", "cpu", "--json", "no/such/folder/r.json"], "--json no/such/folder/r.json: folder "),
        (["--op", "8,8,8", "--plot", "no/such/folder/p.png"], "does not exist"),
    ],
)
def test_bad_input_is_exit_2_with_one_line(args, message, models, tmp_path):
    fixed, other = tmp_path / "fixed.onnx", tmp_path / "other.onnx"
    onnx.save(linear_gelu_model(batch=2), fixed)
    renamed = linear_gelu_model()
    renamed.graph.input[0].name = "z"
    renamed.graph.node[0].input[0] = "z"
    onnx.save(renamed, other)
    (tmp_path / "empty.onnx").write_bytes(b"")
    names = {"MODEL": models[1], "FIXED": str(fixed), "OTHER": str(other), "EMPTY": str(tmp_path / "empty.onnx")}
    code, out, err = run_cli(*[names.get(a, a) for a in args], *QUICK)
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and err.startswith("onnxfuse: error: ") and message in err
    assert not (tmp_path / "chart.jpg").exists()
