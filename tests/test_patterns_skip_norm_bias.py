"""A Gemm's bias moved into the SkipLayerNormalization behind it (patterns/skip_norm_bias.py): the forms it
takes, the outputs against the original on ORT's CPU provider (float32 and float16, every output of the
normalization), and the forms it must leave bit-identical."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from onnxfuse.fuse import fuse_model
from onnxfuse.patterns import GemmBiasIntoSkipNorm, default_rules
from onnxfuse.patterns.rule import after_rewrites

MODELS = Path(__file__).parent / "models"
M_ROWS, HIDDEN, K_IN = 6, 16, 24  # [B=2, S=3] rows


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _model(dtype=T.FLOAT, norm="SkipLayerNormalization", reshape=True, gemm_as_skip=False, beta=1.0,
           bias_shape=(HIDDEN,), norm_bias=False, read_twice=False, trans_b=1, rng=None) -> onnx.ModelProto:
    rng = rng or np.random.default_rng(0)
    npdt = helper.tensor_dtype_to_np_dtype(dtype)
    x = helper.make_tensor_value_info("x", dtype, [M_ROWS, K_IN])
    skip = helper.make_tensor_value_info("skip", dtype, [2, 3, HIDDEN])
    weight = rng.standard_normal((HIDDEN, K_IN) if trans_b else (K_IN, HIDDEN)) * 0.3
    inits = [numpy_helper.from_array(weight.astype(npdt), "w"),
             numpy_helper.from_array(rng.standard_normal(bias_shape).astype(npdt), "c"),
             numpy_helper.from_array((1 + 0.1 * rng.standard_normal(HIDDEN)).astype(npdt), "gamma"),
             numpy_helper.from_array((0.1 * rng.standard_normal(HIDDEN)).astype(npdt), "beta"),
             numpy_helper.from_array(rng.standard_normal(HIDDEN).astype(npdt), "own_bias"),
             numpy_helper.from_array(np.array([2, 3, HIDDEN], np.int64), "shape")]
    nodes = [helper.make_node("Gemm", ["x", "w", "c"], ["proj"], name="proj_gemm", transB=trans_b, beta=beta)]
    summand = "proj"
    if reshape:
        nodes.append(helper.make_node("Reshape", ["proj", "shape"], ["proj3"], name="proj_reshape"))
        summand = "proj3"
    pair = ["skip", summand] if gemm_as_skip else [summand, "skip"]
    norm_inputs = pair + ["gamma"] + (["beta"] if norm == "SkipLayerNormalization" else [])
    if norm_bias:
        norm_inputs.append("own_bias")
    # output 3, the sum the residual stream reads, at the same place in both normalizations
    nodes.append(helper.make_node(norm, norm_inputs, ["y", "", "", "sum"], name="norm", domain="com.microsoft",
                                  epsilon=1e-5))
    graph_outputs = [helper.make_tensor_value_info("y", dtype, None), helper.make_tensor_value_info("sum", dtype, None)]
    if read_twice:
        nodes.append(helper.make_node("Identity", [summand], ["seen"], name="elsewhere"))
        graph_outputs.append(helper.make_tensor_value_info("seen", dtype, None))
    graph = helper.make_graph(nodes, "g", [x, skip], graph_outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                             ir_version=8)


def _feeds(model: onnx.ModelProto, rng) -> dict:
    npdt = helper.tensor_dtype_to_np_dtype(model.graph.input[0].type.tensor_type.elem_type)
    return {"x": rng.standard_normal((M_ROWS, K_IN)).astype(npdt), "skip": rng.standard_normal((2, 3, HIDDEN)).astype(npdt)}


def _fused(model):
    result = fuse_model(model)
    return result, [b for b in result.report.fused if b.rule == "gemm-bias-into-skip-norm"]


FORMS = [
    {},
    {"reshape": False},
    {"gemm_as_skip": True},
    {"trans_b": 0},
    {"norm": "SkipSimplifiedLayerNormalization"},
    {"dtype": T.FLOAT16},
    {"dtype": T.FLOAT16, "norm": "SkipSimplifiedLayerNormalization"},
]


@pytest.mark.parametrize("form", FORMS, ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()) or "default")
def test_bias_moves_into_the_normalization_and_outputs_match(form, rng):
    model = _model(rng=rng, **form)
    if not form.get("reshape", True):  # no Reshape: the normalization reads the Gemm's [M, N] directly
        model.graph.input[1].type.tensor_type.shape.dim[0].dim_value = M_ROWS
        del model.graph.input[1].type.tensor_type.shape.dim[1]
    result, blocks = _fused(model)
    assert len(blocks) == 1
    gemm = next(n for n in result.model.graph.node if n.op_type == "Gemm")
    norm = next(n for n in result.model.graph.node if n.domain == "com.microsoft")
    at = 4 if norm.op_type == "SkipLayerNormalization" else 3
    assert list(gemm.input) == ["x", "w"] and norm.input[at] == "c" and norm.op_type == form.get("norm", norm.op_type)
    assert {a.name: helper.get_attribute_value(a) for a in gemm.attribute}.get("transB") == form.get("trans_b", 1)
    feeds = _feeds(model, rng)
    if not form.get("reshape", True):
        feeds["skip"] = feeds["skip"].reshape(M_ROWS, HIDDEN)
    want, got = _session(model).run(None, feeds), _session(result.model).run(None, feeds)
    tol = 2e-3 if form.get("dtype") == T.FLOAT16 else 1e-5
    for name, w, g in zip(("y", "sum"), want, got):
        w, g = w.astype(np.float64), g.astype(np.float64)
        assert w.shape == g.shape
        assert np.max(np.abs(w - g)) <= tol * max(1.0, np.max(np.abs(w))), name


NEGATIVES = [
    ({"norm_bias": True}, "the normalization has a bias already"),
    ({"beta": 0.5}, "C is scaled"),
    ({"bias_shape": (M_ROWS, HIDDEN)}, "C is a full matrix, not a per-column bias"),
    ({"bias_shape": (1, HIDDEN)}, "C is two-dimensional"),
    ({"read_twice": True}, "the Gemm's output is read elsewhere"),
]


def test_runs_after_the_rules_that_take_gemms():
    # A Gemm that is a Linear+GELU's or a packed projection's is claimed by that rule first: it is the last rule
    # of the driver's first pass (the second pass holds the rules that match what the first one wrote).
    first_pass = [r for r in default_rules() if not after_rewrites(r)]
    assert isinstance(first_pass[-1], GemmBiasIntoSkipNorm)


@pytest.mark.parametrize("form,why", NEGATIVES, ids=[w for _, w in NEGATIVES])
def test_other_forms_stay_bit_identical(form, why, rng):
    model = _model(rng=rng, **form)
    result, blocks = _fused(model)
    assert blocks == [], why
    assert result.model.graph.node == model.graph.node


def _flattened_model(dtype=T.FLOAT, trans_b=0, back="lead", flat_read_twice=False, rng=None) -> onnx.ModelProto:
    """GPT-2's Conv1D as the TorchScript exporter writes it: Reshape(x, Concat([-1], Shape(x)[-1:])) → Gemm
    (C the bias) → Reshape(·, Concat(Shape(x)[0], Shape(x)[1], [N])) → SkipLayerNormalization, x [B, S, K]
    with symbolic B and S. ``back``: "lead" (x's leading dims), "swapped" ([S, B, N], not x's) or "constant"
    ([2, 3, N] where x's B and S are not known to be 2 and 3)."""
    rng = rng or np.random.default_rng(0)
    npdt = helper.tensor_dtype_to_np_dtype(dtype)
    x = helper.make_tensor_value_info("x", dtype, ["B", "S", K_IN])
    skip = helper.make_tensor_value_info("skip", dtype, ["B", "S", HIDDEN])
    weight = rng.standard_normal((HIDDEN, K_IN) if trans_b else (K_IN, HIDDEN)) * 0.3
    i64 = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    inits = [numpy_helper.from_array(weight.astype(npdt), "w"),
             numpy_helper.from_array(rng.standard_normal(HIDDEN).astype(npdt), "c"),
             numpy_helper.from_array((1 + 0.1 * rng.standard_normal(HIDDEN)).astype(npdt), "gamma"),
             numpy_helper.from_array((0.1 * rng.standard_normal(HIDDEN)).astype(npdt), "beta"),
             i64("minus_one", [-1]), i64("last", [-1]), i64("end", [2**62]), i64("zero", 0), i64("one", 1),
             i64("axes0", [0]), i64("n", [HIDDEN]), i64("fixed", [2, 3, HIDDEN])]
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Slice", ["shape", "last", "end"], ["k"]),
             helper.make_node("Concat", ["minus_one", "k"], ["flat_shape"], axis=0),
             helper.make_node("Reshape", ["x", "flat_shape"], ["flat"], name="flatten"),
             helper.make_node("Gemm", ["flat", "w", "c"], ["proj"], name="proj_gemm", transB=trans_b),
             helper.make_node("Gather", ["shape", "zero"], ["b"], axis=0),
             helper.make_node("Gather", ["shape", "one"], ["s"], axis=0),
             helper.make_node("Unsqueeze", ["b", "axes0"], ["b1"]),
             helper.make_node("Unsqueeze", ["s", "axes0"], ["s1"])]
    if back == "constant":
        target = "fixed"
    else:
        target = "back_shape"
        nodes.append(helper.make_node("Concat", ["b1", "s1", "n"] if back == "lead" else ["s1", "b1", "n"],
                                      [target], axis=0))
    nodes += [helper.make_node("Reshape", ["proj", target], ["proj3"], name="unflatten"),
              helper.make_node("SkipLayerNormalization", ["proj3", "skip", "gamma", "beta"], ["y", "", "", "sum"],
                               name="norm", domain="com.microsoft", epsilon=1e-5)]
    outputs = [helper.make_tensor_value_info("y", dtype, None), helper.make_tensor_value_info("sum", dtype, None)]
    if flat_read_twice:
        nodes.append(helper.make_node("Identity", ["flat"], ["seen"], name="elsewhere"))
        outputs.append(helper.make_tensor_value_info("seen", dtype, None))
    graph = helper.make_graph(nodes, "g", [x, skip], outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                             ir_version=8)


