"""The values the symbolic evaluator computes, and the arithmetic on their formulas.

A value is one of:

* :class:`Vec` — a small int64 vector (or scalar) whose elements are :class:`~.dims.Dim` monomials: products
  of integers and symbolic dimensions (``Shape(x)[i]``);
* :class:`BoolVec` — the result of comparing two such vectors element by element, where it is decided;
* :class:`Index` — a tensor given by a formula of its own indices: ``Range(0, n)`` is the tensor whose
  element at position ``i`` is ``i``; Unsqueeze/Expand/compare/And/Add/Mul/GatherND build formulas of
  those. Its ``extents`` are Dims (1 for a broadcast axis);
* :class:`Data` — a tensor of unknown values the formula may index into (an ``attention_mask``);
  :class:`FlatData` is such a tensor seen through ``Flatten``.

A formula is a nested tuple: ``("axis", a)`` (the index along axis ``a``), ``("const", v)``, ``("data", d,
row, col)`` (element [row, col] of :class:`Data` ``d``), ``("flatdata", d, cols, i)``, ``("flat", extents,
inner)``, ``("stack", a, b)``, or an operation over formulas (``("and", a, b)``, ``("le", a, b)``, ``("add",
a, b)``, ``("abs", a)``, ...). :func:`conjuncts` reads a boolean mask formula as the terms a rule proves.

Anything the evaluator does not model raises :class:`NotSymbolic` with a reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..match import Refused
from .dims import Dim, clamp_dim


class NotSymbolic(Refused):
    """The value cannot be followed symbolically; the message says where and why. A ``match.Refused``:
    where a rule lets it reach the user, it is the reason the candidate stays."""


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
    """``expr`` with every axis ``a`` it reads renamed ``mapping(a)``."""
    if expr[0] == "axis":
        return ("axis", mapping(expr[1]))
    if expr[0] == "const":
        return expr
    if expr[0] == "data":
        return ("data", expr[1], *(shift_axes(e, mapping) for e in expr[2:]))
    if expr[0] == "flatdata":
        return ("flatdata", expr[1], expr[2], shift_axes(expr[3], mapping))
    return (expr[0], *(shift_axes(e, mapping) for e in expr[1:]))


def broadcast(a: tuple, b: tuple, where: str) -> tuple:
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


def aligned(v: Index, rank: int) -> Index:
    """``v`` with leading broadcast axes added up to ``rank`` (its formula's axes shift right)."""
    k = rank - len(v.extents)
    if k <= 0:
        return v
    return Index((Dim(1),) * k + v.extents, shift_axes(v.expr, lambda a: a + k))


def as_index(v: Value) -> Value:
    """A one-element shape value as a constant index tensor (a scalar, or a [1] that broadcasts)."""
    if isinstance(v, Vec) and len(v.items) == 1:
        d = v.items[0]
        return Index(() if v.scalar else (Dim(1),), ("const", d.coef if d.is_int else d))
    return v


def addable(a: Vec, b: Vec) -> bool:
    """Shape arithmetic ``a + b`` stays a vector of monomials: equal lengths (or one scalar) and each pair
    of the same factors (ints: (d + 2) / 3 of a known d), or one of them 0 (transformers' decoders add the
    cache's length, 0 without a cache, to the sequence's)."""
    n = max(len(a.items), len(b.items))
    xs = a.items * n if len(a.items) == 1 else a.items
    ys = b.items * n if len(b.items) == 1 else b.items
    return len(xs) == len(ys) and all(x.factors == y.factors or Dim(0) in (x, y) for x, y in zip(xs, ys))


def is_boolean(expr: tuple) -> bool:
    return expr[0] in ("and", "le", "ge", "lt", "gt", "eq") or (expr[0] == "const" and isinstance(expr[1], bool)) \
        or (expr[0] == "data" and expr[1].as_bool) or (expr[0] == "flatdata" and expr[1].as_bool)


def non_unit(dims) -> tuple:
    return tuple(d for d in dims if d != Dim(1))


def reindex_units(src: tuple, expr: tuple, dst: tuple) -> Index:
    """Reshape that only drops or inserts axes of extent 1: the formula's axes move with their extents.
    A formula that reads an extent-1 axis reads index 0 there, which the new layout keeps implicit only
    if it is not read, so such a formula is not moved."""
    src_axes = [a for a, d in enumerate(src) if d != Dim(1)]
    dst_axes = [a for a, d in enumerate(dst) if d != Dim(1)]
    read = axes_read(expr)
    if read - set(src_axes):
        raise NotSymbolic("Reshape drops an axis the index formula reads")
    mapping = dict(zip(src_axes, dst_axes))
    return Index(tuple(dst), shift_axes(expr, mapping.__getitem__))


def axes_read(expr: tuple) -> set[int]:
    """The index axes a formula depends on."""
    kind = expr[0]
    if kind == "axis":
        return {expr[1]}
    if kind == "const":
        return set()
    if kind == "flat":  # ("flat", extents, inner): the inner formula's axes
        return axes_read(expr[2])
    operands = {"data": expr[2:], "flatdata": expr[3:]}.get(kind, expr[1:])
    out: set[int] = set()
    for e in operands:
        out |= axes_read(e)
    return out


def vec_arith(a: Vec, b: Vec, op: str) -> Value:
    """Shape arithmetic on two vectors, element by element (one of length 1 broadcasts)."""
    n = max(len(a.items), len(b.items))
    xs = a.items * n if len(a.items) == 1 else a.items
    ys = b.items * n if len(b.items) == 1 else b.items
    if len(xs) != len(ys):
        raise NotSymbolic("shape arithmetic on vectors of different lengths")
    if op == "mul":
        return Vec(tuple(x * y for x, y in zip(xs, ys)), scalar=a.scalar and b.scalar)
    if op in ("add", "sub"):  # monomials of the same factors (ints among them: addable); zero is the int 0
        sums = (x.coef + y.coef if op == "add" else x.coef - y.coef for x, y in zip(xs, ys))
        return Vec(tuple(Dim(c, (x.factors or y.factors) if c else ()) for c, x, y in zip(sums, xs, ys)),
                   scalar=a.scalar and b.scalar)
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
