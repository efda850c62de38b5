"""value_range: bounds proved from the graph, and finiteness of additive biases."""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from onnxfuse.patterns.graph import GraphView, infer_types
from onnxfuse.patterns.value_range import is_finite, value_range

F32_MIN = float(np.finfo(np.float32).min)


def _view(nodes, inputs, inits=()):
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(nodes[-1].output[0], T.FLOAT, None)],
                              list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return GraphView(model.graph, inferred=list(infer_types(model).value_info), opset=17)


def _one_minus_mask_times(c: float, mask_type: int, cast_to_bool: bool = False, dtype=T.FLOAT):
    nodes = []
    src = "mask"
    if cast_to_bool:
        nodes.append(helper.make_node("Cast", [src], ["as_bool"], to=T.BOOL))
        src = "as_bool"
    nodes += [helper.make_node("Cast", [src], ["m"], to=dtype),
              helper.make_node("Sub", ["one", "m"], ["inv"]),
              helper.make_node("Mul", ["inv", "c"], ["bias"])]
    np_type = helper.tensor_dtype_to_np_dtype(dtype)
    inits = [numpy_helper.from_array(np.array(1.0, np_type), "one"), numpy_helper.from_array(np.array(c, np_type), "c")]
    return _view(nodes, [helper.make_tensor_value_info("mask", mask_type, ["b", "t"])], inits), "bias"


def test_a_bool_mask_keeps_finfo_min_finite():
    view, bias = _one_minus_mask_times(F32_MIN, T.INT64, cast_to_bool=True)
    assert value_range(view, bias) == (F32_MIN, 0.0)
    assert is_finite(view, bias)


def test_an_int64_mask_times_finfo_min_may_overflow():
    view, bias = _one_minus_mask_times(F32_MIN, T.INT64)
    assert not is_finite(view, bias)


def test_an_int64_mask_times_minus_10000_stays_finite():
    view, bias = _one_minus_mask_times(-10000.0, T.INT64)
    lo, hi = value_range(view, bias)
    assert math.isfinite(lo) and math.isfinite(hi) and hi >= 1e4 * 2.0**63


def test_int64_to_float16_overflows_in_the_cast():
    view, bias = _one_minus_mask_times(-65504.0, T.INT64, dtype=T.FLOAT16)
    assert not is_finite(view, bias)
    view, bias = _one_minus_mask_times(-65504.0, T.INT64, cast_to_bool=True, dtype=T.FLOAT16)
    assert is_finite(view, bias)


def test_two_finfo_min_fills_added_overflow():
    inits = [numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
             numpy_helper.from_array(np.array(F32_MIN, np.float32), "fill")]
    nodes = [helper.make_node("Where", ["a", "zero", "fill"], ["wa"]),
             helper.make_node("Where", ["b", "zero", "fill"], ["wb"]),
             helper.make_node("Add", ["wa", "wb"], ["sum"])]
    view = _view(nodes, [helper.make_tensor_value_info(n, T.BOOL, [4]) for n in "ab"], inits)
    assert is_finite(view, "wa") and not is_finite(view, "sum")


def test_a_gathered_table_is_bounded_by_its_values_and_a_float_input_by_nothing():
    table = np.array([[-2.0, 0.5], [1.5, 3.0]], np.float32)
    nodes = [helper.make_node("Gather", ["table", "idx"], ["rows"]),
             helper.make_node("Transpose", ["rows"], ["t"], perm=[1, 0]),
             helper.make_node("Add", ["t", "x"], ["y"])]
    view = _view(nodes, [helper.make_tensor_value_info("idx", T.INT64, [3]),
                         helper.make_tensor_value_info("x", T.FLOAT, [2, 3])],
                 [numpy_helper.from_array(table, "table")])
    assert value_range(view, "t") == (-2.0, 3.0)
    assert value_range(view, "y") is None


def test_minus_inf_and_zero_times_inf():
    inits = [numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
             numpy_helper.from_array(np.array(-np.inf, np.float32), "ninf")]
    nodes = [helper.make_node("Where", ["a", "zero", "ninf"], ["w"]),
             helper.make_node("Mul", ["w", "zero"], ["p"])]
    view = _view(nodes, [helper.make_tensor_value_info("a", T.BOOL, [4])], inits)
    assert value_range(view, "w") == (-math.inf, 0.0) and not is_finite(view, "w")
    assert value_range(view, "p") is None  # 0 · -inf is NaN
