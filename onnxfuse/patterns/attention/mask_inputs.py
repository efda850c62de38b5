"""The tensors a plan writes in front of the fused op for its mask: the rebuilt keep and its bias, the
graph's own bias expanded to the scores' lengths, and the bias of a literal keep on the product.

Kernel choice (ORT's contrib_ops/cuda/bert/multihead_attention.cc and attention.cc): no mask and causal-only
reach cuDNN SDPA (sm90), flash attention (float16) or memory-efficient attention, and the TensorRT fused
kernel without a mask; a ``key_padding_mask``/``mask_index`` of shape [B, T] rules out every fused kernel
(only the unfused softmax path takes it, ``SoftmaxWithRawMaskSmallKernel``: its cost in BERT-base is in
bench/results/e2e_h200.md), while an ``attention_bias`` reaches memory-efficient attention when S is a
multiple of 4·sizeof(T). So padding goes in as ``attention_bias``; which kernel ran is read by
``bench/e2e_kernels.py``.

The mask is rebuilt from what the rule proved it to be, keep[b, 0, q, k] = padding[b, k] != 0
(∧ k <= q, or ∧ lo <= k - q <= hi), from the padding tensor and the query's length alone: every op of
it runs on the model's provider, where the exporters' index arithmetic (Range, GatherND, Expand chains
over shapes) ran partly on the CPU, which cost a device-host copy per inference and kept ORT from
capturing the model in a CUDA graph. One rebuilt mask serves every layer with the same padding tensor
and query length.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import onnx

from ..rule import Emitter, T

if TYPE_CHECKING:
    from .plan import AttentionPlan


def keep_mask(plan: AttentionPlan, out: Emitter, nodes: list) -> str:
    """keep [B, 1, 1, T] (padding) or [B, 1, S, T] (padding ∧ causal or a window), bool: appends the nodes
    that make it to ``nodes`` unless an earlier block made it."""
    made, keep = out.shared(_mask_key(plan, "keep"), lambda: _keep_nodes(plan, out))
    nodes += made
    return keep


def padding_bias(plan: AttentionPlan, out: Emitter) -> tuple[list[onnx.NodeProto], str]:
    """MHA's ``attention_bias`` for a proved padding mask (with causality or a window): one for every layer
    with the same padding tensor (and, beyond self-attention, the same query)."""
    return out.shared(_mask_key(plan, "attention_bias"), lambda: _padding_bias_nodes(plan, out))


def expanded_bias(plan: AttentionPlan, out: Emitter) -> tuple[list[onnx.NodeProto], str]:
    """The graph's own additive bias expanded to the query and key lengths (where it broadcasts over them)."""
    return out.shared(("expanded_bias", plan.additive_bias, plan.query, plan.key),
                      lambda: _expanded_bias_nodes(plan, out))


def score_keep_bias(plan: AttentionPlan, out: Emitter, attention_bias: str) -> tuple[list[onnx.NodeProto], str]:
    """The bias of a literal keep on the product (``score_keep``), plus ``attention_bias`` (or nothing)."""
    # one bias for every layer that slices the same literal to the padding's own length (both exporters
    # store each of GPT-Neo's buffers once, its causal and its banded one, for all the layers that read it)
    lengths = (plan.padding,) if _lengths_from_padding(plan) else (plan.query, plan.key)
    return out.shared(("score_keep_bias", plan.score_keep, plan.score_fill, plan.dtype, attention_bias) + lengths,
                      lambda: _score_keep_bias_nodes(plan, out, attention_bias))


def _mask_key(plan: AttentionPlan, what: str) -> tuple:
    # Self-attention's mask depends on the padding tensor alone; otherwise also on this block's query.
    return (what, plan.padding, plan.mask_kind, plan.band, plan.fill, plan.dtype,
            None if plan.self_attention else plan.query)


def _length_source(plan: AttentionPlan) -> str:
    """The tensor whose axis 1 is the query length S: the padding mask itself in self-attention
    (S = T, its last axis; shared by every layer), else the query."""
    return plan.padding if plan.self_attention else plan.query


