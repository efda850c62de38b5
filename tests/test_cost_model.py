"""`--target`: the cost model's review of every planned block, on hand-built graphs and the committed models.

cuda (the default) and cpu leave today's output exactly as it was; tensorrt leaves every block alone with a
reason per block; a bad --target is one line and exit 2 with nothing written."""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass

import onnx
import pytest

from onnxfuse import cost_model, provenance
from onnxfuse.fuse import fuse_model
from onnxfuse.pipeline import inspect_file, load_input, optimize_file
from onnxfuse.patterns import default_rules
from onnxfuse.patterns.rule import after_rewrites
from onnxfuse.patterns.graph import base_dir_of
from tests.graphs import build, build_mlp
from tests.test_cli_optimize import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMITTED = sorted(glob.glob(f"{ROOT}/tests/models/*.onnx") + glob.glob(f"{ROOT}/sample_models/*.onnx"))
# A few committed models of different kinds for the file-level checks (optimize is slow on 2 cores):
# FFN + attention, fp16 after ORT's optimizer, external data, GPT-2's Conv1D.
REPRESENTATIVE = [f"{ROOT}/{p}" for p in ("sample_models/tiny_bert.onnx", "tests/models/bert_torchscript_op14_ortfp16.onnx",
                                          "tests/models/bert_torchscript_op17.onnx", "sample_models/tiny_gpt2.onnx")]


@dataclass(frozen=True)
class _EveryPlanPays:
    """The driver without a cost model's say: what optimize wrote before targets existed."""

    name: str = "every-plan-pays"
    summary: str = ""

    def review(self, view, plan):
        return None


def _fused(path, target):
    model = load_input(path)
    return fuse_model(model, base_dir=base_dir_of(path), target=target)


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: os.path.relpath(p, ROOT))
def test_each_target_on_committed_models(path):
    plain = _fused(path, _EveryPlanPays())
    for name in ("cuda", "cpu"):  # today both fuse every block the rules prove
        result = _fused(path, name)
        assert result.model.SerializeToString() == plain.model.SerializeToString(), name
        assert result.report.to_dict() | {"target": None} == plain.report.to_dict() | {"target": None}
        assert result.report.target == name
    trt = _fused(path, "tensorrt")
    original = load_input(path)
    assert trt.report.fused == [] and trt.model.graph == original.graph  # every block as it was
    mine = [r for r in trt.report.refused if r.rule == cost_model.RULE]
    # one refusal per block the rules would fuse, naming exactly its nodes, with the op's own reason; the
    # second pass's rules match what the first pass wrote (the attention's row guard), which tensorrt
    # left unwritten, so they have nothing to refuse
    second_pass = {r.name for r in default_rules() if after_rewrites(r)}
    would_fuse = [b for b in plain.report.fused if b.rule not in second_pass]
    assert [r.nodes for r in mine] == [b.replaced for b in would_fuse]
    for r, b in zip(mine, would_fuse):
        assert r.reason.startswith("--target tensorrt: ") and b.form in r.reason
        assert f"has no {b.op} kernel" in r.reason
    # the rules' own refusals are the same as without a target
    assert [r for r in trt.report.refused if r.rule != cost_model.RULE] == plain.report.refused


@pytest.mark.parametrize("path", REPRESENTATIVE, ids=lambda p: os.path.relpath(p, ROOT))
def test_default_output_files_are_unchanged(tmp_path, path):
    """The file optimize writes by default is the one the driver writes with no cost model at all (with the
    provenance stamp optimize adds)."""
    (tmp_path / "default").mkdir()
    (tmp_path / "plain").mkdir()
    default, plain = tmp_path / "default" / "out.onnx", tmp_path / "plain" / "out.onnx"
    optimize_file(path, default)
    model = load_input(path)
    result = fuse_model(model, base_dir=base_dir_of(path), target=_EveryPlanPays())
    if result.report.fused:
        provenance.stamp(result.model, {b.rule for b in result.report.fused})
    result.save(plain, check=False)
    assert sorted(os.listdir(default.parent)) == sorted(os.listdir(plain.parent))
    for name in os.listdir(plain.parent):  # the model, and its external data file where it has one
        assert (default.parent / name).read_bytes() == (plain.parent / name).read_bytes(), name


