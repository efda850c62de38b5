"""The dimensions and element types the attention rule derives where shape inference gives none: the forward
pass of ``symbolic.Evaluator`` through Split, ORT's contrib normalisation and Casts, and GraphView keeping an
inferred shape over a declaration of the type alone (what ORT's float16 converter writes)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from onnxfuse.patterns.graph import GraphView, infer_types
from onnxfuse.patterns.match import Refused
from onnxfuse.patterns.symbolic import Dim, Evaluator, NotSymbolic

B, S = Dim(1, ("batch",)), Dim(1, ("seq",))


def _model(nodes, inits, value_info=(), opset=14):
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, ["batch", "seq", 8])],
        [helper.make_tensor_value_info(o, T.UNDEFINED, None) for o in nodes[-1].output],  # untyped: derived,
        initializer=inits, value_info=list(value_info))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                   helper.make_opsetid("com.microsoft", 1)])


def _evaluator(model) -> Evaluator:
    return Evaluator(GraphView(model.graph, inferred=list(infer_types(model).value_info)))


def _qkv(sizes, dtype=None):
    """x → SkipLayerNormalization (contrib: no ONNX shape inference) → MatMul [8, 24] → Split on the last axis."""
    inits = [numpy_helper.from_array(np.ones(8, np.float32), "gamma"),
             numpy_helper.from_array(np.ones((8, 24), np.float32), "w")]
    split_inputs = ["p"]
    if sizes is not None:
        inits.append(numpy_helper.from_array(np.array(sizes, np.int64), "sizes"))
        split_inputs.append("sizes")
    nodes = [helper.make_node("SkipLayerNormalization", ["x", "x", "gamma"], ["n"], domain="com.microsoft"),
             helper.make_node("MatMul", ["n", "w"], ["p"]),
             helper.make_node("Split", split_inputs, ["q", "k", "v"], axis=2)]
    return _model(nodes, inits)


def test_split_with_constant_sizes_gives_each_output_its_size():
    ev = _evaluator(_qkv([8, 8, 8]))
    for out in ("q", "k", "v"):
        assert [ev.dim(out, a) for a in range(3)] == [B, S, Dim(8)]


def test_split_with_uneven_constant_sizes():
    ev = _evaluator(_qkv([4, 8, 12]))
    assert [ev.dim(o, 2) for o in ("q", "k", "v")] == [Dim(4), Dim(8), Dim(12)]
    assert ev.dim("v", 0) == B and ev.dim("v", 1) == S


def test_split_sizes_that_do_not_cover_the_axis_prove_nothing():
    ev = _evaluator(_qkv([8, 8, 4]))  # 20 of 24: the node fails at run time
    assert not ev.dim("q", 2).is_int


def test_even_split_without_sizes():
    ev = _evaluator(_qkv(None))
    assert [ev.dim(o, 2) for o in ("q", "k", "v")] == [Dim(8)] * 3


def test_element_type_is_carried_through_contrib_normalisation_and_split():
    model = _qkv([8, 8, 8])
    ev = _evaluator(model)
    assert GraphView(model.graph, inferred=list(infer_types(model).value_info)).dtype("q") is None
    assert ev.dtype("q") == T.FLOAT


def test_element_type_is_not_invented_through_an_unknown_op():
    nodes = [helper.make_node("Mystery", ["x"], ["m"], domain="com.example"),
             helper.make_node("Relu", ["m"], ["r"])]
    model = _model(nodes, [])
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    ev = _evaluator(model)
    assert ev.dtype("m") is None and ev.dtype("r") is None


def test_skip_normalisation_sum_output_is_the_residual_stream():
    """Output 3 (input + skip) has the input's dimensions and type, as ORT's optimizer uses it for the next
    block's residual (GPT-NeoX); the statistics outputs 1 and 2 are not followed."""
    nodes = [helper.make_node("SkipLayerNormalization", ["x", "x", "gamma"], ["n", "mean", "inv_std", "sum"],
                              domain="com.microsoft"),
             helper.make_node("Neg", ["sum"], ["y"])]
    ev = _evaluator(_model(nodes, [numpy_helper.from_array(np.ones(8, np.float32), "gamma")]))
    assert [ev.dim("y", a) for a in range(3)] == [B, S, Dim(8)]
    assert ev.dtype("sum") == T.FLOAT
    assert not ev.dim("mean", 0).is_int and ev.dim("mean", 0) != B


