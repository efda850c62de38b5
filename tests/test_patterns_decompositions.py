"""The erf, tanh and sigmoid normalisers: exporters' constants are accepted in every precision; constants
that only nearly match are refused with their value, and the block is left bit-identical."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from onnxfuse.fuse import fuse_model
from tests.graphs import Builder, build, input_shape

NEAR_MISSES = [
    ("erf:pytorch:div", "sqrt2", 1.414, "erf-gelu", "the Erf divisor 1.414 is not √2"),
    ("erf:pytorch:div", "sqrt2", 1.4142, "erf-gelu", "the Erf divisor 1.4142 is not √2"),
    ("erf:keras:mul", "inv_sqrt2", 0.7071, "erf-gelu", "is not 1/√2"),
    ("erf:assoc:div", "half", 0.4999, "erf-gelu", "is not 0.5"),
    ("erf:pytorch:mul", "one", 1.001, "erf-gelu", "is not 1"),
    ("tanh:pow", "cubic", 0.0447, "tanh-gelu", "is not 0.044715"),
    ("tanh:mul", "sqrt_2_over_pi", 0.7978, "tanh-gelu", "is not √(2/π)"),
    ("tanh:bloom", "cubic", 0.04471, "tanh-gelu", "is not 0.044715"),
    ("tanh:bloom", "half", 0.501, "tanh-gelu", "is not 0.5"),
    ("sigmoid", "sigmoid_alpha", 1.7, "sigmoid-gelu", "is not QuickGELU's 1.702"),
    ("sigmoid", "sigmoid_alpha", 1.0, "sigmoid-gelu", "is not QuickGELU's 1.702"),
]


@pytest.mark.parametrize("gelu,role,value,rule,reason", NEAR_MISSES)
def test_near_miss_constants_are_refused_bit_identically(gelu, role, value, rule, reason):
    model = build(gelu, "matmul", perturb={role: value})
    result = fuse_model(model)
    assert not result.report.fused
    (refusal,) = result.report.refused
    assert (refusal.rule, reason in refusal.reason) == (rule, True), refusal
    assert result.model.SerializeToString() == model.SerializeToString()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("gelu", ["erf:pytorch:div", "tanh:pow", "tanh:bloom", "sigmoid"])
def test_constants_rounded_to_half_precision_are_accepted(gelu, dtype):
    assert len(fuse_model(build(gelu, "matmul", dtype=dtype)).report.fused) == 1


def test_literals_as_exporters_write_them_are_accepted():
    # BLOOM writes 0.79788456, some TF graphs 1.41421356, 0.7071067811865475; all round to the reference
    for role, value in [("sqrt_2_over_pi", 0.79788456), ("sqrt2", 1.41421356), ("inv_sqrt2", 0.70710678)]:
        gelu = {"sqrt_2_over_pi": "tanh:bloom", "sqrt2": "erf:pytorch:div", "inv_sqrt2": "erf:pytorch:mul"}[role]
        assert len(fuse_model(build(gelu, "matmul", perturb={role: value})).report.fused) == 1


def test_the_sigmoid_form_keeps_its_own_alpha():
    result = fuse_model(build("sigmoid", "matmul", perturb={"sigmoid_alpha": 1.7020001}))
    node = next(n for n in result.model.graph.node if n.op_type == "FusedLinearGelu")
    alpha = next(a.f for a in node.attribute if a.name == "alpha")
    assert alpha == pytest.approx(1.7020001, rel=1e-7)


def _silu_model():
    b = Builder()
    pre = b.node("MatMul", ["x", b.tensor("W", (16, 24))])
    y = b.node("Mul", [pre, b.node("Sigmoid", [pre])])
    return b.model([("x", input_shape("matmul", 3, 16))], [(y, ["batch", "seq", 24])])


def test_plain_silu_and_lone_tanh_erf_are_not_candidates():
    assert fuse_model(_silu_model()).report.to_dict()["refused"] == 0
    b = Builder()
    t = b.node("Tanh", [b.node("MatMul", ["x", b.tensor("W", (16, 24))])])  # a pooler
    e = b.node("Erf", ["x"])
    model = b.model([("x", [5, 16])], [(t, [5, 24]), (e, [5, 16])])
    result = fuse_model(model)
    assert not result.report.fused and not result.report.refused


def test_erf_with_a_different_argument_is_refused_with_reason():
    b = Builder()
    pre = b.node("MatMul", ["x", b.tensor("W", (16, 24))])
    e = b.node("Erf", [b.node("Mul", [pre, "x2"])])  # erf(x*y): two tensors
    y = b.node("Mul", [b.node("Mul", [pre, b.node("Add", [e, b.const("one")])]), b.const("half")])
    model = b.model([("x", [5, 16]), ("x2", [5, 24])], [(y, [5, 24])])
    (refusal,) = fuse_model(model).report.refused
    assert refusal.rule == "erf-gelu" and "not x/√2" in refusal.reason


def test_product_with_an_extra_factor_is_not_gelu():
    b = Builder()
    pre = b.node("MatMul", ["x", b.tensor("W", (16, 24))])
    e = b.node("Erf", [b.node("Div", [pre, b.const("sqrt2")])])
    p = b.node("Add", [e, b.const("one")])
    y = b.node("Mul", [b.node("Mul", [b.node("Mul", [pre, "g"]), p]), b.const("half")])
    model = b.model([("x", [5, 16]), ("g", [5, 24])], [(y, [5, 24])])
    (refusal,) = fuse_model(model).report.refused
    assert "not multiplied by exactly x and 0.5" in refusal.reason


def test_a_constant_that_broadcasts_the_rank_is_not_a_scalar():
    """0.5 of shape [1, 1, 1, 1] makes a 3-D block's output 4-D: fusing would change the output shape."""
    b = Builder()
    pre = b.node("MatMul", ["x", b.tensor("W", (16, 24))])
    half = b.fresh("half")
    b.initializers.append(onnx.numpy_helper.from_array(np.full((1, 1, 1, 1), 0.5, np.float32), half))
    e = b.node("Erf", [b.node("Div", [pre, b.const("sqrt2")])])
    y = b.node("Mul", [b.node("Mul", [pre, b.node("Add", [e, b.const("one")])]), half])
    model = b.model([("x", [2, 5, 16])], [(y, [1, 2, 5, 24])])
    result = fuse_model(model)
    assert not result.report.fused
    assert result.model.SerializeToString() == model.SerializeToString()
