"""One spelling of ONNX element types for every message and report: numpy's names for the float types
(float32, float16, bfloat16, float64), ONNX's lower-cased for the others (int64, bool, string,
float8e4m3fn…).

Both the rewrite's refusal reasons and the accuracy gate's reports print these, so a type reads the same
in ``onnxfuse inspect`` and ``onnxfuse compare``.
"""

from __future__ import annotations

import onnx

_T = onnx.TensorProto
_FLOAT_NAMES = {_T.FLOAT: "float32", _T.FLOAT16: "float16", _T.BFLOAT16: "bfloat16", _T.DOUBLE: "float64"}


def dtype_name(dtype: int | None) -> str:
    """float32, float16, bfloat16, float64, int64, bool…; ``unknown`` for None (a type no one declared), and
    ``type <n>`` for a number that is no ONNX type (names from malformed models must still print)."""
    if dtype is None:
        return "unknown"
    if dtype in _FLOAT_NAMES:
        return _FLOAT_NAMES[dtype]
    try:
        return _T.DataType.Name(dtype).lower()
    except ValueError:
        return f"type {dtype}"
