"""The fused attentions on ONNX Runtime's CUDA provider: every committed export whose attention the rule fuses
(packed ``Attention``, ``MultiHeadAttention``, rotary heads, padding and causal masks) gives on CUDA what the
original gives there, with a different padding in every batch row (right, left, none, all).

The reference is the original model on ORT's CPU provider. The fused model's CUDA error against it must stay
within twice the original's own CUDA error (ORT's CUDA MatMuls run TF32 for float32 and its kernels reorder
float16 sums; the fused attention kernels do the same), plus the CPU tests' tolerance; NaN where the original
has NaN, and nowhere else. Skips, with the reason, where there is no CUDA provider or no GPU.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from test_patterns_attention import (D, ENTRIES, FUSED_MODELS, SCORE_KEEPS, TOLERANCE, _attention, _feed_batches,
                                     _feeds, _fuse, _load, _session)

from onnxfuse.patterns.attention import FLOAT32_MIN

from onnxfuse.runtime import CUDA, cuda_unusable_reason, get_library_path


_NO_CUDA = cuda_unusable_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_NO_CUDA is not None, reason=f"CUDA tests: {_NO_CUDA}")]


def _cuda_session(model: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the graphs as written
    so.log_severity_level = 3
    so.register_custom_ops_library(get_library_path())  # the row guard, FillMaskedRows
    return ort.InferenceSession(model.SerializeToString(), so, providers=[CUDA, "CPUExecutionProvider"])


def _relative_error(want: np.ndarray, got: np.ndarray) -> float:
    ok = ~np.isnan(want)
    if not ok.any():
        return 0.0
    return float(np.max(np.abs(want[ok] - got[ok])) / max(1.0, np.max(np.abs(want[ok]))))


# bert_torchscript_op17.onnx keeps its weights in external data: test_patterns_attention covers it on CPU.
@pytest.mark.parametrize("file", [f for f in FUSED_MODELS if f != "bert_torchscript_op17.onnx"])
@pytest.mark.parametrize("batch,seq", [(6, 7), (8, 16)])
def test_fused_attention_on_cuda_matches_the_original(file, batch, seq, rng):
    original = _load(file)
    fused = _fuse(original).model
    fused_ops = {n.op_type for n in fused.graph.node if n.domain == "com.microsoft"}
    assert fused_ops & {"Attention", "MultiHeadAttention"}, f"{file}: no attention fused"
    reference = _session(original)
    names = [o.name for o in reference.get_outputs()]
    original_session, fused_session = _cuda_session(original), _cuda_session(fused)
    assert any(CUDA in p for p in fused_session.get_providers())
    tol = TOLERANCE[ENTRIES[file]["dtype"]]
    for feeds in _feed_batches(file, reference, batch, seq, rng):
        want_cpu, original_cuda, fused_cuda = (s.run(None, feeds) for s in (reference, original_session, fused_session))
        for name, want, base, got in zip(names, want_cpu, original_cuda, fused_cuda):
            want, base, got = (a.astype(np.float64) for a in (want, base, got))
            assert np.array_equal(np.isnan(want), np.isnan(got)), f"{name}: NaN where the original has none, or none where it has"
            base_err, err = _relative_error(want, base), _relative_error(want, got)
            assert err <= 2 * base_err + tol, f"{name}: fused {err:.2e} against the original's {base_err:.2e} on CUDA"


@pytest.mark.parametrize("kw", SCORE_KEEPS, ids=lambda kw: "-".join(str(v) for v in kw.values()))
def test_scores_masked_by_a_literal_keep_on_cuda(kw):
    """GPT-Neo's Where(C, Q·Kᵀ, fill) as attention_bias (with unidirectional where the mask is causal only)
    on ORT's CUDA MHA kernels: what the original gives on the CPU, padded rows and rows with no key included."""
    kw = {"fill": FLOAT32_MIN, "guard": False, **kw}
    kw["guard"] = kw["guard"] or kw["fill"] == -math.inf
    model = _attention(**kw)
    fused = _fuse(model).model
    fp16 = kw.get("dtype") == T.FLOAT16
    rng = np.random.default_rng(5)
    for seq in ([5] if kw.get("seq_len") == 5 else [1, 5, 12]):
        x = rng.standard_normal((4, seq, D)).astype(np.float16 if fp16 else np.float32)
        mask = np.ones((4, seq), np.int64)
        mask[1, : seq // 2] = 0
        mask[2, seq // 2 + 1:] = 0
        mask[3] = 0
        feeds = {"x": x, "attention_mask": mask} if any(i.name == "attention_mask" for i in model.graph.input) else {"x": x}
        want = np.asarray(_session(model).run(None, feeds)[0], np.float64)
        base = np.asarray(_cuda_session(model).run(None, feeds)[0], np.float64)
        got = np.asarray(_cuda_session(fused).run(None, feeds)[0], np.float64)
        assert np.array_equal(np.isnan(want), np.isnan(got))
        tol = TOLERANCE["float16" if fp16 else "float32"]
        assert _relative_error(want, got) <= 2 * _relative_error(want, base) + tol


# The committed exports ORT's optimizer has seen, whose row guards fold into the SkipLayerNormalization behind
# the projection (patterns/guard_into_skip_norm.py): the masked normalization's CUDA kernel in the whole model.
@pytest.mark.parametrize("file", ["bert_torchscript_op14_ortopt.onnx", "bert_torchscript_op14_ortfp16.onnx",
                                  "gpt2_torchscript_op14_ortopt.onnx", "gpt2_torchscript_op14_ortfp16.onnx"])
def test_guards_folded_into_the_normalization_on_cuda_match_the_original(file, rng):
    from onnxfuse.fuse import fuse_model

    original = _load(file)
    fused = fuse_model(original).model
    assert any(n.op_type == "MaskedSkipLayerNormalization" for n in fused.graph.node)
    assert not any(n.op_type == "FillMaskedRows" for n in fused.graph.node)
    reference = _session(original)
    feeds = _feeds(file, reference, 6, 7, rng)  # batch entries 2 and 3: rows that see no key
    want_cpu = reference.run(None, feeds)
    original_cuda = _cuda_session(original).run(None, feeds)
    fused_cuda = _cuda_session(fused).run(None, feeds)
    tol = TOLERANCE[ENTRIES[file]["dtype"]]
    for name, want, base, got in zip([o.name for o in reference.get_outputs()], want_cpu, original_cuda, fused_cuda):
        want, base, got = (a.astype(np.float64) for a in (want, base, got))
        assert np.array_equal(np.isnan(want), np.isnan(got)), name
        base_err, err = _relative_error(want, base), _relative_error(want, got)
        assert err <= 2 * base_err + tol, f"{name}: fused {err:.2e} against the original's {base_err:.2e} on CUDA"
