"""ONNX's elementwise ops on one element, in the graph's own element types: what one entry of a mask's cone
computes (``mask_semantics`` evaluates the scalar function ``mask_cone`` reads off the graph).

Every value is a numpy 0-d array of the tensor's element type, and every op computes as ONNX defines it, never
in float64: float16 and float32 arithmetic rounds to nearest in the type itself (numpy computes a float16
``+ - * /`` in float32 and rounds once more, which gives the correctly rounded float16 result: float32 has
more than twice float16's precision plus two bits), so a fill is the bit pattern the graph computes
(``(1 - 0) · finfo(float16).min`` is -65504, ``(1 - 0) · finfo(float32).min`` cast to float16 is -inf).
Casts follow ONNX's Cast: to bool, nonzero (NaN too) is true; to a float type, rounded to nearest with
overflow to ±inf; float to an integer truncates toward zero, and a value the target cannot hold (NaN, ±inf,
out of range) is undefined there: :class:`Undefined`. Integer ``Div`` truncates toward zero; by zero it is
undefined. ``Min``/``Max`` of a NaN are left undefined too (the runtimes disagree).

An element of an integer or float ``attention_mask`` may also be known only as zero or nonzero
(:class:`ZeroTest`): the ops that look at nothing else — Cast to bool, ``Equal`` with 0, Casts that keep
zero zero and nonzero nonzero (integer or bool to any float, integer to a wider integer, float to a wider
float), Identity, Where's choice — carry it; any other op raises :class:`NeedsValue`, and the caller
evaluates at concrete values instead. Anything else not modelled raises :class:`Undefined`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

T = onnx.TensorProto
FLOAT_TYPES = (T.FLOAT16, T.FLOAT, T.DOUBLE)
INT_TYPES = (T.INT8, T.INT16, T.INT32, T.INT64, T.UINT8, T.UINT16, T.UINT32, T.UINT64)
COMPARISONS = {"Equal": np.equal, "Less": np.less, "LessOrEqual": np.less_equal, "Greater": np.greater,
               "GreaterOrEqual": np.greater_equal}
_LOGICAL = {"And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor}
_ARITHMETIC = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}


class Undefined(Exception):
    """ONNX leaves the value undefined, or the op is not modelled: nothing is proved from it."""


class NeedsValue(Exception):
    """An op reads more of an element than whether it is zero."""


@dataclass(frozen=True)
class ZeroTest:
    """An element known only as zero or nonzero, of ONNX element type ``dtype``."""

    nonzero: bool
    dtype: int


Value = np.ndarray | ZeroTest


def np_type(dtype: int):
    return onnx.helper.tensor_dtype_to_np_dtype(dtype)


def typed(value, dtype: int) -> np.ndarray:
    """``value`` as a 0-d array of ONNX type ``dtype`` (exact: the caller passes a value of that type)."""
    return np.asarray(value, dtype=np_type(dtype)).reshape(())


def dtype_of(v: Value) -> int:
    return v.dtype if isinstance(v, ZeroTest) else onnx.helper.np_dtype_to_tensor_dtype(v.dtype)


def _keeps_zero(src: int, to: int) -> bool:
    """A Cast from ``src`` to ``to`` maps 0 to 0 and every nonzero value to a nonzero one."""
    if src == to:
        return True
    if src == T.BOOL:
        return to in FLOAT_TYPES or to in INT_TYPES
    if src in INT_TYPES:  # (an integer wraps into one at least as wide: a nonzero value stays nonzero)
        return to in FLOAT_TYPES or (to in INT_TYPES and np.iinfo(np_type(to)).bits >= np.iinfo(np_type(src)).bits)
    return src in FLOAT_TYPES and to in FLOAT_TYPES and np.finfo(np_type(to)).bits >= np.finfo(np_type(src)).bits


def cast(x: Value, to: int) -> Value:
    """ONNX ``Cast(x, to)``."""
    if isinstance(x, ZeroTest):
        if to == T.BOOL:
            return typed(x.nonzero, T.BOOL)
        if _keeps_zero(x.dtype, to):
            return ZeroTest(x.nonzero, to)
        raise NeedsValue
    if to == T.BOOL:
        return typed(x != 0, T.BOOL)
    if to in FLOAT_TYPES:
        with np.errstate(all="ignore"):
            return typed(x.astype(np_type(to)), to)
    if to in INT_TYPES:
        if x.dtype.kind == "f":
            if not np.isfinite(x):
                raise Undefined
            whole = np.trunc(x.astype(np.float64))
            info = np.iinfo(np_type(to))
            if not info.min <= whole <= info.max:
                raise Undefined
            return typed(int(whole), to)
        return typed(x.astype(np_type(to)), to)  # integers and bools: wrapped as a C cast does
    raise Undefined


def apply(op: str, args: list[Value], to: int | None = None) -> Value:
    """ONNX op ``op`` on one element of each operand (``to``: Cast's and CastLike's target type)."""
    if op in ("Identity",):
        return args[0]
    if op in ("Cast", "CastLike"):
        return cast(args[0], to)
    if op == "Where":
        c, x, y = args
        if isinstance(c, ZeroTest):
            raise NeedsValue
        return x if bool(c) else y
    if op == "Equal" and any(isinstance(a, ZeroTest) for a in args):
        test, other = (args[0], args[1]) if isinstance(args[0], ZeroTest) else (args[1], args[0])
        if isinstance(other, ZeroTest) or other != 0:
            raise NeedsValue
        return typed(not test.nonzero, T.BOOL)
    if any(isinstance(a, ZeroTest) for a in args):
        raise NeedsValue
    if len({a.dtype for a in args}) != 1:
        raise Undefined  # ONNX ties the operands to one type: a graph that mixes them is not modelled
    x = args[0]
    with np.errstate(all="ignore"):
        if op in COMPARISONS:
            return typed(COMPARISONS[op](*args), T.BOOL)
        if op in _LOGICAL:
            return typed(_LOGICAL[op](*args), T.BOOL)
        if op == "Not":
            return typed(np.logical_not(x), T.BOOL)
        if x.dtype == np.bool_:
            raise Undefined  # arithmetic on bools is no ONNX op
        if op == "Neg":
            return typed(np.negative(x), dtype_of(x))
        if op == "Abs":
            return typed(np.abs(x), dtype_of(x))
        if op in _ARITHMETIC:
            return typed(_ARITHMETIC[op](*args), dtype_of(x))
        if op == "Div":
            return _divide(*args)
        if op in ("Min", "Max"):
            if any(a.dtype.kind == "f" and np.isnan(a) for a in args):
                raise Undefined
            pick = np.minimum if op == "Min" else np.maximum
            out = args[0]
            for a in args[1:]:
                out = pick(out, a)
            return typed(out, dtype_of(x))
    raise Undefined


def _divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "f":
        return typed(np.divide(a, b), dtype_of(a))
    if b == 0:
        raise Undefined
    quotient = abs(int(a)) // abs(int(b))
    return typed(quotient if (a < 0) == (b < 0) else -quotient, dtype_of(a))
