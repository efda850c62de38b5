"""The library pipeline (``onnxfuse.optimize``, ``onnxfuse.save``, ``pipeline.write_optimized``): what a Python
caller gets is what ``onnxfuse optimize`` writes, byte for byte, from a path or a ModelProto, with the same
report and the same errors; and ``--approximate auto`` rewrites once, tuning in memory where it can."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import helper

import onnxfuse
from onnxfuse import model_io, pipeline, tune
from onnxfuse.cli import main
from onnxfuse.errors import BadInputError
from onnxfuse.pipeline import load_input, optimize_file
from tests.graphs import build
from tests.test_bad_inputs import BAD_INPUTS
from tests.test_tune_approximate import AUTO, _tune

ROOT = Path(__file__).resolve().parent.parent
TINY_BERT = ROOT / "sample_models" / "tiny_bert.onnx"  # weights inline
EXTERNAL = ROOT / "tests" / "models" / "bert_torchscript_op17.onnx"  # weights in bert_torchscript_op17.onnx.data
BLOOM = ROOT / "tests" / "models" / "bloom_torchscript_op17.onnx"  # ALiBi attention: refused
GRAPHSURGEON = ROOT / "tests" / "models" / "bert_freshinit_torchscript_op17_gsunshaped.onnx"
# 2 BERT layers: each one intermediate Linear+GELU and one self-attention (Q/K/V packed); the embeddings' sum
# into its LayerNorm
BERT_BLOCKS = {"ai.onnxfuse.FusedLinearGelu": 2, "com.microsoft.Attention": 2,
               "com.microsoft.SkipLayerNormalization": 1}
_VOLATILE = {"seconds", "model", "output", "exit_code"}


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _cli_optimize(src: Path, folder: Path, *args) -> dict:
    """``onnxfuse optimize SRC -o FOLDER/out.onnx --json FOLDER/../report.json``: the report as JSON."""
    folder.mkdir()
    report = folder.parent / f"{folder.name}.json"
    run = CliRunner().invoke(main, ["optimize", str(src), "-o", str(folder / "out.onnx"), "--json", str(report),
                                    *args])
    assert run.exit_code == 0, run.output
    return json.loads(report.read_text())


def _scrubbed(report: dict) -> dict:
    """The report as its JSON reads back, without what differs from run to run (paths, times)."""
    return {k: v for k, v in json.loads(json.dumps(report)).items() if k not in _VOLATILE}


@pytest.mark.parametrize("src", [TINY_BERT, EXTERNAL], ids=["inline", "external-data"])
def test_optimize_from_a_path_writes_what_the_cli_writes(tmp_path, src):
    expected = _cli_optimize(src, tmp_path / "cli")
    result = onnxfuse.optimize(src)
    model, report = result
    assert isinstance(model, onnx.ModelProto) and report is result.report
    (tmp_path / "lib").mkdir()
    onnxfuse.save(result, tmp_path / "lib" / "out.onnx")
    assert _files(tmp_path / "lib") == _files(tmp_path / "cli")  # the model and, where it has one, its data file
    assert _scrubbed(report.to_dict()) == _scrubbed(expected)
    assert report.model == str(src) and report.output == str(tmp_path / "lib" / "out.onnx")
    assert report.fused_by_op == BERT_BLOCKS and report.refused == []


def test_optimize_from_a_modelproto_writes_what_the_cli_writes(tmp_path):
    _cli_optimize(TINY_BERT, tmp_path / "cli", "--target", "cpu")
    proto = onnx.load(str(TINY_BERT))
    before = proto.SerializeToString()
    result = onnxfuse.optimize(proto, target="cpu")
    assert proto.SerializeToString() == before  # the caller's model is not changed
    assert result.report.model is None and result.report.target == "cpu" and not result.deferred
    (tmp_path / "lib").mkdir()
    result.save(tmp_path / "lib" / "out.onnx")
    assert _files(tmp_path / "lib") == _files(tmp_path / "cli")


def test_a_modelproto_with_external_data_keeps_its_weights_on_disk(tmp_path):
    """The graph without its weights, and the folder they are in: the rewrite reads none of them (the
    transposed and packed ones are deferred), and the saved files are the CLI's."""
    _cli_optimize(EXTERNAL, tmp_path / "cli")
    proto = onnx.load(str(EXTERNAL), load_external_data=False)
    with pytest.raises(ValueError, match="has external data; say where it is"):
        onnxfuse.optimize(proto)
    result = onnxfuse.optimize(proto, base_dir=EXTERNAL.parent)
    assert result.deferred and result.source_dir == str(EXTERNAL.parent)
    (tmp_path / "lib").mkdir()
    onnxfuse.save(result, tmp_path / "lib" / "out.onnx")
    assert _files(tmp_path / "lib") == _files(tmp_path / "cli")


def test_the_report_counts_fused_blocks_and_refusals(tmp_path):
    """BLOOM's 2 layers: each intermediate Linear+GELU fused; each ALiBi attention refused, with its reason."""
    expected = _cli_optimize(BLOOM, tmp_path / "cli")
    report = onnxfuse.optimize(BLOOM).report
    assert report.fused_by_op == {"ai.onnxfuse.FusedLinearGelu": 2} and len(report.fused) == 2
    assert [r.rule for r in report.refused] == ["attention", "attention"]
    assert all("the scores reach the Softmax from their MatMul through" in r.reason for r in report.refused)
    assert _scrubbed(report.to_dict()) == _scrubbed(expected)


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_raises_the_error_the_cli_says(tmp_path, case):
    bad, _ = BAD_INPUTS[case](tmp_path)
    run = CliRunner().invoke(main, ["optimize", str(bad), "-o", str(tmp_path / "out.onnx")])
    assert run.exit_code == 2
    with pytest.raises(BadInputError) as raised:
        onnxfuse.optimize(bad)
    assert run.stderr == f"onnxfuse: error: {raised.value}\n"


