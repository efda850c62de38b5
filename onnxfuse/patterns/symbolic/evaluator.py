"""The symbolic evaluator: the values of the small integer and boolean subgraphs exporters write around
attention — reshape targets built from ``Shape`` slices, and attention masks built from index ranges.

Nothing here runs the model. :meth:`Evaluator.value` follows a tensor back through the ops it models, each
tensor once, into one of the values of :mod:`.values` (a shape vector, an index formula, unknown data);
its dimensions come from the forward pass it is built on (:class:`~.shapes.ShapePass`). Two dimensions are
proved equal only by being the same value here; anything else is "not shown", and the caller refuses.
Anything the evaluator does not model (another op, a non-uniform constant, a formula it cannot simplify)
raises :class:`~.values.NotSymbolic` with a reason; a caller that needs a proof then refuses.

Each modelled op is one ``_op_<OpType>`` method (default ONNX domain): a new op is followed by adding its
method; an op without one is data (a tensor of unknown values) where its rank is known. Nodes whose output is
their input (``graph.passes_value``: Identity, ORT's device copies, a Cast to the type the tensor has) are
identities here: values, dimensions and element types pass through them.
"""

from __future__ import annotations

import numpy as np
import onnx

from ..graph import GraphView, attr, passes_value
from .dims import INT64_MAX, Dim, product
from .shapes import ShapePass
from .values import (BoolVec, Data, FlatData, Index, NotSymbolic, Value, Vec, addable, aligned, as_index, axis,
                     broadcast, is_boolean, non_unit, reindex_units, shift_axes, vec_arith)

T = onnx.TensorProto
_INDEX_DTYPES = (T.INT64, T.INT32, T.BOOL)
_MAX_DEPTH = 200  # ops between a mask or shape and its sources; exporters write a few dozen