def _padding_key_axis(plan: AttentionPlan) -> int:
    """The padding tensor's key axis, its last: 1 of [B, T], 3 of [B, 1, 1, T]."""
    return plan.padding_rank - 1


def _positional(plan: AttentionPlan) -> bool:
    """The keep depends on the query and key positions (causal, or a window): [B, 1, S, T]."""
    return "causal" in plan.mask_kind or plan.band is not None


def _lengths_from_padding(plan: AttentionPlan) -> bool:
    return plan.padding is not None and plan.self_attention


def _keep_nodes(plan: AttentionPlan, out: Emitter) -> tuple[list[onnx.NodeProto], str]:
    hint = plan.name_hint + "_mask"
    nodes: list[onnx.NodeProto] = []
    source = plan.padding
    if not plan.padding_is_bool:
        source = out.name(hint + "_padding_bool")
        nodes.append(onnx.helper.make_node("Cast", [plan.padding], [source], name=out.name(source), to=T.BOOL))
    if plan.padding_rank == 2:
        keep = out.name(hint + "_keep_padding")
        nodes.append(_with_axes(out, plan.opset, "Unsqueeze", 13, source, keep, [1, 2], hint + "_padding_axes"))
    else:
        keep = source  # already [B, 1, 1, T]
    if not _positional(plan):
        return nodes, keep
    names = [out.name(hint + s) for s in ("_query_shape", "_query_len", "_padding_shape", "_key_len",
                                         "_key_positions", "_query_positions", "_query_column", "_keep")]
    q_shape, q_len, p_shape, k_len, k_pos, q_pos, q_col, both = names
    zero, one = (out.initializer(hint + n, np.array(v, np.int64)) for n, v in (("_pos0", 0), ("_pos_step", 1)))
    seq_axis = out.initializer(hint + "_seq_axis", np.array(1, np.int64))
    key_axis = seq_axis if plan.padding_rank == 2 else \
        out.initializer(hint + "_padding_key_axis", np.array(_padding_key_axis(plan), np.int64))
    nodes += [
        onnx.helper.make_node("Shape", [plan.padding], [p_shape], name=out.name(p_shape)),
        onnx.helper.make_node("Gather", [p_shape, key_axis], [k_len], name=out.name(k_len), axis=0),
        onnx.helper.make_node("Range", [zero, k_len, one], [k_pos], name=out.name(k_pos)),
    ]
    if plan.self_attention:
        q_pos = k_pos
    else:
        nodes += [
            onnx.helper.make_node("Shape", [plan.query], [q_shape], name=out.name(q_shape)),
            onnx.helper.make_node("Gather", [q_shape, seq_axis], [q_len], name=out.name(q_len), axis=0),
            onnx.helper.make_node("Range", [zero, q_len, one], [q_pos], name=out.name(q_pos)),
        ]
    nodes.append(_with_axes(out, plan.opset, "Unsqueeze", 13, q_pos, q_col, [1], hint + "_column_axes"))
    if plan.band is None:  # causal: k <= q
        future, kept = out.name(hint + "_future"), out.name(hint + "_past_or_present")
        nodes += [onnx.helper.make_node("Greater", [k_pos, q_col], [future], name=out.name(future)),
                  onnx.helper.make_node("Not", [future], [kept], name=out.name(kept))]  # [S, T]
    else:  # lo <= k - q <= hi, integers compared exactly as the graph's own bounds
        offset, below, above, outside, kept = (out.name(hint + s) for s in (
            "_key_offset", "_before_window", "_after_window", "_outside_window", "_in_window"))
        lo, hi = (out.initializer(hint + n, np.array(v, np.int64)) for n, v in zip(("_lowest", "_highest"),
                                                                                  plan.band))
        nodes += [onnx.helper.make_node("Sub", [k_pos, q_col], [offset], name=out.name(offset)),  # [S, T]
                  onnx.helper.make_node("Less", [offset, lo], [below], name=out.name(below)),
                  onnx.helper.make_node("Greater", [offset, hi], [above], name=out.name(above)),
                  onnx.helper.make_node("Or", [below, above], [outside], name=out.name(outside)),
                  onnx.helper.make_node("Not", [outside], [kept], name=out.name(kept))]
    nodes.append(onnx.helper.make_node("And", [keep, kept], [both], name=out.name(both)))
    return nodes, both