def _assert_close(model, fused, feeds, dtype):
    want, got = _session(model).run(None, feeds), _session(fused).run(None, feeds)
    tol = 2e-3 if dtype == T.FLOAT16 else 1e-5
    for w, g in zip(want, got):
        w, g = w.astype(np.float64), g.astype(np.float64)
        assert w.shape == g.shape
        assert np.max(np.abs(w - g)) <= tol * max(1.0, np.max(np.abs(w)))


@pytest.mark.parametrize("dtype", [T.FLOAT, T.FLOAT16])
def test_the_flattening_around_the_gemm_goes_with_the_bias(dtype, rng):
    """Conv1D's Reshape → Gemm → Reshape and the shape arithmetic behind both targets become one MatMul of x
    as it is; the normalization takes the bias, and the outputs match at two batch and sequence sizes."""
    model = _flattened_model(dtype, rng=rng)
    result, blocks = _fused(model)
    assert len(blocks) == 1 and blocks[0].details["flattening_dropped"]
    ops = [n.op_type for n in result.model.graph.node]
    assert ops == ["MatMul", "SkipLayerNormalization"]
    matmul, norm = result.model.graph.node
    assert list(matmul.input) == ["x", "w"] and norm.input[4] == "c"
    npdt = helper.tensor_dtype_to_np_dtype(dtype)
    for b, s in ((2, 3), (1, 7)):
        feeds = {"x": rng.standard_normal((b, s, K_IN)).astype(npdt), "skip": rng.standard_normal((b, s, HIDDEN)).astype(npdt)}
        _assert_close(model, result.model, feeds, dtype)


