"""A bias read structurally as one scalar function of its leaves' elements, and where each leaf's axes land.

:func:`read_cone` follows a tensor back through its producers (its cone) to its leaves and proves, op by op,
that every element of it is one scalar function ``f`` of one element of each leaf, read at a position the
tensor's own index determines axis by axis. The leaves:

* the **source**: one graph input (the ``attention_mask``, bool, integer or float, [B, T] or [B, 1, 1, T]);
  a second graph input, or any activation, in the cone and the cone is not read here;
* **keep formulas**: a boolean tensor the symbolic evaluator reads as a formula of its own indices (causal
  and window comparisons of ``Range`` positions, or a padding lookup of the mask it already proves:
  ``symbolic``), taken whole as one leaf;
* **constants**, uniform (every element the same value: a scalar, a ``ConstantOfShape``, a folded tensor of
  one value); any other constant depends on the position and the cone is not read here.

The ops between them, each with what it does to the index map (which leaf axis an axis of its output reads):

* elementwise (Identity, Cast, CastLike, Not, Neg, Abs; Add, Sub, Mul, Div, Min, Max, And, Or, Xor, the
  comparisons, Where), with numpy broadcasting: an output axis reads what its operands' axes read (right
  aligned); an operand broadcast along it reads its single element, which is what the leaf's own
  broadcast gives, so every operand reads the same leaf element at every output index;
* Unsqueeze, and Squeeze of axes that read nothing: axes inserted or dropped;
* Reshape whose target (read by the symbolic evaluator, 0 and -1 resolved) has the input's dimensions
  apart from units, in order: units inserted or dropped, the data order kept;
* Expand: the input's axes broadcast (values copied, never moved), leading axes that read nothing;
* Slice from 0 to the end (an end at least the axis's extent, or the exporters' INT64_MAX) with step 1
  along every axis that reads a leaf (any slice along the others: their values do not change with the
  index);
* Transpose: the axes permuted.

* Trilu of a uniform constant: a keep formula of its last two axes (``k - q >= diagonal``, or ``<=``), the
  constant where it holds and 0 elsewhere.

Every other op — anything that moves or mixes elements (Gather, ReduceSum, MatMul, Concat, ScatterND, Tile,
...) — and every op outside the default domain ends the reading: not this form (None). So where
:func:`read_cone` answers, element ``[i_0, ..., i_r]`` of the tensor is ``f(source[i_{a(0)}, ...],
keep_1[...], ...)`` with each leaf read at the output indices of the axes that carry its axes (index 0
where it is broadcast), which is what lets ``mask_semantics`` evaluate ``f`` on scalars and read the mask
off its values. Shapes, sizes and Expand/Reshape targets are read with the symbolic evaluator, never run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from onnx import numpy_helper

from ..graph import GraphView, attr
from ..symbolic import Dim, Evaluator, Index, NotSymbolic
from ..symbolic.values import axes_read
from . import scalar_ops
from .scalar_ops import T

SOURCE = "source"  # the leaf key of the source; keep formulas are ("keep", i)
_MAX_DEPTH = 200  # ops between a bias and its leaves; exporters write a few dozen
_MAX_KEEPS = 4  # keep formulas in one cone (each doubles the points mask_semantics evaluates)
_SOURCE_TYPES = (T.BOOL, T.INT32, T.INT64, T.FLOAT, T.FLOAT16, T.DOUBLE)
_CONSTANT_ELEMENTS = 4096  # a folded constant read to show it is uniform
_SLICE_TO_END = 2**31 - 1  # an end this large reaches past any axis (exporters write INT64_MAX or INT32_MAX)

_UNARY = ("Identity", "Cast", "Not", "Neg", "Abs")
_BROADCASTING = ("Add", "Sub", "Mul", "Div", "Min", "Max", "And", "Or", "Xor", "Where", *scalar_ops.COMPARISONS)
_BOOLEAN_RESULT = ("Not", "And", "Or", "Xor", *scalar_ops.COMPARISONS)


@dataclass(frozen=True, eq=False)
class Scalar:
    """The scalar function one element of a cone computes: a leaf (``op`` "source", "keep" with its number in
    ``value``), a constant (``op`` "const", the 0-d array in ``value``), or an ONNX op of its operands; of ONNX
    element type ``dtype``."""

    op: str
    dtype: int
    args: tuple = ()
    value: object = None


@dataclass(frozen=True)
class Cone:
    fn: Scalar
    axes: tuple  # per axis of the tensor: the frozenset of (leaf key, leaf axis) it reads along that axis


@dataclass
class Leaves:
    source: str | None = None  # the graph input read as data
    keeps: list = field(default_factory=list)  # (tensor name, symbolic Index) per keep formula


@dataclass(frozen=True)
class _Formula:
    name: str
    index: Index

    @property
    def expr(self) -> tuple:
        return self.index.expr


def _reads_data(expr: tuple) -> bool:
    """The formula reads a tensor's values (a padding lookup), not only index positions and constants."""
    if expr[0] in ("data", "flatdata"):
        return True
    return expr[0] not in ("axis", "const") and any(_is_formula(e) and _reads_data(e) for e in expr[1:])


