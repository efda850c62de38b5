"""The rewriter on real exporter output: tiny random-weight Hugging Face models exported by torch.onnx
(TorchScript and dynamo exporters, opsets 14-20, one with external data), some of them after ONNX Runtime's
transformers optimizer and its float16 converter; freshly initialised TorchScript exports (merged duplicate
initializers read through Identity); Keras encoders through tf2onnx (tensordot); and files ONNX Runtime
runs but onnx.checker rejects (the raw float16 converter's out-of-order nodes, onnx-graphsurgeon's outputs
typed without a shape).

The models and ``models/manifest.json`` are made by ``scripts/make_test_models.py`` and
``scripts/make_tf_test_models.py``; these tests need neither torch nor tensorflow. Per model: the number of fused blocks and of refusals the architecture implies, the activation
each block must get, ``onnx.checker``, idempotence, and outputs equal to the unmodified model's (ONNX Runtime
CPU, graph optimizations off) when run with the op library's CPU kernel, at two input shapes.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxfuse import domain  # noqa: F401  (registers the FusedLinearGelu schema before onnx.checker runs)
from onnxfuse.domain import DOMAIN, OP_TYPE

MODELS = Path(__file__).resolve().parent / "models"
SAMPLES = Path(__file__).resolve().parent.parent / "sample_models"
MANIFEST = json.loads((MODELS / "manifest.json").read_text())
ENTRIES = {m["file"]: m for m in MANIFEST["models"]}

# (rtol, atol relative to the reference output's largest magnitude), by the model's compute dtype.
TOLERANCE = {"float32": (1e-4, 1e-4), "float16": (1e-2, 1e-2)}

# Activation ops that must all be gone once every block is fused (the anchors of the GELU forms).
GELU_OPS = {("", "Erf"), ("", "Gelu"), ("com.microsoft", "Gelu"), ("com.microsoft", "BiasGelu"),
            ("com.microsoft", "FastGelu"), ("com.microsoft", "QuickGelu")}

# The ops the generator counts in each manifest entry's "ops".
_MANIFEST_OPS = {"Gelu", "Erf", "Tanh", "Sigmoid", "Pow", "com.microsoft.Gelu", "com.microsoft.BiasGelu",
                 "com.microsoft.FastGelu", "com.microsoft.QuickGelu", "Gemm", "MatMul"}

# Known gaps of the rewriter on these models: (file, aspect) -> the exact reason. Every entry is a strict
# xfail, so it turns into a failure as soon as the gap is closed and the mark must be removed.
# mixed_precision/ holds the float16 converter's outputs with the GELU op kept in float32 between Casts
# (its float32 or Cast-wrapped biases included): no gap left there.
KNOWN_GAPS: dict[tuple[str, str], str] = {}


def _params(aspect: str, files=None):
    out = []
    for file in files or sorted(ENTRIES):
        reason = KNOWN_GAPS.get((file, aspect))
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        out.append(pytest.param(file, id=file.removesuffix(".onnx"), marks=marks))
    return out


# --- shared work, done once per model -------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _original(file: str) -> onnx.ModelProto:
    return onnx.load(str(MODELS / file))  # external data, if any, loaded inline


@functools.lru_cache(maxsize=None)
def _loaded(file: str) -> onnx.ModelProto:
    """The model as optimize reads it: nodes put in topological order where the file has them out of it."""
    from onnxfuse.pipeline import load_input

    return load_input(MODELS / file, load_external_data=True)


@functools.lru_cache(maxsize=None)
def _fused(file: str):
    from onnxfuse.fuse import fuse_model

    return fuse_model(_loaded(file))


def _gelu(blocks) -> list:
    """The report's blocks or refusals but the attention, embedding, Gemm-bias and row-guard rules': the manifest
    counts Linear+GELU blocks; the others' per-model expectations live in test_patterns_attention.py,
    test_patterns_embedding_norm.py, test_patterns_skip_norm_bias.py and test_patterns_guard_into_skip_norm.py."""
    return [b for b in blocks if b.rule not in ("attention", "embeddings-into-skip-norm", "gemm-bias-into-skip-norm",
                                                "guard-into-skip-norm")]


def _key(n: onnx.NodeProto) -> tuple[str, str]:
    return ("" if n.domain == "ai.onnx" else n.domain, n.op_type)


def _ops(model: onnx.ModelProto) -> Counter:
    return Counter(_key(n) for n in model.graph.node)


def _fused_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.domain == DOMAIN and n.op_type == OP_TYPE]


def _attr(node: onnx.NodeProto, name: str, default):
    for a in node.attribute:
        if a.name == name:
            value = onnx.helper.get_attribute_value(a)
            return value.decode() if isinstance(value, bytes) else value
    return default


def _symbolic_axes(model: onnx.ModelProto) -> dict[str, set[int]]:
    out = {}
    for i in model.graph.input:
        dims = i.type.tensor_type.shape.dim
        out[i.name] = {k for k, d in enumerate(dims) if not d.HasField("dim_value")}
    return out


def _feeds(file: str, alternate: bool) -> dict[str, np.ndarray]:
    """Seeded inputs from the manifest's specs; ``alternate``: every dynamic axis one shorter, to show the
    fused model keeps the original's dynamic shapes."""
    entry = ENTRIES[file]
    rng = np.random.default_rng(zlib.crc32(f"{file}:{alternate}".encode()))
    symbolic = _symbolic_axes(_original(file))
    feeds = {}
    for spec in entry["inputs"]:
        shape = list(spec["shape"])
        if alternate:
            shape = [d - 1 if k in symbolic[spec["name"]] else d for k, d in enumerate(shape)]
        if spec["kind"] == "int":
            a = rng.integers(spec["low"], spec["high"], size=shape)
        elif spec["kind"] == "ones":
            a = np.ones(shape)
        else:
            a = rng.standard_normal(shape)
        feeds[spec["name"]] = a.astype(spec["dtype"])
    return feeds


