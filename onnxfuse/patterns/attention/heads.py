"""The heads each product reads: Q, K and V split into heads, the key transposed, and the heads merged back.

Every form here is proved from dimensions. ONNX shape inference stops at ORT's contrib ops
(SkipLayerNormalization, and LayerNormalization below opset 17): the projections' dimensions and element
type are then carried forward by ``symbolic.Evaluator`` from the graph inputs through the ops that keep them
(normalisations, Casts, MatMul with a 2-D weight, bias Adds, Split with constant sizes); where that chain
breaks the head split cannot be proved: refused.

Projections and head split (every model)::

    Qp = MatMul(X, Wq) [+ bq]                        [B, S, D]     (GPT-2: one c_attn, then Split)
    Qh = Transpose(Reshape(Qp, [B, S, N, H]), 0213)  [B, N, S, H]   same for K and V

The Reshape target is read symbolically (``symbolic.Evaluator``): TorchScript builds it from
``Shape(hidden)`` Gathers, dynamo from ``Shape(input_ids)`` slices; B and S must be the projection's own
dimensions (same int or inferred symbol), N·H its last one.

Kᵀ: TorchScript ``Transpose(Reshape(Kp), 0231)``; dynamo ``Reshape(Transpose(Reshape(Kh, [-1, S, H]),
021), [B, N, H, S])``, shown to be ``Transpose(Kh, 0132)`` by reading both targets from ``Shape(Kh)``;
or ``Transpose(Kh, 0132)`` itself. A static dynamo export (constant shapes) folds repeat_kv's Reshape to
[B, N, L, H] into the first of those, which then reads the 5-D Expand [B, N_kv, n_rep, L, H] with a
constant target [B·N, L, H]: the targets' dimensions show the second Reshape splits only the leading axis,
so Kᵀ is ``Transpose(Reshape(X, [B, N, L, H]), 0132)``, and that Reshape (repeat_kv's own) is made again in
front of the op, which reads it as the key heads (``_folded_key_heads``).

Heads computed per head (GPT-NeoX, LLaMA, Phi: a rotary position embedding between the head split and
the scores; NeoX's partial rotary concatenates rotated and passed-through halves; NeoX also slices q, k
and v from one [B, N, S, 3H] split)::

    Q4 = f(Qh, cos, sin)   [B, N, S, H]    K4 likewise (Kᵀ = Transpose(K4, 0132) or dynamo's reshapes)

Heads split from something other than a [B, S, D] projection are taken the same way: GPTBigCode unsqueezes
its c_attn output to [B, 1, S, D + 2H] and splits that, so its query heads are a head split of a 4-D tensor
and its one key/value head is [B, 1, L, H] as split. GPT-J and CodeGen rotate the split [B, S, N, H] before
transposing the heads, so Kᵀ is ``Transpose(K4', 0231)`` of a computed [B, L, N, H] tensor: MHA reads
``Transpose(K4', 0213)``, made in front of it.

Nothing about ``f`` is proved or rewritten: it stays in the graph, and the op reads its results — the
query merged back into [B, S, N·H] in front of it (Transpose 0213, Reshape [0, 0, -1]: what MHA splits
into heads again), key and value as MHA's 4-D [B, N, L, H] inputs, the value's heads as the product reads
them (a plain split's Transpose output, where only Q and K are rotated). Exact for any ``f``: the graph
computes softmax(scale·Q4·K4ᵀ + mask)·V4 from those tensors, and so does MHA. What is proved is their
dimensions (``symbolic``): Q4 [B, N, S, ·] with N an int (num_heads), K4 and V4 [B, N, L, ·] with the
query's B and N (MHA broadcasts no batch or head, where the graph's MatMuls would), one L, and one head
size for K4 and V4 (ORT 1.31's CPU kernel refuses key and value of different shapes, measured); the
query's and key's head sizes are contracted by the graph's own product. The mask proofs read B, S and L
from these dimensions. The projections' bias Adds stay where they are, before the rotary (which would turn
a bias into a term that depends on the position), and nothing goes into MHA's ``bias`` — with a 4-D key
ORT 1.31's CPU kernel adds only its query third (measured); Q, K and V are not packed. Grouped key/value
heads repeated to the query's count (repeat_kv: Unsqueeze, Expand, Reshape from the heads' shape) are [B,
N, L, H] heads like any other; one key/value head the products broadcast over the query's (Falcon's multi-query
attention: [B, 1, L, H]) is expanded to the query's N in front of MHA, which broadcasts none; other
unrepeated ones (1 < N_kv < N: the graph's MatMul would not broadcast them) are refused. A present
key or value returned as a graph output (a cache) is such a tensor, computed in front of the op: it does
not keep the attention from being fused.

Nodes that pass a value on unchanged (``graph.passes_value``: Identity, ORT's device copies, a Cast to the type
the tensor has — GPT-Neo's ``query.to(float32)``; in front of the product also an Expand to the heads' own
dimensions) are seen through between every two steps of these forms and join the block. Where heads are read as
computed, MHA reads them behind Identities and such Casts but at a device copy's output: the heads on the device
the product read them on.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..graph import GraphView, attr, is_device_copy, is_op, passes_value, value_source
from ..match import Refused, parent_path
from ..symbolic import Dim, Evaluator, NotSymbolic


@dataclass
class Heads:
    projected: str | None  # [B, S, D]: what MHA reads (None for heads the graph computes per head)
    heads: int
    head_size: int  # 0 where it is not known as an int (heads computed per head)
    batch: Dim
    seq: Dim
    bias_add: int | None = None  # Add(MatMul(X, W), b) producing `projected`, b an inline [D] constant
    unbiased: str | None = None
    bias: str | None = None
    tensor: str | None = None  # the heads [B, N, S, H] as the product reads them (None: split straight into Kᵀ)
    computed: bool = False  # `tensor` is computed from the split heads (a rotary embedding): MHA reads it
    split_nodes: frozenset = frozenset()  # the head split's Reshape and Transpose
    shape: tuple = ()  # ints [B, N, L, H]: the heads are Reshape(tensor, shape), made in front of MHA
    from_bsnh: bool = False  # `tensor` is [B, L, N, H]: the heads are Transpose(tensor, 0213), made in front of MHA

    @property
    def typed(self) -> str:
        """The tensor whose element type is the heads'."""
        return self.tensor if self.computed else self.projected


