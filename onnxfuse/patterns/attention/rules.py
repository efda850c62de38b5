"""The Softmax-anchored rule: self-attention as the exporters write it, Softmax(scores)·V, into one fused op.

From the Softmax, the rule reads the scores (``scores``), the query and key heads behind the product and the
value heads behind P·V (``heads``), the mask (``masks``, ``score_keep``), the row guard after the Softmax and
the head merge after P·V; ``assemble`` turns those into the plan.

The row guard: sdpa's math path writes ``Where(IsNaN(P), 0, P)`` after the Softmax: it turns rows with no
visible key (−inf everywhere: NaN) into zeros. The block takes it in and the plan writes what it computes
(``masks``: why that is exact).

Between the Softmax and P·V the probabilities may pass nodes that keep their value (Identity, ORT's device
copies, Casts to the type they have: GPT-Neo's ``attn_weights.to(value.dtype)``, LLaMA-class eager attention's
two). The softmax upcast of transformers' eager attention — ``softmax(scores, dtype=float32).to(query.dtype)``:
``Cast(float32)`` of float16 scores, the Softmax in float32, ``Cast(float16)`` of P before P·V — is taken too:
the upcast is exact, and MultiHeadAttention computes its softmax in float32 and rounds P to float16 before P·V,
on ORT's CPU kernel (``tests/test_patterns_attention_seethrough.py`` checks it bit for bit) as in its CUDA
kernels (flash and memory-efficient attention keep P in float16 for their second product; the unfused path
writes the softmax's output in float16), so the fused op rounds where the graph's Casts do. Its scores stay
in float32 where the graph rounds them to float16 after the product, the scale and the mask: the difference
every float16 attention the rule fuses has. Any other cast on that path (scores rounded before the Softmax, P
rounded to another type, upcast to float64) is refused with its reason.

Refused, with the reason shown by ``inspect``: probabilities read anywhere else (``output_attentions``),
Softmax over another axis, a bias that is neither a proved padding/causal mask nor a finite tensor of the
scores' type and shape (``-inf`` fills of masks it cannot prove, such as an anti-causal compare; a bias of
another type or one that broadcasts the scores up), scores scaled
after the bias is added, a query/key that reaches the product through other ops without proved [B, N, S, H]
dimensions (``heads``), key and value heads of different sizes, inconsistent head counts.
"""

from __future__ import annotations

import math

from ..graph import GraphView, attr, exact_cast, is_op, passes_value, value_source
from ..match import Refused
from ..rule import Refusal, T, dtype_name
from ..symbolic import Evaluator
from . import masks
from .assemble import attention_dtype, finish, unless_escaping
from .heads import key_transposed, merge_heads, read_heads, value_hidden
from .plan import MS_DOMAIN, RULE, AttentionPlan
from .score_keep import prove_score_keep
from .scores import Scores, find_scores, scores_in_another_form, scores_masked_by_where, strip_scale


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
        ev = Evaluator(view)
        scores, upcast = None, _cast_in_front(view, ev, node.input[0])
        if upcast is not None:  # Softmax(Cast(scores)): the product behind the Cast
            scores = find_scores(view, view.nodes[upcast[0]].input[0], ev)
            if scores is not None:
                scores.nodes |= {upcast[0], *upcast[1]}
            else:
                upcast = None
        if scores is None:
            scores = find_scores(view, node.input[0], ev)
        if scores is None:
            why = scores_masked_by_where(view, node.input[0]) or scores_in_another_form(view, node.input[0])
            # not fed by a product: some other Softmax, unless it is one whose scores come in a form not taken
            return Refusal(RULE, why, (view.node_name(i),)) if why else None
        try:
            plan = _plan(view, ev, i, scores, upcast[0] if upcast else None)
        except Refused as why:
            return why.as_refusal(RULE, (view.node_name(i),))
        return unless_escaping(view, i, plan)


def _cast_in_front(view: GraphView, ev: Evaluator, t: str) -> tuple[int, tuple] | None:
    """The Cast (not to the type it has) that makes the Softmax's input ``t`` (through nodes that pass values
    on), and those nodes: (its index, theirs); None where there is none."""
    src, via = value_source(view, t, ev.dtype)
    i = view.producer.get(src)
    if i is None or not is_op(view.nodes[i], "Cast") or len(view.nodes[i].input) != 1:
        return None
    return i, via


