"""The accuracy gate (onnxfuse.compare): statistics, verdicts, exit codes, inputs, reports, plots."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from onnxfuse.cli import main
from onnxfuse.compare import CompareReport, compare_models, verify_optimized
from onnxfuse.error_statistics import DEFAULT_TOLERANCES, tolerance_for
from onnxfuse.errors import AccuracyGateError, BadInputError

K, N = 32, 48
RNG = np.random.default_rng(7)
W = (RNG.standard_normal((K, N)) / math.sqrt(K)).astype(np.float32)
B = (RNG.standard_normal(N) * 0.1).astype(np.float32)


def _model(nodes, inputs, outputs, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)


def linear_gelu(form: str = "erf", bias_shift: float = 0.0, dtype=TensorProto.FLOAT) -> onnx.ModelProto:
    """X[batch, seq, K] -> MatMul -> Add -> GELU, either as the exported erf decomposition or ONNX Gelu.
    ``bias_shift`` perturbs the bias: an optimizer that got a constant wrong."""
    np_type = helper.tensor_dtype_to_np_dtype(dtype)
    inits = [numpy_helper.from_array(W.astype(np_type), "W"), numpy_helper.from_array((B + bias_shift).astype(np_type), "B")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["mm"]), helper.make_node("Add", ["mm", "B"], ["pre"])]
    if form == "op":
        nodes.append(helper.make_node("Gelu", ["pre"], ["y"]))
    else:
        for name, value in (("inv_sqrt2", 2**-0.5), ("one", 1.0), ("half", 0.5)):
            inits.append(numpy_helper.from_array(np.array(value, np_type), name))
        nodes += [
            helper.make_node("Mul", ["pre", "inv_sqrt2"], ["s"]),
            helper.make_node("Erf", ["s"], ["e"]),
            helper.make_node("Add", ["e", "one"], ["e1"]),
            helper.make_node("Mul", ["pre", "e1"], ["m"]),
            helper.make_node("Mul", ["m", "half"], ["y"]),
        ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", dtype, ["batch", "sequence", K])],
        [helper.make_tensor_value_info("y", dtype, ["batch", "sequence", N])],
        inits,
    )


def reference(x: np.ndarray) -> np.ndarray:
    pre = x.astype(np.float64) @ W.astype(np.float64) + B
    return 0.5 * pre * (1 + np.vectorize(math.erf)(pre / math.sqrt(2)))


@pytest.fixture()
def files(tmp_path):
    paths = {}
    for name, model in {
        "erf": linear_gelu("erf"),
        "op": linear_gelu("op"),
        "shifted": linear_gelu("op", bias_shift=1e-2),
        "fp16_erf": linear_gelu("erf", dtype=TensorProto.FLOAT16),
        "fp16_op": linear_gelu("op", dtype=TensorProto.FLOAT16),
    }.items():
        path = tmp_path / f"{name}.onnx"
        onnx.save(model, path)
        paths[name] = str(path)
    return paths


# --- the library API ------------------------------------------------------------------------------------


def test_same_function_written_two_ways_passes(files):
    report = compare_models(files["erf"], files["op"], samples=3, progress=False)
    assert isinstance(report, CompareReport)
    assert report.passed and report.exit_code == 0 and report.failures() == []
    (y,) = report.outputs
    assert y.name == "y" and y.dtype == "float32" and y.shape == [1, 128, N]
    assert y.elements == 3 * 128 * N
    assert y.max_abs < 1e-5 and y.cosine > 0.999999
    assert y.tolerance == DEFAULT_TOLERANCES["float32"]
    assert report.samples == 3 and report.input_shapes == {"x": [1, 128, K]}


def test_statistics_are_the_measured_errors(tmp_path):
    """Feed the same inputs through a known perturbation and check every statistic against numpy."""
    shift = 3e-3
    original, shifted = linear_gelu("op"), linear_gelu("op", bias_shift=shift)
    x = RNG.standard_normal((2, 5, K)).astype(np.float32)
    report = compare_models(original, shifted, inputs=[{"x": x}], progress=False)
    import onnxruntime as ort

    run = lambda m: ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    ref, opt = run(original).astype(np.float64), run(shifted).astype(np.float64)
    err = np.abs(opt - ref)
    (y,) = report.outputs
    assert y.max_abs == pytest.approx(err.max())
    assert y.mean_abs == pytest.approx(err.mean())
    assert y.p50_abs == pytest.approx(np.quantile(err, 0.5))
    assert y.p99_abs == pytest.approx(np.quantile(err, 0.99))
    assert y.p999_abs == pytest.approx(np.quantile(err, 0.999))
    meaningful = np.abs(ref) > y.tolerance.atol
    assert y.max_rel == pytest.approx((err[meaningful] / np.abs(ref[meaningful])).max())
    cos = float((ref * opt).sum() / np.linalg.norm(ref) / np.linalg.norm(opt))
    assert y.cosine == pytest.approx(cos, abs=1e-12)
    bound = y.tolerance.atol + y.tolerance.rtol * np.abs(ref)
    assert y.violations == int((err > bound).sum()) > 0
    assert y.worst_ratio == pytest.approx((err / bound).max())
    # the GELU slope is between 0 and ~1.13, so a bias shift moves outputs by at most ~1.13×shift
    assert 0 < y.max_abs < 1.2 * shift


def test_perturbed_model_fails_with_exit_code_3(files):
    report = compare_models(files["op"], files["shifted"], progress=False)
    assert not report.passed and report.exit_code == 3
    (y,) = report.outputs
    assert y.violations > 0 and y.max_abs > 1e-3
    assert report.failures()[0].startswith("output 'y': ")
    with pytest.raises(AccuracyGateError, match="output 'y'"):
        report.raise_if_failed()


def test_tolerance_override_decides_the_verdict(files):
    assert compare_models(files["op"], files["shifted"], atol=0.05, progress=False).passed
    assert not compare_models(files["op"], files["shifted"], atol=1e-4, rtol=0.0, progress=False).passed
    # rtol alone cannot cover errors where the reference is ~0
    assert not compare_models(files["op"], files["shifted"], atol=0.0, rtol=0.5, progress=False).passed


def test_per_dtype_default_tolerances():
    assert tolerance_for(TensorProto.FLOAT, "cpu") == DEFAULT_TOLERANCES["float32"]
    assert tolerance_for(TensorProto.FLOAT, "cuda") == DEFAULT_TOLERANCES["float32/cuda"]  # TF32
    assert tolerance_for(TensorProto.FLOAT16, "cuda") == DEFAULT_TOLERANCES["float16"]
    assert tolerance_for(TensorProto.BFLOAT16) == DEFAULT_TOLERANCES["bfloat16"]
    assert tolerance_for(TensorProto.INT64).atol == 0 and tolerance_for(TensorProto.BOOL).rtol == 0
    overridden = tolerance_for(TensorProto.FLOAT16, atol=0.5)
    assert overridden.atol == 0.5 and overridden.rtol == DEFAULT_TOLERANCES["float16"].rtol
    assert tolerance_for(TensorProto.INT64, atol=1.0).atol == 0  # integers stay exact


def test_float16_models_use_float16_tolerance(files):
    report = compare_models(files["fp16_erf"], files["fp16_op"], progress=False)
    (y,) = report.outputs
    assert y.dtype == "float16" and y.tolerance == DEFAULT_TOLERANCES["float16"]
    assert report.passed, report.summary()


def _sqrt_model(abs_first: bool) -> onnx.ModelProto:
    nodes = [helper.make_node("Abs", ["x"], ["a"]), helper.make_node("Sqrt", ["a"], ["y"])] if abs_first else [
        helper.make_node("Sqrt", ["x"], ["y"])
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 5])],
    )


def test_nan_positions_that_differ_fail_even_when_finite_values_agree():
    x = np.linspace(-1, 2, 20, dtype=np.float32).reshape(4, 5)
    report = compare_models(_sqrt_model(False), _sqrt_model(True), inputs=[{"x": x}], progress=False)
    (y,) = report.outputs
    assert y.nonfinite_mismatches == int((x < 0).sum()) > 0
    assert y.violations == 0 and y.max_abs == 0.0  # the finite positions agree exactly
    assert not report.passed and "NaN/Inf" in report.failures()[0]
    # identical NaNs on both sides are agreement
    same = compare_models(_sqrt_model(False), _sqrt_model(False), inputs=[{"x": x}], progress=False)
    assert same.passed and same.outputs[0].nonfinite_mismatches == 0


def test_opposite_infinities_are_a_mismatch():
    def model(negate: bool):
        nodes = [helper.make_node("Reciprocal", ["x"], ["r"])]
        nodes.append(helper.make_node("Neg" if negate else "Identity", ["r"], ["y"]))
        return _model(
            nodes,
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
        )

    zeros = np.zeros(3, np.float32)
    assert compare_models(model(False), model(False), inputs=[{"x": zeros}], progress=False).passed
    report = compare_models(model(False), model(True), inputs=[{"x": zeros}], progress=False)
    assert report.outputs[0].nonfinite_mismatches == 3


def test_output_shape_difference_fails():
    def model(reduce: bool):
        nodes = [helper.make_node("ReduceSum", ["x"], ["y"], keepdims=1) if reduce else helper.make_node("Identity", ["x"], ["y"])]
        return _model(
            nodes,
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        )

    report = compare_models(model(False), model(True), progress=False)
    assert not report.passed and "shape [1, 1], the original gives [2, 3]" in report.failures()[0]


def test_models_that_do_not_correspond_are_bad_input(files):
    renamed = linear_gelu("op")
    renamed.graph.output[0].name = "z"
    renamed.graph.node[-1].output[0] = "z"
    with pytest.raises(BadInputError, match="outputs do not correspond: only the original has y; only the optimized has z"):
        compare_models(files["op"], renamed, progress=False)
    other_input = linear_gelu("op")
    other_input.graph.input[0].name = "x2"
    other_input.graph.node[0].input[0] = "x2"
    with pytest.raises(BadInputError, match="inputs do not correspond"):
        compare_models(files["op"], other_input, progress=False)
    with pytest.raises(BadInputError, match="float32 in the original but float16"):
        compare_models(files["op"], files["fp16_op"], progress=False)


def test_unreadable_models_are_bad_input(tmp_path, files):
    with pytest.raises(BadInputError, match="^original model .*missing.onnx: no such file"):
        compare_models(tmp_path / "missing.onnx", files["op"], progress=False)
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x00\x01 not a model")
    with pytest.raises(BadInputError, match="^optimized model .*garbage.onnx: not an ONNX model"):
        compare_models(files["op"], garbage, progress=False)
    # valid protobuf, but ORT cannot run it (an op that does not exist)
    broken = linear_gelu("op")
    broken.graph.node[-1].op_type = "NoSuchOp"
    with pytest.raises(BadInputError, match="ONNX Runtime cannot load the optimized model"):
        compare_models(files["op"], broken, progress=False)


def test_bad_arguments_are_bad_input(files):
    with pytest.raises(BadInputError, match="unknown provider"):
        compare_models(files["op"], files["op"], provider="tpu")
    with pytest.raises(BadInputError, match="at least 1"):
        compare_models(files["op"], files["op"], samples=0)
    with pytest.raises(BadInputError, match="rtol"):
        compare_models(files["op"], files["op"], rtol=-1)
    with pytest.raises(BadInputError, match="does not take"):
        compare_models(files["op"], files["op"], shapes={"input_ids": (1, 2)})


def test_cuda_never_falls_back_silently(files):
    from onnxfuse.runtime import cuda_usable

    if cuda_usable():
        pytest.skip("CUDA is usable here: the fallback cannot be observed")
    with pytest.raises(BadInputError, match="CUDA"):
        compare_models(files["erf"], files["op"], provider="cuda", progress=False)


def test_shapes_and_samples_reach_the_models(files):
    report = compare_models(files["erf"], files["op"], samples=2, shapes={"x": (3, 7, K)}, progress=True)
    assert report.input_shapes == {"x": [3, 7, K]}
    assert report.outputs[0].shape == [3, 7, N] and report.outputs[0].elements == 2 * 3 * 7 * N


def test_user_inputs_npz_are_used(tmp_path, files):
    x = RNG.standard_normal((2, 4, K)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    report = compare_models(files["erf"], files["op"], inputs=tmp_path / "in.npz", progress=False)
    assert report.samples == 1 and report.input_shapes == {"x": [2, 4, K]}
    assert report.inputs == str(tmp_path / "in.npz")


def test_bfloat16_outputs_are_compared():
    def model(via: str):
        # bf16 in and out; the body runs in float32 (ORT CPU has few bf16 kernels)
        nodes = [
            helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT),
            helper.make_node(via, ["xf"], ["yf"]),
            helper.make_node("Cast", ["yf"], ["y"], to=TensorProto.BFLOAT16),
        ]
        return _model(
            nodes,
            [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, ["n", 8])],
            [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, ["n", 8])],
        )

    report = compare_models(model("Gelu"), model("Gelu"), samples=2, progress=False)
    assert report.passed and report.outputs[0].dtype == "bfloat16"
    assert report.outputs[0].tolerance == DEFAULT_TOLERANCES["bfloat16"]
    x = np.linspace(0.5, 4, 8, dtype=np.float32).astype(ml_dtypes.bfloat16).reshape(1, 8)
    bad = compare_models(model("Gelu"), model("Relu"), inputs=[{"x": x}], progress=False)
    # bf16 numbers read back bit-exactly: Gelu(x) - Relu(x) for positive x is the known, tiny-but-real gap
    expected = np.abs(
        np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.astype(np.float64).ravel()]).astype(ml_dtypes.bfloat16).astype(np.float64)
        - x.astype(np.float64).ravel()
    )
    assert bad.outputs[0].max_abs == pytest.approx(expected.max())
    assert not bad.passed


def test_verify_optimized_returns_the_report(files):
    ok = verify_optimized(files["erf"], files["op"], progress=False)
    assert ok.exit_code == 0
    failed = verify_optimized(files["erf"], files["shifted"], progress=False)
    assert failed.exit_code == 3 and failed.failures()
    with pytest.raises(BadInputError):
        verify_optimized(files["erf"], files["erf"] + ".missing")


def test_report_to_dict_is_json_and_complete(files):
    report = compare_models(files["op"], files["shifted"], samples=2, progress=False)
    data = json.loads(json.dumps(report.to_dict()))
    assert data["passed"] is False and data["exit_code"] == 3 and data["samples"] == 2
    (y,) = data["outputs"]
    for key in ("max_abs", "max_rel", "mean_abs", "p50_abs", "p99_abs", "p999_abs", "cosine",
                "nonfinite_mismatches", "violations", "rtol", "atol", "problems"):
        assert key in y
    assert y["max_abs"] == report.outputs[0].max_abs


# --- the fused op itself (needs the built library) -----------------------------------------------------



def test_fused_model_against_its_unfused_original(library_path):
    """The real use: a model with a FusedLinearGelu node judged against the subgraph it replaced."""
    from onnxfuse.domain import DOMAIN, OP_TYPE, DOMAIN_VERSION

    fused_node = helper.make_node(OP_TYPE, ["x", "Wt", "B"], ["y"], domain=DOMAIN, approximate="none")
    fused = helper.make_model(
        helper.make_graph(
            [fused_node],
            "fused",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", K])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence", N])],
            [numpy_helper.from_array(np.ascontiguousarray(W.T), "Wt"), numpy_helper.from_array(B, "B")],
        ),
        opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid(DOMAIN, DOMAIN_VERSION)],
        ir_version=10,
    )
    report = compare_models(linear_gelu("erf"), fused, samples=2, progress=False)
    assert report.passed, report.summary()
    assert report.outputs[0].max_abs < 1e-5
    # and the gate still bites when the fused model is wrong
    wrong = onnx.ModelProto()
    wrong.CopyFrom(fused)
    wrong.graph.node[0].attribute.append(helper.make_attribute("approximate", "tanh"))
    del wrong.graph.node[0].attribute[0]
    x = np.full((1, 4, K), 0.3, np.float32)
    assert not compare_models(linear_gelu("erf"), wrong, inputs=[{"x": x}], atol=1e-7, rtol=1e-7, progress=False).passed


def test_passing_tolerance_is_the_tolerance_the_same_gate_passes_at(files):
    failed = compare_models(files["op"], files["shifted"], samples=2, progress=False)
    assert not failed.passed
    tolerance = failed.passing_tolerance()
    worst = failed.outputs[0].worst_ratio
    assert tolerance.rtol == pytest.approx(1e-4 * worst, rel=0.1) and tolerance.atol == tolerance.rtol
    again = compare_models(files["op"], files["shifted"], samples=2, rtol=tolerance.rtol, atol=tolerance.atol,
                           progress=False)
    assert again.passed
    # at a zero tolerance the ratio is infinite: the largest error, as an atol, is what passes
    exact = compare_models(files["op"], files["shifted"], samples=2, rtol=0, atol=0, progress=False)
    tolerance = exact.passing_tolerance()
    assert tolerance.rtol == 0 and tolerance.atol >= exact.outputs[0].max_abs
    assert compare_models(files["op"], files["shifted"], samples=2, rtol=0, atol=tolerance.atol,
                          progress=False).passed


def test_no_tolerance_passes_a_changed_integer_output():
    def model(op):
        return _model([helper.make_node(op, ["x"], ["y"])],
                      [helper.make_tensor_value_info("x", TensorProto.INT64, [4])],
                      [helper.make_tensor_value_info("y", TensorProto.INT64, [4])])

    x = np.array([-2, -1, 1, 2], np.int64)
    report = compare_models(model("Abs"), model("Neg"), inputs=[{"x": x}], progress=False)
    assert not report.passed and report.passing_tolerance() is None


# --- the command line -----------------------------------------------------------------------------------


def _cli(*args):
    return CliRunner().invoke(main, ["compare", *args], catch_exceptions=False)


def test_cli_pass_prints_the_table_and_exits_0(files):
    result = _cli(files["erf"], files["op"], "--samples", "2", "--no-progress")
    assert result.exit_code == 0, result.output
    assert "PASS" in result.output and "p99.9" in result.output and "cosine" in result.output


TINY_BERT = Path(__file__).resolve().parent.parent / "sample_models" / "tiny_bert.onnx"
SHAPES = ["--shape", "input_ids=1,16", "--shape", "attention_mask=1,16"]


@pytest.fixture(scope="module")
def tiny_bert_fused(tmp_path_factory, library_path):
    out = tmp_path_factory.mktemp("fused") / "tiny_bert.fused.onnx"
    assert CliRunner().invoke(main, ["optimize", str(TINY_BERT), "-o", str(out), "-q"]).exit_code == 0
    return out


def _significant_digits(number: str) -> int:
    return len(number.split("e")[0].replace(".", "").lstrip("0"))


def _table(stdout: str) -> list[list[str]]:
    """The cells of the table's body rows (│ … │ lines), stripped."""
    return [[c.strip() for c in line.strip("│").split("│")] for line in stdout.splitlines() if line.startswith("│")]


