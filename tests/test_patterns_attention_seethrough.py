"""The attention rule reads through the nodes that keep a value as it is, and through eager attention's float32
softmax (issue #54).

- ONNX Runtime's device copies (``MemcpyFromHost``/``MemcpyToHost``), as its CUDA session writes them into the
  model ORT's transformers optimizer saves with ``use_gpu=True``: inserted where that session puts them
  (``tests/device_copies.py``) into the committed ORT-optimized exports and into decoders after ORT's optimizer.
  ORT's CPU provider runs the copies, so each such model is compared with its fused form directly, on fresh
  inputs with every row's own padding: what this proves is that the rewrite of a model with copies computes
  what that model computes, and fuses as many attentions as the model without them.
- Identity, a Cast to the type a tensor has, and an Expand to a shape its reader broadcasts to anyway, on the mask,
  the heads and the scale of hand-built graphs; and beside each, the node that does change something (a Cast to
  another type, an Expand that changes the result's shape), which leaves the graph bit-identical, refused.
- The float32 softmax of float16 scores (``softmax(scores, dtype=float32).to(query.dtype)``): fused, since
  MultiHeadAttention rounds where the graph's Casts do (checked here on ORT's CPU kernel, bit for bit); any
  other cast around the Softmax refused with its reason.
- A head split whose target is a Concat of parts of several kinds (dynamo), and a banded local attention in a
  layout the rule does not take, which gets its reason rather than silence.
"""

from __future__ import annotations

import contextlib
import io
import math
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper
from test_patterns_attention import (D, ENTRIES, EXPECTED, FLOAT32_MIN, MODELS, N, TOLERANCE, _attention, _feeds,
                                     _fuse, _fused_node, _load, _run, _session, assert_outputs_match)

from tests.device_copies import CUDA, copy_to_host, with_device_copies

H = D // N
COPIES = ("MemcpyFromHost", "MemcpyToHost")


def _copies(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type in COPIES]


def _refusals(result) -> list[str]:
    return sorted(r.reason for r in result.report.refused if r.rule == "attention")


def _between(model: onnx.ModelProto, tensor: str, op: str, extra=(), inits=(), **attrs) -> onnx.ModelProto:
    """``model`` with ``op(tensor, *extra)`` between ``tensor`` and its readers, which read the new node's output
    (``<tensor>_<op>``) instead; ``inits``: initializers the extra inputs need."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    made = f"{tensor}_{op}"
    for node in graph.node:
        node.input[:] = [made if x == tensor else x for x in node.input]
    new = helper.make_node(op, [tensor, *extra], [made], name=made, **attrs)
    nodes = list(graph.node)
    at = next((k + 1 for k, n in enumerate(nodes) if tensor in n.output), 0)
    nodes.insert(at, new)
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(inits)
    return out


def _i64(name: str, values) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


# --- ORT's device copies in its optimized exports ------------------------------------------------------------
# The committed ORT-optimized exports with a mask or computed head shapes: ORT's CUDA session copies their shape
# arithmetic's results to the device (the mask's index arithmetic, the embeddings' token types).
COPIED = ["bert_torchscript_op14_ortopt.onnx", "bert_torchscript_op14_ortfp16.onnx",
          "bert_torchscript_op14_ortopt_nobiasgelu.onnx", "clip_text_torchscript_op16_ortopt.onnx",
          "clip_text_torchscript_op16_ortfp16.onnx", "gpt2_torchscript_op14_ortopt.onnx",
          "gpt2_torchscript_op14_ortfp16.onnx", "gpt_neox_torchscript_op16_ortopt.onnx",
          "gpt_neox_torchscript_op16_ortfp16.onnx", "vit_torchscript_op15_ortopt.onnx",
          "vit_torchscript_op15_ortfp16.onnx", "t5_torchscript_op15_ortopt.onnx", "t5_torchscript_op15_ortfp16.onnx"]


@pytest.mark.parametrize("file", COPIED)
def test_device_copies_in_ort_optimized_exports_are_seen_through(file, rng):
    """Each export with the copies ORT's CUDA session writes fuses the attentions the export fuses (before #54:
    "MemcpyFromHost 'Memcpy' is not modelled"), and its fused form computes what it computes."""
    original = _load(file)
    copied = with_device_copies(original)
    assert _copies(copied), "ORT's CUDA session copies something in this export"
    plain, result = _fuse(original), _fuse(copied)
    assert len(result.report.fused) == len(plain.report.fused) == EXPECTED[file][0]
    assert len(_refusals(result)) == len(_refusals(plain))
    reason = EXPECTED[file][1]  # (T5's: the block whose intermediate a cache or a shape reads)
    assert all(reason in r for r in _refusals(result)) if reason else not _refusals(result)
    ref, new = _session(copied), _session(result.model)
    assert_outputs_match(ref, new, _feeds(file, ref, 6, 7, rng), TOLERANCE[ENTRIES[file]["dtype"]])


@pytest.mark.parametrize("file, fp16", [("llama_torchscript_op17.onnx", False), ("llama_torchscript_op17.onnx", True),
                                        ("phi_torchscript_op17.onnx", False), ("gpt_neox_torchscript_op16.onnx", True)])
def test_decoders_after_ort_optimizer_on_the_gpu_fuse(file, fp16, rng):
    """LLaMA-class and Phi decoders through ORT's transformers optimizer and its float16 converter, with the
    copies its CUDA session writes (the attention mask's copy to the device, the key's repeat_kv target):
    before #54 they fused no attention."""
    from onnxruntime.transformers import optimizer

    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = optimizer.optimize_model(str(MODELS / file), model_type="gpt2", opt_level=0)
        if fp16:
            opt.convert_float_to_float16(keep_io_types=True)
    copied = with_device_copies(opt.model)
    assert _copies(copied)
    result = _fuse(copied)
    assert [b.rule for b in result.report.fused] == ["attention", "attention"], _refusals(result)
    ref, new = _session(copied), _session(result.model)
    assert_outputs_match(ref, new, _feeds(file, ref, 6, 7, rng), TOLERANCE["float16" if fp16 else "float32"])