def _plan(view: GraphView, ev: Evaluator, softmax: int, sc: Scores, upcast: int | None) -> AttentionPlan:
    node = view.nodes[softmax]
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

    dtype = attention_dtype(ev, q, k)
    softmax_dtype = _softmax_dtype(view, ev, upcast, dtype)
    mask = masks.classify(view, ev, sc.bias, q, k, dtype) if sc.bias is not None else masks.NO_MASK
    score_keep = None if sc.keep is None else prove_score_keep(view, ev, sc.keep, q, k, dtype, mask)
    if score_keep is not None and all(r in nodes | score_keep.slices for i in score_keep.slices
                                      for o in view.nodes[i].output for r in view.consumers_of(o)):
        # the block's own slices go with it (the keep is sliced again: mask_inputs.score_keep_bias), so the
        # shape arithmetic over the heads they may read dies with it; slices another layer also reads (the
        # dynamo exporter shares one between layers of the same buffer) stay, and die once no layer reads them
        nodes |= score_keep.slices
    # The mask adds without broadcasting the scores up (checked by masks.classify), so the probabilities
    # have the product's dimensions: recorded, so the head merge's reshapes can be checked against them.
    probs, guarded = node.output[0], False
    dims = tuple(ev.dim(qk.output[0], j) for j in range(4))
    ev.seed(probs, dims)
    if probs in view.graph_outputs:
        raise Refused("the attention probabilities are a graph output (output_attentions)")
    casts = _ProbabilityCasts(view, ev, softmax_dtype, dtype, nodes, dims)
    probs = casts.follow(probs)
    readers = view.consumers_of(probs)
    if len(readers) == 2:
        guard = _nan_guard(view, probs, readers)
        if guard is None:
            raise Refused("the attention probabilities are read outside the attention (output_attentions?)")
        nodes |= set(guard[0])
        probs, guarded = guard[1], True
        ev.seed(probs, dims)
    probs = casts.follow(probs)
    casts.check()
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
    notes = ", ".join(n for n in ("softmax in float32" if softmax_dtype != dtype else "",
                                  "IsNaN guard" if guarded else "") if n)
    return finish(view, ev, nodes, q, k, v, dtype, mask, merged, flat_shape, scale, (scaling, notes), no_key_row,
                   view.nodes[softmax].name or f"attention_{softmax}", score_keep)


def _softmax_dtype(view: GraphView, ev: Evaluator, upcast: int | None, dtype: int) -> int:
    """The type the Softmax computes in: the attention's own, or float32 where float16 scores are upcast for it
    (``upcast``: the Cast in front of the Softmax). Refused: any other cast of the scores there."""
    if upcast is None:
        return dtype
    cast = view.nodes[upcast]
    src, to = ev.dtype(cast.input[0]), attr(cast, "to")
    if src == dtype == T.FLOAT16 and to == T.FLOAT:
        return T.FLOAT
    raise Refused(f"the scores are cast from {dtype_name(src)} to {dtype_name(to)} for the Softmax: "
                  f"MultiHeadAttention computes the softmax of {dtype_name(dtype)} scores in float32 (taken: float16 "
                  "scores upcast to float32)")


class _ProbabilityCasts:
    """The nodes between the Softmax and P·V that keep the probabilities' values or round them to the
    attention's type (module docstring): followed one sole reader at a time into the block; :meth:`check`
    refuses where the probabilities reach P·V other than rounded once to the attention's type from a float32
    softmax, or not rounded at all from a softmax in the attention's type."""

    def __init__(self, view: GraphView, ev: Evaluator, softmax_dtype: int, dtype: int, nodes: set, dims: tuple):
        self.view, self.ev, self.nodes, self.dims = view, ev, nodes, dims
        self.softmax_dtype, self.dtype = softmax_dtype, dtype
        self.type = softmax_dtype  # what the probabilities are now
        self.held = softmax_dtype  # the narrowest type their values are known to be exact in
        self.rounded: list[int] = []  # the types they were rounded to

    def follow(self, probs: str) -> str:
        view = self.view
        while True:
            r = view.single_consumer(probs)
            node = view.nodes[r] if r is not None else None
            cast = node is not None and is_op(node, "Cast") and len(node.input) == 1 and attr(node, "to") is not None
            if node is None or not (cast or passes_value(node, self.ev.dtype)):
                return probs
            if cast:
                to = attr(node, "to")
                if not exact_cast(self.held, to):
                    self.rounded.append(to)
                    self.held = to
                self.type = to
            self.nodes.add(r)
            probs = node.output[0]
            self.ev.seed(probs, self.dims)

    def check(self) -> None:
        if self.type != self.dtype:
            raise Refused(f"the attention probabilities reach P·V as {dtype_name(self.type)}, the attention is "
                          f"{dtype_name(self.dtype)}")
        if self.softmax_dtype == self.dtype:
            if self.rounded:
                raise Refused(f"the attention probabilities are rounded to {dtype_name(self.rounded[0])} before P·V: "
                              "MultiHeadAttention keeps them in the attention's type")
            return
        if self.rounded != [self.dtype]:
            what = " then ".join(dtype_name(t) for t in self.rounded) or "nothing"
            raise Refused(f"the float32 softmax's probabilities are rounded to {what} before P·V: MultiHeadAttention "
                          f"rounds them once, to {dtype_name(self.dtype)}")


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
