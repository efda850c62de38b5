"""ONNX's own ``Attention`` op (opset 23, what the dynamo exporter writes for sdpa) → ORT's contrib attention.

The dynamo exporter's own opset-23 BERT (tests/models/bert_dynamo_op23.onnx): both attentions fuse, packed,
and its outputs equal the original's with a different padding in every batch row. Hand-built graphs in the
exporter's layout: Q, K and V projections split into heads [B, N, S, H] (or fed
3-D with ``q_num_heads``), the op, its output merged back. Accepted forms fuse into ``com.microsoft.Attention``
(the three projections packed) and give the original's outputs on ORT's CPU provider, fp32 and fp16, with a
different padding in every batch row, an all-padding row included (0 there, as ORT's kernel makes it).
Negative cases stay bit-identical and are refused with their reason.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from onnxfuse.fuse import fuse_model
from onnxfuse.patterns.attention import OnnxAttention
from onnxfuse.runtime import get_library_path

B, S, N, H = 4, 6, 2, 8
D = N * H
RULES = (OnnxAttention(),)


def _graph(dtype=T.FLOAT, mask="padding", causal=False, three_d=False, scale=None, extra_inputs=(),
           present_read=False, softcap=0.0, kv_heads=None, seed=0):
    """X [B, S, D], attention_mask [B, S] int64 (and a float bias [B, 1, S, S] for mask="additive") →
    ONNX Attention → [B, S, D]."""
    rng = np.random.default_rng(seed)
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    inits, nodes = [], []
    heads = []
    for name in ("q", "k", "v"):
        inits += [numpy_helper.from_array((rng.standard_normal((D, D)) / np.sqrt(D)).astype(np_dtype), f"W{name}"),
                  numpy_helper.from_array((0.1 * rng.standard_normal(D)).astype(np_dtype), f"b{name}")]
        nodes += [helper.make_node("MatMul", ["X", f"W{name}"], [f"{name}_mm"]),
                  helper.make_node("Add", [f"{name}_mm", f"b{name}"], [f"{name}_proj"])]
        if three_d:
            heads.append(f"{name}_proj")
            continue
        nodes += [helper.make_node("Reshape", [f"{name}_proj", "split_shape"], [f"{name}_bsnh"]),
                  helper.make_node("Transpose", [f"{name}_bsnh"], [f"{name}_heads"], perm=[0, 2, 1, 3])]
        heads.append(f"{name}_heads")
    inits += [numpy_helper.from_array(np.array([0, 0, N, H], np.int64), "split_shape"),
              numpy_helper.from_array(np.array([0, 0, D], np.int64), "merge_shape"),
              numpy_helper.from_array(np.array([1, 2], np.int64), "mask_axes")]
    inputs = [helper.make_tensor_value_info("X", dtype, ["batch", "seq", D]),
              helper.make_tensor_value_info("attention_mask", T.INT64, ["batch", "seq"])]
    attn_mask = ""
    if mask == "padding":  # [B, 1, S, S], as the exporter expands it (ORT's kernel takes no broadcast query axis)
        inits.append(numpy_helper.from_array(np.array([1], np.int64), "one"))
        nodes += [helper.make_node("Cast", ["attention_mask"], ["mask_bool"], to=T.BOOL),
                  helper.make_node("Unsqueeze", ["mask_bool", "mask_axes"], ["mask_b11s"]),
                  helper.make_node("Shape", ["attention_mask"], ["batch_dim"], start=0, end=1),
                  helper.make_node("Shape", ["attention_mask"], ["seq_dim"], start=1, end=2),
                  helper.make_node("Concat", ["batch_dim", "one", "seq_dim", "seq_dim"], ["mask_shape"], axis=0),
                  helper.make_node("Expand", ["mask_b11s", "mask_shape"], ["attn_mask"])]
        attn_mask = "attn_mask"
    elif mask == "additive":
        inputs.append(helper.make_tensor_value_info("bias", dtype, ["batch", 1, "seq", "seq"]))
        attn_mask = "bias"
    elif mask == "bool_input":
        inputs.append(helper.make_tensor_value_info("keep", T.BOOL, ["batch", 1, "seq", "seq"]))
        attn_mask = "keep"
    attrs = {}
    if scale is not None:
        attrs["scale"] = scale
    if causal:
        attrs["is_causal"] = 1
    if softcap:
        attrs["softcap"] = softcap
    if three_d:
        attrs["q_num_heads"] = N
        attrs["kv_num_heads"] = N if kv_heads is None else kv_heads
    attention_inputs = heads + [attn_mask] + list(extra_inputs)
    outputs = ["attn"] + (["present_key", "present_value"] if present_read else [])
    nodes.append(helper.make_node("Attention", attention_inputs, outputs, name="sdpa", **attrs))
    if three_d:
        nodes.append(helper.make_node("Identity", ["attn"], ["Y"]))
    else:
        nodes += [helper.make_node("Transpose", ["attn"], ["attn_bsnh"], perm=[0, 2, 1, 3]),
                  helper.make_node("Reshape", ["attn_bsnh", "merge_shape"], ["Y"])]
    graph_outputs = [helper.make_tensor_value_info("Y", dtype, ["batch", "seq", D])]
    if present_read:
        nodes.append(helper.make_node("Identity", ["present_key"], ["cache"]))
        graph_outputs.append(helper.make_tensor_value_info("cache", dtype, None))
    for extra in extra_inputs:
        inputs.append(helper.make_tensor_value_info(extra, dtype, ["batch", N, "past", H]))
    graph = helper.make_graph(nodes, "attention", inputs, graph_outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)


def _feeds(model, dtype, rng):
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    mask = np.ones((B, S), np.int64)
    mask[1, S - 2:] = 0  # right padding
    mask[2, :3] = 0  # left padding
    mask[3, :] = 0  # no key at all
    feeds = {"X": rng.standard_normal((B, S, D)).astype(np_dtype), "attention_mask": mask}
    names = {i.name for i in model.graph.input}
    if "bias" in names:
        feeds["bias"] = rng.standard_normal((B, 1, S, S)).astype(np_dtype)
    if "keep" in names:
        feeds["keep"] = rng.random((B, 1, S, S)) > 0.3
    return feeds


def _run(model, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    so.register_custom_ops_library(get_library_path())  # the row guard, FillMaskedRows
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _ops(model):
    return [(n.domain, n.op_type) for n in model.graph.node]


ACCEPTED = [
    dict(mask="padding"),
    dict(mask="padding", scale=0.3),
    dict(mask="none"),
    dict(mask="none", causal=True),
    dict(mask="padding", three_d=True),
]


@pytest.mark.parametrize("dtype", [T.FLOAT, T.FLOAT16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("form", ACCEPTED, ids=lambda f: "-".join(f"{k}={v}" for k, v in f.items()))
def test_accepted_forms_fuse_and_match(form, dtype, rng):
    model = _graph(dtype, **form)
    result = fuse_model(model, rules=RULES)
    assert [b.rule for b in result.report.fused] == ["attention"], [r.reason for r in result.report.refused]
    ops = _ops(result.model)
    assert ("", "Attention") not in ops
    assert ("com.microsoft", "Attention") in ops  # the three projections of X packed into one
    feeds = _feeds(model, dtype, rng)
    (want,), (got,) = _run(model, feeds), _run(result.model, feeds)
    want, got = want.astype(np.float64), got.astype(np.float64)
    assert np.array_equal(np.isnan(want), np.isnan(got))
    tol = 1e-5 if dtype == T.FLOAT else 4e-3
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    if form["mask"] == "padding":
        assert np.all(want[3] == 0.0)  # the all-padding row is 0 in ORT's kernel, and stays 0


REFUSED = [
    (dict(extra_inputs=("past_k", "past_v")), "KV cache"),
    (dict(present_read=True), "present key/value"),
    (dict(softcap=30.0), "softcap"),
    (dict(three_d=True, kv_heads=1), "grouped key/value heads"),
    (dict(mask="padding", causal=True), "is_causal and an attn_mask"),
    (dict(mask="bool_input"), "not provably padding or causal"),
    (dict(mask="additive"), "not shown to be finite"),
]


@pytest.mark.parametrize("form,reason", REFUSED, ids=[r for _, r in REFUSED])
def test_negatives_stay_bit_identical(form, reason):
    model = _graph(**form)
    result = fuse_model(model, rules=RULES)
    assert not result.report.fused
    (refusal,) = result.report.refused
    assert reason in refusal.reason, refusal.reason
    assert result.model.SerializeToString() == model.SerializeToString()


def test_the_dynamo_exporters_opset_23_bert_fuses_and_matches(rng):
    from test_patterns_attention import MODELS, _feeds, _session

    model = onnx.load(str(MODELS / "bert_dynamo_op23.onnx"))
    assert sum(n.op_type == "Attention" and n.domain == "" for n in model.graph.node) == 2
    result = fuse_model(model)
    assert result.report.fused_by_op == {"ai.onnxfuse.FusedLinearGelu": 2, "com.microsoft.Attention": 2,
                                         "com.microsoft.SkipLayerNormalization": 1}  # the embeddings
    assert result.report.refused == []
    attention = [b for b in result.report.fused if b.rule == "attention"]
    assert all(b.form == "attention (ONNX Attention, key-padding)" and b.details["qkv"] == "packed" for b in attention)
    only_attention = fuse_model(model, rules=RULES).model  # the CPU provider runs it without the op library
    reference, fused = _session(model), _session(only_attention)
    for batch, seq in ((6, 7), (8, 16)):
        feeds = _feeds("bert_dynamo_op23.onnx", reference, batch, seq, rng)
        for want, got in zip(reference.run(None, feeds), fused.run(None, feeds)):
            assert np.array_equal(np.isnan(want), np.isnan(got))
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_default_rules_take_onnx_attention():
    result = fuse_model(_graph())
    assert result.report.fused_by_op == {"com.microsoft.Attention": 1}
    assert result.report.fused[0].form == "attention (ONNX Attention, key-padding)"
    assert onnx.checker.check_model(result.model, full_check=True) is None


def test_heads_given_as_graph_inputs_are_refused_with_that_reason():
    # ONNX's own node tests feed 4-D Q, K and V as graph inputs: there is no projection to split heads from, and
    # the reason says so (not "computed per head", which is the rotary case)
    q, k, v = (helper.make_tensor_value_info(n, T.FLOAT, [2, 3, 4, 8]) for n in ("Q", "K", "V"))
    node = helper.make_node("Attention", ["Q", "K", "V"], ["Y"], name="attention")
    graph = helper.make_graph([node], "g", [q, k, v], [helper.make_tensor_value_info("Y", T.FLOAT, [2, 3, 4, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    result = fuse_model(model)
    assert result.report.fused == []
    (refusal,) = result.report.refused
    assert "query heads [B, N, S, H] are the graph input 'Q', not split from a projection" in refusal.reason
    assert result.model.SerializeToString() == model.SerializeToString()