def _reference_session(model: onnx.ModelProto) -> ort.InferenceSession:
    """The unmodified model as written: ORT CPU, graph optimizations off."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _fused_session(model) -> ort.InferenceSession:
    """The fused model as users run it: the op library registered, ORT's default optimizations, CPU."""
    from onnxfuse.runtime import create_session

    return create_session(model, providers=["CPUExecutionProvider"], intra_op_num_threads=1)


def _assert_close(file: str, got: list[np.ndarray], want: list[np.ndarray]) -> None:
    rtol, atol_rel = TOLERANCE[ENTRIES[file]["dtype"]]
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and g.dtype == w.dtype, (k, g.shape, w.shape, g.dtype, w.dtype)
        scale = max(1.0, float(np.abs(w.astype(np.float64)).max()))
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol_rel * scale,
                                   err_msg=f"{file}: output {k}")


# --- the manifest itself ---------------------------------------------------------------------------


# Folders of tests/models/ with a manifest of their own (legacy/: the older exporters' models of issue #54,
# tests/test_legacy_exports.py), which this manifest does not list.
OWN_MANIFESTS = ("legacy",)


def _ours(path: Path) -> bool:
    return path.relative_to(MODELS).parts[0] not in OWN_MANIFESTS


def test_manifest_lists_every_committed_model_and_nothing_else():
    assert all((MODELS / folder / "manifest.json").is_file() for folder in OWN_MANIFESTS)
    on_disk = {p.relative_to(MODELS).as_posix() for p in MODELS.rglob("*.onnx") if _ours(p)}
    assert on_disk == set(ENTRIES)
    data = {p.relative_to(MODELS).as_posix() for p in MODELS.rglob("*.data") if _ours(p)}
    assert data == {str(Path(f).parent / m["external_data"]).removeprefix("./")
                    for f, m in ENTRIES.items() if m["external_data"]}


def test_manifest_covers_the_issue_matrix():
    families = {m["family"] for m in ENTRIES.values()}
    assert {"bert", "gpt2", "vit", "clip_text", "bloom", "convnext", "t5", "gpt_neox", "distilbert"} <= families
    assert {m["exporter"] for m in ENTRIES.values()} == {"torchscript", "dynamo", "tf2onnx"}
    assert {m["post"] for m in ENTRIES.values()} == {"raw", "ort-optimizer", "ort-fp16", "ort-fp16-converter",
                                                     "graphsurgeon"}
    assert {m["opset"] for m in ENTRIES.values()} == set(range(13, 21)) | {23}  # 23: ONNX's Attention op
    assert any(m["external_data"] for m in ENTRIES.values())
    # Freshly initialised TorchScript exports (the framework's own init, no randomising) of these families.
    fresh = {m["family"] for m in ENTRIES.values() if m.get("variant", "").startswith("framework-default")}
    assert fresh == {"bert", "gpt2", "vit", "clip_text", "distilbert", "bloom", "gpt_neox"}
    # Keras Dense through tf2onnx (tensordot), with and without a bias Add, at opsets 13-17.
    keras = [m for m in ENTRIES.values() if m["exporter"] == "tf2onnx"]
    assert {m["opset"] for m in keras} >= {13, 17} and len(keras) >= 2
    # Families without an ORT optimizer or dynamo export are recorded with the reason, not silently absent.
    torch_families = families - {m["family"] for m in keras}
    for fam in torch_families - {m["family"] for m in ENTRIES.values() if m["post"] != "raw"}:
        assert MANIFEST["ort_optimizer_unsupported"].get(fam), fam
    for fam in torch_families - {m["family"] for m in ENTRIES.values() if m["exporter"] == "dynamo"}:
        assert MANIFEST["dynamo_unsupported"].get(fam), fam