def _padding_bias_nodes(plan: AttentionPlan, out: Emitter) -> tuple[list[onnx.NodeProto], str]:
    """MHA's 4-D ``attention_bias`` [B, 1, S, T]: 0 where the graph keeps a key, its fill elsewhere."""
    hint = plan.name_hint + "_mask"
    nodes: list[onnx.NodeProto] = []
    keep = keep_mask(plan, out, nodes)
    np_dtype = onnx.helper.tensor_dtype_to_np_dtype(plan.dtype)
    bias = out.name(hint + "_additive")
    nodes.append(onnx.helper.make_node(
        "Where", [keep, out.initializer(hint + "_kept", np.array(0, np_dtype)),
                  out.initializer(hint + "_fill", np.array(plan.fill, np_dtype))], [bias], name=out.name(bias)))
    if _positional(plan):
        return nodes, bias  # already [B, 1, S, T]
    # [B, 1, 1, T] → [B, 1, S, T]: MHA takes the query axis whole
    q_shape, q_len, target, expanded = (out.name(hint + s) for s in
                                        ("_query_shape", "_query_len", "_bias_shape", "_attention_bias"))
    nodes += [
        onnx.helper.make_node("Shape", [_length_source(plan)], [q_shape], name=out.name(q_shape)),
        onnx.helper.make_node("Gather", [q_shape, out.initializer(hint + "_seq_axes", np.array(
                              [_padding_key_axis(plan) if plan.self_attention else 1], np.int64))],
                              [q_len], name=out.name(q_len), axis=0),
        onnx.helper.make_node("Concat", [out.initializer(hint + "_bias_lead", np.array([1, 1], np.int64)), q_len,
                                         out.initializer(hint + "_bias_tail", np.array([1], np.int64))],
                              [target], name=out.name(target), axis=0),
        onnx.helper.make_node("Expand", [bias, target], [expanded], name=out.name(expanded)),
    ]
    return nodes, expanded


def _score_keep_bias_nodes(plan: AttentionPlan, out: Emitter, attention_bias: str) -> tuple[list[onnx.NodeProto], str]:
    """``Where(C[.., :S, :L], 0, fill) + bias`` (the mask's bias, or nothing) as MHA's attention_bias: the
    graph's ``Where(keep, s, fill) + bias`` with the product taken out, which MHA adds back (exact:
    ``score_keep``'s docstring). The keep is sliced from the literal again, from 0 to the query's and key's own
    lengths, which is what the graph's slices were proved to be (their starts 0, their ends these
    lengths): so it reads none of the block's tensors. Padded to 4 axes; a literal of one row is
    expanded over the query positions (MHA takes [B|1, N|1, S, T])."""
    hint = plan.name_hint + "_score_keep"
    np_dtype = onnx.helper.tensor_dtype_to_np_dtype(plan.dtype)
    nodes, q_len, k_len = _lengths(plan, out, hint)
    rank = plan.score_keep_rank
    ends, sliced, keep, dropped = (out.name(hint + x) for x in ("_ends", "_sliced", "_4d", "_bias"))
    nodes += [
        onnx.helper.make_node("Concat", [q_len, k_len], [ends], name=out.name(ends), axis=0),
        onnx.helper.make_node("Slice", [plan.score_keep, out.initializer(hint + "_starts", np.zeros(2, np.int64)),
                                        ends, out.initializer(hint + "_axes", np.array([rank - 2, rank - 1],
                                                                                       np.int64))],
                              [sliced], name=out.name(sliced)),
    ]
    if rank < 4:
        nodes.append(_with_axes(out, plan.opset, "Unsqueeze", 13, sliced, keep, list(range(4 - rank)),
                                hint + "_lead_axes"))
    else:
        keep = sliced
    nodes.append(onnx.helper.make_node(
        "Where", [keep, out.initializer(hint + "_kept", np.array(0, np_dtype)),
                  out.initializer(hint + "_fill", np.array(plan.score_fill, np_dtype))], [dropped],
        name=out.name(dropped)))
    if plan.score_keep_rows == 1:
        made, dropped = _expand_to(out, dropped, q_len, k_len, hint)
        nodes += made
    if not attention_bias:
        return nodes, dropped
    total = out.name(hint + "_attention_bias")
    nodes.append(onnx.helper.make_node("Add", [dropped, attention_bias], [total], name=out.name(total)))
    return nodes, total