@pytest.mark.parametrize("columns", [80, 100, 120])
@pytest.mark.parametrize("tolerance", [[], ["--rtol", "0", "--atol", "0"]], ids=["pass", "fail"])
def test_cli_table_fits_the_terminal_with_no_cell_cut(tiny_bert_fused, columns, tolerance):
    """COLUMNS (or the terminal) chooses a layout the table fits in: no line wider than the terminal, no cell
    ending in an ellipsis, the numbers in 3 significant digits."""
    result = CliRunner().invoke(main, ["compare", str(TINY_BERT), str(tiny_bert_fused), *SHAPES, *tolerance],
                                env={"COLUMNS": str(columns)})
    assert result.exit_code == (3 if tolerance else 0), result.output
    assert "…" not in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) <= columns
    rows = [row for row in _table(result.stdout) if row[0] in ("last_hidden_state", "pooler_output")]
    assert len(rows) == 2, result.stdout  # the names are not cut either
    numbers = [cell for row in rows for cell in row[1:] if re.fullmatch(r"[\d.]+(e-?\d+)?", cell)]
    assert len(numbers) >= 4 and all(_significant_digits(n) <= 3 for n in numbers), numbers
    assert ("mean abs" in result.stdout) == (columns >= 120)
    if tolerance:
        assert all("FAIL" in row[-1] for row in rows) and "FAIL: 2 of 2 outputs outside tolerance" in result.stdout


