"""Q, K and V as one projection: what ``com.microsoft.Attention`` reads in place of three.

An attention's query, key and value are three linear maps of one hidden state. ``com.microsoft.Attention``
takes that state X [B, S, D_in] with one weight [D_in, 3D] and one bias [3D] and runs a single GEMM for
all three, where ``MultiHeadAttention`` is fed three projections the graph computed itself (three GEMMs in
BERT, or GPT-2's one GEMM followed by a Split that ORT runs as its own kernel). The packed weight is what
ORT's own fusion writes (onnxruntime/python/tools/transformers/fusion_attention.py, ``create_attention_node``):
the three weights side by side, ``[Wq | Wk | Wv]``, and the biases likewise, so the GEMM's output row is
``[q | k | v]`` with heads in order inside each — ORT's BS3NH layout, which its kernels split into heads
themselves (adding the bias in the same pass).

The two forms the exporters write::

    Qp = MatMul(X, Wq) [+ bq], Kp = MatMul(X, Wk) [+ bk], Vp = MatMul(X, Wv) [+ bv]   BERT, ViT, CLIP
    Qp, Kp, Vp = Split(MatMul(X, W) [+ b], [D, D, D], axis=-1)                        GPT-2 (c_attn)
                 Split(Reshape(Gemm(Reshape(X, [-1, D_in]), W, b), [B, S, 3D]), ...)  GPT-2, dynamo

For the first the packed weight is a new constant, the three stored ones concatenated (nothing is
computed: every entry is one of theirs); a missing bias packs as zeros (adding 0 changes no value but the
sign of a zero). Weights stored as external data (the dynamo exporter's default) are joined while the model
is saved, one packed weight at a time (``Emitter.concatenation``): the rewrite never loads them. For the
second the graph's own ``W`` and ``b`` are already ``[Wq | Wk | Wv]`` and ``[bq | bk | bv]``: they are read
as they are, wherever they are stored.

Each projection is read by the Linear matcher every rule shares (:func:`~.linear_match.find_linear`); what
packing needs on top of it is checked here: a MatMul (or, for the split form, a Gemm that neither transposes
nor scales), a constant [D_in, d] weight of the attention's type, a constant [d] bias, and a product that the
bias Add alone reads.

Not packed (the attention is still fused, into ``MultiHeadAttention`` with the separate projections;
``inspect`` says why): projections of different tensors, a weight that is not a constant 2-D tensor of
the attention's type, a bias that is not a constant [D], a Split in another order or of other sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from .graph import ConstantRef, GraphView, attr, is_op
from .linear_match import find_linear
from .match import Refused
from .rule import dtype_name
from .symbolic import Dim, Evaluator, NotSymbolic

WHAT = ("query", "key", "value")


class NotPacked(Refused):
    """The projections cannot be packed into one GEMM; the message is the reason. The attention catches it
    and keeps the projections separate (``MultiHeadAttention``), saying why."""


@dataclass(frozen=True)
class PackedQkv:
    """The one projection ``com.microsoft.Attention`` computes: ``input`` X [B, S, D_in] times the weight
    [D_in, 3D] plus the bias [3D], replacing the projection ``nodes``.

    The weight and bias are either the graph's own tensors (``weight``/``bias``: GPT-2's c_attn) or three
    inline constants each, to be concatenated (``weights``/``biases``; a bias None packs as zeros)."""

    input: str
    nodes: frozenset[int]
    hidden: int  # D, the size of each of q, k and v
    weight: str | None = None
    bias: str | None = None
    weights: tuple[ConstantRef, ConstantRef, ConstantRef] | None = None
    biases: tuple[ConstantRef | None, ConstantRef | None, ConstantRef | None] | None = None
    form: str = ""  # "three MatMuls" | "one MatMul and a Split", for reports


def find(view: GraphView, ev: Evaluator, projected: tuple[str, str, str], hidden: tuple[int, int, int],
         dtype: int) -> PackedQkv:
    """The packed form of the projections ``projected`` (Qp, Kp, Vp [B, S, D] each), or ``NotPacked``."""
    if len(set(hidden)) != 1:
        raise NotPacked(f"the query, key and value have hidden sizes {'/'.join(map(str, hidden))}: "
                        "Attention packs three of one size")
    d = hidden[0]
    split = {view.producer.get(p) for p in projected}
    if len(split) == 1:
        i = split.pop()
        if i is not None and is_op(view.nodes[i], "Split"):
            return _from_split(view, ev, i, projected, d, dtype)
    return _from_three(view, ev, projected, d, dtype)


# --- BERT: three MatMuls -----------------------------------------------------------------------------
def _from_three(view: GraphView, ev: Evaluator, projected, d: int, dtype: int) -> PackedQkv:
    parts = [_linear(view, p, d, dtype, what) for p, what in zip(projected, WHAT)]
    sources = [p[0] for p in parts]
    x = _common_source(view, sources)
    if x is None:
        raise NotPacked(f"the query, key and value are projections of different tensors "
                        f"({', '.join(repr(s) for s in dict.fromkeys(sources))})")
    weights = tuple(p[1] for p in parts)
    biases = tuple(p[2] for p in parts)
    for what, w in zip(WHAT, weights):
        if w.converts:
            raise NotPacked(f"the {what} weight is read through a Cast from {dtype_name(w.tensor.data_type)}")
        if w.dims != weights[0].dims:
            raise NotPacked(f"the {what} weight is {list(w.dims)}, the query's {list(weights[0].dims)}")
    for what, b in zip(WHAT, biases):
        if b is not None and b.converts:
            raise NotPacked(f"the {what} bias is read through a Cast from {dtype_name(b.tensor.data_type)}")
    _check_rows(ev, x, projected[0])
    nodes = frozenset(i for p in parts for i in p[3])
    return PackedQkv(input=x, nodes=nodes, hidden=d, weights=weights, biases=biases, form="three MatMuls")


def _linear(view: GraphView, t: str, d: int, dtype: int,
            what: str) -> tuple[str, ConstantRef, ConstantRef | None, set]:
    """``t = MatMul(x, W) [+ b]`` with constants W [D_in, d] and b [d] of ``dtype``: (x, W, b, nodes)."""
    producer = view.producer_of(t)

    def not_projection() -> NotPacked:
        got = "a graph input" if producer is None else producer.op_type
        return NotPacked(f"the {what} projection comes from {got}, not MatMul(x, W) [+ b]")

    try:
        lin = find_linear(view, t, f"the {what} projection", bias_after=("MatMul",))
    except Refused:
        raise not_projection() from None
    node = view.nodes[lin.node]
    if lin.reshape is not None or lin.tensordot or not is_op(node, "MatMul"):
        raise not_projection()
    bias = None
    if lin.add is not None:
        ((c, _),) = lin.biases
        bias = view.constant_ref(c)
        if bias is None or bias.dims != (d,) or bias.data_type != dtype:
            raise NotPacked(f"the {what} projection's bias '{c}' is not a constant [{d}] of its type")
        if view.single_consumer(lin.output) != lin.add:
            raise NotPacked(f"the {what} projection '{lin.output}' is also read outside the attention")
    if len(node.input) != 2:
        raise not_projection()
    ref = view.constant_ref(lin.w)
    if ref is None:
        raise NotPacked(f"the {what} weight '{lin.w}' is not a constant")
    if len(ref.dims) != 2 or ref.dims[1] != d or ref.data_type != dtype:
        raise NotPacked(f"the {what} weight '{lin.w}' is not a 2-D [D_in, {d}] constant of the attention's type")
    return lin.x, ref, bias, set(lin.nodes)


def _common_source(view: GraphView, sources: list[str]) -> str | None:
    """The one tensor the three MatMuls read: the same name, or the same tensor through identical Casts
    (a float16 converter may give each MatMul its own): the first of those Casts' outputs."""
    if len(set(sources)) == 1:
        return sources[0]
    casts = [view.producer_of(s) for s in sources]
    if all(c is not None and is_op(c, "Cast") and len(c.input) == 1 for c in casts):
        if len({(c.input[0], attr(c, "to")) for c in casts}) == 1:
            return sources[0]
    return None


