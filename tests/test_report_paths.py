"""Where a command may write: a report (`--json`, `--plot`) or an output model that would overwrite a file the
command reads or writes, or that is not a regular file, is refused before any work (exit 2, one line, every
file as it was). As root, permission bits do not say what can be written: the folder is tried for real."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

from onnxfuse.cli import main
from tests.graphs import build_mlp

ROOT = Path(__file__).resolve().parent.parent


def cli(*args):
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("ONNXFUSE_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "onnxfuse.cli", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=120)


def snapshot(folder: Path) -> dict[str, str]:
    """Every entry of the folder: a file by its bytes' digest, anything else by its kind."""
    out = {}
    for entry in sorted(folder.iterdir()):
        mode = entry.lstat().st_mode
        out[entry.name] = (hashlib.sha256(entry.read_bytes()).hexdigest() if stat.S_ISREG(mode)
                           else stat.filemode(mode)[0])
    return out


def refused(r, *says: str) -> None:
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("onnxfuse: error: "), r.stderr
    for text in says:
        assert text in r.stderr, r.stderr


@pytest.fixture
def models(tmp_path):
    """An input with its weights in an external data file, and its optimized form (also external)."""
    src = tmp_path / "in.onnx"
    onnx.save_model(build_mlp(layers=2, k=64, n=128), src, save_as_external_data=True,
                    all_tensors_to_one_file=True, location="in.onnx.data", size_threshold=0)
    fused = tmp_path / "fused.onnx"
    r = cli("optimize", src, "-o", fused)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "in.onnx.data").is_file() and (tmp_path / "fused.onnx.data").is_file()
    return src, fused


@pytest.mark.parametrize("report, says", [
    ("in.onnx", "is the input model in.onnx"),
    ("in.onnx.data", "is external data of the input model"),
    ("out.onnx", "is the output model"),
    ("out.onnx.data", "is the output model's data file"),
])
def test_optimize_report_never_overwrites_a_model_file(tmp_path, models, monkeypatch, report, says):
    monkeypatch.chdir(tmp_path)
    if report.startswith("out"):
        (tmp_path / report).write_bytes(b"an earlier file")
    before = snapshot(tmp_path)
    refused(cli("optimize", "in.onnx", "-o", "out.onnx", "--json", report), f"--json {report}: ", says)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("command", ["compare", "bench"])
@pytest.mark.parametrize("report", ["original", "optimized", "optimized data"])
def test_compare_and_bench_reports_never_overwrite_their_models(tmp_path, models, command, report):
    src, fused = models
    target = {"original": src, "optimized": fused, "optimized data": tmp_path / "fused.onnx.data"}[report]
    args = [src, fused] if command == "compare" else [fused, "--baseline", src, "--provider", "cpu"]
    before = snapshot(tmp_path)
    refused(cli(command, *args, "--json", target), "--json ", "the report would overwrite it")
    assert snapshot(tmp_path) == before


def test_compare_report_is_not_the_inputs_file_nor_the_plot(tmp_path, models):
    src, fused = models
    samples = tmp_path / "samples.npz"
    samples.write_bytes(b"samples")
    before = snapshot(tmp_path)
    refused(cli("compare", src, fused, "--inputs", samples, "--json", samples), "is the input")
    refused(cli("compare", src, fused, "--json", tmp_path / "r.png", "--plot", tmp_path / "r.png"),
            "is also the --json file")
    assert snapshot(tmp_path) == before


