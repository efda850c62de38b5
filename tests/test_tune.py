"""`onnxfuse tune`: the rows each node sees, the choice per row count, the table's compression, the written
model and its metadata, the command's errors — with injected measurements (no GPU needed) — and, on a GPU,
the real measurement of a sample model."""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import shutil
import subprocess

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import helper

from onnxfuse import model_io, tuning
from onnxfuse.cli import main
from onnxfuse.domain import GEMV_MAX_ROWS, OP_TYPE
from onnxfuse.errors import BadInputError
from onnxfuse.pipeline import optimize_file
from onnxfuse.patterns.graph import base_dir_of
from onnxfuse.runtime import create_session, cuda_device_signature, cuda_usable
from onnxfuse.tune import tune_plan
from onnxfuse.tuning import NodeShape, PathTimes, compress, table_of
from tests.test_cli_optimize import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIGNATURE = "NVIDIA Test GPU|sm_90|cuda 13.0|onnxfuse 0.6.0"
DEVICE = tuning.Device(SIGNATURE, "NVIDIA Test GPU", "9.0", "13.0", "13.0", "1.31.1", "0.6.0")
F32 = onnx.TensorProto.FLOAT

def _fake_measure(calls: list):
    """Deterministic times: the fallback wins at 64 rows or fewer (where the one kernel's tiles idle), the
    one-kernel path above."""

    def measure(shape: NodeShape, m: int) -> PathTimes:
        calls.append((shape, m))
        fused = 5.0 + m * shape.k * shape.n * 1e-6
        fallback = fused * (0.8 if m <= 64 else 1.25)
        return PathTimes(fused, fallback, fused * 1.5)

    return measure


def _fake_measure_gemv(calls: list):
    """Deterministic times with the few-rows path: gemv wins at 8 rows or fewer and loses at 9-16 (it is
    not measured above 16, where it does not run); the fallback beats the one kernel at 64 rows or fewer."""

    def measure(shape: NodeShape, m: int) -> PathTimes:
        calls.append((shape, m))
        fused = 5.0 + m * shape.k * shape.n * 1e-6
        fallback = fused * (0.8 if m <= 64 else 1.25)
        if m > GEMV_MAX_ROWS:
            return PathTimes(fused, fallback, fused * 1.5, gemv_note="not applicable")
        return PathTimes(fused, fallback, fused * 1.5, gemv_us=fallback * (0.5 if m <= 8 else 1.5))

    return measure


def _measurer(calls, fake=_fake_measure):
    return lambda reps: (DEVICE, fake(calls))


def _lookup(rows, paths, m):
    """The contract's rule: the path of the first bound >= M, the last entry beyond the last bound."""
    return next((p for r, p in zip(rows, paths) if m <= r), paths[-1])


def _obeys_the_contract(rows, paths) -> bool:
    """Bounds strictly ascending and positive, known paths, gemv only for bounds <= 16 and never last."""
    return (len(rows) == len(paths) > 0 and all(r > 0 for r in rows) and rows == sorted(set(rows))
            and set(paths) <= {"fused", "fallback", "gemv"} and paths[-1] != "gemv"
            and all(r <= GEMV_MAX_ROWS for r, p in zip(rows, paths) if p == "gemv"))


@pytest.fixture(scope="module")
def fused_models(tmp_path_factory):
    """The sample models and a few committed exports, optimized (tune reads optimize's output)."""
    out = tmp_path_factory.mktemp("fused")
    paths = {}
    for rel in ("sample_models/tiny_bert.onnx", "sample_models/tiny_gpt2.onnx", "tests/models/convnext_torchscript_op14.onnx",
                "tests/models/gpt2_torchscript_op14_ortopt.onnx", "tests/models/t5_torchscript_op15_ortfp16.onnx",
                "tests/models/vit_torchscript_op15_ortfp16.onnx", "tests/models/bert_torchscript_op17.onnx",
                "tests/models/bert_torchscript_op16_nofold.onnx", "tests/models/clip_text_torchscript_op16_ortfp16.onnx",
                "tests/models/gpt_neox_torchscript_op16.onnx"):
        target = out / os.path.basename(rel)
        optimize_file(os.path.join(ROOT, rel), target)
        paths[os.path.basename(rel)] = target
    return paths


# --- choosing and compressing ------------------------------------------------------------------------
def test_choose_takes_the_faster_path_and_the_one_kernel_on_ties():
    assert PathTimes(10.0, 12.0, 20.0).choice == "fused"
    assert PathTimes(10.0, 8.0, 20.0).choice == "fallback"
    assert PathTimes(10.0, 10.0, None).choice == "fused"
    assert PathTimes(10.0, None, 9.0, fallback_note="no cuBLASLt").choice == "fused"


