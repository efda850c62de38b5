"""Self-attention, as the exporters write it, into one ``com.microsoft.Attention`` (Q, K and V packed into
one projection) or, where they cannot be packed, one ``com.microsoft.MultiHeadAttention``.

Anchored on ``Softmax``. The forms below are the ones torch.onnx writes for Hugging Face models with the
default (``sdpa``) attention, TorchScript (``dynamo=False``) and dynamo exporters, opsets 14-20, raw and
after ORT's transformers optimizer (which fuses none of them) and its float16 converter; see
tests/models/manifest.json.

Guard: sdpa's math path writes ``Where(IsNaN(P), 0, P)`` after the Softmax: it turns rows with no visible
key (−inf everywhere: NaN) into zeros.

Refused, with the reason shown by ``inspect``: probabilities read anywhere else (``output_attentions``),
Softmax over another axis, a bias that is neither a proved padding/causal mask nor a finite tensor of
the scores' type and shape (``-inf`` fills of masks it cannot prove, such as an anti-causal compare;
``(1 - m) · finfo.min`` of an int64 mask; a bias of another type or
one that broadcasts the scores up), scores scaled after the bias is added, a query/key that reaches the
product through other ops without proved [B, N, S, H] dimensions (above), key and value heads of
different sizes, inconsistent head counts.

Projections: where Q, K and V are constant-weight projections of one tensor X (three MatMuls, or GPT-2's
one MatMul and a Split; qkv.py), the block takes them in and becomes ``Attention(X, [Wq | Wk | Wv],
[bq | bk | bv])``: ORT runs one GEMM and one kernel that adds the bias and splits the heads, where MHA
was fed three GEMMs' outputs (BERT) or a Split's (GPT-2: a Split kernel and a bias broadcast of their
own). Weights in external data are packed too, joined while the model is saved. Otherwise (a
cross-attention, a run-time weight, a projection also read elsewhere: ``inspect`` gives the reason as
``qkv_separate_because``) the projections are fed to MHA as they are; when each is ``MatMul +
Add(const [D])``, the three Adds are folded into MHA's ``bias`` input (one new [3D] constant), else the Adds
stay in front of the op.

ONNX's own ``Attention`` op (opset 23, the dynamo exporter's sdpa) is the second anchor (:class:`OnnxAttention`),
rewritten on the same proofs. Not handled (no such form among the committed exports): ALiBi as bloom
writes it (its scores are one ``baddbmm``, no Q·Kᵀ MatMul: not a candidate), a row guard derived from a bias's values (which would admit non-finite biases).
"""

from __future__ import annotations

import math

import numpy as np

from .. import qkv
from ..graph import GraphView, attr, is_op
from ..match import Refused
from ..rule import Refusal, T, dtype_name
from ..symbolic import Evaluator
from . import masks
from .heads import (Heads, heads_read_as_they_are, key_transposed, merge_heads, projection_heads, read_heads,
                    value_hidden)
from .masks import FLOAT32_MIN
from .plan import MS_DOMAIN, RULE, AttentionPlan, PackedAttentionPlan
from .score_keep import prove_score_keep
from .scores import ScoreKeep, Scores, find_scores, scores_in_another_form, scores_masked_by_where, strip_scale

_SUPPORTED = (T.FLOAT, T.FLOAT16)
# Nodes that only compute shapes of a block's tensors may be absorbed into the block (their only reader).
# Ops of a shape-only subgraph that dies with the block (_shape_closure), the run-time scale's arithmetic
# (1/√Shape(q)[-1], scores.strip_scale) included: a closure is taken only where every path ends inside the block.
_SHAPE_OPS = ("Shape", "Slice", "Concat", "Gather", "Squeeze", "Unsqueeze", "Cast", "Reshape", "CastLike", "Sqrt",
              "Reciprocal", "Div", "Mul", "Sub")  # Sub: GPT-Neo's key_length - query_length


