"""A mask read off what it computes, whatever the spelling: a bias that is a function of ``attention_mask[b, k]``
(and of proved causal or window comparisons) alone, broadcast over heads and query rows.

transformers builds the same padding mask in many spellings — ``(1 - m) · finfo.min`` (BERT's
``get_extended_attention_mask`` in 4.x), ``inverted.masked_fill(inverted.to(bool), finfo.min)``
(``_expand_mask`` / ``AttentionMaskConverter``, 4.3x-4.5x), ``causal.masked_fill(padding.bool(), min)`` for
decoders, ``Where(m == 0, -inf, 0)``, Identity and Cast nodes in between, ``CastLike`` fills — and
exporters add their own. Rather than one proof per spelling, :func:`read_keep` proves the structure and reads
the values:

1. Structure (``mask_cone``): the bias is one scalar function ``f`` of one element of each leaf — the
   ``attention_mask`` graph input (the *source*), boolean keep formulas the symbolic evaluator reads (causal
   and window comparisons), uniform constants — through elementwise ops and pure axis insertions,
   broadcasts and whole slices only. Here the source's batch axis must land on the scores' batch axis and its
   key axis on the key axis (the head and query axes read nothing of it), and each keep formula's axes where
   the formula says: so ``bias[b, h, q, k] = f(m[b, k], c_1(q, k), ...)``.
2. Values (``scalar_ops``): ``f`` is evaluated on scalars, in the graph's element types and with ONNX's
   semantics (never in float64), at every point of its leaves' domains: each keep formula true and false;
   the source at ``False``/``True`` when it is boolean, else as *zero* and *nonzero* where ``f`` looks at
   nothing more than that (a Cast to bool, ``Equal`` with 0, Casts that keep zero zero), which covers every
   value an integer or float mask may hold, exactly. Where ``f`` reads the mask arithmetically
   (``(1 - m) · c``), the two points are 0 and 1: the values transformers documents for ``attention_mask``
   (and ORT's own attention fusion assumes when it turns these masks into ``mask_index``). The mask is
   then exact on those values only, and says so: the plan's report records ``"mask_values": "0 or 1"``
   (``inspect``, the JSON report), never silently.
3. What the values must say: ``f`` is exactly 0 (or -0.0) where a key is kept and one negative value — finite
   or ``-inf`` — everywhere a key is dropped (two different fills, such as ``finfo.min`` and the ``-inf`` of
   ``min + min``, are refused: a row that sees no key would differ); a key is kept exactly when the mask
   entry is nonzero and a conjunction of the keep formulas (or their negations) holds; a masked key is
   dropped at every position. That keep — ``m[b, k] != 0 ∧ causal/window`` — is a formula of the scores'
   indices, which ``masks.keep_formula_mask`` proves to be padding, causal or a window exactly as it proves
   a ``Where(keep, 0, fill)`` the graph computes: with the same dimension checks, and rebuilt in front of the
   fused op by ``mask_inputs`` (``Where(Cast(m, bool)[..], 0, fill)``) entry for entry the graph's bias:
   0 where ``f`` is 0, the fill where ``f`` is the fill. A value that is not 0 where a key is kept, or a
   positive or NaN fill, or a keep that reads the mask where it should be zero (an inverted mask), is refused
   with the values read.

Why exactness holds: where the structure is proved, each bias entry is ``f`` of the leaves' elements at that
entry's index; the leaves' domains are covered (a boolean has two values, an element read only for being zero
has two classes, a keep formula is true or false); and at every covered point the rebuilt bias is the graph's
``f`` bit for bit (0 and the fill are the values ``f`` computes, in its type). Only the arithmetic reading of a
non-boolean mask narrows the domain, to the contract's 0 and 1, and the report says so.

The query axis: a padding mask broadcast over the rows whose query extent is 1, the scores' own, or (in
self-attention) the mask's key length — the fused op checks at run time that the rebuilt bias's rows are the
query's, so a graph whose Add would broadcast the scores up cannot reach it — is taken as broadcast.

Tried after the graph's own bias is refused as it is (``masks.classify``): a finite bias is exact as it is and
stays so; this form serves the masks that tensor cannot be (an infinite fill, a fill that overflows for mask
values outside 0 and 1, dimensions not shown to be the scores').
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from ..graph import GraphView
from ..match import Refused
from ..rule import dtype_name
from ..symbolic import Data, Dim, Evaluator, Index, shift_axes
from ..symbolic.values import axes_read
from . import scalar_ops
from .heads import Heads
from .mask_cone import SOURCE, Leaves, Scalar, read_cone
from .scalar_ops import T, ZeroTest

CONTRACT_VALUES = "0 or 1"  # the attention_mask values a mask read arithmetically is proved on
_NEGATED = {"lt": "ge", "le": "gt", "gt": "le", "ge": "lt"}


@dataclass(frozen=True)
class ReadKeep:
    """The bias read off its values: ``keep`` (a formula of the scores' indices, its extents aligned to [B, N,
    S, L]) where it is 0, ``fill`` elsewhere; ``mask_values`` the source values it is proved on (None: all)."""

    keep: Index
    fill: float
    mask_values: str | None


def read_keep(view: GraphView, ev: Evaluator, bias: str, q: Heads, k: Heads, dtype: int) -> ReadKeep | None:
    """``bias`` read off what it computes (module docstring); None where it is not a function of a mask and
    keep formulas alone; ``Refused`` where it is, but not 0 on kept keys and one negative fill elsewhere."""
    read = read_cone(view, ev, bias)
    if read is None:
        return None
    cone, leaves = read
    if leaves.source is None and not leaves.keeps:
        return None  # a constant: nothing to read it off
    what = f"the bias computed from {_names(leaves)}"
    if cone.fn.dtype != dtype:
        raise Refused(f"{what} is {dtype_name(cone.fn.dtype)}, the scores {dtype_name(dtype)}")
    if len(cone.axes) > 4:
        raise Refused(f"{what} has more than 4 dimensions")
    axes = (frozenset(),) * (4 - len(cone.axes)) + cone.axes
    where = {leaf: a for a, carried in enumerate(axes) for leaf in carried}  # (leaf, its axis) -> scores' axis
    if leaves.source is not None:
        _check_source_axes(ev, leaves.source, where)
    points, mask_values = _evaluated(cone.fn, leaves, what)
    keep, fill = _keep_and_fill(points, leaves, what)
    source = Data(leaves.source, ev.rank(leaves.source), as_bool=True) if leaves.source else None
    expr = _keep_expr(keep, source, leaves, where, what)
    extents = _extents(ev, bias, leaves, axes, len(cone.axes), what)
    _check_broadcasts_onto_scores(ev, bias, len(cone.axes), q, k, what)
    if 2 not in axes_read(expr):
        extents = extents[:2] + (_rows(ev, leaves, extents[2], q, k, what),) + extents[3:]
    return ReadKeep(Index(extents, expr), fill, mask_values)


def _extents(ev: Evaluator, bias: str, leaves: Leaves, axes: tuple, rank: int, what: str) -> tuple:
    """The bias's extents on the scores' four axes: along an axis that reads leaves' axes, their extent, which
    must be one (a leaf broadcast along it would be read at index 0, not at the formula's index), else what
    the forward pass knows of the bias."""
    out = []
    for a, carried in enumerate(axes):
        own = {leaves.keeps[leaf[1]][1].extents[j] if leaf != SOURCE else ev.dim(leaves.source, j)
               for leaf, j in carried}
        if len(own) > 1:
            raise Refused(f"{what} meets extents {' and '.join(sorted(map(repr, own)))} along one axis, not shown "
                          "equal")
        out.append(own.pop() if own else Dim(1) if a < 4 - rank else ev.dim(bias, a - (4 - rank)))
    return tuple(out)


def _check_broadcasts_onto_scores(ev: Evaluator, bias: str, rank: int, q: Heads, k: Heads, what: str) -> None:
    """The bias does not broadcast the scores [B, N, S, T] up. The rebuilt mask has the scores' shape, so a bias
    dimension fixed at a size above 1 that the scores' is not shown to be (an Expand to a batch of 2, added to
    scores of batch 1, widens the graph's sum to 2) would give the fused op another output shape than the
    graph's. Dimensions the model's inputs name (the mask's key length beside the keys') are the inputs'
    contract: the graph runs only where they agree or one is 1, and the leaves' extents are checked above."""
    dims = (Dim(1),) * (4 - rank) + tuple(ev.dim(bias, j) for j in range(rank))
    scores = (q.batch, Dim(q.heads), q.seq, k.seq)
    for j, (d, s) in enumerate(zip(dims, scores)):
        if d.is_int and d.coef > 1 and d != s:
            raise Refused(f"{what}: its dimension {j} ({d}) is not shown to be 1 or the scores' ({s})")


def _names(leaves: Leaves) -> str:
    parts = ([f"'{leaves.source}'"] if leaves.source else []) + [f"'{name}'" for name, _ in leaves.keeps]
    return " and ".join(parts)


def _check_source_axes(ev: Evaluator, source: str, where: dict) -> None:
    """The source's batch axis is read along the scores' batch axis and its key axis along the key axis."""
    rank = ev.rank(source)
    landed = {a: where.get((SOURCE, a)) for a in range(rank) if (SOURCE, a) in where}
    wanted = {0: 0, rank - 1: 3}
    for a, at in landed.items():
        if wanted.get(a) != at:
            names = {0: "batch", 1: "head", 2: "query", 3: "key"}
            raise Refused(f"the bias reads '{source}' axis {a} along the scores' {names[at]} axis: not a padding "
                          "mask [batch, key] broadcast over heads and query rows")


def _source_points(source_type: int) -> list[list]:
    """The source's points to evaluate at: covering every value (booleans; zero/nonzero), then the contract's."""
    if source_type == T.BOOL:
        return [[scalar_ops.typed(False, T.BOOL), scalar_ops.typed(True, T.BOOL)]]
    return [[ZeroTest(False, source_type), ZeroTest(True, source_type)],
            [scalar_ops.typed(0, source_type), scalar_ops.typed(1, source_type)]]


def _evaluated(fn: Scalar, leaves: Leaves, what: str) -> tuple[dict, str | None]:
    """``f`` at every point of its leaves' domains: {(source point 0|1 or None, keep values...): value}, and
    the source values that covers (None: all of them)."""
    keeps = [(False, True)] * len(leaves.keeps)
    tries = _source_points(_source_type(fn)) if leaves.source is not None else [[None]]
    for attempt, source_points in enumerate(tries):
        try:
            points = {}
            for s, source_value in enumerate(source_points):
                for keep_values in itertools.product(*keeps):
                    env = {SOURCE: source_value, **{("keep", i): v for i, v in enumerate(keep_values)}}
                    value = _evaluate(fn, env)
                    if isinstance(value, ZeroTest):
                        raise scalar_ops.NeedsValue
                    points[(s if source_value is not None else None,) + keep_values] = value
        except scalar_ops.NeedsValue:
            continue
        except scalar_ops.Undefined:
            raise Refused(f"{what} computes a value ONNX leaves undefined, or an op not modelled, at the mask's "
                          "values") from None
        return points, (CONTRACT_VALUES if attempt == 1 else None)
    raise Refused(f"{what} cannot be evaluated at the mask's values")  # (a bool source never needs values)


def _source_type(fn: Scalar) -> int | None:
    if fn.op == SOURCE:
        return fn.dtype
    for a in fn.args:
        t = _source_type(a)
        if t is not None:
            return t
    return None


def _evaluate(fn: Scalar, env: dict):
    if fn.op == SOURCE:
        return env[SOURCE]
    if fn.op == "keep":
        return scalar_ops.typed(env[("keep", fn.value)], T.BOOL)
    if fn.op == "const":
        return fn.value
    return scalar_ops.apply(fn.op, [_evaluate(a, env) for a in fn.args], to=fn.dtype)


def _show(value) -> str:
    v = float(value)
    return repr(v) if math.isinf(v) or math.isnan(v) else f"{v:g}"


def _keep_and_fill(points: dict, leaves: Leaves, what: str) -> tuple[dict, float]:
    """Which points keep the key (the bias is 0 there) and the one fill of the others."""
    keep = {p: bool(v == 0) for p, v in points.items()}
    dropped = {p: v for p, v in points.items() if not keep[p]}
    if leaves.source is not None and not leaves.keeps:
        kept_value, masked_value = points[(1,)], points[(0,)]
        says = f"{what} is {_show(kept_value)} where the mask keeps a key and {_show(masked_value)} where it masks one"
    else:
        says = f"{what} takes the values {', '.join(sorted({_show(v) for v in points.values()}))}"
    fills = {v.tobytes() for v in dropped.values()}
    if len(fills) > 1:
        raise Refused(f"{says}: dropped keys get different fills, so a row that sees no key would differ")
    if dropped:
        fill = next(iter(dropped.values()))
        if np.isnan(fill) or not fill < 0:
            raise Refused(f"{says}: not 0 on a kept key and a negative fill on a dropped one")
        return keep, float(fill)
    return keep, -math.inf  # keeps every key


def _keep_expr(keep: dict, source: Data | None, leaves: Leaves, where: dict, what: str) -> tuple:
    """The keep as a formula of the scores' indices: ``source[b, k] != 0`` (where it depends on the mask) and
    the conjunction of keep formulas (or their negations) it is on the other leaves."""
    n = len(leaves.keeps)
    terms = []
    if leaves.source is not None:
        masked = [keep[(0,) + c] for c in itertools.product((False, True), repeat=n)]
        kept = {c: keep[(1,) + c] for c in itertools.product((False, True), repeat=n)}
        if any(masked) and masked != list(kept.values()):
            raise Refused(f"{what} keeps keys where the mask is 0 (an inverted mask) or does not drop them everywhere")
        if not any(masked):
            terms.append(("data", source, ("axis", 0), ("axis", 3)))
    else:
        kept = {c[1:]: v for c, v in keep.items()}
    true = [c for c, v in kept.items() if v]
    if not true:
        raise Refused(f"{what} drops every key")
    for i, (name, formula) in enumerate(leaves.keeps):
        values = {c[i] for c in true}
        if len(values) == 2:
            continue
        term = shift_axes(formula.expr, lambda a, i=i: where[(("keep", i), a)])
        terms.append(term if values == {True} else _negated(term, name))
    free = sum(len({c[i] for c in true}) == 2 for i in range(n))
    if len(true) != 2 ** free:
        raise Refused(f"{what} keeps keys where its keep formulas are not a conjunction (an Or of them)")
    expr = terms[0] if terms else ("const", True)
    for t in terms[1:]:
        expr = ("and", expr, t)
    return expr


def _negated(term: tuple, name: str) -> tuple:
    if term[0] in _NEGATED:
        return (_NEGATED[term[0]], term[1], term[2])
    raise Refused(f"the mask keeps keys where '{name}' is false, which is not a comparison that can be turned")


def _rows(ev: Evaluator, leaves: Leaves, rows: Dim, q: Heads, k: Heads, what: str) -> Dim:
    """The query extent of a mask broadcast over the rows, shown not to broadcast the scores up: 1 for the proof."""
    key_length = ev.dim(leaves.source, ev.rank(leaves.source) - 1) if leaves.source else None
    if rows in (Dim(1), q.seq) or (q.seq == k.seq and rows == key_length):
        return Dim(1)
    raise Refused(f"{what} has {rows} query rows, not shown to be 1 or the scores' ({q.seq})")
