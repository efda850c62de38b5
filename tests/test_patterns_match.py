"""The shared matching toolkit: parent paths and the one refusal exception (the Linear matcher: test_linear_match)."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from onnxfuse.patterns.graph import GraphView
from onnxfuse.patterns.match import Refused, parent_path
from onnxfuse.patterns.rule import Refusal


def _view() -> GraphView:
    # y = Gelu(Add(b, MatMul(x, W)))  with the bias Add's operands in the "wrong" order, plus a
    # com.microsoft op on a side branch
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["mm"], name="mm"),
        helper.make_node("Add", ["b", "mm"], ["pre"], name="add"),
        helper.make_node("Gelu", ["pre"], ["y"], name="gelu"),
        helper.make_node("FastGelu", ["mm"], ["z"], name="fast", domain="com.microsoft"),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", T.FLOAT, [2, 3]), helper.make_tensor_value_info("z", T.FLOAT, [2, 3])],
        [helper.make_tensor("W", T.FLOAT, [4, 3], [0.0] * 12), helper.make_tensor("b", T.FLOAT, [3], [0.0] * 3)])
    return GraphView(onnx.helper.make_model(graph).graph)


def test_path_with_fixed_inputs():
    view = _view()
    assert parent_path(view, "y", ["Gelu", "Add", "MatMul"], [0, 1]) == [2, 1, 0]
    # input 0 of the Add is the bias, not the MatMul: the path breaks
    assert parent_path(view, "y", ["Gelu", "Add", "MatMul"], [0, 0]) is None


def test_path_with_any_input():
    view = _view()
    assert parent_path(view, "y", ["Gelu", "Add", "MatMul"], [0, None]) == [2, 1, 0]


def test_default_inputs_read_input_zero():
    view = _view()
    assert parent_path(view, "pre", ["Add"]) == [1]
    assert parent_path(view, "y", ["Gelu", "Add"]) == [2, 1]
    assert parent_path(view, "y", ["Gelu", "Add", "MatMul"]) is None  # the MatMul is input 1


def test_domain_steps():
    view = _view()
    assert parent_path(view, "z", [("com.microsoft", "FastGelu"), "MatMul"]) == [3, 0]
    assert parent_path(view, "z", ["FastGelu"]) is None  # not the default domain
    assert parent_path(view, "x", ["MatMul"]) is None  # a graph input has no producer


def test_input_count_must_fit_the_path():
    with pytest.raises(ValueError):
        parent_path(_view(), "y", ["Gelu", "Add", "MatMul"], [0])


def test_refused_carries_its_reason():
    e = Refused("the bias is not [N]")
    assert e.reason == "the bias is not [N]"
    assert e.as_refusal("linear", ["n1"]) == Refusal("linear", "the bias is not [N]", ("n1",))


# The rule modules of the GELU fusion, the shared matchers and the rules beside them: every exception they define
# is a Refused, so that a reason reaches the user one way whichever stage found it.
_RULE_MODULES = ("match", "linear_match", "linear", "qkv", "linear_gelu", "rule", "erf", "tanh", "sigmoid",
                 "gelu_ops", "casts", "skip_norm_bias", "embedding_norm", "guard_into_skip_norm")


@pytest.mark.parametrize("module", _RULE_MODULES)
def test_every_refusal_exception_is_a_refused(module):
    import importlib
    import inspect

    mod = importlib.import_module(f"onnxfuse.patterns.{module}")
    own = [c for _, c in inspect.getmembers(mod, inspect.isclass)
           if c.__module__ == mod.__name__ and issubclass(c, BaseException)]
    assert all(issubclass(c, Refused) for c in own), [c.__name__ for c in own if not issubclass(c, Refused)]


def test_not_packed_and_not_linear_are_refusals():
    from onnxfuse.patterns.linear_match import NotLinear
    from onnxfuse.patterns.qkv import NotPacked

    for cls in (NotPacked, NotLinear):
        e = cls("the reason")
        assert isinstance(e, Refused) and e.as_refusal("attention").reason == "the reason"
