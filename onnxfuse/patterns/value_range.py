"""Bounds on the values of a floating tensor, proved from the graph: is an additive bias finite?

A tensor fed to a fused op in place of the graph's arithmetic is exact when the op adds it as the graph
did; what can still differ is how a kernel treats infinities (a softmax row hidden entirely by ``-inf``,
or given ``+inf``, is NaN in the graph and whatever the kernel makes of it in the fused op). So a caller
asks here whether every element is finite, and refuses unless that is proved.

:func:`value_range` follows a tensor back through the ops that move or select elements (shape ops,
Gather from a constant table, Where), convert them (Cast: rounded to the target type, out-of-range values
become ±inf as they do at run time), and the few arithmetic ops exporters write into masks and biases
(Add, Sub, Mul, Neg, Min, Max), with interval arithmetic in float64 rounded outwards after every op so
the bounds hold whatever the rounding of the original type. Its sources are constants (their stored
values), ``ConstantOfShape`` (its value) and graph inputs of a boolean or integer type (that type's whole
range: an ``attention_mask`` may hold any int64). A float input, any other op, or a NaN that might arise
(``0 · inf``) gives None: nothing proved.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import onnx
from onnx import numpy_helper

from .graph import DEVICE_COPIES, GraphView, attr

T = onnx.TensorProto
_MAX_DEPTH = 200  # ops between a bias and its sources; exporters write a few dozen
_MAX_CONSTANT = 1 << 22  # elements of a constant table read for its bounds (T5's are a few hundred)
# Ops whose output elements are some of the first input's (or broadcast copies of them; ORT's device copies
# are all of them).
_SELECTING = {"Identity", *DEVICE_COPIES, "Reshape", "Unsqueeze", "Squeeze", "Transpose", "Expand", "Flatten",
              "Slice", "Tile", "Gather", "GatherElements", "GatherND"}  # (not Dropout: in training mode it scales)
_FLOAT_TYPES = (T.FLOAT, T.FLOAT16, T.DOUBLE, T.BFLOAT16)
_LARGEST = {T.FLOAT: float(np.finfo(np.float32).max), T.FLOAT16: float(np.finfo(np.float16).max),
            T.DOUBLE: float(np.finfo(np.float64).max), T.BFLOAT16: float.fromhex("0x1.fep127")}


def value_range(view: GraphView, name: str) -> tuple[float, float] | None:
    """(lowest, highest) bounds of every element of ``name`` (possibly ±inf), or None if not proved
    (NaN possible, or a value it does not follow)."""
    return _Ranges(view).of(name, 0)


def is_finite(view: GraphView, name: str) -> bool:
    """Every element of ``name`` is proved finite (no ±inf, no NaN)."""
    r = value_range(view, name)
    return r is not None and math.isfinite(r[0]) and math.isfinite(r[1])


def _type_range(dtype: int | None) -> tuple[float, float] | None:
    if dtype == T.BOOL:
        return 0.0, 1.0
    np_type = onnx.helper.tensor_dtype_to_np_dtype(dtype) if dtype else None
    if np_type is not None and np.issubdtype(np_type, np.integer):
        info = np.iinfo(np_type)
        return float(info.min), float(info.max)
    return None


def _exact(x: float) -> Fraction | float:
    return Fraction(x) if math.isfinite(x) else x


def _sum(x: float, y: float) -> Fraction | float:
    """x + y exactly (a Fraction), or ±inf where an operand is infinite (the caller excludes inf - inf)."""
    return x + y if not (math.isfinite(x) and math.isfinite(y)) else Fraction(x) + Fraction(y)


def _float_bound(v: Fraction | float, down: bool) -> float:
    """A float64 on the outer side of the exact value ``v``."""
    f = float(v)
    if isinstance(v, Fraction) and Fraction(f) != v and (Fraction(f) > v) == down:
        f = float(np.nextafter(f, -np.inf if down else np.inf))
    return f


def _rounded(lo, hi, dtype: int | None) -> tuple[float, float] | None:
    """Bounds, as float64, of the exact values [lo, hi] (Fractions or floats) computed in ``dtype``: a
    value beyond the type's largest finite one may round to ±inf there (and does, from half an ulp
    on), one within it rounds to a finite value (rounding to nearest is monotone and the largest value
    is representable). An integer result beyond its type wraps around, and an unknown type bounds
    nothing: None."""
    if (isinstance(lo, float) and math.isnan(lo)) or (isinstance(hi, float) and math.isnan(hi)) or dtype is None:
        return None
    ints = _type_range(dtype)
    if ints is not None:
        return (_float_bound(lo, down=True), _float_bound(hi, down=False)) if ints[0] <= lo and hi <= ints[1] else None
    if dtype not in _FLOAT_TYPES:
        return None
    top = _LARGEST[dtype]
    low = -math.inf if lo < -top else max(_float_bound(lo, down=True), -top)
    high = math.inf if hi > top else min(_float_bound(hi, down=False), top)
    return low, high


class _Ranges:
    def __init__(self, view: GraphView):
        self.view = view
        self.memo: dict[str, tuple | None] = {}

    def of(self, name: str, depth: int) -> tuple[float, float] | None:
        if name not in self.memo:
            self.memo[name] = None if depth > _MAX_DEPTH else self._evaluate(name, depth)
        return self.memo[name]

    def _constant(self, name: str) -> tuple[float, float] | None:
        ref = self.view.constant_ref(name)
        if ref is None or int(np.prod(ref.dims, dtype=np.int64)) > _MAX_CONSTANT:
            return None
        if ref.tensor.data_location == T.EXTERNAL:
            # read from the model's folder (torch's dynamo exporter stores folded masks and position-bias tables
            # there), converted as the graph reads it; None where the folder is not known
            values = self.view.small_value(name, max_elements=_MAX_CONSTANT)
            if values is None:
                return None
            values = np.asarray(values, np.float64)
        else:
            values = numpy_helper.to_array(ref.tensor).astype(np.float64)
        if values.size == 0 or np.isnan(values).any():
            return None
        # the graph reads the stored value converted once to its own type (GraphView.constant_ref)
        return _rounded(_exact(float(values.min())), _exact(float(values.max())), self.view.dtype(name))

    def _evaluate(self, name: str, depth: int) -> tuple[float, float] | None:
        view = self.view
        if view.constant_ref(name) is not None:
            return self._constant(name)
        node = view.producer_of(name)
        if node is None:
            return _type_range(view.dtype(name)) if name in view.graph_inputs else None
        if node.domain not in ("", "ai.onnx"):
            return None
        op, ins = node.op_type, list(node.input)
        out_type = view.dtype(name)

        def sub(x):
            return self.of(x, depth + 1)

        if op in _SELECTING:
            return sub(ins[0])
        if op == "Concat":
            parts = [sub(x) for x in ins if x]
            return None if not parts or None in parts else (min(p[0] for p in parts), max(p[1] for p in parts))
        if op == "Where" and len(ins) == 3:
            a, b = sub(ins[1]), sub(ins[2])
            return None if a is None or b is None else (min(a[0], b[0]), max(a[1], b[1]))
        if op == "ConstantOfShape":
            t = attr(node, "value")
            v = float(numpy_helper.to_array(t).reshape(-1)[0]) if t is not None else 0.0
            return None if math.isnan(v) else (v, v)
        if op == "Cast":
            to = attr(node, "to")
            r = sub(ins[0])
            if r is None:
                return None
            if to == T.BOOL:
                return 0.0, 1.0
            if to in _FLOAT_TYPES:
                return _rounded(_exact(r[0]), _exact(r[1]), to)
            bounds = _type_range(to)
            # float → int truncates (monotone); out of the target's range it is undefined: not followed
            if bounds is None or r[0] < bounds[0] or r[1] > bounds[1]:
                return None
            return float(math.trunc(r[0])), float(math.trunc(r[1]))
        if op == "Neg":
            r = sub(ins[0])
            return None if r is None else (-r[1], -r[0])
        if op in ("Add", "Sub", "Mul", "Min", "Max") and len(ins) == 2:
            a, b = sub(ins[0]), sub(ins[1])
            if a is None or b is None:
                return None
            if op == "Min":
                return min(a[0], b[0]), min(a[1], b[1])
            if op == "Max":
                return max(a[0], b[0]), max(a[1], b[1])
            if op == "Sub":
                b = (-b[1], -b[0])
            if op in ("Add", "Sub"):
                # inf + (-inf) is NaN
                if (a[0] == -math.inf and b[1] == math.inf) or (a[1] == math.inf and b[0] == -math.inf):
                    return None
                return _rounded(_sum(a[0], b[0]), _sum(a[1], b[1]), out_type)
            if not all(math.isfinite(v) for v in a + b):
                return None  # 0 · inf is NaN; an infinite factor is not followed
            products = [Fraction(x) * Fraction(y) for x in a for y in b]
            return _rounded(min(products), max(products), out_type)
        return None
