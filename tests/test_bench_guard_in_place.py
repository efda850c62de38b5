"""bench/guard_in_place.py's reading of a session: its child process runs a fused model with ORT's log at
verbose, the op's lines say which guards ran in place, and the graph ORT optimized is described around each
guard. Here on the CPU provider with a committed GPT-2 export (building the bench's own models needs torch
and transformers: that part runs on the device)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import onnx

from onnxfuse.fuse import fuse_model

from tests.bench_scripts import load_bench_script

ROOT = Path(__file__).resolve().parents[1]
_PATH = ROOT / "bench" / "guard_in_place.py"
guard = load_bench_script("guard_in_place")


def test_said_reads_the_ops_lines():
    log = ("2026-12-03 [V:onnxruntime:, fill_masked_rows_common.cc:68 Note] FillMaskedRows node 'a/b': runs in "
           "place (Y shares X's buffer)\n[V:onnxruntime:] FillMaskedRows node 'c': copies the kept rows (ORT gave "
           "Y a buffer of its own)\nunrelated line\n")
    assert guard.said(log) == {"a/b": "in place", "c": "copies"}


def test_a_child_session_reports_every_guard_and_the_optimized_graph(tmp_path):
    fused = fuse_model(onnx.load(ROOT / "tests" / "models" / "gpt2_torchscript_op14.onnx")).model
    guards = {n.name for n in fused.graph.node if n.op_type == "FillMaskedRows"}
    model, optimized = tmp_path / "fused.onnx", tmp_path / "optimized.onnx"
    onnx.save(fused, model)
    child = subprocess.run(
        [sys.executable, str(_PATH), "--provider", "cpu", "--batch", "3", "--sequence", "6", "--child", str(model),
         "ORT_ENABLE_ALL", str(optimized)],
        capture_output=True, text=True, env=os.environ | {"PYTHONPATH": str(ROOT)}, timeout=300)
    assert child.returncode == 0, child.stderr[-2000:]
    assert guard.said(child.stderr) == {name: "in place" for name in guards} and len(guards) == 2
    described = guard.describe_guards(str(optimized))
    assert {g["node"] for g in described} == guards
    for g in described:
        assert g["x_from"] in ("com.microsoft.Attention", "com.microsoft.MultiHeadAttention")
        assert g["x"]["dims"] is not None and len(g["x"]["dims"]) == 3
