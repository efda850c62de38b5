"""onnxfuse.atomic, and the reports and charts written through it: a file onnxfuse writes is the old one or
the complete new one, never a part, and no temporary file outlives a failed write.

The failures are injected where a real one happens: the disk filling up at fsync (the last moment before
the rename), and a chart renderer dying halfway through its PNG. A reader holding the old file open keeps
reading the old bytes, which only a rename (not a rewrite in place) can give.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import subprocess
import sys

import matplotlib.figure
import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from onnxfuse import atomic
from onnxfuse.cli import main
from onnxfuse.errors import BadInputError

OLD = b"the old file, complete\n"


def entries(folder) -> list[str]:
    return sorted(os.listdir(folder))


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def fail_fsync_of(monkeypatch, target_name: str) -> list[str]:
    """Make fsync fail with ENOSPC for the temporary file of ``target_name`` (a full disk at the last moment
    before the rename); every other fsync works. Returns the temporary paths it failed for."""
    real = os.fsync
    failed = []

    def fsync(fd):
        where = os.readlink(f"/proc/self/fd/{fd}")
        if os.path.basename(where).startswith(f".{target_name}.") and where.endswith(atomic.TEMP_SUFFIX):
            failed.append(where)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return failed


# --- the primitive ---------------------------------------------------------------------------------------


def test_bytes_and_writer_content_land_whole_with_the_usual_permissions(tmp_path):
    old_umask = os.umask(0o022)
    try:
        atomic.write_atomic(tmp_path / "a.bin", b"bytes")
        assert atomic.write_atomic(tmp_path / "b.bin", lambda f: f.write(b"written by a callable")) == tmp_path / "b.bin"
    finally:
        os.umask(old_umask)
    assert (tmp_path / "a.bin").read_bytes() == b"bytes"
    assert (tmp_path / "b.bin").read_bytes() == b"written by a callable"
    # as open(path, "w") would make it, not tempfile's 0600: a published report is readable by others
    assert stat.S_IMODE((tmp_path / "a.bin").stat().st_mode) == 0o644
    assert entries(tmp_path) == ["a.bin", "b.bin"]


def test_the_target_is_replaced_by_a_rename_not_rewritten(tmp_path):
    target = tmp_path / "r.json"
    target.write_bytes(OLD)
    with open(target, "rb") as reader:  # a reader that opened the old file before the write
        atomic.write_atomic(target, b"new")
        assert reader.read() == OLD
    assert target.read_bytes() == b"new"


def test_a_writer_failing_halfway_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "chart.png"
    target.write_bytes(OLD)

    def half_then_fail(f):
        f.write(b"\x89PNG\r\n\x1a\n and then")
        raise RuntimeError("renderer died")

    with pytest.raises(RuntimeError, match="renderer died"):
        atomic.write_atomic(target, half_then_fail)
    assert target.read_bytes() == OLD
    assert entries(tmp_path) == ["chart.png"]


def test_a_full_disk_is_one_line_and_leaves_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "r.json"
    target.write_bytes(OLD)
    failed = fail_fsync_of(monkeypatch, "r.json")
    with pytest.raises(BadInputError, match=r"r\.json: cannot write: No space left on device"):
        atomic.write_json(target, {"a": 1})
    assert failed, "the injected failure did not happen"
    assert target.read_bytes() == OLD
    assert entries(tmp_path) == ["r.json"]


def test_unwritable_targets_are_bad_input(tmp_path):
    with pytest.raises(BadInputError, match="folder .* does not exist"):
        atomic.write_atomic(tmp_path / "missing" / "r.json", b"x")
    (tmp_path / "a_folder").mkdir()
    with pytest.raises(BadInputError, match="a_folder: cannot write"):
        atomic.write_atomic(tmp_path / "a_folder", b"x")
    assert entries(tmp_path) == ["a_folder"] and entries(tmp_path / "a_folder") == []


def test_leftovers_of_dead_writers_are_removed_and_only_those(tmp_path):
    dead = dead_pid()
    stale_file = f".r.json.{dead}.0badf00d.tmp"
    stale_folder = f".r.json.{dead}.x1y2z3.tmp"  # model_save.save_model stages in folders named alike
    live = f".r.json.{os.getpid()}.cafe0001.tmp"  # a write in progress in a running process
    other_target = f".r.json.5.{dead}.0badf00d.tmp"  # a leftover of the target 'r.json.5', not of 'r.json'
    unrelated = ".r.json.swp"
    for name in (stale_file, live, other_target, unrelated):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / stale_folder).mkdir()
    (tmp_path / stale_folder / "r.json").write_bytes(b"")
    atomic.write_atomic(tmp_path / "r.json", b"new")
    assert entries(tmp_path) == sorted([live, other_target, unrelated, "r.json"])


def _strict(constant: str):
    raise ValueError(f"not JSON: {constant}")


def test_json_text_is_the_one_rendering():
    data = {"name": "sortie·é", "n": np.int64(3), "x": np.float32(0.5), "ok": np.bool_(True), "inf": math.inf,
            "stats": [np.float64("nan"), -math.inf, (1.5, np.float32("inf"))]}
    text = atomic.json_text(data)
    assert "sortie·é" in text  # UTF-8 as it is, not \u escapes
    # strict JSON, as jq and JSON.parse read it: a non-finite number is null
    assert json.loads(text, parse_constant=_strict) == {"name": "sortie·é", "n": 3, "x": 0.5, "ok": True,
                                                         "inf": None, "stats": [None, None, [1.5, None]]}
    assert text.startswith('{\n  "name"')  # indented by two
    with pytest.raises(TypeError, match="not JSON serialisable: object"):
        atomic.json_text({"x": object()})


# --- what the commands write -------------------------------------------------------------------------------


def linear_gelu_model() -> onnx.ModelProto:
    rng = np.random.default_rng(7)
    w = numpy_helper.from_array((rng.standard_normal((16, 24)) / 4).astype(np.float32), "W")
    b = numpy_helper.from_array((rng.standard_normal(24) * 0.1).astype(np.float32), "B")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["mm"]), helper.make_node("Add", ["mm", "B"], ["pre"]),
             helper.make_node("Gelu", ["pre"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 24])], [w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(linear_gelu_model(), path)
    return str(path)


def run(*args: str):
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def old_outputs(folder, *names):
    for name in names:
        (folder / name).write_bytes(OLD)


def assert_one_line(code, err, *words):
    assert code == 2, err
    (line,) = err.strip().splitlines()
    assert line.startswith("onnxfuse: error: ") and all(w in line for w in words), line


def half_a_png_then_a_full_disk(monkeypatch) -> None:
    def savefig(self, f, **kwargs):
        f.write(b"\x89PNG\r\n\x1a\n half a chart")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)


COMPARE = ["--provider", "cpu", "--no-progress"]


def test_compare_json_and_plot_replace_the_old_files_whole(tmp_path, model):
    old_outputs(tmp_path, "r.json", "r.png")
    with open(tmp_path / "r.json", "rb") as json_reader, open(tmp_path / "r.png", "rb") as png_reader:
        code, _, err = run("compare", model, model, *COMPARE, "--json", str(tmp_path / "r.json"),
                           "--plot", str(tmp_path / "r.png"))
        assert code == 0, err
        assert json_reader.read() == OLD and png_reader.read() == OLD  # renamed over, not rewritten in place
    assert json.loads((tmp_path / "r.json").read_text())["passed"] is True
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert entries(tmp_path) == ["model.onnx", "r.json", "r.png"]


def test_compare_json_failing_at_fsync_keeps_the_old_report(tmp_path, model, monkeypatch):
    old_outputs(tmp_path, "r.json")
    failed = fail_fsync_of(monkeypatch, "r.json")
    code, _, err = run("compare", model, model, *COMPARE, "--json", str(tmp_path / "r.json"))
    assert failed
    assert_one_line(code, err, "r.json", "cannot write", "No space left on device")
    assert (tmp_path / "r.json").read_bytes() == OLD
    assert entries(tmp_path) == ["model.onnx", "r.json"]


def test_compare_plot_failing_halfway_keeps_the_old_chart(tmp_path, model, monkeypatch):
    old_outputs(tmp_path, "r.png")
    half_a_png_then_a_full_disk(monkeypatch)
    code, _, err = run("compare", model, model, *COMPARE, "--plot", str(tmp_path / "r.png"))
    assert_one_line(code, err, "r.png", "cannot write")
    assert (tmp_path / "r.png").read_bytes() == OLD
    assert entries(tmp_path) == ["model.onnx", "r.png"]


def test_optimize_json_report_failing_at_fsync_keeps_the_old_report(tmp_path, model, monkeypatch):
    old_outputs(tmp_path, "report.json")
    failed = fail_fsync_of(monkeypatch, "report.json")
    code, _, err = run("optimize", model, "-o", str(tmp_path / "out.onnx"), "--json", str(tmp_path / "report.json"))
    assert failed
    assert_one_line(code, err, "report.json", "cannot write")
    assert (tmp_path / "report.json").read_bytes() == OLD
    assert not [e for e in entries(tmp_path) if e.endswith(atomic.TEMP_SUFFIX)]


BENCH = ["--provider", "cpu", "--no-progress", "--budget", "0.02"]


@pytest.fixture
def fused(model, tmp_path, library_path):
    from onnxfuse.pipeline import optimize_file

    path = tmp_path / "fused.onnx"
    optimize_file(model, str(path))
    return str(path)


def test_bench_json_and_plot_replace_the_old_files_whole(tmp_path, model, fused):
    old_outputs(tmp_path, "b.json", "b.png")
    with open(tmp_path / "b.json", "rb") as json_reader, open(tmp_path / "b.png", "rb") as png_reader:
        code, _, err = run("bench", fused, "--baseline", model, *BENCH, "--json", str(tmp_path / "b.json"),
                           "--plot", str(tmp_path / "b.png"))
        assert code == 0, err
        assert json_reader.read() == OLD and png_reader.read() == OLD
    assert [r["batch"] for r in json.loads((tmp_path / "b.json").read_text())["results"]] == [1]
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert entries(tmp_path) == ["b.json", "b.png", "fused.onnx", "model.onnx"]


def test_bench_failures_mid_write_keep_the_old_files(tmp_path, model, fused, monkeypatch):
    old_outputs(tmp_path, "b.json", "b.png")
    with monkeypatch.context() as patch:
        half_a_png_then_a_full_disk(patch)
        code, _, err = run("bench", fused, *BENCH, "--json", str(tmp_path / "b.json"), "--plot", str(tmp_path / "b.png"))
    assert_one_line(code, err, "b.png", "cannot write")
    assert (tmp_path / "b.png").read_bytes() == OLD and (tmp_path / "b.json").read_bytes() == OLD
    failed = fail_fsync_of(monkeypatch, "b.json")
    code, _, err = run("bench", fused, *BENCH, "--json", str(tmp_path / "b.json"))
    assert failed
    assert_one_line(code, err, "b.json", "cannot write")
    assert (tmp_path / "b.json").read_bytes() == OLD
    assert entries(tmp_path) == ["b.json", "b.png", "fused.onnx", "model.onnx"]
