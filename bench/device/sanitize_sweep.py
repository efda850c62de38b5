#!/usr/bin/env python3
"""A size sweep of the CUDA FusedLinearGelu node, small enough to run under compute-sanitizer.

    compute-sanitizer --tool memcheck  --error-exitcode 9 python3 bench/device/sanitize_sweep.py
    compute-sanitizer --tool racecheck --error-exitcode 9 python3 bench/device/sanitize_sweep.py

X, W, B and Y are graph inputs/outputs bound with IO binding to buffers of exactly their size, each its own
cuMemAlloc (pycuda), never a slice of ORT's or torch's memory pools: an access one element past any of
them is outside an allocation, which memcheck reports. Some cases bind X one element past a 256-byte
boundary (a view into a larger buffer), the alignment a tactic must check before it uses wide loads or TMA.
Each result is also compared with a float64 reference, so the sweep fails on wrong numbers too.
A second part gives the node its W and B as initializers, the form an exported model has, so that the copies
a node stages once in its constructor are read too (16-bit rows off 16-byte vectors on the fused path;
float32 on the fallback for a large, narrow, deep W): those live in ORT's memory, which memcheck sees as
ORT's allocations, so there it checks the node's own copies and kernels rather than one element past W.
Exit status: 0 clean, 1 a wrong result or an error.
"""

from __future__ import annotations

import math
import os
import sys

import ml_dtypes
import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

DOMAIN = "ai.onnxfuse"
ONNX_TYPE = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}
NP_TYPE = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
# (M, K, N): tiny, odd, one tile exactly, tile + 1, a few tiles with K, N off multiples of 8, and short K beyond
# two waves of 128x128 tiles with edges on M and N (16-bit: the overlapped 128x128 kernel).
SIZES = [(1, 8, 8), (7, 13, 17), (128, 64, 128), (129, 72, 136), (300, 770, 1000), (4097, 384, 1544)]
# (dtype, M, K, N) with W and B as initializers: float16 staged for the fused kernel (K, N off multiples of 8,
# 64+ rows of enough work), float32 staged for the fallback (a W of 2^21+ weights, N < K, off multiples of 4).
STAGED_CASES = [("float16", 300, 770, 3074), ("float32", 2, 4095, 1023), ("float32", 64, 4095, 1023),
                ("float32", 300, 4096, 1023)]


def model(dtype, trans_b, bias, approximate, initializers=None):
    """The node with X, W and B as graph inputs, or W and B as initializers ({"W": w, "B": b}) where given."""
    from onnx import numpy_helper

    t = ONNX_TYPE[dtype]
    inputs = [helper.make_tensor_value_info("X", t, ["M", "K"])]
    if initializers is None:
        inputs.append(helper.make_tensor_value_info("W", t, ["N", "K"] if trans_b else ["K", "N"]))
        if bias:
            inputs.append(helper.make_tensor_value_info("B", t, ["N"]))
    inits = [numpy_helper.from_array(a, name) for name, a in (initializers or {}).items()]
    node = helper.make_node("FusedLinearGelu", ["X", "W", "B" if bias else ""], ["Y"], domain=DOMAIN,
                            approximate=approximate, transB=int(trans_b))
    g = helper.make_graph([node], "sweep", inputs, [helper.make_tensor_value_info("Y", t, ["M", "N"])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid(DOMAIN, 1)],
                             ir_version=10).SerializeToString()


def gelu64(pre, approximate):
    if approximate == "none":
        return 0.5 * pre * (1.0 + np.vectorize(math.erf, otypes=[np.float64])(pre / math.sqrt(2.0)))
    if approximate == "tanh":
        return 0.5 * pre * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (pre + 0.044715 * pre**3)))
    return pre / (1.0 + np.exp(-1.702 * pre))


class DeviceBuffer:
    """Exactly ``array.nbytes`` bytes (plus ``offset`` leading bytes for a misaligned view) of device memory."""

    def __init__(self, drv, array: np.ndarray, offset: int = 0):
        self.mem = drv.mem_alloc(max(array.nbytes + offset, 1))
        self.ptr = int(self.mem) + offset
        if array.nbytes:
            # bytes, not elements: pycuda cannot read ml_dtypes' bfloat16 through the buffer protocol
            drv.memcpy_htod(self.ptr, np.ascontiguousarray(array).view(np.uint8))