class _NotSplit(Refused):
    """The heads do not come straight from a head split Transpose(Reshape(·)); the message is the reason."""


def read_heads(view: GraphView, ev: Evaluator, t: str, nodes: set, what: str) -> Heads:
    """The heads ``t`` [B, N, S, H] that reach a product: a head split of a projection (which MHA reads
    as [B, S, D] and splits itself), or else any tensor of proved [B, N, S, ·] dimensions, which the graph
    computes from the heads itself (a rotary embedding): MHA then reads that tensor as it is."""
    src, via = value_source(view, t, ev.dtype, lambda n: ev.expands_within(n, _dims(ev, n.input[0])))
    try:
        heads = _split_heads(view, ev, src, (0, 2, 1, 3), nodes, what)
    except _NotSplit as why:
        t, passed = _up_to_device_copy(view, t, via)
        nodes.update(passed)
        return _computed_heads(ev, t, str(why))
    nodes.update(via)  # GPT-Neo's query.to(float32) of float32 heads: a Cast to the type they have
    return heads


def _dims(ev: Evaluator, t: str) -> tuple:
    """``t``'s dimensions (none where its rank is unknown): an Expand to them changes nothing."""
    rank = ev.rank(t)
    return () if rank is None else tuple(ev.dim(t, a) for a in range(rank))


def _up_to_device_copy(view: GraphView, t: str, via: tuple) -> tuple[str, list]:
    """Heads MHA reads as they are: ``t`` read behind the nodes of ``via`` (``graph.value_source``'s, nearest
    first) that compute nothing (Identity, a Cast to the type it has: they go with the block), up to a device
    copy, whose output MHA reads (the heads on the device the product read them on). Returns (the tensor, the
    nodes passed)."""
    passed = []
    for i in via:
        if is_device_copy(view.nodes[i]):
            break
        passed.append(i)
        t = view.nodes[i].input[0]
    return t, passed


