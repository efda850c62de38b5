"""The domain and op name are one fact shared by Python (onnxfuse.domain) and C++ (src/domain.h), and
the onnx schema makes checker/shape inference accept models that use the op."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxfuse
from onnxfuse.domain import DOMAIN, DOMAIN_VERSION, OP_SINCE_VERSION, OP_TYPE
from onnxfuse.errors import BadInputError
from onnxfuse.runtime import create_session

_DOMAIN_H = Path(__file__).resolve().parents[1] / "custom_ops" / "src" / "domain.h"


def _model(domain: str, x_shape=(3, 4), w_shape=(5, 4), trans_b=1, bias=True) -> onnx.ModelProto:
    inputs = ["X", "W", "B"] if bias else ["X", "W"]
    # The op's output feeds an Identity, so shape inference has an intermediate value to fill in.
    node = helper.make_node(OP_TYPE, inputs, ["H"], domain=domain, approximate="tanh", transB=trans_b)
    identity = helper.make_node("Identity", ["H"], ["Y"])
    n = w_shape[0] if trans_b else w_shape[1]
    graph_inputs = [
        helper.make_tensor_value_info("X", TensorProto.FLOAT, list(x_shape)),
        helper.make_tensor_value_info("W", TensorProto.FLOAT, list(w_shape)),
    ]
    if bias:
        graph_inputs.append(helper.make_tensor_value_info("B", TensorProto.FLOAT, [n]))
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [f"y{i}" for i in range(len(x_shape))])
    graph = helper.make_graph([node, identity], "g", graph_inputs, [y])
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid(domain, DOMAIN_VERSION)], ir_version=10
    )


def test_python_and_cpp_agree_on_domain_and_op():
    text = _DOMAIN_H.read_text()
    assert re.search(r'kDomain\s*=\s*"([^"]+)"', text).group(1) == DOMAIN
    assert re.search(r'kOpType\s*=\s*"([^"]+)"', text).group(1) == OP_TYPE
    assert int(re.search(r"kDomainVersion\s*=\s*(\d+)", text).group(1)) == DOMAIN_VERSION
    assert int(re.search(r"kOpSinceVersion\s*=\s*(\d+)", text).group(1)) == OP_SINCE_VERSION
    assert onnx.defs.get_schema(OP_TYPE, DOMAIN_VERSION, DOMAIN).since_version == OP_SINCE_VERSION
    assert onnxfuse.DOMAIN == DOMAIN == "ai.onnxfuse"


def test_the_library_serves_exactly_onnxfuse_domain():
    """A real ORT session: the node in onnxfuse.DOMAIN runs; the same node in another domain has no kernel."""
    feeds = {"X": np.ones((3, 4), np.float32), "W": np.ones((5, 4), np.float32), "B": np.zeros(5, np.float32)}
    (y,) = create_session(_model(onnxfuse.DOMAIN), providers="cpu").run(None, feeds)
    assert y.shape == (3, 5)
    np.testing.assert_allclose(y, 4 * 0.5 * (1 + np.tanh(np.sqrt(2 / np.pi) * (4 + 0.044715 * 64))), rtol=1e-6)
    with pytest.raises(BadInputError):
        create_session(_model(onnxfuse.DOMAIN + ".other"), providers="cpu")


@pytest.mark.parametrize("trans_b,w_shape", [(1, (5, 4)), (0, (4, 5))])
def test_checker_and_shape_inference(trans_b, w_shape):
    model = _model(DOMAIN, x_shape=(2, 3, 4), w_shape=w_shape, trans_b=trans_b)
    onnx.checker.check_model(model, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    (h,) = [v for v in inferred.graph.value_info if v.name == "H"]
    assert h.type.tensor_type.elem_type == TensorProto.FLOAT
    assert [d.dim_value for d in h.type.tensor_type.shape.dim] == [2, 3, 5]


def test_checker_accepts_no_bias():
    onnx.checker.check_model(_model(DOMAIN, bias=False), full_check=True)
