"""The shared algebra of the rules: constant comparison, product flattening, operand orders."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest

from onnxfuse.patterns.graph import GraphView
from onnxfuse.patterns.rule import close_to, operand_orders, product
from tests.graphs import Builder

T = onnx.TensorProto


@pytest.mark.parametrize("dtype,np_dtype", [(T.FLOAT, np.float32), (T.FLOAT16, np.float16)])
@pytest.mark.parametrize("ref", [math.sqrt(2), 1 / math.sqrt(2), 0.5, math.sqrt(2 / math.pi), 0.044715, 1.702])
def test_a_constant_rounded_to_its_dtype_is_accepted(ref, dtype, np_dtype):
    assert close_to(float(np_dtype(ref)), ref, dtype)


@pytest.mark.parametrize("value,ref,dtype", [
    (1.414, math.sqrt(2), T.FLOAT), (1.4142, math.sqrt(2), T.FLOAT), (0.7978, math.sqrt(2 / math.pi), T.FLOAT),
    (0.0447, 0.044715, T.FLOAT), (1.7, 1.702, T.FLOAT16), (0.49, 0.5, T.FLOAT16),
])
def test_a_near_miss_is_refused(value, ref, dtype):
    assert not close_to(value, ref, dtype)


def _view(b: Builder, outputs) -> GraphView:
    model = b.model([("x", [4, 8])], [(o, [4, 8]) for o in outputs])
    return GraphView(model.graph)


@pytest.mark.parametrize("grouping", range(4))
def test_every_grouping_flattens_to_one_product(grouping):
    b = Builder()
    half = b.const(0.5)
    y = [
        lambda: b.node("Mul", [b.node("Mul", ["x", "p"]), half]),
        lambda: b.node("Mul", ["x", b.node("Mul", [half, "p"])]),
        lambda: b.node("Mul", [b.node("Mul", [half, "x"]), "p"]),
        lambda: b.node("Div", [b.node("Mul", ["p", "x"]), b.const(2.0)]),
    ][grouping]()
    b2 = b.model([("x", [4, 8]), ("p", [4, 8])], [(y, [4, 8])])
    prod = product(GraphView(b2.graph), y)
    assert sorted(prod.leaves) == ["p", "x"] and prod.const == 0.5 and len(prod.nodes) == 2


def test_powers_expand_and_shared_factors_stay_whole():
    b = Builder()
    cube = b.node("Pow", ["x", b.const(3.0)])
    shared = b.node("Mul", ["x", b.const(2.0)])
    y = b.node("Mul", [cube, shared])
    view = _view(b, [y, shared])  # `shared` is also a graph output: a factor, not part of this product
    prod = product(view, y)
    assert sorted(prod.leaves) == sorted(["x", "x", "x", shared]) and not prod.has_const


def test_upcast_casts_are_seen_through():
    b = Builder()
    c = b.node("Cast", ["x"], to=T.FLOAT)
    y = b.node("Mul", [c, b.const(0.5)])
    prod = product(_view(b, [y]), y)
    assert prod.leaves == ["x"] and prod.upcast


def test_operand_orders():
    node = onnx.helper.make_node("Add", ["a", "b"], ["c"])
    assert list(operand_orders(node)) == [("a", "b"), ("b", "a")]
    assert list(operand_orders(onnx.helper.make_node("Add", ["a", "a"], ["c"]))) == [("a", "a")]
    assert list(operand_orders(onnx.helper.make_node("Add", ["a"], ["c"]))) == []