# --- the rule ----------------------------------------------------------------------------------------
class Attention:
    """Softmax-anchored self-attention → ``com.microsoft.MultiHeadAttention``."""

    name = RULE
    anchors = (("", "Softmax"),)
    # The fused op. The ONNX ops written around it (the mask's Casts, the output's IsNaN/Where guard or
    # hidden-row factor, a Reshape) run on every provider; listed here they would hold every such node of
    # a model to the requested provider in the benchmark's placement check.
    emits = ((MS_DOMAIN, "MultiHeadAttention"), (MS_DOMAIN, "Attention"))

    def match(self, view: GraphView, i: int):
        node = view.nodes[i]
        if not is_op(node, "Softmax"):
            return None
        scores = find_scores(view, node.input[0])
        if scores is None:
            why = scores_masked_by_where(view, node.input[0]) or scores_in_another_form(view, node.input[0])
            # not fed by a product: some other Softmax, unless it is one whose scores come in a form not taken
            return Refusal(RULE, why, (view.node_name(i),)) if why else None
        try:
            plan = _plan(view, i, scores)
        except Refused as why:
            return why.as_refusal(RULE, (view.node_name(i),))
        return _unless_escaping(view, i, plan)


def _unless_escaping(view: GraphView, anchor: int, plan: AttentionPlan) -> AttentionPlan | Refusal:
    """``plan``, unless a tensor it removes is read elsewhere: an attention whose heads or scores are read
    outside it (T5's first layers return the key heads as the cache; its decoder's position bias reads the
    query heads' shape) stays, with this rule's reason."""
    escape = view.escaping_intermediate(plan.nodes, plan.outputs)
    if escape is None:
        return plan
    out, reader = escape
    where = "is a graph output" if reader is None else f"is also read by {view.node_name(reader)}"
    return Refusal(RULE, f"the attention's intermediate '{out}' {where} (a cache output or a shape read outside "
                         "the attention)", (view.node_name(anchor),))