def _is_formula(e) -> bool:
    """A formula operand, not the extents a ``("flat", extents, inner)`` carries."""
    return isinstance(e, tuple) and bool(e) and isinstance(e[0], str)


def _reads_flattened(expr: tuple) -> bool:
    if expr[0] == "flat":
        return True
    return expr[0] not in ("axis", "const") and any(_is_formula(e) and _reads_flattened(e) for e in expr[1:])


class _NotACone(Exception):
    """The tensor is not written as one scalar function of its leaves (internal: the caller answers None)."""


def read_cone(view: GraphView, ev: Evaluator, name: str) -> tuple[Cone, Leaves] | None:
    """``name`` as one scalar function of its leaves and its index map (module docstring), or None."""
    reader = _Reader(view, ev)
    try:
        return reader.cone(name), reader.leaves
    except (_NotACone, NotSymbolic, scalar_ops.Undefined):
        return None


class _Reader:
    def __init__(self, view: GraphView, ev: Evaluator):
        self.view, self.ev = view, ev
        self.leaves = Leaves()
        self.memo: dict[str, Cone] = {}
        self.depth = 0

    def cone(self, name: str) -> Cone:
        if name not in self.memo:
            if self.depth > _MAX_DEPTH:
                raise _NotACone
            self.depth += 1
            try:
                self.memo[name] = self._read(name)
            finally:
                self.depth -= 1
        return self.memo[name]

    # -- leaves --
    def _read(self, name: str) -> Cone:
        view = self.view
        if view.constant_ref(name) is not None:
            return self._constant(name)
        if name in view.graph_inputs:
            return self._source(name)
        node = view.producer_of(name)
        if node is None or node.domain not in ("", "ai.onnx"):
            raise _NotACone
        formula = self._formula(name) if self.ev.dtype(name) == T.BOOL else None
        if formula is not None and not _reads_data(formula.expr):
            return self._keep_formula(formula)  # causal and window comparisons: one leaf
        if formula is None:
            return self._op(node)
        # A formula that reads the mask is read through its ops where they are taken (the mask then is the
        # source, and whether f reads it only for being zero is seen), else as one leaf (the symbolic
        # evaluator's padding lookups: GatherND, a Flatten read at b·T + k).
        saved = (self.leaves.source, len(self.leaves.keeps), dict(self.memo))
        try:
            return self._op(node)
        except (_NotACone, NotSymbolic, scalar_ops.Undefined):
            self.leaves.source, self.memo = saved[0], saved[2]
            del self.leaves.keeps[saved[1]:]
            return self._keep_formula(formula)

    def _op(self, node) -> Cone:
        handler = getattr(self, f"_op_{node.op_type}", None)
        if handler is not None:
            return handler(node)
        if node.op_type in _UNARY or node.op_type in _BROADCASTING:
            return self._elementwise(node)
        raise _NotACone

    def _constant(self, name: str) -> Cone:
        ref = self.view.constant_ref(name)
        if ref.data_type not in _SOURCE_TYPES + scalar_ops.INT_TYPES:
            raise _NotACone
        value = self.view.small_value(name, max_elements=_CONSTANT_ELEMENTS)
        if value is None or value.size == 0:
            raise _NotACone
        flat = value.reshape(-1)
        if not (np.all(flat == flat[0]) or np.all(np.isnan(flat))):
            raise _NotACone  # a literal table: its elements depend on their position
        # small_value widens floats to float64; converting back is exact (they are values of data_type)
        return Cone(Scalar("const", ref.data_type, value=scalar_ops.typed(flat[0], ref.data_type)),
                    (frozenset(),) * len(ref.dims))

    def _source(self, name: str) -> Cone:
        leaves, ev = self.leaves, self.ev
        if leaves.source not in (None, name):
            raise _NotACone  # a second data input
        dtype, rank = self.view.dtype(name), ev.rank(name)
        if dtype not in _SOURCE_TYPES or rank not in (2, 4):
            raise _NotACone
        if rank == 4 and not ev.dim(name, 1) == ev.dim(name, 2) == Dim(1):
            raise _NotACone
        leaves.source = name
        return Cone(Scalar(SOURCE, dtype), tuple(frozenset() if ev.dim(name, a) == Dim(1) else
                                                 frozenset({(SOURCE, a)}) for a in range(rank)))

    def _formula(self, name: str) -> tuple[str, Index] | None:
        """A boolean tensor as the symbolic evaluator reads it, a formula of its indices, or None."""
        try:
            keep = self.ev.index(name)
        except NotSymbolic:
            return None
        if not isinstance(keep, Index) or (keep.expr[0] == "const" and not isinstance(keep.expr[1], bool)):
            return None
        if _reads_flattened(keep.expr) or any(not 0 <= a < len(keep.extents) for a in axes_read(keep.expr)):
            return None  # (a flattened index's formula reads the axes it was flattened from, not the tensor's)
        return _Formula(name, keep)

    def _keep_formula(self, formula: _Formula) -> Cone:
        """A keep formula as one leaf (a constant where it reads no index)."""
        keep = formula.index
        if keep.expr[0] == "const":
            return Cone(Scalar("const", T.BOOL, value=scalar_ops.typed(keep.expr[1], T.BOOL)),
                        (frozenset(),) * len(keep.extents))
        read = axes_read(keep.expr)
        if any(keep.extents[a] == Dim(1) for a in read) or len(self.leaves.keeps) >= _MAX_KEEPS:
            raise _NotACone  # (a formula reading index 0 of a unit axis would read the broadcast index instead)
        key = ("keep", len(self.leaves.keeps))
        self.leaves.keeps.append((formula.name, keep))
        return Cone(Scalar("keep", T.BOOL, value=key[1]),
                    tuple(frozenset({(key, a)}) if a in read else frozenset() for a in range(len(keep.extents))))

    # -- elementwise --
    def _elementwise(self, node) -> Cone:
        op = node.op_type
        ins = [x for x in node.input if x]
        if not ins or (op in _UNARY and len(ins) != 1) or (op == "Where" and len(ins) != 3) or \
                (op not in ("Min", "Max", "Where") + _UNARY and len(ins) != 2):
            raise _NotACone
        cones = [self.cone(x) for x in ins]
        args = tuple(c.fn for c in cones)
        if op == "Cast":
            fn = Scalar("Cast", attr(node, "to"), args)
        elif op in _BOOLEAN_RESULT:
            fn = Scalar(op, T.BOOL, args)
        elif op == "Where":
            fn = Scalar(op, args[1].dtype, args)
        else:
            fn = Scalar(op, args[0].dtype, args)
        return Cone(fn, _broadcast([c.axes for c in cones]))

    def _op_CastLike(self, node) -> Cone:
        x = self.cone(node.input[0])
        to = self.ev.dtype(node.input[1])
        if to is None:
            raise _NotACone
        return Cone(Scalar("Cast", to, (x.fn,)), x.axes)

    def _op_ConstantOfShape(self, node) -> Cone:
        t = attr(node, "value")
        value = numpy_helper.to_array(t).reshape(-1)[0] if t is not None else np.float32(0.0)
        dtype = t.data_type if t is not None else T.FLOAT
        rank = self._length(node.input[0])
        return Cone(Scalar("const", dtype, value=scalar_ops.typed(value, dtype)), (frozenset(),) * rank)

    def _op_Trilu(self, node) -> Cone:
        """Trilu of a uniform constant c (Mistral's window, LLaMA's causal fill): ``Where(k - q >= diagonal, c, 0)``
        (upper) or ``k - q <= diagonal``, over its last two axes (the rows q, the columns k): a keep formula."""
        x = self.cone(node.input[0])
        if x.fn.op != "const" or any(x.axes) or len(x.axes) < 2:
            raise _NotACone
        diagonal = self.ev.vec(node.input[1]).items if len(node.input) > 1 and node.input[1] else (Dim(0),)
        if len(diagonal) != 1 or not diagonal[0].is_int:
            raise _NotACone
        rank = len(x.axes)
        rows, cols = ("axis", rank - 2), ("axis", rank - 1)
        bound = ("add", rows, ("const", diagonal[0].coef))
        expr = ("ge", cols, bound) if attr(node, "upper", 1) else ("le", cols, bound)
        keep = self._keep_formula(_Formula(node.output[0], Index(tuple(self.ev.dim(node.input[0], a)
                                                                      for a in range(rank)), expr)))
        zero = Scalar("const", x.fn.dtype, value=scalar_ops.typed(0, x.fn.dtype))
        return Cone(Scalar("Where", x.fn.dtype, (keep.fn, x.fn, zero)), keep.axes)

    # -- axes inserted, dropped, broadcast, permuted --
    def _axes_operand(self, node, position: int = 1) -> list[int]:
        axes = attr(node, "axes", None)
        if axes is None:
            if len(node.input) <= position or not node.input[position]:
                raise _NotACone
            items = self.ev.vec(node.input[position]).items
            if not all(d.is_int for d in items):
                raise _NotACone
            axes = [d.coef for d in items]
        return list(axes)

    def _op_Unsqueeze(self, node) -> Cone:
        x = self.cone(node.input[0])
        axes = self._axes_operand(node)
        rank = len(x.axes) + len(axes)
        inserted = {a % rank for a in axes}
        rest = iter(x.axes)
        return Cone(x.fn, tuple(frozenset() if a in inserted else next(rest) for a in range(rank)))

    def _op_Squeeze(self, node) -> Cone:
        x = self.cone(node.input[0])
        dropped = {a % len(x.axes) for a in self._axes_operand(node)}
        if any(x.axes[a] for a in dropped):
            raise _NotACone
        return Cone(x.fn, tuple(c for a, c in enumerate(x.axes) if a not in dropped))

    def _op_Expand(self, node) -> Cone:
        x = self.cone(node.input[0])
        rank = max(len(x.axes), self._length(node.input[1]))
        return Cone(x.fn, (frozenset(),) * (rank - len(x.axes)) + x.axes)

    def _length(self, shape: str) -> int:
        """The length of a shape vector (its values are not needed): from its own shape where known."""
        dims = self.view.shape(shape)
        if dims is not None and len(dims) == 1 and isinstance(dims[0], int):
            return dims[0]
        return len(self.ev.vec(shape).items)

    def _op_Transpose(self, node) -> Cone:
        x = self.cone(node.input[0])
        perm = attr(node, "perm", None) or list(range(len(x.axes)))[::-1]
        if sorted(perm) != list(range(len(x.axes))):
            raise _NotACone
        return Cone(x.fn, tuple(x.axes[p] for p in perm))

    def _op_Reshape(self, node) -> Cone:
        """Only units inserted or dropped: the target's dimensions other than 1 are the input's, in order."""
        src = node.input[0]
        x = self.cone(src)
        dims = [self.ev.dim(src, a) for a in range(len(x.axes))]
        target = list(self.ev.vec(node.input[1]).items)
        if not attr(node, "allowzero", 0):
            target = [dims[j] if d == Dim(0) and j < len(dims) else d for j, d in enumerate(target)]
        if target.count(Dim(-1)) > 1 or any(d.is_int and d.coef < -1 for d in target):
            raise _NotACone
        kept = [a for a, d in enumerate(dims) if d != Dim(1)]
        if any(x.axes[a] for a, d in enumerate(dims) if d == Dim(1)):
            raise _NotACone
        placed = [j for j, d in enumerate(target) if d != Dim(1)]
        if len(placed) != len(kept) or any(target[j] not in (dims[a], Dim(-1)) for j, a in zip(placed, kept)):
            raise _NotACone
        moved = dict(zip(placed, kept))
        return Cone(x.fn, tuple(x.axes[moved[j]] if j in moved else frozenset() for j in range(len(target))))

    def _op_Slice(self, node) -> Cone:
        """The whole of every axis that reads a leaf (from 0, step 1, to at least its end)."""
        src = node.input[0]
        x = self.cone(src)
        ins = list(node.input) + [""] * (5 - len(node.input))
        starts, ends = self.ev.vec(ins[1]).items, self.ev.vec(ins[2]).items
        axes = [d.coef for d in self.ev.vec(ins[3]).items] if ins[3] else list(range(len(starts)))
        steps = self.ev.vec(ins[4]).items if ins[4] else (Dim(1),) * len(starts)
        if not (len(starts) == len(ends) == len(axes) == len(steps)):
            raise _NotACone
        for a, start, end, step in zip(axes, starts, ends, steps):
            a %= len(x.axes)
            if not x.axes[a]:
                continue
            whole = end == self.ev.dim(src, a) or (end.is_int and end.coef >= _SLICE_TO_END)
            if start != Dim(0) or step != Dim(1) or not whole:
                raise _NotACone
        return Cone(x.fn, x.axes)


def _broadcast(operands: list[tuple]) -> tuple:
    """The index map of an elementwise op's output: operands aligned from the right, each axis reading what
    any operand's does."""
    rank = max(len(a) for a in operands)
    padded = [(frozenset(),) * (rank - len(a)) + tuple(a) for a in operands]
    return tuple(frozenset().union(*(p[j] for p in padded)) for j in range(rank))