def test_tune_report_is_not_its_model(tmp_path, models):
    _, fused = models
    before = snapshot(tmp_path)
    refused(cli("tune", fused, "-o", tmp_path / "tuned.onnx", "--json", fused), "is the input model")
    refused(cli("tune", fused, "-o", tmp_path / "tuned.onnx", "--json", tmp_path / "tuned.onnx"),
            "is the output model")
    assert snapshot(tmp_path) == before


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this platform")
@pytest.mark.parametrize("option", ["-o", "--json"])
def test_a_pipe_is_not_replaced_by_a_file(tmp_path, models, option):
    """The atomic write renames a new file over its target: over a pipe or a device (/dev/null, as root) that
    would replace the entry itself."""
    src, _ = models
    pipe = tmp_path / "pipe.onnx"
    os.mkfifo(pipe)
    args = ["-o", pipe] if option == "-o" else ["-o", tmp_path / "out.onnx", "--json", pipe]
    before = snapshot(tmp_path)
    refused(cli("optimize", src, *args), "not a regular file")
    assert snapshot(tmp_path) == before and stat.S_ISFIFO(pipe.lstat().st_mode)


def test_a_report_through_a_link_to_a_model_is_refused(tmp_path, models):
    src, _ = models
    (tmp_path / "link.json").symlink_to(src)
    before = snapshot(tmp_path)
    refused(cli("optimize", src, "-o", tmp_path / "out.onnx", "--json", tmp_path / "link.json"), "is the input model")
    assert snapshot(tmp_path) == before


def test_a_folder_where_the_data_file_goes_is_refused(tmp_path, models):
    src, _ = models
    (tmp_path / "out.onnx.data").mkdir()
    before = snapshot(tmp_path)
    refused(cli("optimize", src, "-o", tmp_path / "out.onnx"), "is not a regular file")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("args, says", [
    (["-o", ""], "an empty path; give the output model's file name"),
    (["-o", "-"], "-: a model is written to a file"),
    (["-o", "{tmp}/out.onnx", "--json", ""], "--json: an empty path"),
    (["-o", "{tmp}/out.onnx", "--json", "{tmp}"], "is a directory; give the report's file name"),
])
def test_empty_and_folder_paths(tmp_path, models, args, says):
    src, _ = models
    before = snapshot(tmp_path)
    refused(cli("optimize", src, *[a.format(tmp=tmp_path) for a in args]), says)
    assert snapshot(tmp_path) == before


def test_a_folder_that_refuses_the_write_is_found_before_the_model_is_written(tmp_path, models, monkeypatch):
    """Root passes every permission check, yet cannot write in /sys or on a read-only mount: the report's
    folder is tried before the model is published, so that a failed report never leaves a model behind."""
    import onnxfuse.model_save as model_save

    src, _ = models
    reports = tmp_path / "reports"
    reports.mkdir()
    real = model_save.create_temp_file

    def read_only_reports(folder, name):
        if Path(folder) == reports:
            raise OSError(30, "Read-only file system")
        return real(folder, name)

    monkeypatch.setattr(model_save, "create_temp_file", read_only_reports)
    before = snapshot(tmp_path)
    r = CliRunner().invoke(main, ["optimize", str(src), "-o", str(tmp_path / "out.onnx"),
                                  "--json", str(reports / "r.json")])
    assert r.exit_code == 2, r.output
    assert "cannot write in folder" in r.output and "Read-only file system" in r.output
    assert snapshot(tmp_path) == before


def test_a_report_that_fails_after_the_model_was_written_says_so(tmp_path, models, monkeypatch):
    """A disk that fills between the check and the report: the model is whole and in place, and the error line
    says it was written rather than leave the user to think nothing was."""
    import onnxfuse.atomic as atomic
    from onnxfuse.errors import BadInputError

    src, _ = models

    def full_disk(path, data):
        raise BadInputError(f"{path}: cannot write: No space left on device")

    monkeypatch.setattr(atomic, "write_json", full_disk)
    out, report = tmp_path / "out.onnx", tmp_path / "r.json"
    r = CliRunner().invoke(main, ["optimize", str(src), "-o", str(out), "--json", str(report)])
    assert r.exit_code == 2, r.output
    assert f"{out} written, but not the --json report: {report}: cannot write: No space left" in r.output
    onnx.checker.check_model(str(out), full_check=True)
    assert not report.exists()