def _computed_heads(ev: Evaluator, t: str, not_split: str, from_bsnh: bool = False) -> Heads:
    """Heads the graph computes between the split and the product (rotary embeddings: Slices, Concats,
    Muls and Adds of the split heads with position tables), taken as they are: nothing about that
    computation is proved but its result's dimensions, from ``symbolic`` — [B, N, S, H] with N an int.

    ``from_bsnh``: ``t`` is [B, S, N, H], computed from the split before the heads are transposed (GPT-J's and
    CodeGen's rotary: ``apply_rotary_pos_emb`` on [B, S, N, H], then ``permute(0, 2, 1, 3)``, which the exporter
    merges with the key's ``transpose(-1, -2)`` into Kᵀ = Transpose(t, 0231)); MHA reads Transpose(t, 0213),
    made in front of it."""
    if ev.rank(t) != 4:
        raise Refused(f"{not_split}; as heads computed per head, '{t}' is not known to be 4-D")
    b, n, s, h = (ev.dim(t, a) for a in ((0, 2, 1, 3) if from_bsnh else (0, 1, 2, 3)))
    if not n.is_int or n.coef <= 0:
        raise Refused(f"{not_split}; as heads computed per head, '{t}' has {n} heads, not a known count")
    return Heads(None, n.coef, h.coef if h.is_int else 0, b, s, tensor=t, computed=True, from_bsnh=from_bsnh)