def test_cast_gives_its_target_type():
    nodes = [helper.make_node("SkipLayerNormalization", ["x", "x", "gamma"], ["n"], domain="com.microsoft"),
             helper.make_node("Cast", ["n"], ["c"], to=T.FLOAT16)]
    model = _model(nodes, [numpy_helper.from_array(np.ones(8, np.float32), "gamma")])
    assert _evaluator(model).dtype("c") == T.FLOAT16


def test_a_type_only_declaration_does_not_hide_the_inferred_shape():
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])]
    declared = [helper.make_tensor_value_info("r", T.FLOAT, None)]  # as ORT's float16 converter writes them
    model = _model(nodes, [], value_info=declared)
    view = GraphView(model.graph, inferred=list(infer_types(model).value_info))
    assert view.shape("r") == ("batch", "seq", 8)


def test_a_declared_shape_still_wins():
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])]
    declared = [helper.make_tensor_value_info("r", T.FLOAT, ["b2", "s2", 8])]
    model = _model(nodes, [], value_info=declared)
    view = GraphView(model.graph, inferred=list(infer_types(model).value_info))
    assert view.shape("r") == ("b2", "s2", 8)


def test_forward_pass_follows_unsqueeze_expand_and_range():
    """T5's bias: Where(Expand(keep, target), Unsqueeze(position bias)) keeps the inputs' dimensions."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["seq"], axis=0),
        helper.make_node("Range", ["zero", "seq", "step"], ["positions"]),
        helper.make_node("Unsqueeze", ["positions", "axes0"], ["row"]),
        helper.make_node("Abs", ["row"], ["dist"]),
        helper.make_node("Unsqueeze", ["mask", "axes12"], ["keep4"]),
        helper.make_node("Expand", ["keep4", "target"], ["keep"]),
    ]
    inits = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
             (("one", 1), ("zero", 0), ("step", 1), ("axes0", [0]), ("axes12", [1, 2]), ("target", [1, 1, 1, 1]))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, ["b", "s", 4]),
                                           helper.make_tensor_value_info("mask", T.BOOL, ["b", "s"])],
                              [helper.make_tensor_value_info("keep", T.BOOL, None),
                               helper.make_tensor_value_info("dist", T.INT64, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    ev = Evaluator(GraphView(model.graph, inferred=list(infer_types(model).value_info), opset=17))
    s = Dim(1, ("s",))
    assert [ev.dim("dist", a) for a in range(2)] == [Dim(1), s]
    assert [ev.dim("keep", a) for a in range(4)] == [Dim(1, ("b",)), Dim(1), Dim(1), s]


def _sliced_heads(end_offset: int = 2):
    """x → SkipLayerNormalization → MatMul [8, 24] → (as NeoX's TorchScript export splits its fused
    query_key_value) Slices of the last axis at multiples of (Shape(p)[-1] + end_offset) / 3 → Concat of
    two of them and a Slice taken whole; then Cos, and a Slice of the symbolic batch axis (default axes)."""
    c = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    inits = [numpy_helper.from_array(np.ones(8, np.float32), "gamma"),
             numpy_helper.from_array(np.ones((8, 24), np.float32), "w"),
             c("last", [-1]), c("zero", [0]), c("offset", [end_offset]), c("three", [3]), c("two", [2]),
             c("big", [2**63 - 1]), c("one", [1])]
    nodes = [helper.make_node("SkipLayerNormalization", ["x", "x", "gamma"], ["n"], domain="com.microsoft"),
             helper.make_node("MatMul", ["n", "w"], ["p"]),
             helper.make_node("Shape", ["p"], ["p_shape"]),
             helper.make_node("Gather", ["p_shape", "last"], ["p_last"], axis=0),
             helper.make_node("Add", ["p_last", "offset"], ["p_last_plus"]),
             helper.make_node("Div", ["p_last_plus", "three"], ["third"]),
             helper.make_node("Mul", ["third", "two"], ["two_thirds"]),
             helper.make_node("Slice", ["p", "zero", "third", "last"], ["q"]),
             helper.make_node("Slice", ["p", "third", "two_thirds", "last"], ["k"]),
             helper.make_node("Slice", ["p", "zero", "big", "last", "one"], ["whole"]),
             helper.make_node("Concat", ["q", "k"], ["qk"], axis=-1),
             helper.make_node("Cos", ["qk"], ["cos"]),
             helper.make_node("Slice", ["p", "zero", "p_last_plus"], ["batch_rows"])]
    return _model(nodes, inits)


def test_slices_of_the_last_axis_at_shape_arithmetic_bounds():
    ev = _evaluator(_sliced_heads())
    assert ev.vec("third").items == (Dim(8),)  # (24 + 2) / 3, truncated as integer Div does
    for out in ("q", "k"):
        assert [ev.dim(out, a) for a in range(3)] == [B, S, Dim(8)]
    assert [ev.dim("whole", a) for a in range(3)] == [B, S, Dim(24)]


def test_concat_adds_its_axis_and_keeps_the_others():
    ev = _evaluator(_sliced_heads())
    assert [ev.dim("qk", a) for a in range(3)] == [B, S, Dim(16)]
    assert [ev.dim("cos", a) for a in range(3)] == [B, S, Dim(16)]


def test_a_slice_of_a_symbolic_axis_keeps_only_the_other_axes():
    ev = _evaluator(_sliced_heads())
    # Slice(p, [0], [26]) with default axes slices axis 0 to 26 rows: the batch is no longer known
    assert not ev.dim("batch_rows", 0).is_int and ev.dim("batch_rows", 0) != B
    assert ev.dim("batch_rows", 1) == S and ev.dim("batch_rows", 2) == Dim(24)


def test_shape_sums_of_one_symbol_are_exact_and_a_zero_sum_is_zero():
    c = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "one"], ["seq_len"], axis=0),
             helper.make_node("Add", ["seq_len", "seq_len"], ["twice"]),
             helper.make_node("Mul", ["seq_len", "minus_one"], ["negated"]),
             helper.make_node("Add", ["seq_len", "negated"], ["nothing"]),
             helper.make_node("Add", ["seq_len", "minus_one"], ["seq_minus_one"])]
    ev = _evaluator(_model(nodes, [c("one", [1]), c("minus_one", [-1])]))
    assert ev.vec("twice").items == (Dim(2, ("seq",)),)
    assert ev.vec("nothing").items == (Dim(0),)  # (a Reshape reads 0 as "copy": it must be the int)
    with pytest.raises(NotSymbolic):
        ev.vec("seq_minus_one")  # seq - 1 is no monomial


def test_adding_zero_to_a_symbolic_length_is_that_length():
    """transformers' decoders add the cache's length (0 without a cache) to the sequence's: ``seq + 0`` is
    ``seq``, either way round; ``0 - seq`` is the negated monomial."""
    c = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "one"], ["seq_len"], axis=0),
             helper.make_node("Add", ["seq_len", "zero"], ["plus_nothing"]),
             helper.make_node("Add", ["zero", "seq_len"], ["nothing_plus"]),
             helper.make_node("Sub", ["zero", "seq_len"], ["negated"])]
    ev = _evaluator(_model(nodes, [c("one", [1]), c("zero", [0])]))
    assert ev.vec("plus_nothing").items == ev.vec("nothing_plus").items == (S,)
    assert ev.vec("negated").items == (Dim(-1, ("seq",)),)


def test_a_value_it_cannot_follow_is_a_refusal_with_the_reason():
    """NotSymbolic is the rules' one refusal exception: a rule that lets it through reports its message."""
    c = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "one"], ["seq_len"], axis=0),
             helper.make_node("Add", ["seq_len", "minus_one"], ["seq_minus_one"])]
    ev = _evaluator(_model(nodes, [c("one", [1]), c("minus_one", [-1])]))
    with pytest.raises(Refused) as caught:
        ev.vec("seq_minus_one")
    assert isinstance(caught.value, NotSymbolic)
    refusal = caught.value.as_refusal("attention", ("softmax",))
    assert (refusal.rule, refusal.reason, refusal.nodes) == (
        "attention", "'seq_minus_one' is not a small integer vector", ("softmax",))


