"""GELU constants the graph computes or casts before it uses them, as exporters write them:

* keras2onnx divides by ``Sqrt(2.0)`` of a constant;
* ONNX's own ``Gelu`` function body (what a Gelu expanded by its schema becomes) casts each literal to the
  input's type with ``CastLike(c, X)``, takes ``Sqrt`` of the cast 2 (of 2/π for tanh) and adds with ``Sum``;
* onnxscript's torchlib functions (the torch dynamo exporter's Whisper, inlined) cast each literal with
  ``CastLike`` too, and read the Linear's weight and bias through ``CastLike``.

Each fuses where the values are GELU's (the fold computes what the graph computes, its roundings included)
and computes what the unfused model computes on ONNX Runtime; each near miss stays bit-identical with its
reason, and an Erf read by an Add of something unreadable is a refusal, never a silent skip."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnx.backend.test.case.node as onnx_node_cases
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from onnxfuse.fuse import fuse_model
from onnxfuse.patterns.graph import GraphView, infer_types
from tests.graphs import NP_DTYPES, ONNX_DTYPES, Builder
from tests.ort_run import assert_ort_matches
from tests.reference_ops import run

K, N = 16, 24
FEEDS = {"x": np.random.default_rng(11).standard_normal((2, 5, K)).astype(np.float32)}


def _linear(b: Builder, castlike_weights: bool = False) -> str:
    w, bias = b.tensor("W", (K, N), K ** -0.5), b.tensor("B", (N,), 0.1)
    if castlike_weights:  # onnxscript: the parameters cast to the activation's type
        w = b.node("CastLike", [w, "x"])
    mm = b.node("MatMul", ["x", w])
    if castlike_weights:
        bias = b.node("CastLike", [bias, mm])
    return b.node("Add", [mm, bias])


def keras_sqrt(divisor_of: float = 2.0) -> onnx.ModelProto:
    """keras2onnx: x * 0.5 * (1 + erf(x / Sqrt(2.0)))."""
    b = Builder()
    y = _linear(b)
    arg = b.node("Div", [y, b.node("Sqrt", [b.const(divisor_of)])])
    p = b.node("Add", [b.const("one"), b.node("Erf", [arg])])
    out = b.node("Mul", [b.node("Mul", [y, b.const("half")]), p])
    return b.model([("x", ["b", "s", K])], [(out, ["b", "s", N])])


def onnx_gelu_body(approximate: str = "none", dtype: str = "float32") -> onnx.ModelProto:
    """A Linear, then ONNX's Gelu expanded into its function body by onnx's own helper, node for node."""
    b = Builder(dtype=dtype)
    y = _linear(b)
    gelu = helper.make_node("Gelu", [y], ["out"], approximate=approximate)
    ((nodes, _),), _ = onnx_node_cases.function_testcase_helper(
        gelu, [helper.make_tensor_type_proto(ONNX_DTYPES[dtype], ["b", "s", N])], "body")
    b.nodes.extend(nodes)
    return b.model([("x", ["b", "s", K])], [("out", ["b", "s", N])])


def torchlib_gelu(dtype: str = "float32", castlike_weights: bool = False, shared_half: bool = False,
                  sqrt2: float = math.sqrt(2.0)) -> onnx.ModelProto:
    """onnxscript's aten gelu (approximate="none") behind a Linear, inlined: Div(x, √2), Erf, Add 1, Mul x,
    Mul 0.5, each literal a float32 Constant cast to X's type by CastLike."""
    b = Builder(dtype=dtype)
    x = _linear(b, castlike_weights)

    def literal(value: float) -> str:
        return b.node("CastLike", [b.const(value, "float32"), x])

    half = literal(0.5)
    p = b.node("Add", [b.node("Erf", [b.node("Div", [x, literal(sqrt2)])]), literal(1.0)])
    out = b.node("Mul", [half, b.node("Mul", [x, p])])
    outputs = [(out, ["b", "s", N])]
    if shared_half:
        outputs.append((b.node("Mul", [half, "x"]), ["b", "s", K]))
    return b.model([("x", ["b", "s", K])], outputs)


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


# --- fused -------------------------------------------------------------------------------------------
def test_keras_sqrt_of_two_is_the_erf_divisor():
    model = keras_sqrt()
    result = fuse_model(model)
    assert [b.form for b in result.report.fused] == ["erf-GELU+MatMul+Add"], result.report.refused
    assert _ops(result.model) == ["FusedLinearGelu"]  # the Sqrt and its 2.0 fed only the block
    onnx.checker.check_model(result.model, full_check=True)
    assert_ort_matches(model, result.model, FEEDS)


