"""``optimize --ort-fusions``: ORT's transformer fusions as the step before onnxfuse's rules.

On the sample exports: the step runs ORT's fusions, onnxfuse then fuses the FFNs and attentions it left,
and the result matches the original (``compare``); for GPT-2 the "gpt2" model type is the one kept (only
after it can the attention rule prove the query's shape). Where it does not apply (a model ORT's optimizer
has seen, one optimized by onnxfuse, TensorRT, external data beyond what can be loaded, ORT's optimizer
failing, ORT's output neither onnx.checker nor ONNX Runtime accepts) the rules run on the model as it was
and the report says why. Models whose weights are external data get the step too, and keep their weights
external. Without the flag nothing of ORT's runs. ORT's fusions never change a GELU's approximation (its
BiasGelu for a tanh GELU is written as FastGelu: ``--ort-fusions`` alone keeps a tanh model within
``compare``'s tolerance), and an output of theirs that onnx.checker rejects and ONNX Runtime loads is kept
with a warning.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from onnxfuse import model_io, ort_fusions, pipeline
from onnxfuse.compare import compare_models
from onnxfuse.errors import BadInputError
from onnxfuse.pipeline import inspect_file, optimize_file
from onnxfuse.runtime import onnxruntime_load_error
from tests.graphs import Builder, build

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


def _fused_linear_gelu_forms(path) -> list[str]:
    return [onnx.helper.get_node_attr_value(n, "approximate").decode()
            for n in onnx.load(str(path), load_external_data=False).graph.node if n.op_type == "FusedLinearGelu"]


@pytest.mark.parametrize("model_type", ort_fusions.MODEL_TYPES)
def test_orts_erf_bias_gelu_for_a_tanh_gelu_is_written_as_fast_gelu(model_type):
    """ORT's FusionBiasGelu writes the exact-erf BiasGelu where GPT-NeoX's dynamo export computes ONNX's
    Gelu(approximate="tanh"); the step writes FastGelu, tanh, on the same inputs, and says so."""
    model = onnx.load(str(MODELS / "gpt_neox_tanh_dynamo_op20.onnx"))
    tanh_gelu = [n for n in model.graph.node
                 if n.op_type == "Gelu" and onnx.helper.get_node_attr_value(n, "approximate") == b"tanh"]
    assert len(tanh_gelu) == 2
    orts, _ = ort_fusions._run_fusions(model, model_type, use_gpu=False, gelu_fusions=True)
    bias_gelu = {n.output[0]: list(n.input) for n in orts.graph.node if n.op_type == "BiasGelu"}
    assert sorted(bias_gelu) == sorted(n.output[0] for n in tanh_gelu)

    fused, step = ort_fusions.apply_ort_fusions(model, model_type=model_type, use_gpu=False)
    assert step.applied and step.added.get("com.microsoft.FastGelu") == 2 and "com.microsoft.BiasGelu" not in step.added
    assert {n.output[0]: list(n.input) for n in fused.graph.node if n.op_type == "FastGelu"} == bias_gelu
    assert not any(n.op_type in ("BiasGelu", "Gelu") for n in fused.graph.node)
    assert [(c["ort_wrote"], c["computes"], c["model_computes"], c["now"]) for c in step.gelu_corrected] == [
        ("com.microsoft.BiasGelu", "erf", "tanh", "com.microsoft.FastGelu")] * 2
    assert step.gelu_fusions_off is None
    assert "2 BiasGelu computing erf where the model computes tanh made FastGelu" in step.summary()
    assert compare_models(model, fused, samples=2, progress=False).passed


@pytest.mark.parametrize("model", [MODELS / "gpt_neox_tanh_dynamo_op20.onnx", "onnx:tanh", "tanh:pow"])
def test_ort_fusions_alone_keep_a_tanh_gelu_model_within_tolerance(tmp_path, model):
    """``--ort-fusions`` without ``--verify``: the tanh GELUs stay tanh through ORT's fusions and the rules, and
    the output matches the input within compare's tolerance."""
    if isinstance(model, str):  # a hand-built Linear+GELU: MatMul, bias Add, the tanh GELU (opset 20)
        src = tmp_path / "tanh.onnx"
        onnx.save(build(model), str(src))
    else:
        src = model
    out = tmp_path / "out.onnx"
    report = optimize_file(src, out, ort_fusions=True)
    assert report.ort_fusions["applied"] and report.warnings == []
    corrected = report.ort_fusions.get("gelu_corrected", [])
    assert [c["now"] for c in corrected] == ["com.microsoft.FastGelu"] * (0 if model == "tanh:pow" else
                                                                          1 if model == "onnx:tanh" else 2)
    assert _fused_linear_gelu_forms(out) == ["tanh"] * (2 if isinstance(model, Path) else 1)
    assert not any(op.endswith(("BiasGelu", ".Gelu")) for op in _ops(out))
    assert compare_models(str(src), str(out), samples=2, progress=False).passed


