"""The scores a Softmax normalises: which product Q·Kᵀ they are, its scale, the bias added to them, and a
``Where`` on the product itself.

Taken (:func:`find_scores`): the product ``MatMul(Q, Kᵀ)`` times scalar factors ``s``, either as it is or masked
on the product itself as ``Where(keep, Q·Kᵀ·s, fill)``, then optionally one bias added (``Add``, its operands
in either order). What the bias is (a mask the rule proves, or a tensor fed as it is) is ``masks``'s
question; what the Where's keep is, ``score_keep``'s.

Scale: sdpa splits it as ``√scale`` on Q and on Kᵀ (``Mul(Qh, c)``, ``Mul(Kᵀ, c)``), eager attention
divides or multiplies the scores; every such scalar counts, and MHA's ``scale`` is their product
(:func:`strip_scale`). A factor is a scalar constant; on Q or Kᵀ it may also be a scalar the graph computes
from constants and shape integers, where the exporter did not fold it (torch's sdpa with no scale given and a
head size unknown at export: ``1/√(Shape(q)[-1])``), evaluated in the tensor's element type as ONNX Runtime
computes it. A scale
applied after the bias is added scales the bias too, which MHA does not do: recorded here
(``post_scale``), refused by the rule.

Nodes whose output is their input (``graph.passes_value``: Identity, ONNX Runtime's device copies, a Cast to
the type the tensor has) are seen through on every step of that path; they join the block. A scalar factor
may also be an Expand of a scalar to a shape the product broadcasts to anyway (``Evaluator.expands_within``).

A Softmax of a product in another form gets a reason rather than silence, so that every attention left
unfused says why: the product masked by a Where and then scaled (which scales the fill), and scores that
reach the Softmax through ops no form takes — two additive terms (MPNet), a Reshape between the product and
its mask (DeBERTa), a soft cap ``c·tanh(s / c)`` (Gemma 2), a clamp ``max(scores, finfo.min)`` (XGLM), a head
axis squeezed out and put back around the mask (single-head exports), an Einsum instead of a MatMul.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..graph import GraphView, is_op, value_source
from ..rule import T
from ..symbolic import Evaluator, NotSymbolic


@dataclass
class Scores:
    matmul: int
    nodes: set
    scale: float
    bias: str | None  # the mask bias added to the scores
    post_scale: float = 1.0  # a factor applied after the bias is added: (Q·Kᵀ·s + bias)·post_scale
    keep: ScoreKeep | None = None  # Where(keep, Q·Kᵀ·s, fill) on the product itself (GPT-Neo)


@dataclass(frozen=True)
class ScoreKeep:
    """``Where(keep, Q·Kᵀ·s, fill)``: the product masked before any bias is added (GPT-Neo's own attention
    code, with a slice of its literal causal buffer)."""

    keep: str  # the boolean condition, as the graph computes it
    fill: float
    node: int  # the Where
    # proved by prove_score_keep: the literal the keep is sliced from, its rank and rows, the Slices
    literal: str = ""
    rank: int = 4
    rows: int = 0
    slices: frozenset = frozenset()


def _through(view: GraphView, t: str, nodes: set | None, ev: Evaluator | None = None) -> str:
    """``t`` read through the nodes that pass its value on (``graph.value_source``), which join ``nodes``."""
    src, via = value_source(view, t, ev.dtype if ev is not None else None)
    if nodes is not None:
        nodes.update(via)
    return src


def _score_where(view: GraphView, t: str) -> tuple[str, ScoreKeep | None]:
    """``t = Where(keep, x, fill)`` with a constant scalar fill: (x, the keep); else (t, None)."""
    i = view.producer.get(t)
    if i is None or not is_op(view.nodes[i], "Where") or len(view.nodes[i].input) != 3:
        return t, None
    w = view.nodes[i]
    fill = view.scalar(w.input[2])
    if fill is None or view.dtype(w.input[0]) != T.BOOL:
        return t, None
    return w.input[1], ScoreKeep(w.input[0], fill[0], i)


def _scalar_factor(view: GraphView, i: int, t: str, ev: Evaluator | None = None) -> tuple[str, float] | None:
    """``Mul(t', c)``/``Mul(c, t')``/``Div(t', c)`` producing ``t`` with a scalar constant: (t', factor). With
    ``ev``, ``c`` may also be a scalar the graph computes from shapes (_shape_scalar), or either one expanded
    to a shape the product broadcasts to anyway."""
    node = view.nodes[i]

    def value(name: str, other: str) -> float | None:
        s = view.scalar(name)
        if s is not None:
            return s[0]
        if ev is None:
            return None
        e = view.producer.get(name)
        rank = ev.rank(other)
        if e is not None and rank is not None and ev.expands_within(view.nodes[e], tuple(
                ev.dim(other, j) for j in range(rank))):
            return value(view.nodes[e].input[0], other)
        return _shape_scalar(view, ev, name)

    if is_op(node, "Mul") and len(node.input) == 2:
        for a, b in ((node.input[0], node.input[1]), (node.input[1], node.input[0])):
            s = value(b, a)
            if s is not None:
                return a, s
    if is_op(node, "Div") and len(node.input) == 2:
        s = value(node.input[1], node.input[0])
        if s is not None and s != 0.0:
            return node.input[0], 1.0 / s
    return None


# The ops of a scale the exporter computes from the query's shape (torch's sdpa with no scale given, where the
# head size is not a constant at export: 1/√(Shape(q)[-1]) and its square root on Q and on Kᵀ, Falcon), each
# evaluated in its tensor's element type as ONNX Runtime computes it (IEEE: the same bits).
_SCALAR_UNARY = {"Sqrt": np.sqrt, "Reciprocal": np.reciprocal, "Neg": np.negative}
_SCALAR_BINARY = {"Div": np.divide, "Mul": np.multiply, "Add": np.add, "Sub": np.subtract}
_SCALAR_FLOATS = {T.FLOAT: np.float32, T.FLOAT16: np.float16, T.DOUBLE: np.float64}


def _shape_scalar(view: GraphView, ev: Evaluator, name: str, depth: int = 0) -> float | None:
    """The value of a one-element tensor computed from constants and shape integers (proved by ``ev``), or
    None: what the scores' factor is when the exporter did not fold it."""
    if depth > 16:
        return None
    c = view.scalar(name)
    if c is not None:
        return c[0]
    dtype = ev.dtype(name)
    if dtype in (T.INT64, T.INT32):
        try:
            items = ev.vec(name).items
        except NotSymbolic:
            return None
        return float(items[0].coef) if len(items) == 1 and items[0].is_int else None
    i = view.producer.get(name)
    if i is None or dtype not in _SCALAR_FLOATS:
        return None
    node, np_type = view.nodes[i], _SCALAR_FLOATS[dtype]
    if node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type == "CastLike":  # the dynamo exporter's Cast to its second operand's type
        x = _shape_scalar(view, ev, node.input[0], depth + 1)
        return None if x is None else float(np_type(x))
    ins = [_shape_scalar(view, ev, x, depth + 1) for x in node.input]
    if any(x is None for x in ins):
        return None
    if node.op_type == "Cast" and len(ins) == 1:
        return float(np_type(ins[0]))
    if node.op_type in _SCALAR_UNARY and len(ins) == 1:
        return float(_SCALAR_UNARY[node.op_type](np_type(ins[0])))
    if node.op_type in _SCALAR_BINARY and len(ins) == 2:
        with np.errstate(all="ignore"):
            return float(_SCALAR_BINARY[node.op_type](np_type(ins[0]), np_type(ins[1])))
    return None


