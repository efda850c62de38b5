"""One meaning per flag: --json FILE|- in every command (inspect's and doctor's bare switch a deprecated alias),
--error-budget for the relative error (--budget there a deprecated alias: bench's --budget is seconds), and one
--approximate vocabulary. A deprecated spelling still works, with one warning line on stderr."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from onnxfuse.cli import main

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_models" / "tiny_bert.onnx"
DEPRECATED = re.compile(r"onnxfuse: warning: (.+) is deprecated \((.+)\): use (.+); the old spelling goes in the "
                        r"next release")


def _run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _deprecation(stderr: str) -> tuple[str, str]:
    """(old, new) of the one deprecation warning ``stderr`` holds."""
    (line,) = [x for x in stderr.splitlines() if "is deprecated" in x]
    m = DEPRECATED.fullmatch(line)
    assert m, line
    return m.group(1), m.group(3)


# --- --json FILE|- -----------------------------------------------------------------------------------------
def test_inspect_json_takes_a_file_or_stdout(tmp_path):
    report = tmp_path / "report.json"
    r = _run("inspect", SAMPLE, "--json", report)
    assert r.exit_code == 0 and r.stderr == "", r.output
    assert json.loads(report.read_text())["fused"] == 5 and "blocks to fuse" in r.stdout  # the tables as well
    r = _run("inspect", SAMPLE, "--json", "-")
    assert r.exit_code == 0 and r.stderr == ""
    assert json.loads(r.stdout)["fused"] == 5


@pytest.mark.parametrize("args", [["inspect", SAMPLE, "--json"], ["inspect", "--json", SAMPLE],
                                  ["inspect", SAMPLE, "--json", "--target", "cpu"]],
                         ids=["at-the-end", "before-the-model", "before-an-option"])
def test_inspect_bare_json_is_the_deprecated_stdout_switch(args):
    r = _run(*args)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["fused"] == 5
    assert _deprecation(r.stderr) == ("a bare --json", "--json -") and len(r.stderr.splitlines()) == 1


def test_inspect_without_a_model_is_still_a_usage_error():
    r = _run("inspect", "--json", "-")
    (line,) = r.stderr.splitlines()
    assert r.exit_code == 2 and line.startswith("onnxfuse: error: Missing argument 'MODEL'. See '")


def test_doctor_json_takes_a_file_and_the_bare_switch_is_deprecated(tmp_path, library_path):
    report = tmp_path / "doctor.json"
    r = _run("doctor", "--json", report)
    assert r.exit_code == 0 and r.stderr == "", r.output
    assert json.loads(report.read_text())["library_ok"] is True and "op library" in r.stdout
    r = _run("doctor", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["library_ok"] is True
    assert _deprecation(r.stderr) == ("a bare --json", "--json -")
    assert _run("doctor", "--json", "-q").stderr == ""  # -q: only errors, deprecations included


def test_a_report_file_is_checked_before_any_work(tmp_path):
    r = _run("inspect", SAMPLE, "--json", tmp_path / "no" / "such" / "report.json")
    assert r.exit_code == 2 and r.stderr.startswith("onnxfuse: error: --json") and r.stdout == ""
    r = _run("inspect", SAMPLE, "--json", SAMPLE)  # the report would overwrite the model read
    assert r.exit_code == 2 and "--json" in r.stderr


# --- --error-budget ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["optimize", "tune"])
def test_error_budget_is_the_name_and_budget_its_deprecated_alias(tmp_path, command):
    help_text = " ".join(_run(command, "--help").stdout.split())
    assert "--error-budget REL" in help_text and "--budget REL" not in help_text
    missing = tmp_path / "missing.onnx"
    # the alias's value reaches the check of the option it stands for ...
    r = _run(command, missing, "-o", tmp_path / "o.onnx", "--approximate", "auto", "--budget", "0")
    assert r.exit_code == 2
    assert _deprecation(r.stderr) == ("--budget", "--error-budget REL")
    assert r.stderr.splitlines()[-1] == "onnxfuse: error: --error-budget must be a finite number > 0, got 0.0"
    # ... and a valid one lets the run go on to the next problem (here, no model)
    r = _run(command, missing, "-o", tmp_path / "o.onnx", "--approximate", "auto", "--budget", "1e-3")
    assert r.exit_code == 2 and r.stderr.splitlines()[-1].endswith("missing.onnx: no such file")
    r = _run(command, missing, "-o", tmp_path / "o.onnx", "--approximate", "auto", "--budget", "1e-3",
             "--error-budget", "1e-3")
    assert r.exit_code == 2 and r.stderr.strip() == ("onnxfuse: error: --budget is the deprecated spelling of "
                                                     "--error-budget: give --error-budget only")
    assert os.listdir(tmp_path) == []


def test_bench_budget_keeps_its_meaning_seconds():
    help_text = " ".join(_run("bench", "--help").stdout.split())
    assert "--budget FLOAT RANGE" in help_text and "Seconds of timed runs" in help_text


# --- --approximate -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["optimize", "tune", "bench"])
def test_approximate_help_gives_the_shared_vocabulary(command):
    help_text = " ".join(_run(command, "--help").stdout.split())
    assert "One vocabulary in every command: none, each fused node keeps its model's GELU form" in help_text


def test_optimize_approximate_none_is_the_default_spelled_out(tmp_path):
    plain, none = tmp_path / "plain.onnx", tmp_path / "none.onnx"
    assert _run("optimize", SAMPLE, "-o", plain).exit_code == 0
    r = _run("optimize", SAMPLE, "-o", none, "--approximate", "none", "--json", "-")
    assert r.exit_code == 0 and json.loads(r.stdout)["approximate"] is None
    assert hashlib.sha256(plain.read_bytes()).digest() == hashlib.sha256(none.read_bytes()).digest()


@pytest.mark.parametrize("command, value, says", [
    (["bench", "--op", "8,16,24"], "sigmoid", "--approximate sigmoid: the op-level benchmark takes none or tanh "
                                              "(ONNX's Gelu, which the unfused twin runs, has no sigmoid form)"),
    (["bench", "--op", "8,16,24"], "auto", "--approximate auto: the op-level benchmark takes none or tanh (auto "
                                           "chooses per node of a model"),
    (["bench", "--op", "8,16,24"], "erf", "--approximate 'erf': expected one of none, tanh, sigmoid, auto"),
    (["tune", "missing.onnx"], "sigmoid", "--approximate 'sigmoid': expected none or auto (to make every node "
                                          "compute it, `onnxfuse optimize --approximate`)"),
    (["optimize", "missing.onnx"], "erf", "Invalid value for '--approximate': 'erf' is not one of 'none', 'tanh', "
                                          "'sigmoid', 'auto'."),
])
def test_approximate_values_a_command_cannot_take_say_why(command, value, says):
    r = _run(*command, "--approximate", value)
    assert r.exit_code == 2 and r.stdout == ""
    (line,) = r.stderr.splitlines()
    assert line.startswith(f"onnxfuse: error: {says}"), line


# --- --shape NAME:DIMS -----------------------------------------------------------------------------------------
def test_shape_takes_name_colon_dims_beside_name_equals_dims(tmp_path, library_path):
    r = _run("optimize", SAMPLE, "-o", tmp_path / "out.onnx", "--verify", "--shape", "input_ids:2x16",
             "--shape", "attention_mask:[2,16]", "--json", "-")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["verify"]["input_shapes"] == {"input_ids": [2, 16], "attention_mask": [2, 16]}
    assert "--shape NAME:DIMS" in " ".join(_run("compare", "--help").stdout.split())
