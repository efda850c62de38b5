"""Progress on long steps: a status line on stderr naming the step that runs (ORT's fusions, the rules,
writing, --verify's gate, tuning) when stderr is a terminal, and nothing at all otherwise, so that CI logs and
``--json -`` stay clean. The terminal is a real pseudo-terminal: what rich sees is what a user's shell gives."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import threading

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(ROOT, "sample_models", "tiny_bert.onnx")
VERIFY = ["--verify", "--shape", "input_ids=2,16", "--shape", "attention_mask=2,16"]


def _env() -> dict:
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), "TERM": "xterm"}
    env.pop("ONNXFUSE_DEBUG", None)
    return env


def _with_stderr_on_a_terminal(*args) -> tuple[int, str, str]:
    """Run the command line with stdout a pipe and stderr a pseudo-terminal: (exit code, stdout, what the
    terminal received)."""
    main, side = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "onnxfuse.cli", *map(str, args)], stdout=subprocess.PIPE,
                               stderr=side, env=_env(), text=True)
    os.close(side)
    received = bytearray()

    def drain() -> None:  # read while it runs: a full terminal buffer would block the writer
        while True:
            try:
                chunk = os.read(main, 4096)
            except OSError:  # the other side closed (Linux answers EIO)
                return
            if not chunk:
                return
            received.extend(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    stdout, _ = process.communicate(timeout=180)
    reader.join(timeout=30)
    os.close(main)
    return process.returncode, stdout, received.decode(errors="replace")


def _piped(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "onnxfuse.cli", *map(str, args)], capture_output=True, text=True,
                          env=_env(), timeout=180)


def test_a_terminal_sees_each_long_step(tmp_path, library_path):
    code, stdout, terminal = _with_stderr_on_a_terminal("optimize", SAMPLE, "-o", tmp_path / "out.onnx", *VERIFY)
    assert code == 0, terminal
    for step in ("reading: ", "onnxfuse's rules", "writing: ",  # (paths cut at the terminal's width)
                 "verifying: 2 sample(s) on cpu"):
        assert step in terminal, terminal
    assert "PASS" in stdout and "verifying" not in stdout  # the status never reaches stdout


def test_ort_fusions_are_shown_by_fusion_set(tmp_path):
    code, _, terminal = _with_stderr_on_a_terminal("inspect", SAMPLE, "--ort-fusions")
    assert code == 0, terminal
    assert "ORT's transformer fusions: the bert fusion set" in terminal, terminal


def test_quiet_shows_no_status_even_on_a_terminal(tmp_path, library_path):
    code, stdout, terminal = _with_stderr_on_a_terminal("-q", "optimize", SAMPLE, "-o", tmp_path / "out.onnx", *VERIFY)
    assert code == 0, terminal
    assert terminal == "" and len(stdout.splitlines()) == 1


@pytest.mark.parametrize("json_to", ["-", "report.json"])
def test_without_a_terminal_stderr_stays_empty(tmp_path, library_path, json_to):
    report = json_to if json_to == "-" else tmp_path / json_to
    r = _piped("optimize", SAMPLE, "-o", tmp_path / "out.onnx", *VERIFY, "--ort-fusions", "--json", report)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    data = json.loads(r.stdout) if json_to == "-" else json.loads(report.read_text())
    assert data["verify"]["passed"] is True