class OnnxAttention:
    """ONNX's own ``Attention`` op (opset 23: the dynamo exporter's scaled_dot_product_attention) →
    ``com.microsoft.Attention`` or ``MultiHeadAttention``, on the same proofs as :class:`Attention`.

    ORT runs ONNX's op, but slower than its contrib ops (H200, BERT-base fp16 at batch 32: 387 µs of attention
    kernels per inference against 192 µs, and three Q/K/V GEMMs where the contrib op packs one;
    bench/results/e2e_kernels_h200_dynamo_op23.md). Taken: Q, K and V as head splits [B, N, S, H] of
    projections (or 3-D [B, S, N·H] with ``q_num_heads``), the output merged back by the graph (4-D) or 3-D;
    ``attn_mask`` absent, boolean and proved padding and/or causal (a dropped key gets -inf, as the op
    defines), or a finite additive tensor; ``is_causal`` with the query and key lengths proved equal; the
    op's own scale or its default 1/√head_size. A row that sees no key is 0, as ORT's kernel makes it
    (measured on its CPU provider), kept by the row guard. Refused with the reason: a KV cache
    (``past_key``/``past_value``, ``nonpad_kv_seqlen``), present key/value or ``qk_matmul_output`` read,
    ``softcap``, grouped K/V heads (``kv_num_heads`` ≠ ``q_num_heads``), ``is_causal`` with a mask, and
    whatever the Softmax form refuses for its Q, K, V and mask."""

    name = RULE
    anchors = (("", "Attention"),)
    emits = Attention.emits

    def match(self, view: GraphView, i: int):
        try:
            plan = _plan_onnx(view, i)
        except Refused as why:
            return why.as_refusal(RULE, (view.node_name(i),))
        return _unless_escaping(view, i, plan)


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
        if q.computed or k.computed or v.computed:
            raise Refused("ONNX Attention whose heads the graph computes per head (a rotary embedding): "
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
    dtype = ev.dtype(q.typed)
    if dtype is None:
        raise Refused("the attention's dtype is not known (no projection's type can be derived)")
    if dtype not in _SUPPORTED or ev.dtype(k.typed) != dtype:
        raise Refused(f"attention in {dtype_name(dtype)}: MultiHeadAttention is fused here for float32/float16")
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
    return _finish(view, ev, nodes, q, k, v, dtype, mask, merged, flat_shape, scale, ("ONNX Attention", ""), 0.0,
                   node.name or f"attention_{i}")


def _plan(view: GraphView, softmax: int, sc: Scores) -> AttentionPlan:
    node = view.nodes[softmax]
    ev = Evaluator(view)
    rank = ev.rank(node.input[0]) or 4
    axis = attr(node, "axis", -1)
    if axis not in (-1, rank - 1):
        raise Refused(f"Softmax over axis {axis}: attention normalises over the key axis (the last)")
    if sc.post_scale != 1.0:
        raise Refused(f"the scores are scaled by {sc.post_scale:g} after the bias is added: MultiHeadAttention "
                       "adds attention_bias to the scaled product, unscaled")
    nodes = set(sc.nodes) | {softmax}
    qk = view.nodes[sc.matmul]

    q_scaled, k_scaled = qk.input[0], qk.input[1]
    qh, q_scale = strip_scale(view, q_scaled, nodes, ev)
    kt, k_scale = strip_scale(view, k_scaled, nodes, ev)
    q = read_heads(view, ev, qh, nodes, "query")
    k = key_transposed(view, ev, kt, nodes)
    scale = sc.scale * q_scale * k_scale

    dtype = ev.dtype(q.typed)
    if dtype is None:
        raise Refused("the attention's dtype is not known (no projection's type can be derived)")
    if dtype not in _SUPPORTED or ev.dtype(k.typed) != dtype:
        raise Refused(f"attention in {dtype_name(dtype)}: MultiHeadAttention is fused here for float32/float16")
    mask = masks.classify(view, ev, sc.bias, q, k, dtype) if sc.bias is not None else masks.NO_MASK
    score_keep = None if sc.keep is None else prove_score_keep(view, ev, sc.keep, q, k, dtype, mask)
    if score_keep is not None and all(r in nodes | score_keep.slices for i in score_keep.slices
                                      for o in view.nodes[i].output for r in view.consumers_of(o)):
        # the block's own slices go with it (the keep is sliced again: AttentionPlan._score_keep_bias), so the
        # shape arithmetic over the heads they may read dies with it; slices another layer also reads (the
        # dynamo exporter shares one between layers of the same buffer) stay, and die once no layer reads them
        nodes |= score_keep.slices
    # The mask adds without broadcasting the scores up (checked by masks.classify), so the probabilities
    # have the product's dimensions: recorded, so the head merge's reshapes can be checked against them.
    probs, guarded = node.output[0], False
    ev.seed(probs, tuple(ev.dim(qk.output[0], j) for j in range(4)))
    readers = view.consumers_of(probs)
    if probs in view.graph_outputs:
        raise Refused("the attention probabilities are a graph output (output_attentions)")
    if len(readers) == 2:
        guard = _nan_guard(view, probs, readers)
        if guard is None:
            raise Refused("the attention probabilities are read outside the attention (output_attentions?)")
        nodes |= set(guard[0])
        probs, guarded = guard[1], True
    ev.seed(probs, tuple(ev.dim(qk.output[0], j) for j in range(4)))
    cast = view.single_consumer(probs)
    if cast is not None and is_op(view.nodes[cast], "Cast") and attr(view.nodes[cast], "to") == dtype:
        # GPT-Neo's attn_weights.to(value.dtype): a Cast to the type the probabilities already have
        nodes.add(cast)
        probs = view.nodes[cast].output[0]
        ev.seed(probs, tuple(ev.dim(qk.output[0], j) for j in range(4)))
    pv = view.single_consumer(probs)
    if pv is None or not is_op(view.nodes[pv], "MatMul") or view.nodes[pv].input[0] != probs:
        raise Refused("the attention probabilities are read outside the attention (output_attentions?)")
    nodes.add(pv)
    v = read_heads(view, ev, view.nodes[pv].input[1], nodes, "value")
    per_head = q.computed or k.computed or v.computed
    hidden = value_hidden(ev, q, v) if per_head else q.heads * q.head_size
    merged, flat_shape = merge_heads(view, ev, view.nodes[pv].output[0], q, hidden, nodes)
    scaling = ("√scale on Q and Kᵀ" if q_scale != 1.0 and k_scale != 1.0 else
               "scaled Q" if q_scale != 1.0 else "scaled Kᵀ" if k_scale != 1.0 else
               "scaled scores" if sc.scale != 1.0 else "unscaled")
    # A row that sees no key (an all-padding batch row; left padding under causality) is NaN in the graph
    # with the -inf fill, and 0 after its guard: reproduced whatever the kernel makes of such a row. With a
    # finite fill such a row is the graph's plain softmax of equal scores, which MHA computes the same way.
    no_key_row = 0.0 if guarded else math.nan
    return _finish(view, ev, nodes, q, k, v, dtype, mask, merged, flat_shape, scale,
                   (scaling, "IsNaN guard" if guarded else ""), no_key_row,
                   view.nodes[softmax].name or f"attention_{softmax}", score_keep)


def _finish(view: GraphView, ev: Evaluator, nodes: set, q: Heads, k: Heads, v: Heads, dtype: int, mask: masks.Mask,
            merged: str, flat_shape: tuple | None, scale: float, form_notes: tuple, no_key_row: float,
            name_hint: str, score_keep: ScoreKeep | None = None) -> AttentionPlan:
    """The plan of a matched attention (either anchor): packing, biases, the mask's input and the rows that
    see no key. ``no_key_row`` is the graph's value for such a row where the fill is -inf (0 or NaN)."""
    per_head = q.computed or k.computed or v.computed
    if ev.dtype(v.typed) != dtype:
        raise Refused(f"the value is {dtype_name(ev.dtype(v.typed))}, the query {dtype_name(dtype)}")
    broadcast_heads: tuple = ()
    if per_head:
        kept, broadcast_heads = heads_read_as_they_are(ev, q, k, v)
        nodes -= kept
    elif not (q.heads == k.heads == v.heads and q.head_size == k.head_size):
        raise Refused(f"query/key/value split into {q.heads}/{k.heads}/{v.heads} heads of "
                       f"{q.head_size}/{k.head_size}/{v.head_size}")

    if per_head:  # the projections' bias Adds stay before the rotary; MHA gets no bias (module docstring)
        packed, separate_because = None, ("the heads are computed per head (a rotary embedding, or heads not "
                                          "split from a [batch, sequence, hidden] projection): "
                                          "MultiHeadAttention reads them as the graph computes them")
    else:
        packed, separate_because = _packed_projection(view, ev, (q, k, v), dtype, nodes, merged)
    biases = None if packed or per_head else _packable_biases(view, (q, k, v), dtype)
    if per_head:
        query, key, value = (q.projected or q.tensor), k.tensor, v.tensor
    elif packed is not None:
        nodes |= packed.nodes
        query = key = value = packed.input
    elif biases is not None:
        nodes |= {x.bias_add for x in (q, k, v)}
        query, key, value = (x.unbiased for x in (q, k, v))
    else:
        query, key, value = q.projected, k.projected, v.projected
    nodes = _absorb_shape_readers(view, nodes)
    padded = mask.tensor is not None
    hidden_rows = no_key_row if padded and mask.fill == -math.inf else None
    if padded and view.opset is None:
        raise Refused("the model imports no ONNX opset: the mask's ops cannot be written")
    if scale == 0.0:  # MHA reads scale 0 as "the default 1/√head_size"
        raise Refused("the scores are scaled by 0")
    scaling, guard_note = form_notes
    form = ", ".join(p for p in ("heads computed per head" if per_head else "", scaling,
                                 "Where(keep, Q·Kᵀ, fill)" if score_keep else "", mask.kind or "no mask",
                                 guard_note) if p)
    extra = {"packed": packed} if packed else {"separate_because": separate_because}
    return (PackedAttentionPlan if packed else AttentionPlan)(
        rule=RULE, form=f"attention ({form})", nodes=frozenset(nodes), outputs=(merged,),
        name_hint=name_hint,
        query=query, key=key, value=value, biases=biases,
        mask_kind=mask.kind, padding=mask.tensor,
        padding_is_bool=padded and view.dtype(mask.tensor) == T.BOOL, fill=mask.fill,
        hidden_rows=hidden_rows, causal=mask.causal and not padded, band=mask.band, num_heads=q.heads,
        scale=float(np.float32(scale)), dtype=dtype, opset=view.opset or 0,
        self_attention=q.seq == k.seq, flat_shape=flat_shape,
        query_heads=q.tensor if q.computed else None, kv_heads=per_head, broadcast_heads=broadcast_heads,
        key_shape=k.shape, key_from_bsnh=k.from_bsnh,
        additive_bias=mask.bias, bias_is_full=mask.bias is not None and mask.rank == 4 and mask.full,
        score_keep=score_keep.literal if score_keep else None, score_fill=score_keep.fill if score_keep else None,
        score_keep_rank=score_keep.rank if score_keep else 4, score_keep_rows=score_keep.rows if score_keep else 0,
        **extra)


def _packed_projection(view: GraphView, ev: Evaluator, heads, dtype: int, nodes: set,
                       merged: str) -> tuple[qkv.PackedQkv | None, str | None]:
    """Q, K and V as one projection for ``com.microsoft.Attention`` (qkv.py), or None and why not.

    Packing takes the projections into the block: one that something else also reads would leave the
    block open, so such an attention keeps its separate projections (and stays fused)."""
    try:
        packed = qkv.find(view, ev, tuple(h.projected for h in heads), tuple(h.heads * h.head_size for h in heads),
                          dtype)
    except qkv.NotPacked as why:
        return None, str(why)
    leak = view.escaping_intermediate(_absorb_shape_readers(view, nodes | packed.nodes), (merged,))
    if leak is not None and view.escaping_intermediate(_absorb_shape_readers(view, nodes), (merged,)) is None:
        out, reader = leak
        where = "is a graph output" if reader is None else f"is also read by {view.node_name(reader)}"
        return None, f"the projection '{out}' {where}"
    return packed, None


def _nan_guard(view: GraphView, probs: str, readers: list) -> tuple[tuple, str] | None:
    """``Where(IsNaN(P), 0, P)``: (its two nodes, its output), when those are P's only readers."""
    isnan = next((r for r in readers if is_op(view.nodes[r], "IsNaN")), None)
    where = next((r for r in readers if is_op(view.nodes[r], "Where")), None)
    if isnan is None or where is None:
        return None
    w = view.nodes[where]
    zero = view.scalar(w.input[1]) if len(w.input) == 3 else None
    if w.input[0] != view.nodes[isnan].output[0] or w.input[2] != probs or zero is None or zero[0] != 0.0:
        return None
    if view.single_consumer(view.nodes[isnan].output[0]) != where:
        return None
    return (isnan, where), w.output[0]


def _packable_biases(view: GraphView, heads, dtype: int) -> tuple | None:
    """The three bias constants, when all are stored constants of the attention's dtype read as stored
    (inline or external: packed side by side, ``Emitter.concatenation``); otherwise those Adds stay in front
    of the op."""
    names = []
    for h in heads:
        if h.bias_add is None or view.single_consumer(h.projected) is None:
            return None
        ref = view.constant_ref(h.bias)
        if ref is None or ref.converts or ref.data_type != dtype:
            return None
        names.append(h.bias)
    return tuple(names)


def _absorb_shape_readers(view: GraphView, nodes: set) -> set:
    """Add the shape-only nodes (``Shape(Kh)`` and the Slices/Concats of it: dynamo's Kᵀ reshapes) whose
    every reader is in the block: they read block tensors, and die with it."""
    nodes = set(nodes)
    changed = True
    while changed:
        changed = False
        produced = {o for i in nodes for o in view.nodes[i].output}
        for name in produced:
            for r in view.consumers_of(name):
                if r in nodes or view.nodes[r].op_type != "Shape":
                    continue
                closure = _shape_closure(view, r, nodes)
                if closure is not None:
                    nodes |= closure
                    changed = True
    return nodes


def _shape_closure(view: GraphView, start: int, block: set) -> set | None:
    """``start`` and its shape-op descendants, if all their outputs end up read only inside ``block``."""
    out, todo = set(), [start]
    while todo:
        i = todo.pop()
        if i in out:
            continue
        out.add(i)
        for o in view.nodes[i].output:
            if o in view.graph_outputs:
                return None
            for r in view.consumers_of(o):
                if r in block:
                    continue
                if view.nodes[r].op_type not in _SHAPE_OPS:
                    return None
                todo.append(r)
    return out

