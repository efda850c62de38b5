"""GELU's tanh approximation spelled out, in the two ways exporters write it:

* ``0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³)))``  — GPT-2/NewGELU, ``x³`` as ``Pow(x, 3)`` or
  ``x·x·x``;
* ``0.5 · x · (1 + tanh(0.79788456 · x · (1 + 0.044715 · x · x)))`` — BLOOM, Megatron.

Every Mul grouping and operand order is one flattened product; the two Adds (or two-operand Sums) are tried in
both orders. ONNX's own ``Gelu(approximate="tanh")`` function body is the first form, with ``√(2/π)`` computed
as ``Sqrt(2/π)``, its literals cast to x's type and its sums written with ``Sum`` (see ``graph.GraphView.scalar``).
"""

from __future__ import annotations

import math

from .graph import GraphView, is_add
from .rule import (Activation, Product, Refusal, close_to, closing_product, describe_miss, one_plus,
                   operand_orders, product, upcast_root)

RULE = "tanh-gelu"
FORM = "tanh-GELU"
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
CUBIC = 0.044715


def _cubic_term(view: GraphView, t: str, x: str, power: int) -> Product | str | None:
    """``t = 0.044715 · x^power``: the Product, a near-miss reason, or None if it is not that shape."""
    term = product(view, t)
    if sorted(term.leaves) != [x] * power or not term.has_const:
        return None
    if not close_to(term.const, CUBIC, term.const_dtype):
        return describe_miss("the cubic coefficient", term.const, CUBIC, "0.044715", term.const_dtype)
    return term


def _inner(view: GraphView, arg: Product) -> tuple[str, set[int], bool] | str | None:
    """Find ``x`` inside the tanh argument ``arg`` (already known to carry √(2/π)): (x, nodes, upcast), a
    near-miss reason, or None."""
    miss = None
    if len(arg.leaves) == 1:  # √(2/π) · (x + 0.044715·x³)
        i = view.producer.get(arg.leaves[0])
        if i is None or not is_add(view.nodes[i]):
            return None
        for u, v in operand_orders(view.nodes[i]):
            nodes = {i}
            x, upcast = upcast_root(view, u, nodes)
            term = _cubic_term(view, v, x, 3)
            if isinstance(term, Product):
                return x, nodes | term.nodes, upcast or term.upcast
            miss = miss or term
    elif len(arg.leaves) == 2:  # √(2/π) · x · (1 + 0.044715·x·x)
        for x, q in (arg.leaves, arg.leaves[::-1]):
            i = view.producer.get(q)
            if i is None or not is_add(view.nodes[i]) or view.single_consumer(q) is None:
                continue
            for c, r in operand_orders(view.nodes[i]):
                one = view.scalar(c)
                if one is None:
                    continue
                if not close_to(one[0], 1.0, one[1]):
                    miss = miss or describe_miss("the constant in (1 + 0.044715·x²)", one[0], 1.0, "1", one[1])
                    continue
                term = _cubic_term(view, r, x, 2)
                if isinstance(term, Product):
                    return x, {i} | term.nodes, arg.upcast or term.upcast
                miss = miss or term
    return miss


class TanhGelu:
    rule = RULE
    anchors = (("", "Tanh"),)

    def match(self, view: GraphView, i: int) -> Activation | Refusal | None:
        tanh = view.nodes[i]
        p = one_plus(view, tanh.output[0])
        if p is None:
            return None  # a Tanh not followed by 1 + tanh(...) (a pooler, an RNN cell) is not a GELU
        involved = (view.node_name(i), view.node_name(p.node))
        arg = product(view, tanh.input[0])
        if not arg.has_const:
            return Refusal(RULE, "the tanh argument has no √(2/π) factor", involved)
        if not close_to(arg.const, SQRT_2_OVER_PI, arg.const_dtype):
            return Refusal(RULE, describe_miss("the tanh argument scale", arg.const, SQRT_2_OVER_PI, "√(2/π)",
                                               arg.const_dtype), involved)
        inner = _inner(view, arg)
        if inner is None:
            return Refusal(RULE, "the tanh argument is not √(2/π)·(x + 0.044715·x³)", involved)
        if isinstance(inner, str):
            return Refusal(RULE, inner, involved)
        x, inner_nodes, upcast = inner
        if not close_to(p.value, 1.0, p.dtype):
            return Refusal(RULE, describe_miss("the constant added to tanh", p.value, 1.0, "1", p.dtype), involved)
        closing = closing_product(view, RULE, p.output, x, 0.5, "0.5", involved)
        if closing is None:
            return Refusal(RULE, "1 + tanh(...) is not multiplied by exactly x and 0.5", involved)
        if isinstance(closing, Refusal):
            return closing
        return Activation(form=FORM, input=x, output=closing.output,
                          nodes=frozenset({i, p.node} | arg.nodes | inner_nodes | closing.nodes),
                          approximate="tanh", upcast=upcast or arg.upcast or closing.upcast)
