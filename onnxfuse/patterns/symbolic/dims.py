"""Dimensions as the symbolic evaluator proves them: :class:`Dim` monomials and the arithmetic on them.

A dimension is an integer, or a product of named symbols: a ``dim_param`` or inferred symbol (two tensors
whose dims carry the same symbol have the same size: that is what the ONNX symbol means), or
``Shape(x)[i]`` of one tensor, equal only to itself. Equality of two :class:`Dim` values is the only proof
of equal sizes that the rules accept; nothing here compares sizes any other way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..graph import GraphView

INT64_MAX = 2**63 - 1


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


def product(dims) -> Dim:
    """The product of ``dims`` (1 for none)."""
    out = Dim(1)
    for d in dims:
        out = out * d
    return out


def broadcast_dims(shapes: list) -> tuple:
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
