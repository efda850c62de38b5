"""The pass driver on hand-built graphs: every GELU form × Linear form × knob fuses into one node that
computes what the block computed (checked against a float64 oracle), and nothing else changes."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest

from onnxfuse.domain import DOMAIN, DOMAIN_VERSION, OP_TYPE
from onnxfuse.errors import BadInputError
from onnxfuse.fuse import fuse_model
from tests.graphs import (ALL_GELU_FORMS, APPROXIMATE, LINEAR_FORMS, NP_DTYPES, Builder, block, build,
                          build_gated, build_mlp, input_shape)
from tests.reference_ops import run

TOL = {"float32": 2e-5, "float16": 4e-3, "bfloat16": 3e-2}


def feeds_for(model: onnx.ModelProto, dtype: str, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {}
    for v in model.graph.input:
        dims = [d.dim_value if d.HasField("dim_value") else 3 for d in v.type.tensor_type.shape.dim]
        feeds[v.name] = rng.standard_normal(dims).astype(NP_DTYPES[dtype])
    return feeds


def assert_same_outputs(original, fused, dtype="float32", seed=0):
    feeds = feeds_for(original, dtype, seed)
    for a, b in zip(run(original, feeds), run(fused, feeds)):
        a, b = a.astype(np.float64), b.astype(np.float64)
        assert a.shape == b.shape
        np.testing.assert_allclose(b, a, rtol=TOL[dtype], atol=TOL[dtype])


def fused_nodes(model):
    return [n for n in model.graph.node if n.domain == DOMAIN and n.op_type == OP_TYPE]


def attrs(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


@pytest.mark.parametrize("swap", [False, True], ids=["order", "swapped"])
@pytest.mark.parametrize("linear", list(LINEAR_FORMS))
@pytest.mark.parametrize("gelu", ALL_GELU_FORMS)
def test_every_form_fuses_into_one_exact_node(gelu, linear, swap):
    model = build(gelu, linear, swap=swap)
    result = fuse_model(model)
    assert len(result.report.fused) == 1 and not result.report.refused
    (node,) = fused_nodes(result.model)
    assert attrs(node)["approximate"].decode() == APPROXIMATE[gelu]
    assert attrs(node)["transB"] == 1  # constant W stored [N, K]
    w = next(t for t in result.model.graph.initializer if t.name == node.input[1])
    assert list(w.dims) == [24, 16]
    # only the fused node (and, for GPT-2's Conv1D, its reshapes and their shape arithmetic) remain
    kinds = {n.op_type for n in result.model.graph.node}
    assert kinds <= {OP_TYPE, "Reshape", "Shape", "Slice", "Concat"}
    onnx.checker.check_model(result.model, full_check=True)
    assert_same_outputs(model, result.model)


@pytest.mark.parametrize("const_style", ["initializer", "node", "one_element"])
@pytest.mark.parametrize("gelu", [f for f in ALL_GELU_FORMS if not f.startswith(("onnx", "ms"))])
def test_constants_in_every_style(gelu, const_style):
    model = build(gelu, "matmul", const_style=const_style, swap=const_style == "node")
    result = fuse_model(model)
    assert len(result.report.fused) == 1, result.report.refused
    # Constant nodes used only by the block are gone with it
    assert not any(n.op_type == "Constant" for n in result.model.graph.node)
    assert_same_outputs(model, result.model)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("cast_wrap", [False, True], ids=["native", "cast-wrapped"])
@pytest.mark.parametrize("gelu", ["onnx:none", "erf:pytorch:div", "tanh:pow", "tanh:bloom", "sigmoid"])
def test_half_precision_graphs(gelu, dtype, cast_wrap):
    model = build(gelu, "matmul", dtype=dtype, cast_wrap=cast_wrap)
    result = fuse_model(model)
    assert len(result.report.fused) == 1, result.report.refused
    (form,) = result.report.fused_by_form
    assert form.startswith("Cast(") == cast_wrap
    assert not any(n.op_type == "Cast" for n in result.model.graph.node)
    assert_same_outputs(model, result.model, dtype)


@pytest.mark.parametrize("rank", [2, 3, 4])
@pytest.mark.parametrize("bias", [True, False])
def test_activation_ranks_and_optional_bias(rank, bias):
    model = build("erf:keras:mul", "matmul", rank=rank, bias=bias)
    result = fuse_model(model)
    (node,) = fused_nodes(result.model)
    assert len(node.input) == (3 if bias else 2)
    assert result.report.fused[0].form == ("erf-GELU+MatMul+Add" if bias else "erf-GELU+MatMul")
    assert_same_outputs(model, result.model)


@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm_alpha_beta_fold_into_constants(trans_b):
    model = build("onnx:none", f"gemm:transB{trans_b}", alpha=0.5, beta=2.0)
    result = fuse_model(model)
    (node,) = fused_nodes(result.model)
    assert attrs(node)["transB"] == 1
    assert_same_outputs(model, result.model)


def test_bias_of_shape_1xN_is_flattened():
    model = build("onnx:none", "matmul", bias_shape=(1, 1, 24))
    result = fuse_model(model)
    (node,) = fused_nodes(result.model)
    b = next(t for t in result.model.graph.initializer if t.name == node.input[2])
    assert list(b.dims) == [24]
    assert_same_outputs(model, result.model)


def test_gated_gelu_branch_fuses_and_gate_stays():
    model = build_gated("tanh:pow")
    result = fuse_model(model)
    assert len(result.report.fused) == 1
    assert [n.op_type for n in result.model.graph.node] == [OP_TYPE, "MatMul", "Mul", "MatMul"]
    assert_same_outputs(model, result.model)


def test_non_constant_weight_is_used_as_given():
    b = Builder()
    w = b.node("Neg", [b.tensor("W", (16, 24))])  # computed at run time
    pre = b.node("MatMul", ["x", w])
    y = b.node("Gelu", [pre])
    shape = input_shape("matmul", 3, 16)
    model = b.model([("x", shape)], [(y, shape[:-1] + [24])])
    result = fuse_model(model)
    (node,) = fused_nodes(result.model)
    assert node.input[1] == w and attrs(node)["transB"] == 0
    assert_same_outputs(model, result.model)


def test_tied_weight_transposed_once_and_kept_for_its_other_user():
    b = Builder()
    w = b.tensor("W", (16, 16))
    y1 = b.node("Gelu", [b.node("MatMul", ["x", w])])
    y2 = b.node("Gelu", [b.node("MatMul", [y1, w])])
    other = b.node("MatMul", [y2, w])
    shape = input_shape("matmul", 3, 16)
    model = b.model([("x", shape)], [(other, shape)])
    result = fuse_model(model)
    assert len(result.report.fused) == 2
    names = [t.name for t in result.model.graph.initializer]
    assert names == [w, f"{w}.T"]
    assert_same_outputs(model, result.model)


def test_mlp_stack_keeps_everything_else():
    model = build_mlp(layers=3)
    model.doc_string = "doc"
    model.model_version = 7
    onnx.helper.set_model_props(model, {"author": "tests"})
    model.graph.doc_string = "graph doc"
    model.graph.node[-1].doc_string = "node doc"
    model.opset_import.append(onnx.helper.make_opsetid("ai.example", 3))
    model = onnx.shape_inference.infer_shapes(model)
    assert model.graph.value_info
    result = fuse_model(model)
    out = result.model
    assert len(result.report.fused) == 3
    assert (out.doc_string, out.model_version, out.producer_name) == ("doc", 7, "tests.graphs")
    assert [(p.key, p.value) for p in out.metadata_props] == [("author", "tests")]
    assert out.graph.doc_string == "graph doc" and out.graph.node[-1].doc_string == "node doc"
    assert [(o.domain, o.version) for o in out.opset_import] == \
        [(o.domain, o.version) for o in model.opset_import] + [(DOMAIN, DOMAIN_VERSION)]
    assert out.ir_version == model.ir_version
    # untouched nodes keep their names, order and bytes
    kept_before = [n for n in model.graph.node if n.op_type == "MatMul" and "Gelu" not in n.name]
    untouched = [n.SerializeToString() for n in model.graph.node
                 if n.name not in {x for b in result.report.fused for x in b.replaced}]
    assert [n.SerializeToString() for n in out.graph.node if n.domain != DOMAIN] == untouched
    assert kept_before
    # value_info of surviving tensors survives, in order
    alive = {o for n in out.graph.node for o in n.output}
    assert [v.SerializeToString() for v in out.graph.value_info] == \
        [v.SerializeToString() for v in model.graph.value_info if v.name in alive]
    # untouched initializers keep their order
    before = [t.name for t in model.graph.initializer]
    after = [t.name for t in out.graph.initializer if t.name in before]
    assert after == [n for n in before if n in after]
    assert_same_outputs(model, out)


def test_input_model_is_not_mutated():
    model = build_mlp(layers=2)
    before = model.SerializeToString()
    fuse_model(model, approximate="tanh")
    assert model.SerializeToString() == before


def test_idempotent_and_deterministic():
    model = build_mlp(layers=2, gelu="tanh:mul")
    once = fuse_model(model).model
    assert fuse_model(model).model.SerializeToString() == once.SerializeToString()
    twice = fuse_model(once)
    assert not twice.report.fused and not twice.report.refused
    assert twice.model.SerializeToString() == once.SerializeToString()
    # names derive from the Linear each node replaced
    linear_names = [n.name for n in model.graph.node if n.op_type == "MatMul"][0::2]
    assert [n.name for n in fused_nodes(once)] == [f"{name}/{OP_TYPE}" for name in linear_names]


def test_node_names_stay_unique():
    model = build("onnx:none", "matmul")
    taken = f"{model.graph.node[0].name}/{OP_TYPE}"
    model.graph.node.append(onnx.helper.make_node("Identity", ["x"], ["unused"], name=taken))
    result = fuse_model(model)
    assert result.report.fused[0].name == f"{taken}_1"


def test_dead_code_the_model_had_before_is_kept():
    model = build("onnx:none", "matmul")
    model.graph.node.insert(0, onnx.helper.make_node("Identity", ["x"], ["dead"], name="already_dead"))
    result = fuse_model(model)
    assert "already_dead" in [n.name for n in result.model.graph.node]


@pytest.mark.parametrize("approximate", ["tanh", "sigmoid"])
def test_approximate_changes_math_on_purpose_and_says_where(approximate):
    model = build_mlp(layers=2, gelu="erf:pytorch:div")
    result = fuse_model(model, approximate=approximate)
    changed = {c.name: (c.was, c.now) for c in result.report.math_changed}
    assert changed == {n.name: ("none", approximate) for n in fused_nodes(result.model)}
    assert all(attrs(n)["approximate"].decode() == approximate for n in fused_nodes(result.model))
    # a block that already computes the requested form is not listed
    same = fuse_model(build("onnx:tanh"), approximate="tanh")
    assert not same.report.math_changed


def test_approximate_rejects_unknown_form():
    with pytest.raises(BadInputError):
        fuse_model(build(), approximate="erf")


def test_several_forms_in_one_model_counted_by_form():
    b = Builder()
    x = "x"
    for gelu, linear in itertools.product(["onnx:none", "tanh:pow", "ms:BiasGelu"], ["matmul", "reshape_gemm"]):
        x = block(b, x, gelu, linear, k=16, n=16)
    shape = input_shape("matmul", 3, 16)
    model = b.model([("x", shape)], [(x, shape)])
    result = fuse_model(model)
    assert result.report.fused_by_form == {
        "Gelu(erf)+MatMul+Add": 1, "Gelu(erf)+Reshape→Gemm→Reshape": 1,
        "com.microsoft.BiasGelu+MatMul": 1, "com.microsoft.BiasGelu+Reshape→Gemm→Reshape": 1,
        "tanh-GELU+MatMul+Add": 1, "tanh-GELU+Reshape→Gemm→Reshape": 1}
    assert_same_outputs(model, result.model)


@pytest.fixture(scope="module")
def ort_cpu_session():
    """A factory of CPU sessions with the op library, or a skip where the library is not built."""
    from onnxfuse.runtime import create_session, get_library_path

    try:
        get_library_path()
    except BadInputError as e:
        pytest.skip(f"op library not built: {e}")
    return lambda model: create_session(model.SerializeToString(), providers="cpu")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("gelu,linear", [
    ("erf:pytorch:div", "matmul"), ("tanh:bloom", "gemm:transB0"), ("sigmoid", "gemm:transB1"),
    ("ms:FastGelu+bias", "reshape_gemm"), ("onnx:tanh", "matmul"),
])
def test_fused_models_run_in_onnxruntime(ort_cpu_session, gelu, linear, dtype):
    model = build(gelu, linear, dtype=dtype, cast_wrap=dtype == "float16" and gelu.startswith("erf"))
    fused = fuse_model(model).model
    feeds = feeds_for(model, dtype)
    (want,) = run(model, feeds)
    (got,) = ort_cpu_session(fused).run(None, feeds)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=TOL[dtype] * 5,
                               atol=TOL[dtype] * 5)


@pytest.mark.parametrize("linear,transposed", [("matmul", True), ("gemm:transB1", False)])
def test_weight_from_a_constant_node(linear, transposed):
    model = build("onnx:none", linear, w_as_node=True)
    result = fuse_model(model)
    (node,) = fused_nodes(result.model)
    if transposed:  # stored [N, K] as a new initializer; the Constant node went with the block
        assert node.input[1].endswith(".T")
        assert not any(n.op_type == "Constant" for n in result.model.graph.node)
    else:  # already [N, K]: read from its Constant node as it is
        assert any(n.op_type == "Constant" and n.output[0] == node.input[1] for n in result.model.graph.node)
    assert attrs(node)["transB"] == 1
    assert_same_outputs(model, result.model)


def test_blocks_inside_if_branches_fuse_reading_outer_constants():
    """A subgraph block reads its weight from the enclosing graph: still constant, still stored [N, K]."""
    outer = Builder()
    w = outer.tensor("W", (16, 24))
    inner = Builder(seed=1)
    inner._count = outer._count  # one name space for the whole model
    y = block(inner, "x", "erf:keras:div", "matmul")
    w_inner = next(n for n in inner.nodes if n.op_type == "MatMul").input[1]
    inner.initializers = [t for t in inner.initializers if t.name != w_inner]
    next(n for n in inner.nodes if n.op_type == "MatMul").input[1] = w  # the outer weight
    shape = input_shape("matmul", 3, 16)
    then_branch = onnx.helper.make_graph(
        inner.nodes, "then", [], [onnx.helper.make_tensor_value_info(y, onnx.TensorProto.FLOAT, shape[:-1] + [24])],
        inner.initializers)
    else_out, else_mm = outer.fresh("else_out"), outer.fresh("else_mm")
    else_branch = onnx.helper.make_graph(
        [onnx.helper.make_node("MatMul", ["x", w], [else_mm], name=outer.fresh("MatMul")),
         onnx.helper.make_node("Gelu", [else_mm], [else_out], name=outer.fresh("Gelu"))], "else", [],
        [onnx.helper.make_tensor_value_info(else_out, onnx.TensorProto.FLOAT, shape[:-1] + [24])])
    out = outer.node("If", ["cond"], then_branch=then_branch, else_branch=else_branch)
    model = outer.model([("x", shape)], [(out, shape[:-1] + [24])])
    model.graph.input.append(onnx.helper.make_tensor_value_info("cond", onnx.TensorProto.BOOL, []))
    onnx.checker.check_model(model, full_check=True)
    result = fuse_model(model)
    assert result.report.fused_by_form == {"erf-GELU+MatMul+Add": 1, "Gelu(erf)+MatMul": 1}
    onnx.checker.check_model(result.model, full_check=True)
    branches = {a.name: a.g for a in result.model.graph.node[-1].attribute}
    for g in branches.values():
        (node,) = [n for n in g.node if n.op_type == OP_TYPE]
        assert node.input[1] == f"{w}.T" and attrs(node)["transB"] == 1
    assert [t.name for t in result.model.graph.initializer] == [f"{w}.T"]  # one copy, beside W
    for cond in (True, False):
        feeds = {**feeds_for(model, "float32"), "cond": np.array(cond)}
        np.testing.assert_allclose(run(result.model, feeds)[0], run(model, feeds)[0], rtol=2e-5, atol=2e-5)


def test_gemm_with_beta_zero_has_no_bias():
    model = build("onnx:none", "gemm:transB1", beta=0.0)
    result = fuse_model(model)
    (node,) = fused_nodes(result.model)
    assert len(node.input) == 2
    assert_same_outputs(model, result.model)
