"""The product masked before any bias is added: ``Where(C, Q·Kᵀ·s, fill)``, proved to be what the fused op
computes from ``C``'s own bias.

GPT-Neo's own attention code (its only one: transformers has no sdpa form for it) masks the product before
the mask is added: ``Softmax(Where(C, Q·Kᵀ·s, fill) [+ mask])``, ``C`` a slice of a literal boolean
buffer (``tril``; banded to ``window_size`` keys in the "local" layers), ``fill`` the dtype's lowest. MHA
gets the graph's own ``C`` as ``attention_bias = Where(C, 0, fill) [+ mask's bias]``: entry by entry the
same numbers where C keeps a key (``s_qk + m_qk``); where it drops one the graph has ``fill + m_qk`` and
MHA ``s_qk + (fill + m_qk)`` — the same ``-inf`` where the mask drops the key too (lowest + lowest
overflows, in both), else ``lowest`` against ``s_qk + lowest``, which float32 rounds to lowest (|s| far
below 2^103) and whose exponential is 0 in both once the row keeps any key. So the rows agree wherever
one entry of a row is finite, and ``prove_score_keep`` shows that from ``C``: every row keeps a key at or
before its own position, with both slices starting at 0 and the query and key lengths equal (GPT-Neo's
``C[:, :, L - S : L, :L]``, L - S read as 0 from the shapes); the block then takes the slices and slices
``C`` again from the query's and key's own lengths, so the exporter's shape arithmetic over the heads dies
with it. Float32's lowest absorbs any score (``s + lowest`` is lowest); float16's does not, so in float16 a
finite fill must drop only keys the proved causal mask drops too (a causal literal; a banded one is
refused: a row whose window holds only padding would differ). A fill other than ``-inf`` or the lowest, a
keep computed at run time, a slice from elsewhere, or a scale applied after the Where (it scales the
fill) is refused. Causal without padding keeps MHA's ``unidirectional`` and adds the literal's bias.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import onnx

from ..graph import DEVICE_COPIES, GraphView, is_op
from ..match import Refused
from ..rule import T
from ..symbolic import Dim, Evaluator, NotSymbolic
from .heads import Heads
from .masks import Mask
from .scores import ScoreKeep


# A literal keep is read whole to prove it (GPT-Neo-2.7B's buffer: 2048 × 2048 booleans, 4 MiB).
_SCORE_KEEP_MAX_ELEMENTS = 1 << 24
_SHAPE_PASS_THROUGH = ("Reshape", "Unsqueeze", "Squeeze", "Identity", "Cast", *DEVICE_COPIES)


def prove_score_keep(view: GraphView, ev: Evaluator, sk: ScoreKeep, q: Heads, k: Heads,
                      dtype: int, mask: Mask) -> ScoreKeep:
    """The scores' own ``Where(keep, Q·Kᵀ·s, fill) [+ mask]`` is MHA's ``Q·Kᵀ·s + (Where(keep, 0, fill)
    [+ mask])`` exactly when (module docstring) the fill is ``-inf`` or the dtype's lowest and every query
    row keeps a key. The keep must be a boolean literal ``C`` or Slices of one (GPT-Neo: its buffer
    ``C[:, :, L - S : L, :L]``) from 0 on its last two axes, the key axis sliced up to the key length or
    not at all, the query axis likewise to the query length; with the two lengths proved equal, row q of
    the keep is ``C[q, :L]``, L > q, and every row of ``C`` must keep a key at or left of its diagonal (a
    causal or banded buffer does: its diagonal). In float16 a finite fill must drop only keys the mask
    drops too (a proved causal mask and a literal keeping every key at or before the diagonal): MHA adds
    the product to ``fill + m`` in float32, where the graph's ``fill`` of a dropped key the mask keeps
    stays ``fill`` — float32's lowest absorbs any score, float16's does not, and a row whose kept keys
    the padding hides all (a banded layer's rows more than its window past the last token) would differ.
    Returns ``sk`` with the literal, its rank and rows, and
    the Slices (which the block takes: the keep is sliced again from the query's and key's lengths)."""
    what = "the product is masked as Where(keep, Q·Kᵀ, fill)"
    lowest = float(np.finfo(onnx.helper.tensor_dtype_to_np_dtype(dtype)).min)
    if sk.fill not in (-math.inf, lowest):
        raise Refused(f"{what} with fill {sk.fill:g}: only -inf or the dtype's lowest ({lowest:g}) drops a key "
                      "the way an attention_bias entry does")
    if q.seq != k.seq:
        raise Refused(f"{what} where the query and key lengths are not shown equal")
    t, ends, slices = sk.keep, {}, set()  # ends: axis -> (the Slice's ends input, position in it)
    while view.constant(t) is None:
        i = view.producer.get(t)
        node = view.nodes[i] if i is not None else None
        if node is None or not is_op(node, "Slice") or len(node.input) < 3 or len(ends) > 8:
            raise Refused(f"{what} where keep is not a literal or a Slice of one (a mask computed at run time)")
        rank = ev.rank(node.input[0])
        try:
            starts = ev.vec(node.input[1]).items
            axes = ev.vec(node.input[3]).items if len(node.input) > 3 and node.input[3] else \
                tuple(Dim(a) for a in range(len(starts)))
            steps = ev.vec(node.input[4]).items if len(node.input) > 4 and node.input[4] else (Dim(1),) * len(starts)
        except NotSymbolic as e:
            raise Refused(f"{what} where keep's Slice cannot be followed: {e}") from None
        if rank is None or len(axes) != len(starts) or not all(a.is_int and -rank <= a.coef < rank for a in axes):
            raise Refused(f"{what} where keep's Slice axes are not known")
        for n, (a, start, step) in enumerate(zip(axes, starts, steps)):
            j = a.coef % rank
            if start != Dim(0) or step != Dim(1) or j in ends:
                raise Refused(f"{what} where keep is sliced from {start} by {step} on axis {j}: only one slice "
                              "from 0, step 1, per axis is proved")
            ends[j] = (node.input[2], n)
        slices.add(i)
        t = node.input[0]
    c = view.small_value(t, max_elements=_SCORE_KEEP_MAX_ELEMENTS)
    if c is None or c.dtype != np.bool_ or not 2 <= c.ndim <= 4:
        raise Refused(f"{what} where keep's literal is not a 2-D to 4-D boolean tensor of at most "
                      f"{_SCORE_KEEP_MAX_ELEMENTS} elements")
    rank, (rows, cols) = c.ndim, c.shape[-2:]
    if any(d != 1 for d in c.shape[:-2]) or any(j < rank - 2 for j in ends):
        raise Refused(f"{what} where keep's literal {list(c.shape)} has batch or head axes of its own")
    if cols == 1 or (rank - 1 in ends and not _end_reaches(view, ev, *ends[rank - 1], k.seq, cols)):
        raise Refused(f"{what} where keep's key axis is not shown to span the key length")
    if rank - 2 in ends and not _end_reaches(view, ev, *ends[rank - 2], q.seq, rows):
        raise Refused(f"{what} where keep's query axis is not shown to span the query length")
    matrix = c.reshape(rows, cols)
    blind = np.flatnonzero(~np.tril(matrix).any(axis=1))
    if blind.size:
        raise Refused(f"{what} where keep's row {int(blind[0])} keeps no key at or before its own position "
                      "(such a row is NaN in the graph and the kernel's own choice in the fused op)")
    keeps_the_triangle = bool(matrix[np.tril_indices(rows, 0, cols)].all())
    if dtype == T.FLOAT16 and sk.fill != -math.inf and not (mask.causal and keeps_the_triangle):
        raise Refused(f"{what} in float16 with a finite fill, where keep drops keys the mask keeps (a banded "
                      "literal): MultiHeadAttention adds the product to the fill in float32, which float16's "
                      "lowest does not absorb")
    return replace(sk, literal=t, rank=rank, rows=rows, slices=frozenset(slices))


def _end_reaches(view: GraphView, ev: Evaluator, ends: str, n: int, length: Dim, extent: int) -> bool:
    """Whether entry ``n`` of a Slice's ``ends`` is ``length``, or takes an axis of ``extent`` whole (an int
    at least ``extent``, or ``Min(c, length)`` with c at least ``extent``: dynamo's clamp)."""
    try:
        end = ev.vec(ends).items[n]
        return end == length or (end.is_int and end.coef >= extent)
    except (NotSymbolic, IndexError):
        pass
    t = ends
    for _ in range(8):
        i = view.producer.get(t)
        if i is None:
            return False
        node = view.nodes[i]
        if node.op_type in _SHAPE_PASS_THROUGH and node.domain in ("", "ai.onnx"):
            t = node.input[0]
            continue
        if not is_op(node, "Min") or len(node.input) != 2:
            return False
        for a, b in ((node.input[0], node.input[1]), (node.input[1], node.input[0])):
            bound = view.small_value(a)
            if bound is not None and bound.size == 1 and bound.reshape(-1)[0] >= extent:
                try:
                    return ev.vec(b).items == (length,)
                except NotSymbolic:
                    return False
        return False
    return False