def test_a_gelu_ort_fuses_onnxfuse_cannot_read_turns_orts_gelu_fusions_off(tmp_path):
    """ORT's FusionGelu takes an Erf divisor within 0.001 of √2 (here 1.4135) as √2 and writes the exact op: the
    math changes. onnxfuse reads no GELU form there, so ORT's fusions run again with their GELU fusions off and
    the block stays as the model wrote it (the rules refuse it too)."""
    src = tmp_path / "near_miss.onnx"
    onnx.save(build("erf:pytorch:div", perturb={"sqrt2": 1.4135}), str(src))
    out = tmp_path / "out.onnx"
    report = optimize_file(src, out, ort_fusions=True)
    step = report.ort_fusions
    assert step["applied"] and "is not a GELU form onnxfuse reads" in step["gelu_fusions_off"]
    assert "its GELU fusions off (" in ort_fusions.OrtFusionsReport(**step).summary()
    assert "gelu_corrected" not in step
    ops = _ops(out)
    assert ops.get("ai.onnx.Erf") == 1 and not any("Gelu" in op for op in ops), ops
    assert [r.rule for r in report.refused] == ["erf-gelu"]
    assert compare_models(str(src), str(out), samples=2, progress=False).passed


def _stale_weight_declaration(folder: Path) -> Path:
    """What the dynamo exporter writes at opset 23 with ``optimize=False`` and static shapes, in small: the
    weights reach their MatMuls through a Transpose, and value_info declares every tensor, the weights too.
    ORT's FusionConstantFold transposes each weight in place under its name: their declarations are then
    stale, which onnx.checker's full check rejects and ONNX Runtime reads past. (A Linear+GELU, then a
    Linear the rules leave.)"""
    b = Builder(opset=23)
    w_up, w_down = b.tensor("W", (24, 16), 0.25), b.tensor("W", (16, 24), 0.2)
    y = b.node("MatMul", ["x", b.node("Transpose", [w_up], perm=[1, 0])])
    y = b.node("Gelu", [b.node("Add", [y, b.tensor("B", (24,), 0.1)])])
    y = b.node("MatMul", [y, b.node("Transpose", [w_down], perm=[1, 0])])
    model = b.model([("x", [2, 8, 16])], [(y, [2, 8, 16])])
    model.ir_version = 11
    model.graph.value_info.extend(onnx.helper.make_tensor_value_info(w, onnx.TensorProto.FLOAT, dims)
                                  for w, dims in ((w_up, [24, 16]), (w_down, [16, 24])))
    onnx.checker.check_model(model, full_check=True)
    path = folder / "stale.onnx"
    onnx.save(model, str(path))
    return path


def test_an_ort_output_the_checker_rejects_and_ort_loads_is_kept_with_a_warning(tmp_path):
    src = _stale_weight_declaration(tmp_path)
    orts, _ = ort_fusions._run_fusions(onnx.load(str(src)), "bert", use_gpu=False, gelu_fusions=True)
    error = model_io.checker_error(orts)
    assert error.startswith("[ShapeInferenceError] Inferred shape and existing shape differ in dimension 0")
    assert onnxruntime_load_error(orts) is None

    out = tmp_path / "out.onnx"
    report = optimize_file(src, out, ort_fusions=True)
    step = report.ort_fusions
    assert step["applied"] and step["checker_error"] == error
    assert report.warnings == [f"ORT's transformer fusions (bert) wrote a model that onnx.checker rejects ({error}); "
                               "ONNX Runtime loads it, so it is kept, and the output is held to load in ONNX Runtime "
                               "in place of onnx.checker"]
    assert report.fused_by_op == {"ai.onnxfuse.FusedLinearGelu": 1}
    # the output keeps the other stale declaration: the checker's first error is another than on ORT's output
    assert model_io.checker_error(out) not in (None, error)
    assert onnxruntime_load_error(onnx.load(str(out)), str(out)) is None
    assert compare_models(str(src), str(out), samples=2, progress=False).passed

    run = subprocess.run([sys.executable, "-m", "onnxfuse.cli", "optimize", str(src), "-o", str(tmp_path / "cli.onnx"),
                          "--ort-fusions"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "onnxfuse: warning: ORT's transformer fusions (bert) wrote a model that onnx.checker rejects" in run.stderr
    assert "onnx.checker rejects its output, ONNX Runtime loads it" in run.stdout


def test_an_ort_output_neither_the_checker_nor_ort_accepts_leaves_the_model_to_the_rules(tmp_path, monkeypatch):
    src = _stale_weight_declaration(tmp_path)
    monkeypatch.setattr(pipeline, "_onnxruntime_load_error", lambda model, source, *, base_dir=None: "refused")
    out = tmp_path / "out.onnx"
    report = optimize_file(src, out, ort_fusions=True)
    step = report.ort_fusions
    assert step["applied"] is False and step["checker_error"].startswith("[ShapeInferenceError]")
    assert step["why_not"] == ("ORT's fusions (bert) wrote a model that onnx.checker rejects "
                               f"({step['checker_error']}) and ONNX Runtime cannot load (refused); the rules run on "
                               "the model as it was")
    assert report.warnings == [step["why_not"]]
    assert report.fused_by_op == {"ai.onnxfuse.FusedLinearGelu": 1}  # the rules on the model as it was
    assert model_io.checker_error(out) is None


def test_the_output_of_a_kept_ort_output_must_load_in_ort(tmp_path, monkeypatch):
    """The checker cannot judge the rewrite of an ORT output it rejects: ONNX Runtime loading the written model
    is the guarantee, and an output it cannot load is not written."""
    src = _stale_weight_declaration(tmp_path)
    refuse_files = lambda model, source, *, base_dir=None: None if source is None else "refused"  # noqa: E731
    monkeypatch.setattr(pipeline, "_onnxruntime_load_error", refuse_files)
    out = tmp_path / "out.onnx"
    with pytest.raises(BadInputError, match="not written: ONNX Runtime cannot load the output \\(refused\\)"):
        optimize_file(src, out, ort_fusions=True)
    assert not out.exists()


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
