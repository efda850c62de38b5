"""The provenance stamp: onnxfuse.version and onnxfuse.rules in metadata_props of a model something was fused
in, nothing in one where nothing fused; deterministic and idempotent."""

from __future__ import annotations

import hashlib
from pathlib import Path

import onnx

from onnxfuse import provenance
from onnxfuse.pipeline import optimize_file
from onnxfuse.version import __version__
from tests.graphs import build

SAMPLE = Path(__file__).resolve().parent.parent / "sample_models" / "tiny_bert.onnx"


def _props(path) -> list[tuple[str, str]]:
    return [(p.key, p.value) for p in onnx.load(str(path), load_external_data=False).metadata_props]


def _sha(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_a_fused_model_names_the_version_and_the_rules_that_fused(tmp_path):
    out = tmp_path / "out.onnx"
    report = optimize_file(SAMPLE, out)
    assert {b.rule for b in report.fused} == {"attention", "embeddings-into-skip-norm", "linear-gelu"}
    assert _props(out)[-2:] == [("onnxfuse.version", __version__),
                                ("onnxfuse.rules", "attention,embeddings-into-skip-norm,linear-gelu")]
    assert provenance.read(onnx.load(str(out))) == provenance.Provenance(
        __version__, ("attention", "embeddings-into-skip-norm", "linear-gelu"))


def test_a_model_nothing_fused_in_gets_no_stamp(tmp_path):
    src, out = tmp_path / "near.onnx", tmp_path / "out.onnx"
    onnx.save(build("erf:pytorch:div", "matmul", perturb={"sqrt2": 1.414}), str(src))
    report = optimize_file(src, out)
    assert not report.fused and _props(out) == [] and _sha(out) == _sha(src)


def test_optimizing_twice_writes_the_same_bytes_and_the_stamp_once(tmp_path):
    once, twice = tmp_path / "once.onnx", tmp_path / "twice.onnx"
    optimize_file(SAMPLE, once)
    report = optimize_file(once, twice)
    assert not report.fused and _sha(once) == _sha(twice)
    assert [k for k, _ in _props(twice)].count("onnxfuse.version") == 1


def test_the_models_own_metadata_stays_and_an_earlier_stamp_is_updated_in_place():
    model = onnx.ModelProto()
    model.metadata_props.add(key="author", value="someone")
    model.metadata_props.add(key="onnxfuse.version", value="0.0.1")
    model.metadata_props.add(key="onnxfuse.rules", value="attention")
    model.metadata_props.add(key="license", value="MIT")
    provenance.stamp(model, ["linear-gelu", "attention"])
    assert [(p.key, p.value) for p in model.metadata_props] == [
        ("author", "someone"), ("onnxfuse.version", __version__), ("onnxfuse.rules", "attention,linear-gelu"),
        ("license", "MIT")]
    assert provenance.read(onnx.ModelProto()) is None
