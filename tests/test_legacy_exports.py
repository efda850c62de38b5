"""The rewriter on the exporters users pin (issue #54): transformers 4.36-4.57 and 5.x through the TorchScript
exporter, torch's dynamo exporter, torch's default exporter and optimum's, some after ONNX Runtime's
transformers optimizer and its float16 converter of their day.

The models (``models/legacy/``) are a subset of the export corpus that ``scripts/exports/`` makes and tallies
(``bench/results/attention_export_corpus_cpu.md``): one export per distinct refusal reason. Per model: it loads
and opens in ONNX Runtime, ``onnxfuse optimize`` exits 0 and its output matches the original on the CPU
provider with padded masks, and the attention blocks fused and refused are what the manifest records today.
Where issue #54 says a miss must go, a strict xfail asserts that every block of the architecture fuses: the day
the attention rule takes it, the test fails and the marker (and the manifest's ``fused_today``) is updated.
"""

from __future__ import annotations

import functools
import json
import zlib
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

LEGACY = Path(__file__).resolve().parent / "models" / "legacy"
MANIFEST = json.loads((LEGACY / "manifest.json").read_text())
ENTRIES = {m["file"]: m for m in MANIFEST["models"]}
BUDGET = 1_000_000  # bytes: the subset travels with the repository to every GPU run
TOLERANCE = {"float32": 1e-4, "float16": 1e-2}  # relative to the reference output's largest magnitude
ATTENTION_OPS = {("com.microsoft", "Attention"), ("com.microsoft", "MultiHeadAttention")}


def _ids(files=None, issue_marks: bool = False):
    out = []
    for file in sorted(files or ENTRIES):
        why = ENTRIES[file]["issue_54"]
        marks = [pytest.mark.xfail(strict=True, raises=AssertionError, reason="; ".join(why))] if issue_marks and why else []
        out.append(pytest.param(file, id=file.removesuffix(".onnx"), marks=marks))
    return out


@functools.lru_cache(maxsize=None)
def _report(file: str):
    from onnxfuse.pipeline import inspect_file

    return inspect_file(LEGACY / file)


def _feeds(file: str) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
    """Seeded inputs from the manifest's specs at batch 3 where the graph leaves the batch free; the mask's
    row 1 padded on the right and row 2 on the left. Returns (feeds, the mask as kept positions, or None)."""
    entry = ENTRIES[file]
    model = onnx.load(str(LEGACY / file), load_external_data=False)
    free = {i.name: not i.type.tensor_type.shape.dim[0].HasField("dim_value")
            for i in model.graph.input if i.type.tensor_type.shape.dim}
    rng = np.random.default_rng(zlib.crc32(file.encode()))
    feeds, mask = {}, None
    for spec in entry["inputs"]:
        shape = list(spec["shape"])
        if free.get(spec["name"]):
            shape[0] = 3
        if spec["kind"] == "int":
            a = rng.integers(spec["low"], spec["high"], size=shape)
        elif spec["kind"] == "ones":
            a = np.ones(shape)
            if shape[0] >= 2 and shape[-1] >= 4:
                a[1, -3:] = 0
            if shape[0] >= 3 and shape[-1] >= 4:
                a[2, :2] = 0
            mask = a.astype(bool)
        elif spec["kind"] == "positions":
            a = np.broadcast_to(np.arange(shape[-1]), shape)
        else:
            a = rng.standard_normal(shape)
        feeds[spec["name"]] = np.ascontiguousarray(a.astype(spec["dtype"]))
    return feeds, mask


# --- the folder and its manifest -------------------------------------------------------------------


def test_manifest_lists_every_legacy_model_and_nothing_else():
    on_disk = {p.name for p in LEGACY.iterdir() if p.suffix == ".onnx"}
    assert on_disk == set(ENTRIES)
    data = {p.name for p in LEGACY.iterdir() if p.suffix == ".data"}
    assert data == {m["external_data"] for m in ENTRIES.values() if m["external_data"]}
    assert {p.name for p in LEGACY.iterdir()} == on_disk | data | {"manifest.json"}


def test_legacy_models_are_small():
    sizes = {p.name: p.stat().st_size for p in LEGACY.iterdir()}
    assert sum(sizes.values()) < BUDGET, sizes
    for file, entry in ENTRIES.items():
        assert entry["bytes"] == sizes[file] + (sizes[entry["external_data"]] if entry["external_data"] else 0)