@pytest.mark.parametrize("approximate,form", [("none", "erf-GELU"), ("tanh", "tanh-GELU")])
def test_onnx_gelu_function_body_fuses(approximate, form):
    model = onnx_gelu_body(approximate)
    assert "Sum" in _ops(model) and "CastLike" in _ops(model)
    result = fuse_model(model)
    assert [b.form for b in result.report.fused] == [f"{form}+MatMul+Add"], result.report.refused
    # every CastLike read X for its type alone and fed only the block: none is left
    assert _ops(result.model) == ["FusedLinearGelu"]
    onnx.checker.check_model(result.model, full_check=True)
    assert_ort_matches(model, result.model, FEEDS)


@pytest.mark.parametrize("castlike_weights", [False, True], ids=["stored-weights", "castlike-weights"])
def test_torchlib_gelu_fuses_with_its_castlike_literals_and_weights(castlike_weights):
    model = torchlib_gelu(castlike_weights=castlike_weights)
    result = fuse_model(model)
    assert [b.form for b in result.report.fused] == ["erf-GELU+MatMul+Add"], result.report.refused
    assert _ops(result.model) == ["FusedLinearGelu"]
    (node,) = result.model.graph.node
    stored = {t.name for t in model.graph.initializer}
    assert node.input[1] == "W_0.T" and node.input[2] in stored  # the stored weight (transposed) and bias
    onnx.checker.check_model(result.model, full_check=True)
    assert_ort_matches(model, result.model, FEEDS)


def test_whisper_ffn_then_the_second_linear_stays():
    """fc1 → GELU (torchlib, CastLike weights) → fc2, as the dynamo exporter inlines Whisper's FFN."""
    model = torchlib_gelu(castlike_weights=True)
    b = Builder(seed=1)
    gelu_out = model.graph.output[0].name
    w2 = b.tensor("W2", (N, K), N ** -0.5)
    model.graph.initializer.extend(b.initializers)
    model.graph.node.extend([helper.make_node("CastLike", [w2, gelu_out], ["w2_cast"], name="fc2_cast"),
                             helper.make_node("MatMul", [gelu_out, "w2_cast"], ["y"], name="fc2")])
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info("y", T.FLOAT, ["b", "s", K]))
    result = fuse_model(model)
    assert len(result.report.fused) == 1 and result.report.refused == []
    assert _ops(result.model) == ["FusedLinearGelu", "CastLike", "MatMul"]
    assert_ort_matches(model, result.model, FEEDS)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("build", [torchlib_gelu, onnx_gelu_body], ids=["torchlib", "onnx-body"])
def test_cast_literals_in_half_precision(build, dtype):
    """The float32 literals cast to 16 bits (√2 computed in 16 bits): GELU's constants at that precision."""
    model = build(dtype=dtype)
    result = fuse_model(model)
    assert [b.form for b in result.report.fused] == ["erf-GELU+MatMul+Add"], result.report.refused
    feeds = {"x": FEEDS["x"].astype(NP_DTYPES[dtype])}
    (want,), (got,) = run(model, feeds), run(result.model, feeds)
    tol = {"float16": 2e-2, "bfloat16": 1e-1}[dtype]
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)


# --- left as they were, with the reason --------------------------------------------------------------
def _unchanged(model: onnx.ModelProto) -> list[str]:
    result = fuse_model(model)
    assert result.report.fused == []
    assert result.model.SerializeToString() == model.SerializeToString()
    return [r.reason for r in result.report.refused]


def test_sqrt_of_another_constant_is_refused_with_its_value():
    (reason,) = _unchanged(keras_sqrt(divisor_of=2.1))
    assert f"the Erf divisor {str(np.float32(math.sqrt(2.1)))} is not √2" in reason
    (reason,) = _unchanged(torchlib_gelu(sqrt2=1.414))
    assert "the Erf divisor 1.414 is not √2" in reason


def test_a_sqrt2_rounded_to_float16_in_a_float32_graph_is_no_sqrt2():
    """The fold rounds as the graph does: √2 cast to float16 (a like of that type) and back divides by
    1.4140625, which is not float32's √2."""
    b = Builder()
    y = _linear(b)
    half_like = b.tensor("h", (1,), 1.0)
    b.initializers[-1] = numpy_helper.from_array(np.ones(1, np.float16), half_like)
    sqrt2 = b.node("Cast", [b.node("CastLike", [b.const(math.sqrt(2.0)), half_like])], to=T.FLOAT)
    p = b.node("Add", [b.node("Erf", [b.node("Div", [y, sqrt2])]), b.const("one")])
    out = b.node("Mul", [b.node("Mul", [y, b.const("half")]), p])
    (reason,) = _unchanged(b.model([("x", ["b", "s", K])], [(out, ["b", "s", N])]))
    assert "divisor 1.414062" in reason and "is not √2" in reason


