"""ONNX's own ``Attention`` op (opset 23, the dynamo exporter's scaled_dot_product_attention) into
``com.microsoft.Attention`` or ``MultiHeadAttention``, on the proofs of the Softmax form (:mod:`.rules`).
"""

from __future__ import annotations

import math

from ..graph import GraphView, attr
from ..match import Refused
from ..rule import T
from ..symbolic import Evaluator
from . import masks
from .assemble import attention_dtype, finish, unless_escaping
from .heads import merge_heads, projection_heads, read_heads
from .plan import RULE, AttentionPlan
from .rules import Attention


class OnnxAttention:
    """ONNX's own ``Attention`` op (opset 23: the dynamo exporter's scaled_dot_product_attention) →
    ``com.microsoft.Attention`` or ``MultiHeadAttention``, on the same proofs as :class:`Attention`.

    ORT runs ONNX's op, but slower than its contrib ops: its attention kernels take longer, and it runs three Q/K/V
    GEMMs where the contrib op packs one (bench/results/e2e_kernels_h200_dynamo_op23.md). Taken: Q, K and V as head
    splits [B, N, S, H] of projections (or 3-D [B, S, N·H] with ``q_num_heads``), the output merged back by the
    graph (4-D) or 3-D; ``attn_mask`` absent, boolean and proved padding and/or causal (a dropped key gets -inf, as
    the op defines), or a finite additive tensor; ``is_causal`` with the query and key lengths proved equal; the
    op's own scale or its default 1/√head_size. A row that sees no key is 0, as ORT's kernel makes it (measured on
    its CPU provider), kept by the row guard. Refused with the reason: a KV cache (``past_key``/``past_value``,
    ``nonpad_kv_seqlen``), present key/value or ``qk_matmul_output`` read, ``softcap``, grouped K/V heads
    (``kv_num_heads`` ≠ ``q_num_heads``), ``is_causal`` with a mask, and whatever the Softmax form refuses for its
    Q, K, V and mask."""

    name = RULE
    anchors = (("", "Attention"),)
    emits = Attention.emits

    def match(self, view: GraphView, i: int):
        try:
            plan = _plan_onnx(view, i)
        except Refused as why:
            return why.as_refusal(RULE, (view.node_name(i),))
        return unless_escaping(view, i, plan)


def _plan_onnx(view: GraphView, i: int) -> AttentionPlan:
    node = view.nodes[i]
    ev = Evaluator(view)
    ins = list(node.input) + [""] * (7 - len(node.input))
    if any(ins[4:7]):
        raise Refused("ONNX Attention with a KV cache (past_key/past_value or nonpad_kv_seqlen): not a "
                      "self-attention over the inputs alone")
    read = [o for o in node.output[1:] if o and (view.consumers_of(o) or o in view.graph_outputs)]
    if read:
        raise Refused(f"ONNX Attention's present key/value or qk_matmul_output ('{read[0]}') is read")
    if attr(node, "softcap", 0.0) != 0.0:
        raise Refused(f"ONNX Attention with softcap {attr(node, 'softcap', 0.0):g}: the contrib ops have none")
    nodes = {i}
    rank = ev.rank(ins[0])
    if rank == 4:
        q, k, v = (read_heads(view, ev, t, nodes, what) for t, what in zip(ins[:3], ("query", "key", "value")))
        computed = [(t, what) for t, what, h in zip(ins[:3], ("query", "key", "value"), (q, k, v)) if h.computed]
        if computed:
            t, what = computed[0]
            if t in view.graph_inputs:
                # (ONNX's own node tests feed Q, K and V as inputs; no projection to pack or merge heads from)
                raise Refused(f"ONNX Attention whose {what} heads [B, N, S, H] are the graph input '{t}', not "
                              "split from a projection: not taken from this op")
            raise Refused(f"ONNX Attention whose {what} heads the graph computes per head (a rotary embedding): "
                          "not taken from this op")
    elif rank == 3:
        q_heads, kv_heads = attr(node, "q_num_heads", 0), attr(node, "kv_num_heads", 0)
        if q_heads <= 0 or kv_heads != q_heads:
            raise Refused(f"ONNX Attention with 3-D inputs and {q_heads} query / {kv_heads} key-value heads "
                          "(grouped key/value heads, or none given)")
        q, k, v = (projection_heads(view, ev, t, q_heads, what) for t, what in zip(ins[:3], ("query", "key", "value")))
    else:
        raise Refused(f"ONNX Attention's query is not known to be 3-D or 4-D (rank {rank})")
    if not (q.heads == k.heads == v.heads):
        raise Refused(f"ONNX Attention with {q.heads} query and {k.heads}/{v.heads} key/value heads (grouped "
                      "key/value heads)")
    dtype = attention_dtype(ev, q, k)
    mask = masks.NO_MASK
    if ins[3]:
        if ev.dtype(ins[3]) == T.BOOL:
            mask = masks.proved_keep(view, ev, ins[3], -math.inf, q, k, dtype)
        else:
            mask = masks.additive_bias(view, ev, ins[3], q, k, dtype, "the float attn_mask is added to the scores")
    if attr(node, "is_causal", 0):
        if ins[3]:
            raise Refused("ONNX Attention with is_causal and an attn_mask: not taken")
        if q.seq != k.seq:
            raise Refused("ONNX Attention with is_causal where the query and key lengths are not shown equal "
                          "(its causal mask is aligned to the top left, MultiHeadAttention's to the bottom right)")
        mask = masks.Mask("causal", causal=True)
    head_size = q.head_size
    scale = attr(node, "scale", None)
    if scale is None:
        scale = 1.0 / math.sqrt(head_size)
    if rank == 4:
        merged, flat_shape = merge_heads(view, ev, node.output[0], q, q.heads * q.head_size, nodes)
    else:
        merged, flat_shape = node.output[0], None
    return finish(view, ev, nodes, q, k, v, dtype, mask, merged, flat_shape, scale, ("ONNX Attention", ""), 0.0,
                   node.name or f"attention_{i}")