def _after_contrib_norm(tail, extra_inputs=(), opset=14, inits=()):
    """x → SkipLayerNormalization (no ONNX shape inference past it) → ``tail`` nodes reading "n"."""
    gamma = numpy_helper.from_array(np.ones(8, np.float32), "gamma")
    nodes = [helper.make_node("SkipLayerNormalization", ["x", "x", "gamma"], ["n"], domain="com.microsoft"), *tail]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, ["batch", "seq", 8]), *extra_inputs],
        [helper.make_tensor_value_info(o, T.UNDEFINED, None) for o in nodes[-1].output], initializer=[gamma, *inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)])
    return Evaluator(GraphView(model.graph, inferred=list(infer_types(model).value_info), opset=opset))


def test_a_one_operand_concat_is_its_operand():
    """What the TorchScript exporter leaves of LLaMA's key/value cache appended to an empty one."""
    ev = _after_contrib_norm([helper.make_node("Concat", ["n"], ["c"], axis=1)])
    assert [ev.dim("c", a) for a in range(3)] == [B, S, Dim(8)]


def test_an_operand_empty_along_the_axis_adds_nothing():
    past = helper.make_tensor_value_info("past", T.FLOAT, ["batch", 0, 8])
    ev = _after_contrib_norm([helper.make_node("Concat", ["past", "n"], ["c"], axis=1)], [past])
    assert [ev.dim("c", a) for a in range(3)] == [B, S, Dim(8)]