def test_cli_wide_table_has_every_column(tiny_bert_fused):
    result = CliRunner().invoke(main, ["compare", str(TINY_BERT), str(tiny_bert_fused), *SHAPES],
                                env={"COLUMNS": "200"})
    header = " ".join(result.stdout.split())
    for column in ("output", "dtype", "max abs", "max rel", "mean abs", "p50", "p99", "p99.9", "cosine", "NaN/Inf",
                   "rtol/atol", "verdict"):
        assert f" {column} " in header
    assert "1e-4/1e-4" in result.stdout and re.search(r"1−\d\.\d\de-\d+", result.stdout)  # cosine: its distance to 1


def _masked_embedding(honours_mask: bool) -> onnx.ModelProto:
    """Token embeddings times the attention mask; or, a rewrite that lost the mask, the embeddings alone: the
    two agree wherever the mask is whole."""
    table = numpy_helper.from_array(np.random.default_rng(3).standard_normal((50, 8)).astype(np.float32), "table")
    axes = numpy_helper.from_array(np.array([-1], np.int64), "axes")
    nodes = [helper.make_node("Gather", ["table", "input_ids"], ["tok"])]
    if honours_mask:
        nodes += [helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
                  helper.make_node("Unsqueeze", ["maskf", "axes"], ["mask3"]),
                  helper.make_node("Mul", ["tok", "mask3"], ["out"])]
    else:
        nodes += [helper.make_node("Identity", ["tok"], ["out"])]
    return _model(nodes, [helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "sequence"])
                          for name in ("input_ids", "attention_mask")],
                  [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", "sequence", 8])],
                  [table, axes] if honours_mask else [table])