def test_inspect_json_gives_each_target_and_its_reasons():
    sample = f"{ROOT}/sample_models/tiny_bert.onnx"
    reports = {}
    for target in ("cuda", "cpu", "tensorrt"):
        r = cli("inspect", sample, "--json", "--target", target)
        assert r.returncode == 0, r.stderr
        reports[target] = json.loads(r.stdout)
        assert reports[target]["target"] == target
    r = cli("inspect", sample, "--json")
    assert json.loads(r.stdout) == reports["cuda"] | {"seconds": json.loads(r.stdout)["seconds"]}
    assert reports["cuda"]["fused"] == reports["cpu"]["fused"] == 5 and reports["cuda"]["refused"] == 0
    trt = reports["tensorrt"]
    assert trt["fused"] == 0 and trt["refused"] == 5
    reasons = sorted(r["reason"] for r in trt["refusals"])
    assert all(r["rule"] == "cost-model" for r in trt["refusals"])
    assert sum("no com.microsoft.Attention kernel" in r for r in reasons) == 2  # Q, K and V packed
    assert sum("ai.onnxfuse.FusedLinearGelu" in r and "erf-GELU+MatMul+Add" in r for r in reasons) == 2
    assert sum("no com.microsoft.SkipLayerNormalization kernel" in r for r in reasons) == 1  # the embeddings


def test_optimize_tensorrt_writes_the_model_unfused_and_says_why(tmp_path):
    src = tmp_path / "in.onnx"
    onnx.save(build_mlp(layers=2), str(src))
    r = cli("optimize", src, "-o", tmp_path / "out.onnx", "--target", "tensorrt", "--json", "-")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["target"] == "tensorrt" and report["fused"] == 0 and report["refused"] == 2
    assert all("TensorRT fuses MatMul+bias+GELU" in x["reason"] for x in report["refusals"])
    out = onnx.load(str(tmp_path / "out.onnx"))
    assert out.graph.node == onnx.load(str(src)).graph.node
    assert out.opset_import == onnx.load(str(src)).opset_import  # no domain of ours imported


@pytest.mark.parametrize("command", ["optimize", "inspect"])
def test_bad_target_is_one_line_and_exit_2(tmp_path, command):
    src = tmp_path / "in.onnx"
    onnx.save(build_mlp(layers=1), str(src))
    out = tmp_path / "out.onnx"
    args = [command, src, "--target", "trt"] + (["-o", out] if command == "optimize" else [])
    r = cli(*args)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["onnxfuse: error: --target 'trt': choose one of cuda, cpu, tensorrt"]
    assert not out.exists() and sorted(os.listdir(tmp_path)) == ["in.onnx"]


def test_a_refused_plan_claims_no_node_and_stays_bit_identical():
    """A target's refusal leaves the block exactly as it was; the plans it lets through are fused."""

    @dataclass(frozen=True)
    class OnlyWide:
        name: str = "only-wide"
        summary: str = ""

        def review(self, view, plan):
            return None if plan.name_hint == "MatMul_18" else f"not this one: {plan.name_hint}"

    model = build_mlp(layers=2)
    result = fuse_model(model, target=OnlyWide())
    assert len(result.report.fused) == 1 and len(result.report.refused) == 1
    refusal = result.report.refused[0]
    assert refusal.rule == cost_model.RULE and refusal.reason.startswith("not this one")
    kept = {n.name for n in result.model.graph.node}
    assert set(refusal.nodes) <= kept  # the refused block's nodes are all still there
    originals = {n.name: n for n in model.graph.node}
    for n in result.model.graph.node:
        if n.name in refusal.nodes:
            assert n == originals[n.name]


def test_unknown_target_in_the_api_is_bad_input():
    from onnxfuse.errors import BadInputError

    with pytest.raises(BadInputError, match="choose one of cuda, cpu, tensorrt"):
        fuse_model(build("erf:pytorch:div", "matmul"), target="gpu")
    with pytest.raises(BadInputError):
        inspect_file("does-not-matter.onnx", target="gpu")


def test_cpu_rule_cites_the_committed_measurements():
    """The cpu target fuses everything because the committed CPU measurements say the fused kernel is never
    slower: its docstring cites those files, every ratio in them is below 1, and a new measurement that shows a
    loss fails here until the cost model says what to do about it."""
    doc = cost_model.Cpu.__doc__
    for relpath in (*cost_model.Cpu().measurements, cost_model.Cpu().small_row_measurements):
        table = os.path.splitext(relpath)[0] + ".md"
        assert os.path.basename(table) in doc and os.path.exists(os.path.join(ROOT, table)), relpath
        rows = json.load(open(os.path.join(ROOT, relpath)))["rows"]
        slower = [r for r in rows if r["ratio"] >= 1.0]
        assert rows and not slower, f"{relpath}: fused slower than ORT at {slower}"
    shapes = [{(r["M"], r["K"], r["N"]) for r in json.load(open(os.path.join(ROOT, relpath)))["rows"]}
              for relpath in cost_model.Cpu().measurements]
    assert shapes[0] == shapes[1]  # the same shapes on both CPUs
    small = json.load(open(os.path.join(ROOT, cost_model.Cpu().small_row_measurements)))["rows"]
    assert any(r["M"] == 1 for r in small) and any(r["K"] % 8 for r in small)
