"""`onnxfuse tune --approximate auto --error-budget REL`: which forms pay per node, the choice and its back-off
within the budget, the model error it is held to, the written attributes and metadata, re-tuning, the
argument errors — with injected timings and an injected error function (no GPU needed) — and, on a GPU,
the real thing on a sample model."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import helper

from onnxfuse import approximation, tuning
from onnxfuse.accuracy import ModelError, ReferenceRun, model_error
from onnxfuse.approximation import FormOption, NodeForms, choose_forms, node_forms, restore_forms, with_forms
from onnxfuse.cli import main
from onnxfuse.error_statistics import output_errors
from onnxfuse.domain import OP_TYPE
from onnxfuse.pipeline import optimize_file
from onnxfuse.runtime import create_session, cuda_usable
from onnxfuse.tuning import NodeShape, NodeTuning, PathTimes, TunableNode
from tests.test_cli_optimize import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIGNATURE = "NVIDIA Test GPU|sm_90|cuda 13.0|onnxfuse 0.6.0"
DEVICE = tuning.Device(SIGNATURE, "NVIDIA Test GPU", "9.0", "13.0", "13.0", "1.31.1", "0.6.0")
F32 = onnx.TensorProto.FLOAT
EXACT_SHAPE = NodeShape(768, 3072, onnx.TensorProto.FLOAT16, 1, "none")


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """tiny_bert after optimize: two exact-GELU FusedLinearGelu nodes (K=32, N=128)."""
    out = tmp_path_factory.mktemp("approx") / "tiny_bert.fused.onnx"
    optimize_file(os.path.join(ROOT, "sample_models/tiny_bert.onnx"), out)
    return out


def _tuning(times: dict[int, tuple[float, ...]], form: str = "none", name: str = "n0") -> NodeTuning:
    """A node's tuning from (fused µs, fallback µs[, gemv µs]) per M."""
    shape = approximation.form_shape(EXACT_SHAPE, form)
    node = TunableNode(name, "x", shape, "auto")
    return NodeTuning(node, {b: m for b, m in enumerate(sorted(times))},
                      {m: PathTimes(t[0], t[1], None, gemv_us=t[2] if len(t) > 2 else None) for m, t in times.items()})


# --- which forms pay -----------------------------------------------------------------------------------
def test_a_form_pays_where_its_fastest_path_gains_2_percent_at_the_largest_m():
    exact = _tuning({128: (20.0, 10.0), 4096: (100.0, 110.0)})  # best: 10 (fallback), 100 (fused)
    tanh = _tuning({128: (20.0, 10.1), 4096: (108.0, 97.5)}, "tanh")  # best: 10.1, 97.5 (fallback now)
    forms = node_forms(exact, {"tanh": tanh})
    assert forms.largest_m == 4096 and forms.best == {"none": {128: 10.0, 4096: 100.0}, "tanh": {128: 10.1, 4096: 97.5}}
    (option,) = forms.options
    assert option.form == "tanh" and option.gain_us == pytest.approx(2.5) and option.gain == pytest.approx(0.025)
    assert forms.rejected == {}


def test_a_forms_time_is_its_fastest_path_gemv_included():
    """At few rows the node may take gemv: a form is judged by the path it would take, gemv too."""
    exact = _tuning({8: (20.0, 18.0, 6.0), 4096: (100.0, 110.0)})  # best: 6 (gemv), 100 (fused)
    tanh = _tuning({8: (19.0, 17.0, 6.3), 4096: (95.0, 110.0)}, "tanh")  # 5 % slower at M=8 through gemv
    forms = node_forms(exact, {"tanh": tanh})
    assert forms.best == {"none": {8: 6.0, 4096: 100.0}, "tanh": {8: 6.3, 4096: 95.0}}
    assert forms.options == () and forms.rejected == {"tanh": "5.0% slower at M=8"}
    assert exact.paths == ["gemv", "fused"] and exact.max_rows == [8, 4096]


@pytest.mark.parametrize("tanh_times, why", [
    ({128: (10.0, 10.0), 4096: (98.5, 99.0)}, "+1.5% at M=4096, under the 2% a change must clear"),  # noise
    ({128: (10.0, 10.0), 4096: (101.0, 120.0)}, "-1.0% at M=4096"),  # slower
    ({128: (10.3, 10.5), 4096: (90.0, 99.0)}, "3.0% slower at M=128"),  # faster at the top, slower below
])
def test_a_form_that_does_not_clear_the_margin_everywhere_stays_out(tanh_times, why):
    exact = _tuning({128: (10.0, 11.0), 4096: (100.0, 110.0)})
    forms = node_forms(exact, {"tanh": _tuning(tanh_times, "tanh")})
    assert forms.options == () and why in forms.rejected["tanh"]