def test_a_castlike_literal_read_elsewhere_keeps_the_block():
    (reason,) = _unchanged(torchlib_gelu(shared_half=True))
    assert "is also read by CastLike" in reason


def test_an_erf_plus_something_unreadable_is_a_refusal_not_a_silence():
    b = Builder()
    y = _linear(b)
    p = b.node("Add", [b.node("Erf", [b.node("Div", [y, b.const("sqrt2")])]), "offset"])
    out = b.node("Mul", [b.node("Mul", [y, b.const("half")]), p])
    model = b.model([("x", ["b", "s", K]), ("offset", [])], [(out, ["b", "s", N])])
    (reason,) = _unchanged(model)
    assert "of 'offset' (a graph input), not of a constant onnxfuse can read as 1" in reason


def test_an_erf_read_by_no_add_is_no_candidate():
    b = Builder()
    out = b.node("Mul", [b.node("Erf", [_linear(b)]), b.const("half")])
    assert _unchanged(b.model([("x", ["b", "s", K])], [(out, ["b", "s", N])])) == []


# --- the fold itself ---------------------------------------------------------------------------------
def _view(b: Builder, outputs) -> GraphView:
    model = b.model([("x", ["b", K])], outputs)
    return GraphView(model.graph, inferred=list(infer_types(model).value_info))


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_folded_values_are_rounded_once_per_op_as_ieee_arithmetic(dtype):
    b = Builder(dtype=dtype)
    two = b.const(2.0)
    ops = {"sqrt": b.node("Sqrt", [two]), "recip": b.node("Reciprocal", [b.node("Sqrt", [two])]),
           "neg": b.node("Neg", [two]), "div": b.node("Div", [b.const(1.0), b.node("Sqrt", [two])]),
           "sub": b.node("Sub", [b.const(0.1), b.const(0.3)])}
    view = _view(b, [(name, []) for name in ops.values()])
    np_type = NP_DTYPES[dtype]
    two_t, one_t = np_type(2.0), np_type(1.0)
    expected = {"sqrt": np.sqrt(two_t), "recip": np.reciprocal(np.sqrt(two_t)), "neg": -two_t,
                "div": one_t / np.sqrt(two_t), "sub": np_type(0.1) - np_type(0.3)}
    for name, tensor in ops.items():
        value, elem, rank = view.folded_scalar(tensor)
        assert (value, elem, rank) == (float(expected[name]), ONNX_DTYPES[dtype], 0), name
        assert view.scalar(tensor) == (value, elem)


def test_what_does_not_fold():
    b = Builder()
    zero, minus = b.const(0.0), b.const(-2.0)
    cases = {
        "division by zero": b.node("Div", [b.const(1.0), zero]),
        "sqrt of a negative": b.node("Sqrt", [minus]),
        "reciprocal of zero": b.node("Reciprocal", [zero]),
        "a graph input": b.node("Sqrt", ["x"]),
        "an op not folded": b.node("Exp", [b.const(1.0)]),
        "mixed types": b.node("Add", [b.const(1.0), b.const(1.0, "float16")]),
    }
    view = _view(b, [(t, None) for t in cases.values()])
    for why, tensor in cases.items():
        assert view.folded_scalar(tensor) is None, why
        assert view.scalar(tensor) is None, why
    b = Builder()
    wide = b.node("Sqrt", [b.tensor("v", (1, 1), 1.0)])  # one element, rank 2: broadcasts a rank, no scalar
    view = _view(b, [(wide, None)])
    assert view.folded_scalar(wide)[2] == 2 and view.scalar(wide) is None


def test_castlike_of_a_constant_is_that_constant_converted():
    b = Builder()
    c16 = b.node("CastLike", [b.const(1.5), b.tensor("like16", (1,), 1.0)])
    b.initializers[-1] = numpy_helper.from_array(np.ones(1, np.float16), b.nodes[-1].input[1])
    same = b.node("CastLike", [b.const(0.5), "x"])
    view = _view(b, [(c16, None), (same, None)])
    ref = view.constant_ref(c16)
    assert ref is not None and ref.data_type == T.FLOAT16 and ref.converts and ref.via
    assert view.scalar(c16) == (1.5, T.FLOAT16)
    assert view.scalar(same) == (0.5, T.FLOAT) and not view.constant_ref(same).converts
