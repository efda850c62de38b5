"""Keras ``Dense`` on a 3-D input through tf2onnx: ``tf.tensordot``, written as ``Reshape(X, [-1, K]) →
MatMul → Reshape(shape computed from Shape(X)) → Add(bias) → GELU``. Node for node as tf2onnx 1.17
writes it (int32 round trip of the shape included); the committed Keras exports in tests/models/ are the
real thing. Also here: the almost-tensordots, refused with what was seen, and the channel-first 1x1 Conv
candidates ``inspect`` names."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from onnxfuse.fuse import fuse_model
from tests.graphs import Builder
from tests.reference_ops import run
from tests.test_fuse import fused_nodes

K, N = 16, 24


def _i64(b: Builder, values, stem="c") -> str:
    name = b.fresh(stem)
    b.initializers.append(numpy_helper.from_array(np.array(values, np.int64), name))
    return name


def _erf_gelu(b: Builder, x: str) -> str:
    # tf.math.erf GELU after grappler: x*0.5 and x*(1/√2) are both read from the BiasAdd output
    half = b.node("Mul", [b.const("half"), x])
    e = b.node("Erf", [b.node("Mul", [x, b.const("inv_sqrt2")])])
    return b.node("Mul", [half, b.node("Add", [b.const("one"), e])])


def tensordot_dense(*, flat=(-1, K), free=(0, 1), last=N, x_last=K, cast_shape=True, shape_of_x=True,
                    bias=True) -> tuple[onnx.ModelProto, Builder]:
    b = Builder()
    w = b.tensor("kernel", (K, N), K ** -0.5)
    flat_x = b.node("Reshape", ["x", _i64(b, list(flat))])
    mm = b.node("MatMul", [flat_x, w])
    shape = b.node("Shape", ["x" if shape_of_x else flat_x])
    if cast_shape:
        shape = b.node("Cast", [shape], to=T.INT32)
    lead = b.node("Gather", [shape, _i64(b, list(free)) if not cast_shape else _i32(b, list(free))], axis=0)
    target = b.node("Concat", [lead, _i32(b, [last]) if cast_shape else _i64(b, [last])], axis=0)
    if cast_shape:
        target = b.node("Cast", [target], to=T.INT64)
    y = b.node("Reshape", [mm, target])
    if bias:
        y = b.node("Add", [y, b.tensor("bias", (N,), 0.5)])
    out = _erf_gelu(b, y)
    return b.model([("x", [None, None, x_last])], [(out, [None, None, last])]), b


def _i32(b: Builder, values) -> str:
    name = b.fresh("c")
    b.initializers.append(numpy_helper.from_array(np.array(values, np.int32), name))
    return name


def _run_both(model, fused, batch=2, seq=5):
    x = np.random.default_rng(3).standard_normal((batch, seq, K)).astype(np.float32)
    (want,), (got,) = run(model, {"x": x}), run(fused, {"x": x})
    assert got.shape == want.shape == (batch, seq, N)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("cast_shape", [True, False], ids=["int32-round-trip", "int64"])
def test_tensordot_with_bias_is_a_linear_over_x(cast_shape):
    model, _ = tensordot_dense(cast_shape=cast_shape)
    result = fuse_model(model)
    assert [b.form for b in result.report.fused] == ["erf-GELU+tensordot(MatMul)+Add"], result.report.refused
    (node,) = fused_nodes(result.model)
    assert node.input[0] == "x"  # X in its own rank: the op takes [..., K]
    # The flattening Reshape, the MatMul, the restoring Reshape and its whole shape chain fed only the block.
    assert [n.op_type for n in result.model.graph.node] == ["FusedLinearGelu"]
    onnx.checker.check_model(result.model, full_check=True)
    _run_both(model, result.model)
    _run_both(model, result.model, batch=1, seq=7)


def test_tensordot_parts_read_elsewhere_stay():
    model, b = tensordot_dense()
    flat_x = next(n for n in model.graph.node if n.op_type == "Reshape").output[0]
    model.graph.output.append(helper.make_tensor_value_info(flat_x, T.FLOAT, [None, K]))
    result = fuse_model(model)
    assert len(result.report.fused) == 1
    assert [n.op_type for n in result.model.graph.node] == ["Reshape", "FusedLinearGelu"]


def test_tensordot_without_bias_keeps_its_reshape_form():
    """No Add after it: the Reshape→MatMul→Reshape form, absorbed as it always was."""
    model, _ = tensordot_dense(bias=False)
    result = fuse_model(model)
    assert [b.form for b in result.report.fused] == ["erf-GELU+Reshape→MatMul→Reshape"]
    _run_both(model, result.model)


@pytest.mark.parametrize("kw, seen", [
    (dict(flat=(-1, 8)), "flattens to [-1, 8], not [-1, K=16]"),
    (dict(free=(0,)), "restores [X.shape[0], 24], not X's leading dims and N=24 ([X.shape[0], X.shape[1], 24])"),
    (dict(free=(1, 0)), "restores [X.shape[1], X.shape[0], 24]"),
    (dict(shape_of_x=False), "restores not computed from Shape(X)"),
], ids=["flat-not-K", "drops-a-dim", "swaps-dims", "shape-of-another-tensor"])
def test_almost_tensordot_is_refused_with_what_was_seen(kw, seen):
    model, _ = tensordot_dense(**kw)
    if kw.get("flat") == (-1, 8):
        model.graph.input[0].type.tensor_type.shape.dim[2].dim_value = 8
    result = fuse_model(model)
    assert not result.report.fused
    (refusal,) = result.report.refused
    assert refusal.rule == "linear"
    assert "which is not a tensordot" in refusal.reason and seen in refusal.reason, refusal.reason
    assert result.model.SerializeToString() == model.SerializeToString()


def test_add_of_two_non_linears_names_both():
    b = Builder()
    y = _erf_gelu(b, b.node("Add", [b.node("Relu", ["x"]), b.tensor("bias", (K,))]))
    model = b.model([("x", [3, K])], [(y, [3, K])])
    (refusal,) = fuse_model(model).report.refused
    assert "Add of" in refusal.reason and "computed by Relu" in refusal.reason, refusal.reason
    assert "adds nothing" not in refusal.reason


def _conv_gelu(kernel: int, group: int = 1) -> onnx.ModelProto:
    b = Builder()
    w = b.tensor("conv.weight", (32, 16 // group, kernel, kernel), 0.25)
    conv = b.node("Conv", ["x", w, b.tensor("conv.bias", (32,))], group=group,
                  pads=[kernel // 2] * 4)
    y = _erf_gelu(b, conv)
    return b.model([("x", [1, 16, 4, 4])], [(y, [1, 32, 4, 4])])


def test_channel_first_pointwise_conv_is_named_a_candidate():
    result = fuse_model(_conv_gelu(1))
    (refusal,) = result.report.refused
    assert "1x1 Conv" in refusal.reason and "a Linear over axis 1 (channels first), not the last axis" in refusal.reason


@pytest.mark.parametrize("kernel, group", [(3, 1), (1, 2)])
def test_other_convs_are_not_linears(kernel, group):
    (refusal,) = fuse_model(_conv_gelu(kernel, group)).report.refused
    assert "Linear over axis 1" not in refusal.reason
    assert f"kernel {kernel}x{kernel}" in refusal.reason
