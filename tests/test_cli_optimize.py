"""`onnxfuse optimize` and `onnxfuse inspect` as users and CI steps run them: exit codes, one-line
errors, JSON reports, nothing written on failure."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import onnx
import pytest

from tests.graphs import build, build_mlp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cli(*args, cwd=None):
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("ONNXFUSE_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "onnxfuse.cli", *map(str, args)], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=120)


@pytest.fixture
def mixed(tmp_path):
    """Two fusable blocks and one near-miss."""
    model = build_mlp(layers=2)
    path = tmp_path / "in.onnx"
    onnx.save(model, str(path))
    near = tmp_path / "near.onnx"
    onnx.save(build("erf:pytorch:div", "matmul", perturb={"sqrt2": 1.414}), str(near))
    return path, near


def test_optimize_writes_model_and_json(tmp_path, mixed):
    src, _ = mixed
    before = hashlib.sha256(src.read_bytes()).hexdigest()
    r = cli("optimize", src, "-o", tmp_path / "out.onnx", "--json", tmp_path / "report.json")
    assert r.returncode == 0, r.stderr
    assert "erf-GELU+MatMul+Add" in r.stdout and "total fused" in r.stdout
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["fused"] == 2 and report["refused"] == 0 and report["exit_code"] == 0
    assert report["fused_by_form"] == {"erf-GELU+MatMul+Add": 2}
    assert hashlib.sha256(src.read_bytes()).hexdigest() == before
    onnx.checker.check_model(str(tmp_path / "out.onnx"), full_check=True)


def test_optimize_without_output_writes_beside_the_model(tmp_path, mixed):
    """`onnxfuse optimize model.onnx` (no -o): model.fused.onnx in the model's folder, wherever it is run from;
    external weights go external beside it; the input stays as it was."""
    src, _ = mixed
    before = hashlib.sha256(src.read_bytes()).hexdigest()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = cli("optimize", src, "--json", "-", cwd=elsewhere)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["output"] == str(tmp_path / "in.fused.onnx")
    assert os.listdir(elsewhere) == []
    assert hashlib.sha256(src.read_bytes()).hexdigest() == before
    onnx.checker.check_model(str(tmp_path / "in.fused.onnx"), full_check=True)
    # a relative name, a name without .onnx, and weights in external data
    model = onnx.load(str(src))
    onnx.save(model, str(tmp_path / "weights"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="weights.bin", size_threshold=0)
    r = cli("optimize", "weights", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "→ weights.fused.onnx" in r.stdout
    fused = onnx.load(str(tmp_path / "weights.fused.onnx"))
    assert sum(n.op_type == "FusedLinearGelu" for n in fused.graph.node) == 2
    assert os.path.isfile(tmp_path / "weights.fused.onnx.data")


def test_tune_without_output_writes_model_tuned_beside_the_input(tmp_path, mixed):
    """tune's default OUT is model.tuned.onnx beside MODEL (shown here, with no GPU needed, by a report path
    that would overwrite it: refused before any tuning, nothing written)."""
    src, _ = mixed
    before = sorted(os.listdir(tmp_path))
    r = cli("tune", src, "--json", tmp_path / "in.tuned.onnx", cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert f"is the output model {tmp_path / 'in.tuned.onnx'}" in r.stderr
    assert sorted(os.listdir(tmp_path)) == before


def test_optimize_json_to_stdout_and_approximate(tmp_path, mixed):
    src, _ = mixed
    r = cli("optimize", src, "-o", tmp_path / "out.onnx", "--json", "-", "--approximate", "tanh")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["approximate"] == "tanh"
    assert [c["now"] for c in report["math_changed"]] == ["tanh", "tanh"]


def test_inspect_lists_blocks_and_refusals(mixed):
    src, near = mixed
    r = cli("inspect", near, "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["fused"] == 0 and report["refused"] == 1
    (refusal,) = report["refusals"]
    assert refusal["rule"] == "erf-gelu" and "divisor 1.414 is not √2" in refusal["reason"]
    r = cli("inspect", src)
    assert r.returncode == 0 and "blocks to fuse" in r.stdout and "FusedLinearGelu" in r.stdout
    r = cli("inspect", near)
    assert "erf-gelu" in r.stdout and "refusals" in r.stdout


@pytest.mark.parametrize("case", ["not_a_model", "missing", "directory", "unwritable_output", "bad_option"])
def test_bad_input_exit_2_one_line_nothing_written(tmp_path, mixed, case):
    src, _ = mixed
    model_arg, out = src, tmp_path / "out.onnx"
    extra = []
    if case == "not_a_model":
        model_arg = tmp_path / "junk.onnx"
        model_arg.write_text("not a model at all\n")
    elif case == "missing":
        model_arg = tmp_path / "nope.onnx"
    elif case == "directory":
        model_arg = tmp_path
    elif case == "unwritable_output":
        out = tmp_path / "no" / "such" / "dir.onnx"
    elif case == "bad_option":
        extra = ["--approximate", "erf"]
    before = sorted(os.listdir(tmp_path))
    r = cli("optimize", model_arg, "-o", out, *extra)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("onnxfuse: error:")
    assert sorted(os.listdir(tmp_path)) == before


@pytest.mark.parametrize("args, says", [
    # (click's suggestion of the nearest option, -v/--verbose here, stays on the line)
    (["optimize", "{src}", "-o", "{out}", "--bogus"],
     "No such option '--bogus'. Did you mean '--verbose'? See 'onnxfuse optimize --help'."),
    (["optimize"], "Missing argument 'MODEL'."),
    (["--bogus"], "No such option '--bogus'. Did you mean '--verbose'? See 'onnxfuse --help'."),
    (["nosuch"], "No such command 'nosuch'."),
    (["compare", "{src}"], "Missing argument 'OPTIMIZED'."),
    (["compare", "{src}", "{src}", "--samples", "0"], "Invalid value for '--samples'"),
])
def test_usage_errors_are_one_line_exit_2(tmp_path, mixed, args, says):
    """click's own parse errors (its usage block is four lines and a blank) as every other bad input."""
    src, _ = mixed
    before = sorted(os.listdir(tmp_path))
    r = cli(*[a.format(src=src, out=tmp_path / "out.onnx") for a in args])
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stdout == "" and r.stderr.count("\n") == 1 and r.stderr.startswith("onnxfuse: error: ")
    assert says in r.stderr
    assert sorted(os.listdir(tmp_path)) == before


def test_bare_command_still_shows_the_help():
    r = cli()
    assert "Usage: onnxfuse" in r.stdout + r.stderr and "optimize" in r.stdout + r.stderr


def test_output_bytes_do_not_depend_on_hash_seed(tmp_path, mixed):
    src, _ = mixed
    digests = set()
    for seed in ("1", "2"):
        out = tmp_path / f"out{seed}.onnx"
        env = {**os.environ, "PYTHONHASHSEED": seed,
               "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
        subprocess.run([sys.executable, "-m", "onnxfuse.cli", "optimize", str(src), "-o", str(out)],
                       check=True, capture_output=True, env=env, timeout=120)
        digests.add(hashlib.sha256(out.read_bytes()).hexdigest())
    assert len(digests) == 1