# --- GPT-2: one MatMul and a Split -------------------------------------------------------------------
def _from_split(view: GraphView, ev: Evaluator, i: int, projected, d: int, dtype: int) -> PackedQkv:
    split = view.nodes[i]
    if tuple(split.output) != tuple(projected):
        raise NotPacked("the Split's outputs are not read as query, key, value in that order")
    src = split.input[0]
    if ev.rank(src) != 3 or attr(split, "axis", 0) not in (2, -1):
        raise NotPacked("the Split is not along the last axis of a [batch, sequence, 3·hidden] projection")
    sizes = None
    if len(split.input) > 1 and split.input[1]:
        value = view.small_value(split.input[1])
        sizes = None if value is None else [int(s) for s in value.reshape(-1)]
        if sizes is None:
            raise NotPacked("the Split's sizes are not constant")
    elif attr(split, "split") is not None:
        sizes = list(attr(split, "split"))
    elif ev.dim(src, 2) == Dim(3 * d):
        sizes = [d, d, d]  # equal parts of a known 3D
    if sizes != [d, d, d]:
        raise NotPacked(f"the Split's sizes are {sizes}, not [{d}, {d}, {d}]")
    nodes = {i}
    x, weight, bias = _packed_linear(view, ev, src, 3 * d, dtype, nodes)
    _check_rows(ev, x, projected[0])
    return PackedQkv(input=x, nodes=frozenset(nodes), hidden=d, weight=weight, bias=bias,
                     form="one MatMul and a Split")


