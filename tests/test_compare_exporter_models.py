"""The gate on every committed exporter model (tests/models/: BERT and GPT-2 from torch.onnx's TorchScript
and dynamo exporters, ORT's transformers optimizer and float16 converter): optimize, then compare with the
default inputs and tolerances. Each must pass, with the tolerance the output's compute type calls for, and
the default inputs must be ones the models accept (token ids inside the vocabulary, masks of ones)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from onnxfuse.compare import verify_optimized
from onnxfuse.error_statistics import DEFAULT_TOLERANCES
from onnxfuse.pipeline import optimize_file
from onnxfuse.inputs import gather_bounds, random_inputs

MODELS = sorted((Path(__file__).parent / "models").glob("*.onnx"))


PROVIDERS = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]

# T5 in float16 is ill-conditioned (no mean subtraction in its RMSNorm, activations up to |3.8| in these
# tiny models): measured on the H200, ORT's own unfused float16 path lands up to 0.045 from the float32 model
# (p99 0.0135) and the fused model up to 0.038 (p99 0.0137), so two correct float16 executions differ by up
# to 0.023, past the float16 default bound 1e-2 + 1e-2·|ref| (1.49× it at worst; 0.85× on this CPU). The
# fused model is no farther from float32 than ORT's own path; such a model is judged at 3e-2.
ILL_CONDITIONED_FP16 = 3e-2


def _tolerance_override(stem: str) -> float | None:
    return ILL_CONDITIONED_FP16 if stem.startswith("t5_") and "_ortfp16" in stem else None


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("path", MODELS, ids=[p.stem for p in MODELS])
def test_optimized_exporter_model_passes_the_gate(path, provider, tmp_path, library_path):
    if provider == "cuda":
        from onnxfuse.runtime import cuda_usable

        if not cuda_usable():
            pytest.skip("no usable CUDA device")
    fused = tmp_path / f"{path.stem}_fused.onnx"
    assert optimize_file(path, fused).fused, "nothing fused: the gate would compare a model with itself"
    override = _tolerance_override(path.stem)
    report = verify_optimized(path, fused, provider=provider, samples=2, progress=False, rtol=override, atol=override)
    print(f"{path.stem} {provider}: " + "; ".join(
        f"{o.name} max abs {o.max_abs:.3g} worst {o.worst_ratio:.3f}x tol" for o in report.outputs))
    assert report.exit_code == 0, report.summary()
    for stats in report.outputs:
        assert stats.elements > 0 and stats.cosine > 0.9999
        expected = "float16" if "fp16" in path.stem else "float32"
        assert (stats.compute_dtype or stats.dtype) == expected
        key = f"{expected}/{provider}" if f"{expected}/{provider}" in DEFAULT_TOLERANCES else expected
        if override is None:
            assert stats.tolerance == DEFAULT_TOLERANCES[key]
        else:
            assert stats.tolerance.atol == stats.tolerance.rtol == override


@pytest.mark.parametrize("path", MODELS[:1] + [p for p in MODELS if p.stem.startswith("gpt2")][:1], ids=lambda p: p.stem)
def test_default_token_ids_stay_inside_the_vocabulary(path):
    model = onnx.load(str(path), load_external_data=False)
    bounds = gather_bounds(model)
    assert bounds.get("input_ids", 0) > 100  # the word-embedding table was found
    sample = random_inputs(model, seed=1)
    assert sample["input_ids"].max() < bounds["input_ids"]
    assert np.all(sample["attention_mask"] == 1)


def test_gate_runs_a_model_with_a_short_position_table_at_sizes_it_takes(tmp_path):
    """The freshly initialised CLIP text export has 16 positions: the default 128 tokens do not run, so
    the gate draws 16 and says so (a user running it in CI need not know the model's limits)."""
    src = Path(__file__).parent / "models" / "clip_text_freshinit_torchscript_op17.onnx"
    fused = tmp_path / "fused.onnx"
    optimize_file(src, fused)
    report = verify_optimized(src, fused, provider="cpu", progress=False)
    assert report.exit_code == 0, report.summary()
    assert report.input_shapes == {"input_ids": [1, 16], "attention_mask": [1, 16]}
    assert "sequence=16 (chosen: the model does not run at sequence=128)" in report.inputs