def test_manifest_covers_every_configuration_and_exporter():
    assert {m["configuration"] for m in ENTRIES.values()} == set(MANIFEST["generator"])
    assert {m["exporter"] for m in ENTRIES.values()} >= {"torchscript", "dynamo"}
    for m in ENTRIES.values():
        assert m["transformers"] == MANIFEST["generator"][m["configuration"]]["transformers"]
        assert m["fused_today"] + m["already_fused_by_ort"] + len(m["refused_today"]) <= m["expected_attention"]


# --- each model ------------------------------------------------------------------------------------


@pytest.mark.parametrize("file", _ids())
def test_model_is_what_the_manifest_says(file):
    entry = ENTRIES[file]
    model = onnx.load(str(LEGACY / file), load_external_data=False)
    opset = {o.domain: o.version for o in model.opset_import}
    assert opset.get("", opset.get("ai.onnx")) == entry["opset"]
    initializers = {t.name for t in model.graph.initializer}
    assert [i.name for i in model.graph.input if i.name not in initializers] == [s["name"] for s in entry["inputs"]]
    assert [o.name for o in model.graph.output] == entry["outputs"]
    external = [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert bool(external) == bool(entry["external_data"])
    ops = {("" if n.domain == "ai.onnx" else n.domain, n.op_type) for n in model.graph.node}
    assert not any(d == "ai.onnxfuse" for d, _ in ops)
    assert sum(1 for n in model.graph.node if (n.domain, n.op_type) in ATTENTION_OPS) == entry["already_fused_by_ort"]


@pytest.mark.parametrize("file", _ids())
def test_attention_today(file):
    """The blocks fused and every refusal's reason, as the manifest records them today."""
    entry, report = ENTRIES[file], _report(file)
    assert sum(b.rule == "attention" for b in report.fused) == entry["fused_today"], (
        [(r.rule, r.reason) for r in report.refused])
    anchors = {n.name for n in onnx.load(str(LEGACY / file), load_external_data=False).graph.node
               if n.op_type in ("Softmax", "Attention") and n.domain in ("", "ai.onnx")}
    refused = sorted(r.reason for r in report.refused if r.rule == "attention" or set(r.nodes) & anchors)
    assert refused == entry["refused_today"]


@pytest.mark.parametrize("file", _ids(issue_marks=True))
def test_every_attention_fuses(file):
    """Issue #54: every attention block of the architecture fused (by onnxfuse, or by ORT before it)."""
    entry, report = ENTRIES[file], _report(file)
    fused = sum(b.rule == "attention" for b in report.fused)
    assert fused + entry["already_fused_by_ort"] == entry["expected_attention"], (
        entry["expected_attention_why"], [r.reason for r in report.refused])


@pytest.mark.parametrize("file", _ids())
def test_optimize_exits_0_and_matches_the_original(file, tmp_path):
    from click.testing import CliRunner

    from onnxfuse.cli import main
    from onnxfuse.runtime import create_session

    out = tmp_path / "fused.onnx"
    run = CliRunner().invoke(main, ["optimize", str(LEGACY / file), "-o", str(out)])
    assert run.exit_code == 0, run.output
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the original as written
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    reference = ort.InferenceSession(str(LEGACY / file), so, providers=["CPUExecutionProvider"])
    fused = create_session(str(out), providers=["CPUExecutionProvider"], intra_op_num_threads=1, quiet=True)
    feeds, mask = _feeds(file)
    want, got = reference.run(None, feeds), fused.run(None, feeds)
    assert len(want) == len(got)
    for k, (w, g) in enumerate(zip(want, got)):
        assert w.shape == g.shape and w.dtype == g.dtype, (k, w.shape, g.shape)
        w, g = w.astype(np.float64), g.astype(np.float64)
        if mask is not None and w.shape[:2] == mask.shape:
            # a padded query row sees no key: each implementation makes its own of it (the row guard writes 0)
            w, g = w[mask], g[mask]
        scale = max(1.0, float(np.abs(w).max()))
        np.testing.assert_allclose(g, w, rtol=0, atol=TOLERANCE[ENTRIES[file]["dtype"]] * scale,
                                   err_msg=f"{file}: output {k}")
