"""What `optimize` says it did: the op counts before → after (the ops onnxfuse writes, and every count that
changed), in the summary and in the JSON report."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import onnx
from click.testing import CliRunner

from onnxfuse.cli import main
from tests.graphs import build, build_mlp

SAMPLE = Path(__file__).resolve().parent.parent / "sample_models" / "tiny_bert.onnx"


def _run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _counts(path) -> Counter:
    model = onnx.load(str(path))
    return Counter(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}" for n in model.graph.node)


def _table_rows(stdout: str) -> dict[str, str]:
    """{op: "before → after"} of the ops table."""
    rows = re.findall(r"│ (\S+)\s+│\s+(\d+ → \d+) │", stdout)
    return dict(rows)


def test_op_counts_in_the_json_report_are_the_files(tmp_path):
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(build_mlp(layers=2), str(src))
    r = _run("optimize", src, "-o", out, "--json", "-")
    assert r.exit_code == 0, r.output
    counts = json.loads(r.stdout)["op_counts"]
    assert counts == {"before": dict(sorted(_counts(src).items())), "after": dict(sorted(_counts(out).items()))}
    assert counts["before"]["Erf"] == 2 and "Erf" not in counts["after"]
    assert counts["after"]["ai.onnxfuse.FusedLinearGelu"] == 2
    assert "ai.onnxfuse.FusedLinearGelu" not in counts["before"]


def test_summary_table_shows_written_and_changed_ops_only(tmp_path):
    src, out = SAMPLE, tmp_path / "out.onnx"
    r = _run("optimize", src, "-o", out)
    assert r.exit_code == 0, r.output
    before, after = _counts(src), _counts(out)
    rows = _table_rows(r.stdout)
    written = ["ai.onnxfuse.FillMaskedRows", "ai.onnxfuse.FusedLinearGelu", "com.microsoft.Attention",
               "com.microsoft.SkipLayerNormalization"]  # the attention's row guard too, though no block is one
    assert list(rows)[:4] == written
    assert rows["ai.onnxfuse.FusedLinearGelu"] == "0 → 2" and rows["Erf"] == "2 → 0" and rows["Softmax"] == "2 → 0"
    changed = {op for op in before | after if before[op] != after[op]}
    assert set(rows) == changed
    assert {"Gemm", "Tanh"} <= {op for op in before if before[op] == after[op]}  # the pooler, as it was: no row


def test_no_ops_table_where_nothing_fused(tmp_path):
    src = tmp_path / "near.onnx"
    onnx.save(build("erf:pytorch:div", "matmul", perturb={"sqrt2": 1.414}), str(src))
    r = _run("optimize", src, "-o", tmp_path / "out.onnx")
    assert r.exit_code == 0, r.output
    assert "ops written" not in r.stdout and _table_rows(r.stdout) == {}
    r = _run("optimize", src, "-o", tmp_path / "out.onnx", "--json", "-")
    counts = json.loads(r.stdout)["op_counts"]
    assert counts["before"] == counts["after"] == dict(sorted(_counts(src).items()))