def test_choose_takes_gemv_only_where_it_ran_and_last_on_ties():
    assert PathTimes(10.0, 12.0, 20.0, gemv_us=4.0).choice == "gemv"
    assert PathTimes(10.0, 8.0, 20.0, gemv_us=9.0).choice == "fallback"
    assert PathTimes(10.0, None, 20.0, gemv_us=9.0).choice == "gemv"
    assert PathTimes(10.0, 12.0, 20.0, gemv_note="not applicable").choice == "fused"  # M > 16: no gemv time
    # ties: fused before fallback before gemv
    assert PathTimes(10.0, 10.0, None, gemv_us=10.0).choice == "fused"
    assert PathTimes(10.0, 8.0, None, gemv_us=8.0).choice == "fallback"
    assert PathTimes(10.0, None, None, gemv_us=10.0).choice == "fused"
    # among the paths that run any M: what the rows beyond a gemv entry take
    assert tuning.choose(PathTimes(10.0, 12.0, 20.0, gemv_us=4.0), tuning.UNBOUNDED_PATHS) == "fused"
    assert tuning.choose(PathTimes(10.0, 9.0, 20.0, gemv_us=4.0), tuning.UNBOUNDED_PATHS) == "fallback"
    times = PathTimes(10.0, 12.0, 20.0, gemv_us=4.0)
    assert times.best_us == 4.0 and times.path_us() == {"fused": 10.0, "fallback": 12.0, "gemv": 4.0}


@pytest.mark.parametrize("choices, table", [
    ([(128, "fused")], ([128], ["fused"])),
    ([(128, "fused"), (1024, "fused"), (4096, "fallback")], ([1024, 4096], ["fused", "fallback"])),
    ([(4096, "fallback"), (16, "fallback"), (128, "fused")], ([16, 128, 4096], ["fallback", "fused", "fallback"])),
    ([(1, "fallback"), (8, "fallback"), (64, "fused"), (512, "fused")], ([8, 512], ["fallback", "fused"])),
])
def test_compress_merges_equal_neighbours_into_the_larger_bound(choices, table):
    assert compress(choices) == table
    rows, paths = table

    def lookup(m):  # the contract's rule: first bound >= M, the last entry beyond the last bound
        return next((p for r, p in zip(rows, paths) if m <= r), paths[-1])

    for m, path in choices:  # every measured M gets its own choice back
        assert lookup(m) == path


def test_compress_refuses_what_the_contract_cannot_hold():
    with pytest.raises(ValueError):
        compress([(8, "fused"), (8, "fallback")])
    with pytest.raises(ValueError):
        compress([(8, "split-k")])
    with pytest.raises(ValueError, match="M=32 chose gemv, which runs at most 16 rows"):
        compress([(8, "gemv"), (32, "gemv"), (128, "fused")])
    with pytest.raises(ValueError, match=r"the largest M \(16\) chose gemv"):  # and no path for the rows beyond
        compress([(1, "gemv"), (16, "gemv")])
    with pytest.raises(ValueError, match="the largest M"):
        compress([(16, "gemv")], beyond="gemv")


@pytest.mark.parametrize("choices, beyond, table", [
    # gemv best at every M measured, nothing above 16: the rows beyond take the given path
    ([(1, "gemv"), (8, "gemv"), (16, "gemv")], "fallback", ([16, 17], ["gemv", "fallback"])),
    ([(4, "gemv")], "fused", ([4, 5], ["gemv", "fused"])),
    # gemv best only in the middle: its own entry between the others
    ([(1, "fused"), (8, "gemv"), (16, "fallback"), (128, "fused")], None,
     ([1, 8, 16, 128], ["fused", "gemv", "fallback", "fused"])),
    ([(1, "gemv"), (8, "gemv"), (64, "fallback"), (512, "fused")], None, ([8, 64, 512], ["gemv", "fallback", "fused"])),
    # a path for the rows beyond is ignored where the largest M already has one that runs any M
    ([(1, "gemv"), (16, "fused")], "fallback", ([1, 16], ["gemv", "fused"])),
])
def test_compress_keeps_gemv_within_its_rows_and_never_last(choices, beyond, table):
    assert compress(choices, beyond=beyond) == table
    rows, paths = table
    assert _obeys_the_contract(rows, paths)
    for m, path in choices:
        assert _lookup(rows, paths, m) == path
    assert _lookup(rows, paths, max(m for m, _ in choices) + 1000) == (beyond if choices[-1][1] == "gemv" else paths[-1])


def _times(fused, fallback, gemv=None):
    return PathTimes(fused, fallback, None, gemv_us=gemv)


