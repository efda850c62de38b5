"""A model ONNX Runtime can load is a model onnxfuse takes: nodes out of topological order are sorted
(stably), an ``onnx.checker`` error of the input ORT tolerates is one warning line, and the output passes
the checker wherever the input does and adds no checker error the input did not have. Real garbage (what
ORT refuses too) still exits 2.

The committed files are the real thing: ``vit_torchscript_op15_fp16raw`` (ORT's float16 converter
appends the input Casts at the end of the node list) and ``bert_freshinit_torchscript_op17_gsunshaped``
(onnx-graphsurgeon writes outputs typed without a shape)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto as T
from onnx import helper

from onnxfuse import model_io, model_save
from onnxfuse.cli import main
from onnxfuse.errors import BadInputError
from onnxfuse.pipeline import optimize_file
from tests.graphs import build
from tests.reference_ops import run

MODELS = Path(__file__).resolve().parent / "models"
FP16_CONVERTER = MODELS / "vit_torchscript_op15_fp16raw.onnx"
GRAPHSURGEON = MODELS / "bert_freshinit_torchscript_op17_gsunshaped.onnx"


def _save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save_model(model, str(path))
    return path


def _moved_to_end(model: onnx.ModelProto, index: int) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    node = out.graph.node[index]
    moved = onnx.NodeProto()
    moved.CopyFrom(node)
    del out.graph.node[index]
    out.graph.node.append(moved)
    return out


# --- node order ---------------------------------------------------------------------------------------
def test_out_of_order_nodes_are_sorted_back_where_they_were(tmp_path):
    model = build("erf:pytorch:div", "matmul", k=8, n=16)
    notes = model_io.LoadNotes()
    loaded = model_io.load_model(_save(_moved_to_end(model, 0), tmp_path / "m.onnx"), notes=notes)
    assert notes.reordered and "re-ordered" in notes.warnings[0]
    # Stable: the one node out of place goes back to the first place it can take, the others keep theirs.
    assert [n.SerializeToString() for n in loaded.graph.node] == [n.SerializeToString() for n in model.graph.node]
    assert notes.checker_error is None  # the sorted model passes the checker


def test_in_order_models_are_returned_as_read(tmp_path):
    path = _save(build("tanh:pow", "gemm:transB1"), tmp_path / "m.onnx")
    notes = model_io.LoadNotes()
    loaded = model_io.load_model(path, notes=notes)
    assert not notes.reordered and notes.warnings == []
    assert loaded.SerializeToString() == onnx.load(str(path)).SerializeToString()


def test_fp16_converter_output_is_sorted_fused_and_checked(tmp_path):
    notes = model_io.LoadNotes()
    model_io.load_model(FP16_CONVERTER, notes=notes)
    assert notes.reordered and notes.checker_error is None
    report = optimize_file(FP16_CONVERTER, tmp_path / "out.onnx")
    assert report.fused_by_op == {"ai.onnxfuse.FusedLinearGelu": 2, "com.microsoft.Attention": 2}  # 2 ViT layers x (1 intermediate Linear+GELU, 1 attention, Q/K/V packed)
    assert len(report.warnings) == 1 and "topological order" in report.warnings[0]
    assert model_io.checker_error(tmp_path / "out.onnx") is None


def test_cycles_and_undefined_tensors_are_still_refused(tmp_path):
    model = build()
    first, second = model.graph.node[0], model.graph.node[1]
    first.input[0] = second.output[0]  # reads what a later node computes from it: a cycle
    with pytest.raises(BadInputError, match="a cycle"):
        model_io.load_model(_save(model, tmp_path / "cycle.onnx"))
    model = build()
    model.graph.node[-1].input[0] = "nowhere"
    with pytest.raises(BadInputError, match="reads 'nowhere' before any node computes it"):
        model_io.load_model(_save(model, tmp_path / "undefined.onnx"))


def test_subgraph_nodes_are_sorted_too(tmp_path):
    body_nodes = [helper.make_node("Neg", ["a"], ["b"], name="neg"), helper.make_node("Relu", ["x"], ["a"], name="relu")]
    body = helper.make_graph(body_nodes, "then", [], [helper.make_tensor_value_info("b", T.FLOAT, [2])])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["c"])], "else", [],
                              [helper.make_tensor_value_info("c", T.FLOAT, [2])])
    node = helper.make_node("If", ["cond"], ["y"], then_branch=body, else_branch=other)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("cond", T.BOOL, []),
                                            helper.make_tensor_value_info("x", T.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    notes = model_io.LoadNotes()
    loaded = model_io.load_model(_save(model, tmp_path / "if.onnx"), notes=notes)
    assert notes.reordered
    then = next(a.g for a in loaded.graph.node[0].attribute if a.name == "then_branch")
    assert [n.name for n in then.node] == ["relu", "neg"]


# --- checker errors ORT tolerates ---------------------------------------------------------------------
def test_unshaped_outputs_warn_and_stay_unshaped(tmp_path):
    out = tmp_path / "out.onnx"
    report = optimize_file(GRAPHSURGEON, out)
    # 2 BERT layers x (1 intermediate Linear+GELU, 1 attention, Q/K/V packed), and the embeddings
    assert report.fused_by_op == {"ai.onnxfuse.FusedLinearGelu": 2, "com.microsoft.Attention": 2,
                                  "com.microsoft.SkipLayerNormalization": 1}
    assert len(report.warnings) == 1 and "onnx.checker rejects the input" in report.warnings[0]
    written = onnx.load(str(out))
    assert all(not o.type.tensor_type.HasField("shape") for o in written.graph.output)
    assert [o.SerializeToString() for o in written.graph.output] == \
        [o.SerializeToString() for o in onnx.load(str(GRAPHSURGEON)).graph.output]
    assert model_io.checker_error(out) == model_io.checker_error(GRAPHSURGEON)


def test_cli_says_each_warning_in_one_line_on_stderr(tmp_path):
    for path in (GRAPHSURGEON, FP16_CONVERTER):
        for args in (["inspect", str(path)], ["optimize", str(path), "-o", str(tmp_path / "o.onnx")],
                     ["inspect", str(path), "--json", "-"]):
            result = CliRunner().invoke(main, args)
            assert result.exit_code == 0, result.output
            lines = result.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("onnxfuse: warning: "), result.stderr
            assert str(path) in lines[0]
    assert '"warnings": [' in CliRunner().invoke(main, ["inspect", str(GRAPHSURGEON), "--json", "-"]).stdout


def test_checker_errors_ort_refuses_too_are_bad_input(tmp_path):
    model = build()
    matmul = next(n for n in model.graph.node if n.op_type == "MatMul")
    del matmul.input[1:]  # a MatMul of one operand
    path = _save(model, tmp_path / "bad.onnx")
    with pytest.raises(BadInputError, match="not a valid ONNX model: .*input size"):
        model_io.load_model(path)
    result = CliRunner().invoke(main, ["optimize", str(path), "-o", str(tmp_path / "o.onnx")])
    assert result.exit_code == 2 and not (tmp_path / "o.onnx").exists()


def test_the_output_may_keep_the_inputs_checker_error_but_not_add_one(tmp_path):
    unshaped = build()
    unshaped.graph.output[0].type.tensor_type.ClearField("shape")
    path = _save(unshaped, tmp_path / "unshaped.onnx")
    error = model_io.checker_error(path)
    assert error is not None and "shape" in error
    model_save.check_output(str(path), "out.onnx", error)  # the same error: allowed
    with pytest.raises(BadInputError, match="an error the input did not have"):
        model_save.check_output(str(path), "out.onnx", "some other error the input had")
    with pytest.raises(onnx.checker.ValidationError):
        model_save.check_output(str(path), "out.onnx", None)  # an input that passes: so must the output


def test_optimized_unshaped_model_computes_what_the_input_did(tmp_path):
    model = build("erf:pytorch:div", "matmul", k=8, n=16)
    for o in model.graph.output:
        o.type.tensor_type.ClearField("shape")
    src = _save(model, tmp_path / "in.onnx")
    optimize_file(src, tmp_path / "out.onnx")
    out = onnx.load(str(tmp_path / "out.onnx"))
    feeds = {v.name: np.random.default_rng(0).standard_normal(
        [d.dim_value or 3 for d in v.type.tensor_type.shape.dim]).astype(np.float32) for v in model.graph.input}
    np.testing.assert_allclose(run(out, feeds)[0], run(model, feeds)[0], rtol=2e-5, atol=2e-5)


def test_out_of_order_model_with_external_data_is_checked_as_sorted(tmp_path):
    """The sorted model exists in memory only; its external weights are judged by type and dims (their
    files are checked on load), so the checker says nothing of a model that is fine once sorted."""
    model = onnx.load(str(FP16_CONVERTER))
    src = tmp_path / "in.onnx"
    onnx.save_model(model, str(src), save_as_external_data=True, location="in.onnx.data", size_threshold=0)
    notes = model_io.LoadNotes()
    model_io.load_model(src, notes=notes)
    assert notes.reordered and notes.checker_error is None, notes
    report = optimize_file(src, tmp_path / "out.onnx")
    # (every weight is external data here: Q, K and V are packed while the output is saved)
    assert report.fused_by_op == {"ai.onnxfuse.FusedLinearGelu": 2, "com.microsoft.Attention": 2} and len(report.warnings) == 1
    assert model_io.checker_error(tmp_path / "out.onnx") is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.onnx", "in.onnx.data", "out.onnx", "out.onnx.data"]