def test_cli_default_runs_a_padded_sample_where_the_model_has_a_mask(tmp_path, files):
    """By default a model with an attention mask is run twice, the mask whole then padded on the right: a rewrite
    that lost the mask fails the gate; --samples 1 (the mask whole only) cannot see it. Without a mask, one."""
    original, lost = tmp_path / "masked.onnx", tmp_path / "lost.onnx"
    onnx.save(_masked_embedding(True), str(original))
    onnx.save(_masked_embedding(False), str(lost))
    result = _cli(str(original), str(lost), "--shape", "input_ids=1,16", "--json", "-")
    assert result.exit_code == 3 and json.loads(result.stdout)["samples"] == 2
    result = _cli(str(original), str(lost), "--shape", "input_ids=1,16", "--samples", "1", "--json", "-")
    assert result.exit_code == 0 and json.loads(result.stdout)["samples"] == 1
    assert json.loads(_cli(files["erf"], files["op"], "--json", "-").stdout)["samples"] == 1


def test_zero_tolerance_says_so_and_its_json_is_strict(files, tmp_path):
    """atol = rtol = 0 makes the error ratio infinite: the line says what the tolerance asks instead of
    "inf×", and the report stays strict JSON (null, not Infinity, which jq and JSON.parse reject)."""
    result = _cli(files["op"], files["shifted"], "--atol", "0", "--rtol", "0", "--json", str(tmp_path / "r.json"))
    assert result.exit_code == 3
    assert "a zero tolerance: every element must match exactly" in result.stderr and "inf×" not in result.stderr

    def strict(constant):
        raise AssertionError(f"not JSON: {constant}")

    data = json.loads((tmp_path / "r.json").read_text(), parse_constant=strict)
    (out,) = data["outputs"]
    assert out["worst_ratio"] is None and out["passed"] is False