def run_case(drv, sess, dtype, x, w_nk, b, approximate, trans_b, x_offset, bound_weights):
    """One call with X and Y in exact-size buffers (X one element off alignment where x_offset), W and B bound the
    same way where bound_weights; returns rel-L2 against float64."""
    M, N = x.shape[0], w_nk.shape[0]
    elem = np.dtype(NP_TYPE[dtype]).itemsize
    bufs = {"X": DeviceBuffer(drv, x, offset=elem if x_offset else 0)}
    arrays = {"X": x}
    if bound_weights:
        arrays["W"] = w_nk if trans_b else np.ascontiguousarray(w_nk.T)
        if b is not None:
            arrays["B"] = b
        bufs.update({name: DeviceBuffer(drv, arrays[name]) for name in arrays if name != "X"})
    y = np.zeros((M, N), NP_TYPE[dtype])
    ybuf = DeviceBuffer(drv, y)
    binding = sess.io_binding()
    et = ONNX_TYPE[dtype] if dtype == "bfloat16" else NP_TYPE[dtype]
    for name, arr in arrays.items():
        binding.bind_input(name, "cuda", 0, et, list(arr.shape), bufs[name].ptr)
    binding.bind_output("Y", "cuda", 0, et, [M, N], ybuf.ptr)
    sess.run_with_iobinding(binding)
    drv.memcpy_dtoh(y.view(np.uint8), ybuf.ptr)
    pre = x.astype(np.float64) @ w_nk.astype(np.float64).T + (b.astype(np.float64) if b is not None else 0)
    ref = gelu64(pre, approximate)
    return np.linalg.norm(y.astype(np.float64) - ref) / max(np.linalg.norm(ref), 1e-30)


def session(library, model_bytes):
    so = ort.SessionOptions()
    so.register_custom_ops_library(library)
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    return ort.InferenceSession(model_bytes, so, providers=["CUDAExecutionProvider"])


def main() -> int:
    import pycuda.driver as drv

    library = os.environ["ONNXFUSE_LIBRARY"]
    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    drv.init()
    ctx = drv.Device(0).retain_primary_context()  # the context ORT and the CUDA runtime use
    ctx.push()
    rng = np.random.default_rng(0)
    failures, runs = [], 0
    try:
        for dtype in ("float16", "bfloat16", "float32"):
            for trans_b in (1, 0):
                for bias in (True, False):
                    approximate = ("none", "tanh", "sigmoid")[runs % 3]
                    sess = session(library, model(dtype, trans_b, bias, approximate))
                    for i, (M, K, N) in enumerate(SIZES):
                        x = rng.standard_normal((M, K)).astype(NP_TYPE[dtype])
                        w_nk = (rng.standard_normal((N, K)) / math.sqrt(K)).astype(NP_TYPE[dtype])
                        b = (rng.standard_normal(N) * 0.1).astype(NP_TYPE[dtype]) if bias else None
                        err = run_case(drv, sess, dtype, x, w_nk, b, approximate, trans_b, bool(i % 2), True)
                        runs += 1
                        tol = 2e-2 if dtype == "bfloat16" else 5e-3
                        tag = f"{dtype} transB={trans_b} bias={bias} {approximate} M={M} K={K} N={N} x_offset={bool(i % 2)}"
                        print(f"{tag}: rel-L2 {err:.2e}", flush=True)
                        if not err < tol:
                            failures.append(f"{tag}: rel-L2 {err:.2e} >= {tol}")
        for i, (dtype, M, K, N) in enumerate(STAGED_CASES):
            for trans_b in (1, 0):
                approximate = ("none", "tanh", "sigmoid")[runs % 3]
                x = rng.standard_normal((M, K)).astype(NP_TYPE[dtype])
                w_nk = (rng.standard_normal((N, K)) / math.sqrt(K)).astype(NP_TYPE[dtype])
                b = (rng.standard_normal(N) * 0.1).astype(NP_TYPE[dtype])
                w = w_nk if trans_b else np.ascontiguousarray(w_nk.T)
                sess = session(library, model(dtype, trans_b, True, approximate, {"W": w, "B": b}))
                err = run_case(drv, sess, dtype, x, w_nk, b, approximate, trans_b, bool(i % 2), False)
                runs += 1
                tol = 5e-3
                tag = f"{dtype} transB={trans_b} W, B initializers {approximate} M={M} K={K} N={N} x_offset={bool(i % 2)}"
                print(f"{tag}: rel-L2 {err:.2e}", flush=True)
                if not err < tol:
                    failures.append(f"{tag}: rel-L2 {err:.2e} >= {tol}")
    except Exception as e:
        failures.append(f"{type(e).__name__}: {e}")
    finally:
        ctx.pop()
    print(f"{runs} launches, {len(failures)} failures")
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
