"""Exact GELU spelled out with Erf: ``0.5 · x · (1 + erf(x / √2))``.

Matches ``Div(x, √2)`` or ``Mul(x, 1/√2)`` into ``Erf``, ``Add 1`` (either order) and the closing product
with ``x`` and ``0.5`` in every grouping PyTorch, Keras and TF write (the product is flattened, see
``rule.product``). The constants may be computed from constants (keras2onnx's ``Sqrt(2.0)``) and cast to
x's type (ONNX's own ``Gelu`` function body and onnxscript's functions: ``CastLike(2.0, x)``), see
``graph.GraphView.scalar``; ONNX's function body adds 1 with a two-operand ``Sum``. An Erf read by an Add of
anything else is still a candidate: refused with what that operand is, never skipped in silence.
"""

from __future__ import annotations

import math

from .graph import GraphView, is_add, is_op
from .rule import Activation, Refusal, close_to, closing_product, describe_miss, one_plus, product

RULE = "erf-gelu"
FORM = "erf-GELU"
INV_SQRT2 = 1.0 / math.sqrt(2.0)


class ErfGelu:
    rule = RULE
    anchors = (("", "Erf"),)

    def match(self, view: GraphView, i: int) -> Activation | Refusal | None:
        erf = view.nodes[i]
        p = one_plus(view, erf.output[0])
        if p is None:
            return _unread_addend(view, i)  # None: an Erf not followed by an Add is not a GELU
        involved = (view.node_name(i), view.node_name(p.node))
        arg = product(view, erf.input[0])
        if len(arg.leaves) != 1 or not arg.has_const:
            return Refusal(RULE, "the Erf argument is not x/√2 (one tensor times a constant)", involved)
        x = arg.leaves[0]
        if not close_to(arg.const, INV_SQRT2, arg.const_dtype):
            # Say it as the graph wrote it: x/1.414 reads better as "divisor 1.414 is not √2".
            div = view.producer_of(erf.input[0])
            if div is not None and is_op(div, "Div") and arg.const:
                miss = describe_miss("the Erf divisor", 1.0 / arg.const, math.sqrt(2.0), "√2", arg.const_dtype)
            else:
                miss = describe_miss("the Erf argument scale", arg.const, INV_SQRT2, "1/√2", arg.const_dtype)
            return Refusal(RULE, miss, involved)
        if not close_to(p.value, 1.0, p.dtype):
            return Refusal(RULE, describe_miss("the constant added to erf", p.value, 1.0, "1", p.dtype), involved)
        closing = closing_product(view, RULE, p.output, x, 0.5, "0.5", involved)
        if closing is None:
            return Refusal(RULE, "1 + erf(x/√2) is not multiplied by exactly x and 0.5", involved)
        if isinstance(closing, Refusal):
            return closing
        return Activation(form=FORM, input=x, output=closing.output,
                          nodes=frozenset({i, p.node} | arg.nodes | closing.nodes),
                          approximate="none", upcast=arg.upcast or closing.upcast)


def _unread_addend(view: GraphView, i: int) -> Refusal | None:
    """An Erf read only by an Add whose other operand is not a constant this view can read: the shape of
    ``1 + erf(x/√2)`` with a constant spelled in a way not followed (a CastLike to a type shape inference left
    unknown, a value computed by an op ``GraphView.folded_scalar`` does not compute). None for anything else."""
    erf_out = view.nodes[i].output[0]
    j = view.single_consumer(erf_out)
    add = view.nodes[j] if j is not None else None
    if add is None or not is_add(add) or len(add.input) != 2 or add.input[0] == add.input[1]:
        return None
    other = add.input[1] if add.input[0] == erf_out else add.input[0]
    producer = view.producer_of(other)
    if producer is not None:
        seen = f"computed by {producer.op_type} '{producer.name or other}'"
    else:
        seen = "a graph input" if other in view.graph_inputs else "not a one-element constant"
    return Refusal(RULE, f"the Erf is read by Add '{view.node_name(j)}' of '{other}' ({seen}), not of a constant "
                         "onnxfuse can read as 1", (view.node_name(i), view.node_name(j)))