def test_cli_fail_exits_3_with_one_line(files, tmp_path):
    result = _cli(files["op"], files["shifted"], "--samples", "3", "--json", str(tmp_path / "r.json"),
                  "--plot", str(tmp_path / "r.png"))
    assert result.exit_code == 3
    assert "FAIL" in result.output
    (line,) = result.stderr.splitlines()  # exactly one line: no progress bar residue, no traceback
    assert line.startswith("onnxfuse: error: accuracy gate failed: 1 of 1 outputs outside tolerance: output 'y'")
    # the report and the plot are written even when the gate fails: that is when one reads them
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["passed"] is False
    png = (tmp_path / "r.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000


def test_cli_tolerance_options_and_json_to_stdout(files):
    result = _cli(files["op"], files["shifted"], "--atol", "0.05", "--json", "-")
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["outputs"][0]["atol"] == 0.05 and data["passed"] is True


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--shape", "x=1"], "1 dims given"),
        (["--shape", "bogus"], "expected NAME=DIMS"),
        (["--inputs", "/nonexistent/in.npz"], "do not exist"),
        (["--inputs", "/tmp", "--samples", "2"], "drop --samples"),
        (["--plot", "errors.jpg"], "give a file name ending in .png"),
        (["--plot", "/nonexistent/errors.png"], "does not exist"),
        (["--json", "/nonexistent/report.json"], "does not exist"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(files, extra, message):
    result = CliRunner().invoke(main, ["compare", files["erf"], files["op"], *extra])
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_cli_mismatched_models_exit_2(files):
    result = CliRunner().invoke(main, ["compare", files["op"], files["fp16_op"]])
    assert result.exit_code == 2 and "in the original but float16" in result.output


def test_cli_help_documents_the_tolerances():
    result = CliRunner().invoke(main, ["compare", "--help"])
    assert result.exit_code == 0
    for text in ("float32 on CPU  1e-4", "TF32", "float16         1e-2", "bfloat16         5e-2", "Exit codes"):
        assert text in result.output


def test_models_with_external_weights_run_from_their_folder(tmp_path, files):
    """ORT opens a path-given model itself, so weights stored beside it (models over 2 GB must) resolve."""
    folder = tmp_path / "external"
    folder.mkdir()
    model = linear_gelu("op")
    onnx.save(model, folder / "big.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="big.onnx.data", size_threshold=0)
    assert (folder / "big.onnx.data").stat().st_size >= W.nbytes
    report = compare_models(files["erf"], folder / "big.onnx", progress=False)
    assert report.passed and report.outputs[0].max_abs < 1e-5


def _keep_io_types(model: onnx.ModelProto) -> onnx.ModelProto:
    """What ORT's float16 converter does with keep_io_types=True: float32 in and out, float16 inside."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    graph.node.insert(0, helper.make_node("Cast", ["x32"], ["x"], to=TensorProto.FLOAT16))
    graph.node.append(helper.make_node("Cast", ["y"], ["y32"], to=TensorProto.FLOAT))
    graph.input[0].name, graph.output[0].name = "x32", "y32"
    graph.input[0].type.tensor_type.elem_type = graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT
    return out


def test_float32_outputs_of_a_float16_body_get_the_float16_tolerance():
    from onnxfuse.error_statistics import compute_type

    original, optimized = (_keep_io_types(linear_gelu(f, dtype=TensorProto.FLOAT16)) for f in ("erf", "op"))
    assert compute_type(original, "y32") == TensorProto.FLOAT16
    assert compute_type(linear_gelu("erf"), "y") == TensorProto.FLOAT
    report = compare_models(original, optimized, samples=2, progress=False)
    (y,) = report.outputs
    assert y.dtype == "float32" and y.compute_dtype == "float16"
    assert y.tolerance == DEFAULT_TOLERANCES["float16"]
    assert report.to_dict()["outputs"][0]["compute_dtype"] == "float16"
    assert report.passed, report.summary()
    # a plain float32 model reports no separate compute type
    plain = compare_models(linear_gelu("erf"), linear_gelu("op"), progress=False).outputs[0]
    assert plain.compute_dtype == "" and plain.to_dict()["compute_dtype"] == "float32"


def test_inputs_the_original_rejects_are_bad_input_with_the_shapes(tmp_path):
    """A default shape the model cannot take (here a Reshape to a fixed size) says which shapes it tried."""
    shape = numpy_helper.from_array(np.array([4, 4], np.int64), "shape")
    model = _model(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])],
        [shape],
    )
    with pytest.raises(BadInputError, match=r"original model cannot run on sample 0 \(x\[1\]; give dynamic dims with --shape\)"):
        compare_models(model, model, progress=False)
    # given shapes the model cannot take: the hint points at them, not at giving some
    with pytest.raises(BadInputError, match=r"original model cannot run on sample 0 \(x\[15\]; check the --shape values\)"):
        compare_models(model, model, shapes={"x": (15,)}, progress=False)
    assert compare_models(model, model, shapes={"x": (16,)}, progress=False).passed


@pytest.mark.parametrize("provider", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16], ids=["fp32", "fp16", "bf16"])
def test_gate_passes_the_fused_op_at_bert_base_size(dtype, provider, library_path):
    """The default tolerances hold for the fused op at a real FFN size (K=768, N=3072). On the GPU, float32
    runs on TF32 Tensor Cores in both ORT's MatMul and the fused kernel: the float32/cuda tolerance is the
    one that must hold there. bfloat16's reference is the float32 subgraph between Casts (ORT has few
    bfloat16 kernels), fed the same bfloat16 weights."""
    from onnxfuse.domain import DOMAIN, OP_TYPE, DOMAIN_VERSION
    from onnxfuse.runtime import cuda_usable

    if provider == "cuda" and not cuda_usable():
        pytest.skip("no usable CUDA device")
    k, n = 768, 3072
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((n, k)) / math.sqrt(k)).astype(np.float32)
    b = (rng.standard_normal(n) * 0.1).astype(np.float32)
    np_type = np.dtype(ml_dtypes.bfloat16) if dtype == TensorProto.BFLOAT16 else helper.tensor_dtype_to_np_dtype(dtype)
    x_info = helper.make_tensor_value_info("x", dtype, ["batch", "sequence", k])
    y_info = helper.make_tensor_value_info("y", dtype, ["batch", "sequence", n])
    opsets = [helper.make_opsetid("", 20), helper.make_opsetid(DOMAIN, DOMAIN_VERSION)]
    fused = helper.make_model(
        helper.make_graph(
            [helper.make_node(OP_TYPE, ["x", "W", "B"], ["y"], domain=DOMAIN, approximate="none")],
            "fused", [x_info], [y_info],
            [numpy_helper.from_array(w.astype(np_type), "W"), numpy_helper.from_array(b.astype(np_type), "B")],
        ),
        opset_imports=opsets, ir_version=10,
    )
    compute = TensorProto.FLOAT if dtype == TensorProto.BFLOAT16 else dtype
    c_type = helper.tensor_dtype_to_np_dtype(compute)
    nodes = [
        helper.make_node("Cast", ["x"], ["xc"], to=compute),
        helper.make_node("MatMul", ["xc", "Wt"], ["mm"]),
        helper.make_node("Add", ["mm", "B"], ["pre"]),
        helper.make_node("Gelu", ["pre"], ["act"]),
        helper.make_node("Cast", ["act"], ["y"], to=dtype),
    ]
    unfused = helper.make_model(
        helper.make_graph(
            nodes, "unfused", [x_info], [y_info],
            [numpy_helper.from_array(np.ascontiguousarray(w.T).astype(np_type).astype(c_type), "Wt"),
             numpy_helper.from_array(b.astype(np_type).astype(c_type), "B")],
        ),
        opset_imports=opsets[:1], ir_version=10,
    )
    report = compare_models(unfused, fused, provider=provider, samples=2, shapes={"x": (4, 128, k)}, progress=False)
    (y,) = report.outputs
    print(f"{provider} {y.dtype}: max abs {y.max_abs:.3g}, p99.9 {y.p999_abs:.3g}, worst {y.worst_ratio:.3f}x tolerance")
    assert report.passed, report.summary()


# --- dynamic sizes the model can run ------------------------------------------------------------------
def _capped_sequence(rows: int) -> onnx.ModelProto:
    """A model that adds a [rows, 4] position table to its [batch, sequence, 4] input: it runs at up to
    ``rows`` tokens only (a CLIP text tower's 77 positions, in miniature)."""
    table = numpy_helper.from_array(np.arange(rows * 4, dtype=np.float32).reshape(rows, 4) / 10, "positions")
    nodes = [helper.make_node("Shape", ["x"], ["shape"], start=1, end=2),
             helper.make_node("Slice", ["positions", "zero", "shape"], ["used"]),
             helper.make_node("Add", ["x", "used"], ["y"])]
    zero = numpy_helper.from_array(np.array([0], np.int64), "zero")
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", 4])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence", 4])], [table, zero])


