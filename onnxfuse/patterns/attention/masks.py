"""The mask: what the bias added to the scores is proved to be, so that the fused op adds the same.

The mask proved: ``Add(scores, Where(keep, 0, fill))`` (either operand order). transformers' ``sdpa_mask``
builds ``keep`` from index arithmetic, not constants: ``Range`` over batch, query and key positions,
``Unsqueeze``/``Expand`` onto [B, 1, S, L], ``kv_idx <= q_idx`` (causal), ``kv_idx >= 0`` (always true),
and the padding lookup ``attention_mask[b, kv_idx]`` — a ``GatherND`` of (b, kv_idx) pairs (dynamo) or a
``Gather`` from ``Flatten(mask)`` at ``b·T + kv_idx`` (TorchScript). ``symbolic`` evaluates ``keep`` into
a formula of the index positions; the rule accepts exactly the conjunctions of ``mask[b, k] != 0`` and
``k <= q``, so causality and padding are *proved*, never assumed from names. Windows are bounds on k - q
too: every comparison of k with q plus an integer (and ``|k - q| <= c``, both at once) bounds it from above
or below, and the bounds met make a band lo <= k - q <= hi. hi = 0 alone is causal; a band around the
query's own position (lo <= 0 <= hi) is taken beside a padding term — Mistral's sliding window
(``kv_idx > q_idx - sliding_window``: lo = 1 - window, hi = 0), ModernBERT's local attention
(``|q - k| <= local_attention / 2``) — and the rebuilt keep carries the same bounds, so MHA's bias and the
row guard's flags are the graph's entry for entry. Any other band, or one without padding (MHA has no
banded mode; the band alone would need a mask made from the lengths, which no export seen writes with a
``-inf`` fill), is refused; with a finite fill it still goes in as an additive bias (below). ViT's dynamo
export adds a uniform all-keep mask (zero bias): no mask. ``fill`` is ``finfo(float32).min`` (dynamo), ``-inf``
(TorchScript) or ``-65504`` (after ORT's float16 converter).

Any other bias added to the scores before the Softmax — the ``(1 - mask) · c`` padding bias of eager and older
exports, T5's ``Where(keep, position_bias, finfo.min)``, BEiT/Swin relative position tables, a causal
``Where`` with a finite fill, or the sum of a mask and such a term — is fed to MHA as it is
(:func:`additive_bias`): the graph's own tensor (its arithmetic stays in front of the op), expanded to
[B|1, N|1, S, T] where it broadcasts over the query or key axis (MHA takes those whole). It must have the
scores' element type, a shape that broadcasts onto [B, N, S, T] without broadcasting the scores up (each axis
proved 1 or the scores' own, ``symbolic``), and values proved finite (``value_range``).

Why these are exact, row by row:

* padding, with or without causality: the graph's own mask tensor ``Where(keep, 0, fill)`` becomes MHA's
  ``attention_bias`` (expanded over the query positions when the graph lets the Add broadcast it), so MHA adds
  to the scaled scores exactly what the graph adds, for every padding pattern, left or right, and every fill.
  A row that sees no key (an all-padding batch row; left padding under causality makes them common) is NaN in
  the graph with the ``-inf`` fill, 0 after its guard: the rewrite counts each row's kept keys from ``keep``
  and writes that value there (``FillMaskedRows(y, row sees a key)`` with 0 or NaN: ``Where`` bit for bit),
  whatever the kernel makes of such a row. With a finite fill such a row is the softmax of equal scores,
  uniform in both (measured on ORT 1.31's CPU kernel, float32 and float16, fills ``finfo.min`` and
  ``-65504``);
* a window with padding: as padding with causality, the keep rebuilt with the band's bounds (integers
  compared exactly): the same bias entries and the same rows seeing no key (those whose window holds only
  padding keys);
* causal without padding (GPT-2 fed no ``attention_mask``): MHA's ``unidirectional``, which drops future
  keys entirely, so the graph's fill must too: ``-inf`` or the dtype's lowest value (their exponentials
  underflow to exactly 0 unless one row's scores already span the dtype's whole range); other fills
  (``-10000``) let large scores through and are refused. Every row sees its own key;
* an additive bias: MHA computes softmax(scale·QKᵀ + bias), the graph softmax(scale·QKᵀ + bias) with the
  same tensor, so every finite bias is exact, whatever its values mean, and such a bias is fed as it is
  even where it looks like a keep/fill mask (``(1 - m) · c`` is one only for m ∈ {0, 1}, and an int64
  ``attention_mask`` may hold any value). Finiteness is what makes it safe without a row guard: a finite
  bias hides no row entirely (every score stays finite, so every row is a plain softmax, the same in
  both), while an entry of ``-inf`` (a masked_fill with ``-inf``) can hide a row and one of ``+inf``
  turns it to NaN in the graph, and what a kernel makes of those rows is its own. Finite is proved, not
  assumed: ``(1 - m) · finfo.min`` overflows to ±inf for m outside [-1, 2] and an int64 → float16 Cast
  itself overflows, so those are not fed as they are unless m was cast to bool first; ``(1 - m) ·
  -10000`` of an int64 mask stays within float32. The graph's scaling must come before the bias: scaled
  after (by anything but 1), the bias is scaled too, which MHA does not do;
* a bias that cannot be fed as it is (not shown finite, or of dimensions not shown to be the scores'):
  where it is a function of ``attention_mask[b, k]`` and proved causal/window comparisons alone, it is
  read off its values (``mask_semantics``: 0 on kept keys, one negative fill on the others) and its keep
  proved and rebuilt as a Where's is (below). Where it reads the mask arithmetically (``(1 - m) ·
  finfo.min``), that holds for the mask values 0 and 1 only, transformers' contract for
  ``attention_mask``: the plan records it (``"mask_values": "0 or 1"`` in the report);
* the guard with a finite fill or no mask only sees NaN from scores that overflowed; MHA has no guard,
  so such (already overflowed) heads give NaN instead of 0. This is the one difference accepted.

Adding a mask form. :func:`classify` is the one entry point for a bias added to the scores: it tries the
forms of :data:`FORMS` in order, then falls back to :func:`additive_bias`, and where that refuses, to the
forms of :data:`FALLBACK_FORMS` (the mask read off its values: after the bias as it is, which is exact
wherever it is taken, so that every model whose bias fuses as it is keeps its output). A new spelling of a
mask is one function ``prove(view, ev, bias, q, k, dtype) -> Mask | None`` — None where ``bias`` is not
written that way, the :class:`Mask` it is proved to be, or ``match.Refused`` with the reason where it is
written that way but cannot be proved — listed in :data:`FORMS` as a :class:`MaskForm` with its spelling
(named in the reason when no form recognises a bias). A boolean keep proved by :func:`proved_keep` (or a
keep formula by :func:`keep_formula_mask`) is rebuilt in front of the op (``mask_inputs``); a form whose
keep is something else must say how it is rebuilt there too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import onnx

from ..graph import GraphView, is_op, value_source
from ..match import Refused
from ..rule import T, dtype_name
from ..symbolic import Data, Dim, Evaluator, Index, NotSymbolic, clamped_to, conjuncts, shift_axes
from ..value_range import is_finite
from . import mask_semantics
from .heads import Heads


FLOAT32_MIN = float(np.finfo(np.float32).min)


@dataclass(frozen=True)
class Mask:
    kind: str  # "" | "key-padding" | "causal" | "causal+key-padding" | "causal+sliding-window+key-padding"
    # | "local-window+key-padding"
    tensor: str | None = None  # the padding tensor the graph reads as attention_mask[b, k]
    causal: bool = False
    fill: float | None = None
    keep: str | None = None  # the Where's condition
    rank: int = 4  # the mask's rank (it broadcasts from the right onto the scores)
    has_query_axis: bool = True  # the mask has a query axis of its own (not broadcast over the rows)
    bias: str | None = None  # an additive bias fed as it is (kind "additive bias")
    full: bool = False  # ... whose query and key axes are the scores' own (no Expand needed)
    band: tuple | None = None  # (lo, hi): only keys lo <= k - q <= hi (lo <= 0 <= hi), where not causal alone
    padding_rank: int = 2  # the padding tensor's rank: [B, T], or [B, 1, 1, T]
    # the attention_mask values for which the rebuilt mask is the graph's (None: every value), where a form
    # proves it only on the values transformers' attention_mask contract allows (mask_semantics)
    mask_values: str | None = None


NO_MASK = Mask("")


@dataclass(frozen=True)
class MaskForm:
    """One spelling of a mask the rule proves (module docstring, "Adding a mask form")."""

    spelling: str  # how the graph writes it: named in the reason when no form recognises a bias
    # prove(view, ev, bias, q, k, dtype): None where the bias is not written this way, else the Mask it is
    # proved to be; Refused where it is written this way but not proved
    prove: Callable[[GraphView, Evaluator, str, Heads, Heads, int], Mask | None]


def classify(view: GraphView, ev: Evaluator, bias: str, q: Heads, k: Heads, dtype: int) -> Mask:
    """The mask ``bias`` (added to the scores) is proved to be by the first of :data:`FORMS` that proves it,
    else the graph's bias itself, where it is a finite tensor of the scores' type that broadcasts onto them
    (:func:`additive_bias`; its reason then starts with why no form proved it: the first form that
    recognised the bias, or that none did)."""
    unproved = None
    for form in FORMS:
        try:
            mask = form.prove(view, ev, bias, q, k, dtype)
        except Refused as why:
            unproved = unproved or why.reason
            continue
        if mask is not None:
            return mask
    if unproved is None:
        i = view.producer.get(bias)
        got = view.nodes[i].op_type if i is not None else \
            "a constant" if view.constant_ref(bias) is not None else "a graph input"
        unproved = (f"the scores get an additive bias from {got}, not a mask "
                    f"{' or '.join(form.spelling for form in FORMS)} "
                    "(ALiBi, relative position bias or an unrecognised mask)")
    try:
        return additive_bias(view, ev, bias, q, k, dtype, unproved)
    except Refused as as_it_is:
        for form in FALLBACK_FORMS:
            try:
                mask = form.prove(view, ev, bias, q, k, dtype)
            except Refused as why:
                raise Refused(f"{as_it_is.reason}; {why.reason}") from None
            if mask is not None:
                return mask
        raise


def additive_bias(view: GraphView, ev: Evaluator, bias: str, q: Heads, k: Heads, dtype: int,
                   unproved: str) -> Mask:
    """Any tensor the graph adds to the scaled scores is MHA's attention_bias exactly (MHA adds it at
    the same place), given the scores' type, a shape that broadcasts onto [B, N, S, T] without
    broadcasting the scores up, and finite values (module docstring)."""
    def refuse(reason: str):
        raise Refused(f"{unproved}; as attention_bias, {reason}")

    if ev.dtype(bias) != dtype:
        refuse(f"the bias is {dtype_name(ev.dtype(bias))}, the scores {dtype_name(dtype)}")
    rank = ev.rank(bias)
    if rank is None or rank > 4:
        refuse("the bias's rank is not known to be at most 4")
    dims = (Dim(1),) * (4 - rank) + tuple(ev.dim(bias, j) for j in range(rank))
    scores = (q.batch, Dim(q.heads), q.seq, k.seq)
    for j, (d, s) in enumerate(zip(dims, scores)):
        if d != Dim(1) and d != s:
            refuse(f"the bias's dimension {j} ({d}) is not shown to be 1 or the scores' ({s})")
    if not is_finite(view, bias):
        refuse("the bias is not shown to be finite (a row it hides entirely with -inf, or an infinite "
               "entry, is NaN in the graph and the kernel's own choice in the fused op)")
    return Mask("additive bias", rank=rank, has_query_axis=dims[2] != Dim(1), bias=bias,
                 full=dims[2] == scores[2] and dims[3] == scores[3])


def _keep_where(view: GraphView, ev: Evaluator, bias: str, q: Heads, k: Heads, dtype: int) -> Mask | None:
    """``Where(keep, 0, fill)`` with a negative constant fill (transformers' mask functions), its keep proved
    (:func:`proved_keep`); read through a device copy and an Expand onto the scores (``graph.value_source``)."""
    scores = (q.batch, Dim(q.heads), q.seq, k.seq)
    i = view.producer.get(value_source(view, bias, ev.dtype, lambda n: ev.expands_within(n, scores))[0])
    w = view.nodes[i] if i is not None else None
    if w is None or not is_op(w, "Where") or len(w.input) != 3:
        return None
    zero, fill = view.scalar(w.input[1]), view.scalar(w.input[2])
    if zero is None or zero[0] != 0.0 or fill is None or not fill[0] < 0.0:
        raise Refused("the mask is a Where whose kept value is not 0 or whose fill is not a negative constant")
    return proved_keep(view, ev, w.input[0], fill[0], q, k, dtype)


def _read_off_values(view: GraphView, ev: Evaluator, bias: str, q: Heads, k: Heads, dtype: int) -> Mask | None:
    """A bias that is a function of ``attention_mask[b, k]`` (and causal or window comparisons) alone, whatever
    its spelling: read off its values (``mask_semantics``), its keep proved as a Where's keep is."""
    read = mask_semantics.read_keep(view, ev, bias, q, k, dtype)
    if read is None:
        return None
    mask = keep_formula_mask(view, ev, read.keep, read.fill, q, k, dtype)
    return replace(mask, mask_values=read.mask_values) if mask.kind else mask


# The mask forms classify tries, in order (module docstring, "Adding a mask form").
FORMS: tuple[MaskForm, ...] = (MaskForm("Where(keep, 0, fill)", _keep_where),)
# The forms classify tries where the bias cannot be fed as it is: a finite bias of the scores' shape is
# exact as the graph computes it, and stays so (every model whose bias fuses as it is keeps its output).
FALLBACK_FORMS: tuple[MaskForm, ...] = (
    MaskForm("a function of attention_mask alone, broadcast over the rows", _read_off_values),)


def proved_keep(view: GraphView, ev: Evaluator, keep_name: str, fill_value: float, q: Heads, k: Heads,
                 dtype: int) -> Mask:
    """The boolean ``keep_name`` (true where a key is kept; dropped keys get ``fill_value``) proved to be
    padding and/or causal."""
    try:
        keep = ev.index(keep_name)
    except NotSymbolic as e:
        raise Refused(f"the mask is not provably padding or causal: {e}") from None
    return keep_formula_mask(view, ev, keep, fill_value, q, k, dtype, keep_name)


def keep_formula_mask(view: GraphView, ev: Evaluator, keep: Index, fill_value: float, q: Heads, k: Heads,
                      dtype: int, keep_name: str | None = None) -> Mask:
    """The keep formula ``keep`` (its extents aligned from the right onto the scores [B, N, S, L]) proved to
    be padding and/or causal or a window, or refused: the proof behind :func:`proved_keep`, for a keep the
    graph computes as a tensor, and for one a form reads off what the graph computes (``mask_semantics``)."""
    if len(keep.extents) > 4:
        raise Refused("the mask has more than 4 dimensions")
    pad = 4 - len(keep.extents)
    extents = (Dim(1),) * pad + keep.extents
    expr = shift_axes(keep.expr, lambda a: a + pad)  # the formula's axes, aligned to [B, N, S, L]
    try:
        terms = conjuncts(expr, extents)
    except NotSymbolic as e:
        raise Refused(f"the mask is not provably padding or causal: {e}") from None
    batch, query_len, key_len = q.batch, q.seq, k.seq
    lo = hi = padding = None  # the key offsets kept, lo <= k - q <= hi (None: unbounded)
    for term in terms:
        bounds = _diagonal_bounds(term)
        if bounds:
            for side, c in bounds:
                if side == "upper":
                    hi = c if hi is None else min(hi, c)
                else:
                    lo = c if lo is None else max(lo, c)
        elif term[0] == "data" and term[2] == ("axis", 0) and term[3] == ("axis", 3) and padding in (None, term[1]):
            padding = term[1]
        else:
            raise Refused(f"the mask has a term that is neither padding nor causal: {_show(term)}")
    causal = hi == 0 and lo is None
    band = None if causal or (lo is None and hi is None) else (lo, hi)
    if band is not None and not (lo is not None and hi is not None and lo <= 0 <= hi):
        raise Refused(f"the mask keeps the keys {_show_offsets(lo, hi)}: neither causal nor a window around "
                      "the query's own position")
    if band is not None and padding is None:
        # MHA has no banded mode; the band alone would be a bias of its own, made from the lengths
        raise Refused(f"the mask keeps the keys {_show_offsets(lo, hi)} with no padding mask to build it on")
    positional = causal or band is not None
    lowest = float(np.finfo(onnx.helper.tensor_dtype_to_np_dtype(dtype)).min)
    if causal and padding is None and fill_value not in (-math.inf, lowest):
        raise Refused(f"causal mask with fill {fill_value:g}: MultiHeadAttention drops the future keys "
                      f"entirely, which a fill above the dtype's lowest ({lowest:g}) does not")
    # The formula's positions must be the real ones: an index axis of another length would broadcast
    # (length 1) where MHA reads every position. The padding tensor's own extents count as proof: the
    # mask built from it is fed to MHA, which requires [batch or 1, heads or 1, S, T] at run time.
    rows = cols = None
    if padding is not None:
        if not _padding_shaped(ev, padding):
            raise Refused(f"the padding mask '{padding.name}' has rank {padding.rank}, not [batch, key length]")
        rows, cols = ev.dim(padding.name, 0), ev.dim(padding.name, padding.rank - 1)
        if extents[0] not in (batch, rows) or extents[3] not in (key_len, cols):
            raise Refused(f"the padding mask spans {extents[0]}×{extents[3]}, not shown to be batch × key length")
        if view.dtype(padding.name) not in (T.BOOL, T.INT64, T.INT32) and not padding.as_bool:
            raise Refused("the padding mask is read as values, not as keep/drop")
    if positional and (not _one_of(extents[2], (query_len, extents[3]))
                       or not _one_of(extents[3], (key_len, query_len, cols))):
        raise Refused(f"the {'causal' if causal else 'banded'} mask spans {extents[2]}×{extents[3]} positions, "
                      "not shown to be the query and key lengths")
    allowed = ({batch, rows}, {Dim(q.heads)}, {query_len, extents[3] if positional else query_len}, {key_len, cols})
    for j, (e, ok) in enumerate(zip(extents, allowed)):
        if e != Dim(1) and not _one_of(e, ok):
            raise Refused(f"the mask's dimension {j} ({e}) is not shown to match the scores'")
    sliding = band is not None and band[1] == 0
    kind = "+".join(p for p, on in (("causal", causal or sliding), ("sliding-window", sliding),
                                     ("local-window", band is not None and not sliding),
                                     ("key-padding", padding is not None)) if on)
    if not kind:
        return NO_MASK  # keeps every key: adding its zero bias changes nothing
    return Mask(kind, padding.name if padding else None, causal, fill_value, keep=keep_name,
                 rank=len(keep.extents), has_query_axis=extents[2] != Dim(1), band=band,
                 padding_rank=padding.rank if padding else 2)


def _padding_shaped(ev: Evaluator, padding: Data) -> bool:
    """The padding tensor is [batch, key length], or [batch, 1, 1, key length] (a mask given already
    broadcast over heads and queries: ``mask_inputs`` reads its last axis as the key length)."""
    return padding.rank == 2 or (padding.rank == 4 and ev.dim(padding.name, 1) == Dim(1) == ev.dim(padding.name, 2))


def _one_of(d: Dim, lengths) -> bool:
    """``d`` is one of ``lengths``, where a mask's axis meets the scores' in the graph's own Add: there a
    length ``Min(c, x)`` (c ≥ 1; the dynamo exporter names the scores' length so after slicing a buffer
    of c positions) and ``x`` broadcast only where they are equal (each is 1 exactly when the other is)."""
    for e in lengths:
        if d == e:
            return True
        if e is None:
            continue
        for a, b in ((d, e), (e, d)):
            clamp = clamped_to(a)
            if clamp is not None and clamp[0] >= 1 and clamp[1] == repr(b):
                return True
    return False


def _show(term: tuple) -> str:
    names = {0: "b", 1: "h", 2: "q", 3: "k"}
    if term[0] == "axis":
        return names.get(term[1], f"i{term[1]}")
    if term[0] == "const":
        return repr(term[1])
    if term[0] == "data":
        return f"{term[1].name}[{_show(term[2])}, {_show(term[3])}]"
    return f"{term[0]}({', '.join(_show(t) for t in term[1:] if isinstance(t, tuple))})"


def _show_offsets(lo: int | None, hi: int | None) -> str:
    """The kept keys lo <= k - q <= hi as comparisons of k with q."""
    def at(c: int) -> str:
        return "q" if c == 0 else f"q + {c}" if c > 0 else f"q - {-c}"
    return " and ".join(b for b in (f"k >= {at(lo)}" if lo is not None else "",
                                    f"k <= {at(hi)}" if hi is not None else "") if b)


_MIRRORED = {"le": "ge", "lt": "gt", "ge": "le", "gt": "lt"}  # a ⋈ b  ⇔  b ⋈' a


def _diagonal_bounds(term: tuple) -> list[tuple[str, int]]:
    """A comparison of the key position k with the query position q plus an integer, read as bounds on
    k - q: ``("upper", c)`` for k - q <= c (causal: c = 0), ``("lower", c)`` for k - q >= c (a sliding
    window of 1 - c keys: transformers writes ``k > q - window``); ``|k - q| <= c`` (ModernBERT's local
    attention) is both. Empty for any other term. Positions are integers, so the strict comparisons are
    the non-strict ones one step in."""
    if term[0] not in _MIRRORED:
        return []
    op, lhs, rhs = term
    if rhs[0] == "abs":  # c ⋈ |e|  ⇔  |e| ⋈' c
        op, lhs, rhs = _MIRRORED[op], rhs, lhs
    if lhs[0] == "abs":
        inner, c = _affine(lhs[1]), _affine(rhs)
        if op not in ("le", "lt") or c is None or c[:2] != (0, 0) or inner is None or inner[2] != 0 \
                or inner[:2] not in ((1, -1), (-1, 1)):
            return []
        reach = c[2] - (op == "lt")  # |k - q| <= reach
        return [("upper", reach), ("lower", -reach)] if reach >= 0 else []
    bound = _diagonal_bound(op, _affine(lhs), _affine(rhs))
    return [bound] if bound else []


def _diagonal_bound(op: str, lhs: tuple | None, rhs: tuple | None) -> tuple[str, int] | None:
    """``lhs ⋈ rhs`` (affine in k and q) as one bound on k - q, or None."""
    if lhs is None or rhs is None:
        return None
    on_k, on_q, const = (a - b for a, b in zip(lhs, rhs))  # lhs - rhs = on_k·k + on_q·q + const, compared to 0
    if (on_k, on_q) == (1, -1):  # (k - q) + const ⋈ 0  ⇔  k - q ⋈ -const
        c = -const
    elif (on_k, on_q) == (-1, 1):  # -(k - q) + const ⋈ 0  ⇔  k - q ⋈' const
        op, c = _MIRRORED[op], const
    else:
        return None
    return {"le": ("upper", c), "lt": ("upper", c - 1), "ge": ("lower", c), "gt": ("lower", c + 1)}[op]


def _affine(expr: tuple) -> tuple[int, int, int] | None:
    """``expr`` as (a, b, c) with expr = a·k + b·q + c over the key (axis 3) and query (axis 2) positions
    and integer constants; None for anything else."""
    if expr == ("axis", 3):
        return 1, 0, 0
    if expr == ("axis", 2):
        return 0, 1, 0
    if expr[0] == "const":
        v = expr[1]
        return (0, 0, int(v)) if isinstance(v, (int, np.integer)) and not isinstance(v, bool) else None
    if expr[0] in ("add", "sub"):
        a, b = _affine(expr[1]), _affine(expr[2])
        if a is None or b is None:
            return None
        sign = 1 if expr[0] == "add" else -1
        return tuple(x + sign * y for x, y in zip(a, b))
    return None