def test_two_symbolic_operands_prove_no_sum():
    ev = _after_contrib_norm([helper.make_node("Concat", ["n", "n"], ["c"], axis=1)])
    assert ev.dim("c", 1) != S and ev.dim("c", 0) == B


@pytest.mark.parametrize("keepdims,want", [(1, [B, S, Dim(1)]), (0, [B, S])])
def test_reduce_mean_keeps_the_axes_it_does_not_reduce(keepdims, want):
    """RMSNorm's ReduceMean, where ORT's float16 converter's Casts leave shape inference without batch and
    sequence: axes as the attribute (opset 17) and as the input (opset 18)."""
    ev = _after_contrib_norm([helper.make_node("ReduceMean", ["n"], ["r"], axes=[-1], keepdims=keepdims)], opset=17)
    assert [ev.dim("r", a) for a in range(len(want))] == want
    axes = numpy_helper.from_array(np.array([-1], np.int64), "axes")
    ev = _after_contrib_norm([helper.make_node("ReduceMean", ["n", "axes"], ["r"], keepdims=keepdims)], opset=18,
                             inits=[axes])
    assert [ev.dim("r", a) for a in range(len(want))] == want
    assert ev.rank("r") == len(want)


def test_reduce_without_axes_reduces_all_or_nothing():
    ev = _after_contrib_norm([helper.make_node("ReduceSum", ["n"], ["r"])], opset=18)
    assert [ev.dim("r", a) for a in range(3)] == [Dim(1)] * 3
    ev = _after_contrib_norm([helper.make_node("ReduceSum", ["n"], ["r"], noop_with_empty_axes=1)], opset=18)
    assert [ev.dim("r", a) for a in range(3)] == [B, S, Dim(8)]