def test_compare_picks_sizes_the_model_runs_and_says_which():
    model = _capped_sequence(40)
    report = compare_models(model, model, progress=False)
    assert report.passed and report.input_shapes == {"x": [1, 32, 4]}
    assert "dynamic sizes sequence=32 (chosen: the model does not run at sequence=128)" in report.inputs
    # The defaults where they run: nothing said.
    report = compare_models(_capped_sequence(128), _capped_sequence(128), progress=False)
    assert report.input_shapes == {"x": [1, 128, 4]} and report.inputs == "random (seed 0)"


def test_compare_keeps_the_users_shapes_as_given():
    model = _capped_sequence(40)
    with pytest.raises(BadInputError, match=r"cannot run on sample 0 \(x\[1, 64, 4\]; check the --shape values"):
        compare_models(model, model, shapes={"x": (1, 64, 4)}, progress=False)


def test_compare_says_which_shape_to_give_when_no_size_runs():
    shape = numpy_helper.from_array(np.array([3, 7], np.int64), "shape")
    model = _model([helper.make_node("Reshape", ["x", "shape"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "sequence"])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 7])], [shape])
    with pytest.raises(BadInputError) as e:
        compare_models(model, model, progress=False)
    line = str(e.value)
    assert "\n" not in line and "nor with sequence=128 halved down to 1" in line
    assert "--shape NAME=DIMS, inputs x: float[1,sequence]" in line
    assert compare_models(model, model, shapes={"x": (1, 21)}, progress=False).passed


def test_size_candidates_halve_only_the_defaulted_sequence_dims():
    from onnxfuse.inputs import input_specs, size_candidates

    specs = input_specs(_capped_sequence(8))
    candidates = size_candidates(specs)
    assert [c[0]["x"] for c in candidates] == [(1, s, 4) for s in (128, 64, 32, 16, 8, 4, 2, 1)]
    assert candidates[0][1] == "sequence=128"
    assert size_candidates(specs, {"x": (2, 5, 4)}) == [({"x": (2, 5, 4)}, "")]