def test_a_bad_modelproto_is_refused_as_a_file_would_be():
    model = build()
    model.graph.node[0].input[0] = model.graph.node[1].output[0]  # reads what a later node computes from it
    with pytest.raises(BadInputError, match=r"^<in-memory model>: not a valid ONNX model: .* \(a cycle\)$"):
        onnxfuse.optimize(model)
    with pytest.raises(BadInputError, match="^--target 'nowhere': choose one of "):
        onnxfuse.optimize(build(), target="nowhere")


def test_a_modelproto_out_of_order_is_sorted_on_a_copy():
    model = build("erf:pytorch:div", "matmul", k=8, n=16)
    moved = onnx.NodeProto()
    moved.CopyFrom(model.graph.node[0])
    del model.graph.node[0]
    model.graph.node.append(moved)
    before = model.SerializeToString()
    report = onnxfuse.optimize(model).report
    assert model.SerializeToString() == before
    assert len(report.warnings) == 1 and report.warnings[0].startswith("<in-memory model>: the nodes are not in")
    assert report.fused_by_op == {"ai.onnxfuse.FusedLinearGelu": 1}


def test_onnx_runtime_judges_what_onnx_checker_rejects():
    """model_io alone refuses a model onnx.checker rejects; the pipeline asks ONNX Runtime, which loads it."""
    with pytest.raises(BadInputError, match="not a valid ONNX model: Field 'shape' of 'type' is required"):
        model_io.load_model(GRAPHSURGEON)
    notes = model_io.LoadNotes()
    load_input(GRAPHSURGEON, notes=notes)
    assert notes.checker_error is not None
    report = onnxfuse.optimize(onnx.load(str(GRAPHSURGEON))).report
    assert len(report.warnings) == 1 and report.warnings[0].startswith("<in-memory model>: onnx.checker rejects")


def test_import_onnxfuse_imports_no_pipeline_until_asked():
    code = ("import sys, onnxfuse; assert 'onnxfuse.pipeline' not in sys.modules, 'eager'; "
            "assert onnxfuse.optimize is sys.modules['onnxfuse.pipeline'].optimize; "
            "assert 'onnxruntime' not in sys.modules, 'optimize imported onnxruntime'")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr


# --- optimize --approximate auto: one rewrite, tuned in memory where it can be -------------------------
def _count_rewrites(monkeypatch) -> list:
    calls = []
    real = pipeline.fuse_model

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "fuse_model", counted)
    return calls


@pytest.mark.parametrize("src", [TINY_BERT, EXTERNAL], ids=["in-memory", "staged-deferred-weights"])
def test_auto_writes_what_optimize_then_tune_write(tmp_path, monkeypatch, src):
    """One run of the rewrite, then tune from memory (inline weights) or from a staged copy (deferred ones):
    the bytes the two commands in a row write, and no staging folder left behind."""
    (tmp_path / "steps").mkdir()
    rewrite = tmp_path / "steps" / "exact.onnx"
    optimize_file(src, rewrite)
    r = _tune(["tune", rewrite, "-o", tmp_path / "steps" / "out.onnx", *AUTO, "--error-budget", "1e-3"], monkeypatch,
              {"tanh": 0.9}, {"tanh": 4e-4})
    assert r.exit_code == 0, r.output
    rewrites = _count_rewrites(monkeypatch)
    if src == TINY_BERT:  # nothing deferred: tune reads the rewrite in memory, never a staged file
        monkeypatch.setattr(tune, "tune_file", lambda *a, **k: pytest.fail("the rewrite was staged on disk"))
    (tmp_path / "one").mkdir()
    r = _tune(["optimize", src, "-o", tmp_path / "one" / "out.onnx", *AUTO, "--error-budget", "1e-3"], monkeypatch,
              {"tanh": 0.9}, {"tanh": 4e-4})
    assert r.exit_code == 0, r.output
    assert len(rewrites) == 1
    steps = _files(tmp_path / "steps")
    assert _files(tmp_path / "one") == {k: v for k, v in steps.items() if not k.startswith("exact.onnx")}


def test_auto_on_a_model_without_gelu_blocks_rewrites_once(tmp_path, monkeypatch):
    """No FusedLinearGelu node, no form to choose: OUT is the one rewrite, tune never starts."""
    src = tmp_path / "relu.onnx"
    w = onnx.numpy_helper.from_array(np.ones((8, 4), np.float32), "W")
    graph = helper.make_graph([helper.make_node("MatMul", ["X", "W"], ["H"]), helper.make_node("Relu", ["H"], ["Y"])],
                              "relu", [helper.make_tensor_value_info("X", onnx.TensorProto.FLOAT, ["M", 8])],
                              [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, ["M", 4])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(src))
    rewrites = _count_rewrites(monkeypatch)
    written = pipeline.write_optimized(src, tmp_path / "out.onnx", auto=pipeline.AutoApproximation(budget=1e-3))
    assert len(rewrites) == 1 and written.tuned is None and written.verdict is None
    assert written.report.warnings == ["--approximate auto: no FusedLinearGelu node in the rewrite, so no GELU form "
                                       "to choose: OUT is the exact rewrite"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.onnx", "relu.onnx"]