def _split_heads(view: GraphView, ev: Evaluator, t: str, perm: tuple, nodes: set, what: str) -> Heads:
    """``t = Transpose(Reshape(Xp, [B, S, N, H]), perm)`` with Xp's own B and S: the heads of Xp."""
    ti = view.producer.get(t)
    if ti is not None and view.nodes[ti].op_type in ("Mul", "Div"):
        raise Refused(f"the {what} is scaled by a factor computed at run time, not a constant")
    if ti is None or not is_op(view.nodes[ti], "Transpose") or tuple(attr(view.nodes[ti], "perm", ())) != perm:
        got = "a graph input" if ti is None else view.nodes[ti].op_type
        raise _NotSplit(f"the {what} reaches the attention product through {got}, not the head split "
                        f"Transpose(Reshape(·), {list(perm)}) (rotary embedding or another layout)")
    reshaped, between = value_source(view, view.nodes[ti].input[0], ev.dtype)
    ri = view.producer.get(reshaped)
    if ri is None or not is_op(view.nodes[ri], "Reshape"):
        raise _NotSplit(f"the {what} heads are not a Reshape of a projection")
    xp = view.nodes[ri].input[0]
    if ev.rank(xp) != 3 or not ev.dim(xp, 2).is_int:
        raise _NotSplit(f"the {what} projection '{xp}' is not known to be [batch, sequence, hidden]")
    hidden = ev.dim(xp, 2).coef
    try:
        target = ev.vec(view.nodes[ri].input[1]).items
    except NotSymbolic as e:
        raise Refused(f"the {what} head split's shape cannot be followed: {e}") from None
    allow_zero = not attr(view.nodes[ri], "allowzero", 0)
    if len(target) != 4:
        raise Refused(f"the {what} head split {list(target)} is not 4-D")
    n, h = target[2], target[3]
    # position j keeps dimension j of Xp: the same int or symbol, or 0 ("copy", unless allowzero)
    kept = [target[j] == ev.dim(xp, j) or (allow_zero and target[j] == Dim(0)) for j in (0, 1)]
    # one entry among batch/sequence that is -1, or a symbol of its own (dynamo's min(max_positions, S)), is
    # the other's complement when heads × head_size is the hidden size: the element count forces it
    implied = sorted(kept) == [False, True] and _forced(target[kept.index(False)]) and \
        n.is_int and h.is_int and n.coef * h.coef == hidden
    if not (all(kept) or implied):
        raise Refused(f"the {what} head split {list(target)} does not keep the projection's batch and sequence")
    if n == Dim(-1) and h.is_int and h.coef > 0 and hidden % h.coef == 0:
        n = Dim(hidden // h.coef)
    elif h == Dim(-1) and n.is_int and n.coef > 0 and hidden % n.coef == 0:
        h = Dim(hidden // n.coef)
    if not (n.is_int and h.is_int and n.coef * h.coef == hidden and n.coef > 0):
        raise Refused(f"the {what} head split {list(target)} is not [B, S, heads, head_size] of {hidden}")
    nodes |= {ti, ri, *between}
    heads = Heads(xp, n.coef, h.coef, ev.dim(xp, 0), ev.dim(xp, 1), tensor=t if perm == (0, 2, 1, 3) else None,
                   split_nodes=frozenset({ti, ri, *between}))
    return _with_bias_add(view, heads, xp, hidden)


def _with_bias_add(view: GraphView, heads: Heads, xp: str, hidden: int) -> Heads:
    """``heads`` with the projection's bias Add recorded, where ``xp = Add(MatMul(X, W), b)`` with b an
    inline [hidden] constant."""
    ai = view.producer.get(xp)
    if ai is not None and is_op(view.nodes[ai], "Add") and len(view.nodes[ai].input) == 2:
        operands = view.nodes[ai].input
        for a, b in ((operands[0], operands[1]), (operands[1], operands[0])):
            mi = view.producer.get(a)
            bt = view.constant(b)
            if mi is not None and is_op(view.nodes[mi], "MatMul") and bt is not None and list(bt.dims) == [hidden]:
                heads.bias_add, heads.unbiased, heads.bias = ai, a, b
                break
    return heads


def projection_heads(view: GraphView, ev: Evaluator, t: str, heads: int, what: str) -> Heads:
    """A 3-D [B, S, N·H] input of ONNX Attention: the projection itself, as MultiHeadAttention reads it."""
    if not ev.dim(t, 2).is_int or ev.dim(t, 2).coef % heads:
        raise Refused(f"the {what} '{t}' is not known to be [batch, sequence, {heads} × head_size]")
    hidden = ev.dim(t, 2).coef
    return _with_bias_add(view, Heads(t, heads, hidden // heads, ev.dim(t, 0), ev.dim(t, 1)), t, hidden)


def key_transposed(view: GraphView, ev: Evaluator, t: str, nodes: set) -> Heads:
    """Kᵀ [B, N, H, L] in one of the three layouts the exporters write (module docstring)."""
    t, via = value_source(view, t, ev.dtype)
    k = _key_transposed(view, ev, t, nodes)
    nodes.update(via)  # the key is read behind its transpose: what passes Kᵀ on goes with the block
    return k


def _key_transposed(view: GraphView, ev: Evaluator, t: str, nodes: set) -> Heads:
    ti = view.producer.get(t)
    node = view.nodes[ti] if ti is not None else None
    if node is not None and is_op(node, "Transpose"):
        perm = tuple(attr(node, "perm", ()))
        if perm == (0, 2, 3, 1):
            try:
                return _split_heads(view, ev, t, perm, nodes, "key")
            except _NotSplit as why:
                k = _computed_heads(ev, node.input[0], str(why), from_bsnh=True)
                nodes.add(ti)
                return k
        if perm == (0, 1, 3, 2):
            k = read_heads(view, ev, node.input[0], nodes, "key")
            nodes.add(ti)
            return k
    # dynamo: Reshape(Transpose(Reshape(Kh, [-1, L, H]), 021), [B, N, H, L])
    path = parent_path(view, t, ["Reshape", "Transpose", "Reshape"], [0, 0])
    if path is not None and tuple(attr(view.nodes[path[1]], "perm", ())) == (0, 2, 1):
        split_node, merge_node = view.nodes[path[0]], view.nodes[path[2]]
        kh = merge_node.input[0]
        try:
            merge = ev.vec(merge_node.input[1]).items
            split = ev.vec(split_node.input[1]).items
        except NotSymbolic as e:
            raise Refused(f"the key transpose's shapes cannot be followed: {e}") from None
        d = [ev.dim(kh, a) for a in range(4)] if ev.rank(kh) == 4 else None
        if d is not None and merge == (Dim(-1), d[2], d[3]) and split == (d[0], d[1], d[3], d[2]):
            k = read_heads(view, ev, kh, nodes, "key")
            nodes |= set(path)
            return k
        k = _folded_key_heads(view, ev, merge_node, split, nodes)
        if k is not None:
            nodes |= set(path)
            return k
        raise Refused(f"the key is reshaped {list(merge)} → transposed → {list(split)}: not shown to be Kᵀ")
    got = "a graph input" if node is None else node.op_type
    raise Refused(f"the key reaches the attention product through {got}, not Kᵀ: a transposed head split "
                  "or transposed [batch, heads, length, head_size] heads (another layout)")


def _folded_key_heads(view: GraphView, ev: Evaluator, merge, split: tuple, nodes: set) -> Heads | None:
    """Kᵀ = Reshape(Transpose(Y, 021), split) with Y = ``merge``'s output, its target not the [-1, L, H] of
    Shape(its input) that ``key_transposed`` reads: a static dynamo export, whose optimizer folds repeat_kv's
    Reshape to [B, N, L, H] into sdpa's to [B·N, L, H], so that ``merge`` reads the 5-D Expand
    [B, N_kv, n_rep, L, H] and its target is a constant ([8, 16, 16]).

    Y is [M, L, H]; with ``split`` read literally (no 0 or -1) as [B, N, H, L], B·N = M, H and L Y's last two
    (proved, ``symbolic``), the split divides only Y's leading axis, which the Transpose leaves in place:
    element [b, n, h, l] is Y[b·N + n, l, h], so Kᵀ = Transpose(Reshape(Y, [B, N, L, H]), 0132), and that
    Reshape of Y is the same Reshape of ``merge``'s input X (both read X's elements in order). MHA reads those
    heads: X itself where it already is [B, N, L, H], else Reshape(X, [B, N, L, H]) made in front of the op —
    the graph's own repeat_kv, which needs the target as ints. Nothing about X is proved or assumed beyond
    that (its values are computed heads as any other, ``_computed_heads``). None where this is not shown."""
    y, x = merge.output[0], merge.input[0]
    if ev.rank(y) != 3 or len(split) != 4 or any(d.is_int and d.coef <= 0 for d in split):
        return None
    m, length, size = (ev.dim(y, a) for a in range(3))
    if not (split[0] * split[1] == m and split[2] == size and split[3] == length):
        return None
    heads = (split[0], split[1], split[3], split[2])
    if ev.rank(x) == 4 and tuple(ev.dim(x, a) for a in range(4)) == heads:
        return read_heads(view, ev, x, nodes, "key")
    if not all(d.is_int for d in heads):
        return None
    return Heads(None, split[1].coef, split[2].coef, split[0], split[3], tensor=x, computed=True,
                  shape=tuple(d.coef for d in heads))


def heads_read_as_they_are(ev: Evaluator, q: Heads, k: Heads, v: Heads) -> frozenset:
    """Where the graph computes heads itself, MHA reads the key and value heads [B, N, L, H] as they are
    (and the query's merged back into [B, S, N·H] in front of it, or its projection where that is split):
    their dimensions must be what MHA requires — the query's batch and head count, one length, and one
    head size for key and value (ORT's CPU kernel refuses key and value heads of different shapes). The
    query's and key's head sizes need no proof: the graph's own product of the two contracts them. One
    key/value head that the graph's products broadcast over the query's (Falcon's multi-query attention)
    is expanded to the query's count in front of MHA, which is what the broadcast computes.
    Returns the head splits of key and value, which stay in the graph (MHA reads their output), and which
    of "key"/"value" is such a broadcast head."""
    if k.tensor is None:
        raise Refused("the key is split into heads straight as Kᵀ while other heads are computed per head: "
                      "MultiHeadAttention would need the key heads as [batch, heads, length, head_size]")
    kd, vd = (_head_dims(ev, x) for x in (k, v))
    broadcast = []
    for d, what in ((kd, "key"), (vd, "value")):
        if d[0] != q.batch:
            raise Refused(f"the {what} heads' batch ({d[0]}) is not shown to be the query's ({q.batch})")
        if d[1] == Dim(1) and q.heads > 1:
            broadcast.append(what)
        elif d[1] != Dim(q.heads):
            raise Refused(f"query/{what} split into {q.heads}/{d[1]} heads")
    if vd[2] != kd[2]:
        raise Refused(f"the value heads' length ({vd[2]}) is not shown to be the key heads' ({kd[2]})")
    if vd[3] != kd[3]:
        raise Refused(f"the key and value heads' sizes ({kd[3]}, {vd[3]}) are not shown to be equal: "
                      "MultiHeadAttention takes [batch, heads, length, head_size] key and value of one shape")
    return k.split_nodes | v.split_nodes, tuple(broadcast)


def _head_dims(ev: Evaluator, x: Heads) -> list[Dim]:
    """[B, N, L, H] of heads MHA reads as they are (after the reshape or transpose made in front of it)."""
    if x.shape:
        return [Dim(n) for n in x.shape]
    d = [ev.dim(x.tensor, a) for a in range(4)]
    return [d[0], d[2], d[1], d[3]] if x.from_bsnh else d


def value_hidden(ev: Evaluator, q: Heads, v: Heads) -> int | None:
    """N·H of the product P·V, where the value's head size is known: the query's N heads (one value head
    is broadcast over them by the product: multi-query attention)."""
    h = Dim(v.head_size) if v.head_size else ev.dim(v.tensor, 3)
    return (q.heads if v.heads == 1 else v.heads) * h.coef if h.is_int else None


def merge_heads(view: GraphView, ev: Evaluator, t: str, q: Heads, hidden: int | None,
                 nodes: set) -> tuple[str, tuple | None]:
    """P·V [B, N, S, H] → (identity Reshapes) → Transpose 0213 → Reshape [B, S, N·H]: what MHA writes
    (``hidden`` is N·H where it is known; nodes that pass the value on may come between). Returns the merged
    tensor and, for a merge into [B·S, N·H], that shape (MHA's output is reshaped)."""
    cur = t
    while True:
        i = _sole_reader(view, cur)
        if i is None:
            raise Refused("the attention output is read before its heads are merged")
        node = view.nodes[i]
        if (is_op(node, "Reshape") and node.input[0] == cur and _identity_reshape(view, ev, node, cur)) or \
                passes_value(node, ev.dtype):
            nodes.add(i)
            cur = node.output[0]
            continue
        break
    if not (is_op(node, "Transpose") and tuple(attr(node, "perm", ())) == (0, 2, 1, 3)):
        raise Refused(f"the attention output goes to {node.op_type}, not the head merge Transpose [0, 2, 1, 3]")
    nodes.add(i)
    tm = node.output[0]
    ri = _sole_reader(view, tm)
    while ri is not None and passes_value(view.nodes[ri], ev.dtype):
        nodes.add(ri)
        tm = view.nodes[ri].output[0]
        ri = _sole_reader(view, tm)
    if ri is None or not is_op(view.nodes[ri], "Reshape"):
        raise Refused("the merged heads are not reshaped back to [batch, sequence, hidden]")
    try:
        target = ev.vec(view.nodes[ri].input[1]).items
    except NotSymbolic as e:
        raise Refused(f"the head merge's shape cannot be followed: {e}") from None
    batch = {ev.dim(tm, 0), q.batch}
    seq = {ev.dim(tm, 1), q.seq}
    if not attr(view.nodes[ri], "allowzero", 0):
        batch.add(Dim(0))
        seq.add(Dim(0))
    last = (Dim(-1),) if hidden is None else (Dim(-1), Dim(hidden))
    # [B·S, D]: GPT-2's Conv1D (dynamo)
    flat = len(target) == 2 and hidden is not None and target == (Dim(-1), Dim(hidden))
    # one entry among batch/sequence that is -1 or a symbol of its own is the other's complement when the
    # last is the hidden size (the element count forces it, as in the head split)
    kept = len(target) == 3 and (
        (target[0] in batch and target[1] in seq and target[2] in last)
        or (hidden is not None and target[2] == Dim(hidden) and ((_forced(target[0]) and target[1] in seq)
                                                                 or (target[0] in batch and _forced(target[1])))))
    if not flat and not kept:
        raise Refused(f"the heads are merged into {list(target)}, not [batch, sequence, {hidden or 'hidden'}]")
    nodes.add(ri)
    return view.nodes[ri].output[0], (-1, hidden) if flat else None


def _forced(d: Dim) -> bool:
    """A Reshape target entry whose value the element count decides, given the others: -1, or a symbolic
    dimension the evaluator could not name as the input's own (any other value makes the Reshape fail)."""
    return d == Dim(-1) or not d.is_int


def _sole_reader(view: GraphView, t: str) -> int | None:
    """The one node reading ``t`` other than ``Shape`` nodes (those are taken into the block when only
    the block reads them), or None."""
    if t in view.graph_outputs:
        return None
    readers = [r for r in view.consumers_of(t) if view.nodes[r].op_type != "Shape"]
    return readers[0] if len(readers) == 1 else None


def _identity_reshape(view: GraphView, ev: Evaluator, node, src: str) -> bool:
    try:
        target = ev.vec(node.input[1]).items
    except NotSymbolic:
        return False
    if ev.rank(src) != len(target):
        return False
    free = [j for j, d in enumerate(target) if d != ev.dim(src, j)]
    return len(free) <= 1 and all(target[j] == Dim(-1) for j in free)
