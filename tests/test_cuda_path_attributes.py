"""The CUDA path attributes (cuda_path, tuned_device, tuned_max_rows, tuned_paths) where no GPU is needed: the
schema accepts them, the CPU kernel ignores them, and the library exports the device-signature query (which
reports "no device" without a GPU and in a CPU-only build). tests/test_op_cuda.py covers what they do on a GPU."""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tomllib
from onnx import TensorProto, helper

from onnxfuse.domain import CUDA_PATHS, DOMAIN, DOMAIN_VERSION, GEMV_MAX_ROWS, OP_TYPE

_ROOT = Path(__file__).resolve().parents[1]
_GEMV_H = _ROOT / "custom_ops" / "src" / "cuda" / "kernels" / "gemv_gelu.h"

PATH_ATTRIBUTES = {"cuda_path": "fallback", "tuned_device": "NVIDIA H200|sm_90|cuda 13.0|onnxfuse 0.1.0",
                   "tuned_max_rows": [16, 1024], "tuned_paths": ["fallback", "fused"]}
# The few-rows path forced, and a table that takes it up to its bound (never as the last entry).
GEMV_ATTRIBUTES = {"cuda_path": "gemv", "tuned_device": "NVIDIA H200|sm_90|cuda 13.0|onnxfuse 0.6.0",
                   "tuned_max_rows": [GEMV_MAX_ROWS, 1024, 4096], "tuned_paths": ["gemv", "fallback", "fused"]}


def _model(**attrs) -> onnx.ModelProto:
    node = helper.make_node(OP_TYPE, ["X", "W", "B"], ["Y"], domain=DOMAIN, approximate="tanh", **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [3, 4]),
         helper.make_tensor_value_info("W", TensorProto.FLOAT, [5, 4]),
         helper.make_tensor_value_info("B", TensorProto.FLOAT, [5])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3, 5])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid(DOMAIN, DOMAIN_VERSION)],
                             ir_version=10)


@pytest.mark.parametrize("attrs", [PATH_ATTRIBUTES, GEMV_ATTRIBUTES], ids=["fused-fallback", "gemv"])
def test_schema_accepts_the_path_attributes(attrs):
    onnx.checker.check_model(_model(**attrs), full_check=True)
    schema = onnx.defs.get_schema(OP_TYPE, DOMAIN_VERSION, DOMAIN)
    assert schema.attributes["cuda_path"].default_value.s == b"auto"
    assert schema.attributes["tuned_device"].default_value.s == b""
    assert not schema.attributes["tuned_max_rows"].required and not schema.attributes["tuned_paths"].required
    assert CUDA_PATHS == ("auto", "fused", "fallback", "gemv")
    assert "gemv" in schema.attributes["cuda_path"].description
    assert "gemv" in schema.attributes["tuned_paths"].description


@pytest.mark.skipif(not _GEMV_H.is_file(), reason="the gemv kernel's header (custom_ops/src/cuda/kernels/gemv_gelu.h) "
                                                   "is not in this tree")
def test_gemv_row_bound_is_the_kernels():
    """GEMV_MAX_ROWS is the C++ kGemvMaxRows: what tune measures and writes, and what the kernel accepts."""
    found = re.search(r"\bkGemvMaxRows\s*=\s*(\d+)", _GEMV_H.read_text())
    assert found, f"no kGemvMaxRows in {_GEMV_H}"
    assert int(found.group(1)) == GEMV_MAX_ROWS


def _cpu_run(library_path, model: onnx.ModelProto, feeds):
    so = ort.SessionOptions()
    so.register_custom_ops_library(library_path)
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def test_cpu_kernel_ignores_the_path_attributes(library_path, rng):
    feeds = {"X": rng.standard_normal((3, 4)).astype(np.float32), "W": rng.standard_normal((5, 4)).astype(np.float32),
             "B": rng.standard_normal(5).astype(np.float32)}
    plain = _cpu_run(library_path, _model(), feeds)
    np.testing.assert_array_equal(_cpu_run(library_path, _model(**PATH_ATTRIBUTES), feeds), plain)
    np.testing.assert_array_equal(_cpu_run(library_path, _model(**GEMV_ATTRIBUTES), feeds), plain)
    # Even values the CUDA kernel refuses: the CPU kernel has one path and never reads them.
    malformed = {"cuda_path": "fastest", "tuned_max_rows": [8, 4, 2], "tuned_paths": ["nope"]}
    np.testing.assert_array_equal(_cpu_run(library_path, _model(**malformed), feeds), plain)


def test_device_signature_query_is_exported_and_says_no_device_without_a_gpu(library_path):
    query = ctypes.CDLL(library_path).OnnxfuseCudaDeviceSignature
    query.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
    query.restype = ctypes.c_int
    buf = ctypes.create_string_buffer(b"stale", 256)
    rc = query(0, buf, len(buf))
    if rc == 0:  # a CUDA build on a machine with a GPU: the contract's format
        assert re.fullmatch(r"[^|]+\|sm_\d+\|cuda \d+\.\d+\|onnxfuse \S+", buf.value.decode()), buf.value
    else:  # CPU-only build, or no driver / no GPU (CI): nonzero and an empty string
        assert buf.value == b""
    assert query(-1, buf, len(buf)) != 0 and buf.value == b""


def test_library_version_is_the_package_version():
    """The device signature names the library version CMake compiles in: the project's own."""
    pyproject = tomllib.loads((_ROOT / "pyproject.toml").read_text())["project"]["version"]
    cmake = re.search(r"project\(onnxfuse_ops VERSION (\S+)", (_ROOT / "custom_ops" / "CMakeLists.txt").read_text())
    assert cmake and cmake.group(1) == pyproject
