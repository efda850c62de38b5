"""The GELU operators as rules: ONNX Gelu-20 and the com.microsoft ops, one declarative row each."""

from __future__ import annotations

import onnx
import pytest

from onnxfuse.fuse import fuse_model
from onnxfuse.patterns.gelu_ops import RULES
from onnxfuse.patterns.graph import GraphView
from onnxfuse.patterns.rule import Activation, Refusal
from tests.graphs import Builder


def one_node(op, inputs, domain="", **attrs):
    b = Builder()
    y = b.node(op, inputs, domain=domain, **attrs)
    model = b.model([("x", [4, 8]), ("bias", [8])], [(y, [4, 8])])
    return GraphView(model.graph)


def match(view):
    node = view.nodes[0]
    (rule,) = [r for r in RULES if r.op_type == node.op_type and (r.domain or "") == node.domain]
    return rule.match(view, 0)


@pytest.mark.parametrize("op,domain,attrs,inputs,expect", [
    ("Gelu", "", {}, ["x"], ("Gelu(erf)", "none", None, None)),
    ("Gelu", "", {"approximate": "tanh"}, ["x"], ("Gelu(tanh)", "tanh", None, None)),
    ("Gelu", "com.microsoft", {}, ["x"], ("com.microsoft.Gelu", "none", None, None)),
    ("BiasGelu", "com.microsoft", {}, ["x", "bias"], ("com.microsoft.BiasGelu", "none", None, "bias")),
    ("FastGelu", "com.microsoft", {}, ["x"], ("com.microsoft.FastGelu", "tanh", None, None)),
    ("FastGelu", "com.microsoft", {}, ["x", "bias"], ("com.microsoft.FastGelu+bias", "tanh", None, "bias")),
    ("QuickGelu", "com.microsoft", {}, ["x"], ("com.microsoft.QuickGelu", "sigmoid", 1.702, None)),
    ("QuickGelu", "com.microsoft", {"alpha": 1.0}, ["x"], ("com.microsoft.QuickGelu", "sigmoid", 1.0, None)),
])
def test_each_operator_becomes_the_canonical_activation(op, domain, attrs, inputs, expect):
    form, approximate, alpha, bias = expect
    act = match(one_node(op, inputs, domain, **attrs))
    assert isinstance(act, Activation)
    assert (act.form, act.approximate, act.bias) == (form, approximate, bias)
    assert act.alpha == (None if alpha is None else pytest.approx(alpha, rel=1e-6))
    assert (act.input, act.nodes) == ("x", frozenset({0}))


def test_unknown_approximate_is_refused():
    result = match(one_node("Gelu", ["x"], approximate="fast"))
    assert isinstance(result, Refusal) and "approximate='fast'" in result.reason


def test_malformed_contrib_node_is_no_candidate():
    b = Builder()
    b.nodes.append(onnx.helper.make_node("QuickGelu", [], ["y"], domain="com.microsoft"))
    model = b.model([("x", [4, 8])], [("y", [4, 8])])
    result = fuse_model(model)
    assert not result.report.fused and not result.report.refused
