"""The Linear-absorption rule: what it absorbs is covered by test_fuse; here, every place §2 says never to
fuse is refused with its reason and left bit-identical."""

from __future__ import annotations

import onnx
import pytest

from onnxfuse.fuse import fuse_model
from tests.graphs import Builder, block, build, input_shape


def refused_identically(model: onnx.ModelProto, rule: str, reason: str):
    result = fuse_model(model)
    assert not result.report.fused
    assert [r.rule for r in result.report.refused] == [rule], result.report.refused
    assert reason in result.report.refused[0].reason, result.report.refused[0].reason
    assert result.model.SerializeToString() == model.SerializeToString()
    return result.report.refused[0]


def test_intermediate_with_another_consumer():
    b = Builder()
    y = block(b, "x", "onnx:none", "matmul")
    extra = b.node("Relu", [b.tensors["linear_out"]])
    shape = input_shape("matmul", 3, 16)
    model = b.model([("x", shape)], [(y, shape[:-1] + [24]), (extra, shape[:-1] + [24])])
    refused_identically(model, "single-use", "is also read by Relu")


@pytest.mark.parametrize("role", ["bias_out", "linear_out"])
def test_intermediate_that_is_a_graph_output(role):
    b = Builder()
    y = block(b, "x", "onnx:none", "matmul")
    shape = input_shape("matmul", 3, 16)
    b.output(b.tensors[role], shape[:-1] + [24])
    model = b.model([("x", shape)], [(y, shape[:-1] + [24])])
    refused_identically(model, "single-use", "is a graph output")


def test_intermediate_inside_the_activation_with_another_consumer():
    b = Builder()
    y = block(b, "x", "erf:pytorch:div", "matmul")
    extra = b.node("Relu", [b.tensors["erf"]])
    shape = input_shape("matmul", 3, 16)
    model = b.model([("x", shape)], [(y, shape[:-1] + [24]), (extra, shape[:-1] + [24])])
    result = fuse_model(model)
    assert not result.report.fused and result.model.SerializeToString() == model.SerializeToString()


def test_batched_weight():
    b = Builder()
    pre = b.node("MatMul", ["x", b.tensor("W", (3, 16, 24))])
    y = b.node("Gelu", [pre])
    model = b.model([("x", [3, 5, 16])], [(y, [3, 5, 24])])
    refused_identically(model, "linear", "batched weight")


@pytest.mark.parametrize("shape", [(5, 24), (24, 1), (1,), (1, 1, 1, 24)])
def test_bias_not_broadcast_as_N(shape):
    b = Builder()
    pre = b.node("MatMul", ["x", b.tensor("W", (16, 24))])
    pre = b.node("Add", [pre, b.tensor("B", shape)])
    y = b.node("Gelu", [pre])
    out_shape = [5, 24] if shape != (1, 1, 1, 24) else [1, 1, 5, 24]
    model = b.model([("x", [5, 16])], [(y, out_shape)])
    if shape == (24, 1):
        model.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 24
    refused_identically(model, "linear", "does not broadcast over the last axis")


def test_gemm_trans_a():
    b = Builder()
    pre = b.node("Gemm", ["x", b.tensor("W", (16, 24))], transA=1)
    y = b.node("Gelu", [pre])
    model = b.model([("x", [16, 5])], [(y, [5, 24])])
    refused_identically(model, "linear", "transA=1")


def test_gemm_alpha_with_non_constant_weight():
    b = Builder()
    y = b.node("Gelu", [b.node("Gemm", ["x", "w"], alpha=2.0)])
    model = b.model([("x", [5, 16]), ("w", [16, 24])], [(y, [5, 24])])
    refused_identically(model, "linear", "alpha=2 cannot be folded")


def test_dtype_outside_T():
    model = build("onnx:none", "matmul", dtype="float64")
    refused_identically(model, "linear", "dtype float64 is not")


def test_activation_of_a_graph_input():
    b = Builder()
    y = b.node("Gelu", ["x"])
    model = b.model([("x", [5, 16])], [(y, [5, 16])])
    refused_identically(model, "linear", "graph input or constant")


def test_activation_after_something_else():
    b = Builder()
    y = b.node("Gelu", [b.node("Relu", ["x"])])
    model = b.model([("x", [5, 16])], [(y, [5, 16])])
    refused_identically(model, "linear", "follows a Relu")


def test_non_constant_bias():
    b = Builder()
    pre = b.node("MatMul", ["x", b.tensor("W", (16, 24))])
    y = b.node("Gelu", [b.node("Add", [pre, "bias"])])
    model = b.model([("x", [5, 16]), ("bias", [24])], [(y, [5, 24])])
    refused_identically(model, "linear", "is not a constant")


def test_initializer_that_is_also_a_graph_input_is_not_constant():
    model = build("onnx:none", "matmul", bias=False)
    w = model.graph.initializer[0]
    model.graph.input.append(onnx.helper.make_tensor_value_info(w.name, w.data_type, list(w.dims)))
    result = fuse_model(model)
    (node,) = [n for n in result.model.graph.node if n.op_type == "FusedLinearGelu"]
    assert node.input[1] == w.name and node.attribute  # used as given: it can be overridden at run time
    assert {a.name: a.i for a in node.attribute if a.name == "transB"} == {"transB": 0}


def test_two_biases_refused():
    b = Builder()
    pre = b.node("MatMul", ["x", b.tensor("W", (16, 24))])
    pre = b.node("Add", [pre, b.tensor("B", (24,))])
    y = b.node("BiasGelu", [pre, b.tensor("B", (24,))], domain="com.microsoft")
    model = b.model([("x", [5, 16])], [(y, [5, 24])])
    refused_identically(model, "linear", "2 biases")


def test_cast_back_to_another_type_refused():
    model = build("onnx:none", "matmul", dtype="float16", cast_wrap=True)
    cast = next(n for n in model.graph.node if n.op_type == "Cast" and n.attribute[0].i != 1)
    cast.attribute[0].i = onnx.TensorProto.BFLOAT16
    model.graph.output[0].type.tensor_type.elem_type = onnx.TensorProto.BFLOAT16
    refused_identically(model, "linear", "cast back to bfloat16 but the Linear computes in float16")
