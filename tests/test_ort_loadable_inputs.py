"""Models ONNX Runtime loads though they break a rule of ONNX, taken as ORT takes them (the cases ORT's own test
models showed):

* nodes of a domain the model does not import (``com.microsoft``, ``ai.onnx.ml``, even the default domain):
  ORT imports every domain it knows at its latest version; so does the load, and the output declares it;
* the default domain spelled ``ai.onnx`` on nodes or imports: the same domain as "" everywhere;
* a tensor several ``Constant`` nodes define (or one beside an initializer): ORT reads the last Constant
  node's value, and so do the rules; a node of another op writing a defined name is refused, by ORT too.

Each is a tiny model built here, checked against ORT itself (it loads it, and computes what the output
computes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from onnxfuse import model_io
from onnxfuse.domain import DOMAIN, DOMAIN_VERSION
from onnxfuse.cli import main
from onnxfuse.errors import BadInputError
from onnxfuse.fuse import fuse_model
from onnxfuse.pipeline import inspect_file, optimize_file
from onnxfuse.runtime import load_probes, ort_implied_opsets
from tests.graphs import Builder, block, build
from tests.ort_run import assert_ort_matches, ort_outputs

ORT_IR_VERSION = 9  # tests.graphs' models: read by the ORT the tests run
FEEDS = {"x": np.random.default_rng(5).standard_normal((2, 3, 16)).astype(np.float32)}


def _save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save_model(model, str(path))
    return path


def _without_import(model: onnx.ModelProto, *domains: str) -> onnx.ModelProto:
    kept = [o for o in model.opset_import if o.domain not in domains]
    del model.opset_import[:]
    model.opset_import.extend(kept)
    return model


def _opsets(model: onnx.ModelProto) -> dict[str, int]:
    return {o.domain: o.version for o in model.opset_import}


# --- undeclared domains -------------------------------------------------------------------------------
def test_ort_names_the_versions_it_assumes():
    versions = ort_implied_opsets()
    assert versions["com.microsoft"] == 1
    assert versions["ai.onnx.ml"] >= 1 and versions[""] >= 17
    assert "ai.unknown" not in versions


def test_undeclared_com_microsoft_is_read_at_orts_version_and_declared(tmp_path):
    model = _without_import(build("ms:Gelu", "matmul"), "com.microsoft")
    path = _save(model, tmp_path / "ms.onnx")
    ort_outputs(model, FEEDS)  # ORT runs it as it is
    notes = model_io.LoadNotes()
    loaded = model_io.load_model(path, notes=notes, **load_probes())
    assert notes.declared_opsets == (("com.microsoft", 1),) and notes.checker_error is None
    assert _opsets(loaded)["com.microsoft"] == 1
    assert len(notes.warnings) == 1 and "domain 'com.microsoft'" in notes.warnings[0]
    report = optimize_file(path, tmp_path / "out.onnx")
    assert [b.form for b in report.fused] == ["com.microsoft.Gelu+MatMul+Add"]
    assert report.warnings == notes.warnings
    out = onnx.load(str(tmp_path / "out.onnx"))
    onnx.checker.check_model(out, full_check=True)
    assert_ort_matches(model, out, FEEDS)


def test_cli_takes_it_with_one_warning_line(tmp_path):
    path = _save(_without_import(build("ms:Gelu", "matmul"), "com.microsoft"), tmp_path / "ms.onnx")
    for args in (["optimize", str(path), "-o", str(tmp_path / "o.onnx")], ["inspect", str(path)]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith("onnxfuse: warning: ") and "'com.microsoft'" in line and "version 1" in line


def _ml_normalizer_model(declared: bool) -> onnx.ModelProto:
    node = helper.make_node("Normalizer", ["x"], ["y"], name="norm", domain="ai.onnx.ml", norm="L2")
    graph = helper.make_graph([node], "ml", [helper.make_tensor_value_info("x", T.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [2, 4])])
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid("ai.onnx.ml", 3)] if declared else [])
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = ORT_IR_VERSION
    return model


def test_undeclared_ai_onnx_ml_with_nothing_to_fuse_is_the_input_with_its_opset_declared(tmp_path):
    model = _ml_normalizer_model(declared=False)
    path = _save(model, tmp_path / "ml.onnx")
    report = optimize_file(path, tmp_path / "out.onnx")
    assert report.fused == [] and "domain 'ai.onnx.ml'" in report.warnings[0]
    out = onnx.load(str(tmp_path / "out.onnx"))
    assert _opsets(out) == {"": 17, "ai.onnx.ml": ort_implied_opsets()["ai.onnx.ml"]}
    # nothing else moved: the input with that one import appended, byte for byte
    expected = onnx.load(str(path))
    expected.opset_import.append(helper.make_opsetid("ai.onnx.ml", ort_implied_opsets()["ai.onnx.ml"]))
    assert (tmp_path / "out.onnx").read_bytes() == expected.SerializeToString()
    x = {"x": np.arange(8, dtype=np.float32).reshape(2, 4)}
    np.testing.assert_array_equal(ort_outputs(out, x)[0], ort_outputs(model, x)[0])


def test_declared_domains_are_left_as_they_are(tmp_path):
    path = _save(_ml_normalizer_model(declared=True), tmp_path / "ml.onnx")
    optimize_file(path, tmp_path / "out.onnx")
    assert (tmp_path / "out.onnx").read_bytes() == path.read_bytes()


def test_undeclared_default_domain_is_read_at_orts_version(tmp_path):
    model = _without_import(build("erf:pytorch:div", "matmul"), "")
    assert _opsets(model) == {"com.microsoft": 1}
    ort_outputs(model, FEEDS)
    path = _save(model, tmp_path / "nodefault.onnx")
    report = optimize_file(path, tmp_path / "out.onnx")
    assert [b.form for b in report.fused] == ["erf-GELU+MatMul+Add"]
    out = onnx.load(str(tmp_path / "out.onnx"))
    assert _opsets(out)[""] == ort_implied_opsets()[""]
    assert_ort_matches(model, out, FEEDS)


def test_domains_ort_does_not_know_are_still_refused(tmp_path):
    model = build()
    model.graph.node[0].domain = "ai.unknown"
    path = _save(model, tmp_path / "d.onnx")
    with pytest.raises(BadInputError, match="uses domain 'ai.unknown' that the model does not import"):
        model_io.load_model(path, **load_probes())
    result = CliRunner().invoke(main, ["optimize", str(path), "-o", str(tmp_path / "o.onnx")])
    assert result.exit_code == 2 and not (tmp_path / "o.onnx").exists()


# --- the default domain spelled ai.onnx ---------------------------------------------------------------
def _spelled_ai_onnx(model: onnx.ModelProto, nodes: bool, imports: bool) -> onnx.ModelProto:
    if nodes:
        for n in model.graph.node:
            if n.domain == "":
                n.domain = "ai.onnx"
    if imports:
        for o in model.opset_import:
            if o.domain == "":
                o.domain = "ai.onnx"
    return model


@pytest.mark.parametrize("nodes,imports", [(True, False), (False, True), (True, True)],
                         ids=["nodes", "import", "both"])
def test_ai_onnx_is_the_default_domain_for_every_rule(tmp_path, nodes, imports):
    for gelu in ("erf:pytorch:div", "tanh:pow", "onnx:none"):
        model = _spelled_ai_onnx(build(gelu, "matmul"), nodes, imports)
        path = _save(model, tmp_path / "m.onnx")
        report = optimize_file(path, tmp_path / "out.onnx")
        assert len(report.fused) == 1, (gelu, report.refused)
        assert_ort_matches(model, onnx.load(str(tmp_path / "out.onnx")), FEEDS)


def test_ai_onnx_nodes_without_a_default_import_declare_the_default_domain(tmp_path):
    model = _without_import(_spelled_ai_onnx(build("erf:pytorch:div", "matmul"), True, False), "")
    ort_outputs(model, FEEDS)
    path = _save(model, tmp_path / "m.onnx")
    notes = model_io.LoadNotes()
    loaded = model_io.load_model(path, notes=notes, **load_probes())
    assert notes.declared_opsets == (("", ort_implied_opsets()[""]),)
    assert _opsets(loaded)[""] == ort_implied_opsets()[""]
    assert notes.checker_error is None  # judged as ONNX reads "ai.onnx": the default domain
    report = optimize_file(path, tmp_path / "out.onnx")
    assert len(report.fused) == 1
    assert_ort_matches(model, onnx.load(str(tmp_path / "out.onnx")), FEEDS)


@pytest.mark.parametrize("nodes,imports", [(True, False), (False, True), (True, True)],
                         ids=["nodes", "import", "both"])
def test_ai_onnx_is_judged_by_the_checker_as_the_default_domain(tmp_path, nodes, imports):
    """onnx.checker looks the schema of a node spelled "ai.onnx" up under that spelling and fails it, naming
    its op: a block fused away would change that error (the first op named), which read as an error the
    output added. Judged as ONNX defines the domain, input and output pass, and the output keeps the
    spelling."""
    b = Builder()
    gelu = block(b, "x", "erf:pytorch:div", "matmul")
    model = _spelled_ai_onnx(b.model([("x", ["b", "s", 16])], [(b.node("Relu", [gelu]), ["b", "s", 24])]),
                             nodes, imports)
    path = _save(model, tmp_path / "m.onnx")
    notes = model_io.LoadNotes()
    model_io.load_model(path, notes=notes, **load_probes())
    assert notes.checker_error is None and notes.warnings == []
    report = optimize_file(path, tmp_path / "out.onnx")
    assert len(report.fused) == 1 and report.warnings == []
    out = onnx.load(str(tmp_path / "out.onnx"))
    relu = next(n for n in out.graph.node if n.op_type == "Relu")
    assert relu.domain == ("ai.onnx" if nodes else "")
    assert ("ai.onnx" if imports else "") in _opsets(out)
    assert_ort_matches(model, out, FEEDS)


def test_ai_onnx_model_with_nothing_to_fuse_stays_byte_identical(tmp_path):
    model = _spelled_ai_onnx(build("erf:pytorch:div", "matmul", perturb={"sqrt2": 1.5}), True, False)
    path = _save(model, tmp_path / "m.onnx")
    report = optimize_file(path, tmp_path / "out.onnx")
    assert report.fused == [] and "not √2" in report.refused[0].reason
    assert (tmp_path / "out.onnx").read_bytes() == path.read_bytes()


# --- a tensor several Constant nodes define -----------------------------------------------------------
def _erf_gelu_with_two_sqrt2(first: float, last: float, initializer: float | None = None) -> onnx.ModelProto:
    """MatMul+Add → x / c · ... with ``c`` written by two Constant nodes (and maybe an initializer), ``last``
    the value ORT reads."""
    b = Builder(const_style="node")
    w, bias = b.tensor("W", (16, 24), 0.25), b.tensor("B", (24,), 0.1)
    y = b.node("Add", [b.node("MatMul", ["x", w]), bias])
    for value in (first, last):
        b.nodes.append(helper.make_node("Constant", [], ["c"], name=b.fresh("Constant"),
                                        value=numpy_helper.from_array(np.array(value, np.float32))))
    if initializer is not None:
        b.initializers.append(numpy_helper.from_array(np.array(initializer, np.float32), "c"))
    p = b.node("Add", [b.node("Erf", [b.node("Div", [y, "c"])]), b.const("one")])
    out = b.node("Mul", [b.node("Mul", [y, p]), b.const("half")])
    return b.model([("x", ["b", "s", 16])], [(out, ["b", "s", 24])])


def test_orts_reading_of_duplicate_constants():
    """The premise, asked of ORT: two Constant nodes of one name load, and the last one's value is read,
    also over an initializer of that name."""
    x = {"x": np.zeros((1, 1), np.float32)}

    def model(*defs):
        nodes = [helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.array([v], np.float32)))
                 for v in defs if v is not None]
        graph = helper.make_graph(nodes + [helper.make_node("Add", ["x", "c"], ["y"])], "g",
                                  [helper.make_tensor_value_info("x", T.FLOAT, [1, 1])],
                                  [helper.make_tensor_value_info("y", T.FLOAT, [1, 1])],
                                  [numpy_helper.from_array(np.array([5.0], np.float32), "c")] if None in defs else [])
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = ORT_IR_VERSION
        return m

    assert ort_outputs(model(1.0, 2.0), x)[0].item() == 2.0
    assert ort_outputs(model(None, 3.0), x)[0].item() == 3.0


@pytest.mark.parametrize("initializer", [None, 7.0], ids=["two-constants", "and-an-initializer"])
def test_the_last_constant_is_the_one_the_rules_read(tmp_path, initializer):
    model = _erf_gelu_with_two_sqrt2(first=1.5, last=float(np.sqrt(2.0)), initializer=initializer)
    path = _save(model, tmp_path / "dup.onnx")
    notes = model_io.LoadNotes()
    model_io.load_model(path, notes=notes, **load_probes())
    assert notes.duplicate_constants == (("c", 3 if initializer else 2),)
    assert notes.checker_error is not None  # not SSA: onnx.checker rejects it, ORT loads it
    assert any("tensor 'c' is defined" in w for w in notes.warnings)
    report = optimize_file(path, tmp_path / "out.onnx")
    assert [b.form for b in report.fused] == ["erf-GELU+MatMul+Add"]
    assert_ort_matches(model, onnx.load(str(tmp_path / "out.onnx")), FEEDS)


def test_a_wrong_last_constant_is_refused_and_left_as_it_was(tmp_path):
    model = _erf_gelu_with_two_sqrt2(first=float(np.sqrt(2.0)), last=1.5)
    path = _save(model, tmp_path / "dup.onnx")
    report = optimize_file(path, tmp_path / "out.onnx")
    assert report.fused == [] and "divisor 1.5 is not √2" in report.refused[0].reason
    assert (tmp_path / "out.onnx").read_bytes() == path.read_bytes()
    # and inspect says the same
    assert "divisor 1.5" in inspect_file(path).refused[0].reason


def test_the_sort_keeps_the_last_constant_last(tmp_path):
    model = _erf_gelu_with_two_sqrt2(first=1.5, last=float(np.sqrt(2.0)))
    nodes = list(model.graph.node)
    last = next(k for k in reversed(range(len(nodes))) if nodes[k].output[0] == "c")
    moved = nodes[last]
    del model.graph.node[last]
    model.graph.node.append(moved)  # the second definition after its reader: ORT reads it all the same
    path = _save(model, tmp_path / "late.onnx")
    notes = model_io.LoadNotes()
    loaded = model_io.load_model(path, notes=notes, **load_probes())
    assert notes.reordered
    constants = [n for n in loaded.graph.node if n.output[0] == "c"]
    assert [numpy_helper.to_array(n.attribute[0].t).item() for n in constants] == [1.5, np.float32(np.sqrt(2.0))]
    report = optimize_file(path, tmp_path / "out.onnx")
    assert len(report.fused) == 1
    assert_ort_matches(model, onnx.load(str(tmp_path / "out.onnx")), FEEDS)


def test_a_node_of_another_op_writing_a_defined_name_is_refused_as_ort_refuses_it(tmp_path):
    model = _erf_gelu_with_two_sqrt2(first=1.5, last=float(np.sqrt(2.0)))
    first = next(n for n in model.graph.node if n.output[0] == "c")
    first.op_type, first.input[:] = "Identity", ["x"]
    del first.attribute[:]
    with pytest.raises(Exception):  # noqa: B017 - ORT's own error type
        ort_outputs(model, FEEDS)
    with pytest.raises(BadInputError, match="tensor 'c' is computed twice"):
        model_io.load_model(_save(model, tmp_path / "twice.onnx"))


def test_fuse_model_alone_reads_the_last_constant():
    model = _erf_gelu_with_two_sqrt2(first=1.5, last=float(np.sqrt(2.0)))
    assert [b.form for b in fuse_model(model).report.fused] == ["erf-GELU+MatMul+Add"]


def test_model_io_alone_assumes_no_version_for_an_undeclared_domain(tmp_path):
    # model_io does not ask ONNX Runtime by itself (it may not import it: tests/test_imports.py); the caller
    # passes runtime.load_probes(), as every command does
    model = _without_import(_spelled_ai_onnx(build("erf:pytorch:div", "matmul"), True, False), "")
    path = _save(model, tmp_path / "m.onnx")
    with pytest.raises(BadInputError, match="does not import"):
        model_io.load_model(path)
    model_io.load_model(path, **load_probes())


def test_an_import_of_our_domain_no_node_uses_at_a_version_we_never_wrote_is_dropped(tmp_path):
    # ONNX Runtime's saves import every domain its registry knows (custom domains at 1000): a model ORT's
    # transformers optimizer saved in a process that had registered onnxfuse's library imports ai.onnxfuse:1000
    model = build("erf:pytorch:div", "matmul")
    model.opset_import.append(helper.make_opsetid(DOMAIN, 1000))
    path = _save(model, tmp_path / "m.onnx")
    notes = model_io.LoadNotes()
    loaded = model_io.load_model(path, notes=notes, **load_probes())
    assert DOMAIN not in _opsets(loaded)
    assert notes.dropped_imports == ((DOMAIN, 1000),) and any("1000" in w for w in notes.warnings)
    report = optimize_file(path, tmp_path / "out.onnx")
    assert len(report.fused) == 1
    out = onnx.load(str(tmp_path / "out.onnx"))
    assert _opsets(out)[DOMAIN] == DOMAIN_VERSION
    assert_ort_matches(model, out, FEEDS)


def test_a_node_of_our_domain_at_a_version_we_never_wrote_is_still_refused(tmp_path):
    model = build("erf:pytorch:div", "matmul")
    model.opset_import.append(helper.make_opsetid(DOMAIN, 1000))
    model.graph.node.append(helper.make_node("FusedLinearGelu", ["x", "x"], ["z"], domain=DOMAIN))
    with pytest.raises(BadInputError, match="version 1000 is not supported"):
        model_io.load_model(_save(model, tmp_path / "m.onnx"), **load_probes())
