"""``optimize --ort-fusions``: ORT's transformer fusions as the step before onnxfuse's rules.

On the sample exports: the step runs ORT's fusions, onnxfuse then fuses the FFNs and attentions it left,
and the result matches the original (``compare``); for GPT-2 the "gpt2" model type is the one kept (only
after it can the attention rule prove the query's shape). Where it does not apply (a model ORT's optimizer
has seen, one optimized by onnxfuse, TensorRT, external data beyond what can be loaded, ORT's optimizer failing) the rules run on the
model as it was and the report says why. Models whose weights are external data get the step too, and
keep their weights external. Without the flag nothing of ORT's runs.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from onnxfuse import ort_fusions
from onnxfuse.compare import compare_models
from onnxfuse.pipeline import inspect_file, optimize_file

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_models"
MODELS = Path(__file__).resolve().parent / "models"


def _ops(path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for n in onnx.load(str(path), load_external_data=False).graph.node:
        key = f"{n.domain or 'ai.onnx'}.{n.op_type}"
        counts[key] = counts.get(key, 0) + 1
    return counts


# folded: the attention row guards (the sdpa TorchScript exports' -inf mask needs one a layer) that go into the
# SkipLayerNormalization ORT's fusions wrote behind the output projection (patterns/guard_into_skip_norm.py)
@pytest.mark.parametrize("sample,model_type,folded", [("tiny_bert", "bert", 2), ("tiny_gpt2", "gpt2", 2),
                                                      ("tiny_clip_text_quickgelu", "bert", 0)])
def test_ort_fusions_then_rules_match_the_original(tmp_path, sample, model_type, folded):
    src = SAMPLES / f"{sample}.onnx"
    out = tmp_path / "out.onnx"
    report = optimize_file(src, out, ort_fusions=True)
    step = report.ort_fusions
    assert step["applied"] and step["model_type"] == model_type, step
    assert step["added"].get("com.microsoft.SkipLayerNormalization", 0) == 4
    ops = _ops(out)
    # ORT leaves the embeddings' sum and the LayerNormalization after it (BERT's; GPT-2's and CLIP's, whose sum is
    # also the residual stream): they become one
    expected = {"ai.onnxfuse.FusedLinearGelu": 2, "com.microsoft.Attention": 2, "com.microsoft.SkipLayerNormalization": 1}
    if model_type == "gpt2":  # ORT leaves the attention output projections Gemms with C: their biases move
        expected["com.microsoft.SkipLayerNormalization"] += 2
    if folded:
        expected["ai.onnxfuse.MaskedSkipLayerNormalization"] = folded
    assert ops["com.microsoft.SkipLayerNormalization"] == 4 + 1 - folded
    assert ops.get("ai.onnxfuse.MaskedSkipLayerNormalization", 0) == folded
    assert ops.get("ai.onnxfuse.FillMaskedRows", 0) == 0
    assert report.fused_by_op == expected, report.fused_by_op
    assert report.refused == []
    assert compare_models(str(src), str(out), samples=2, progress=False).passed


def test_without_the_flag_nothing_of_orts_runs(tmp_path):
    out = tmp_path / "out.onnx"
    report = optimize_file(SAMPLES / "tiny_bert.onnx", out)
    assert report.ort_fusions is None
    # the embeddings' one is the rules' own; ORT's fusions write one per residual Add and LayerNorm as well
    assert report.fused_by_op["com.microsoft.SkipLayerNormalization"] == 1
    assert sum(n for op, n in _ops(out).items() if op.startswith("com.microsoft.Skip")) == 1


@pytest.mark.parametrize("model,target,why", [
    (MODELS / "bert_torchscript_op14_ortopt.onnx", "cuda", "already has ORT's fused ops"),
    (SAMPLES / "tiny_bert.onnx", "tensorrt", "TensorRT"),
])
def test_where_the_step_does_not_apply_the_report_says_why(tmp_path, model, target, why):
    report = optimize_file(model, tmp_path / "out.onnx", ort_fusions=True, target=target)
    assert report.ort_fusions["applied"] is False and why in report.ort_fusions["why_not"], report.ort_fusions


def test_a_model_onnxfuse_optimized_is_not_fused_by_ort_again(tmp_path):
    once = tmp_path / "once.onnx"
    optimize_file(SAMPLES / "tiny_bert.onnx", once)
    report = optimize_file(once, tmp_path / "twice.onnx", ort_fusions=True)
    assert "optimized by onnxfuse" in report.ort_fusions["why_not"]


def _external_copy(folder: Path, sample: str) -> Path:
    """``sample`` saved as torch's dynamo exporter saves every model by default: its weights in external data
    (onnx's default threshold, 1 KiB; small constants stay inline, as the exporter keeps them)."""
    src = folder / f"{sample}.onnx"
    onnx.save_model(onnx.load(str(SAMPLES / f"{sample}.onnx")), str(src), save_as_external_data=True,
                    all_tensors_to_one_file=True, location=f"{sample}.onnx.data", size_threshold=1024)
    model = onnx.load(str(src), load_external_data=False)
    assert sum(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer) >= 8  # the weights
    return src


@pytest.mark.parametrize("sample,model_type", [("tiny_bert", "bert"), ("tiny_gpt2", "gpt2")])
def test_external_data_models_get_orts_fusions_and_stay_external(tmp_path, sample, model_type):
    """ORT's fusions run on a copy with the data loaded; what ORT kept as it was is the input's external
    reference again, streamed into OUT.data: the output has what the inline model's run has, its weights
    outside the model file, and matches the original."""
    src = _external_copy(tmp_path, sample)
    data_before = (tmp_path / f"{sample}.onnx.data").read_bytes()
    inline_out, out = tmp_path / "inline_out.onnx", tmp_path / "out.onnx"
    inline_report = optimize_file(SAMPLES / f"{sample}.onnx", inline_out, ort_fusions=True)
    report = optimize_file(src, out, ort_fusions=True)
    step = report.ort_fusions
    assert step["applied"] and step["model_type"] == model_type, step
    assert step["added"] == inline_report.ort_fusions["added"]
    assert report.fused_by_op == inline_report.fused_by_op and report.refused == []
    assert _ops(out) == _ops(inline_out)
    fused = onnx.load(str(out), load_external_data=False)
    inline = [t for t in fused.graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL]
    assert (tmp_path / "out.onnx.data").is_file()
    assert all(len(t.raw_data) < 1024 for t in inline), [t.name for t in inline]  # every weight in OUT.data
    assert (tmp_path / f"{sample}.onnx.data").read_bytes() == data_before
    assert compare_models(str(src), str(out), samples=2, progress=False).passed


def test_external_data_beyond_what_can_be_loaded_is_left_to_orts_optimizer(tmp_path, monkeypatch):
    monkeypatch.setattr(ort_fusions, "MAX_LOADED_BYTES", 1024)
    src = _external_copy(tmp_path, "tiny_bert")
    report = optimize_file(src, tmp_path / "out.onnx", ort_fusions=True)
    assert report.ort_fusions["applied"] is False
    assert "more than ORT's in-memory fusions can take" in report.ort_fusions["why_not"]
    assert report.fused  # the rules still ran


def test_ort_optimizer_failing_leaves_the_model_to_the_rules(tmp_path, monkeypatch):
    from onnxruntime.transformers import optimizer

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(optimizer, "optimize_model", broken)
    out = tmp_path / "out.onnx"
    report = optimize_file(SAMPLES / "tiny_bert.onnx", out, ort_fusions=True)
    assert report.ort_fusions["applied"] is False and "RuntimeError: boom" in report.ort_fusions["why_not"]
    assert report.fused_by_op == {"ai.onnxfuse.FusedLinearGelu": 2, "com.microsoft.Attention": 2,
                                  "com.microsoft.SkipLayerNormalization": 1}  # the embeddings, the rules' own
    assert sum(n for op, n in _ops(out).items() if op.startswith("com.microsoft.Skip")) == 1


def test_orts_gelu_fusion_can_change_the_math_which_is_why_the_step_is_asked_for():
    """The reason the step is not the default: on GPT-NeoX's dynamo export ORT's fusion writes the exact
    erf BiasGelu where the graph computes ONNX's Gelu(approximate="tanh")."""
    model = onnx.load(str(MODELS / "gpt_neox_tanh_dynamo_op20.onnx"))
    fused, step = ort_fusions.apply_ort_fusions(model, model_type="bert", use_gpu=False)
    assert step.applied and step.added.get("com.microsoft.BiasGelu") == 2
    tanh_gelu = [n for n in model.graph.node if n.op_type == "Gelu" and onnx.helper.get_node_attr_value(n, "approximate") == b"tanh"]
    assert len(tanh_gelu) == 2
    assert not any(n.op_type == "Gelu" for n in fused.graph.node)


def test_inspect_and_the_cli_report_the_step(tmp_path):
    report = inspect_file(SAMPLES / "tiny_gpt2.onnx", ort_fusions=True)
    assert report.ort_fusions["model_type"] == "gpt2" and report.to_dict()["ort_fusions"]["applied"]
    out = tmp_path / "out.onnx"
    run = subprocess.run([sys.executable, "-m", "onnxfuse.cli", "optimize", str(SAMPLES / "tiny_bert.onnx"), "-o",
                          str(out), "--ort-fusions", "--json", "-"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["ort_fusions"]["added"]["com.microsoft.SkipLayerNormalization"] == 4
    table = subprocess.run([sys.executable, "-m", "onnxfuse.cli", "optimize", str(SAMPLES / "tiny_bert.onnx"), "-o",
                            str(out), "--ort-fusions"], capture_output=True, text=True, timeout=300)
    assert "ORT's transformer fusions (bert): 2 BiasGelu, 4 SkipLayerNormalization" in table.stdout, table.stdout


def test_tune_reads_the_rows_of_a_model_after_orts_fusions(tmp_path):
    """ORT's fusions write LayerNormalization in the default domain at opset 14 (ConvNeXt), which ONNX's shape
    inference has no schema for; inference reads it as an Identity of its input, so every node's rows follow."""
    from onnxfuse import tuning

    out = tmp_path / "out.onnx"
    report = optimize_file(MODELS / "convnext_torchscript_op14.onnx", out, ort_fusions=True)
    assert report.ort_fusions["added"].get("ai.onnx.LayerNormalization")
    model = onnx.load(str(out))
    nodes = tuning.tunable_nodes(model)
    rows = tuning.row_counts(model, nodes, [(b, {"pixel_values": (b, 3, 32, 32)}) for b in (1, 8)])
    assert sorted(r[1] for r in rows.values()) == [16, 64, 64] and all(r[8] == 8 * r[1] for r in rows.values())