@pytest.mark.parametrize("form,why", [
    ({"trans_b": 1}, "the weight is [N, K]: a MatMul would need it transposed"),
    ({"back": "swapped"}, "the second target is not x's leading dimensions"),
    ({"back": "constant"}, "the second target is constant, x's dimensions symbolic: not shown equal"),
    ({"flat_read_twice": True}, "the flattened x is read elsewhere"),
], ids=["transB", "swapped", "constant", "read-twice"])
def test_a_flattening_not_proved_stays(form, why, rng):
    """The bias still moves; the Reshapes and the Gemm stay as written."""
    model = _flattened_model(rng=rng, **form)
    result, blocks = _fused(model)
    assert len(blocks) == 1 and not blocks[0].details["flattening_dropped"], why
    ops = [n.op_type for n in result.model.graph.node]
    assert "Gemm" in ops and ops.count("Reshape") == 2
    if form.get("back") != "swapped":  # a swapped target does not run at B != S
        feeds = {"x": rng.standard_normal((2, 3, K_IN)).astype(np.float32),
                 "skip": rng.standard_normal((2, 3, HIDDEN)).astype(np.float32)}
        _assert_close(model, result.model, feeds, T.FLOAT)


def test_gpt2_after_orts_optimizer_moves_every_attention_projection_bias(rng):
    # ORT's optimizer leaves GPT-2's attention output projection a Gemm with C in front of its
    # SkipLayerNormalization (the MLP's own became MatMul + the normalization's bias): one per layer, the
    # exporter's flattening around it (x.view(-1, K), addmm, .view(*x.shape[:-1], N)) gone with it.
    model = onnx.load(MODELS / "gpt2_torchscript_op14_ortopt.onnx")
    result = fuse_model(model, rules=(GemmBiasIntoSkipNorm(),))  # this rule alone: no op library needed
    blocks = result.report.fused
    assert len(blocks) == 2 and all(b.details["flattening_dropped"] for b in blocks)
    assert not [n for n in result.model.graph.node if n.op_type == "Gemm" or "c_proj" in n.name and n.op_type != "MatMul"]
    assert len(model.graph.node) - len(result.model.graph.node) >= 2 * 14
    ref, new = _session(model), _session(result.model)
    feeds = {"input_ids": rng.integers(0, 100, size=(3, 5)).astype(np.int64),
             "attention_mask": np.array([[1] * 5, [0, 0, 1, 1, 1], [1, 1, 1, 0, 0]], np.int64)}
    feeds = {i.name: feeds[i.name] for i in ref.get_inputs()}
    for w, g in zip(ref.run(None, feeds), new.run(None, feeds)):
        w, g = w.astype(np.float64), g.astype(np.float64)
        assert np.max(np.abs(w - g)) <= 1e-4 * max(1.0, np.max(np.abs(w)))


# Every committed export where the rule applies, and how often (all others: never).
EXPECTED = {"gpt2_torchscript_op14_ortopt.onnx": 2, "gpt2_torchscript_op14_ortfp16.onnx": 2,
            "mixed_precision/gpt2_torchscript_op14_ortfp16_keepfastgelu.onnx": 2}


@pytest.mark.parametrize("file", sorted(str(p.relative_to(MODELS)) for p in MODELS.rglob("*.onnx")
                                         if p.relative_to(MODELS).parts[0] != "legacy"))  # (its own tests)
def test_committed_exports(file):
    model = onnx.load(MODELS / file, load_external_data=False)
    result = fuse_model(model, rules=(GemmBiasIntoSkipNorm(),), base_dir=MODELS)
    assert len(result.report.fused) == EXPECTED.get(file, 0)
