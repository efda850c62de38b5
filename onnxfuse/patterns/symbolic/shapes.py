"""The forward pass: every tensor's dimensions and element type, carried over from the inputs it is.

Dimensions come from one pass over the nodes in their topological order (:meth:`ShapePass.shapes`) that
carries each output dimension over from the input it is (Transpose, MatMul, broadcasting, normalisations,
Reshape to a target read symbolically, each output of a Split by its constant size, Slices at bounds read
symbolically, Concats), down from the graph inputs; elsewhere shape inference's: an int, or a
``dim_param``/inferred symbol. Shape inference alone loses these equalities at every op it cannot type
precisely (its fresh ``unk__`` symbols, and ORT's contrib ops, which it does not know at all: there it stops at
SkipLayerNormalization, and at LayerNormalization below opset 17); the trace keeps them. A dimension neither
knows stays ``Shape(x)[i]`` of its tensor, equal only to itself. Element types are carried forward the same
way (:meth:`ShapePass.dtype`) where shape inference typed nothing.

:class:`ShapePass` is the half of :class:`~.evaluator.Evaluator` that reads dimensions; it reads the small
vectors some ops take (a Reshape's target, a Split's sizes, a Slice's bounds) through the evaluator's ``vec``.
"""

from __future__ import annotations

import onnx

from ..graph import DEVICE_COPIES, GraphView, attr
from .dims import INT64_MAX, Dim, broadcast_dims, inferred_dim, product
from .values import NotSymbolic

T = onnx.TensorProto

# Ops whose (first) output has exactly the first input's dimensions, in any domain (ORT's device copies too).
_SAME_SHAPE_OPS = {"Softmax", "Cast", "IsNaN", "Identity", "Relu", "Tanh", "Erf", "Sigmoid", "Sqrt", "Neg",
                   "Not", "Gelu", "FastGelu", "BiasGelu", "QuickGelu", "Dropout", *DEVICE_COPIES}
_NORMALIZATIONS = {"LayerNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization",
                   "SkipSimplifiedLayerNormalization"}
_CONTRIB_TYPED = {"SkipLayerNormalization", "FastGelu", "BiasGelu", "QuickGelu", "Gelu"}  # com.microsoft, T→T
# ORT's Skip*LayerNormalization also returns input + skip (+ bias), the residual stream, as output 3: the
# input's dimensions and type (ORT's optimizer routes the next block's residual through it, e.g. GPT-NeoX).
_SKIP_NORMALIZATIONS = {"SkipLayerNormalization", "SkipSimplifiedLayerNormalization"}
_SKIP_SUM_OUTPUT = 3


# Elementwise ops of one operand, followed by the forward pass only (their values are not modelled).
_UNARY_OPS = {"Abs", "Log", "Exp", "Floor", "Ceil", "Round", "Reciprocal", "Sign", "Cos", "Sin"}
_BROADCAST_OPS = {"Add", "Sub", "Mul", "Div", "Pow", "Where", "And", "Or", "Equal", "Less", "LessOrEqual",
                  "Greater", "GreaterOrEqual", "Max", "Min"}
# Reductions: the reduced axes become 1 (keepdims, the default) or go; the others stay. RMSNorm's ReduceMean
# is where shape inference loses batch and sequence once ORT's float16 converter has wrapped it in Casts.
_REDUCE_OPS = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare", "ReduceL1",
               "ReduceL2", "ReduceLogSum", "ReduceLogSumExp"}
# Ops whose (first) output has their operands' element type, with the operands that carry it (ONNX and ORT
# tie those to one type variable T), for :meth:`ShapePass.dtype`.
_TYPE_KEEPING = {**{op: (0,) for op in ("Softmax", "Identity", *DEVICE_COPIES, "Relu", "Tanh", "Erf", "Sigmoid",
                                        "Sqrt", "Neg", "Gelu", "FastGelu", "BiasGelu", "QuickGelu", "Dropout",
                                        "Transpose", "Reshape", "Split", "Squeeze", "Unsqueeze", "LayerNormalization",
                                        "SkipLayerNormalization")},
                 **{op: (0, 1) for op in ("Add", "Sub", "Mul", "Div", "MatMul", "Max", "Min")},
                 "Where": (1, 2)}


def _is_skip_sum(node, k: int) -> bool:
    return node.op_type in _SKIP_NORMALIZATIONS and k == _SKIP_SUM_OUTPUT


class ShapePass:
    """Dimensions and element types of a graph's tensors (module docstring), each pass run once and run again
    after :meth:`seed`. A mixin of :class:`~.evaluator.Evaluator`, whose ``vec`` it reads shape vectors with."""

    def __init__(self, view: GraphView):
        self.view = view
        self.dims: dict[tuple[str, int], Dim] = {}  # proved by the caller (seed)
        self._shapes: dict[str, tuple | None] | None = None
        self._dtypes: dict[str, int | None] | None = None

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
        the forward pass derives from it (which is run again)."""
        for axis, d in enumerate(dims):
            self.dims[(name, axis)] = d
        self._shapes = None

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
            return (tuple(Dim(1) if a in axes else next(rest) for a in range(rank))
                    if len(axes) == len(set(axes)) else None)
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
            return broadcast_dims([x0, tuple(target)]) if x0 is not None else None
        if op in _REDUCE_OPS and x0 is not None:
            return self._reduced(node, x0)
        if op == "Transpose" and x0 is not None:
            perm = attr(node, "perm", None) or list(range(len(x0)))[::-1]
            return tuple(x0[p] for p in perm) if len(perm) == len(x0) else None
        if op in _BROADCAST_OPS:
            operands = [d for d, name in zip(ins, node.input) if name]
            if any(d is None for d in operands):
                return None
            return broadcast_dims(operands)
        if op == "MatMul" and len(ins) == 2 and all(d is not None and len(d) >= 2 for d in ins):
            a, b = ins
            batch = broadcast_dims([a[:-2], b[:-2]])
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
                out[j] = product(x0).quotient(product(others)) if known else None
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