def _packed_linear(view: GraphView, ev: Evaluator, t: str, n: int, dtype: int,
                   nodes: set) -> tuple[str, str, str | None]:
    """``t`` [B, S, n] = X·W (+ b): ``MatMul(X, W) [+ b]`` or dynamo's ``Reshape(Gemm(Reshape(X, [-1, D_in]),
    W, b), [B, S, n])``: (X, W, b) as the graph reads them, adding the nodes to ``nodes``."""
    beneath = view.producer_of(t)  # the node making t, seen through the Reshape dynamo writes
    if beneath is not None and is_op(beneath, "Reshape"):
        beneath = view.producer_of(beneath.input[0])
    if beneath is not None and is_op(beneath, "Gemm") and len(beneath.input) >= 2 and _transposes_or_scales(beneath):
        raise NotPacked("the c_attn Gemm transposes or scales its operands")

    def not_projection(got: onnx.NodeProto | None) -> NotPacked:
        return NotPacked(f"the split projection comes from {'a graph input' if got is None else got.op_type}, "
                         "not MatMul(x, W) [+ b]")

    try:
        lin = find_linear(view, t, "the split projection", bias_after=("MatMul",), sole_reader=True)
    except Refused:
        raise not_projection(beneath) from None
    if lin.tensordot:  # an Add of a Reshape's output, not of a MatMul's
        raise not_projection(beneath)
    node = view.nodes[lin.node]
    if is_op(node, "MatMul") and len(node.input) != 2:
        raise not_projection(node)
    found = set(lin.nodes)
    x, w = lin.x, lin.w
    bias = lin.biases[0][0] if lin.biases else None  # the Add's b, or C (beta 1, checked above)
    ref = view.constant_ref(w)
    if ref is None:
        raise NotPacked(f"the packed weight '{w}' is not a constant")
    if len(ref.dims) != 2 or ref.dims[1] != n or view.dtype(w) != dtype:
        raise NotPacked(f"the packed weight '{w}' is not a 2-D [D_in, {n}] tensor of the attention's type")
    if bias is not None:
        b = view.constant_ref(bias)
        if b is None or b.dims != (n,) or view.dtype(bias) != dtype:
            raise NotPacked(f"the packed bias '{bias}' is not a constant [{n}] of the attention's type")
    if lin.reshape is not None or ev.rank(x) == 2:  # Conv1D as dynamo writes it: X flattened to [B·S, D_in]
        flat = view.producer_of(x)
        if flat is None or not is_op(flat, "Reshape") or ev.rank(flat.input[0]) != 3:
            raise NotPacked("the split projection's input is not a [batch, sequence, hidden] tensor flattened")
        try:
            target = ev.vec(flat.input[1]).items
        except NotSymbolic as e:
            raise NotPacked(f"the flattening of the split projection's input cannot be followed: {e}") from None
        if len(target) != 2 or target[1] != ev.dim(flat.input[0], 2):
            raise NotPacked(f"the split projection's input is flattened to {list(target)}, not [-1, hidden]")
        found.add(view.producer[x])
        x = flat.input[0]
    nodes |= found
    return x, w, bias


def _transposes_or_scales(gemm: onnx.NodeProto) -> bool:
    """The Gemm reads A or B transposed, or scales A·B or C: Attention reads the weight and bias as stored."""
    c = len(gemm.input) > 2 and gemm.input[2]
    return bool(attr(gemm, "transA", 0) or attr(gemm, "transB", 0) or attr(gemm, "alpha", 1.0) != 1.0
                or (c and attr(gemm, "beta", 1.0) != 1.0))


def _check_rows(ev: Evaluator, x: str, projected: str) -> None:
    """Attention reads X as [B, S, D_in] and writes [B, S, ·]: X's batch and sequence must be the
    projection's, proved (a flattened X, or one of another layout, is not the attention's)."""
    if ev.rank(x) != 3:
        raise NotPacked(f"the projections' input '{x}' is not known to be [batch, sequence, hidden]")
    for axis, what in ((0, "batch"), (1, "sequence")):
        if ev.dim(x, axis) != ev.dim(projected, axis):
            raise NotPacked(f"the projections' input '{x}' is not shown to have the attention's {what} "
                            f"({ev.dim(x, axis)} vs {ev.dim(projected, axis)})")
