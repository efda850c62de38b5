"""`onnxfuse optimize --verify`: the accuracy gate runs on the finished file before it takes OUT's place."""

from __future__ import annotations

import hashlib
import json
import re
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


# --- a failed gate on a model whose math was changed on purpose: what would have passed ---------------------
def _hinted_tolerance(stderr: str) -> tuple[str, str]:
    m = re.search(r"\(--approximate tanh changes the math on purpose: --rtol (\S+) --atol (\S+) would have passed\)$",
                  stderr.strip())
    assert m, stderr
    return m.group(1), m.group(2)


def test_approximate_verify_failure_says_which_tolerance_would_pass(tmp_path, library_path):
    out = tmp_path / "bert.onnx"
    r = _run("optimize", SAMPLE, "-o", out, *VERIFY, "--approximate", "tanh")  # tanh against erf: over 1e-4
    assert r.exit_code == 3 and not out.exists()
    (line,) = r.stderr.splitlines()
    rtol, atol = _hinted_tolerance(line)
    assert 1e-4 < float(rtol) < 1e-2 and 1e-4 < float(atol) < 1e-2
    # the hint is right: the same gate (same samples) passes at it
    r = _run("optimize", SAMPLE, "-o", out, *VERIFY, "--approximate", "tanh", "--rtol", rtol, "--atol", atol)
    assert r.exit_code == 0 and out.exists(), r.output
    # --keep-failed says it too
    r = _run("optimize", SAMPLE, "-o", tmp_path / "kept.onnx", *VERIFY, "--approximate", "tanh", "--keep-failed")
    assert r.exit_code == 3 and _hinted_tolerance(r.stderr) == (rtol, atol)


def test_an_exact_rewrite_that_fails_gets_no_tolerance_hint(tmp_path, library_path):
    """Outside --approximate a failed gate is a wrong rewrite (or a tolerance too tight on purpose): no hint to
    loosen the gate until it passes."""
    r = _run("optimize", SAMPLE, "-o", tmp_path / "bert.onnx", *VERIFY, "--rtol", 0, "--atol", 0)
    assert r.exit_code == 3 and "would have passed" not in r.stderr and "on purpose" not in r.stderr


def test_approximate_auto_verify_failure_names_a_smaller_error_budget(tmp_path, monkeypatch, library_path):
    """auto, with the tuning faked as tune's tests fake it (tanh pays, within the budget): the gate on the CPU
    fails at a tolerance tighter than tanh's error, and says both ways out."""
    from tests.test_tune_approximate import _tune

    out = tmp_path / "bert.onnx"
    r = _tune(["optimize", SAMPLE, "-o", out, "--approximate", "auto", "--error-budget", "1e-3", "--batch", "1,8",
               "--shape", "input_ids=1,8", "--verify", "--rtol", "1e-6", "--atol", "1e-6"], monkeypatch,
              {"tanh": 0.9}, {"tanh": 4e-4})
    assert r.exit_code == 3 and not out.exists()
    line = r.stderr.strip().splitlines()[-1]
    assert re.search(r"\(--approximate auto changes the math on purpose: --rtol \S+ --atol \S+ would have passed; "
                     r"or an --error-budget below \S+ \(the largest rel-L2 measured here; it was 0\.001\) makes tune "
                     r"switch fewer nodes\)$", line), line