@pytest.mark.parametrize("times, table", [
    # gemv fastest at 1..16, nothing measured above: the rows beyond 16 take the faster of fused and
    # fallback at 16 (fallback here), not gemv, which cannot run them
    ({1: _times(5, 4, 2), 8: _times(6, 5, 3), 16: _times(8, 7, 4)}, ([16, 17], ["gemv", "fallback"])),
    ({1: _times(5, 6, 2), 16: _times(8, 9, 4)}, ([16, 17], ["gemv", "fused"])),
    # gemv fastest only in the middle
    ({1: _times(5, 4, 4.5), 8: _times(6, 5, 3), 16: _times(8, 7, 7.5), 256: _times(20, 30)},
     ([1, 8, 16, 256], ["fallback", "gemv", "fallback", "fused"])),
    # ties: fused before fallback before gemv, and a tie merges into the larger rows' entry
    ({1: _times(5, 5, 5), 16: _times(8, 9, 8), 64: _times(10, 12)}, ([64], ["fused"])),
    ({1: _times(6, 5, 5), 64: _times(10, 8)}, ([64], ["fallback"])),
    # the rows beyond a gemv entry on a fused/fallback tie: fused
    ({8: _times(7, 7, 3)}, ([8, 9], ["gemv", "fused"])),
])
def test_table_of_measurements_obeys_the_contract(times, table):
    rows, paths = table_of(times)
    assert (rows, paths) == table and _obeys_the_contract(rows, paths)
    for m, t in times.items():
        assert _lookup(rows, paths, m) == t.choice


# --- the nodes and their rows ------------------------------------------------------------------------
def test_tunable_nodes_read_each_nodes_shape(fused_models):
    tb = model_io.load_model(fused_models["tiny_bert.onnx"])
    nodes = tuning.tunable_nodes(tb)
    assert [n.shape for n in nodes] == [NodeShape(32, 128, F32, 1, "none")] * 2
    assert all(n.cuda_path == "auto" for n in nodes)
    nofold = tuning.tunable_nodes(model_io.load_model(fused_models["bert_torchscript_op16_nofold.onnx"]))
    assert {n.shape.trans_b for n in nofold} == {0} and {n.shape.k for n in nofold} == {32}
    t5 = tuning.tunable_nodes(model_io.load_model(fused_models["t5_torchscript_op15_ortfp16.onnx"]))
    assert {(n.shape.dtype, n.shape.approximate) for n in t5} == {(onnx.TensorProto.FLOAT16, "tanh")}


def test_a_model_without_fused_nodes_says_run_optimize_first():
    model = onnx.load(os.path.join(ROOT, "sample_models/tiny_bert.onnx"))
    with pytest.raises(BadInputError, match="no FusedLinearGelu node to tune: run `onnxfuse optimize` on it first"):
        tuning.tunable_nodes(model)


def _actual_rows(path, feeds) -> dict[str, int]:
    """The rows each fused node's X really has, from ORT running the model with those X as outputs."""
    model = onnx.load(str(path))
    xs = {n.name: n.input[0] for n in model.graph.node if n.op_type == OP_TYPE}
    for x in dict.fromkeys(xs.values()):
        model.graph.output.append(helper.make_empty_tensor_value_info(x))
    session = create_session(model, "cpu", as_written=True, quiet=True)
    names = [o.name for o in session.get_outputs()]
    values = dict(zip(names, session.run(None, feeds)))
    return {node: int(np.prod(values[x].shape[:-1])) for node, x in xs.items()}


@pytest.mark.parametrize("name", ["tiny_bert.onnx", "tiny_gpt2.onnx", "convnext_torchscript_op14.onnx",
                                  "gpt2_torchscript_op14_ortopt.onnx", "t5_torchscript_op15_ortfp16.onnx",
                                  "vit_torchscript_op15_ortfp16.onnx", "clip_text_torchscript_op16_ortfp16.onnx",
                                  "gpt_neox_torchscript_op16.onnx"])
def test_row_counts_are_the_rows_ort_runs(fused_models, name):
    """Worked out from the input shapes alone, through ORT's contrib ops, Attention, MultiHeadAttention (with
    3-D or, after a rotary embedding, 4-D heads) and GPT-2's Reshape→Gemm→Reshape: the same rows as running the
    model gives."""
    from onnxfuse.inputs import random_inputs

    path = fused_models[name]
    model = model_io.load_model(path)
    nodes = tuning.tunable_nodes(model)
    plan = tune_plan(model, {}, [1, 3])
    rows = tuning.row_counts(model, nodes, plan, base_dir_of(path))
    for batch, shapes in plan:
        actual = _actual_rows(path, random_inputs(model, shapes))
        assert {n: r[batch] for n, r in rows.items()} == actual, batch


def test_rows_through_multihead_attention_with_4d_heads():
    """After a rotary embedding MHA reads key and value as heads [B, N, L, H]: its output is [B, S, N·H], so a
    Reshape to [-1, N·H] behind it keeps B·S rows (not B·S·N, as H for the width would give)."""
    from onnx import TensorProto as T
    from onnx import numpy_helper

    w = numpy_helper.from_array(np.ones((16, 8), np.float32), "W")
    flat = numpy_helper.from_array(np.array([-1, 8], np.int64), "flat")
    nodes = [helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["y"], domain="com.microsoft", num_heads=2),
             helper.make_node("Reshape", ["y", "flat"], ["z"]),
             helper.make_node(OP_TYPE, ["z", "W"], ["out"], domain="ai.onnxfuse", approximate="none", transB=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("q", T.FLOAT, ["B", "S", 8]),
                                           helper.make_tensor_value_info("k", T.FLOAT, ["B", 2, "S", 4]),
                                           helper.make_tensor_value_info("v", T.FLOAT, ["B", 2, "S", 4])],
                              [helper.make_tensor_value_info("out", T.FLOAT, None)], [w, flat])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1),
                                                    helper.make_opsetid("ai.onnxfuse", 1)])
    nodes = tuning.tunable_nodes(model)
    plan = [(3, {"q": (3, 5, 8), "k": (3, 2, 5, 4), "v": (3, 2, 5, 4)})]
    assert tuning.row_counts(model, nodes, plan) == {nodes[0].name: {3: 15}}