def test_models_are_small():
    sizes = {str(p): p.stat().st_size for p in [q for q in MODELS.rglob("*") if _ours(q)] + list(SAMPLES.rglob("*"))
             if p.is_file()}  # (legacy/ keeps a budget of its own: tests/test_legacy_exports.py)
    assert all(s < 1_000_000 for s in sizes.values()), {k: v for k, v in sizes.items() if v >= 1_000_000}
    assert sum(sizes.values()) < 11_200_000  # 11.08 MB with GPT-Neo's four layers, the static dynamo BERT, Mistral,
    # GPTBigCode, ModernBERT, GPT-J


@pytest.mark.parametrize("file", _params("opset"))
def test_model_is_what_the_manifest_says(file):
    entry, model = ENTRIES[file], _original(file)
    opset = {o.domain: o.version for o in model.opset_import}
    assert opset.get("", opset.get("ai.onnx")) == entry["opset"]
    assert [i.name for i in model.graph.input] == [s["name"] for s in entry["inputs"]]
    fp16 = any(t.data_type == onnx.TensorProto.FLOAT16 for t in model.graph.initializer)
    assert fp16 == (entry["dtype"] == "float16")
    assert not any(n.domain == DOMAIN for n in model.graph.node)
    counted = {(f"{d}." if d else "") + op: n for (d, op), n in _ops(model).items()}
    assert {k: counted[k] for k in entry["ops"]} == entry["ops"]
    assert not set(entry["ops"]) ^ {k for k in counted if k in _MANIFEST_OPS}


# --- the rewriter on each model --------------------------------------------------------------------


@pytest.mark.parametrize("file", _params("count"))
def test_fused_count(file):
    entry, result = ENTRIES[file], _fused(file)
    nodes = _fused_nodes(result.model)
    assert (len(_gelu(result.report.fused)), len(nodes)) == (entry["expected_fused"], entry["expected_fused"]), (
        f"{entry['expected_fused_why']}; report: {result.report.fused_by_form}, "
        f"refused: {[(r.rule, r.reason) for r in result.report.refused]}")


@pytest.mark.parametrize("file", _params("refusals"))
def test_refusals(file):
    entry, report = ENTRIES[file], _fused(file).report
    refused = _gelu(report.refused)
    assert len(refused) == entry["expected_refused"], [(r.rule, r.reason, r.nodes) for r in refused]


@pytest.mark.parametrize("file", _params("activation"))
def test_every_gelu_is_gone_and_each_block_has_the_architectures_activation(file):
    entry, original, fused = ENTRIES[file], _original(file), _fused(file).model
    nodes = _fused_nodes(fused)
    before, after = _ops(original), _ops(fused)
    if entry["expected_fused"] == 0:  # no GELU in the architecture (LLaMA's SiLU-gated MLP): nothing taken
        assert not nodes
        assert all(before[k] == after[k] for k in GELU_OPS | {("", "Tanh"), ("", "Sigmoid")})
        return
    assert nodes
    assert {_attr(n, "approximate", "none") for n in nodes} == {entry["expected_approximate"]}
    if entry["expected_approximate"] == "sigmoid":
        assert all(abs(_attr(n, "alpha", 1.702) - 1.702) < 1e-6 for n in nodes)
    left = {k: v for k, v in _ops(fused).items() if k in GELU_OPS}
    assert not left, left
    # Each block took exactly one activation anchor with it: an Erf / Gelu / contrib GELU op, or the
    # Tanh / Sigmoid of its own form (never one of another form, such as BERT's tanh pooler).
    taken = {k: before[k] - after[k] for k in GELU_OPS | {("", "Tanh"), ("", "Sigmoid")} if before[k] != after[k]}
    assert sum(taken.values()) == len(nodes), taken
    if entry["expected_approximate"] != "tanh":
        assert ("", "Tanh") not in taken, taken
    if entry["expected_approximate"] != "sigmoid":
        assert ("", "Sigmoid") not in taken, taken


