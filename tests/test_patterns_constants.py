"""Constants however the graph spells them: initializers, ``Constant`` nodes, and either one read through
``Identity`` chains (the TorchScript exporter's merged duplicate initializers) or ``Cast`` nodes. The fused
node reads the stored initializer itself, a Cast's conversion becomes a converted copy (inline and
external data), and nothing else of the model changes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from onnxfuse import model_io
from onnxfuse.fuse import fuse_model
from onnxfuse.pipeline import optimize_file
from onnxfuse.patterns.graph import GraphView
from tests.graphs import Builder
from tests.reference_ops import run
from tests.test_fuse import assert_same_outputs, attrs, fused_nodes


def _erf_gelu(b: Builder, x: str) -> str:
    e = b.node("Erf", [b.node("Div", [x, b.const("sqrt2")])])
    return b.node("Mul", [b.node("Mul", [x, b.node("Add", [e, b.const("one")])]), b.const("half")])


def _two_layers_sharing_a_bias(identity_chain: int = 1) -> onnx.ModelProto:
    """Two Linear+GELU layers as the TorchScript exporter writes a freshly initialised model: the second
    layer's (identical, zero) bias is the first one's initializer read through Identity nodes."""
    b = Builder()
    bias = "layer0.bias"
    b.initializers.append(numpy_helper.from_array(np.zeros(16, np.float32), bias))
    x = "x"
    for layer in range(2):
        w = b.tensor(f"layer{layer}.W", (16, 16), 0.25)
        read = bias
        if layer:
            for _ in range(identity_chain):
                read = b.node("Identity", [read])
        x = _erf_gelu(b, b.node("Add", [b.node("MatMul", [x, w]), read]))
    return b.model([("x", [2, 3, 16])], [(x, [2, 3, 16])])


@pytest.mark.parametrize("chain", [1, 3])
def test_bias_through_identity_is_the_initializer(chain):
    model = _two_layers_sharing_a_bias(chain)
    result = fuse_model(model)
    assert len(result.report.fused) == 2 and not result.report.refused, result.report.refused
    nodes = fused_nodes(result.model)
    assert [n.input[2] for n in nodes] == ["layer0.bias", "layer0.bias"]
    # The Identity nodes fed only the block: dead now, and removed; nothing else is left over.
    assert [n.op_type for n in result.model.graph.node] == ["FusedLinearGelu", "FusedLinearGelu"]
    assert {t.name for t in result.model.graph.initializer} >= {"layer0.bias"}
    onnx.checker.check_model(result.model, full_check=True)
    assert_same_outputs(model, result.model)


def test_identity_with_another_reader_stays():
    model = _two_layers_sharing_a_bias()
    identity = next(n for n in model.graph.node if n.op_type == "Identity")
    model.graph.output.append(helper.make_tensor_value_info(identity.output[0], T.FLOAT, [16]))
    result = fuse_model(model)
    assert len(result.report.fused) == 2
    kept = [n for n in result.model.graph.node if n.op_type == "Identity"]
    assert [n.SerializeToString() for n in kept] == [identity.SerializeToString()]
    assert_same_outputs(model, result.model)


def test_weight_through_identity_is_the_initializer_transposed_once():
    b = Builder()
    w = b.tensor("W", (16, 24), 0.25)
    y = _erf_gelu(b, b.node("MatMul", ["x", b.node("Identity", [b.node("Identity", [w])])]))
    model = b.model([("x", [3, 16])], [(y, [3, 24])])
    result = fuse_model(model)
    (node,) = fused_nodes(result.model)
    assert node.input[1] == f"{w}.T" and attrs(node)["transB"] == 1
    assert [t.name for t in result.model.graph.initializer if t.name.startswith("W")] == [f"{w}.T"]
    assert [n.op_type for n in result.model.graph.node] == ["FusedLinearGelu"]
    assert_same_outputs(model, result.model)


def test_cast_of_a_constant_bias_becomes_a_converted_copy():
    """float64 bias stored, cast to float32 by the graph: the fused node reads a float32 copy, rounded
    once as the Cast rounds it."""
    b = Builder()
    stored = np.random.default_rng(1).standard_normal(24)
    b.initializers.append(numpy_helper.from_array(stored, "bias64"))
    cast = b.node("Cast", ["bias64"], to=T.FLOAT)
    y = _erf_gelu(b, b.node("Add", [b.node("MatMul", ["x", b.tensor("W", (16, 24), 0.25)]), cast]))
    model = b.model([("x", [3, 16])], [(y, [3, 24])])
    result = fuse_model(model)
    (node,) = fused_nodes(result.model)
    assert node.input[2] == "bias64.float32"
    converted = next(t for t in result.model.graph.initializer if t.name == node.input[2])
    assert converted.data_type == T.FLOAT
    np.testing.assert_array_equal(numpy_helper.to_array(converted), stored.astype(np.float32))
    assert "bias64" not in {t.name for t in result.model.graph.initializer}  # read by nothing now
    assert not [n for n in result.model.graph.node if n.op_type == "Cast"]
    assert_same_outputs(model, result.model)


def test_cast_of_an_external_weight_is_converted_while_saving(tmp_path):
    b = Builder()
    stored = np.random.default_rng(2).standard_normal((64, 64)) / 8
    b.initializers.append(numpy_helper.from_array(stored, "W64"))
    y = _erf_gelu(b, b.node("MatMul", ["x", b.node("Cast", ["W64"], to=T.FLOAT)]))
    model = b.model([("x", [3, 64])], [(y, [3, 64])])
    src = tmp_path / "in.onnx"
    external = onnx.ModelProto()
    external.CopyFrom(model)  # (saving as external data rewrites the proto it is given)
    onnx.save_model(external, src, save_as_external_data=True, location="in.onnx.data", size_threshold=0)
    report = optimize_file(src, tmp_path / "out.onnx")
    assert len(report.fused) == 1
    out = onnx.load(str(tmp_path / "out.onnx"))
    (node,) = fused_nodes(out)
    w = numpy_helper.to_array(next(t for t in out.graph.initializer if t.name == node.input[1]))
    np.testing.assert_array_equal(w, stored.astype(np.float32).T)
    feeds = {"x": np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)}
    np.testing.assert_allclose(run(out, feeds)[0], run(model, feeds)[0], rtol=1e-5, atol=1e-5)


def test_view_sees_scalars_through_identity_and_cast():
    b = Builder(const_style="node")
    half16 = b.const(0.5, "float16")
    up = b.node("Cast", [b.node("Identity", [half16])], to=T.FLOAT)
    graph = b.model([("x", [2])], [(up, [])]).graph
    view = GraphView(graph)
    assert view.scalar(up) == (0.5, T.FLOAT)
    ref = view.constant_ref(up)
    assert ref.root == half16 and ref.converts and ref.data_type == T.FLOAT and len(ref.via) == 2
    assert view.dtype(up) == T.FLOAT and view.shape(up) == ()


def test_a_rounding_cast_before_another_cast_is_not_one_conversion():
    """float64 → float16 → float32 rounds at float16: not what one float64 → float32 conversion gives,
    so the chain is not a constant the rewrite could copy in one step."""
    b = Builder()
    b.initializers.append(numpy_helper.from_array(np.array([0.1]), "c64"))
    mid = b.node("Cast", ["c64"], to=T.FLOAT16)
    top = b.node("Cast", [mid], to=T.FLOAT)
    view = GraphView(b.model([("x", [1])], [(top, [1])]).graph)
    assert view.constant_ref(mid) is not None
    assert view.constant_ref(top) is None


def test_initializer_shadowed_by_an_input_stays_non_constant_through_identity():
    b = Builder()
    b.initializers.append(numpy_helper.from_array(np.zeros(16, np.float32), "bias"))
    y = _erf_gelu(b, b.node("Add", [b.node("MatMul", ["x", b.tensor("W", (16, 16))]), b.node("Identity", ["bias"])]))
    model = b.model([("x", [3, 16]), ("bias", [16])], [(y, [3, 16])])
    result = fuse_model(model)
    assert not result.report.fused
    assert "is not a constant" in result.report.refused[0].reason
    assert "computed by Identity" in result.report.refused[0].reason


def test_constant_chains_do_not_change_models_without_them():
    """The stored-constant reads of a model with no Identity/Cast in front of its constants are what
    they always were: optimizing it twice gives the same bytes, and the rest of the graph is untouched."""
    model = _two_layers_sharing_a_bias()
    first = fuse_model(model).model
    again = fuse_model(first).model
    assert again.SerializeToString(deterministic=True) == first.SerializeToString(deterministic=True)
    assert model_io.checker_error(first) is None