def test_rows_follow_shape_and_batch(fused_models):
    path = fused_models["tiny_bert.onnx"]
    model = model_io.load_model(path)
    nodes = tuning.tunable_nodes(model)
    plan = tune_plan(model, {"input_ids": (1, 16)}, [2, 4])
    rows = tuning.row_counts(model, nodes, plan, base_dir_of(path))
    assert all(r == {2: 32, 4: 64} for r in rows.values())
    default = tuning.row_counts(model, nodes, tune_plan(model, {}, None))  # 1,8,32 × 128 tokens
    assert all(r == {1: 128, 8: 1024, 32: 4096} for r in default.values())


# --- measuring (injected), writing, metadata ---------------------------------------------------------
def test_identical_nodes_share_one_measurement(fused_models):
    path = fused_models["convnext_torchscript_op14.onnx"]
    model = model_io.load_model(path)
    nodes = tuning.tunable_nodes(model)
    plan = tune_plan(model, {}, [1, 8])
    rows = tuning.row_counts(model, nodes, plan)
    calls: list = []
    tunings = tuning.measure_all(nodes, rows, _fake_measure(calls))
    distinct = {(n.shape, m) for n in nodes for m in rows[n.name].values()}
    assert len(nodes) == 3 and len(calls) == len(distinct) == 4 and set(calls) == distinct
    for t in tunings:
        assert t.max_rows, t.paths == compress([(m, x.choice) for m, x in t.times.items()])


def test_apply_tuning_writes_the_contract_and_nothing_else(fused_models):
    path = fused_models["tiny_bert.onnx"]
    model = model_io.load_model(path)
    before = model.SerializeToString()
    nodes = tuning.tunable_nodes(model)
    plan = tune_plan(model, {"input_ids": (1, 32)}, [1, 2, 8])  # 32, 64, 256 rows
    tunings = tuning.measure_all(nodes, tuning.row_counts(model, nodes, plan), _fake_measure([]))
    record = tuning.tuning_record(tunings, DEVICE, plan, {"reps": 30, "provider": "cuda"})
    out = tuning.apply_tuning(model, tunings, record)
    assert model.SerializeToString() == before  # pure
    for old, new in zip(model.graph.node, out.graph.node):
        added = {a.name: helper.get_attribute_value(a) for a in new.attribute if a.name in tuning.ATTRIBUTES}
        kept = [a for a in new.attribute if a.name not in tuning.ATTRIBUTES]
        assert kept == list(old.attribute)
        if new.op_type == OP_TYPE:
            assert added == {"tuned_device": SIGNATURE.encode(), "tuned_max_rows": [64, 256],
                             "tuned_paths": [b"fallback", b"fused"]}
        else:
            assert added == {}
    assert out.graph.initializer == model.graph.initializer and out.graph.input == model.graph.input
    meta = json.loads({p.key: p.value for p in out.metadata_props}[tuning.METADATA_KEY])
    assert meta["schema"] == tuning.SCHEMA and meta["device"]["signature"] == SIGNATURE
    assert meta["device"]["gpu"] == "NVIDIA Test GPU" and meta["device"]["compute_capability"] == "9.0"
    assert set(meta["device"]) == {"signature", "gpu", "compute_capability", "cuda", "driver", "onnxruntime", "onnxfuse"}
    assert meta["batches"] == [1, 2, 8]
    entry = meta["nodes"][nodes[0].name]
    assert (entry["K"], entry["N"], entry["dtype"], entry["transB"]) == (32, 128, "float32", 1)
    assert [m["M"] for m in entry["measurements"]] == [32, 64, 256]
    assert [m["choice"] for m in entry["measurements"]] == ["fallback", "fallback", "fused"]
    assert all(m["fused_us"] > 0 and m["fallback_us"] > 0 and m["ort_unfused_us"] > 0 for m in entry["measurements"])
    # tuning again replaces the table and the record, never adds a second
    again = tuning.apply_tuning(out, tunings[:1], record)
    fused = [n for n in again.graph.node if n.op_type == OP_TYPE]
    assert [sum(a.name == "tuned_paths" for a in n.attribute) for n in fused] == [1, 1]
    assert sum(p.key == tuning.METADATA_KEY for p in again.metadata_props) == 1


