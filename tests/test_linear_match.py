"""The shared Linear matcher on hand-built graphs: every form it recognises, every refusal, both operand orders
of the bias Add, constants behind Identity/Cast, and the options the packed attention projection uses."""

from __future__ import annotations

import pytest
from onnx import TensorProto as T

from onnxfuse.patterns.graph import GraphView, infer_types
from onnxfuse.patterns.linear_match import LinearMatch, NotLinear, find_linear
from onnxfuse.patterns.match import Refused
from tests.graphs import LINEAR_FORMS, Builder, build_gated, input_shape
from tests.test_patterns_tensordot import tensordot_dense

K, N = 16, 24
READER = "the test's reader"


def _view(b: Builder, out: str, x_shape=None) -> GraphView:
    model = b.model([("x", x_shape or [5, K])], [(out, None)])
    return GraphView(model.graph, inferred=list(infer_types(model).value_info))


def _index(view: GraphView, op: str) -> int:
    (i,) = [i for i, n in enumerate(view.nodes) if n.op_type == op]
    return i


def _tensordot_view(**kw) -> tuple[GraphView, int]:
    """tf2onnx's tensordot (test_patterns_tensordot) and the index of its bias Add."""
    model, _ = tensordot_dense(**kw)
    view = GraphView(model.graph, inferred=list(infer_types(model).value_info))
    restore = [i for i, n in enumerate(view.nodes) if n.op_type == "Reshape"][-1]
    (add,) = [i for i, n in enumerate(view.nodes) if n.op_type == "Add" and view.nodes[restore].output[0] in n.input]
    return view, add


FORMS = {  # LINEAR_FORMS entry -> (op, trans_b, form with a bias, form without)
    "matmul": ("MatMul", 0, "MatMul+Add", "MatMul"),
    "gemm:transB0": ("Gemm", 0, "Gemm", "Gemm"),
    "gemm:transB1": ("Gemm", 1, "Gemm", "Gemm"),
    "reshape_gemm": ("Gemm", 0, "Reshape→Gemm→Reshape", "Reshape→Gemm→Reshape"),
}


