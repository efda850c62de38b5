"""An independent float64 oracle: ``onnx.reference`` implementations of FusedLinearGelu and of the
com.microsoft GELU ops, so the rewriter's tests need neither the C++ library nor ONNX Runtime.

    run(model, feeds) -> list of outputs (ReferenceEvaluator with these ops registered)
"""

from __future__ import annotations

import math

import numpy as np
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

_erf = np.frompyfunc(math.erf, 1, 1)


def gelu64(y: np.ndarray, approximate: str = "none", alpha: float = 1.702) -> np.ndarray:
    y = y.astype(np.float64)
    if approximate == "none":
        return 0.5 * y * (1.0 + _erf(y / math.sqrt(2.0)).astype(np.float64))
    if approximate == "tanh":
        return 0.5 * y * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (y + 0.044715 * y**3)))
    if approximate == "sigmoid":
        return y / (1.0 + np.exp(-alpha * y))
    raise ValueError(approximate)


class FusedLinearGelu(OpRun):
    op_domain = "ai.onnxfuse"

    # cuda_path and the tuning table choose how the CUDA kernel computes, never what: ignored here
    def _run(self, X, W, B=None, approximate="none", alpha=1.702, transB=1, cuda_path="auto", tuned_device="",
             tuned_max_rows=None, tuned_paths=None):
        w = W.astype(np.float64)
        y = X.astype(np.float64) @ (w.T if transB else w)
        if B is not None:
            y = y + B.astype(np.float64)
        return (gelu64(y, approximate, alpha).astype(X.dtype),)


class Gelu(OpRun):
    op_domain = "com.microsoft"

    # the evaluator hands the ONNX Gelu's schema default along; com.microsoft.Gelu is always exact
    def _run(self, X, approximate="none"):
        return (gelu64(X, approximate).astype(X.dtype),)


class BiasGelu(OpRun):
    op_domain = "com.microsoft"

    def _run(self, X, B):
        return (gelu64(X.astype(np.float64) + B).astype(X.dtype),)


class FastGelu(OpRun):
    op_domain = "com.microsoft"

    def _run(self, X, B=None):
        y = X.astype(np.float64) + (0 if B is None else B.astype(np.float64))
        return (gelu64(y, "tanh").astype(X.dtype),)


class QuickGelu(OpRun):
    op_domain = "com.microsoft"

    def _run(self, X, alpha=1.702):
        return (gelu64(X, "sigmoid", alpha).astype(X.dtype),)


CUSTOM_OPS = [FusedLinearGelu, Gelu, BiasGelu, FastGelu, QuickGelu]


def run(model, feeds: dict) -> list[np.ndarray]:
    return ReferenceEvaluator(model, new_ops=CUSTOM_OPS).run(None, feeds)