def test_sigmoid_is_kept_only_where_it_is_faster_than_tanh():
    exact = _tuning({4096: (100.0, 110.0)})
    tanh = _tuning({4096: (95.0, 110.0)}, "tanh")
    not_faster = node_forms(exact, {"tanh": tanh, "sigmoid": _tuning({4096: (95.0, 110.0)}, "sigmoid")})
    assert [o.form for o in not_faster.options] == ["tanh"]
    assert not_faster.rejected == {"sigmoid": "less accurate than tanh and not faster"}
    faster = node_forms(exact, {"tanh": tanh, "sigmoid": _tuning({4096: (90.0, 110.0)}, "sigmoid")})
    assert [(o.form, round(o.gain_us, 6)) for o in faster.options] == [("tanh", 5.0), ("sigmoid", 10.0)]
    alone = node_forms(exact, {"sigmoid": _tuning({4096: (90.0, 110.0)}, "sigmoid")})  # tanh not asked for
    assert [o.form for o in alone.options] == ["sigmoid"]


def test_a_node_whose_model_computes_an_approximation_is_never_switched():
    own = _tuning({4096: (100.0, 110.0)}, "tanh")
    forms = node_forms(own, {"tanh": _tuning({4096: (50.0, 50.0)}, "tanh")})
    assert forms.options == () and forms.model_form == "tanh" and "only exact GELU nodes" in forms.rejected["*"]
    assert approximation.variants([own.node], ["tanh", "sigmoid"]) == {"tanh": [], "sigmoid": []}


def test_variants_are_the_exact_nodes_in_each_form():
    exact = TunableNode("a", "x", EXACT_SHAPE, "auto")
    found = approximation.variants([exact], ["tanh", "sigmoid"])
    assert [n.shape.approximate for n in found["tanh"]] == ["tanh"] and found["tanh"][0].shape.alpha is None
    assert found["sigmoid"][0].shape.alpha == pytest.approx(1.702) and found["sigmoid"][0].name == "a"


# --- choosing within the budget --------------------------------------------------------------------------
def _forms(name: str, *gains: tuple[str, float], base: float = 100.0) -> NodeForms:
    return NodeForms(name, "none", 4096, {}, tuple(FormOption(f, g, g / base) for f, g in gains))


class _Oracle:
    """An injected model error: the sum of a per-(node, form) error, with every call recorded."""

    def __init__(self, errors: dict[tuple[str, str], float]):
        self.errors, self.calls = errors, []

    def __call__(self, forms: dict[str, str]) -> ModelError:
        self.calls.append(dict(forms))
        total = sum(self.errors[(n, f)] for n, f in forms.items())
        return ModelError(total, {"y": total})


def test_faster_and_within_budget_is_switched_after_one_check():
    nodes = [_forms("a", ("tanh", 5.0)), _forms("b", ("tanh", 3.0))]
    oracle = _Oracle({("a", "tanh"): 1e-4, ("b", "tanh"): 1e-4})
    choice = choose_forms(nodes, oracle, budget=1e-3)
    assert choice.forms == {"a": "tanh", "b": "tanh"} and choice.error.error == pytest.approx(2e-4)
    assert oracle.calls == [{"a": "tanh", "b": "tanh"}] and [c.within_budget for c in choice.checks] == [True]


def test_over_budget_backs_off_the_least_gain_first_and_keeps_only_a_checked_set():
    nodes = [_forms("a", ("tanh", 5.0)), _forms("b", ("tanh", 1.0)), _forms("c", ("tanh", 3.0))]
    oracle = _Oracle({("a", "tanh"): 4e-4, ("b", "tanh"): 4e-4, ("c", "tanh"): 4e-4})
    choice = choose_forms(nodes, oracle, budget=1e-3)
    assert oracle.calls == [{"a": "tanh", "b": "tanh", "c": "tanh"}, {"a": "tanh", "c": "tanh"}]
    assert choice.forms == oracle.calls[-1] and choice.error.error == pytest.approx(8e-4)
    assert [(c.step, c.within_budget) for c in choice.checks] == [(None, False), (("b", "none"), True)]


def test_all_over_budget_leaves_every_node_exact():
    nodes = [_forms("a", ("tanh", 5.0)), _forms("b", ("tanh", 1.0))]
    oracle = _Oracle({("a", "tanh"): 2e-3, ("b", "tanh"): 2e-3})
    choice = choose_forms(nodes, oracle, budget=1e-3)
    assert choice.forms == {} and choice.error is None
    assert oracle.calls == [{"a": "tanh", "b": "tanh"}, {"a": "tanh"}]  # the empty set is exact: not run
    assert [c.step for c in choice.checks] == [None, ("b", "none")]


