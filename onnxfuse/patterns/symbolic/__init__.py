"""Symbolic evaluation of the small integer and boolean subgraphs that exporters write around attention:
reshape targets built from ``Shape`` slices, and attention masks built from index ranges. Nothing here runs
the model; what cannot be followed raises :class:`NotSymbolic`, and a rule that needs a proof refuses.

- ``dims``: :class:`Dim`, a dimension as an integer or a product of symbols, and the arithmetic on them;
- ``values``: the values a tensor evaluates to (:class:`Vec`, :class:`Index`, :class:`Data`, ...), their
  formulas, and :func:`conjuncts`/:func:`simplify`, which read a boolean mask formula as its terms;
- ``shapes``: the forward pass that carries dimensions and element types over from the graph inputs
  (:class:`~.shapes.ShapePass`);
- ``evaluator``: :class:`Evaluator`, which follows a tensor back through the ops it models (one method per
  op) on top of that pass.
"""

from __future__ import annotations

from .dims import INT64_MAX, Dim, clamp_dim, clamped_to, inferred_dim
from .evaluator import Evaluator
from .shapes import ShapePass
from .values import (TRUE, BoolVec, Data, FlatData, Index, NotSymbolic, Value, Vec, axis, conjuncts, shift_axes,
                     simplify)

__all__ = [
    "INT64_MAX", "TRUE", "BoolVec", "Data", "Dim", "Evaluator", "FlatData", "Index", "NotSymbolic", "ShapePass",
    "Value", "Vec", "axis", "clamp_dim", "clamped_to", "conjuncts", "inferred_dim", "shift_axes", "simplify"
]