@pytest.mark.parametrize("swap", [False, True], ids=["Add(MatMul, B)", "Add(B, MatMul)"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("linear", list(LINEAR_FORMS))
def test_every_linear_form(linear, bias, swap):
    assert set(FORMS) == set(LINEAR_FORMS)
    b = Builder(swap=swap)
    pre = LINEAR_FORMS[linear](b, "x", K, N, bias)
    view = _view(b, pre, input_shape(linear, 3, K))
    m = find_linear(view, pre, READER)
    op, trans_b, with_bias, without = FORMS[linear]
    node = view.nodes[m.node]
    assert node.op_type == op and m.trans_b == trans_b and m.alpha == 1.0
    assert m.form == (with_bias if bias else without)
    assert (m.x, m.w) == (node.input[0], node.input[1])
    assert m.output == node.output[0] and not m.tensordot
    if linear == "reshape_gemm":
        assert m.x != "x" and view.producer_of(m.x).op_type == "Reshape"  # the flattened X, as the Gemm reads it
        assert view.nodes[m.reshape].output[0] == pre
    else:
        assert m.x == "x" and m.reshape is None
    assert m.add == (view.producer[pre] if bias and op == "MatMul" else None)
    bias_name = next((t for t in view.initializers if t.startswith("B_") or t.startswith("C_")), None)
    assert m.biases == (((bias_name, 1.0),) if bias else ())
    assert m.nodes == frozenset({m.node} | ({m.add} if m.add is not None else set())
                                | ({m.reshape} if m.reshape is not None else set()))


def test_gemm_scales_are_recorded():
    b = Builder()
    pre = LINEAR_FORMS["gemm:transB1"](b, "x", K, N, True, alpha=2.0, beta=0.5)
    view = _view(b, pre)
    m = find_linear(view, pre, READER)
    assert m.alpha == 2.0 and m.trans_b == 1
    assert m.biases == ((view.nodes[m.node].input[2], 0.5),)


def test_gemm_c_with_beta_zero_takes_no_part():
    b = Builder()
    pre = LINEAR_FORMS["gemm:transB0"](b, "x", K, N, True, beta=0.0)
    assert find_linear(_view(b, pre), pre, READER).biases == ()


def test_gemm_under_an_add_lists_both_bias_terms_add_first():
    b = Builder()
    gemm = LINEAR_FORMS["gemm:transB0"](b, "x", K, N, True, beta=2.0)
    pre = b.node("Add", [b.tensor("B", (N,)), gemm])
    view = _view(b, pre)
    m = find_linear(view, pre, READER)
    c = view.nodes[m.node].input[2]
    assert m.form == "Gemm" and m.add == view.producer[pre]
    assert m.biases == ((view.nodes[m.add].input[0], 1.0), (c, 2.0))


def test_tensordot_with_a_bias_is_a_linear_over_x():
    view, add = _tensordot_view()
    m = find_linear(view, view.nodes[add].output[0], READER)
    assert m.form == "tensordot(MatMul)+Add" and m.tensordot and m.x == "x"
    restore, flatten = [i for i, n in enumerate(view.nodes) if n.op_type == "Reshape"][::-1]
    assert m.nodes == {m.node, restore, add} and flatten not in m.nodes
    assert m.add == add and m.reshape is None and m.output == view.nodes[m.node].output[0]
    assert m.biases == ((view.nodes[add].input[1], 1.0),)


def test_tensordot_without_a_bias_is_the_reshape_form():
    model, _ = tensordot_dense(bias=False)
    view = GraphView(model.graph, inferred=list(infer_types(model).value_info))
    restore = [i for i, n in enumerate(view.nodes) if n.op_type == "Reshape"][-1]
    m = find_linear(view, view.nodes[restore].output[0], READER)
    assert m.form == "Reshape→MatMul→Reshape" and not m.tensordot and m.reshape == restore


def test_almost_tensordot_is_refused_with_what_was_seen():
    view, add = _tensordot_view(free=(1, 0))
    with pytest.raises(Refused) as e:
        find_linear(view, view.nodes[add].output[0], READER)
    assert not isinstance(e.value, NotLinear)
    assert e.value.reason.startswith(f"{READER} follows Add(bias) after Reshape ")
    assert "which is not a tensordot: Reshape" in e.value.reason
    assert "restores [X.shape[1], X.shape[0], 24]" in e.value.reason


@pytest.mark.parametrize("how", ["direct", "tensordot"])
def test_trans_a_is_refused(how):
    b = Builder()
    if how == "direct":
        pre = LINEAR_FORMS["gemm:transB0"](b, "x", K, N, True, trans_a=True)
        view = _view(b, pre, [K, 5])
    else:
        flat = b.node("Reshape", ["x", b.tensor("flat", (2,))])
        restore = b.node("Reshape", [b.node("Gemm", [flat, b.tensor("W", (K, N))], transA=1), "shape"])
        pre = b.node("Add", [restore, b.tensor("B", (N,))])
        view = _view(b, pre, [2, 5, K])
    with pytest.raises(Refused, match=r"Gemm with transA=1 \(its activation input is transposed\)$"):
        find_linear(view, pre, READER)


@pytest.mark.parametrize("inputs", [["x"], ["x", ""]], ids=["one-input", "empty-weight"])
def test_no_weight_input(inputs):
    b = Builder()
    pre = b.node("MatMul", inputs)
    with pytest.raises(Refused, match=r"^MatMul 'MatMul_\d+' has no weight input$"):
        find_linear(_view(b, pre), pre, READER)


def test_add_of_two_non_linear_tensors_names_both():
    b = Builder()
    relu, bias = b.node("Relu", ["x"]), b.tensor("B", (K,))
    pre = b.node("Add", [relu, bias])
    view = _view(b, pre)
    with pytest.raises(NotLinear) as e:
        find_linear(view, pre, READER)
    assert e.value.reason == (f"{READER} follows an Add of '{relu}' (computed by Relu '{view.nodes[0].name}') and "
                              f"'{bias}' (defined nowhere in this graph), neither a MatMul/Gemm output")
    assert e.value.seen == (view.producer[relu],)  # the producers found in the Linear's place


def test_a_graph_input_is_no_linear():
    b = Builder()
    pre = b.node("Reshape", ["x", b.tensor("shape", (2,))])
    with pytest.raises(NotLinear, match=f"^{READER} reads 'x', a graph input or constant, not the output of a "
                                        "Linear$") as e:
        find_linear(_view(b, pre), pre, READER)
    assert e.value.seen == ()


def test_another_op_is_named_with_its_node():
    b = Builder()
    pre = b.node("Relu", ["x"])
    view = _view(b, pre)
    with pytest.raises(NotLinear, match=rf"^{READER} follows a Relu, not a Linear \(MatMul/Gemm\)$") as e:
        find_linear(view, pre, READER)
    assert e.value.seen == (0,)
    assert isinstance(e.value, Refused) and e.value.as_refusal("rule").reason == e.value.reason


def test_constants_behind_identity_and_cast():
    """Structure only: W and B are what the Linear reads (an Identity's, a Cast's output); the caller reads
    them as constants through those (``constant_ref``)."""
    b = Builder()
    w = b.node("Cast", [b.node("Identity", [b.tensor("W", (K, N))])], to=T.FLOAT)
    bias = b.node("Identity", [b.tensor("B", (N,))])
    pre = b.node("Add", [bias, b.node("MatMul", ["x", w])])
    view = _view(b, pre)
    m = find_linear(view, pre, READER)
    assert m.w == w and m.biases == ((bias, 1.0),) and m.form == "MatMul+Add"
    assert view.constant_ref(m.w).root.startswith("W_") and view.constant_ref(bias).root.startswith("B_")
    assert not {view.producer[w], view.producer[bias]} & m.nodes  # the Identity/Cast are not the Linear's


def _add_of_two(first: str) -> tuple[GraphView, str, dict[str, int]]:
    """Add(first-op output, MatMul output), the MatMul's output also read elsewhere when first is 'shared'."""
    b = Builder()
    made = {}
    if first == "Gemm":
        a = b.node("Gemm", ["x", b.tensor("W", (K, N))])
    else:
        a = b.node("MatMul", ["x", b.tensor("W", (K, N))])
        b.output(a, None)  # a second reader of the first operand
    mm = b.node("MatMul", ["x", b.tensor("W", (K, N))])
    pre = b.node("Add", [a, mm])
    view = _view(b, pre)
    made["first"], made["matmul"] = view.producer[a], view.producer[mm]
    return view, pre, made


def test_bias_after_says_which_ops_an_add_follows():
    view, pre, made = _add_of_two("Gemm")
    assert find_linear(view, pre, READER).node == made["first"]  # the first operand order that is a Linear
    m = find_linear(view, pre, READER, bias_after=("MatMul",))
    assert m.node == made["matmul"] and m.biases == ((view.nodes[made["first"]].output[0], 1.0),)


def test_sole_reader_skips_an_operand_read_elsewhere():
    view, pre, made = _add_of_two("shared")
    assert find_linear(view, pre, READER).node == made["first"]
    assert find_linear(view, pre, READER, sole_reader=True).node == made["matmul"]


def test_sole_reader_with_no_operand_left_is_no_linear():
    b = Builder()
    mm = b.node("MatMul", ["x", b.tensor("W", (K, N))])
    b.output(mm, None)
    pre = b.node("Add", [mm, b.tensor("B", (N,))])
    view = _view(b, pre)
    assert find_linear(view, pre, READER).node == view.producer[mm]
    with pytest.raises(NotLinear, match="neither a MatMul/Gemm output"):
        find_linear(view, pre, READER, sole_reader=True)


def test_a_gated_mlp_reads_its_two_linears_with_two_calls():
    """T5 v1.1's gelu(x·Wi0) * (x·Wi1): the gate's Linear and the up projection, one call each."""
    model = build_gated("onnx:none")
    view = GraphView(model.graph, inferred=list(infer_types(model).value_info))
    gelu = _index(view, "Gelu")
    (mul,) = [i for i, n in enumerate(view.nodes) if n.op_type == "Mul"]
    up_out = next(t for t in view.nodes[mul].input if t != view.nodes[gelu].output[0])
    gate = find_linear(view, view.nodes[gelu].input[0], "Gelu(erf)")
    up = find_linear(view, up_out, "the gate's other factor")
    assert isinstance(gate, LinearMatch) and gate.x == up.x == "x"
    assert gate.node != up.node and gate.w != up.w and gate.form == up.form == "MatMul"
