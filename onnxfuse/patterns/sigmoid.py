"""QuickGELU spelled out: ``x · sigmoid(1.702 · x)`` (CLIP).

The scale is kept as written in the graph (as the fused node's ``alpha``), so the fused node computes
exactly what the model did. A scale far from 1.702 is a different activation (``x·sigmoid(x)`` is SiLU,
not GELU): refused with its value. A Sigmoid without a constant scale is not a candidate at all.
"""

from __future__ import annotations

from ..domain import DEFAULT_SIGMOID_ALPHA
from .graph import GraphView
from .rule import Activation, Refusal, close_to, closing_product, describe_miss, product

RULE = "sigmoid-gelu"
FORM = "sigmoid-GELU"
# QuickGELU's 1.702 is itself an empirical fit, and exporters write it as 1.702 in every precision;
# compare at the precision of the constant like every other GELU constant.


class SigmoidGelu:
    rule = RULE
    anchors = (("", "Sigmoid"),)

    def match(self, view: GraphView, i: int) -> Activation | Refusal | None:
        sig = view.nodes[i]
        arg = product(view, sig.input[0])
        if len(arg.leaves) != 1 or not arg.has_const:
            return None  # sigmoid(x) alone (SiLU, gates): not a GELU form
        x = arg.leaves[0]
        involved = (view.node_name(i),)
        closing = closing_product(view, RULE, sig.output[0], x, 1.0, "1", involved)
        if closing is None:
            return None  # a scaled sigmoid that does not multiply its own input
        if isinstance(closing, Refusal):
            return closing
        if not close_to(arg.const, DEFAULT_SIGMOID_ALPHA, arg.const_dtype):
            return Refusal(RULE, describe_miss("the sigmoid scale", arg.const, DEFAULT_SIGMOID_ALPHA,
                                               "QuickGELU's 1.702", arg.const_dtype), involved)
        return Activation(form=FORM, input=x, output=closing.output,
                          nodes=frozenset({i} | arg.nodes | closing.nodes),
                          approximate="sigmoid", alpha=arg.const, upcast=arg.upcast or closing.upcast)
