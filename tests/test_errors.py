"""The one-line pieces every error message is made of: a foreign exception's message as one line, and one
spelling of element types."""

from __future__ import annotations

import pytest
from onnx import TensorProto

from onnxfuse.dtypes import dtype_name
from onnxfuse.errors import one_line


def test_one_line_collapses_and_caps():
    multi = RuntimeError("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Got invalid dimensions for input: x\n"
                         " index: 2 Got: 16 Expected: 32\n Please fix either the inputs or the model.")
    assert one_line(multi) == ("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Got invalid dimensions for input: x "
                               "index: 2 Got: 16 Expected: 32 Please fix either the inputs or the model.")
    long = one_line(ValueError("x" * 2000))
    assert len(long) == 501 and long.endswith("…")
    assert one_line(KeyError()) == "KeyError" and one_line(OSError("  \n ")) == "OSError"


@pytest.mark.parametrize("elem_type, name", [
    (TensorProto.FLOAT, "float32"), (TensorProto.FLOAT16, "float16"), (TensorProto.BFLOAT16, "bfloat16"),
    (TensorProto.DOUBLE, "float64"), (TensorProto.INT64, "int64"), (TensorProto.BOOL, "bool"),
    (TensorProto.STRING, "string"), (TensorProto.FLOAT8E4M3FN, "float8e4m3fn"), (TensorProto.UNDEFINED, "undefined"),
    (None, "unknown"), (91, "type 91"),
])
def test_dtype_name(elem_type, name):
    assert dtype_name(elem_type) == name