@pytest.mark.parametrize("opset", [11, 13])  # axes an attribute, then an input
def test_squeeze_with_its_axes_drops_them_and_keeps_the_others(opset):
    # ModernBERT unbinds q, k and v from one [B, S, 3, N, H] split: Split on axis 2, then Squeeze it away
    shape = numpy_helper.from_array(np.array([0, 0, 3, 2, -1], np.int64), "shape")
    inits = [numpy_helper.from_array(np.ones((8, 24), np.float32), "w"), shape]
    squeeze = (helper.make_node("Squeeze", ["q5"], ["q"], axes=[2]) if opset < 13 else
               helper.make_node("Squeeze", ["q5", "axis2"], ["q"]))
    if opset >= 13:
        inits.append(numpy_helper.from_array(np.array([2], np.int64), "axis2"))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]),
             helper.make_node("Reshape", ["p", "shape"], ["p5"]),
             helper.make_node("Split", ["p5"], ["q5", "k5", "v5"], axis=2), squeeze]
    ev = _evaluator(_model(nodes, inits, opset=opset))
    assert [ev.dim("q", a) for a in range(4)] == [B, S, Dim(2), Dim(4)]


def test_squeeze_without_axes_proves_nothing():
    # it drops every axis that is 1 at run time, which a symbolic dimension does not tell
    nodes = [helper.make_node("Unsqueeze", ["x", "axis0"], ["u"]), helper.make_node("Squeeze", ["u"], ["y"])]
    ev = _evaluator(_model(nodes, [numpy_helper.from_array(np.array([0], np.int64), "axis0")], opset=13))
    assert ev.rank("y") is None or ev.dim("y", 0) != B


def test_abs_of_a_position_difference_is_a_formula():
    # ModernBERT's local window: |rows - rowsᵀ| <= c over Range positions
    inits = [numpy_helper.from_array(np.array(v, np.int64), name) for name, v in (
        ("zero", 0), ("one", 1), ("row_axis", [0]), ("column_axis", [1]), ("reach", 2), ("seq_axis", 1))]
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "seq_axis"], ["n"], axis=0),
             helper.make_node("Range", ["zero", "n", "one"], ["pos"]),
             helper.make_node("Unsqueeze", ["pos", "row_axis"], ["keys"]),
             helper.make_node("Unsqueeze", ["pos", "column_axis"], ["queries"]),
             helper.make_node("Sub", ["keys", "queries"], ["offset"]),
             helper.make_node("Abs", ["offset"], ["distance"]),
             helper.make_node("LessOrEqual", ["distance", "reach"], ["near"])]
    keep = _evaluator(_model(nodes, inits, opset=13)).index("near")
    assert keep.extents == (S, S)
    assert keep.expr == ("le", ("abs", ("sub", ("axis", 1), ("axis", 0))), ("const", 2))


def test_tile_multiplies_the_dimensions_it_repeats():
    # GPT-J's repeat_interleave of its rotary tables: [.., 2, 1] tiled by [.., 1, 2]; a symbolic dimension
    # repeated is no dimension the pass can name
    inits = [numpy_helper.from_array(np.array(v, np.int64), name) for name, v in (
        ("starts", [0]), ("ends", [2]), ("axes", [2]), ("new_axes", [2, 4]), ("pairs", [1, 1, 1, 1, 2]),
        ("batches", [2, 1, 1, 1, 1]))]
    nodes = [helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["half"]),  # [B, S, 2]
             helper.make_node("Unsqueeze", ["half", "new_axes"], ["u5"]),  # [B, S, 1, 2, 1]
             helper.make_node("Tile", ["u5", "pairs"], ["tiled"]),
             helper.make_node("Tile", ["u5", "batches"], ["doubled"])]
    ev = _evaluator(_model(nodes, inits, opset=13))
    assert [ev.dim("tiled", a) for a in range(5)] == [B, S, Dim(1), Dim(2), Dim(2)]
    assert ev.dim("doubled", 0) != B and [ev.dim("doubled", a) for a in range(1, 5)] == [S, Dim(1), Dim(2), Dim(1)]
