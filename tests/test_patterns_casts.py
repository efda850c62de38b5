"""Cast wrappers of fp16/bf16 graphs: Cast(to=float) → GELU → Cast back is one activation."""

from __future__ import annotations

import onnx

from onnxfuse.fuse import fuse_model
from tests.graphs import Builder, build


def test_cast_wrapped_activation_is_absorbed_with_its_casts():
    model = build("onnx:none", "matmul", dtype="float16", cast_wrap=True)
    result = fuse_model(model)
    (block,) = result.report.fused
    assert block.form == "Cast(Gelu(erf))+MatMul+Add"
    assert [n.op_type for n in result.model.graph.node] == ["FusedLinearGelu"]


def test_upcast_without_a_cast_back_is_refused():
    b = Builder(dtype="float16")
    pre = b.node("MatMul", ["x", b.tensor("W", (8, 8))])
    y = b.node("Gelu", [b.node("Cast", [pre], to=onnx.TensorProto.FLOAT)])
    model = b.model([("x", [4, 8])], [])
    model.graph.output.append(onnx.helper.make_tensor_value_info(y, onnx.TensorProto.FLOAT, [4, 8]))
    result = fuse_model(model)
    (refusal,) = result.report.refused
    assert refusal.rule == "cast-wrapper" and "not cast back" in refusal.reason
    assert result.model.SerializeToString() == model.SerializeToString()


def test_per_consumer_upcasts_of_a_decomposition():
    """ORT's converter may cast x once per consumer: x is still the same tensor."""
    model = build("erf:pytorch:div", "matmul", dtype="float16", cast_wrap=True)
    upcast = next(n for n in model.graph.node if n.op_type == "Cast" and n.attribute[0].i == 1)
    second = onnx.helper.make_node("Cast", upcast.input, ["x_again"], to=onnx.TensorProto.FLOAT, name="Cast_again")
    model.graph.node.insert(list(model.graph.node).index(upcast) + 1, second)
    mul = next(n for n in model.graph.node if n.op_type == "Mul" and upcast.output[0] in n.input)
    mul.input[list(mul.input).index(upcast.output[0])] = "x_again"
    result = fuse_model(model)
    assert len(result.report.fused) == 1, result.report.refused
    assert [n.op_type for n in result.model.graph.node] == ["FusedLinearGelu"]


def _fp16_island(bias_kind: str):
    """float16 MatMul → Cast(float32) → <op>(·, bias) → Cast(float16), as ORT's float16 converter writes
    when the GELU op is in its op_block_list: the bias is float32, or float16 behind a Cast(float32)."""
    import numpy as np
    from onnx import numpy_helper

    b = Builder(dtype="float16")
    pre = b.node("Cast", [b.node("MatMul", ["x", b.tensor("W", (16, 24))])], to=onnx.TensorProto.FLOAT)
    if bias_kind == "float32":
        bias = b.fresh("B32")
        b.initializers.append(numpy_helper.from_array((np.arange(24) / 24).astype(np.float32), bias))
        op = "FastGelu"
    else:
        bias = b.node("Cast", [b.tensor("B", (24,), 0.1)], to=onnx.TensorProto.FLOAT)
        op = "BiasGelu"
    y = b.node("Cast", [b.node(op, [pre, bias], domain="com.microsoft")], to=onnx.TensorProto.FLOAT16)
    return b.model([("x", [5, 16])], [(y, [5, 24])])


def test_float32_bias_of_a_float32_island_is_stored_in_float16():
    from tests.test_fuse import assert_same_outputs

    model = _fp16_island("float32")
    result = fuse_model(model)
    assert [b.form for b in result.report.fused] == ["Cast(com.microsoft.FastGelu+bias)+MatMul"]
    (node,) = result.model.graph.node
    bias = next(t for t in result.model.graph.initializer if t.name == node.input[2])
    assert bias.data_type == onnx.TensorProto.FLOAT16 and bias.name.endswith(".float16")
    assert_same_outputs(model, result.model, "float16")


def test_float16_bias_behind_a_cast_is_read_before_the_cast():
    from tests.test_fuse import assert_same_outputs

    model = _fp16_island("cast")
    result = fuse_model(model)
    assert len(result.report.fused) == 1, result.report.refused
    (node,) = result.model.graph.node  # the bias's Cast went with the block
    assert node.input[2] == model.graph.initializer[1].name
    assert_same_outputs(model, result.model, "float16")