def strip_scale(view: GraphView, t: str, nodes: set, ev: Evaluator | None = None) -> tuple[str, float]:
    """``t`` without the scalar factors on it, and their product; the factors' nodes (and the value-passing
    nodes in front of each) join ``nodes``. Returns ``t`` itself, not what a value-passing node reads, where
    no factor is behind one: the caller reads the tensor the graph has there."""
    scale = 1.0
    while True:
        via: set = set()
        src = _through(view, t, via, ev)
        i = view.producer.get(src)
        if i is None:
            return t, scale
        f = _scalar_factor(view, i, src, ev)
        if f is None:
            return t, scale
        nodes |= via | {i}
        t, scale = f[0], scale * f[1]


def find_scores(view: GraphView, t: str, ev: Evaluator | None = None) -> Scores | None:
    """The scores feeding a Softmax: [mask Add ∘] scale ∘ MatMul, or None if there is no MatMul. ``ev`` gives
    the element types a Cast is compared with (else the view's)."""
    nodes: set = set()
    bias = None
    outer: set = set()
    added, post_scale = strip_scale(view, t, outer)
    added = _through(view, added, outer, ev)
    keep = None
    i = view.producer.get(added)
    if i is not None and is_op(view.nodes[i], "Add") and len(view.nodes[i].input) == 2:
        operands = view.nodes[i].input
        for a, b in ((operands[0], operands[1]), (operands[1], operands[0])):
            via: set = set()
            unmasked, keep = _score_where(view, _through(view, a, via, ev))
            inner, _ = strip_scale(view, unmasked, set())
            j = view.producer.get(_through(view, inner, None, ev))
            if j is not None and is_op(view.nodes[j], "MatMul"):
                nodes |= outer | via | {i}
                t, bias = unmasked, b
                break
        else:
            return None
    else:
        post_scale = 1.0  # no bias: the factors are the scores' own, taken below
        t = _through(view, t, nodes, ev)
        unmasked, keep = _score_where(view, t)
        if keep is not None:
            t = unmasked
    if keep is not None:
        nodes.add(keep.node)
    t, scale = strip_scale(view, t, nodes)
    t = _through(view, t, nodes, ev)
    j = view.producer.get(t)
    if j is None or not is_op(view.nodes[j], "MatMul"):
        return None
    nodes.add(j)
    return Scores(j, nodes, scale, bias, post_scale, keep)