def test_nothing_that_pays_means_no_check():
    oracle = _Oracle({})
    choice = choose_forms([_forms("a"), _forms("b")], oracle, budget=1e-3)
    assert choice.forms == {} and choice.checks == [] and oracle.calls == []


def test_a_node_steps_back_through_its_more_accurate_form():
    """sigmoid → tanh before tanh → exact on equal time given up; the earlier node first among equals."""
    nodes = [_forms("a", ("tanh", 2.0), ("sigmoid", 4.0)), _forms("b", ("tanh", 2.0), ("sigmoid", 4.0))]
    oracle = _Oracle({("a", "sigmoid"): 3e-3, ("b", "sigmoid"): 3e-3, ("a", "tanh"): 1e-4, ("b", "tanh"): 1e-4})
    choice = choose_forms(nodes, oracle, budget=1e-3)
    assert oracle.calls == [{"a": "sigmoid", "b": "sigmoid"}, {"a": "tanh", "b": "sigmoid"},
                            {"a": "tanh", "b": "tanh"}]
    assert choice.forms == {"a": "tanh", "b": "tanh"}
    assert [c.step for c in choice.checks] == [None, ("a", "tanh"), ("b", "tanh")]


@pytest.mark.parametrize("budget", [0.0, -1e-3, math.inf, math.nan])
def test_choose_forms_refuses_a_budget_that_is_not_positive_and_finite(budget):
    with pytest.raises(ValueError, match="budget must be a finite number > 0"):
        choose_forms([], _Oracle({}), budget)