def _ort_ops_out_of_the_default_domain(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A copy where default-domain nodes onnx has no schema for at the model's opset (ORT's transformers
    optimizer writes LayerNormalization and SimplifiedLayerNormalization there, which only ORT runs) are
    put in the com.microsoft domain, which onnx.checker leaves to ORT; everything else is checked."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    version = {o.domain: o.version for o in out.opset_import}.get("", None)
    moved = 0
    for n in out.graph.node:
        if n.domain in ("", "ai.onnx"):
            try:
                onnx.defs.get_schema(n.op_type, version, "")
            except onnx.defs.SchemaError:
                n.domain = "com.microsoft"
                moved += 1
    if moved and not any(o.domain == "com.microsoft" for o in out.opset_import):
        out.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    return out, moved


@pytest.mark.parametrize("file", _params("checker"))
def test_checker(file):
    from onnxfuse import model_io

    expected = ENTRIES[file].get("input_checker_error")
    if expected is not None:
        # ONNX Runtime runs it, onnx.checker does not: the output may keep the input's own error, never add one.
        assert expected in model_io.checker_error(_original(file))
        before, after = model_io.checker_error(_loaded(file)), model_io.checker_error(_fused(file).model)
        assert after == before, (before, after)
        return
    original, fused = _original(file), _fused(file).model
    original_moved, moved = _ort_ops_out_of_the_default_domain(original)
    fused_moved, moved_after = _ort_ops_out_of_the_default_domain(fused)
    # a rewrite may replace such a node (the embeddings' LayerNormalization), never write one
    assert moved_after <= moved
    assert moved == 0 or ENTRIES[file]["post"] != "raw"  # only ORT's optimizer writes such nodes
    onnx.checker.check_model(original_moved, full_check=True)
    onnx.checker.check_model(fused_moved, full_check=True)
    if not moved:
        onnx.checker.check_model(fused, full_check=True)
        onnx.shape_inference.infer_shapes(fused, check_type=True, strict_mode=True)


# What a rewrite may leave dead besides the blocks: the constant chains in front of their weights and biases
# (Identity, Cast), the tensordot's flattening Reshape with its shape computation, an attention mask's
# construction, and the token types an embedding sum reads as one table row (a buffer of zeros gathered by
# the position ids, GatherElements).
_FEEDERS = {"Identity", "Cast", "Reshape", "Shape", "Gather", "Concat", "Constant", "Slice", "Unsqueeze", "Squeeze",
            # the attention mask's index arithmetic (transformers' sdpa_mask: Range over positions, the
            # padding lookup, the causal compare, broadcast to [B, 1, S, L]), dead once MHA reads the mask
            "Range", "Where", "And", "Mul", "Add", "Div", "Max", "ConstantOfShape", "Expand", "Flatten",
            "Equal", "GreaterOrEqual", "LessOrEqual", "GatherND", "GatherElements",
            "Greater",  # Mistral's sliding window: kv_idx > q_idx - window
            "Abs",  # ModernBERT's local window: |q - k| <= window / 2
            # the scores' scale where the exporter did not fold it: 1/√(head size) from constants or the
            # query's shape (Falcon; do_constant_folding=False), folded into the op's scale
            "Sqrt", "CastLike",
            # GPT-Neo's buffer slice bounds: key_length - query_length, dynamo's min(max_positions, S)
            "Sub", "Min"}


@pytest.mark.parametrize("file", _params("untouched"))
def test_only_the_blocks_and_what_fed_them_alone_leave_the_graph(file):
    original, result = _loaded(file), _fused(file)
    replaced = {name for b in result.report.fused for name in b.replaced}
    kept = {n.SerializeToString() for n in result.model.graph.node}
    gone = [n for n in original.graph.node if n.SerializeToString() not in kept]
    gone_names = {n.name for n in gone}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in original.graph.node:
        for t in n.input:
            readers.setdefault(t, []).append(n)
    outputs = {o.name for o in original.graph.output}
    for n in gone:
        if n.name in replaced:
            continue
        assert n.op_type in _FEEDERS, (n.name, n.op_type)
        for t in n.output:
            assert t not in outputs and all(r.name in gone_names for r in readers.get(t, [])), (n.name, t)
    # Every fused node reads stored constants, never an Identity/Cast of one.
    initializers = {t.name for t in result.model.graph.initializer}
    constants = {o for n in result.model.graph.node if n.op_type == "Constant" for o in n.output}
    producers = {o: n for n in result.model.graph.node for o in n.output}
    for node in _fused_nodes(result.model):
        for t in node.input[1:]:
            if t in initializers or t in constants:
                continue
            assert producers[t].op_type not in ("Identity", "Cast"), (node.name, t, producers[t].op_type)


