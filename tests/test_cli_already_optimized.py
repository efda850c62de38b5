"""`optimize` on a model onnxfuse optimized already: said in one line, exit 0, no second file unless --force.
Known by the provenance stamp, or, for a model written before stamps, by onnxfuse's ops with nothing left to
fuse."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

from onnxfuse import provenance
from onnxfuse.cli import main
from onnxfuse.version import __version__
from tests.graphs import build

SAMPLE = Path(__file__).resolve().parent.parent / "sample_models" / "tiny_bert.onnx"


def _run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _sha(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture
def optimized(tmp_path) -> Path:
    out = tmp_path / "once.onnx"
    assert _run("optimize", SAMPLE, "-o", out).exit_code == 0
    return out


def _without_stamp(model_path: Path, to: Path) -> Path:
    """The optimized model as an onnxfuse before stamps wrote it."""
    model = onnx.load(str(model_path))
    kept = [p for p in model.metadata_props if p.key not in (provenance.VERSION_KEY, provenance.RULES_KEY)]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    onnx.save(model, str(to))
    return to


def test_a_stamped_model_is_said_optimized_and_not_written_again(tmp_path, optimized):
    again = tmp_path / "again.onnx"
    r = _run("optimize", optimized, "-o", again)
    assert r.exit_code == 0 and r.stderr == "", r.output
    assert r.stdout == (f"{optimized}: already optimized by onnxfuse {__version__}; {again} not written "
                        "(--force writes it)\n")
    assert not again.exists()
    # the default OUT, beside the model, is not written either: no model.fused.fused.onnx
    assert _run("optimize", optimized).exit_code == 0 and sorted(os.listdir(tmp_path)) == ["once.onnx"]
    report = json.loads(_run("optimize", optimized, "-o", again, "--json", "-").stdout)
    assert report["already_optimized"] == {"version": __version__,
                                           "rules": ["attention", "embeddings-into-skip-norm", "linear-gelu"]}
    assert report["output"] is None and report["exit_code"] == 0 and not again.exists()


def test_force_writes_it_again_identical(tmp_path, optimized):
    again = tmp_path / "again.onnx"
    r = _run("optimize", optimized, "-o", again, "--force")
    assert r.exit_code == 0, r.output
    assert "already optimized" in r.stdout and _sha(again) == _sha(optimized)  # idempotent: the same bytes


def test_a_model_from_before_stamps_is_known_by_its_ops(tmp_path, optimized):
    old = _without_stamp(optimized, tmp_path / "old.onnx")
    again = tmp_path / "again.onnx"
    r = _run("optimize", old, "-o", again)
    assert r.exit_code == 0, r.output
    assert r.stdout == (f"{old}: already optimized by onnxfuse (a version before provenance stamps); {again} not "
                        "written (--force writes it)\n")
    assert not again.exists()
    assert _run("optimize", old, "-o", again, "--force").exit_code == 0 and again.exists()


def test_a_stamp_with_more_to_fuse_says_what_force_would_write(tmp_path):
    """A model an older onnxfuse optimized, where this one's rules fuse more: not rewritten behind the user's
    back, but the line says how much --force would fuse."""
    model = onnx.load(str(SAMPLE))
    model.metadata_props.add(key=provenance.VERSION_KEY, value="0.0.1")
    stamped = tmp_path / "stamped.onnx"
    onnx.save(model, str(stamped))
    r = _run("optimize", stamped, "-o", tmp_path / "out.onnx", "-q")
    assert r.exit_code == 0 and r.stdout.endswith("already optimized by onnxfuse 0.0.1; "
                                                  f"{tmp_path / 'out.onnx'} not written (5 more block(s) would "
                                                  "fuse: --force writes them)\n")
    assert not (tmp_path / "out.onnx").exists()


def test_models_onnxfuse_did_not_optimize_are_written_as_before(tmp_path):
    """Nothing to fuse and no onnxfuse op: an ordinary model, written (byte-identical), not 'already optimized'."""
    src, out = tmp_path / "near.onnx", tmp_path / "out.onnx"
    onnx.save(build("erf:pytorch:div", "matmul", perturb={"sqrt2": 1.414}), str(src))
    r = _run("optimize", src, "-o", out, "--json", "-")
    assert r.exit_code == 0 and json.loads(r.stdout)["already_optimized"] is None
    assert _sha(out) == _sha(src)
