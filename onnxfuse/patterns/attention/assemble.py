"""From the parts a rule matched to the plan, for either anchor: the projections packed or fed as they are,
the nodes the block takes, and what the plan records of the mask and of the rows that see no key.

Where Q, K and V are constant-weight projections of one tensor X (three MatMuls, or GPT-2's one MatMul and a
Split; qkv.py), the block takes them in and becomes ``Attention(X, [Wq | Wk | Wv], [bq | bk | bv])``: ORT runs
one GEMM and one kernel that adds the bias and splits the heads, where MHA was fed three GEMMs' outputs (BERT)
or a Split's (GPT-2: a Split kernel and a bias broadcast of their own). Weights in external data are packed
too, joined while the model is saved. Otherwise (a cross-attention, a run-time weight, a projection also read
elsewhere: ``inspect`` gives the reason as ``qkv_separate_because``) the projections are fed to MHA as they
are; when each is ``MatMul + Add(const [D])``, the three Adds are folded into MHA's ``bias`` input (one new
[3D] constant), else the Adds stay in front of the op.

The block takes the nodes the rule matched, and the shape-only nodes that read its tensors and are read
only inside it (the exporters' Shape/Slice/Concat arithmetic over the heads: they die with it). A plan whose
removed tensors are read elsewhere (a cache output, a shape read outside) is refused.
"""

from __future__ import annotations

import math

import numpy as np

from .. import qkv
from ..graph import DEVICE_COPIES, GraphView
from ..match import Refused
from ..rule import Refusal, T, dtype_name
from ..symbolic import Evaluator
from .heads import Heads, heads_read_as_they_are
from .masks import Mask
from .plan import RULE, AttentionPlan, PackedAttentionPlan
from .scores import ScoreKeep

_SUPPORTED = (T.FLOAT, T.FLOAT16)
# Nodes that only compute shapes of a block's tensors may be absorbed into the block (their only reader).
# Ops of a shape-only subgraph that dies with the block (_shape_closure), the run-time scale's arithmetic
# (1/√Shape(q)[-1], scores.strip_scale) included: a closure is taken only where every path ends inside the block.
_SHAPE_OPS = ("Shape", "Slice", "Concat", "Gather", "Squeeze", "Unsqueeze", "Cast", "Reshape", "CastLike", "Sqrt",
              "Reciprocal", "Div", "Mul", "Sub",  # Sub: GPT-Neo's key_length - query_length
              "Identity", *DEVICE_COPIES)  # a shape copied to the device that reads it


def attention_dtype(ev: Evaluator, q: Heads, k: Heads) -> int:
    """The attention's element type, the query's and the key's: float32 or float16, the fused ops' types."""
    dtype = ev.dtype(q.typed)
    if dtype is None:
        raise Refused("the attention's dtype is not known (no projection's type can be derived)")
    if dtype not in _SUPPORTED or ev.dtype(k.typed) != dtype:
        raise Refused(f"attention in {dtype_name(dtype)}: MultiHeadAttention is fused here for float32/float16")
    return dtype


def finish(view: GraphView, ev: Evaluator, nodes: set, q: Heads, k: Heads, v: Heads, dtype: int, mask: Mask,
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

    if per_head:  # the projections' bias Adds stay before the rotary; MHA gets no bias (heads.py)
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
                                 f"attention_mask {mask.mask_values}" if mask.mask_values else "",
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
        padding_rank=mask.padding_rank, mask_values=mask.mask_values, **extra)


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


def unless_escaping(view: GraphView, anchor: int, plan: AttentionPlan) -> AttentionPlan | Refusal:
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