# --- the error it is held to -----------------------------------------------------------------------------
def _model_with_outputs():
    """y = x (float32) and k = ArgMax(x) (int64): what output_errors reads from a reference model."""
    x = helper.make_tensor_value_info("x", F32, [2, 8])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"]),
                               helper.make_node("ArgMax", ["x"], ["k"], axis=1)], "g", [x],
                              [helper.make_tensor_value_info("y", F32, [2, 8]),
                               helper.make_tensor_value_info("k", onnx.TensorProto.INT64, [2, 1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_model_error_is_the_largest_output_rel_l2(rng):
    model = _model_with_outputs()
    refs = [{"y": rng.standard_normal((2, 8)).astype(np.float32), "k": np.zeros((2, 1), np.int64)} for _ in range(2)]
    noise = [{"y": r["y"] * np.float32(1.001), "k": r["k"]} for r in refs]
    stats = output_errors(model, refs, noise)
    ys = np.concatenate([r["y"].ravel() for r in refs]).astype(np.float64)
    zs = np.concatenate([n["y"].ravel() for n in noise]).astype(np.float64)
    assert stats[0].rel_l2 == pytest.approx(np.linalg.norm(zs - ys) / np.linalg.norm(ys), rel=1e-6)
    error = model_error(stats)
    assert error.error == pytest.approx(stats[0].rel_l2) and error.outputs["k"] == 0.0 and not error.problems


def test_a_changed_integer_output_or_a_new_nan_is_over_any_budget(rng):
    model = _model_with_outputs()
    ref = {"y": rng.standard_normal((2, 8)).astype(np.float32), "k": np.zeros((2, 1), np.int64)}
    flipped = model_error(output_errors(model, [ref], [{"y": ref["y"], "k": ref["k"] + 1}]))
    assert flipped.error == math.inf and flipped.outputs["y"] == 0.0 and "'k' (int64) changed" in flipped.problems[0]
    nan = ref["y"].copy()
    nan[0, 0] = np.nan
    assert model_error(output_errors(model, [ref], [{"y": nan, "k": ref["k"]}])).error == math.inf
    assert json.loads(json.dumps(flipped.to_dict()))["error"] == "inf"


def test_reference_run_measures_a_switched_model_against_the_exact_one(tiny_bert):
    """The sessions, inputs and statistics tune checks candidates with, on the CPU kernel."""
    exact = onnx.load(str(tiny_bert))
    run = ReferenceRun(exact, shapes={"input_ids": (2, 16), "attention_mask": (2, 16)}, samples=2, provider="cpu")
    assert run.error_of(exact).error == 0.0
    names = [n.name for n in exact.graph.node if n.op_type == OP_TYPE]
    one = run.error_of(with_forms(exact, {names[0]: "tanh"}))
    both = run.error_of(with_forms(exact, {n: "tanh" for n in names}))
    sigmoid = run.error_of(with_forms(exact, {n: "sigmoid" for n in names}))
    assert 0.0 < one.error < 1e-2 and 0.0 < both.error < 1e-2 and set(one.outputs) == {"last_hidden_state", "pooler_output"}
    assert sigmoid.error > 10 * both.error  # the coarser form shows as such


def test_reference_run_finds_external_data_from_any_folder(tmp_path, monkeypatch):
    """Candidates go to ORT as bytes: their external weights are found in the model's folder, not the cwd."""
    from onnxfuse import model_io

    out = tmp_path / "model" / "bert.onnx"
    out.parent.mkdir()
    optimize_file(os.path.join(ROOT, "tests/models/bert_torchscript_op17.onnx"), out)
    model = model_io.load_model(out)
    assert model_io.external_tensors(model)
    monkeypatch.chdir(tmp_path)
    run = ReferenceRun(model, shapes={}, samples=1, provider="cpu", base_dir=str(out.parent))
    names = [n.name for n in model.graph.node if n.op_type == OP_TYPE]
    assert 0.0 < run.error_of(with_forms(model, {n: "tanh" for n in names})).error < 1e-2


# --- the model: forms written, and undone ----------------------------------------------------------------
def _attrs(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def test_with_forms_rewrites_the_attribute_in_place_and_restore_undoes_it(tiny_bert):
    exact = onnx.load(str(tiny_bert))
    names = [n.name for n in exact.graph.node if n.op_type == OP_TYPE]
    switched = with_forms(exact, {names[0]: "sigmoid", names[1]: "tanh"})
    fused = [n for n in switched.graph.node if n.op_type == OP_TYPE]
    assert _attrs(fused[0])["approximate"] == b"sigmoid" and _attrs(fused[0])["alpha"] == pytest.approx(1.702)
    assert _attrs(fused[1])["approximate"] == b"tanh" and "alpha" not in _attrs(fused[1])
    assert [a.name for a in fused[1].attribute] == [a.name for a in exact.graph.node[
        [n.name for n in exact.graph.node].index(names[1])].attribute]  # in place: the order kept
    # no record: nothing to undo
    assert restore_forms(switched) == (switched, [], [])
    record = {"approximation": {"nodes": {names[0]: {"model": "none", "chosen": "sigmoid"},
                                          names[1]: {"model": "none", "chosen": "sigmoid"}}}}
    switched.metadata_props.add(key=tuning.METADATA_KEY, value=json.dumps(record))
    back, restored, warnings = restore_forms(switched)
    assert restored == [names[0]]
    assert warnings == [f"node {names[1]}: the tuning record says tune switched it to sigmoid, but it computes tanh: "
                        "left as it is"]
    first = next(n for n in back.graph.node if n.name == names[0])
    original = next(n for n in exact.graph.node if n.name == names[0])
    assert first == original


# --- the command --------------------------------------------------------------------------------------------
def _measure(factors: dict[str, float]):
    """Times scaled per form: 1.0 for exact, ``factors[form]`` for the others."""

    def measure(shape: NodeShape, m: int) -> PathTimes:
        fused = (5.0 + m * shape.k * shape.n * 1e-4) * factors.get(shape.approximate, 1.0)
        return PathTimes(fused, fused * (0.8 if m <= 8 else 1.25), fused * 1.5)

    return measure


def _checkers(per_node: dict[str, float], seen: list):
    """The injected error: the sum of a per-form error over the candidate's nodes that are not exact (read
    from the candidate model itself), with the reference model and each candidate recorded."""

    def checkers(reference, shapes, samples, base_dir):
        seen.append(("reference", reference, shapes, samples))

        def error_of(candidate):
            forms = [helper.get_attribute_value(a).decode() for n in candidate.graph.node if n.op_type == OP_TYPE
                     for a in n.attribute if a.name == "approximate"]
            seen.append(("candidate", forms))
            total = sum(per_node[f] for f in forms if f != "none")
            return ModelError(total, {"last_hidden_state": total})

        return error_of

    return checkers


def _tune(args, monkeypatch, factors, per_node, seen=None):
    import onnxfuse.measure.path_bench as path_bench
    import onnxfuse.tune as tune

    monkeypatch.setattr(path_bench, "gpu_measurer", lambda reps: (DEVICE, _measure(factors)))
    monkeypatch.setattr(tune, "_gpu_error_checker", _checkers(per_node, [] if seen is None else seen))
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


AUTO = ["--batch", "1,8", "--shape", "input_ids=1,8", "--approximate", "auto"]


def _fused(path):
    return [n for n in onnx.load(str(path)).graph.node if n.op_type == OP_TYPE]


def test_auto_switches_the_nodes_that_pay_within_the_budget(tmp_path, tiny_bert, monkeypatch):
    out, seen = tmp_path / "tuned.onnx", []
    r = _tune(["tune", tiny_bert, "-o", out, *AUTO, "--error-budget", "1e-3", "--json", "-"], monkeypatch,
              {"tanh": 0.9}, {"tanh": 4e-4}, seen)
    assert r.exit_code == 0, r.output
    report = json.loads(r.output)
    assert report["measurements"] == 4  # (exact, tanh) × M in (8, 64): identical nodes share
    (_, reference, shapes, samples), *candidates = seen
    assert [helper.get_attribute_value(a) for n in reference.graph.node if n.op_type == OP_TYPE
            for a in n.attribute if a.name == "approximate"] == [b"none", b"none"]  # held to the exact model
    assert shapes == {"input_ids": (8, 8), "attention_mask": (8, 8)} and samples == 4  # the largest batch
    assert candidates == [("candidate", ["tanh", "tanh"])]
    section = report["approximation"]
    assert section["budget"] == 1e-3 and section["forms"] == ["tanh"] and section["min_gain"] == 0.02
    assert section["error"]["error"] == pytest.approx(8e-4) and "rel-L2" in section["metric"]
    for name, entry in section["nodes"].items():
        assert (entry["model"], entry["chosen"], entry["M"]) == ("none", "tanh", 64)
        assert entry["options"][0]["gain"] == pytest.approx(0.1)
        assert entry["best_us"]["tanh"]["64"] == pytest.approx(0.9 * entry["best_us"]["none"]["64"], rel=1e-3)
        assert report["nodes"][name]["approximate"] == "tanh"  # the table is the tanh form's
    for node in _fused(out):
        attrs = _attrs(node)
        assert attrs["approximate"] == b"tanh" and attrs["tuned_device"] == SIGNATURE.encode()
        assert attrs["tuned_paths"] == [b"fallback", b"fused"] and attrs["tuned_max_rows"] == [8, 64]
    meta = json.loads({p.key: p.value for p in onnx.load(str(out)).metadata_props}[tuning.METADATA_KEY])
    assert meta["approximation"] == section and meta["nodes"] == report["nodes"]
    onnx.checker.check_model(str(out), full_check=True)


def test_auto_over_budget_backs_off(tmp_path, tiny_bert, monkeypatch):
    out, seen = tmp_path / "tuned.onnx", []
    r = _tune(["tune", tiny_bert, "-o", out, *AUTO, "--error-budget", "1e-3", "--no-progress"], monkeypatch,
              {"tanh": 0.9}, {"tanh": 6e-4}, seen)
    assert r.exit_code == 0, r.output
    assert [s for s in seen if s[0] == "candidate"] == [("candidate", ["tanh", "tanh"]), ("candidate", ["none", "tanh"])]
    assert [_attrs(n)["approximate"] for n in _fused(out)] == [b"none", b"tanh"]  # the earlier node went back
    text = " ".join(r.output.split())
    assert "model error 0.0012 over the budget" in text and "model error 0.0006 within the budget" in text
    assert "backed off to stay within the budget" in text and "1 node(s) switched; model error 0.0006 ≤ budget 0.001" in text


def test_auto_where_no_form_is_faster_keeps_exact_and_checks_nothing(tmp_path, tiny_bert, monkeypatch):
    out, seen = tmp_path / "tuned.onnx", []
    r = _tune(["tune", tiny_bert, "-o", out, *AUTO, "--error-budget", "1e-3", "--json", "-"], monkeypatch,
              {"tanh": 0.99}, {"tanh": 1e-5}, seen)
    assert r.exit_code == 0, r.output
    section = json.loads(r.output)["approximation"]
    assert section["error"] is None and section["checks"] == []
    assert all(e["chosen"] == "none" and "under the 2% a change must clear" in e["rejected"]["tanh"]
               for e in section["nodes"].values())
    assert [s[0] for s in seen] == ["reference"] and [_attrs(n)["approximate"] for n in _fused(out)] == [b"none"] * 2


def test_sigmoid_is_tried_only_when_named(tmp_path, tiny_bert, monkeypatch):
    out = tmp_path / "tuned.onnx"
    factors, errors = {"tanh": 0.95, "sigmoid": 0.85}, {"tanh": 1e-4, "sigmoid": 1e-4}
    r = _tune(["tune", tiny_bert, "-o", out, *AUTO, "--error-budget", "1e-3", "--json", "-"], monkeypatch, factors,
              errors)
    assert {e["chosen"] for e in json.loads(r.output)["approximation"]["nodes"].values()} == {"tanh"}
    r = _tune(["tune", tiny_bert, "-o", out, *AUTO, "--error-budget", "1e-3", "--approximate-forms", "sigmoid,tanh",
               "--json", "-"], monkeypatch, factors, errors)
    report = json.loads(r.output)
    assert report["measurements"] == 6 and report["approximation"]["forms"] == ["tanh", "sigmoid"]
    assert {e["chosen"] for e in report["approximation"]["nodes"].values()} == {"sigmoid"}
    assert all(_attrs(n)["alpha"] == pytest.approx(1.702) for n in _fused(out))


def test_tuning_a_tuned_model_is_idempotent_and_plain_tune_brings_exact_back(tmp_path, tiny_bert, monkeypatch):
    once, twice, plain = tmp_path / "once.onnx", tmp_path / "twice.onnx", tmp_path / "plain.onnx"
    args = [*AUTO, "--error-budget", "1e-3", "--no-progress"]
    assert _tune(["tune", tiny_bert, "-o", once, *args], monkeypatch, {"tanh": 0.9}, {"tanh": 6e-4}).exit_code == 0
    seen = []
    r = _tune(["tune", once, "-o", twice, *args], monkeypatch, {"tanh": 0.9}, {"tanh": 6e-4}, seen)
    assert r.exit_code == 0, r.output
    assert once.read_bytes() == twice.read_bytes()
    reference = seen[0][1]  # held to the exact model again, not to the tuned one
    assert {helper.get_attribute_value(a) for n in reference.graph.node for a in n.attribute
            if a.name == "approximate"} == {b"none"}
    r = _tune(["tune", once, "-o", plain, "--batch", "1,8", "--shape", "input_ids=1,8", "--json", "-"],
              monkeypatch, {"tanh": 0.9}, {})
    report = json.loads(r.output)
    assert report["approximation"] is None and len(report["restored"]) == 1
    assert [_attrs(n)["approximate"] for n in _fused(plain)] == [b"none", b"none"]
    assert "approximation" not in json.loads(onnx.load(str(plain)).metadata_props[-1].value)
    untuned = _tune(["tune", tiny_bert, "-o", tmp_path / "direct.onnx", "--batch", "1,8", "--shape", "input_ids=1,8"],
                    monkeypatch, {}, {})
    assert untuned.exit_code == 0 and (tmp_path / "direct.onnx").read_bytes() == plain.read_bytes()


def test_inspect_shows_each_nodes_form_and_the_error(tmp_path, tiny_bert, monkeypatch):
    out = tmp_path / "tuned.onnx"
    assert _tune(["tune", tiny_bert, "-o", out, *AUTO, "--error-budget", "1e-3"], monkeypatch, {"tanh": 0.9},
                 {"tanh": 6e-4}).exit_code == 0
    r = CliRunner().invoke(main, ["inspect", str(out), "--json"], catch_exceptions=False)
    shown = json.loads(r.output[r.output.index("{"):])["tuning"]
    assert [(n["approximation"]["model"], n["approximation"]["chosen"]) for n in shown["nodes"]] == [
        ("none", "none"), ("none", "tanh")]
    assert shown["approximation"]["budget"] == 1e-3 and shown["approximation"]["error"]["error"] == pytest.approx(6e-4)
    table = " ".join(CliRunner().invoke(main, ["inspect", str(out)], catch_exceptions=False).output.split())
    assert "none → tanh (M=64" in table and "none → none" in table and "measured error 0.0006" in table


@pytest.mark.parametrize("args, message", [
    (["--error-budget", "1e-3"], "--error-budget: meaningful only with --approximate auto"),
    (["--approximate-forms", "tanh"], "--approximate-forms: meaningful only with --approximate auto"),
    (["--samples", "8"], "--samples: meaningful only with --approximate auto"),
    (["--approximate", "auto"], "--approximate auto needs --error-budget REL, the largest error the model's outputs "
                                "may take (rel-L2 against the exact model, e.g. 1e-3)"),
    (["--approximate", "auto", "--error-budget", "0"], "--error-budget must be a finite number > 0, got 0.0"),
    (["--approximate", "auto", "--error-budget", "-1"], "--error-budget must be a finite number > 0, got -1.0"),
    (["--approximate", "auto", "--error-budget", "nan"], "--error-budget must be a finite number > 0, got nan"),
    (["--approximate", "auto", "--error-budget", "1e-3", "--approximate-forms", "tanh,erf"],
     "--approximate-forms 'tanh,erf': expected tanh and/or sigmoid separated by commas (not erf)"),
    (["--approximate", "auto", "--error-budget", "1e-3", "--samples", "0"], "--samples must be at least 1, got 0"),
    (["--approximate", "tanh"], "--approximate 'tanh': expected none or auto (to make every node compute it, "
                                "`onnxfuse optimize --approximate`)"),
])
def test_bad_approximation_options_are_exit_2_before_anything_is_read(tmp_path, args, message):
    out = tmp_path / "tuned.onnx"
    r = cli("tune", tmp_path / "missing.onnx", "-o", out, *args)  # the options are judged before the model
    assert r.returncode == 2 and r.stderr.strip() == f"onnxfuse: error: {message}", r.stderr
    assert os.listdir(tmp_path) == []


def _optimize_auto(tmp_path, monkeypatch, *extra, factors=None, per_node=None, seen=None):
    out = tmp_path / "out" / "tiny_bert.auto.onnx"
    out.parent.mkdir()
    r = _tune(["optimize", os.path.join(ROOT, "sample_models/tiny_bert.onnx"), "-o", out, *AUTO, "--error-budget",
               "1e-3", *extra], monkeypatch, factors or {"tanh": 0.9}, per_node or {"tanh": 4e-4}, seen)
    return r, out


def test_optimize_approximate_auto_rewrites_then_tunes_in_one_run(tmp_path, monkeypatch):
    """optimize --approximate auto is the rewrite and then tune's --approximate auto: OUT carries the forms that
    paid within the budget and the path tables, the report both steps, and no staging folder is left."""
    seen = []
    r, out = _optimize_auto(tmp_path, monkeypatch, "--json", "-", seen=seen)
    assert r.exit_code == 0, r.output
    report = json.loads(r.output[r.output.index("{"):])
    assert report["fused_by_op"]["ai.onnxfuse.FusedLinearGelu"] == 2 and report["output"] == str(out)
    tuned = report["tune"]
    assert tuned["model"] == os.path.join(ROOT, "sample_models/tiny_bert.onnx") and tuned["output"] == str(out)
    assert {e["chosen"] for e in tuned["approximation"]["nodes"].values()} == {"tanh"}
    assert tuned["approximation"]["error"]["error"] == pytest.approx(8e-4)
    (_, reference, shapes, samples), *_ = seen
    assert {helper.get_attribute_value(a) for n in reference.graph.node if n.op_type == OP_TYPE
            for a in n.attribute if a.name == "approximate"} == {b"none"}  # held to the exact rewrite
    assert shapes == {"input_ids": (8, 8), "attention_mask": (8, 8)} and samples == 4
    for node in _fused(out):
        attrs = _attrs(node)
        assert attrs["approximate"] == b"tanh" and attrs["tuned_device"] == SIGNATURE.encode()
    assert os.listdir(out.parent) == [out.name]
    onnx.checker.check_model(str(out), full_check=True)


def test_optimize_approximate_auto_gate_judges_the_tuned_model(tmp_path, monkeypatch):
    """--verify with --approximate auto runs compare's gate on what is published, the tuned model, against the
    original: within loose tolerances it passes (exit 0, the verdict in the report); with none allowed the tanh
    forms fail it (exit 3) and nothing is written."""
    r, out = _optimize_auto(tmp_path, monkeypatch, "--verify", "--rtol", "0.05", "--atol", "0.05", "--json", "-")
    assert r.exit_code == 0, r.output
    report = json.loads(r.output[r.output.index("{"):])
    assert report["verify"]["passed"] and report["tune"]["approximation"]["error"] is not None
    assert [_attrs(n)["approximate"] for n in _fused(out)] == [b"tanh", b"tanh"]
    strict = tmp_path / "strict"
    strict.mkdir()
    r, out = _optimize_auto(strict, monkeypatch, "--verify", "--rtol", "0", "--atol", "0")
    assert r.exit_code == 3, r.output
    assert os.listdir(out.parent) == []


def test_optimize_approximate_auto_on_a_model_without_gelu_blocks_writes_the_exact_rewrite(tmp_path, monkeypatch):
    src, out = tmp_path / "relu.onnx", tmp_path / "relu.auto.onnx"
    w = onnx.numpy_helper.from_array(np.ones((8, 4), np.float32), "W")
    graph = helper.make_graph([helper.make_node("MatMul", ["X", "W"], ["H"]), helper.make_node("Relu", ["H"], ["Y"])],
                              "relu", [helper.make_tensor_value_info("X", F32, ["M", 8])],
                              [helper.make_tensor_value_info("Y", F32, ["M", 4])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(src))
    r = _tune(["optimize", src, "-o", out, "--approximate", "auto", "--error-budget", "1e-3"], monkeypatch, {}, {})
    assert r.exit_code == 0, r.output
    assert "no FusedLinearGelu node in the rewrite, so no GELU form to choose" in " ".join(r.output.split())
    assert out.exists() and not _fused(out)


@pytest.mark.skipif(cuda_usable(), reason="checks the message where no CUDA GPU is usable")
def test_optimize_approximate_auto_without_a_gpu_is_exit_2_and_writes_nothing(tmp_path):
    r = cli("optimize", os.path.join(ROOT, "sample_models/tiny_bert.onnx"), "-o", tmp_path / "o.onnx",
            "--approximate", "auto", "--error-budget", "1e-3")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("onnxfuse: error: --approximate auto: tune needs CUDAExecutionProvider"), r.stderr
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("args, message", [
    (["--error-budget", "1e-3"], "--error-budget: meaningful only with --approximate auto"),
    (["--approximate", "tanh", "--batch", "1,8"], "--batch: meaningful only with --approximate auto"),
    (["--approximate-forms", "tanh"], "--approximate-forms: meaningful only with --approximate auto"),
    (["--approximate", "auto"], "--approximate auto needs --error-budget REL, the largest error the model's outputs "
                                "may take (rel-L2 against the exact model, e.g. 1e-3)"),
    (["--approximate", "auto", "--error-budget", "1e-3", "--target", "cpu"],
     "--approximate auto times the CUDA kernel's forms: it needs --target cuda, not cpu"),
    (["--samples", "2"], "--samples: meaningful only with --verify (or --approximate auto, for --shape and --samples)"),
])
def test_optimize_bad_approximation_options_are_exit_2_before_anything_is_read(tmp_path, args, message):
    r = cli("optimize", tmp_path / "missing.onnx", "-o", tmp_path / "o.onnx", *args)
    assert r.returncode == 2 and r.stderr.strip() == f"onnxfuse: error: {message}", r.stderr
    assert os.listdir(tmp_path) == []


# --- on a GPU -------------------------------------------------------------------------------------------
@pytest.mark.skipif(not cuda_usable(), reason="no usable CUDA device here (tune times the forms and measures the "
                                              "model's error on the GPU)")
def test_auto_on_the_gpu(tmp_path, tiny_bert):
    out = tmp_path / "tuned.onnx"
    budget = 1e-2
    r = cli("tune", tiny_bert, "-o", out, "--batch", "1,8", "--reps", "10", "--approximate", "auto", "--error-budget",
            str(budget), "--json", "-")
    if r.returncode == 2 and "too old" in r.stderr:
        pytest.skip(f"the op library predates the tuning contract: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    section = json.loads(r.stdout)["approximation"]
    chosen = {name: e["chosen"] for name, e in section["nodes"].items()}
    assert set(chosen.values()) <= {"none", "tanh"}
    for name, entry in section["nodes"].items():
        if entry["chosen"] == "tanh":  # switched only where it paid by the margin
            m = str(entry["M"])
            assert entry["best_us"]["tanh"][m] <= (1 - approximation.MIN_GAIN) * entry["best_us"]["none"][m]
    if any(v == "tanh" for v in chosen.values()):
        assert 0 <= section["error"]["error"] <= budget
    else:
        assert section["error"] is None
    written = {n.name: _attrs(n)["approximate"].decode() for n in _fused(out)}
    assert written == chosen
    # the measured error is what compare's statistics give for the written model on the GPU
    from onnxfuse.inputs import random_inputs

    exact, tuned = onnx.load(str(tiny_bert)), onnx.load(str(out))
    shapes = {k: tuple(v) for k, v in section["input_shapes"].items()}
    feeds = [random_inputs(exact, shapes, seed=i) for i in range(section["samples"])]
    names = [o.name for o in exact.graph.output]
    a = [dict(zip(names, create_session(exact, "cuda").run(names, f))) for f in feeds]
    b = [dict(zip(names, create_session(tuned, "cuda").run(names, f))) for f in feeds]
    assert model_error(output_errors(exact, a, b, "cuda")).error <= budget


@pytest.mark.skipif(not cuda_usable(), reason="no usable CUDA device here (optimize --approximate auto tunes on the "
                                              "GPU)")
def test_optimize_approximate_auto_on_the_gpu(tmp_path):
    """The one-step form on the GPU, from the exported model: every GELU block fused, each node at the form the
    tune step chose within the budget, the path tables written, and --verify's gate passed on that model."""
    out = tmp_path / "tiny_bert.auto.onnx"
    budget = 1e-2
    r = cli("optimize", os.path.join(ROOT, "sample_models/tiny_bert.onnx"), "-o", out, "--approximate", "auto",
            "--error-budget", str(budget), "--batch", "1,8", "--verify", "--provider", "cuda", "--rtol", "0.05",
            "--atol", "0.05", "--json", "-")
    if r.returncode == 2 and "too old" in r.stderr:
        pytest.skip(f"the op library predates the tuning contract: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["fused_by_op"]["ai.onnxfuse.FusedLinearGelu"] == 2 and report["verify"]["passed"]
    section = report["tune"]["approximation"]
    chosen = {name: e["chosen"] for name, e in section["nodes"].items()}
    assert {n.name: _attrs(n)["approximate"].decode() for n in _fused(out)} == chosen
    assert all("tuned_device" in _attrs(n) for n in _fused(out))
    if any(v == "tanh" for v in chosen.values()):
        assert 0 <= section["error"]["error"] <= budget
    assert os.listdir(tmp_path) == [out.name]