class Evaluator(ShapePass):
    """Follows tensors back through the ops it models, each tensor once."""

    def __init__(self, view: GraphView):
        super().__init__(view)
        self.memo: dict[str, Value | NotSymbolic] = {}  # failures too: each tensor is followed once
        self.depth = 0

    def seed(self, name: str, dims: tuple) -> None:
        """:meth:`ShapePass.seed`; the values that read shapes are evaluated again too."""
        super().seed(name, dims)
        self.memo.clear()

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
        v = as_index(self.value(name))
        if not isinstance(v, Index):
            raise NotSymbolic(f"'{name}' is not an index formula")
        return v

    def expands_within(self, node, onto: tuple) -> bool:
        """``node`` is an Expand whose target adds no axis and no extent to ``onto``, the dimensions its
        consumer broadcasts the result onto anyway (right-aligned; each target entry 1 or ``onto``'s own): the
        consumer computes the same from the Expand's input, so a proof may read that input in its place."""
        if node.op_type != "Expand" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
            return False
        try:
            target = self.vec(node.input[1]).items
        except NotSymbolic:
            return False
        return len(target) <= len(onto) and all(t == Dim(1) or t == o for t, o in zip(reversed(target),
                                                                                     reversed(onto)))

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
        # a shape built of parts of several kinds (the dynamo exporter's [Shape(x)[0:2], -1, H] with a part
        # computed as a one-element tensor: Expand(-1, [1]), sym + 0): each part read as its dimensions
        vecs = [_as_shape_vec(p) for p in parts]
        if all(v is not None for v in vecs):
            return Vec(tuple(d for v in vecs for d in v.items))
        if all(isinstance(p, Index) for p in parts) and len(parts) == 2:
            a, b = parts
            ax = attr(node, "axis", 0)
            if ax not in (-1, len(a.extents) - 1) or a.extents[-1:] != (Dim(1),) or b.extents[-1:] != (Dim(1),):
                raise NotSymbolic("Concat of index tensors other than stacking on a new last axis")
            ext = broadcast(a.extents[:-1], b.extents[:-1], "Concat")
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

    def _passed(self, node, _):
        """A node whose output is its input (``graph.passes_value``): the input's value. A tensor of unknown
        values is read at this node's output, which is what the graph reads here: the padding mask behind a
        device copy is then the copy, on the device the graph copied it to for the nodes that read it, and the
        mask a fused op rebuilds from it reads it there too (reading the source would be as exact: ORT copies
        a tensor to where it is read; the graph's own copy is kept rather than a second one made)."""
        v = self.value(node.input[0])
        return Data(node.output[0], v.rank, v.as_bool) if isinstance(v, Data) else v

    _op_Identity = _op_MemcpyFromHost = _op_MemcpyToHost = _passed

    def _op_Cast(self, node, name):
        v = self.value(node.input[0])
        to = attr(node, "to")
        if isinstance(v, Vec) and to in (T.INT64, T.INT32):
            return v
        if isinstance(v, Data) and to == T.BOOL:
            return Data(v.name, v.rank, as_bool=True)
        if isinstance(v, Index) and to in (T.BOOL, T.INT64, T.INT32) and is_boolean(v.expr):
            return v
        if passes_value(node, self.dtype):  # to the type it has
            return self._passed(node, name)
        raise NotSymbolic(f"Cast to {onnx.helper.tensor_dtype_to_string(to)} changes values")

    def _op_Reshape(self, node, _):
        v = self.value(node.input[0])
        target = self.vec(node.input[1])
        if isinstance(v, Data):  # the mask reshaped: the formula reads the reshaped tensor itself
            return Data(node.output[0], len(target.items))
        if isinstance(v, Vec) and [d.coef for d in target.items] == [-1]:
            return Vec(v.items)
        if isinstance(v, Vec) and len(target.items) <= 1 and all(d.is_int for d in target.items) \
                and int(product(target.items).coef) == len(v.items):  # a scalar as [1], a [1] as a scalar
            return Vec(v.items, scalar=not target.items)
        if not isinstance(v, Index):
            raise NotSymbolic("Reshape of an unknown tensor")
        if [d.coef for d in target.items] == [-1] and target.items[0].is_int:
            return Index((product(v.extents),), ("flat", v.extents, v.expr))
        if v.expr[0] == "flat":
            src_ext, src_expr = v.expr[1], v.expr[2]
            wanted = tuple(target.items)
            if non_unit(wanted) == non_unit(src_ext):
                return reindex_units(src_ext, src_expr, wanted)
        if non_unit(target.items) == non_unit(v.extents):
            return reindex_units(v.extents, v.expr, tuple(target.items))
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
        v = as_index(v)
        if not isinstance(v, Index):
            raise NotSymbolic("Expand of an unknown tensor")
        rank = max(len(v.extents), len(shape.items))
        v = aligned(v, rank)
        return Index(broadcast(v.extents, tuple(shape.items), "Expand"), v.expr)

    def _elementwise(self, node, op: str):
        a, b = (self.value(x) for x in node.input[:2])
        if isinstance(a, Vec) and isinstance(b, Vec) and op in ("mul", "div", "eq"):
            return vec_arith(a, b, op)
        if isinstance(a, Vec) and isinstance(b, Vec) and op in ("add", "sub") and addable(a, b):
            return vec_arith(a, b, op)
        if isinstance(a, Vec) and isinstance(b, Vec) and op in ("min", "max"):
            return vec_arith(a, b, op)
        a, b = (as_index(x) for x in (a, b))
        if not isinstance(a, Index) or not isinstance(b, Index):
            raise NotSymbolic(f"{node.op_type} of values it does not model")
        rank = max(len(a.extents), len(b.extents))
        a, b = aligned(a, rank), aligned(b, rank)
        return Index(broadcast(a.extents, b.extents, node.op_type), (op, a.expr, b.expr))

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
        v = as_index(self.value(node.input[0]))
        if not isinstance(v, Index):
            raise NotSymbolic("Abs of values it does not model")
        return Index(v.extents, ("abs", v.expr))

    def _op_Neg(self, node, name):  # a shape entry written as -(1)
        try:
            v = self.value(node.input[0])
        except NotSymbolic:
            v = None
        if isinstance(v, Vec):
            return Vec(tuple(Dim(-d.coef, d.factors) for d in v.items), scalar=v.scalar)
        rank = self.rank(name)  # of anything else, as of an op not modelled: data
        if rank is None:
            raise NotSymbolic(f"Neg '{node.name}' of something other than a shape vector")
        return Data(name, rank)

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


def _as_shape_vec(v: Value) -> Vec | None:
    """A part of a shape being concatenated as a :class:`Vec`: a vector as it is, or a one-dimensional index
    tensor of a known length whose elements are one constant dimension (a formula of no position: ``("const",
    d)`` and sums, differences and products of those), such as an int64 -1 expanded to [1] or a dimension plus 0;
    None for anything else."""
    if isinstance(v, Vec):
        return None if v.scalar else v
    if not isinstance(v, Index) or len(v.extents) != 1 or not v.extents[0].is_int:
        return None
    d = _constant_dim(v.expr)
    return None if d is None else Vec((d,) * v.extents[0].coef)


def _constant_dim(expr: tuple) -> Dim | None:
    """The one value of an index formula that reads no position, as a dimension, where it is one."""
    if expr[0] == "const":
        c = expr[1]
        if isinstance(c, Dim):
            return c
        return Dim(int(c)) if isinstance(c, (int, np.integer)) and not isinstance(c, (bool, np.bool_)) else None
    if expr[0] not in ("add", "sub", "mul", "div", "min", "max"):
        return None
    a, b = _constant_dim(expr[1]), _constant_dim(expr[2])
    if a is None or b is None:
        return None
    if expr[0] in ("add", "sub") and b == Dim(0):
        return a
    if expr[0] == "add" and a == Dim(0):
        return b
    x, y = Vec((a,)), Vec((b,))
    if expr[0] in ("add", "sub") and not addable(x, y):
        return None
    out = vec_arith(x, y, expr[0])
    return out.items[0] if isinstance(out, Vec) else None
