"""`onnxfuse optimize --verify`: the accuracy gate runs on the finished file before it takes OUT's place."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from onnxfuse.cli import main

SAMPLE = Path(__file__).resolve().parent.parent / "sample_models" / "tiny_bert.onnx"
VERIFY = ["--verify", "--shape", "input_ids=2,16", "--shape", "attention_mask=2,16"]


def _run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_verify_passes_and_writes(tmp_path, library_path):
    out, report = tmp_path / "bert.onnx", tmp_path / "report.json"
    r = _run("optimize", SAMPLE, "-o", out, *VERIFY, "--json", report)
    assert r.exit_code == 0, r.output
    assert out.exists()
    data = json.loads(report.read_text())
    assert data["fused_by_op"] == {"ai.onnxfuse.FusedLinearGelu": 2, "com.microsoft.Attention": 2,  # Q, K and V packed
                                   "com.microsoft.SkipLayerNormalization": 1}  # the embeddings
    assert data["verify"]["passed"] is True
    assert data["verify"]["samples"] == 2  # attention masks whole, then padded
    assert {o["name"] for o in data["verify"]["outputs"]} == {"last_hidden_state", "pooler_output"}
    # the gate ran on a temporary file beside OUT; the report names the file the user gets
    assert data["verify"]["original"] == str(SAMPLE) and data["verify"]["optimized"] == str(out)
    assert ".tmp" not in r.output


def test_failed_gate_publishes_nothing_and_keeps_the_old_output(tmp_path, library_path):
    out = tmp_path / "bert.onnx"
    out.write_bytes(b"the previous output")
    before = _sha(out)
    # a zero tolerance no real kernel meets: the gate must fail
    r = _run("optimize", SAMPLE, "-o", out, *VERIFY, "--rtol", 0, "--atol", 0)
    assert r.exit_code == 3, r.output
    assert "not written" in r.output
    assert _sha(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bert.onnx"]  # no temporary files left


def test_keep_failed_writes_and_still_exits_3(tmp_path, library_path):
    out = tmp_path / "bert.onnx"
    r = _run("optimize", SAMPLE, "-o", out, *VERIFY, "--rtol", 0, "--atol", 0, "--keep-failed")
    assert r.exit_code == 3, r.output
    assert out.exists() and out.stat().st_size > 0


@pytest.mark.parametrize("option", [["--keep-failed"], ["--rtol", "1e-3"], ["--shape", "input_ids=1,8"],
                                    ["--provider", "cuda"], ["--samples", "3"]])
def test_gate_options_need_verify(tmp_path, option):
    out = tmp_path / "bert.onnx"
    r = _run("optimize", SAMPLE, "-o", out, *option)
    assert r.exit_code == 2
    assert "only with --verify" in r.output
    assert not out.exists()