def test_read_tuning_is_what_inspect_shows(fused_models):
    model = model_io.load_model(fused_models["tiny_bert.onnx"])
    assert tuning.read_tuning(model) is None
    nodes = tuning.tunable_nodes(model)
    plan = tune_plan(model, {}, [1])
    tunings = tuning.measure_all(nodes, tuning.row_counts(model, nodes, plan), _fake_measure([]))
    out = tuning.apply_tuning(model, tunings, tuning.tuning_record(tunings, DEVICE, plan, {}))
    shown = tuning.read_tuning(out)
    assert shown["device"]["signature"] == SIGNATURE
    assert [(n["tuned_device"], n["tuned_max_rows"], n["tuned_paths"]) for n in shown["nodes"]] == [
        (SIGNATURE, [128], ["fused"])] * 2
    assert shown["nodes"][0]["measurements"][0]["M"] == 128
    next(p for p in out.metadata_props if p.key == tuning.METADATA_KEY).value = "{not json"
    assert "not a tuning record" in tuning.read_tuning(out)["note"]


# --- the command ----------------------------------------------------------------------------------------
def _run(args, monkeypatch, calls=None, fake=_fake_measure):
    import onnxfuse.measure.path_bench as path_bench

    monkeypatch.setattr(path_bench, "gpu_measurer", _measurer([] if calls is None else calls, fake))
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_tune_writes_the_model_and_the_json(tmp_path, fused_models, monkeypatch):
    src = fused_models["tiny_bert.onnx"]
    before = src.read_bytes()
    out = tmp_path / "tuned.onnx"
    calls: list = []
    r = _run(["tune", src, "-o", out, "--batch", "1,8", "--shape", "input_ids=1,8", "--json", "-"], monkeypatch, calls)
    assert r.exit_code == 0, r.output
    report = json.loads(r.output)
    assert report["device"]["signature"] == SIGNATURE and report["batches"] == [1, 8]
    assert report["measurements"] == len(calls) == 2  # two identical nodes, two row counts
    for entry in report["nodes"].values():
        assert entry["rows"] == {"1": 8, "8": 64} and entry["tuned_paths"] == ["fallback"]
    assert src.read_bytes() == before
    tuned = onnx.load(str(out))
    assert json.loads(tuned.metadata_props[-1].value)["nodes"] == report["nodes"]
    table = _run(["tune", src, "-o", out, "--batch", "1,8,32", "--no-progress"], monkeypatch)
    assert table.exit_code == 0, table.output
    assert SIGNATURE in table.output and "choices" in table.output and "M ≤ 1024: fused" not in table.output
    assert "every M: fused" in table.output and "× faster than fallback" in table.output
    assert "ORT's unfused ops were faster" not in table.output


def test_tune_keeps_external_data_external(tmp_path, fused_models, monkeypatch):
    src = fused_models["bert_torchscript_op17.onnx"]
    assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in onnx.load(str(src), load_external_data=False).graph.initializer)
    out = tmp_path / "tuned.onnx"
    r = _run(["tune", src, "-o", out, "--batch", "1", "--json", "-"], monkeypatch)
    assert r.exit_code == 0, r.output
    assert (tmp_path / "tuned.onnx.data").is_file()
    tuned = onnx.load(str(out), load_external_data=False)
    assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in tuned.graph.initializer)
    a, b = onnx.load(str(src)), onnx.load(str(out))
    assert [onnx.numpy_helper.to_array(t).tobytes() for t in a.graph.initializer] == \
           [onnx.numpy_helper.to_array(t).tobytes() for t in b.graph.initializer]