def scores_masked_by_where(view: GraphView, t: str) -> str | None:
    """Why a Softmax of ``Where(keep, Q·Kᵀ, fill)`` scaled after the Where (plus a bias or not) is not taken,
    or None for any other Softmax. The form taken (:func:`_score_where`) scales the product inside the
    Where, as GPT-Neo does (it does not scale at all); scaled after it, the fill is scaled too."""
    added, _ = strip_scale(view, t, set())
    i = view.producer.get(added)
    terms = [added]
    if i is not None and is_op(view.nodes[i], "Add") and len(view.nodes[i].input) == 2:
        terms = list(view.nodes[i].input)
    for term in terms:
        j = view.producer.get(strip_scale(view, term, set())[0])
        if j is None or not is_op(view.nodes[j], "Where") or len(view.nodes[j].input) != 3:
            continue
        inner = view.producer.get(strip_scale(view, view.nodes[j].input[1], set())[0])
        if inner is not None and is_op(view.nodes[inner], "MatMul"):
            return ("the scores are masked as Where(keep, Q·Kᵀ, fill) and then scaled, which scales the fill: "
                    "not taken (the product scaled inside the Where is)")
    return None


# Ops a product's scores may pass on their way to the Softmax, in forms the rule does not take (two additive terms,
# a Reshape between the product and its mask): followed to say why such a Softmax stays.
_SCORE_PATH_OPS = {"Add": (0, 1), "Sub": (0, 1), "Mul": (0, 1), "Div": (0,), "Where": (1, 2), "Reshape": (0,),
                   "Cast": (0,), "Transpose": (0,), "Expand": (0,),
                   "Tanh": (0,),  # Gemma 2's soft cap, c·tanh(s / c)
                   "Max": (0, 1), "Min": (0, 1),  # XGLM's clamp, max(scores, finfo.min)
                   "Identity": (0,), "MemcpyFromHost": (0,), "MemcpyToHost": (0,),
                   # layouts no form takes: a head axis squeezed out of the product and put back for the mask, a
                   # slice or concatenation of scores, clipped scores
                   "Unsqueeze": (0,), "Squeeze": (0,), "Flatten": (0,), "Slice": (0,), "Concat": None,
                   "Neg": (0,), "Clip": (0,)}
# Products other than a MatMul that a path may end at (its operands two computed tensors).
_OTHER_PRODUCTS = ("Einsum",)


def scores_in_another_form(view: GraphView, t: str, depth: int = 8) -> str | None:
    """Why a Softmax whose input is a MatMul's output through a few elementwise or layout ops, in a form
    :func:`find_scores` does not take, stays (MPNet: two additive terms; DeBERTa: a Reshape between the product and
    its mask), or None where no MatMul is that near (some other Softmax): every attention left gets a reason."""
    def path_to_product(name: str, left: int) -> list[str] | None:
        i = view.producer.get(name)
        if i is None or left < 0:
            return None
        node = view.nodes[i]
        if is_op(node, "MatMul"):
            return []
        if node.domain not in ("", "ai.onnx"):
            return None
        if node.op_type in _OTHER_PRODUCTS and len(node.input) == 2 and \
                not any(view.constant_ref(x) is not None for x in node.input):
            return [node.op_type]
        if node.op_type not in _SCORE_PATH_OPS:
            return None
        slots = _SCORE_PATH_OPS[node.op_type]
        for k in range(len(node.input)) if slots is None else slots:
            if k < len(node.input) and node.input[k]:
                rest = path_to_product(node.input[k], left - 1)
                if rest is not None:
                    return [node.op_type] + rest
        return None

    path = path_to_product(t, depth)
    if not path:
        return None
    if path[-1] in _OTHER_PRODUCTS:
        through = f" through {' ← '.join(path[:-1])}" if path[:-1] else ""
        return (f"the scores reach the Softmax from an {path[-1]} of two computed tensors{through}: not a form taken "
                "(the product is a MatMul of the query and the transposed key)")
    if "Tanh" in path:
        return (f"the scores reach the Softmax from their MatMul through {' ← '.join(path)}: soft-capped "
                "(c·tanh(s / c), Gemma 2's attn_logit_softcapping), which MultiHeadAttention does not do; not a "
                "form taken")
    return (f"the scores reach the Softmax from their MatMul through {' ← '.join(path)}: not a form taken (one "
            "additive bias or mask, scales, and a Where on the scaled product are)")
