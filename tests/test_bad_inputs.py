"""Bad input for every command that reads a model: exit 2, one line on stderr that names the file and the
problem, no traceback, nothing written, the input unchanged (sha256).

The CLI runs in-process (click's runner) for the full matrix; a few cases also run as a real subprocess
through the installed entry point, so the ``sys.exit`` path and the absence of a traceback are proven on the
process itself. Also here: the inputs the fuzzer found (``tests/fuzz_regressions/``) replayed through the
harness property.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from onnxfuse.cli import main
from tests.graphs import build

REPO = Path(__file__).resolve().parent.parent
REGRESSIONS = Path(__file__).resolve().parent / "fuzz_regressions"


# --- the inputs --------------------------------------------------------------------------------------
def _good_model() -> onnx.ModelProto:
    return build("erf:pytorch:div", "matmul", k=8, n=16)


def _external_model(folder: Path) -> Path:
    """A valid model whose weights live in ``model.onnx.data`` beside it."""
    model = build("onnx:none", "gemm:transB0", k=64, n=64)
    path = folder / "model.onnx"
    onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.onnx.data", size_threshold=0)
    return path


def _with_opset(version: int) -> onnx.ModelProto:
    model = _good_model()
    model.opset_import[0].version = version
    return model


def _unknown_domain() -> onnx.ModelProto:
    model = _good_model()
    model.graph.node[0].domain = "com.example.unknown"
    return model


def _write(folder: Path, name: str, data: bytes) -> Path:
    path = folder / name
    path.write_bytes(data)
    return path


def make_empty(d):
    return _write(d, "empty.onnx", b""), ("empty",)


def make_random(d):
    return _write(d, "random.onnx", np.random.default_rng(7).bytes(4096)), ("not an onnx model", "truncated",
                                                                           "cannot read", "parse", "decode")


def make_truncated(d):
    data = _good_model().SerializeToString()
    return _write(d, "truncated.onnx", data[: len(data) * 2 // 3]), ("truncated", "not an onnx model",
                                                                    "cannot read", "parse", "decode")


def make_directory(d):
    path = d / "folder.onnx"
    path.mkdir()
    (path / "model.onnx").write_bytes(_good_model().SerializeToString())
    return path, ("directory",)


def make_lfs_pointer(d):
    pointer = (b"version https://git-lfs.github.com/spec/v1\n"
               b"oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\nsize 548576019\n")
    return _write(d, "pointer.onnx", pointer), ("lfs",)


def make_missing_external(d):
    path = _external_model(d)
    (d / "model.onnx.data").unlink()
    return path, ("external", "model.onnx.data", "missing", "no such file")


def make_truncated_external(d):
    path = _external_model(d)
    data = d / "model.onnx.data"
    with open(data, "r+b") as f:
        f.truncate(data.stat().st_size // 2)
    return path, ("truncated", "model.onnx.data", "external")


def make_unknown_opset(d):
    return _write(d, "opset99.onnx", _with_opset(99).SerializeToString()), ("opset",)


def make_unknown_domain(d):
    return _write(d, "domain.onnx", _unknown_domain().SerializeToString()), ("domain", "opset")


def make_newer_ir(d):
    model = _good_model()
    model.ir_version = onnx.IR_VERSION + 5
    return _write(d, "ir.onnx", model.SerializeToString()), ("ir version", "ir_version")


def make_nonexistent(d):
    return d / "nowhere.onnx", ("no such file", "does not exist")


BAD_INPUTS = {
    "empty": make_empty,
    "random-bytes": make_random,
    "truncated": make_truncated,
    "directory": make_directory,
    "git-lfs-pointer": make_lfs_pointer,
    "missing-external-data": make_missing_external,
    "truncated-external-data": make_truncated_external,
    "unknown-opset": make_unknown_opset,
    "unknown-domain": make_unknown_domain,
    "newer-ir-version": make_newer_ir,
    "nonexistent": make_nonexistent,
}


# --- the checks ---------------------------------------------------------------------------------------
def tree_digest(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` → its sha256 (directories as entries, so new folders show too)."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs:
            out[os.path.relpath(os.path.join(root, name), folder) + "/"] = "dir"
        for name in files:
            p = os.path.join(root, name)
            out[os.path.relpath(p, folder)] = hashlib.sha256(Path(p).read_bytes()).hexdigest()
    return out


def run_cli(args: list[str]):
    result = CliRunner().invoke(main, args, catch_exceptions=True)
    return result.exit_code, result.stdout, result.stderr, result.exception


def assert_one_line_error(code, stdout, stderr, exc, *, names: str, keywords) -> None:
    assert code == 2, f"exit {code}, stderr: {stderr!r}, exception: {exc!r}"
    assert "Traceback" not in stderr + stdout
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got: {stderr!r}"
    line = lines[0]
    assert line.startswith("onnxfuse: error: ")
    assert names in line, f"the message does not name {names!r}: {line!r}"
    if keywords:
        assert any(k.lower() in line.lower() for k in keywords), f"the message does not say {keywords}: {line!r}"


def commands(bad: str, good: str, out: str) -> dict[str, list[str]]:
    return {
        "optimize": ["optimize", bad, "-o", out, "--json", out + ".json"],
        "inspect": ["inspect", bad],
        "inspect-json": ["inspect", bad, "--json", "-"],
        "inspect-json-file": ["inspect", bad, "--json", out + ".json"],
        "compare-original": ["compare", bad, good, "--provider", "cpu", "--no-progress", "--json", out + ".json"],
        "compare-optimized": ["compare", good, bad, "--provider", "cpu", "--no-progress", "--json", out + ".json"],
        "bench": ["bench", bad, "--provider", "cpu", "--no-progress", "--budget", "0.1", "--json", out + ".json"],
        "bench-baseline": ["bench", good, "--baseline", bad, "--provider", "cpu", "--no-progress", "--budget", "0.1",
                           "--json", out + ".json"],
    }


COMMANDS = list(commands("a", "b", "c"))


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, case, command):
    inputs = tmp_path / "in"
    inputs.mkdir()
    bad, keywords = BAD_INPUTS[case](inputs)
    good = tmp_path / "good" / "good.onnx"
    good.parent.mkdir()
    onnx.save_model(_good_model(), good)
    outdir = tmp_path / "out"
    outdir.mkdir()
    before_in, before_good = tree_digest(inputs), tree_digest(good.parent)

    code, stdout, stderr, exc = run_cli(commands(str(bad), str(good), str(outdir / "result.onnx"))[command])

    assert_one_line_error(code, stdout, stderr, exc, names=bad.name, keywords=keywords)
    assert tree_digest(inputs) == before_in, "the input was modified"
    assert tree_digest(good.parent) == before_good
    assert not any(outdir.iterdir()), f"something was written: {sorted(os.listdir(outdir))}"


# --- outputs that cannot be written ------------------------------------------------------------------
def _unwritable_outputs(tmp_path: Path) -> dict[str, Path]:
    a_file = tmp_path / "plain-file"
    a_file.write_bytes(b"x")
    a_dir = tmp_path / "a-dir"
    a_dir.mkdir()
    cases = {
        "missing-folder": tmp_path / "no" / "such" / "folder" / "out.onnx",
        "parent-is-a-file": a_file / "out.onnx",
        "output-is-a-directory": a_dir,
        # /proc accepts no new files, even from root (where a chmod-ed folder would still be writable)
        "filesystem-refuses": Path("/proc/onnxfuse-test-out.onnx"),
    }
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        cases["read-only-folder"] = locked / "out.onnx"
    return cases


@pytest.mark.parametrize("external", [False, True], ids=["inline", "external-data"])
@pytest.mark.parametrize("case", ["missing-folder", "parent-is-a-file", "output-is-a-directory",
                                  "filesystem-refuses", "read-only-folder"])
def test_unwritable_output_exits_2_and_leaves_nothing(tmp_path, case, external):
    outputs = _unwritable_outputs(tmp_path)
    if case not in outputs:
        pytest.skip("running as root: a read-only folder is writable by root (the /proc case covers refusal)")
    out = outputs[case]
    src = tmp_path / "src"
    src.mkdir()
    if external:
        model = _external_model(src)
    else:
        model = src / "model.onnx"
        onnx.save_model(_good_model(), model)
    before = tree_digest(tmp_path)
    code, stdout, stderr, exc = run_cli(["optimize", str(model), "-o", str(out)])
    assert_one_line_error(code, stdout, stderr, exc, names=out.name, keywords=())
    assert tree_digest(tmp_path) == before
    assert not out.is_file() or case == "output-is-a-directory"


def test_output_over_the_input_is_refused(tmp_path):
    model = tmp_path / "model.onnx"
    onnx.save_model(_good_model(), model)
    before = tree_digest(tmp_path)
    code, stdout, stderr, exc = run_cli(["optimize", str(model), "-o", str(model)])
    assert_one_line_error(code, stdout, stderr, exc, names="model.onnx", keywords=("input",))
    assert tree_digest(tmp_path) == before


def test_output_data_file_over_the_inputs_data_is_refused(tmp_path):
    """``-o x.onnx`` writes ``x.onnx.data``: when that is the input's data file, refuse (it would be
    truncated while being read)."""
    src = _external_model(tmp_path)
    os.rename(tmp_path / "model.onnx.data", tmp_path / "fused.onnx.data")
    m = onnx.load_model(src, load_external_data=False)
    for t in m.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "fused.onnx.data"
    onnx.save_model(m, src)
    before = tree_digest(tmp_path)
    code, stdout, stderr, exc = run_cli(["optimize", str(src), "-o", str(tmp_path / "fused.onnx")])
    assert_one_line_error(code, stdout, stderr, exc, names="fused.onnx", keywords=("data",))
    assert tree_digest(tmp_path) == before


def test_unwritable_json_report_writes_no_model(tmp_path):
    """``--json`` into a folder that does not exist is bad usage: exit 2 and no model written either."""
    model = tmp_path / "model.onnx"
    onnx.save_model(_good_model(), model)
    out = tmp_path / "out"
    out.mkdir()
    code, stdout, stderr, exc = run_cli(["optimize", str(model), "-o", str(out / "fused.onnx"),
                                         "--json", str(tmp_path / "missing" / "report.json")])
    assert_one_line_error(code, stdout, stderr, exc, names="report.json", keywords=())
    assert not any(out.iterdir()), sorted(os.listdir(out))


# --- the real process ----------------------------------------------------------------------------------
@pytest.mark.parametrize("case", ["random-bytes", "git-lfs-pointer", "truncated-external-data"])
def test_real_process_prints_one_line_and_no_traceback(tmp_path, case):
    bad, _ = BAD_INPUTS[case](tmp_path)
    before = tree_digest(tmp_path)
    out = tmp_path / "out.onnx"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("ONNXFUSE_DEBUG", None)
    proc = subprocess.run([sys.executable, "-m", "onnxfuse.cli", "optimize", str(bad), "-o", str(out)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert re.fullmatch(r"onnxfuse: error: [^\n]+\n", proc.stderr), proc.stderr
    assert tree_digest(tmp_path) == before


# --- inputs the fuzzer found ---------------------------------------------------------------------------
def _fuzz_cases():
    return sorted(p for p in REGRESSIONS.glob("*") if p.is_file() and p.suffix != ".md")


@pytest.mark.parametrize("path", _fuzz_cases(), ids=lambda p: p.name)
def test_fuzz_regressions(tmp_path, path):
    """Each input once made the load → fuse → save path raise something other than ``BadInputError``."""
    sys.path.insert(0, str(REPO / "fuzz"))
    try:
        from fuzz_property import check_one
    finally:
        sys.path.pop(0)
    (tmp_path / "out").mkdir()
    check_one(path.read_bytes(), str(tmp_path))