def _expanded_bias_nodes(plan: AttentionPlan, out: Emitter) -> tuple[list[onnx.NodeProto], str]:
    """The graph's bias broadcast to [B|1, N|1, S, T], the shape MHA's attention_bias must have at run
    time: Expand to [1, 1, S, T] keeps the bias's own batch and head axes (1 or the scores')."""
    hint = plan.name_hint + "_bias"
    nodes, q_len, k_len = _lengths(plan, out, hint)
    made, expanded = _expand_to(out, plan.additive_bias, q_len, k_len, hint)
    return nodes + made, expanded


def _lengths(plan: AttentionPlan, out: Emitter, hint: str) -> tuple[list[onnx.NodeProto], str, str]:
    """The query's and key's lengths as [1] tensors: in self-attention with a padding mask both are the
    mask's length (proved), which every layer shares; else the query's axis 1 and the key's (axis 1 of a
    [B, L, D] key, axis 2 of [B, N, L, H] heads)."""
    if _lengths_from_padding(plan):
        shape, length = out.name(hint + "_padding_shape"), out.name(hint + "_length")
        axis = out.initializer(hint + "_seq_axes", np.array([_padding_key_axis(plan)], np.int64))
        return [onnx.helper.make_node("Shape", [plan.padding], [shape], name=out.name(shape)),
                onnx.helper.make_node("Gather", [shape, axis], [length], name=out.name(length), axis=0)
                ], length, length
    q_shape, k_shape, q_len, k_len = (out.name(hint + s) for s in ("_query_shape", "_key_shape", "_query_len",
                                                                   "_key_len"))
    seq_axis = out.initializer(hint + "_seq_axes", np.array([1], np.int64))
    key_axis = out.initializer(hint + "_key_axes", np.array([2], np.int64)) if plan.kv_heads else seq_axis
    return [
        onnx.helper.make_node("Shape", [plan.query], [q_shape], name=out.name(q_shape)),
        onnx.helper.make_node("Gather", [q_shape, seq_axis], [q_len], name=out.name(q_len), axis=0),
        onnx.helper.make_node("Shape", [plan.key], [k_shape], name=out.name(k_shape)),
        onnx.helper.make_node("Gather", [k_shape, key_axis], [k_len], name=out.name(k_len), axis=0),
    ], q_len, k_len


def _expand_to(out: Emitter, bias: str, q_len: str, k_len: str,
               hint: str) -> tuple[list[onnx.NodeProto], str]:
    target, expanded = out.name(hint + "_shape"), out.name(hint + "_attention_bias_expanded")
    return [
        onnx.helper.make_node("Concat", [out.initializer(hint + "_lead", np.array([1, 1], np.int64)), q_len, k_len],
                              [target], name=out.name(target), axis=0),
        onnx.helper.make_node("Expand", [bias, target], [expanded], name=out.name(expanded)),
    ], expanded


def _with_axes(out: Emitter, opset: int, op: str, axes_input_since: int, x: str, y: str, axes: list,
               axes_hint: str, **attrs) -> onnx.NodeProto:
    """``op(x, axes)`` in the model's opset: axes as an input from ``axes_input_since`` on (Unsqueeze and
    ReduceSum: 13), as an attribute before."""
    if opset >= axes_input_since:
        return onnx.helper.make_node(op, [x, out.initializer(axes_hint, np.array(axes, np.int64))], [y],
                                     name=out.name(y), **attrs)
    return onnx.helper.make_node(op, [x], [y], name=out.name(y), axes=axes, **attrs)
