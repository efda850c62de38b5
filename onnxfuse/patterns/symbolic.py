"""Symbolic evaluation of the small integer and boolean subgraphs that exporters write around attention:
reshape targets built from ``Shape`` slices, and attention masks built from index ranges.

Nothing here runs the model. A value is one of:

* :class:`Vec` — a small int64 vector (or scalar) whose elements are :class:`Dim` monomials: products of
  integers and symbolic dimensions (``Shape(x)[i]``);
* :class:`Index` — a tensor given by a formula of its own indices: ``Range(0, n)`` is the tensor whose
  element at position ``i`` is ``i``; Unsqueeze/Expand/compare/And/Add/Mul/GatherND build formulas of
  those. Its ``extents`` are Dims (1 for a broadcast axis);
* :class:`Data` — a tensor of unknown values the formula may index into (an ``attention_mask``);
  :class:`FlatData` is such a tensor seen through ``Flatten``.

Dimensions come from one forward pass (:meth:`Evaluator.shapes`) that carries each output dimension over
from the input it is (Transpose, MatMul, broadcasting, normalisations, Reshape to a target read here, each
output of a Split by its constant size, Slices at bounds read here, Concats), down from the graph inputs;
elsewhere shape inference's: an int, or a ``dim_param``/inferred symbol (two tensors whose dims carry the
same symbol have the same size: that is what the ONNX symbol means). A dimension neither knows stays
``Shape(x)[i]`` of its tensor, equal only to itself. Two dimensions are proved equal only by being the
same value here; anything else is "not shown", and the caller refuses. Element types are carried forward
the same way (:meth:`Evaluator.dtype`) where shape inference typed nothing.

Anything the evaluator does not model (another op, a non-uniform constant, a formula it cannot simplify)
raises :class:`NotSymbolic` with a reason; a caller that needs a proof then refuses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import onnx

from .graph import GraphView, attr

T = onnx.TensorProto
INT64_MAX = 2**63 - 1
_INDEX_DTYPES = (T.INT64, T.INT32, T.BOOL)
_MAX_DEPTH = 200  # ops between a mask or shape and its sources; exporters write a few dozen
# Ops whose (first) output has exactly the first input's dimensions, in any domain.
_SAME_SHAPE_OPS = {"Softmax", "Cast", "IsNaN", "Identity", "Relu", "Tanh", "Erf", "Sigmoid", "Sqrt", "Neg",
                   "Not", "Gelu", "FastGelu", "BiasGelu", "QuickGelu", "Dropout"}
_NORMALIZATIONS = {"LayerNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization",
                   "SkipSimplifiedLayerNormalization"}
_CONTRIB_TYPED = {"SkipLayerNormalization", "FastGelu", "BiasGelu", "QuickGelu", "Gelu"}  # com.microsoft, T→T
# ORT's Skip*LayerNormalization also returns input + skip (+ bias), the residual stream, as output 3: the
# input's dimensions and type (ORT's optimizer routes the next block's residual through it, e.g. GPT-NeoX).
_SKIP_NORMALIZATIONS = {"SkipLayerNormalization", "SkipSimplifiedLayerNormalization"}
_SKIP_SUM_OUTPUT = 3


def _is_skip_sum(node, k: int) -> bool:
    return node.op_type in _SKIP_NORMALIZATIONS and k == _SKIP_SUM_OUTPUT
# Elementwise ops of one operand, followed by the forward pass only (their values are not modelled).
_UNARY_OPS = {"Abs", "Log", "Exp", "Floor", "Ceil", "Round", "Reciprocal", "Sign", "Cos", "Sin"}
_BROADCAST_OPS = {"Add", "Sub", "Mul", "Div", "Pow", "Where", "And", "Or", "Equal", "Less", "LessOrEqual",
                  "Greater", "GreaterOrEqual", "Max", "Min"}
# Reductions: the reduced axes become 1 (keepdims, the default) or go; the others stay. RMSNorm's ReduceMean
# is where shape inference loses batch and sequence once ORT's float16 converter has wrapped it in Casts.
_REDUCE_OPS = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare", "ReduceL1",
               "ReduceL2", "ReduceLogSum", "ReduceLogSumExp"}


# Ops whose (first) output has their operands' element type, with the operands that carry it (ONNX and ORT
# tie those to one type variable T), for :meth:`Evaluator.dtype`.
_TYPE_KEEPING = {**{op: (0,) for op in ("Softmax", "Identity", "Relu", "Tanh", "Erf", "Sigmoid", "Sqrt", "Neg",
                                        "Gelu", "FastGelu", "BiasGelu", "QuickGelu", "Dropout", "Transpose",
                                        "Reshape", "Split", "Squeeze", "Unsqueeze", "LayerNormalization",
                                        "SkipLayerNormalization")},
                 **{op: (0, 1) for op in ("Add", "Sub", "Mul", "Div", "MatMul", "Max", "Min")},
                 "Where": (1, 2)}


class NotSymbolic(Exception):
    """The value cannot be followed symbolically; the message says where and why."""


# --- dimensions -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Dim:
    """``coef · Π factors``: an integer (no factors) or a product of symbolic dimensions."""

    coef: int
    factors: tuple = ()

    @property
    def is_int(self) -> bool:
        return not self.factors

    def __mul__(self, other: Dim) -> Dim:
        return Dim(self.coef * other.coef, tuple(sorted(self.factors + other.factors, key=repr)))

    def divide(self, other: Dim) -> Dim | None:
        """``self / other`` when it is exact as monomials, else None."""
        if other.coef == 0 or self.coef % other.coef:
            return None
        rest = list(self.factors)
        for f in other.factors:
            if f not in rest:
                return None
            rest.remove(f)
        return Dim(self.coef // other.coef, tuple(rest))

    def quotient(self, other: Dim) -> Dim:
        """``self / other``: exact as monomials, or one opaque symbol naming the quotient (two quotients
        of the same dimensions are the same symbol, which is all a proof here needs)."""
        q = self.divide(other)
        return q if q is not None else Dim(1, (f"({self!r})/({other!r})",))

    def __repr__(self) -> str:
        parts = ([str(self.coef)] if self.coef != 1 or not self.factors else []) + [str(f) for f in self.factors]
        return "·".join(parts)


def clamp_dim(op: str, x: Dim, y: Dim) -> Dim:
    """The symbol of ``min(x, y)`` / ``max(x, y)`` (an int first, as sympy orders them)."""
    a, b = sorted((repr(x), repr(y)), key=lambda r: (not r.lstrip("-").isdigit(), r))
    return Dim(1, (f"{op.capitalize()}({a}, {b})",))


_CLAMPED = re.compile(r"^Min\((\d+), (.+)\)$")


def clamped_to(d: Dim) -> tuple[int, str] | None:
    """(c, the other's spelling) for a dimension ``Min(c, x)``, else None."""
    m = _CLAMPED.match(d.factors[0]) if d.coef == 1 and len(d.factors) == 1 else None
    return (int(m.group(1)), m.group(2)) if m else None


def inferred_dim(view: GraphView, name: str, axis: int) -> Dim:
    """Dimension ``axis`` of ``name`` as shape inference knows it (int or symbol), or ``Shape(name)[axis]``."""
    shape = view.shape(name)
    if shape is not None and -len(shape) <= axis < len(shape):
        d = shape[axis]
        if isinstance(d, int):
            return Dim(d)
        if isinstance(d, str) and d:
            return Dim(1, (d,))
        axis %= len(shape)
    return Dim(1, (f"{name}[{axis}]",))


# --- values -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Vec:
    items: tuple  # of Dim
    scalar: bool = False


@dataclass(frozen=True)
class BoolVec:
    items: tuple  # of bool


@dataclass(frozen=True)
class Index:
    extents: tuple  # of Dim
    expr: tuple  # formula (see module docstring)


@dataclass(frozen=True)
class Data:
    name: str  # the tensor whose (unknown) values the formula reads
    rank: int
    as_bool: bool = False  # read through Cast(to=bool): "nonzero"


@dataclass(frozen=True)
class FlatData:
    data: Data
    cols: Dim  # elements per row of the rank-2 source: Flatten(x)[i] = x[i // cols, i % cols]


Value = Vec | BoolVec | Index | Data | FlatData

TRUE = ("const", True)


def axis(a: int) -> tuple:
    return ("axis", a)


def shift_axes(expr: tuple, mapping) -> tuple:
    if expr[0] == "axis":
        return ("axis", mapping(expr[1]))
    if expr[0] == "const":
        return expr
    if expr[0] == "data":
        return ("data", expr[1], *(shift_axes(e, mapping) for e in expr[2:]))
    if expr[0] == "flatdata":
        return ("flatdata", expr[1], expr[2], shift_axes(expr[3], mapping))
    return (expr[0], *(shift_axes(e, mapping) for e in expr[1:]))


def _broadcast(a: tuple, b: tuple, where: str) -> tuple:
    """Numpy broadcast of two extent tuples (right-aligned); an axis of extent 1 takes the other's."""
    n = max(len(a), len(b))
    a = (Dim(1),) * (n - len(a)) + tuple(a)
    b = (Dim(1),) * (n - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b):
        if x == y or y == Dim(1):
            out.append(x)
        elif x == Dim(1):
            out.append(y)
        else:
            raise NotSymbolic(f"{where}: cannot show that extents {x} and {y} broadcast")
    return tuple(out)


def _aligned(v: Index, rank: int) -> Index:
    """``v`` with leading broadcast axes added up to ``rank`` (its formula's axes shift right)."""
    k = rank - len(v.extents)
    if k <= 0:
        return v
    return Index((Dim(1),) * k + v.extents, shift_axes(v.expr, lambda a: a + k))


# --- the evaluator ----------------------------------------------------------------------------------
class Evaluator:
    """Follows tensors back through the ops it models, each tensor once."""

    def __init__(self, view: GraphView):
        self.view = view
        self.memo: dict[str, Value | NotSymbolic] = {}  # failures too: each tensor is followed once
        self.dims: dict[tuple[str, int], Dim] = {}  # proved by the caller (seed)
        self._shapes: dict[str, tuple | None] | None = None
        self._dtypes: dict[str, int | None] | None = None
        self.depth = 0

    # -- dimensions --
    def dim(self, name: str, axis: int) -> Dim:
        """Dimension ``axis`` (>= 0) of ``name``: from :meth:`shapes` where the forward pass knows it, else
        what shape inference says (an int, a symbol, or ``Shape(name)[axis]`` itself)."""
        if (name, axis) in self.dims:
            return self.dims[(name, axis)]
        dims = self.shapes().get(name)
        if dims is not None and axis < len(dims) and dims[axis] is not None:
            return dims[axis]
        return inferred_dim(self.view, name, axis)

    def rank(self, name: str) -> int | None:
        dims = self.shapes().get(name)
        if dims is not None:
            return len(dims)
        shape = self.view.shape(name)
        return None if shape is None else len(shape)

    def dtype(self, name: str) -> int | None:
        """The element type of ``name``: shape inference's, or where it typed nothing (it stops at ORT's
        contrib ops and at ops newer than the model's opset), carried forward from the inputs through
        the ops that keep their operands' type (all operands that are typed agreeing) and Casts."""
        if self._dtypes is None:
            self._dtypes = {}
            for node in self.view.nodes:
                for k, out in enumerate(node.output):
                    if out:
                        self._dtypes[out] = self.view.dtype(out) or (self._forward_dtype(node) if k == 0 or
                                                                    node.op_type == "Split" or _is_skip_sum(node, k)
                                                                    else None)
        if name in self._dtypes:
            return self._dtypes[name]
        return self.view.dtype(name)

    def _forward_dtype(self, node) -> int | None:
        if node.op_type == "Cast" and node.domain in ("", "ai.onnx"):
            return attr(node, "to")
        carriers = _TYPE_KEEPING.get(node.op_type)
        if carriers is None or (node.domain not in ("", "ai.onnx") and node.op_type not in _CONTRIB_TYPED):
            return None
        types = {self._dtypes.get(x) or self.view.dtype(x) for j, x in enumerate(node.input) if j in carriers and x}
        types.discard(None)
        return types.pop() if len(types) == 1 else None

    def seed(self, name: str, dims: tuple) -> None:
        """Record dimensions the caller has proved: from now on ``name`` has them, and so does everything
        the forward pass derives from it (which is run again, as are the values that read shapes)."""
        for axis, d in enumerate(dims):
            self.dims[(name, axis)] = d
        self._shapes = None
        self.memo.clear()

    def shapes(self) -> dict[str, tuple | None]:
        """Every tensor's dimensions, by one forward pass over the nodes (in their topological order):
        through the ops that only move or broadcast dimensions each output dimension *is* an input's,
        traced back to the graph inputs' own; elsewhere what shape inference gives. Shape inference alone
        loses these equalities at every op it cannot type precisely (its fresh ``unk__`` symbols, and
        ORT's contrib ops, which it does not know at all); the trace keeps them."""
        if self._shapes is None:
            self._shapes = {}
            for name in self.view.graph_inputs | set(self.view.initializers):
                self._shapes[name] = self._inferred(name)
            for node in self.view.nodes:
                for k, out in enumerate(node.output):
                    if out:
                        traced = self._forward(node, k)
                        self._shapes[out] = self._merge(traced, self._inferred(out))
                        if (out, 0) in self.dims:  # seeded
                            rank = len(self._shapes[out] or ()) or 1 + max(a for n, a in self.dims if n == out)
                            self._shapes[out] = tuple(self.dims.get((out, a)) for a in range(rank))
        return self._shapes

    def _inferred(self, name: str) -> tuple | None:
        shape = self.view.shape(name)
        return None if shape is None else tuple(inferred_dim(self.view, name, a) for a in range(len(shape)))

    @staticmethod
    def _merge(traced: tuple | None, inferred: tuple | None) -> tuple | None:
        if traced is None:
            return inferred
        if inferred is not None and len(inferred) == len(traced):
            return tuple(t if t is not None else i for t, i in zip(traced, inferred))
        return traced

    def _in(self, name: str) -> tuple | None:
        if not name:
            return None
        if name not in self._shapes:  # (an outer-scope or constant-node tensor)
            self._shapes[name] = self._inferred(name)
        return self._shapes[name]

    def _forward(self, node, k: int) -> tuple | None:
        """Output ``k``'s dimensions from its inputs', or None (then shape inference's are used)."""
        op = node.op_type
        # of the ops followed here, only Split and the skip normalizations' sum have more than one traced output
        if k != 0 and op != "Split" and not _is_skip_sum(node, k):
            return None
        ins = [self._in(x) for x in node.input]
        x0 = ins[0] if ins else None
        if op in _SAME_SHAPE_OPS or (op in _NORMALIZATIONS and k == 0) or _is_skip_sum(node, k):
            return x0
        if node.domain not in ("", "ai.onnx"):
            return None
        if op in _UNARY_OPS:
            return x0
        if op == "Unsqueeze" and x0 is not None:
            axes = attr(node, "axes", None)
            try:
                axes = [int(a) for a in axes] if axes is not None else [d.coef for d in self.vec(node.input[1]).items]
            except NotSymbolic:
                return None
            rank = len(x0) + len(axes)
            axes = {a % rank for a in axes}
            rest = iter(x0)
            return tuple(Dim(1) if a in axes else next(rest) for a in range(rank)) if len(axes) == len(set(axes)) else None
        if op == "Squeeze" and x0 is not None:
            # with its axes given (ModernBERT's unbind of q, k, v from [B, S, 3, N, H]); without them it drops
            # every axis that is 1 at run time, which a symbolic dimension does not tell
            axes = attr(node, "axes", None)
            try:
                axes = [Dim(int(a)) for a in axes] if axes is not None else (
                    list(self.vec(node.input[1]).items) if len(node.input) > 1 and node.input[1] else None)
            except NotSymbolic:
                return None
            if not axes or not all(d.is_int for d in axes):
                return None
            axes = [d.coef for d in axes]
            if not all(-len(x0) <= a < len(x0) for a in axes):
                return None
            axes = {a % len(x0) for a in axes}
            return tuple(d for j, d in enumerate(x0) if j not in axes)
        if op == "Tile" and x0 is not None:  # GPT-J's repeat_interleave of its rotary tables
            try:
                repeats = self.vec(node.input[1]).items
            except NotSymbolic:
                return None
            if len(repeats) != len(x0):
                return None
            return tuple(d if r == Dim(1) else Dim(d.coef * r.coef) if d is not None and d.is_int and r.is_int
                         else None for d, r in zip(x0, repeats))
        if op in ("Expand", "ConstantOfShape", "Range"):
            try:
                if op == "Range":  # Range(0, n, 1) has n elements
                    start, limit, delta = (self.vec(x).items for x in node.input[:3])
                    return (limit[0],) if start == (Dim(0),) and delta == (Dim(1),) else None
                target = self.vec(node.input[1 if op == "Expand" else 0]).items
            except NotSymbolic:
                return None
            if op == "ConstantOfShape":
                return tuple(target)
            return _broadcast_dims([x0, tuple(target)]) if x0 is not None else None
        if op in _REDUCE_OPS and x0 is not None:
            return self._reduced(node, x0)
        if op == "Transpose" and x0 is not None:
            perm = attr(node, "perm", None) or list(range(len(x0)))[::-1]
            return tuple(x0[p] for p in perm) if len(perm) == len(x0) else None
        if op in _BROADCAST_OPS:
            operands = [d for d, name in zip(ins, node.input) if name]
            if any(d is None for d in operands):
                return None
            return _broadcast_dims(operands)
        if op == "MatMul" and len(ins) == 2 and all(d is not None and len(d) >= 2 for d in ins):
            a, b = ins
            batch = _broadcast_dims([a[:-2], b[:-2]])
            return batch + (a[-2], b[-1])
        if op == "GatherElements" and len(ins) == 2:  # the indices' shape
            return ins[1]
        if op == "Gather" and len(ins) == 2 and all(d is not None for d in ins):
            data, idx = ins
            ax = attr(node, "axis", 0) % max(len(data), 1)
            return data[:ax] + idx + data[ax + 1:]
        if op == "Reshape" and x0 is not None:
            try:
                target = self.vec(node.input[1]).items
            except NotSymbolic:
                return None
            copy = not attr(node, "allowzero", 0)
            out = [x0[j] if (t == Dim(0) and copy and j < len(x0)) else t for j, t in enumerate(target)]
            if out.count(Dim(-1)) == 1:  # the element count over the other dimensions
                j = out.index(Dim(-1))
                others = [d for m, d in enumerate(out) if m != j]
                known = None not in x0 and None not in others
                out[j] = _product(x0).quotient(_product(others)) if known else None
            return tuple(out) if Dim(-1) not in out else None
        if op == "Split" and x0 is not None and x0:
            ax = attr(node, "axis", 0) % len(x0)
            return x0[:ax] + (self._split_size(node, k, x0[ax]),) + x0[ax + 1:]
        if op == "Slice" and x0 is not None:
            return self._sliced(node, x0)
        if op == "Concat" and ins and all(d is not None and len(d) == len(x0) for d in ins) and x0:
            ax = attr(node, "axis", 0) % len(x0)
            # the node fails unless the operands agree off the axis: any operand's dimension is the output's
            along = [d[ax] for d in ins]
            # operands empty along the axis add nothing: a one-operand Concat (what the TorchScript exporter
            # leaves of a key/value cache appended to an empty one, LLaMA-class decoders) is its operand
            along = [d for d in along if d != Dim(0)] or [Dim(0)]
            if len(along) == 1:
                total = along[0]
            else:
                total = Dim(sum(d.coef for d in along)) if all(d is not None and d.is_int for d in along) else None
            off = [next((d[j] for d in ins if d[j] is not None), None) for j in range(len(x0))]
            return tuple(total if j == ax else off[j] for j in range(len(x0)))
        return None

    def _reduced(self, node, x0: tuple) -> tuple | None:
        """A Reduce* op's output: axes from the attribute (before opset 18) or the second input; none given
        reduces every axis, unless noop_with_empty_axes, which returns the input's shape."""
        axes = attr(node, "axes", None)
        try:
            if axes is None and len(node.input) > 1 and node.input[1]:
                items = self.vec(node.input[1]).items
                if not all(d.is_int for d in items):
                    return None
                axes = [d.coef for d in items]
        except NotSymbolic:
            return None
        if not axes:
            if attr(node, "noop_with_empty_axes", 0):
                return x0
            axes = range(len(x0))
        if not all(-len(x0) <= int(a) < len(x0) for a in axes):
            return None
        reduced = {int(a) % len(x0) for a in axes}
        if attr(node, "keepdims", 1):
            return tuple(Dim(1) if j in reduced else d for j, d in enumerate(x0))
        return tuple(d for j, d in enumerate(x0) if j not in reduced)

    def _sliced(self, node, x0: tuple) -> tuple | None:
        """Slice (opset 10 on: starts, ends, axes, steps as inputs; before: attributes) of a tensor: the
        axes it does not slice keep their dimensions; a sliced one is known where its extent and the
        bounds are ints, or where it is taken whole (from 0 to the end, step 1)."""
        try:
            if len(node.input) > 1:
                starts, ends = (self.vec(x).items for x in node.input[1:3])
                axes = self.vec(node.input[3]).items if len(node.input) > 3 and node.input[3] else None
                steps = self.vec(node.input[4]).items if len(node.input) > 4 and node.input[4] else None
            else:
                starts, ends = (tuple(Dim(int(v)) for v in attr(node, a, ())) for a in ("starts", "ends"))
                axes = tuple(Dim(int(v)) for v in attr(node, "axes", ())) or None
                steps = None
        except NotSymbolic:
            return None
        axes = tuple(Dim(a) for a in range(len(starts))) if axes is None else axes
        steps = (Dim(1),) * len(starts) if steps is None else steps
        if not len(starts) == len(ends) == len(axes) == len(steps) or not all(a.is_int for a in axes):
            return None
        out = list(x0)
        for a, s, e, st in zip(axes, starts, ends, steps):
            j = a.coef % len(x0) if -len(x0) <= a.coef < len(x0) else None
            if j is None:
                return None
            n = x0[j]
            if s == Dim(0) and e.is_int and e.coef >= INT64_MAX and st == Dim(1):
                continue  # the whole axis
            out[j] = self._slice_extent(node, n, s, e, st)
        return tuple(out)

    def _slice_extent(self, node, n: Dim | None, s: Dim, e: Dim, st: Dim) -> Dim | None:
        """The extent of an axis of extent ``n`` sliced from ``s`` to ``e`` by ``st``: known where all four
        are ints."""
        if n is None or not (n.is_int and s.is_int and e.is_int and st.is_int) or st.coef == 0:
            return None
        return Dim(len(range(*slice(s.coef, e.coef, st.coef).indices(n.coef))))

    def _split_size(self, node, k: int, whole: Dim | None) -> Dim | None:
        """The extent of Split output ``k`` along the split axis: its entry of the ``split`` sizes (input
        or, before opset 13, attribute), or for an even split of a known int its share; else None."""
        sizes = None
        if len(node.input) > 1 and node.input[1]:
            try:
                sizes = self.vec(node.input[1]).items
            except NotSymbolic:
                return None
        elif attr(node, "split", None) is not None:
            sizes = tuple(Dim(int(n)) for n in attr(node, "split"))
        if sizes is not None:
            # the sizes must account for the whole axis, or the node fails (and nothing is proved)
            known = whole is not None and all(d.is_int for d in sizes) and whole.is_int
            if len(sizes) != len(node.output) or not known or sum(d.coef for d in sizes) != whole.coef:
                return None
            return sizes[k]
        parts = attr(node, "num_outputs", None) or len(node.output)
        if whole is not None and whole.is_int and whole.coef % parts == 0:
            return Dim(whole.coef // parts)
        return None

    def value(self, name: str) -> Value:
        if name not in self.memo:
            if self.depth > _MAX_DEPTH:
                raise NotSymbolic(f"'{name}' is more than {_MAX_DEPTH} ops away")
            self.depth += 1
            try:
                self.memo[name] = self._evaluate(name)
            except NotSymbolic as e:
                self.memo[name] = e
            finally:
                self.depth -= 1
        v = self.memo[name]
        if isinstance(v, NotSymbolic):
            raise v
        return v

    def vec(self, name: str) -> Vec:
        v = self.value(name)
        if not isinstance(v, Vec):
            raise NotSymbolic(f"'{name}' is not a small integer vector")
        return v

    def index(self, name: str) -> Index:
        v = _as_index(self.value(name))
        if not isinstance(v, Index):
            raise NotSymbolic(f"'{name}' is not an index formula")
        return v

    # -- leaves --
    def _constant(self, name: str) -> Value | None:
        t = self.view.constant(name)
        if t is None:
            return None
        value = self.view.small_value(name, max_elements=4096)
        if value is None:
            raise NotSymbolic(f"constant '{name}' is too large to read")
        if t.data_type in (T.INT64, T.INT32) and value.ndim <= 1:
            return Vec(tuple(Dim(int(x)) for x in value.reshape(-1)), scalar=value.ndim == 0)
        flat = value.reshape(-1)
        if flat.size and np.all(flat == flat[0]):  # a uniform constant of any rank: its one value
            item = flat[0].item()
            return Index(tuple(Dim(int(d)) for d in t.dims), ("const", item))
        if flat.size == 0 and t.data_type in (T.INT64, T.INT32):
            return Vec((), scalar=False)
        raise NotSymbolic(f"constant '{name}' is not uniform (a literal mask is not modelled)")

    def _evaluate(self, name: str) -> Value:
        c = self._constant(name)
        if c is not None:
            return c
        i = self.view.producer.get(name)
        dtype = self.view.dtype(name)
        if (dtype is not None and dtype not in _INDEX_DTYPES) or i is None:
            # shapes, indices and masks are integers or booleans: a float tensor is data (an activation),
            # never followed further (which would walk back through the whole network)
            rank = self.rank(name)
            if rank is None:
                raise NotSymbolic(f"the rank of '{name}' is unknown")
            return Data(name, rank)
        node = self.view.nodes[i]
        handler = getattr(self, f"_op_{node.op_type}", None) if node.domain in ("", "ai.onnx") else None
        if handler is None:
            rank = self.rank(name)
            if rank is None:
                raise NotSymbolic(f"{node.op_type} '{self.view.node_name(i)}' is not modelled")
            return Data(name, rank)
        return handler(node, name)

    # -- shape arithmetic --
    def _op_Shape(self, node, _):
        src = node.input[0]
        try:
            v = self.value(src)
        except NotSymbolic:
            v = None
        if isinstance(v, Index):
            dims = v.extents
        elif isinstance(v, Vec):
            dims = () if v.scalar else (Dim(len(v.items)),)
        else:
            rank = self.rank(src)
            if rank is None:
                raise NotSymbolic(f"the rank of '{src}' is unknown")
            dims = tuple(self.dim(src, a) for a in range(rank))
        start, end = attr(node, "start", 0), attr(node, "end", None)
        return Vec(tuple(dims[slice(start, end)]))

    def _op_Gather(self, node, _):
        data = self.value(node.input[0])
        if isinstance(data, FlatData):
            idx = self.index(node.input[1])
            if attr(node, "axis", 0) != 0:
                raise NotSymbolic("Gather of a flattened tensor on an axis other than 0")
            return Index(idx.extents + (Dim(1),), ("flatdata", data.data, data.cols, idx.expr))
        if not isinstance(data, Vec):
            raise NotSymbolic("Gather of a tensor that is neither a shape nor a flattened mask")
        ind = self.vec(node.input[1])
        picked = []
        for d in ind.items:
            if not d.is_int or not -len(data.items) <= d.coef < len(data.items):
                raise NotSymbolic("Gather of a shape at an unknown position")
            picked.append(data.items[d.coef])
        return Vec(tuple(picked), scalar=ind.scalar)

    def _op_Slice(self, node, _):
        data = self.vec(node.input[0])
        starts, ends = self.vec(node.input[1]).items, self.vec(node.input[2]).items
        if len(node.input) > 3 and node.input[3] and [d.coef for d in self.vec(node.input[3]).items] != [0]:
            raise NotSymbolic("Slice of a shape on an axis other than 0")
        if len(node.input) > 4 and node.input[4] and [d.coef for d in self.vec(node.input[4]).items] != [1]:
            raise NotSymbolic("Slice of a shape with a step")
        if len(starts) != 1 or len(ends) != 1 or not starts[0].is_int or not ends[0].is_int:
            raise NotSymbolic("Slice of a shape at unknown positions")
        n = len(data.items)
        s, e = (max(min(x.coef, INT64_MAX), -INT64_MAX) for x in (starts[0], ends[0]))
        return Vec(data.items[slice(*slice(s, e).indices(n)[:2])])

    def _op_Concat(self, node, _):
        parts = [self.value(x) for x in node.input]
        if all(isinstance(p, Vec) for p in parts):
            return Vec(tuple(d for p in parts for d in p.items))
        if all(isinstance(p, Index) for p in parts) and len(parts) == 2:
            a, b = parts
            ax = attr(node, "axis", 0)
            if ax not in (-1, len(a.extents) - 1) or a.extents[-1:] != (Dim(1),) or b.extents[-1:] != (Dim(1),):
                raise NotSymbolic("Concat of index tensors other than stacking on a new last axis")
            ext = _broadcast(a.extents[:-1], b.extents[:-1], "Concat")
            return Index(ext + (Dim(2),), ("stack", a.expr, b.expr))
        raise NotSymbolic("Concat of values of different kinds")

    def _op_Squeeze(self, node, _):
        v = self.value(node.input[0])
        if isinstance(v, Vec) and len(v.items) == 1:
            return Vec(v.items, scalar=True)
        raise NotSymbolic("Squeeze of something other than a one-element shape")

    def _op_Unsqueeze(self, node, _):
        v = self.value(node.input[0])
        axes = attr(node, "axes", None)
        if axes is None:
            axes = [d.coef for d in self.vec(node.input[1]).items]
        if isinstance(v, Vec):
            if v.scalar and list(axes) == [0]:
                return Vec(v.items)
            raise NotSymbolic("Unsqueeze of a shape vector")
        if isinstance(v, Data) and v.rank == 2:  # mask[:, None, None, :]: element (b, ., ., k) is mask[b, k]
            src = node.input[0]
            v = Index((self.dim(src, 0), self.dim(src, 1)), ("data", v, axis(0), axis(1)))
        if not isinstance(v, Index):
            raise NotSymbolic("Unsqueeze of an unknown tensor")
        rank = len(v.extents) + len(axes)
        axes = sorted(a % rank for a in axes)
        old_to_new, new_ext, j = {}, [], 0
        for a in range(rank):
            if a in axes:
                new_ext.append(Dim(1))
            else:
                old_to_new[j] = a
                new_ext.append(v.extents[j])
                j += 1
        return Index(tuple(new_ext), shift_axes(v.expr, old_to_new.__getitem__))

    def _op_Cast(self, node, _):
        v = self.value(node.input[0])
        to = attr(node, "to")
        if isinstance(v, Vec) and to in (T.INT64, T.INT32):
            return v
        if isinstance(v, Data) and to == T.BOOL:
            return Data(v.name, v.rank, as_bool=True)
        if isinstance(v, Index) and to in (T.BOOL, T.INT64, T.INT32) and _is_boolean(v.expr):
            return v
        raise NotSymbolic(f"Cast to {onnx.helper.tensor_dtype_to_string(to)} changes values")

    def _op_Reshape(self, node, _):
        v = self.value(node.input[0])
        target = self.vec(node.input[1])
        if isinstance(v, Data):  # the mask reshaped: the formula reads the reshaped tensor itself
            return Data(node.output[0], len(target.items))
        if isinstance(v, Vec) and [d.coef for d in target.items] == [-1]:
            return Vec(v.items)
        if not isinstance(v, Index):
            raise NotSymbolic("Reshape of an unknown tensor")
        if [d.coef for d in target.items] == [-1] and target.items[0].is_int:
            return Index((_product(v.extents),), ("flat", v.extents, v.expr))
        if v.expr[0] == "flat":
            src_ext, src_expr = v.expr[1], v.expr[2]
            wanted = tuple(target.items)
            if _non_unit(wanted) == _non_unit(src_ext):
                return _reindex_units(src_ext, src_expr, wanted)
        if _non_unit(target.items) == _non_unit(v.extents):
            return _reindex_units(v.extents, v.expr, tuple(target.items))
        raise NotSymbolic("Reshape that moves index elements")

    def _op_Flatten(self, node, _):
        v = self.value(node.input[0])
        if isinstance(v, Data) and v.rank == 2 and attr(node, "axis", 1) == 2:
            return FlatData(v, self.dim(v.name, 1))
        raise NotSymbolic("Flatten of something other than a rank-2 mask")

    def _op_ConstantOfShape(self, node, _):
        shape = self.vec(node.input[0])
        t = attr(node, "value")
        value = onnx.numpy_helper.to_array(t).reshape(-1)[0].item() if t is not None else 0.0
        if type(value) is int and len(shape.items) == 1 and shape.items[0].is_int:  # a shape of ones
            return Vec((Dim(value),) * shape.items[0].coef)
        return Index(tuple(shape.items), ("const", value))

    def _op_Range(self, node, _):
        start, limit, delta = (self.vec(x) for x in node.input[:3])
        if start.items != (Dim(0),) or delta.items != (Dim(1),):
            raise NotSymbolic("Range that does not start at 0 with step 1")
        return Index((limit.items[0],), axis(0))

    def _op_Expand(self, node, _):
        v = self.value(node.input[0])
        shape = self.vec(node.input[1])
        v = _as_index(v)
        if not isinstance(v, Index):
            raise NotSymbolic("Expand of an unknown tensor")
        rank = max(len(v.extents), len(shape.items))
        v = _aligned(v, rank)
        return Index(_broadcast(v.extents, tuple(shape.items), "Expand"), v.expr)

    def _elementwise(self, node, op: str):
        a, b = (self.value(x) for x in node.input[:2])
        if isinstance(a, Vec) and isinstance(b, Vec) and op in ("mul", "div", "eq"):
            return _vec_arith(a, b, op)
        if isinstance(a, Vec) and isinstance(b, Vec) and op in ("add", "sub") and _addable(a, b):
            return _vec_arith(a, b, op)
        if isinstance(a, Vec) and isinstance(b, Vec) and op in ("min", "max"):
            return _vec_arith(a, b, op)
        a, b = (_as_index(x) for x in (a, b))
        if not isinstance(a, Index) or not isinstance(b, Index):
            raise NotSymbolic(f"{node.op_type} of values it does not model")
        rank = max(len(a.extents), len(b.extents))
        a, b = _aligned(a, rank), _aligned(b, rank)
        return Index(_broadcast(a.extents, b.extents, node.op_type), (op, a.expr, b.expr))

    def _op_And(self, node, _):
        return self._elementwise(node, "and")

    def _op_LessOrEqual(self, node, _):
        return self._elementwise(node, "le")

    def _op_GreaterOrEqual(self, node, _):
        return self._elementwise(node, "ge")

    def _op_Less(self, node, _):
        return self._elementwise(node, "lt")

    def _op_Greater(self, node, _):
        return self._elementwise(node, "gt")

    def _op_Abs(self, node, _):  # ModernBERT's local window: |q - k| <= window / 2
        v = _as_index(self.value(node.input[0]))
        if not isinstance(v, Index):
            raise NotSymbolic("Abs of values it does not model")
        return Index(v.extents, ("abs", v.expr))

    def _op_Add(self, node, _):
        return self._elementwise(node, "add")

    def _op_Sub(self, node, _):  # key_length - query_length: GPT-Neo's slice of its causal buffer
        return self._elementwise(node, "sub")

    def _op_Mul(self, node, _):
        return self._elementwise(node, "mul")

    def _op_Div(self, node, _):
        return self._elementwise(node, "div")

    def _op_Max(self, node, _):
        return self._elementwise(node, "max")

    def _op_Min(self, node, _):
        return self._elementwise(node, "min")

    def _op_Equal(self, node, _):
        return self._elementwise(node, "eq")

    def _op_Where(self, node, name):
        c = self.value(node.input[0])
        if isinstance(c, BoolVec):
            x, y = self.vec(node.input[1]), self.vec(node.input[2])
            n = len(c.items)
            xs = x.items * n if len(x.items) == 1 else x.items
            ys = y.items * n if len(y.items) == 1 else y.items
            return Vec(tuple(a if k else b for k, a, b in zip(c.items, xs, ys)))
        raise NotSymbolic("Where outside shape arithmetic")

    def _op_GatherND(self, node, _):
        data, idx = self.value(node.input[0]), self.index(node.input[1])
        if not isinstance(data, Data) or data.rank != 2 or attr(node, "batch_dims", 0) != 0:
            raise NotSymbolic("GatherND of something other than a rank-2 mask")
        if idx.extents[-1:] != (Dim(2),) or idx.expr[0] != "stack":
            raise NotSymbolic("GatherND with indices that are not a (row, column) pair")
        return Index(idx.extents[:-1], ("data", data, idx.expr[1], idx.expr[2]))


def _as_index(v: Value) -> Value:
    """A one-element shape value as a constant index tensor (a scalar, or a [1] that broadcasts)."""
    if isinstance(v, Vec) and len(v.items) == 1:
        d = v.items[0]
        return Index(() if v.scalar else (Dim(1),), ("const", d.coef if d.is_int else d))
    return v


def _addable(a: Vec, b: Vec) -> bool:
    """Shape arithmetic ``a + b`` stays a vector of monomials: equal lengths (or one scalar) and each pair
    of the same factors (ints: (d + 2) / 3 of a known d)."""
    n = max(len(a.items), len(b.items))
    xs = a.items * n if len(a.items) == 1 else a.items
    ys = b.items * n if len(b.items) == 1 else b.items
    return len(xs) == len(ys) and all(x.factors == y.factors for x, y in zip(xs, ys))


def _is_boolean(expr: tuple) -> bool:
    return expr[0] in ("and", "le", "ge", "lt", "gt", "eq") or (expr[0] == "const" and isinstance(expr[1], bool)) \
        or (expr[0] == "data" and expr[1].as_bool) or (expr[0] == "flatdata" and expr[1].as_bool)


def _broadcast_dims(shapes: list) -> tuple:
    """Numpy broadcast of dimension tuples: an axis is the operands' common dimension, the one that is not
    1, or None where that is not known."""
    n = max(len(d) for d in shapes)
    out = []
    for j in range(n):
        axis = [d[j - (n - len(d))] for d in shapes if j - (n - len(d)) >= 0]
        known = {a for a in axis if a is not None and a != Dim(1)}
        if None in axis:
            out.append(None)
        elif not known:
            out.append(Dim(1))
        elif len(known) == 1:
            out.append(known.pop())
        else:
            out.append(None)
    return tuple(out)


def _product(dims) -> Dim:
    out = Dim(1)
    for d in dims:
        out = out * d
    return out


def _non_unit(dims) -> tuple:
    return tuple(d for d in dims if d != Dim(1))


def _reindex_units(src: tuple, expr: tuple, dst: tuple) -> Index:
    """Reshape that only drops or inserts axes of extent 1: the formula's axes move with their extents.
    A formula that reads an extent-1 axis reads index 0 there, which the new layout keeps implicit only
    if it is not read, so such a formula is not moved."""
    src_axes = [a for a, d in enumerate(src) if d != Dim(1)]
    dst_axes = [a for a, d in enumerate(dst) if d != Dim(1)]
    read = _axes_read(expr)
    if read - set(src_axes):
        raise NotSymbolic("Reshape drops an axis the index formula reads")
    mapping = dict(zip(src_axes, dst_axes))
    return Index(tuple(dst), shift_axes(expr, mapping.__getitem__))


def _axes_read(expr: tuple) -> set[int]:
    """The index axes a formula depends on."""
    kind = expr[0]
    if kind == "axis":
        return {expr[1]}
    if kind == "const":
        return set()
    if kind == "flat":  # ("flat", extents, inner): the inner formula's axes
        return _axes_read(expr[2])
    operands = {"data": expr[2:], "flatdata": expr[3:]}.get(kind, expr[1:])
    out: set[int] = set()
    for e in operands:
        out |= _axes_read(e)
    return out


def _vec_arith(a: Vec, b: Vec, op: str) -> Value:
    n = max(len(a.items), len(b.items))
    xs = a.items * n if len(a.items) == 1 else a.items
    ys = b.items * n if len(b.items) == 1 else b.items
    if len(xs) != len(ys):
        raise NotSymbolic("shape arithmetic on vectors of different lengths")
    if op == "mul":
        return Vec(tuple(x * y for x, y in zip(xs, ys)), scalar=a.scalar and b.scalar)
    if op in ("add", "sub"):  # monomials of the same factors (ints among them: _addable); zero is the int 0
        sums = (x.coef + y.coef if op == "add" else x.coef - y.coef for x, y in zip(xs, ys))
        return Vec(tuple(Dim(c, x.factors if c else ()) for c, x in zip(sums, xs)), scalar=a.scalar and b.scalar)
    if op in ("min", "max"):
        # Shape(x)[1] clamped by a constant (dynamo's min(max_positions, S)): an int where both are, else a
        # symbol of its own, spelled as the dynamo exporter spells the same dimension in its value_info
        # ("Min(32, s50)"), so that the two are the same symbol
        pick = min if op == "min" else max
        return Vec(tuple(x if x == y else Dim(pick(x.coef, y.coef)) if x.is_int and y.is_int
                         else clamp_dim(op, x, y) for x, y in zip(xs, ys)), scalar=a.scalar and b.scalar)
    if op == "div" and all(x.is_int and y.is_int and y.coef for x, y in zip(xs, ys)):
        # integer Div truncates toward zero
        return Vec(tuple(Dim(abs(x.coef) // abs(y.coef) * (1 if (x.coef < 0) == (y.coef < 0) else -1))
                         for x, y in zip(xs, ys)), scalar=a.scalar and b.scalar)
    if op == "div":
        # Div truncates; its quotient symbol is the one a Reshape's -1 over the same dimensions gets, and
        # where that Reshape runs the division is exact, so the two are the same number
        return Vec(tuple(x.quotient(y) for x, y in zip(xs, ys)), scalar=a.scalar and b.scalar)
    # eq: a symbolic dimension is never negative, so it differs from a negative constant
    res = []
    for x, y in zip(xs, ys):
        if x == y:
            res.append(True)
        elif (x.is_int and y.is_int) or (x.is_int and x.coef < 0) or (y.is_int and y.coef < 0):
            res.append(False)
        else:
            raise NotSymbolic(f"cannot decide whether {x} equals {y}")
    return BoolVec(tuple(res))


# --- simplification of boolean mask formulas ---------------------------------------------------------
def conjuncts(expr: tuple, extents: tuple) -> list[tuple]:
    """The terms of an And-tree, each simplified; always-true terms (``True``, ``index >= 0``) dropped."""
    if expr[0] == "and":
        return conjuncts(expr[1], extents) + conjuncts(expr[2], extents)
    term = simplify(expr, extents)
    if term == TRUE:
        return []
    if term[0] == "ge" and term[1][0] == "axis" and term[2] == ("const", 0):
        return []  # an index is never negative
    if term[0] == "le" and term[1] == ("const", 0) and term[2][0] == "axis":
        return []
    return [term]


def simplify(expr: tuple, extents: tuple) -> tuple:
    """Rewrite ``Flatten(x)[row·cols + col]`` into ``x[row, col]`` where ``0 <= col < cols`` is known from
    the extent of ``col``'s axis (it indexes a ``Range(0, cols)``)."""
    if expr[0] == "flatdata":
        data, cols, e = expr[1], expr[2], expr[3]
        if e[0] == "add":
            for col, rest in ((e[1], e[2]), (e[2], e[1])):
                if col[0] != "axis" or extents[col[1]] != cols or rest[0] != "mul":
                    continue
                for row, k in ((rest[1], rest[2]), (rest[2], rest[1])):
                    if k == ("const", cols.coef if cols.is_int else cols):
                        return ("data", data, row, col)
        raise NotSymbolic("a flattened mask read at a position not of the form row·columns + column")
    if expr[0] in ("axis", "const", "data"):
        return expr
    return (expr[0], *(simplify(e, extents) for e in expr[1:]))
