"""Running a model as ONNX Runtime's CPU provider runs it, graph optimizations off: the judge the
differential tests hold a rewrite to (the unfused model and the fused one, on the same inputs)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from onnxfuse.errors import BadInputError


def ort_outputs(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    """The outputs of ``model`` on ``feeds`` (ORT CPU, ``ORT_DISABLE_ALL``, the op library registered; a skip
    where the library is not built)."""
    import onnxruntime as ort

    from onnxfuse.runtime import session_options

    try:
        so = session_options(graph_optimization_level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    except BadInputError as e:
        pytest.skip(f"op library not built: {e}")
    so.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def assert_ort_matches(original: onnx.ModelProto, rewritten: onnx.ModelProto, feeds: dict, tol: float = 2e-5) -> None:
    """Both models give the same outputs on ORT's CPU provider, within ``tol`` (relative and absolute)."""
    want, got = ort_outputs(original, feeds), ort_outputs(rewritten, feeds)
    assert len(want) == len(got)
    for a, b in zip(want, got):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(b.astype(np.float64), a.astype(np.float64), rtol=tol, atol=tol)
