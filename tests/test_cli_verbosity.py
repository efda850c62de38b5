"""-q/--quiet and -v/--verbose, on the group or on the command: quiet says only errors and the final one-line
result; verbose also every refusal and each step's time."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

from onnxfuse.cli import main
from tests import graphs

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_models" / "tiny_bert.onnx"
TOLERATED = ROOT / "tests" / "models" / "bert_freshinit_torchscript_op17_gsunshaped.onnx"  # one load warning
VERIFY = ["--verify", "--shape", "input_ids=2,16", "--shape", "attention_mask=2,16"]


def _run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture
def near_misses(tmp_path) -> Path:
    """Two GELU blocks refused for the same reason (a divisor of 1.414 is not √2)."""
    b = graphs.Builder(perturb={"sqrt2": 1.414})
    h = graphs.block(b, "x", "erf:pytorch:div", "matmul", k=16, n=24)
    y = graphs.block(b, h, "erf:pytorch:div", "matmul", k=24, n=16)
    path = tmp_path / "near.onnx"
    onnx.save(b.model([("x", ["batch", "seq", 16])], [(y, ["batch", "seq", 16])]), str(path))
    return path


@pytest.mark.parametrize("where", ["group", "command"])
def test_quiet_optimize_says_only_the_result(tmp_path, where):
    out = tmp_path / "out.onnx"
    args = ["optimize", TOLERATED, "-o", out]
    r = _run(*(["-q", *args] if where == "group" else [*args, "--quiet"]))
    assert r.exit_code == 0, r.output
    assert r.stderr == ""  # the load warning a normal run prints is not said
    (line,) = r.stdout.splitlines()
    assert re.fullmatch(rf"\d+ fused, \d+ refused in [\d.]+ s → {re.escape(str(out))}", line), line
    normal = _run(*args)
    assert normal.stderr.startswith("onnxfuse: warning: ") and len(normal.stdout.splitlines()) > 1


def test_quiet_verify_is_one_line_and_a_failure_only_the_error(tmp_path, library_path):
    r = _run("-q", "optimize", SAMPLE, "-o", tmp_path / "out.onnx", *VERIFY)
    assert r.exit_code == 0 and r.stderr == "" and len(r.stdout.splitlines()) == 1, r.output
    r = _run("-q", "optimize", SAMPLE, "-o", tmp_path / "out.onnx", *VERIFY, "--rtol", "0", "--atol", "0")
    assert r.exit_code == 3 and r.stdout == ""
    (line,) = r.stderr.splitlines()
    assert line.startswith("onnxfuse: error: ") and "not written" in line


def test_quiet_in_every_command(tmp_path, near_misses, library_path):
    fused = tmp_path / "fused.onnx"
    assert _run("optimize", SAMPLE, "-o", fused).exit_code == 0
    inspect = _run("inspect", near_misses, "-q")
    assert inspect.exit_code == 0 and re.fullmatch(r"0 fused, 2 refused in [\d.]+ s\n", inspect.stdout), inspect.output
    compare = _run("compare", SAMPLE, fused, "-q", "--shape", "input_ids=1,16", "--shape", "attention_mask=1,16")
    assert compare.exit_code == 0 and compare.stderr == "", compare.output
    assert re.fullmatch(r"PASS: all 2 outputs within tolerance over \d sample\(s\)\n", compare.stdout), compare.stdout
    doctor = _run("-q", "doctor")
    assert doctor.exit_code == 0 and doctor.stdout.startswith("ready: onnxfuse ") and doctor.stdout.count("\n") == 1
    bench = _run("bench", fused, "--provider", "cpu", "--budget", "0.02", "--shape", "input_ids=1,16",
                 "--shape", "attention_mask=1,16", "-q")
    assert bench.exit_code == 0 and bench.stderr == "", bench.output
    assert re.fullmatch(rf"{re.escape(str(fused))} on cpu: batch 1 [\d.]+ ms\n", bench.stdout), bench.stdout


def test_quiet_json_to_stdout_is_the_json_alone(tmp_path):
    r = _run("optimize", TOLERATED, "-o", tmp_path / "out.onnx", "--json", "-", "-q")
    assert r.exit_code == 0 and r.stderr == ""
    assert json.loads(r.stdout)["exit_code"] == 0


def test_refusals_one_row_per_reason_and_each_with_verbose(tmp_path, near_misses):
    normal = _run("optimize", near_misses, "-o", tmp_path / "out.onnx")
    assert normal.exit_code == 0, normal.output
    text = " ".join(normal.stdout.split())
    assert "one row per reason; -v lists each block" in text and "(and 1 more block(s) for this reason)" in text
    assert text.count("divisor 1.414 is not √2") == 1
    for where in ("group", "command"):
        args = ["optimize", near_misses, "-o", tmp_path / "out.onnx"]
        r = _run(*(["-v", *args] if where == "group" else [*args, "--verbose"]))
        assert r.exit_code == 0, r.output
        text = " ".join(r.stdout.split())
        assert text.count("divisor 1.414 is not √2") == 2 and "more block(s)" not in text
    # inspect lists each refusal whatever the verbosity: that is what it is for
    assert " ".join(_run("inspect", near_misses).stdout.split()).count("divisor 1.414 is not √2") == 2


def test_verbose_says_each_steps_time(tmp_path, library_path):
    r = _run("optimize", SAMPLE, "-o", tmp_path / "out.onnx", *VERIFY, "-v")
    assert r.exit_code == 0, r.output
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("onnxfuse: time: ")]
    assert re.fullmatch(r"onnxfuse: time: reading [\d.]+ s · onnxfuse's rules [\d.]+ s · writing [\d.]+ s · "
                        r"verifying [\d.]+ s \(total [\d.]+ s\)", line), line
    r = _run("-v", "compare", SAMPLE, tmp_path / "out.onnx", "--shape", "input_ids=1,16",
             "--shape", "attention_mask=1,16")
    assert r.exit_code == 0 and re.search(r"onnxfuse: time: the original [\d.]+ s, the optimized model", r.stderr)
    assert "onnxfuse: time:" not in _run("optimize", SAMPLE, "-o", tmp_path / "again.onnx").stderr


@pytest.mark.parametrize("args", [["-q", "optimize", "{src}", "-v"], ["optimize", "{src}", "-q", "--verbose"],
                                  ["-v", "-q", "doctor"]])
def test_quiet_and_verbose_together_is_a_usage_error(tmp_path, args):
    before = sorted(os.listdir(tmp_path))
    r = _run(*[a.format(src=SAMPLE) for a in args])
    assert r.exit_code == 2 and r.stdout == ""
    (line,) = r.stderr.splitlines()
    assert line.startswith("onnxfuse: error: -v/--verbose and -q/--quiet contradict each other")
    assert sorted(os.listdir(tmp_path)) == before