@pytest.mark.parametrize("file", _params("idempotent"))
def test_idempotent(file):
    from onnxfuse.fuse import fuse_model

    first = _fused(file)
    again = fuse_model(first.model)
    assert len(again.report.fused) == 0
    assert again.model.SerializeToString(deterministic=True) == first.model.SerializeToString(deterministic=True)


@pytest.mark.parametrize("file", _params("outputs"))
def test_outputs_match_the_original(file):
    reference, fused = _reference_session(_original(file)), _fused_session(_fused(file).model)
    for alternate in (False, True):
        feeds = _feeds(file, alternate)
        _assert_close(file, fused.run(None, feeds), reference.run(None, feeds))


# --- external data through optimize_file ---------------------------------------------------------


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


EXTERNAL = sorted(f for f, m in ENTRIES.items() if m["external_data"])


@pytest.mark.parametrize("file", _params("external", EXTERNAL))
def test_external_data_model_optimizes_to_external_data(file, tmp_path):
    from onnxfuse.pipeline import optimize_file

    entry = ENTRIES[file]
    src = MODELS / file
    src_data = src.parent / entry["external_data"]
    raw = onnx.load(str(src), load_external_data=False)
    assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in raw.graph.initializer)
    before = (_sha(src), _sha(src_data))

    out = tmp_path / "optimized.onnx"
    report = optimize_file(src, out)
    assert len(_gelu(report.fused)) == entry["expected_fused"]
    assert (_sha(src), _sha(src_data)) == before, "the input model or its data was modified"

    written = onnx.load(str(out), load_external_data=False)
    external = [t for t in written.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert external, "the optimized model keeps no external data"
    locations = {dict((kv.key, kv.value) for kv in t.external_data)["location"] for t in external}
    for loc in locations:
        data = (tmp_path / loc).resolve()
        assert data.parent == tmp_path.resolve() and data.is_file(), loc
        assert data != src_data.resolve()
    assert len(_fused_nodes(written)) == entry["expected_fused"]

    feeds = _feeds(file, False)
    _assert_close(file, _fused_session(str(out)).run(None, feeds), _reference_session(_original(file)).run(None, feeds))


# --- the samples users get -----------------------------------------------------------------------


def test_sample_readme_names_every_sample():
    readme = (SAMPLES / "README.md").read_text()
    samples = sorted(p.name for p in SAMPLES.glob("*.onnx"))
    assert samples and sorted(MANIFEST["samples"]) == samples
    for name in samples:
        assert name in readme


@pytest.mark.parametrize("sample", sorted(MANIFEST["samples"]))
def test_sample_is_its_test_model(sample):
    """Each sample is a committed test model under a friendlier name (so the tests above cover it)."""
    src = MANIFEST["samples"][sample] + ".onnx"
    a = onnx.load(str(SAMPLES / sample))
    b = _original(src)
    assert a.graph.SerializeToString(deterministic=True) == b.graph.SerializeToString(deterministic=True)
    assert not any(t.data_location == onnx.TensorProto.EXTERNAL for t in a.graph.initializer)
    assert os.path.getsize(SAMPLES / sample) < 1_000_000


@pytest.mark.parametrize("sample", _params("readme", sorted(MANIFEST["samples"])))
def test_sample_readme_commands(sample, tmp_path):
    """What sample_models/README.md tells users to run: inspect, optimize, compare (default inputs), exit 0."""
    from click.testing import CliRunner

    from onnxfuse.cli import main

    src, out = SAMPLES / sample, tmp_path / "fused.onnx"
    expected = ENTRIES[MANIFEST["samples"][sample] + ".onnx"]["expected_fused"]
    runner = CliRunner()
    for args in (["inspect", str(src)], ["optimize", str(src), "-o", str(out)], ["compare", str(src), str(out)]):
        result = runner.invoke(main, args)
        assert result.exit_code == 0, (args[0], result.output)
    assert len(_fused_nodes(onnx.load(str(out)))) == expected
