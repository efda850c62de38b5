"""scripts/run_corpora.py on a corpus of tiny models made here (its ``--ort-testdata`` form, no download): each
promise it holds the optimizer to is counted where kept and named where broken, the exit code says which."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from onnxfuse.domain import DOMAIN
from onnxfuse.errors import BadInputError
from tests.graphs import build

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "run_corpora.py"


@pytest.fixture(scope="module")
def corpora():
    spec = importlib.util.spec_from_file_location("onnxfuse_run_corpora", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (dataclasses look their module up while the file runs)
    spec.loader.exec_module(module)
    return module


def _model(name: str, folder: Path, model: onnx.ModelProto, inputs: dict | None = None) -> Path:
    folder = folder / name
    folder.mkdir(parents=True)
    onnx.save_model(model, str(folder / "model.onnx"))
    if inputs:
        sets = folder / "test_data_set_0"
        sets.mkdir()
        for k, (key, value) in enumerate(inputs.items()):
            (sets / f"input_{k}.pb").write_bytes(numpy_helper.from_array(value, key).SerializeToString())
    return folder / "model.onnx"


def _relu() -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "relu",
                              [helper.make_tensor_value_info("x", T.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


@pytest.fixture
def corpus(tmp_path) -> Path:
    """fuses (with its own inputs) · nothing to fuse · ORT cannot load it, onnxfuse takes it (a contrib op
    that does not exist) · neither loads it (an IR version from the future) · an undeclared domain (the
    output declares it: normalised) · fuses, its weights in external data (random inputs)."""
    root = tmp_path / "corpus"
    x = np.random.default_rng(1).standard_normal((2, 3, 16)).astype(np.float32)
    _model("fuses", root, build("erf:pytorch:div", "matmul"), {"x": x})
    _model("relu", root, _relu())
    unknown_op = _relu()
    unknown_op.graph.node[0].domain = "com.microsoft"
    unknown_op.graph.node[0].op_type = "NoSuchOp"
    unknown_op.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    _model("ort-cannot-load", root, unknown_op)
    future = _relu()
    future.ir_version = onnx.IR_VERSION + 1
    _model("nobody-loads", root, future)
    _model("undeclared", root, _relu_with_undeclared_ml())
    external = root / "external"
    external.mkdir()
    onnx.save_model(build("tanh:pow", "matmul"), str(external / "model.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="model.onnx.data", size_threshold=0)
    return root


def _relu_with_undeclared_ml() -> onnx.ModelProto:
    node = helper.make_node("Normalizer", ["x"], ["y"], name="norm", domain="ai.onnx.ml", norm="MAX")
    graph = helper.make_graph([node], "ml", [helper.make_tensor_value_info("x", T.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def _run(corpora, corpus: Path, capsys) -> tuple[int, str]:
    code = corpora.main(["--no-onnx", "--ort-testdata", str(corpus), "-v"])
    return code, capsys.readouterr().out


def _row(out: str, corpus: str = "ort") -> dict[str, int]:
    header = next(line for line in out.splitlines() if line.startswith("corpus"))
    names = [h for h in header.split("  ") if h.strip()][1:]
    row = next(line for line in out.splitlines() if line.startswith(corpus + " "))
    return dict(zip([n.strip() for n in names], map(int, row.split()[1:])))


def test_a_corpus_that_keeps_every_promise(corpora, corpus, capsys):
    code, out = _run(corpora, corpus, capsys)
    assert code == 0, out
    assert _row(out) == {"models": 6, "ORT loads": 4, "taken": 5, "refused": 1, "fused": 2, "within tol.": 2,
                         "unchecked": 0, "byte-identical": 2, "normalised": 1, "idempotent": 5, "failures": 0}
    assert "ok   ort/fuses/model.onnx: fused" in out
    assert "ok   ort/ort-cannot-load/model.onnx: identical (ORT cannot load it)" in out
    assert "FAIL" not in out


def _wrap(corpora, monkeypatch, after):
    """``optimize_file`` as the runner calls it, then ``after(output path, report)`` on what it wrote."""
    real = corpora.optimize_file

    def optimize(src, dst, **kw):
        report = real(src, dst, **kw)
        after(Path(dst), report)
        return report

    monkeypatch.setattr(corpora, "optimize_file", optimize)


def test_a_rewrite_that_changes_the_math_is_named(corpora, corpus, capsys, monkeypatch):
    def skew_the_bias(path: Path, report) -> None:
        model = onnx.load(str(path))
        fused = [n for n in model.graph.node if n.domain == DOMAIN]
        if fused and "fuses/model.onnx" in report.model:  # the input's pass only: it stays idempotent
            bias = next(t for t in model.graph.initializer if t.name == fused[0].input[2])
            bias.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(bias) + 0.01, bias.name))
            onnx.save(model, str(path))

    _wrap(corpora, monkeypatch, skew_the_bias)
    code, out = _run(corpora, corpus, capsys)
    assert code == 1
    (fail,) = [line for line in out.splitlines() if line.startswith("FAIL")]
    assert "ort/fuses/model.onnx: output" in fail and "test_data_set sample 0" in fail and "beyond rtol" in fail
    assert _row(out)["within tol."] == 1 and _row(out)["failures"] == 1  # the external one is still right


def test_a_model_ort_loads_and_onnxfuse_refuses_is_named(corpora, corpus, capsys, monkeypatch):
    def refuse_relu(path: Path, report) -> None:
        if "relu" in report.model:
            raise BadInputError(f"{report.model}: refused for the test")

    _wrap(corpora, monkeypatch, refuse_relu)
    code, out = _run(corpora, corpus, capsys)
    assert code == 1
    (fail,) = [line for line in out.splitlines() if line.startswith("FAIL")]
    assert fail.startswith("FAIL ort/relu/model.onnx: ONNX Runtime loads it, onnxfuse refused it")


def test_a_change_where_nothing_fused_is_named(corpora, corpus, capsys, monkeypatch):
    def touch(path: Path, report) -> None:
        if not report.fused and "ort-cannot-load" in report.model:
            model = onnx.load(str(path))
            model.doc_string = "touched"
            onnx.save(model, str(path))

    _wrap(corpora, monkeypatch, touch)
    code, out = _run(corpora, corpus, capsys)
    assert code == 1
    assert "FAIL ort/ort-cannot-load/model.onnx: nothing fused, yet the output is neither the input" in out


def test_a_rewrite_that_is_not_idempotent_is_named(corpora, corpus, capsys, monkeypatch):
    def stamp(path: Path, report) -> None:
        if "relu" in report.model:
            model = onnx.load(str(path))
            model.model_version += 1  # each pass writes another version
            onnx.save(model, str(path))

    _wrap(corpora, monkeypatch, stamp)
    code, out = _run(corpora, corpus, capsys)
    assert code == 1
    assert "FAIL ort/relu/model.onnx: nothing fused, yet" in out
    assert "FAIL ort/relu/model.onnx: not idempotent" in out


def test_an_internal_error_is_named_whatever_the_input(corpora, corpus, capsys, monkeypatch):
    def crash(path: Path, report) -> None:
        if "nobody" in report.model:
            raise AssertionError("boom")

    _wrap(corpora, monkeypatch, crash)
    code, out = _run(corpora, corpus, capsys)
    assert code == 0  # never called: onnxfuse refuses that one before writing anything

    def crash_relu(path: Path, report) -> None:
        if "relu" in report.model:
            raise AssertionError("boom")

    _wrap(corpora, monkeypatch, crash_relu)
    code, out = _run(corpora, corpus, capsys)
    assert code == 1 and "FAIL ort/relu/model.onnx: internal error: AssertionError: boom" in out


def test_usage_errors_exit_2(corpora, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        corpora.main(["--ort-testdata", str(tmp_path / "missing")])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        corpora.main(["--no-onnx"])
    assert e.value.code == 2


def test_onnx_corpus_is_generated_from_the_installed_onnx(corpora, tmp_path):
    """The node tests come from onnx's case generators, with their own inputs; the shipped data folders exist."""
    items = corpora.onnx_node_tests(tmp_path)
    first = next(items)
    model = onnx.load(str(first.path))
    (sample,) = first.samples(model)[:1]
    assert set(sample) == {v.name for v in model.graph.input}
    assert any(True for _ in corpora.onnx_shipped_tests())