def test_inspect_shows_the_tuning(tmp_path, fused_models, monkeypatch):
    out = tmp_path / "tuned.onnx"
    assert _run(["tune", fused_models["tiny_bert.onnx"], "-o", out, "--batch", "1,32", "--json", "-"],
                monkeypatch).exit_code == 0
    r = CliRunner().invoke(main, ["inspect", str(out), "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    shown = json.loads(r.output[r.output.index("{"):])["tuning"]
    assert shown["device"]["signature"] == SIGNATURE
    assert [n["tuned_max_rows"] for n in shown["nodes"]] == [[4096], [4096]]
    table = CliRunner().invoke(main, ["inspect", str(out)], catch_exceptions=False)
    assert f"CUDA path tuning, measured on {SIGNATURE}" in table.output.replace("\n", " ") or SIGNATURE in table.output
    assert "≤ 4096: fused (and beyond)" in table.output


def test_tune_with_gemv_measured_writes_it_within_its_rows(tmp_path, fused_models, monkeypatch):
    """tiny_bert at 1 and 4 tokens: 1, 4 (gemv wins), 16 (gemv runs and loses) and 64 rows (gemv does not
    run); the report, the table, the metadata, the nodes and inspect all carry it."""
    out = tmp_path / "tuned.onnx"
    r = _run(["tune", fused_models["tiny_bert.onnx"], "-o", out, "--batch", "1,4,16", "--shape", "input_ids=1,1",
              "--json", "-"], monkeypatch, fake=_fake_measure_gemv)
    assert r.exit_code == 0, r.output
    report = json.loads(r.output)
    for entry in report["nodes"].values():
        by_m = {m["M"]: m for m in entry["measurements"]}
        assert [m["choice"] for m in entry["measurements"]] == ["gemv", "gemv", "fallback"]
        assert by_m[1]["gemv_us"] < by_m[1]["fallback_us"] and by_m[16]["gemv_us"] > by_m[16]["fallback_us"]
        assert (entry["tuned_max_rows"], entry["tuned_paths"]) == ([4, 16], ["gemv", "fallback"])
    tuned = onnx.load(str(out))
    onnx.checker.check_model(tuned, full_check=True)
    meta = json.loads({p.key: p.value for p in tuned.metadata_props}[tuning.METADATA_KEY])
    assert meta["schema"] == "onnxfuse.tuning/2" and meta["nodes"] == report["nodes"]
    assert meta["settings"] == report["settings"] == {"reps": 30, "provider": "cuda", "gemv_max_rows": 16}
    for node in (n for n in tuned.graph.node if n.op_type == OP_TYPE):
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        assert (attrs["tuned_max_rows"], attrs["tuned_paths"]) == ([4, 16], [b"gemv", b"fallback"])
    table = _run(["tune", fused_models["tiny_bert.onnx"], "-o", out, "--batch", "1,4,16", "--shape",
                  "input_ids=1,1", "--no-progress"], monkeypatch, fake=_fake_measure_gemv)
    assert table.exit_code == 0, table.output
    assert "gemv" in table.output and "M ≤ 4: gemv, beyond: fallback" in table.output
    assert "× faster than fallback" in table.output and "gemv unavailable" not in table.output
    shown = CliRunner().invoke(main, ["inspect", str(out)], catch_exceptions=False)
    assert shown.exit_code == 0 and "≤ 4: gemv" in shown.output and "≤ 16: fallback (and beyond)" in shown.output


def test_tune_with_gemv_best_at_every_row_count_ends_on_a_path_for_any_rows(tmp_path, fused_models, monkeypatch):
    """Only 1 and 8 rows measured, gemv fastest at both: the table ends on the faster of the others at 8."""
    out = tmp_path / "tuned.onnx"
    r = _run(["tune", fused_models["tiny_bert.onnx"], "-o", out, "--batch", "1,8", "--shape", "input_ids=1,1",
              "--json", "-"], monkeypatch, fake=_fake_measure_gemv)
    assert r.exit_code == 0, r.output
    for entry in json.loads(r.output)["nodes"].values():
        assert [m["choice"] for m in entry["measurements"]] == ["gemv", "gemv"]
        assert (entry["tuned_max_rows"], entry["tuned_paths"]) == ([8, 9], ["gemv", "fallback"])


def test_tune_says_why_gemv_has_no_time(tmp_path, fused_models, monkeypatch):
    """Where gemv could not run at M <= 16 (a library without it), the table says why; above 16 it is n/a."""
    def fake(calls):
        def measure(shape, m):
            return PathTimes(10.0, 12.0, 20.0, gemv_note=("cuda_path='gemv' is not known" if m <= 16 else None))
        return measure

    out = tmp_path / "tuned.onnx"
    r = _run(["tune", fused_models["tiny_bert.onnx"], "-o", out, "--batch", "1,32", "--shape", "input_ids=1,1",
              "--no-progress"], monkeypatch, fake=fake)
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())  # (the why column wraps)
    assert text.count("gemv unavailable") == 1 and "is not known" in text  # at M=1 only, not at M=32
    from onnxfuse.cli.render import _why

    assert _why(PathTimes(10.0, 12.0, 20.0, gemv_note="cuda_path='gemv' is not known"), 1) == (
        "1.20× faster than fallback; gemv unavailable (cuda_path='gemv' is not known); 2.00× over ORT unfused")
    assert _why(PathTimes(10.0, 12.0, 20.0, gemv_note="not applicable"), 17) == (
        "1.20× faster than fallback; 2.00× over ORT unfused")
    assert _why(PathTimes(10.0, 12.0, None, gemv_us=5.0), 4) == "2.00× faster than fused"
    assert _why(PathTimes(10.0, 8.0, None, gemv_us=8.0), 4) == "tie with gemv: fallback goes first"
    assert _why(PathTimes(10.0, None, None, gemv_us=10.0), 4) == (
        "tie: the one-kernel path; fallback unavailable (None)")


def test_read_tuning_reads_schema_1_records(fused_models):
    """A model tuned before gemv: its record (no gemv_us) is shown as written, with no note; an unknown
    schema is shown too, with a note."""
    model = model_io.load_model(fused_models["tiny_bert.onnx"])
    nodes = tuning.tunable_nodes(model)
    plan = tune_plan(model, {}, [1])
    tunings = tuning.measure_all(nodes, tuning.row_counts(model, nodes, plan), _fake_measure([]))
    record = tuning.tuning_record(tunings, DEVICE, plan, {})
    for entry in record["nodes"].values():  # what onnxfuse.tuning/1 wrote
        for m in entry["measurements"]:
            del m["gemv_us"]
    out = tuning.apply_tuning(model, tunings, record | {"schema": "onnxfuse.tuning/1"})
    shown = tuning.read_tuning(out)
    assert "note" not in shown and shown["device"]["signature"] == SIGNATURE
    assert all("gemv_us" not in m and m["fused_us"] > 0 for n in shown["nodes"] for m in n["measurements"])
    future = tuning.read_tuning(tuning.apply_tuning(model, tunings, record | {"schema": "onnxfuse.tuning/9"}))
    assert "onnxfuse.tuning/9" in future["note"] and future["nodes"][0]["measurements"]


def test_inspect_shows_schema_1_and_2_measurements(tmp_path, fused_models):
    model = model_io.load_model(fused_models["tiny_bert.onnx"])
    nodes = tuning.tunable_nodes(model)
    plan = tune_plan(model, {"input_ids": (1, 1)}, [1, 32])
    tunings = tuning.measure_all(nodes, tuning.row_counts(model, nodes, plan), _fake_measure_gemv([]))
    record = tuning.tuning_record(tunings, DEVICE, plan, {})
    v2 = tmp_path / "v2.onnx"
    onnx.save(tuning.apply_tuning(model, tunings, record), str(v2))
    for entry in record["nodes"].values():
        for m in entry["measurements"]:
            del m["gemv_us"]
    v1 = tmp_path / "v1.onnx"
    onnx.save(tuning.apply_tuning(model, tunings, record | {"schema": "onnxfuse.tuning/1"}), str(v1))
    shown = {}
    for path in (v1, v2):
        r = CliRunner().invoke(main, ["inspect", str(path)], catch_exceptions=False, terminal_width=300)
        assert r.exit_code == 0, r.output
        shown[path] = " ".join(r.output.split())
    assert "1: 5.004 / 4.003 / 2.002;" in shown[v2] and "32: 5.131 / 4.105 / n/a" in shown[v2]
    assert "1: 5.004 / 4.003;" in shown[v1] and "32: 5.131 / 4.105" in shown[v1] and "n/a" not in shown[v1]


def test_tuned_model_passes_the_checker(tmp_path, fused_models, monkeypatch):
    out = tmp_path / "tuned.onnx"
    assert _run(["tune", fused_models["tiny_bert.onnx"], "-o", out, "--batch", "1"], monkeypatch).exit_code == 0
    onnx.checker.check_model(str(out), full_check=True)


@pytest.mark.parametrize("args, message", [
    (["--batch", "0,8"], "--batch '0,8': expected positive integers"),
    (["--batch", "x"], "--batch 'x': expected positive integers"),
    (["--shape", "nope=1,2"], "--shape names nope, which the model does not take"),
    (["--shape", "input_ids=1"], "--shape input_ids: 1 dims given"),
])
def test_bad_batch_or_shape_is_exit_2(tmp_path, fused_models, args, message):
    out = tmp_path / "tuned.onnx"
    r = cli("tune", fused_models["tiny_bert.onnx"], "-o", out, *args)
    assert r.returncode == 2 and r.stderr.strip().startswith("onnxfuse: error: ") and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not out.exists()


def test_unoptimized_model_is_exit_2_saying_run_optimize(tmp_path):
    r = cli("tune", os.path.join(ROOT, "sample_models/tiny_bert.onnx"), "-o", tmp_path / "t.onnx")
    assert r.returncode == 2 and "run `onnxfuse optimize` on it first" in r.stderr
    assert os.listdir(tmp_path) == []


@pytest.mark.skipif(cuda_usable(), reason="this machine has a usable GPU: tune would run")
def test_no_gpu_is_exit_2_saying_what_tune_needs(tmp_path, fused_models):
    r = cli("tune", fused_models["tiny_bert.onnx"], "-o", tmp_path / "t.onnx")
    assert r.returncode == 2, r.stderr
    line, = r.stderr.strip().splitlines()
    assert line.startswith("onnxfuse: error: tune needs CUDAExecutionProvider and a GPU")
    assert os.listdir(tmp_path) == []


def test_signature_from_a_library_without_the_symbol_says_too_old():
    libm = ctypes.util.find_library("m")
    with pytest.raises(BadInputError, match="too old: it has no OnnxfuseCudaDeviceSignature"):
        cuda_device_signature(libm)


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler to build a stand-in library")
def test_signature_is_the_librarys_string_or_a_clear_no_device(tmp_path):
    """Through ctypes exactly as the contract declares it: the library's own string, or (nonzero) an error."""
    src = tmp_path / "sig.c"
    src.write_text('#include <string.h>\n#include <stddef.h>\n'
                   'int OnnxfuseCudaDeviceSignature(int device, char* buf, size_t len) {\n'
                   '  if (device != 0) return 1;\n'
                   '  strncpy(buf, "NVIDIA H200|sm_90|cuda 13.0|onnxfuse 0.6.0", len); buf[len - 1] = 0; return 0; }\n')
    lib = tmp_path / "libsig.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    assert cuda_device_signature(str(lib), 0) == "NVIDIA H200|sm_90|cuda 13.0|onnxfuse 0.6.0"
    with pytest.raises(BadInputError, match="reports no CUDA device 1 .*tuning needs CUDAExecutionProvider and a GPU"):
        cuda_device_signature(str(lib), 1)


def test_path_models_compute_the_same_block(rng):
    """The models tune times are one computation (on the CPU kernel, which ignores cuda_path)."""
    from onnxfuse.measure.path_bench import path_models

    for shape in (NodeShape(48, 80, F32, 1, "none"), NodeShape(48, 80, F32, 0, "tanh"),
                  NodeShape(48, 80, F32, 1, "sigmoid", 1.702)):
        models = path_models(shape, 5)
        x = rng.standard_normal((5, 48)).astype(np.float32)
        ys = {k: create_session(m, "cpu", quiet=True).run(None, {"X": x})[0] for k, m in models.items()}
        for key in ("fused", "fallback", "gemv"):
            np.testing.assert_allclose(ys[key], ys["ort_unfused"], rtol=1e-5, atol=1e-5)
        assert {k: _cuda_paths(m) for k, m in models.items()} == {
            "fused": [b"fused"], "fallback": [b"fallback"], "gemv": [b"gemv"], "ort_unfused": []}
    # gemv runs at most 16 rows: above, there is no model for it
    assert set(path_models(NodeShape(48, 80, F32, 1, "none"), GEMV_MAX_ROWS)) == {"fused", "fallback", "gemv", "ort_unfused"}
    assert set(path_models(NodeShape(48, 80, F32, 1, "none"), GEMV_MAX_ROWS + 1)) == {"fused", "fallback", "ort_unfused"}


def _cuda_paths(model: bytes) -> list:
    return [helper.get_attribute_value(a) for n in onnx.load_from_string(model).graph.node
            for a in n.attribute if a.name == "cuda_path"]


def test_path_times_measures_each_model():
    """The sessions, IO binding and interleaved timing tune uses, run on the CPU provider (one path there)."""
    from onnxfuse.measure.path_bench import path_times
    from onnxfuse.measure.timing import TimingPolicy

    policy = TimingPolicy(warmup_runs=1, warmup_s=0.0, min_reps=3, budget_s=0.2, block_s=0.005)
    times = path_times(NodeShape(64, 96, F32, 1, "tanh"), 16, policy, provider="cpu")
    assert times.fused_us > 0 and times.fallback_us > 0 and times.gemv_us > 0 and times.ort_unfused_us > 0
    assert times.fallback_note is None and times.gemv_note is None and times.ort_note is None
    assert times.choice == min(("fused", "fallback", "gemv"), key=times.path_us().__getitem__)
    above = path_times(NodeShape(64, 96, F32, 1, "tanh"), 17, policy, provider="cpu")
    assert above.fused_us > 0 and above.fallback_us > 0 and above.gemv_us is None
    assert above.gemv_note == "not applicable: gemv runs at most 16 rows (M=17)" and above.choice != "gemv"


# --- on a GPU -------------------------------------------------------------------------------------------
@pytest.mark.skipif(not cuda_usable(), reason="no usable CUDA device here (tune measures on the GPU)")
def test_tune_on_the_gpu(tmp_path, fused_models):
    out = tmp_path / "tuned.onnx"
    r = cli("tune", fused_models["tiny_bert.onnx"], "-o", out, "--batch", "1,8", "--reps", "10", "--json", "-")
    if r.returncode == 2 and "too old" in r.stderr:
        pytest.skip(f"the op library predates the tuning contract: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    signature = cuda_device_signature()
    assert report["device"]["signature"] == signature
    tuned = onnx.load(str(out))
    for node in (n for n in tuned.graph.node if n.op_type == OP_TYPE):
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["tuned_device"].decode() == signature
        assert _obeys_the_contract(attrs["tuned_max_rows"], [p.decode() for p in attrs["tuned_paths"]])
    for entry in report["nodes"].values():
        for m in entry["measurements"]:
            ran = {p: m[f"{p}_us"] for p in ("fused", "fallback", "gemv") if m[f"{p}_us"] is not None}
            assert m["fused_us"] > 0 and m["choice"] == min(ran, key=ran.__getitem__)
            assert (m["gemv_us"] is not None or m.get("gemv_note")) if m["M"] <= GEMV_MAX_ROWS else m["gemv_us"] is None
    # the tuned model runs and computes what the untuned one does
    from onnxfuse.inputs import random_inputs

    feeds = random_inputs(tuned, {})
    a = create_session(str(fused_models["tiny_bert.onnx"]), "cuda").run(None, feeds)
    b = create_session(str(out), "cuda").run(None, feeds)
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=5e-3, atol=5e-3)