def test_a_shape_and_a_mask_copied_to_the_host_are_seen_through(rng):
    """MemcpyToHost, the other direction (ORT writes one where a node without a CUDA kernel reads a CUDA
    tensor): on the keep every layer's mask reads, and on a head split's target."""
    file = "bert_torchscript_op14_ortopt.onnx"
    model = copy_to_host(copy_to_host(with_device_copies(_load(file)), "/model/Expand_output_0"),
                         "/model/encoder/layer.0/attention/self/Concat_output_0")
    assert sum(n.op_type == "MemcpyToHost" for n in model.graph.node) == 2
    result = _fuse(model)
    assert len(result.report.fused) == 2, _refusals(result)
    ref, new = _session(model), _session(result.model)
    assert_outputs_match(ref, new, _feeds(file, ref, 6, 7, rng), TOLERANCE["float32"])


@pytest.mark.parametrize("fill", [-math.inf, FLOAT32_MIN])
def test_the_rebuilt_mask_reads_the_padding_mask_where_the_graph_copied_it(fill):
    """The attention mask copied to the device (ORT copies a graph input read on both devices): the mask the
    fused op rebuilds reads the copy, on the device the graph copied it to, and the copy stays."""
    model = _between(_attention(mask="causal+padding", fill=fill), "attention_mask", "MemcpyFromHost")
    copy = "attention_mask_MemcpyFromHost"
    result = _fuse(model)
    (block,) = result.report.fused
    assert block.details["mask"] == "causal+key-padding"
    readers = [n for n in result.model.graph.node if copy in n.input]
    assert readers and all(n.op_type != "MemcpyFromHost" for n in readers)
    assert any(n.op_type == "MemcpyFromHost" and n.output[0] == copy for n in result.model.graph.node)
    assert not any("attention_mask" in n.input for n in result.model.graph.node if n.op_type != "MemcpyFromHost")
    x = np.random.default_rng(4).standard_normal((6, 5, D)).astype(np.float32)
    mask = np.array([[1] * 5, [1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [0] * 5, [0, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    want, got = _run(model, x, mask), _run(result.model, x, mask)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# Where ORT 1.31.1's CUDA session (on an H100; ORT_ENABLE_BASIC, optimized_model_filepath, as ORT's optimizer runs
# it with use_gpu=True) put its copies in these exports: one MemcpyFromHost each, of a Gather of the mask's shape
# read by the Mul of its flattened lookup (b·T + k). Its own constant folding first removes the Shape nodes that
# read other CPU tensors, so it writes no copy where tests/device_copies.py writes one for those.
ORT_CUDA_SESSION_COPIES = {"bert_torchscript_op14_ortopt.onnx": {"/model/Gather_3_output_0": "Mul"},
                           "gpt2_torchscript_op14_ortfp16.onnx": {"/model/Gather_5_output_0": "Mul"}}


@pytest.mark.parametrize("file", sorted(ORT_CUDA_SESSION_COPIES))
def test_the_copies_written_include_the_ones_ort_writes(file):
    """The helper writes the copy ORT's session wrote, named and read as ORT's, in the default domain."""
    copied = with_device_copies(_load(file))
    made = {n.input[0]: n for n in _copies(copied)}
    for tensor, reader in ORT_CUDA_SESSION_COPIES[file].items():
        node = made[tensor]
        assert node.op_type == "MemcpyFromHost" and node.domain == "" and node.name.startswith("Memcpy")
        assert node.output[0] == f"{tensor}_{CUDA}"
        assert [n.op_type for n in copied.graph.node if node.output[0] in n.input] == [reader]


# --- Identity, no-op Casts and broadcast-only Expands on hand-built graphs -------------------------------------
def _mask_expanded(model: onnx.ModelProto, batch: str = "shape") -> onnx.ModelProto:
    """The mask's Where(keep, 0, fill) expanded to [B, 1, S, T] (transformers' _expand_mask) before the Add, its
    target read from the inputs' shapes; ``batch="2"``: a constant 2 in place of B (a shape the scores' Add would
    not broadcast to by itself)."""
    b = "am_batch" if batch == "shape" else "two"
    target = [helper.make_node("Shape", ["attention_mask"], ["am_shape"], name="am_shape"),
              helper.make_node("Shape", ["x"], ["x_seq_len"], name="x_seq_len", start=1, end=2),
              helper.make_node("Slice", ["am_shape", "s0", "s1"], ["am_batch"], name="am_batch"),
              helper.make_node("Slice", ["am_shape", "s1", "s2"], ["am_len"], name="am_len"),
              helper.make_node("Concat", [b, "one", "x_seq_len", "am_len"], ["bias_shape"], name="bias_shape", axis=0)]
    out = _between(model, "mask_bias", "Expand", ["bias_shape"],
                   [_i64("s0", [0]), _i64("s1", [1]), _i64("s2", [2]), _i64("one", [1]), _i64("two", [2])])
    nodes = list(out.graph.node)
    at = next(k for k, n in enumerate(nodes) if n.op_type == "Expand")
    nodes[at:at] = target
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def _heads_expanded(model: onnx.ModelProto, own: bool) -> onnx.ModelProto:
    """The value heads expanded to Shape(heads) (``own``: a no-op) or to [2, N, S, H] before P·V."""
    out = _between(model, "v_heads", "Expand", ["v_target"], [_i64("two_heads", [2]), _i64("from1", [1])])
    made = [helper.make_node("Shape", ["v_heads"], ["v_target"], name="v_target")] if own else [
        helper.make_node("Shape", ["v_heads"], ["v_rest"], name="v_rest", start=1),
        helper.make_node("Concat", ["two_heads", "v_rest"], ["v_target"], name="v_target", axis=0)]
    nodes = list(out.graph.node)
    at = next(k for k, n in enumerate(nodes) if n.op_type == "Expand")
    nodes[at:at] = made
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def _scale_expanded(model: onnx.ModelProto, target) -> onnx.ModelProto:
    """√scale on Q and on Kᵀ read through Expand(c, ``target``)."""
    return _between(model, "sqrt_scale", "Expand", ["scale_target"], [_i64("scale_target", target)])


SEEN_THROUGH = {
    # the mask's path: the padding mask, its keep, the bias
    "Identity on the padding keep": lambda m: _between(m, "keep_padding", "Identity"),
    "no-op Cast of the bool mask": lambda m: _between(m, "mask_bool", "Cast", to=T.BOOL),
    "device copy of the mask bias": lambda m: _between(m, "mask_bias", "MemcpyFromHost"),
    "Expand of the mask bias to [B, 1, S, T]": _mask_expanded,
    # the heads
    "Identity in the query's head split": lambda m: _between(m, "q_split", "Identity"),
    "device copy of Kᵀ": lambda m: _between(m, "k_t", "MemcpyToHost"),
    "no-op Cast of the value heads": lambda m: _between(m, "v_heads", "Cast", to=T.FLOAT),
    "Expand of the value heads to their own shape": lambda m: _heads_expanded(m, own=True),
    "Identity of the scores": lambda m: _between(m, "scores", "Identity"),
    "no-op Casts of P (LLaMA eager's two)": lambda m: _between(_between(m, "probs_guarded", "Cast", to=T.FLOAT),
                                                               "probs_guarded_Cast", "Cast", to=T.FLOAT),
    "Identity before the head merge": lambda m: _between(m, "context", "Identity"),
    # the scale
    "Identity of √scale": lambda m: _between(m, "sqrt_scale", "Identity"),
    "Expand of √scale to [1, 1, 1, 1]": lambda m: _scale_expanded(m, [1, 1, 1, 1]),
}


@pytest.mark.parametrize("insert", SEEN_THROUGH.values(), ids=SEEN_THROUGH.keys())
def test_value_keeping_nodes_are_seen_through(insert):
    """The attention with a node that changes nothing in its mask, heads, probabilities or scale fuses as it does
    without it, with the same scale, mask and guard, and computes the same."""
    plain = _attention(mask="causal+padding", fill=-math.inf)
    model = insert(plain)
    if not _copies(model):  # (ONNX has no schema for ORT's copies)
        onnx.checker.check_model(model, full_check=True)
    (want,) = _fuse(plain).report.fused
    result = _fuse(model)
    (block,) = result.report.fused
    for key in ("scale", "mask", "num_heads", "mask_input", "qkv"):
        assert block.details[key] == want.details[key], key
    x = np.random.default_rng(5).standard_normal((6, 5, D)).astype(np.float32)
    mask = np.array([[1] * 5, [1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [0] * 5, [0, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    got, ref = _run(result.model, x, mask), _run(model, x, mask)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


CHANGED = {
    # a Cast that changes the type: the probabilities rounded through float16 (the mask bias through float16 is
    # read off its values instead: test_a_mask_bias_rounded_through_float16_is_read_off_its_values)
    "probabilities through float16": (lambda m: _between(_between(m, "probs_guarded", "Cast", to=T.FLOAT16),
                                                         "probs_guarded_Cast", "Cast", to=T.FLOAT),
                                      "rounded to float16 before P·V"),
    # an Expand that changes the result's shape: to a batch of 2 whatever the batch
    # (read as heads the graph computes, which this graph's straight Kᵀ split cannot be fed beside)
    "value heads expanded to a batch of 2": (lambda m: _heads_expanded(m, own=False),
                                             "while other heads are computed per head"),
    "mask bias expanded to a batch of 2": (lambda m: _mask_expanded(m, batch="2"),
                                           "dimension 0 (2) is not shown to be 1 or the scores'"),
    "√scale expanded to a batch of 2": (lambda m: _scale_expanded(m, [2, 1, 1, 1]),
                                        "scaled by a factor computed at run time"),
}


def test_a_mask_bias_rounded_through_float16_is_read_off_its_values():
    # not seen through (the Casts change the type), but the bias is a function of the mask alone: its values,
    # computed through both Casts, are 0 and -inf, which the padding mask is rebuilt with (mask_semantics.py)
    model = _between(_between(_attention(mask="causal+padding", fill=-math.inf), "mask_bias", "Cast", to=T.FLOAT16),
                     "mask_bias_Cast", "Cast", to=T.FLOAT)
    (block,) = _fuse(model).report.fused
    assert "padding" in block.form


@pytest.mark.parametrize("insert, reason", CHANGED.values(), ids=CHANGED.keys())
def test_nodes_that_change_the_value_or_shape_are_refused_bit_identical(insert, reason):
    model = insert(_attention(mask="causal+padding", fill=-math.inf))
    result = _fuse(model)
    assert result.report.fused == []
    (refused,) = _refusals(result)
    assert reason in refused, refused
    assert result.model.SerializeToString() == model.SerializeToString()


# --- the float32 softmax of float16 scores ----------------------------------------------------------------------
def _upcast(model: onnx.ModelProto, up: int = T.FLOAT, down: tuple = (T.FLOAT16, T.FLOAT16)) -> onnx.ModelProto:
    """transformers' eager ``softmax(scores, dtype=float32).to(query.dtype)``: Cast(``up``) in front of the Softmax,
    the Casts ``down`` behind it (LLaMA's export writes two, the second to the type P already has)."""
    (softmax,) = [n for n in model.graph.node if n.op_type == "Softmax"]
    out = _between(model, softmax.input[0], "Cast", to=up)
    t = softmax.output[0]
    for k, to in enumerate(down):
        out = _between(out, t, "Cast", to=to)
        t = f"{t}_Cast"
    return out


def test_mha_rounds_the_probabilities_as_the_upcast_graph_does():
    """ORT's CPU MultiHeadAttention for float16: P is the float32 softmax of the float32 scores, rounded once to
    float16 before P·V (read off with V the identity: the output rows are P's), what the graph's
    Cast(float32) → Softmax → Cast(float16) does to scores it has in float32."""
    rng = np.random.default_rng(0)
    s, h, scale = 8, 8, 0.37
    q, k = (rng.integers(-3, 4, (1, s, h)).astype(np.float16) for _ in range(2))  # exact integer products
    v = np.eye(s, h, dtype=np.float16)[None]
    node = helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["y"], domain="com.microsoft", num_heads=1,
                            scale=scale)
    graph = helper.make_graph([node], "mha", [helper.make_tensor_value_info(n, T.FLOAT16, None) for n in "qkv"],
                              [helper.make_tensor_value_info("y", T.FLOAT16, None)])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=9)
    (y,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"q": q, "k": k, "v": v})
    scores = (q.astype(np.float64) @ k.astype(np.float64).transpose(0, 2, 1) * np.float32(scale)).astype(np.float32)
    e = np.exp(scores - scores.max(-1, keepdims=True))
    np.testing.assert_array_equal(y, (e / e.sum(-1, keepdims=True)).astype(np.float32).astype(np.float16))


@pytest.mark.parametrize("mask, fill", [("causal+padding", -65504.0), ("padding", -math.inf), ("none", -math.inf)])
def test_float32_softmax_of_float16_scores_fuses(mask, fill):
    plain = _attention(mask=mask, fill=fill, dtype=T.FLOAT16, guard=False)
    model = _upcast(plain)
    result = _fuse(model)
    (block,) = result.report.fused
    assert "softmax in float32" in block.form
    left = {n.name for n in result.model.graph.node}
    assert not {"masked_scores_Cast", "probs_Cast", "probs_Cast_Cast"} & left  # the Casts went with the block
    assert not any(n.op_type == "Softmax" for n in result.model.graph.node)
    x = (np.random.default_rng(6).standard_normal((6, 5, D))).astype(np.float16)
    m = np.array([[1] * 5, [1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [0] * 5, [0, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    want, got = (np.asarray(_run(g, x, m), np.float64) for g in (model, result.model))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    assert np.max(np.abs(got[ok] - want[ok])) <= TOLERANCE["float16"] * max(1.0, np.max(np.abs(want[ok])))


@pytest.mark.parametrize("file", ["llama_torchscript_op17.onnx", "gpt2_torchscript_op14.onnx"])
def test_float16_converter_keeping_the_softmax_in_float32(file, rng):
    """ORT's float16 converter told to keep the Softmax in float32 writes eager attention's form: both fuse, within
    float16's tolerance of the converted original on every row's own padding."""
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        original = convert_float_to_float16(_load(file), keep_io_types=True,
                                            op_block_list=DEFAULT_OP_BLOCK_LIST + ["Softmax"])
    result = _fuse(original)
    assert [b.rule for b in result.report.fused] == ["attention", "attention"], _refusals(result)
    assert all("softmax in float32" in b.form for b in result.report.fused)
    ref, new = _session(original), _session(result.model)
    assert_outputs_match(ref, new, _feeds(file, ref, 6, 7, rng), TOLERANCE["float16"])


UPCASTS_REFUSED = [
    # float16 scores upcast to float64: MHA's softmax is float32's
    ({"up": T.DOUBLE, "down": (T.FLOAT16,)}, T.FLOAT16, "cast from float16 to float64 for the Softmax"),
    # float32 scores rounded to float16 for the Softmax
    ({"up": T.FLOAT16, "down": (T.FLOAT,)}, T.FLOAT, "cast from float32 to float16 for the Softmax"),
    # P rounded to bfloat16 on its way back to float16: not MHA's one rounding to float16
    ({"down": (T.BFLOAT16, T.FLOAT16)}, T.FLOAT16, "rounded to bfloat16"),
]


@pytest.mark.parametrize("casts, dtype, reason", UPCASTS_REFUSED, ids=[r for _, _, r in UPCASTS_REFUSED])
def test_other_casts_around_the_softmax_are_refused_bit_identical(casts, dtype, reason):
    model = _upcast(_attention(mask="padding", fill=-math.inf, dtype=dtype, guard=False), **casts)
    result = _fuse(model)
    assert result.report.fused == []
    (refused,) = _refusals(result)
    assert reason in refused, refused
    assert result.model.SerializeToString() == model.SerializeToString()


# --- a head split of a shape Concat of several kinds --------------------------------------------------------------
SHAPE_PARTS = {
    "Expand(-1, [1])": lambda: ([helper.make_node("Expand", ["minus_one", "one"], ["heads_part"], name="e")],
                                [_i64("minus_one", -1), _i64("one", [1])]),
    "sequence + 0": None,  # the sequence part, below
    "Identity of [N]": lambda: ([helper.make_node("Identity", ["n_const"], ["heads_part"], name="i")],
                                [_i64("n_const", [N])]),
    "Reshape(-1, [1])": lambda: ([helper.make_node("Reshape", ["minus_one", "one"], ["heads_part"], name="r")],
                                 [_i64("minus_one", -1), _i64("one", [1])]),
}


@pytest.mark.parametrize("part", SHAPE_PARTS, ids=SHAPE_PARTS)
def test_head_split_of_a_shape_concat_of_several_kinds(part):
    """The dynamo exporter's head split target [Shape(x)[0], Shape(x)[1], -1 or N, H] with a part that is not a
    plain shape vector (before #54: "Concat of values of different kinds")."""
    model = _attention(mask="padding", fill=-math.inf)
    graph = model.graph
    nodes = [helper.make_node("Shape", ["x"], ["x_b"], name="x_b", start=0, end=1),
             helper.make_node("Shape", ["x"], ["x_s"], name="x_s", start=1, end=2)]
    inits = [_i64("head_size", [H])]
    seq = "x_s"
    if part == "sequence + 0":
        nodes.append(helper.make_node("Add", ["x_s", "no_more"], ["x_s0"], name="x_s0"))
        inits += [_i64("no_more", [0]), _i64("n_const", [N])]
        seq, heads = "x_s0", "n_const"
    else:
        made, more = SHAPE_PARTS[part]()
        nodes += made
        inits += more
        heads = "heads_part"
    nodes.append(helper.make_node("Concat", ["x_b", seq, heads, "head_size"], ["q_target"], name="q_target", axis=0))
    reshape = next(n for n in graph.node if n.output[0] == "q_split")
    reshape.input[1] = "q_target"
    kept = list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes + kept)
    graph.initializer.extend(inits)
    result = _fuse(model)
    (block,) = result.report.fused
    assert block.details["num_heads"] == N
    x = np.random.default_rng(7).standard_normal((3, 5, D)).astype(np.float32)
    mask = np.array([[1] * 5, [1, 1, 1, 0, 0], [0, 0, 1, 1, 1]])
    np.testing.assert_allclose(_run(result.model, x, mask), _run(model, x, mask), rtol=1e-5, atol=1e-6)


# --- a banded local attention in a layout the rule does not take -------------------------------------------------
def _single_head_local_attention(window: int = 1) -> onnx.ModelProto:
    """A ModernBERT-like local attention, |q - k| <= window beside the padding mask, of one head whose axis the
    export squeezed out: the product is [B, S, T], unsqueezed to [B, 1, S, T] to take the mask and squeezed back
    for P·V (no head split, no head merge)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((D, D)) / math.sqrt(D)).astype(np.float32), f"w{p}")
             for p in "qkv"]
    inits += [_i64("axis1", [1]), _i64("axes12", [1, 2]), _i64("zero_i", 0), _i64("one_i", 1), _i64("w", window),
              _i64("q_axes", [1]), _i64("k_axes", [0]),
              numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
              numpy_helper.from_array(np.array(-np.inf, np.float32), "fill")]
    n = helper.make_node
    nodes = [n("MatMul", ["x", "wq"], ["q"]), n("MatMul", ["x", "wk"], ["k"]), n("MatMul", ["x", "wv"], ["v"]),
             n("Transpose", ["k"], ["kt"], perm=[0, 2, 1]), n("MatMul", ["q", "kt"], ["scores3"]),
             n("Unsqueeze", ["scores3", "axis1"], ["scores"]),
             n("Cast", ["attention_mask"], ["mask_bool"], to=T.BOOL),
             n("Unsqueeze", ["mask_bool", "axes12"], ["keep_padding"]),
             n("Shape", ["x"], ["x_len"], start=1, end=2), n("Squeeze", ["x_len"], ["seq"]),
             n("Range", ["zero_i", "seq", "one_i"], ["positions"]),
             n("Unsqueeze", ["positions", "q_axes"], ["q_idx"]), n("Unsqueeze", ["positions", "k_axes"], ["k_idx"]),
             n("Sub", ["k_idx", "q_idx"], ["offset"]), n("Abs", ["offset"], ["distance"]),
             n("LessOrEqual", ["distance", "w"], ["in_window"]), n("And", ["keep_padding", "in_window"], ["keep"]),
             n("Where", ["keep", "zero", "fill"], ["mask_bias"]), n("Add", ["scores", "mask_bias"], ["masked"]),
             n("Softmax", ["masked"], ["probs"], axis=-1), n("Squeeze", ["probs", "axis1"], ["probs3"]),
             n("MatMul", ["probs3", "v"], ["y"])]
    for k, node in enumerate(nodes):
        node.name = f"n{k}_{node.op_type}"
    graph = helper.make_graph(nodes, "local", [helper.make_tensor_value_info("x", T.FLOAT, ["batch", "seq", D]),
                                               helper.make_tensor_value_info("attention_mask", T.INT64,
                                                                             ["batch", "seq"])],
                              [helper.make_tensor_value_info("y", T.FLOAT, ["batch", "seq", D])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def test_banded_attention_in_a_layout_not_taken_is_refused_with_its_reason():
    """Before #54 this attention was left with no refusal at all (no form's path from the product reaches the
    Softmax through an Unsqueeze); now inspect says why, and the model stays bit-identical."""
    model = _single_head_local_attention()
    _run(model, np.zeros((2, 5, D), np.float32), np.ones((2, 5), np.int64))  # a model ORT runs
    result = _fuse(model)
    assert result.report.fused == []
    (refused,) = _refusals(result)
    assert "through Add ← Unsqueeze" in refused and "not a form taken" in refused, refused
    assert result.model.SerializeToString() == model.SerializeToString()


def test_scores_of_an_einsum_are_refused_with_their_reason():
    """Scores written as an Einsum of the query and key heads (no MatMul): listed, with why."""
    n = helper.make_node
    nodes = [n("Einsum", ["q", "k"], ["scores"], name="qk", equation="bnqh,bnkh->bnqk"),
             n("Softmax", ["scores"], ["probs"], name="softmax", axis=-1),
             n("Einsum", ["probs", "k"], ["y"], name="pv", equation="bnqk,bnkh->bnqh")]
    heads = ["batch", N, "seq", H]
    graph = helper.make_graph(nodes, "einsum", [helper.make_tensor_value_info(x, T.FLOAT, heads) for x in "qk"],
                              [helper.make_tensor_value_info("y", T.FLOAT, heads)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    result = _fuse(model)
    (refused,) = _refusals(result)
    assert refused.startswith("the scores reach the Softmax from an Einsum of two computed tensors: not a form taken")
    assert result.model.SerializeToString() == model.SerializeToString()
