"""The attention rule: self-attention → ``com.microsoft.Attention`` (Q, K and V packed into one projection)
or ``com.microsoft.MultiHeadAttention`` (the projections fed separately).

On the committed exports (tests/models, transformers' default sdpa attention, both exporters): how many
attentions each architecture has and which the rule fuses or refuses (and why), and outputs equal to the
original's on ONNX Runtime's CPU kernel, fp32 and fp16, with a different padding in every batch row (right,
left, none, all) and causal models. On hand-built graphs: every form the rule accepts (proved masks, and
additive biases fed as they are: (1 - mask)·c, T5's position bias, tables), and the negative cases
(probabilities that escape, softmax over another axis, masks that are not padding or causal and not
finite, biases scaled after they are added, of another type or shape, head counts that disagree), which
must stay bit-identical and be refused with the right reason. Packing: the three-MatMul and the
MatMul-and-Split (GPT-2) forms, weights read by other nodes, external data, and the projections it must
leave separate (of different tensors, a run-time weight, a projection read elsewhere, a Split in another
order), whose attention is still fused, into MultiHeadAttention.

ORT 1.31's CPU MultiHeadAttention and Attention run float32 and float16 (both are tested here).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from onnxfuse.fuse import fuse_model
from onnxfuse.patterns import default_rules
from onnxfuse.patterns.attention import FLOAT32_MIN, Attention
from onnxfuse.domain import DOMAIN, FILL_MASKED_ROWS
from onnxfuse.runtime import get_library_path

MODELS = Path(__file__).resolve().parent / "models"
ENTRIES = {m["file"]: m for m in json.loads((MODELS / "manifest.json").read_text())["models"]}
RULES = (Attention(),)
MHA = ("com.microsoft", "MultiHeadAttention")
PACKED = ("com.microsoft", "Attention")

# Per committed model: (attentions fused, the reason (or reasons) every other attention is refused, or None).
# Layers × 1 from the architecture (2 layers in every tiny config; T5: 2 encoder self, 2 decoder self and
# 2 cross attentions); what is not fused is refused for a reason of its form, never silently.
# After ORT's optimizer and float16 converter the hidden states are typed by shape inference up to ORT's
# contrib ops and from there by the rule's own forward pass (symbolic.Evaluator: normalisations, Casts,
# GPT-2's c_attn Split with its constant sizes, SkipSimplifiedLayerNormalization's sum output); T5's first
# blocks return the key heads as the cache (T5_CACHE).
# T5's first layers return the key heads as the cache; its decoder's position bias reads the query heads' shape
T5_CACHE = "a cache output or a shape read outside the attention"
EXPECTED = {
    "bert_dynamo_op18.onnx": (2, None),
    "bert_dynamo_op18_static.onnx": (2, None),  # static shapes: the mask a constant-shaped additive bias
    "bert_dynamo_op18_ortopt.onnx": (2, None),
    "bert_dynamo_op18_ortfp16.onnx": (2, None),
    # ONNX's own Attention op: no Softmax for this rule (OnnxAttention takes it: test_patterns_onnx_attention)
    "bert_dynamo_op23.onnx": (0, None),
    "bert_torchscript_op14.onnx": (2, None),
    "bert_freshinit_torchscript_op17.onnx": (2, None),
    "bert_freshinit_torchscript_op17_gsunshaped.onnx": (2, None),
    "bert_torchscript_op14_ortopt.onnx": (2, None),
    "bert_torchscript_op14_ortopt_nobiasgelu.onnx": (2, None),
    "bert_torchscript_op14_ortfp16.onnx": (2, None),
    # the scale as unfolded constants: Sqrt(head size), evaluated
    "bert_torchscript_op16_nofold.onnx": (2, None),
    "bert_torchscript_op17.onnx": (2, None),
    "bert_torchscript_op20.onnx": (2, None),
    # ALiBi: baddbmm, the scores are no Q·Kᵀ MatMul alone; refused with the path from the product (the ALiBi
    # term added, reshaped, the mask added)
    "bloom_dynamo_op19.onnx": (0, "the scores reach the Softmax from their MatMul through"),
    "bloom_torchscript_op17.onnx": (0, "the scores reach the Softmax from their MatMul through"),
    "bloom_freshinit_torchscript_op17.onnx": (0, "the scores reach the Softmax from their MatMul through"),
    "clip_text_dynamo_op18.onnx": (2, None),
    "clip_text_freshinit_torchscript_op17.onnx": (2, None),
    "clip_text_torchscript_op16.onnx": (2, None),
    "clip_text_torchscript_op16_ortopt.onnx": (2, None),
    "clip_text_torchscript_op16_ortfp16.onnx": (2, None),
    "convnext_dynamo_op18.onnx": (0, None),
    "convnext_torchscript_op14.onnx": (0, None),
    "distilbert_freshinit_torchscript_op17.onnx": (2, None),
    "gpt2_dynamo_op18.onnx": (2, None),
    "gpt2_freshinit_torchscript_op17.onnx": (2, None),
    # the scale is evaluated (Sqrt of a CastLike constant), but the unoptimized graph's mask is not followed
    "gpt2_dynamo_op19_nofold.onnx": (0, "the mask is not provably padding or causal"),
    "gpt2_torchscript_op14.onnx": (2, None),
    "gpt2_torchscript_op14_ortopt.onnx": (2, None),
    "gpt2_torchscript_op14_ortfp16.onnx": (2, None),
    # GPT-NeoX: the rotary embedding computes the query and key heads (partial rotary: rotated and passed
    # halves concatenated); MultiHeadAttention reads the heads the graph computes (use_cache=False: no
    # present key/values are returned)
    "gpt_neox_dynamo_op20.onnx": (2, None),
    "gpt_neox_fast_torchscript_op18.onnx": (2, None),
    "gpt_neox_freshinit_torchscript_op17.onnx": (2, None),
    "gpt_neox_tanh_dynamo_op20.onnx": (2, None),
    "gpt_neox_torchscript_op16.onnx": (2, None),
    "gpt_neox_torchscript_op16_ortopt.onnx": (2, None),
    "gpt_neox_torchscript_op16_ortfp16.onnx": (2, None),
    # rotary heads, grouped key/value heads repeated to the query's (repeat_kv), the cache's key and value
    # concatenated onto nothing (a one-operand Concat) in the TorchScript exports: the heads go to
    # MultiHeadAttention as the graph computes them
    "llama_torchscript_op17.onnx": (2, None),
    "llama_dynamo_op18.onnx": (2, None),
    # without dynamic_shapes the exporter's optimizer folds repeat_kv's Reshape into the key's [B·N, L, H]
    # one: Kᵀ proved from the targets' dimensions, the key heads reshaped again in front of the op
    "llama_dynamo_op18_static.onnx": (2, None),
    "gemma_torchscript_op17.onnx": (2, None),
    "gemma_dynamo_op20.onnx": (2, None),
    "phi_torchscript_op17.onnx": (2, None),  # a partial rotary: half of each head rotated
    # Mistral: LLaMA's heads, the causal mask bounded by a sliding window of 4 keys (k > q - 4), rebuilt
    "mistral_torchscript_op17.onnx": (2, None),
    "mistral_dynamo_op18.onnx": (2, None),
    # GPTBigCode: the query's heads reshaped from a split of the unsqueezed [B, 1, S, ·] c_attn output (not a
    # [B, S, D] projection: read as heads computed per head), the one key/value head [B, 1, L, H] expanded
    "gpt_bigcode_torchscript_op17.onnx": (2, None),
    # ModernBERT: q, k, v unbound from one [B, S, 3, N, H] split, rotary; layer 0 global (padding), layers 1-2
    # local (|k - q| <= 2 beside the padding, rebuilt)
    "modernbert_torchscript_op17.onnx": (3, None),
    # GPT-J: rotary on the [B, S, N, H] split before the heads are transposed; Kᵀ one Transpose 0231 of it
    # (the key heads transposed in front of MHA)
    "gptj_torchscript_op17.onnx": (2, None),
    # Falcon-7B's multi-query heads (one key/value head, expanded in front of MHA); its scale computed at run
    # time from the query's shape
    "falcon_torchscript_op17.onnx": (2, None),
    # GPT-Neo (eager only): Where(slice of its literal causal buffer, Q·Kᵀ, finfo.min), unscaled, plus the
    # padding-and-causal mask; the "local" layers' buffer is banded to 4 keys. Dynamo names the later
    # layers' length Min(16, S) (the buffer's clamp), met by the mask's S in the graph's Add, and shares one
    # slice of each buffer between the two layers that read it.
    "gpt_neo_torchscript_op17.onnx": (4, None),
    "gpt_neo_dynamo_op18.onnx": (4, None),
    # T5: Where(keep, relative position bias, finfo.min), a finite bias fed as attention_bias. The other
    # four blocks' intermediates are read outside them (the first layers' key heads are also the returned
    # cache; the decoder's position bias reads the query heads' shape): the engine's single-use check
    # leaves them alone (rule "single-use", not counted here).
    "t5_torchscript_op15.onnx": (2, T5_CACHE),
    # the second blocks read their residual from SkipSimplifiedLayerNormalization's sum output (followed)
    "t5_torchscript_op15_ortopt.onnx": (2, T5_CACHE),
    "t5_torchscript_op15_ortfp16.onnx": (2, T5_CACHE),
    "vit_dynamo_op20.onnx": (2, None),
    "vit_torchscript_op15.onnx": (2, None),
    "vit_freshinit_torchscript_op17.onnx": (2, None),
    "vit_torchscript_op15_fp16raw.onnx": (2, None),  # ORT's float16 converter alone: shapes still known
    "vit_torchscript_op15_ortopt.onnx": (2, None),
    "vit_torchscript_op15_ortopt_geluapprox.onnx": (2, None),
    "vit_torchscript_op15_ortfp16.onnx": (2, None),
    "vit_torchscript_op15_ortfp16io.onnx": (2, None),
    # Keras through tf2onnx: Dense + LayerNorm blocks, no attention
    "keras_dense_tanh_tf2onnx_op15.onnx": (0, None),
    "keras_dense_tanh_tf2onnx_op15_ortopt.onnx": (0, None),
    "keras_encoder_freshinit_tf2onnx_op17.onnx": (0, None),
    "keras_encoder_tf2onnx_op13.onnx": (0, None),
    "mixed_precision/bert_torchscript_op14_ortfp16_keepbiasgelu.onnx": (2, None),
    "mixed_precision/gpt2_torchscript_op14_ortfp16_keepfastgelu.onnx": (2, None),
}
FUSED_MODELS = sorted(f for f, (n, _) in EXPECTED.items() if n)
# Every fused attention of the committed models packs Q, K and V (BERT/ViT/CLIP/T5: three MatMuls; GPT-2:
# c_attn and its Split) but the external-data model's (test_external_data_model) and these, which keep
# their separate projections (and MultiHeadAttention): (how many, why).
SEPARATE_QKV = {
    # the one cross-attention T5 fuses: its query is the decoder's, its key and value the encoder's
    "t5_torchscript_op15.onnx": (1, "projections of different tensors"),
    "t5_torchscript_op15_ortopt.onnx": (1, "projections of different tensors"),
    "t5_torchscript_op15_ortfp16.onnx": (1, "projections of different tensors"),
    # do_constant_folding=False: each weight reaches its MatMul through a Transpose node, no constant to pack
    "bert_torchscript_op16_nofold.onnx": (2, "is not a constant"),
    # the rotary embedding's heads, read as the graph computes them (no projection to pack)
    **{f: (2, "computed per head") for f in ENTRIES
       if f.startswith(("gpt_neox_", "llama_", "gemma_", "phi_", "falcon_", "mistral_", "gpt_bigcode_", "gptj_"))},
    "modernbert_torchscript_op17.onnx": (3, "computed per head"),
}
TOLERANCE = {"float32": 1e-5, "float16": 4e-3}  # relative to the output's largest magnitude


def _load(file: str) -> onnx.ModelProto:
    return onnx.load(MODELS / file, load_external_data=False)


def _fuse(model: onnx.ModelProto, base_dir=None):
    return fuse_model(model, rules=RULES, base_dir=base_dir)


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # compare the graphs as written
    so.log_severity_level = 3
    so.register_custom_ops_library(get_library_path())  # the row guard, FillMaskedRows
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _ops(model: onnx.ModelProto) -> dict:
    out: dict = {}
    for n in model.graph.node:
        out[(n.domain, n.op_type)] = out.get((n.domain, n.op_type), 0) + 1
    return out


def test_every_committed_model_has_an_expectation():
    assert sorted(EXPECTED) == sorted(ENTRIES)


@pytest.mark.parametrize("file", sorted(EXPECTED))
def test_fused_and_refused_per_architecture(file):
    if (MODELS / file).with_suffix(".onnx.data").exists():
        pytest.skip("external-data model: covered by test_external_data_model")
    fused, reason = EXPECTED[file]
    result = _fuse(_load(file))
    blocks = [b for b in result.report.fused if b.rule == "attention"]
    refused = [r for r in result.report.refused if r.rule == "attention"]
    assert len(blocks) == fused, [r.reason for r in refused]
    separate, why = SEPARATE_QKV.get(file, (0, None))
    assert _ops(result.model).get(PACKED, 0) == fused - separate and _ops(result.model).get(MHA, 0) == separate
    assert sum(b.details["qkv"] == "packed" for b in blocks) == fused - separate
    assert all(why in b.details["qkv_separate_because"] for b in blocks if b.details["qkv"] == "separate")
    if fused:
        assert _ops(result.model).get(("", "Softmax"), 0) == _ops(_load(file))[("", "Softmax")] - fused
    if reason is None:
        assert refused == []
    else:
        reasons = (reason,) if isinstance(reason, str) else reason
        assert refused and all(any(x in r.reason for x in reasons) for r in refused), [r.reason for r in refused]


def _saved_and_loaded(result, tmp_path) -> onnx.ModelProto:
    """The fused model as ``optimize`` writes it (external data streamed, packed weights joined while
    saving), read back with its data."""
    result.save(tmp_path / "fused.onnx")
    return onnx.load(tmp_path / "fused.onnx")  # with its external data


def test_external_data_model(tmp_path, rng):
    """A real export with its weights in external data (as torch's dynamo exporter writes every model by
    default): Q, K and V still pack into one projection, joined while the model is saved; every third of
    the packed weight is one stored weight, bit for bit; the outputs match the original's."""
    file = "bert_torchscript_op17.onnx"
    original = onnx.load(MODELS / file, load_external_data=False)
    result = fuse_model(original, rules=RULES, base_dir=MODELS)
    assert [b.rule for b in result.report.fused] == ["attention", "attention"]
    assert all(b.details["qkv"] == "packed" for b in result.report.fused)
    assert _ops(result.model).get(PACKED, 0) == 2 and MHA not in _ops(result.model)
    packed = [n.input[1] for n in result.model.graph.node if n.op_type == "Attention"]
    assert set(packed) <= set(result.derived)  # placeholders until saved: the rewrite loaded no weight
    fused = _saved_and_loaded(result, tmp_path)
    assert (tmp_path / "fused.onnx.data").is_file()
    stored = [numpy_helper.to_array(t, base_dir=str(MODELS)) for t in original.graph.initializer]
    inits = {t.name: numpy_helper.to_array(t) for t in fused.graph.initializer}
    for name in packed:
        weight = inits[name]
        d = weight.shape[1] // 3
        for third in (weight[:, i * d:(i + 1) * d] for i in range(3)):
            assert any(v.shape == third.shape and np.array_equal(v, third) for v in stored)
    reference = onnx.load(MODELS / file)  # with its data
    feeds = _feeds(file, _session(reference), 6, 7, rng)
    assert_outputs_match(_session(reference), _session(fused), feeds, TOLERANCE[ENTRIES[file]["dtype"]])


@pytest.mark.parametrize("threshold", ["all external", "weights external, biases inline"])
def test_projections_in_external_data_pack_while_saving(tmp_path, rng, threshold):
    """The packed weight and bias of weights (and biases) stored as external data: placeholders while the
    model is rewritten (nothing loaded), the stored tensors side by side once saved, bit for bit, whether
    the biases are external too or inline beside external weights."""
    model = _attention(mask="padding", fill=-math.inf)
    # onnx compares sys.getsizeof of the raw bytes: biases [D] ~65 bytes, weights [D, D] ~289
    size = 0 if threshold == "all external" else 128
    onnx.save(onnx.ModelProto.FromString(model.SerializeToString()), tmp_path / "m.onnx", save_as_external_data=True,
              all_tensors_to_one_file=True, location="m.data", size_threshold=size)
    source = onnx.load(tmp_path / "m.onnx", load_external_data=False)
    external = {t.name for t in source.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL}
    assert {"wq", "wk", "wv"} <= external and ({"bq", "bk", "bv"} <= external) == (threshold == "all external")
    result = fuse_model(source, rules=RULES, base_dir=tmp_path)
    (block,) = result.report.fused
    assert block.details["qkv"] == "packed" and block.details["bias"] == "packed"
    node = _fused_node(result.model)
    assert node.op_type == "Attention" and node.input[1] in result.derived
    assert (node.input[2] in result.derived) == (threshold == "all external")
    (tmp_path / "out").mkdir()
    fused = _saved_and_loaded(result, tmp_path / "out")
    stored = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    inits = {t.name: numpy_helper.to_array(t) for t in fused.graph.initializer}
    node = _fused_node(fused)
    np.testing.assert_array_equal(inits[node.input[1]], np.concatenate([stored["wq"], stored["wk"], stored["wv"]], axis=1))
    np.testing.assert_array_equal(inits[node.input[2]], np.concatenate([stored["bq"], stored["bk"], stored["bv"]]))
    assert not {"wq", "wk", "wv", "bq", "bk", "bv"} & set(inits)
    x = rng.standard_normal((3, 5, D)).astype(np.float32)
    mask = np.array([[1] * 5, [1, 1, 0, 0, 0], [0] * 5])
    np.testing.assert_allclose(_run(fused, x, mask), _run(model, x, mask), rtol=1e-5, atol=1e-6)


# --- outputs --------------------------------------------------------------------------------------------
def _padding_masks(batch: int, seq: int, rng: np.random.Generator) -> np.ndarray:
    """A different padding in every row: none, right, left, everything, then random lengths either side."""
    mask = np.ones((batch, seq), np.int64)
    mask[1, seq - 2:] = 0  # right padding
    mask[2, :3] = 0  # left padding: under a causal mask its first rows see no key at all
    mask[3, :] = 0  # all padding: no row sees a key
    for b in range(4, batch):
        n = int(rng.integers(1, seq))
        if b % 2:
            mask[b, n:] = 0
        else:
            mask[b, :seq - n] = 0
    return mask


def _feeds(file: str, sess: ort.InferenceSession, batch: int, seq: int, rng) -> dict:
    entry = ENTRIES[file]
    feeds = {}
    for i in sess.get_inputs():
        spec = next(s for s in entry["inputs"] if s["name"] == i.name)
        if i.name == "attention_mask":
            feeds[i.name] = _padding_masks(batch, seq, rng)
        elif spec["kind"] == "int":
            feeds[i.name] = rng.integers(spec["low"], spec["high"], size=(batch, seq)).astype(spec["dtype"])
        else:
            shape = [batch, *spec["shape"][1:]]
            feeds[i.name] = rng.standard_normal(shape).astype(spec["dtype"])
    return feeds


def _feed_batches(file: str, sess: ort.InferenceSession, batch: int, seq: int, rng) -> list[dict]:
    """``_feeds`` as runs of the model: one, or where the export fixed its shape (a static dynamo export runs its
    example's shape only) the same padding patterns at that sequence length, fed that many rows at a time."""
    fixed = sess.get_inputs()[0].shape
    if not all(isinstance(d, int) for d in fixed):
        return [_feeds(file, sess, batch, seq, rng)]
    rows, seq = fixed
    feeds = _feeds(file, sess, batch - batch % rows, seq, rng)
    return [{k: v[start:start + rows] for k, v in feeds.items()} for start in range(0, batch - batch % rows, rows)]


@pytest.mark.parametrize("file", [f for f in FUSED_MODELS if f != "bert_torchscript_op17.onnx"])
@pytest.mark.parametrize("batch,seq", [(6, 7), (8, 5)])
def test_outputs_match_the_original(file, batch, seq, rng):
    original = _load(file)
    fused = _fuse(original).model
    ref, new = _session(original), _session(fused)
    for feeds in _feed_batches(file, ref, batch, seq, rng):
        assert_outputs_match(ref, new, feeds, TOLERANCE[ENTRIES[file]["dtype"]])


def assert_outputs_match(ref: ort.InferenceSession, new: ort.InferenceSession, feeds: dict, tol: float) -> None:
    """Every output of ``new`` within ``tol`` of ``ref``'s, relative to its largest magnitude; NaN where it is NaN."""
    for name, want, got in zip([o.name for o in ref.get_outputs()], ref.run(None, feeds), new.run(None, feeds)):
        want, got = want.astype(np.float64), got.astype(np.float64)
        assert np.array_equal(np.isnan(want), np.isnan(got)), name
        ok = ~np.isnan(want)
        err = np.max(np.abs(want[ok] - got[ok])) / max(1.0, np.max(np.abs(want[ok])))
        assert err <= tol, f"{name}: {err:.2e}"


@pytest.mark.parametrize("fp16", [False, True], ids=["ortopt", "ortfp16"])
def test_gpt_neo_after_ort_optimizer_fuses_exactly(fp16, rng):
    """GPT-Neo after ORT's transformers optimizer (model type gpt2, as bench/e2e.py runs it: ORT has none of
    its own) and its float16 converter: the no-op Casts of the heads are gone, the buffer's slice reads its
    lengths from the head split itself, and the rebuilt keep lets the whole slice go with the block. In
    float16 the local (banded) layers stay, with their reason; the global ones fuse."""
    from onnxruntime.transformers import optimizer

    file = "gpt_neo_torchscript_op17.onnx"
    cfg = ENTRIES[file]["config"]
    with contextlib.redirect_stdout(io.StringIO()):
        opt = optimizer.optimize_model(str(MODELS / file), model_type="gpt2", num_heads=cfg["num_heads"],
                                       hidden_size=cfg["hidden_size"], opt_level=0)
        if fp16:
            opt.convert_float_to_float16(keep_io_types=True)
    original = opt.model
    result = _fuse(original)
    # in float16 the local layer's band drops keys the mask keeps: refused (_prove_score_keep)
    assert [b.details["qkv"] for b in result.report.fused] == ["packed"] * (2 if fp16 else 4)
    refused = [r.reason for r in result.report.refused if r.rule == "attention"]
    assert len(refused) == (2 if fp16 else 0) and all("a banded literal" in r for r in refused), refused
    fused = {n for b in result.report.fused for n in b.replaced}
    masking = {n.name for n in original.graph.node if n.op_type in ("Softmax", "Where", "Slice") and "h.0" in n.name}
    assert masking <= fused  # the global layer's buffer slices went with its block
    ref, new = _session(original), _session(result.model)
    feeds = _feeds(file, ref, 6, 7, rng)
    want, got = (np.asarray(s.run(None, feeds)[0], np.float64) for s in (ref, new))
    assert np.array_equal(np.isnan(want), np.isnan(got))
    err = np.max(np.abs(want - got)) / max(1.0, np.max(np.abs(want)))
    assert err <= TOLERANCE["float16" if fp16 else "float32"], f"{err:.2e}"


@pytest.mark.parametrize("file", ["gpt_neo_torchscript_op17.onnx", "gpt_neo_dynamo_op18.onnx"])
def test_layers_reading_one_literal_share_one_bias(file):
    """GPT-Neo's four layers read two buffers (causal, banded; each exporter stores each once): the fused model
    keeps both and builds one attention_bias per buffer for the two layers that read it."""
    original = _load(file)
    result = _fuse(original)
    literals = [t.name for t in original.graph.initializer if t.data_type == T.BOOL] + \
        [n.output[0] for n in original.graph.node if n.op_type == "Constant" and n.attribute[0].t.data_type == T.BOOL
         and len(n.attribute[0].t.dims) == 4]
    kept = {t.name for t in result.model.graph.initializer} | {o for n in result.model.graph.node for o in n.output}
    assert len([x for x in literals if x in kept]) == 2
    biases = {node.input[5] for node in result.model.graph.node if (node.domain, node.op_type) in (MHA, PACKED)}
    assert len(biases) == 2


def test_multi_query_heads_are_expanded_in_front_of_mha():
    """Falcon-7B's one key/value head, which the graph's products broadcast over the query's heads: MHA
    broadcasts none, so each is expanded to the query's count, and MHA reads the expansions."""
    result = _fuse(_load("falcon_torchscript_op17.onnx"))
    assert [b.details["broadcast_heads"] for b in result.report.fused] == ["one key/value head expanded to 4"] * 2
    expanded = {n.output[0] for n in result.model.graph.node if n.op_type == "Expand"}
    for node in (n for n in result.model.graph.node if (n.domain, n.op_type) == MHA):
        assert node.input[1] in expanded and node.input[2] in expanded


def test_scale_computed_from_the_query_shape_is_evaluated(rng):
    """torch's sdpa with no scale and a head size not constant at export (Falcon) computes 1/√Shape(q)[-1] and
    its square root in the graph: evaluated in float32 as ORT would, it is the constant form's scale."""
    constant, computed = _attention(), _attention(scale_source="shape")
    (want,) = _fuse(constant).report.fused
    result = _fuse(computed)
    (block,) = result.report.fused
    assert block.details["scale"] == want.details["scale"]
    assert "√scale on Q and Kᵀ" in block.form
    assert not any(n.op_type == "Sqrt" for n in result.model.graph.node)  # the scale's computation went with it
    x = rng.standard_normal((3, 5, D)).astype(np.float32)
    mask = np.array([[1] * 5, [1, 1, 1, 0, 0], [0, 0, 1, 1, 1]])
    np.testing.assert_allclose(_run(result.model, x, mask), _run(computed, x, mask), rtol=1e-5, atol=1e-6)


SCORE_KEEPS = [
    {"where_on_scores": "tril", "mask": "", "seq_len": 5},
    {"where_on_scores": "band", "mask": "padding", "seq_len": 5},
    {"where_on_scores": "tril", "mask": "causal+padding", "where_slice": "from_zero"},  # GPT-Neo, TorchScript
    {"where_on_scores": "band", "mask": "causal+padding", "where_slice": "from_zero"},  # its local layers
    {"where_on_scores": "band", "mask": "causal", "where_slice": "from_zero"},  # unidirectional + the band
    {"where_on_scores": "tril", "mask": "causal+padding", "where_slice": "from_zero", "where_fill": -math.inf},
    # the padding mask's -inf fill hides whole rows: NaN in the graph, 0 after sdpa's guard (FillMaskedRows)
    {"where_on_scores": "band", "mask": "causal+padding", "where_slice": "from_zero", "fill": -math.inf},
    # float16: the causal literal drops only keys the causal mask drops too
    {"where_on_scores": "tril", "mask": "causal+padding", "where_slice": "from_zero", "dtype": T.FLOAT16,
     "where_fill": -65504.0, "fill": -65504.0},
]


@pytest.mark.parametrize("kw", SCORE_KEEPS, ids=lambda kw: "-".join(str(v) for v in kw.values()))
def test_scores_masked_by_a_literal_keep_are_fused_exactly(kw):
    """GPT-Neo's form: Where(C, Q·Kᵀ, fill) [+ mask] is MHA's product plus Where(C, 0, fill) [+ mask] as
    attention_bias, for causal and banded literals, with padding on the left (rows that see no key under
    causality) and on the right, and whole-padding rows."""
    kw = {"fill": FLOAT32_MIN, "guard": False, **kw}
    if kw["fill"] == -math.inf:
        kw["guard"] = True
    model = _attention(**kw)
    result = _fuse(model)
    (block,) = result.report.fused
    assert block.details["score_keep"].startswith("Where(keep, Q·Kᵀ, fill) into attention_bias")
    node = _fused_node(result.model)
    assert _attention_bias(node) and _no_mask_index(node)
    assert not any(n.op_type == "Softmax" for n in result.model.graph.node)
    assert (attr_of(node, "unidirectional") == 1) == (kw["mask"] == "causal")
    rng = np.random.default_rng(3)
    for seq in ([5] if kw.get("seq_len") == 5 else [1, 5, 9]):
        x = rng.standard_normal((4, seq, D)).astype(np.float16 if kw.get("dtype") == T.FLOAT16 else np.float32)
        mask = np.ones((4, seq), np.int64)
        mask[1, : seq // 2] = 0  # left padding: under causality its first rows see no key
        mask[2, seq // 2 + 1:] = 0  # right padding
        mask[3] = 0  # no key at all
        want, got = (np.asarray(_run(m, x, mask), np.float64) for m in (model, result.model))
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        if kw.get("dtype") == T.FLOAT16:
            assert np.max(np.abs(got - want)) <= TOLERANCE["float16"] * max(1.0, np.max(np.abs(want)))
        else:
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def attr_of(node: onnx.NodeProto, name: str):
    found = [helper.get_attribute_value(a) for a in node.attribute if a.name == name]
    return found[0] if found else None


@pytest.mark.parametrize("kw, reason", [
    # scaled after the Where: the fill is scaled too
    ({"where_on_scores": "tril", "mask": "padding", "seq_len": 5, "split_scale": False}, "and then scaled"),
    ({"where_on_scores": "tril", "mask": "", "seq_len": 5, "where_fill": -10000.0}, "with fill -10000"),
    ({"where_on_scores": "upper", "mask": "padding", "seq_len": 5}, "row 0 keeps no key"),
    ({"where_on_scores": "tril", "mask": "causal+padding", "where_slice": "from_one"}, "sliced from 1"),
    ({"where_on_scores": "band", "mask": "causal+padding", "where_slice": "from_zero", "dtype": T.FLOAT16,
      "where_fill": -65504.0, "fill": -65504.0}, "a banded literal"),
])
def test_scores_masked_by_a_keep_not_proved_are_refused_with_the_reason(kw, reason):
    model = _attention(**{"guard": False, "fill": FLOAT32_MIN, **kw})
    result = _fuse(model)
    assert result.report.fused == []
    (refusal,) = [r for r in result.report.refused if r.rule == "attention"]
    assert "Where(keep, Q·Kᵀ, fill)" in refusal.reason and reason in refusal.reason, refusal.reason
    assert result.model.graph.SerializeToString() == model.graph.SerializeToString()


def test_scale_computed_from_the_data_is_refused():
    model = _attention(scale_source="data")
    result = _fuse(model)
    assert result.report.fused == []
    assert any("computed at run time" in r.reason for r in result.report.refused)
    assert result.model.graph.SerializeToString() == model.graph.SerializeToString()


@pytest.mark.parametrize("file", ["llama_torchscript_op17.onnx", "gemma_torchscript_op17.onnx", "phi_torchscript_op17.onnx",
                                  "falcon_torchscript_op17.onnx", "mistral_torchscript_op17.onnx",
                                  "gpt_bigcode_torchscript_op17.onnx", "gptj_torchscript_op17.onnx"])
def test_llama_class_decoders_in_float16(file, rng):
    """ORT's transformers optimizer takes none of these exports, so the float16 form a user gets is its
    float16 converter on the export: still two fused attentions, outputs within float16's tolerance of the
    converted original's, with every row's own padding (left padding and all-padding rows included)."""
    import warnings

    from onnxruntime.transformers.float16 import convert_float_to_float16

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        original = convert_float_to_float16(_load(file), keep_io_types=True)
    result = _fuse(original)
    assert [b.rule for b in result.report.fused] == ["attention", "attention"]
    ref, new = _session(original), _session(result.model)
    feeds = _feeds(file, ref, 6, 7, rng)
    (want,), (got,) = ref.run(None, feeds), new.run(None, feeds)
    want, got = want.astype(np.float64), got.astype(np.float64)
    assert np.array_equal(np.isnan(want), np.isnan(got))
    ok = ~np.isnan(want)
    assert np.max(np.abs(want[ok] - got[ok])) / max(1.0, np.max(np.abs(want[ok]))) <= TOLERANCE["float16"]


@pytest.mark.parametrize("file", ["bert_torchscript_op14.onnx", "gpt2_torchscript_op14.onnx"])
def test_row_guard_is_fill_masked_rows_on_flags_made_once(file, rng):
    # The guard is ai.onnxfuse's FillMaskedRows on the attention op's own output (which ORT may let it write
    # in place), no Where over the whole output; every layer reads the one keep mask [B, 1, S|1, T] the
    # attention's bias is built from, no reduction of it.
    model = _fuse(_load(file)).model
    guards = [n for n in model.graph.node if n.op_type == FILL_MASKED_ROWS]
    producer = {o: n for n in model.graph.node for o in n.output}
    assert len(guards) == 2 and all(g.domain == DOMAIN for g in guards)
    assert all(producer[g.input[0]].op_type in ("Attention", "MultiHeadAttention") for g in guards)
    assert len({g.input[1] for g in guards}) == 1
    assert not [n for n in model.graph.node if n.op_type == "Where" and n.name.endswith("_hidden_rows")]
    assert not {producer[g.input[1]].op_type for g in guards} & {"ReduceSum", "ReduceMax", "Greater", "Reshape"}
    # The attention's output is declared [B, S, D] (named dims): ORT's planner needs both shapes to let the
    # guard write in place, and its own inference loses S in these exports.
    declared = {v.name: v for v in model.graph.value_info}
    assert all(len(declared[g.input[0]].type.tensor_type.shape.dim) == 3 for g in guards)
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    watched = sorted({t for g in guards for t in g.input})
    probe.graph.output.extend(helper.make_empty_tensor_value_info(t) for t in watched)
    sess = _session(probe)
    values = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, _feeds(file, sess, 6, 7, rng))))
    for g in guards:
        flags, y = values[g.input[1]], values[g.input[0]]
        assert flags.dtype == bool and flags.shape in ((6, 1, 7, 7), (6, 1, 1, 7)) and y.shape[:2] == (6, 7)


@pytest.mark.parametrize("level", ["ORT_DISABLE_ALL", "ORT_ENABLE_ALL"])
@pytest.mark.parametrize("file", ["bert_torchscript_op14.onnx", "gpt2_torchscript_op14.onnx"])
def test_every_row_guard_runs_in_place(file, level, capfd, rng):
    """ORT lets each guard write into the attention's output (the declared shape is what its planner needs):
    the op says so, once a node, in ORT's verbose log. A guard that copied would say "copies the kept rows".
    (float32 here: ORT's CPU provider runs float16 attention behind Casts it inserts, which the guard then
    reads; the CUDA sessions of the float16 models are checked by bench/guard_in_place.py.)"""
    model = _fuse(_load(file)).model
    guards = {n.name for n in model.graph.node if n.op_type == FILL_MASKED_ROWS}
    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    so.log_severity_level = 0
    so.register_custom_ops_library(get_library_path())
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    capfd.readouterr()
    sess.run(None, _feeds(file, sess, 6, 7, rng))
    said = dict(re.findall(r"FillMaskedRows node '([^']*)': (runs in place|copies the kept rows)", capfd.readouterr().err))
    assert len(guards) == 2 and said == {name: "runs in place" for name in guards}


def test_fp16_runs_in_float16():
    result = _fuse(_load("bert_dynamo_op18_ortfp16.onnx"))
    fused = [n for n in result.model.graph.node if n.op_type == "Attention"]
    assert len(fused) == 2
    inits = {t.name: t for t in result.model.graph.initializer}
    weight, bias = inits[fused[0].input[1]], inits[fused[0].input[2]]
    assert weight.data_type == bias.data_type == T.FLOAT16 and list(weight.dims) == [32, 96] and list(bias.dims) == [96]


def _fused_node(model: onnx.ModelProto) -> onnx.NodeProto:
    """The one fused attention node (Attention or MultiHeadAttention) of ``model``."""
    (node,) = [n for n in model.graph.node if (n.domain, n.op_type) in (MHA, PACKED)]
    return node


def _attention_bias(node: onnx.NodeProto) -> str:
    """The attention_bias input (the sixth of both ops), or ""."""
    return node.input[5] if len(node.input) > 5 else ""


def _no_mask_index(node: onnx.NodeProto) -> bool:
    """Neither MHA's key_padding_mask (input 4) nor Attention's mask_index (3) and past (4) is given."""
    unused = (4,) if node.op_type == "MultiHeadAttention" else (3, 4)
    return all(len(node.input) <= j or node.input[j] == "" for j in unused)


# --- hand-built graphs ------------------------------------------------------------------------------------
D, N = 8, 2
H = D // N


def _attention(mask: str = "padding", fill: float = -math.inf, guard: bool = True, dtype=T.FLOAT,
               axis: int = -1, escape: bool = False, anti_causal: bool = False, literal_mask: bool = False,
               split_scale: bool = True, key_heads: int = N, query_padding: bool = False,
               bias: str = "", bias_fill: float = FLOAT32_MIN, post_scale: float | None = None,
               seq_len: int | str = "seq", seed: int = 0, projections: str = "three",
               unbiased: bool = False, query_input: bool = False, weight_input: bool = False,
               projection_output: bool = False, tied: bool = False, casts: bool = False,
               scale_source: str = "constant", where_on_scores: str = "", where_fill: float = FLOAT32_MIN,
               where_slice: str = "", window: int = 0, window_form: str = "k>q-w") -> onnx.ModelProto:
    """An sdpa-style self-attention block over x [batch, seq, D] with a mask built as transformers does
    (padding: attention_mask[:, None, None, :]; causal: Range compare), or a literal one.

    ``bias`` adds a term to the scores besides (or instead of) that mask, summed with the mask into one
    bias: the ``(1 - mask) · bias_fill`` padding bias of eager exports ("one_minus": from the int64 mask,
    "one_minus_bool": cast to bool first, "one_minus_reshaped": mask[:, None, None, :] as a Reshape,
    "one_minus_swapped": Mul(c, 1 - m)); "t5": Where(keep padding, relative position bias, bias_fill),
    the bias gathered from a [buckets, heads] table; "table": a constant [N, S, S] table (BEiT/Swin;
    needs an int ``seq_len``); "table_batch2": a [2, N, S, S] one (broadcasts the scores up);
    "float16_input": a float16 graph input. ``post_scale`` multiplies the biased scores.

    ``projections``: "three" MatMuls (BERT) or "split": one [D, 3D] MatMul + Add and a Split into q, k, v
    (GPT-2's c_attn; "split_kqv" reads the parts as k, q, v). ``unbiased``: MatMuls without bias Adds;
    ``query_input``: Q projected from another input x2; ``weight_input``: Wq a graph input;
    ``projection_output``: q_proj also a graph output; ``tied``: Wq also read by a MatMul outside;
    ``casts``: each MatMul reads its own Cast of x. ``scale_source``: the √scale on Q and Kᵀ as a constant,
    computed at run time from the query's shape as torch's sdpa does when the head size is not a constant at
    export ("shape": √(1/√Shape(q)[-1])), or from the data ("data": a ReduceMax of x, no constant).
    ``where_on_scores``: the product masked as Where(C, Q·Kᵀ, ``where_fill``) before the mask is added
    (GPT-Neo's own attention code) with a literal boolean C: "tril" (causal), "band" (two keys: GPT-Neo's
    local layers), "upper" (strictly above the diagonal: row 0 keeps no key at or before itself); scaled
    inside the Where with ``split_scale``, else Div after it. ``where_slice``: "" C is [5, 5] (needs
    ``seq_len=5``); "from_zero": C[:, :, L - S : L, :L] of a [1, 1, 16, 16] buffer, L and S read from
    x's shape (as GPT-Neo's TorchScript export slices its buffer); "from_one": starting at row 1.
    ``window``: the causal keep also bounded from below, a sliding window of that many keys written as
    ``window_form``: "k>q-w" (transformers' ``kv_idx > q_idx - sliding_window``), "q-k<w" (the same
    bound the other way round), "k>=q+w" (a lower bound after the diagonal: keeps no key with the causal
    bound); or the keep's only positional term: "|k-q|<=w" (ModernBERT's local window of 2w + 1 keys),
    "k<=q+w" (an upper bound past the diagonal, nothing below)."""
    rng = np.random.default_rng(seed)
    npdt = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    inits, nodes = [], []

    def const(name, value, dt=None):
        inits.append(numpy_helper.from_array(np.asarray(value, dtype=dt or npdt), name))
        return name

    def node(op, ins, out, **kw):
        nodes.append(helper.make_node(op, ins, [out], name=out, **kw))
        return out

    heads = {"q": N, "k": key_heads, "v": N}
    split, projected = {}, {}
    if projections.startswith("split"):
        w = const("w_qkv", rng.standard_normal((D, 3 * D)) / math.sqrt(D))
        packed = node("Add", [node("MatMul", ["x", w], "qkv_mm"), const("b_qkv", rng.standard_normal(3 * D) * 0.2)],
                      "qkv_proj")
        order = "kqv" if projections == "split_kqv" else "qkv"
        nodes.append(helper.make_node("Split", [packed, const("qkv_sizes", [D] * 3, np.int64)],
                                      [f"{p}_proj" for p in order], name="qkv_split", axis=2))
        projected = {p: f"{p}_proj" for p in "qkv"}
    for p in "qkv":
        if projected:
            proj = projected[p]
        else:
            src = "x2" if query_input and p == "q" else "x"
            if casts:
                src = node("Cast", [src], f"{p}_x", to=dtype)
            w = f"w{p}" if weight_input and p == "q" else const(f"w{p}", rng.standard_normal((D, D)) / math.sqrt(D))
            proj = node("MatMul", [src, w], f"{p}_mm" if not unbiased else f"{p}_proj")
            if not unbiased:
                proj = node("Add", [proj, const(f"b{p}", rng.standard_normal(D) * 0.2)], f"{p}_proj")
        shape = const(f"{p}_shape", [0, 0, heads[p], D // heads[p]], np.int64)
        split[p] = node("Reshape", [proj, shape], f"{p}_split")
    if tied:
        node("MatMul", ["x", "wq"], "tied_use")
    half = const("sqrt_scale", H ** -0.25)
    q = node("Transpose", [split["q"]], "q_heads", perm=[0, 2, 1, 3])
    k = node("Transpose", [split["k"]], "k_t", perm=[0, 2, 3, 1])
    if scale_source == "shape":
        size = node("Gather", [node("Shape", [q], "q_heads_shape"), const("last_axis", -1, np.int64)], "head_size_i", axis=0)
        inv = node("Div", [const("one_f", 1.0), node("Sqrt", [node("Cast", [size], "head_size", to=dtype)], "root")],
                   "inv_root")
        half = node("Sqrt", [node("Cast", [inv], "inv_root_cast", to=dtype)], "sqrt_scale_rt")
    elif scale_source == "data":
        half = node("ReduceMax", ["x"], "sqrt_scale_data", keepdims=0)
    if split_scale:
        q, k = node("Mul", [q, half], "q_scaled"), node("Mul", [k, half], "k_scaled")
    scores = node("MatMul", [q, k], "scores")
    if where_on_scores:
        scores = node("Where", [_score_keep(where_on_scores, where_slice, q, k, const, node), scores,
                                const("where_fill", where_fill)], "scores_masked")
    if not split_scale:
        scores = node("Div", [scores, const("sqrt_d", math.sqrt(H))], "scores_scaled")
    keep = None
    if "padding" in mask:
        as_bool = node("Cast", ["attention_mask"], "mask_bool", to=T.BOOL)
        # attention_mask[:, None, None, :] (keys); [:, None, :, None] masks queries instead
        axes = [1, 3] if query_padding else [1, 2]
        keep = node("Unsqueeze", [as_bool, const("pad_axes", axes, np.int64)], "keep_padding")
    if "causal" in mask:
        seq = node("Squeeze", [node("Shape", ["x"], "x_seq", start=1, end=2)], "seq")
        r = node("Range", [const("zero_i", 0, np.int64), seq, const("one_i", 1, np.int64)], "positions")
        qi = node("Unsqueeze", [r, const("q_axes", [1], np.int64)], "q_idx")
        ki = node("Unsqueeze", [r, const("k_axes", [0], np.int64)], "k_idx")
        causal = node("GreaterOrEqual" if anti_causal else "LessOrEqual", [ki, qi], "keep_causal")
        if window and window_form == "|k-q|<=w":
            causal = node("LessOrEqual", [node("Abs", [node("Sub", [ki, qi], "offset")], "distance"),
                                          const("window", window, np.int64)], "in_window")
        elif window and window_form == "k<=q+w":
            causal = node("LessOrEqual", [ki, node("Add", [qi, const("window", window, np.int64)], "window_end")],
                          "in_window")
        elif window:
            w = const("window", window, np.int64)
            band = {"k>q-w": lambda: node("Greater", [ki, node("Sub", [qi, w], "window_start")], "in_window"),
                    "q-k<w": lambda: node("Less", [node("Sub", [qi, ki], "distance"), w], "in_window"),
                    "k>=q+w": lambda: node("GreaterOrEqual", [ki, node("Add", [qi, w], "window_start")], "in_window"),
                    }[window_form]()
            causal = node("And", [causal, band], "keep_band")
        keep = causal if keep is None else node("And", [keep, causal], "keep")
    if literal_mask:
        keep = const("keep_literal", np.triu(np.ones((5, 5), bool)), np.bool_)
    additive = _additive_term(bias, bias_fill, seq_len, rng, const, node, dtype)
    if keep is not None:
        kept = additive if bias == "t5" else const("zero", 0.0)
        mask_bias = node("Where", [keep, kept, const("fill", fill)], "mask_bias")
        if additive is not None and bias != "t5":
            mask_bias = node("Add", [mask_bias, additive], "score_bias")
        scores = node("Add", [scores, mask_bias], "masked_scores")
    elif additive is not None:
        scores = node("Add", [additive, scores], "biased_scores")
    if post_scale is not None:
        scores = node("Mul", [scores, const("post_scale", post_scale)], "scores_rescaled")
    probs = node("Softmax", [scores], "probs", axis=axis)
    if guard:
        probs = node("Where", [node("IsNaN", [probs], "probs_nan"), const("guard_zero", 0.0), probs], "probs_guarded")
    v = node("Transpose", [split["v"]], "v_heads", perm=[0, 2, 1, 3])
    o = node("MatMul", [probs, v], "context")
    merged = node("Transpose", [o], "context_t", perm=[0, 2, 1, 3])
    node("Reshape", [merged, const("merge_shape", [0, 0, D], np.int64)], "y")
    inputs = [helper.make_tensor_value_info("x", dtype, ["batch", seq_len, D])]
    if query_input:
        inputs.append(helper.make_tensor_value_info("x2", dtype, ["batch", seq_len, D]))
    if weight_input:
        inputs.append(helper.make_tensor_value_info("wq", dtype, [D, D]))
    if "padding" in mask or bias.startswith("one_minus"):
        inputs.append(helper.make_tensor_value_info("attention_mask", T.INT64, ["batch", seq_len]))
    if bias == "float16_input":
        inputs.append(helper.make_tensor_value_info("extra_bias", T.FLOAT16, [1, N, seq_len, seq_len]))
    outputs = [helper.make_tensor_value_info("y", dtype, ["batch", seq_len, D])]
    if escape:
        outputs.append(helper.make_tensor_value_info("probs", dtype, None))
    if projection_output:
        outputs.append(helper.make_tensor_value_info("q_proj", dtype, None))
    if tied:
        outputs.append(helper.make_tensor_value_info("tied_use", dtype, None))
    graph = helper.make_graph(nodes, "attention", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _score_keep(form, sliced, q, k, const, node):
    """The literal keep of ``_attention(where_on_scores=form, where_slice=sliced)``."""
    size = 16 if sliced else 5
    ones = np.ones((size, size), bool)
    buffer = {"tril": np.tril(ones), "band": np.tril(ones) & ~np.tril(ones, -2), "upper": np.triu(ones, 1)}[form]
    if not sliced:
        return const("score_buffer", buffer, np.bool_)
    buffer = const("score_buffer", buffer[None, None], np.bool_)

    def length(t, axis_):  # Shape(t)[axis] as a [1] tensor
        return node("Slice", [node("Shape", [t], f"{t}_shape_{axis_}"), const(f"{t}_from_{axis_}", [axis_], np.int64),
                              const(f"{t}_to_{axis_}", [axis_ + 1], np.int64)], f"{t}_len_{axis_}")

    key_len = query_len = length("x", 1)
    start = node("Sub", [key_len, query_len], "buffer_start") if sliced == "from_zero" else const("buffer_start", [1], np.int64)
    rows = node("Slice", [buffer, start, key_len, const("rows_axis", [2], np.int64)], "buffer_rows")
    return node("Slice", [rows, const("cols_start", [0], np.int64), key_len, const("cols_axis", [3], np.int64)],
                "buffer_keep")


def _additive_term(bias, fill, seq_len, rng, const, node, dtype):
    """The bias term of ``_attention(bias=...)``, or None."""
    if bias.startswith("one_minus"):
        src = node("Cast", ["attention_mask"], "mask_as_bool", to=T.BOOL) if bias == "one_minus_bool" else "attention_mask"
        if bias == "one_minus_reshaped":  # Reshape(mask, [B, 1, 1, T]) from the mask's own shape
            shape = node("Shape", [src], "mask_shape")
            b = node("Slice", [shape, const("b0", [0], np.int64), const("b1", [1], np.int64)], "mask_batch")
            t = node("Slice", [shape, const("t0", [1], np.int64), const("t1", [2], np.int64)], "mask_len")
            target = node("Concat", [b, const("ones", [1, 1], np.int64), t], "mask_4d_shape", axis=0)
            wide = node("Reshape", [src, target], "mask_4d")
        else:
            wide = node("Unsqueeze", [src, const("bias_axes", [1, 2], np.int64)], "mask_4d")
        inverted = node("Sub", [const("one", 1.0), node("Cast", [wide], "mask_float", to=dtype)], "inverted_mask")
        c = const("bias_fill", fill)
        return node("Mul", [c, inverted] if bias == "one_minus_swapped" else [inverted, c], "padding_bias")
    if bias == "t5":  # relative_attention_bias(buckets)[None].permute: [1, N, S, S]
        buckets = const("buckets", rng.integers(0, 8, (seq_len, seq_len)), np.int64)
        gathered = node("Gather", [const("bias_table", rng.standard_normal((8, N))), buckets], "position_bias_sst")
        heads_first = node("Transpose", [gathered], "position_bias_nst", perm=[2, 0, 1])
        return node("Unsqueeze", [heads_first, const("pb_axes", [0], np.int64)], "position_bias")
    if bias in ("table", "table_batch2"):
        lead = (2,) if bias == "table_batch2" else ()
        return const("position_table", rng.standard_normal(lead + (N, seq_len, seq_len)))
    if bias == "float16_input":
        return "extra_bias"
    assert not bias, bias
    return None


def _run(model, x, mask=None):
    feeds = {"x": x}
    if mask is not None and any(i.name == "attention_mask" for i in model.graph.input):
        feeds["attention_mask"] = mask
    return _session(model).run(None, feeds)[0]


ACCEPTED = [
    {"mask": "padding", "fill": -math.inf, "guard": True},  # TorchScript BERT
    {"mask": "padding", "fill": FLOAT32_MIN, "guard": True},  # dynamo BERT
    {"mask": "padding", "fill": -math.inf, "guard": False},
    {"mask": "causal", "fill": -math.inf, "guard": True},  # causal without padding: every row sees its own key
    {"mask": "causal+padding", "fill": FLOAT32_MIN, "guard": True},  # dynamo GPT-2 / CLIP text
    # TorchScript GPT-2 / CLIP text: the rows no key is visible to (left padding) are the guard's 0
    {"mask": "causal+padding", "fill": -math.inf, "guard": True},
    {"mask": "causal+padding", "fill": -math.inf, "guard": False},  # ... or NaN without the guard
    {"mask": "causal+padding", "fill": -math.inf, "dtype": T.FLOAT16},  # GPT-2 after ORT's float16 converter
    {"mask": "causal+padding", "fill": -65504.0, "dtype": T.FLOAT16},
    {"mask": "padding", "fill": -10000.0},  # older exports: a finite fill, added as it is
    {"mask": "none", "guard": False},  # ViT, eager
    {"mask": "padding", "fill": FLOAT32_MIN, "split_scale": False},  # eager: Div(scores, √d)
    {"mask": "padding", "fill": -math.inf, "dtype": T.FLOAT16},
    {"mask": "padding", "fill": -65504.0, "dtype": T.FLOAT16},  # after ORT's float16 converter
    {"mask": "causal", "fill": -65504.0, "dtype": T.FLOAT16},
    # Mistral: causal within a sliding window, with padding; with right padding the last rows' windows hold
    # only padding keys (the guard's rows), with a window of 1 every row sees at most its own key
    {"mask": "causal+padding", "fill": -math.inf, "window": 2},
    {"mask": "causal+padding", "fill": FLOAT32_MIN, "window": 3},  # dynamo Mistral
    {"mask": "causal+padding", "fill": -math.inf, "window": 1, "window_form": "q-k<w"},
    {"mask": "causal+padding", "fill": -math.inf, "window": 2, "dtype": T.FLOAT16},
    {"mask": "causal+padding", "fill": -math.inf, "window": 9},  # wider than the sequence: causal in effect
    # ModernBERT's local layers: |k - q| <= 1 with padding, no causal bound (a row may see only padding)
    {"mask": "causal+padding", "fill": -math.inf, "window": 1, "window_form": "|k-q|<=w"},
    {"mask": "causal+padding", "fill": FLOAT32_MIN, "window": 2, "window_form": "|k-q|<=w"},
]


@pytest.mark.parametrize("magnitude", [3.0, 300.0])  # 300: scores of thousands, fills must still remove keys
@pytest.mark.parametrize("form", ACCEPTED, ids=lambda f: "-".join(f"{k}={v}" for k, v in f.items()))
def test_hand_built_forms_fuse_and_match(form, magnitude, rng):
    model = _attention(**form)
    result = _fuse(model)
    assert [b.rule for b in result.report.fused] == ["attention"], [r.reason for r in result.report.refused]
    mha = _fused_node(result.model)
    assert mha.op_type == "Attention"  # three MatMuls of x: packed
    attrs = {a.name: helper.get_attribute_value(a) for a in mha.attribute}
    npdt = onnx.helper.tensor_dtype_to_np_dtype(form.get("dtype", T.FLOAT))
    # exactly the product of the graph's own constants (√scale twice, rounded to the graph's dtype)
    def rounded(v):
        return float(np.array(v, dtype=npdt))

    factor = rounded(H ** -0.25) ** 2 if form.get("split_scale", True) else 1 / rounded(math.sqrt(H))
    assert attrs["num_heads"] == N and attrs["scale"] == np.float32(factor)
    # causal alone is the op's own causal mode; any padding goes in as the graph's own additive mask
    # (attention_bias, memory-efficient attention), never as a key_padding_mask or mask_index
    assert attrs.get("unidirectional", 0) == int(form["mask"] == "causal")
    assert (_attention_bias(mha) != "") == ("padding" in form["mask"])
    assert _no_mask_index(mha)
    row_guard = any(n.name.endswith("_hidden_rows") for n in result.model.graph.node)
    assert row_guard == ("padding" in form["mask"] and form.get("fill", -math.inf) == -math.inf)
    assert not any(n.op_type == "Softmax" for n in result.model.graph.node)
    if npdt == np.float16:
        # (float16 scores of thousands round differently in the two graphs and flip near-ties of an
        # almost one-hot softmax: a rounding effect, not a masking one, so fp16 runs at unit scale)
        magnitude = 3.0
    x = (rng.standard_normal((6, 5, D)) * magnitude).astype(npdt)
    mask = np.array([[1] * 5, [1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [0] * 5, [0, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    want, got = _run(model, x, mask).astype(np.float64), _run(result.model, x, mask).astype(np.float64)
    assert np.array_equal(np.isnan(want), np.isnan(got))
    ok = ~np.isnan(want)
    tol = 4e-3 if form.get("dtype") == T.FLOAT16 else 1e-5
    assert np.max(np.abs(want[ok] - got[ok])) <= tol * max(1.0, np.max(np.abs(want[ok])))


REFUSED = [
    ({"escape": True}, "graph output"),
    ({"axis": 2}, "Softmax over axis 2"),
    ({"mask": "causal", "anti_causal": True}, "keeps the keys k >= q: neither causal nor a window"),
    ({"query_padding": True}, "neither padding nor causal"),  # mask[b, q]: rows, not keys
    ({"mask": "none", "literal_mask": True}, "literal mask is not modelled"),
    # a lower bound on k - q only within a causal mask (transformers' sliding window) and at most 0
    ({"mask": "causal+padding", "window": 1, "window_form": "k>=q+w"}, "keeps the keys k >= q + 1 and k <= q:"),
    ({"mask": "causal+padding", "window": 1, "window_form": "k<=q+w"}, "keeps the keys k <= q + 1: neither causal"),
    # the band with no padding: MHA has no banded mode, and the -inf bias is not finite
    ({"mask": "causal", "window": 2}, "keeps the keys k >= q - 1 and k <= q with no padding mask"),
    ({"key_heads": 4}, "heads"),
    # the bias must be added to the scaled product: scaled after, it is scaled too
    ({"mask": "none", "bias": "table", "seq_len": 5, "post_scale": 0.5}, "scaled by 0.5 after the bias"),
    ({"mask": "none", "bias": "float16_input", "guard": False}, "the bias is float16, the scores float32"),
    ({"mask": "none", "bias": "table_batch2", "seq_len": 5}, "dimension 0 (2) is not shown to be 1 or the scores'"),
    # ((1 - m)·finfo.min of an int64 mask, not finite for m outside [-1, 2], is read off its values for the mask's
    # 0 and 1: test_patterns_attention_mask_semantics.py)
    # a value-based padding bias under a causal mask of -inf: rows may be hidden entirely
    ({"mask": "causal", "fill": -math.inf, "bias": "one_minus_bool"}, "not shown to be finite"),
    # finfo.min twice (padded future keys) overflows to -inf
    ({"mask": "causal", "fill": FLOAT32_MIN, "bias": "one_minus_bool"}, "not shown to be finite"),
]


@pytest.mark.parametrize("form,reason", REFUSED, ids=[r for _, r in REFUSED])
def test_hand_built_negatives_stay_bit_identical(form, reason):
    model = _attention(**form)
    result = _fuse(model)
    assert result.report.fused == []
    assert [r.rule for r in result.report.refused] == ["attention"] and reason in result.report.refused[0].reason
    assert result.model.SerializeToString() == model.SerializeToString()


ADDITIVE = [
    {"bias": "one_minus", "bias_fill": -10000.0},  # int64 mask: |1 - m| ≤ 2⁶³, times 10⁴ stays finite
    {"bias": "one_minus_swapped", "bias_fill": -1e4},
    {"bias": "one_minus_reshaped", "bias_fill": -10000.0},
    {"bias": "one_minus_bool", "bias_fill": FLOAT32_MIN},  # Cast(bool) first: m ∈ {0, 1}
    {"bias": "one_minus_bool", "bias_fill": -3.4e38},
    {"bias": "one_minus_bool", "bias_fill": -65504.0, "dtype": T.FLOAT16},
    {"bias": "one_minus_bool", "bias_fill": -10000.0, "dtype": T.FLOAT16, "split_scale": False},
    # the sum of a causal Where mask and the padding bias is one bias
    {"bias": "one_minus", "bias_fill": -10000.0, "mask": "causal", "fill": -10000.0},
    {"mask": "causal", "fill": -10000.0},  # a finite causal fill: its own bias, not MHA's causal mode
    {"bias": "t5", "mask": "padding", "fill": FLOAT32_MIN, "seq_len": 5, "split_scale": False},  # T5
    {"bias": "t5", "mask": "padding", "fill": -65504.0, "seq_len": 5, "dtype": T.FLOAT16},
    {"bias": "table", "seq_len": 5},  # BEiT/Swin: a constant relative position table
    {"bias": "table", "seq_len": 5, "post_scale": 1.0},  # scaled by 1 after the bias: nothing to scale
]


@pytest.mark.parametrize("terms, says", [
    (2, "from their MatMul through Add ← Add:"),  # MPNet: the position bias and the mask added one after the other
    ("softcap", "through Add ← Mul ← Tanh ← Div: soft-capped"),  # Gemma 2: mask + c·tanh(s / c)
    ("clamp", "through Max ← Add:"),  # XGLM: max(scores + mask, finfo.min)
    (0, None),  # a Softmax over a graph input, no product near: not an attention, no refusal
])
def test_a_softmax_over_a_product_in_a_form_not_taken_says_why(terms, says):
    """Every attention left as it was gets a reason (README: inspect says why): a Softmax whose input is a
    MatMul's output through a few elementwise or layout ops that the rule does not take is refused with the
    path; any other Softmax is no candidate."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "w")]
    nodes = []
    t = "x"
    if terms:
        nodes.append(helper.make_node("MatMul", ["x", "w"], ["product"]))
        t = "product"
        if terms == "softcap":
            inits.append(numpy_helper.from_array(np.array(50.0, np.float32), "cap"))
            nodes += [helper.make_node("Div", [t, "cap"], ["shrunk"]), helper.make_node("Tanh", ["shrunk"], ["capped"]),
                      helper.make_node("Mul", ["capped", "cap"], ["softcapped"])]
            t, terms = "softcapped", 1
        clamp = terms == "clamp"
        if clamp:
            terms = 1
        for k in range(terms):
            inits.append(numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), f"b{k}"))
            nodes.append(helper.make_node("Add", [t, f"b{k}"], [f"biased{k}"]))
            t = f"biased{k}"
        if clamp:
            inits.append(numpy_helper.from_array(np.array(FLOAT32_MIN, np.float32), "lowest"))
            nodes.append(helper.make_node("Max", [t, "lowest"], ["clamped"]))
            t = "clamped"
    nodes.append(helper.make_node("Softmax", [t], ["y"], axis=-1))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [2, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    result = _fuse(model)
    assert result.report.fused == []
    if says is None:
        assert result.report.refused == []
    else:
        (refused,) = result.report.refused
        assert says in refused.reason and "not a form taken" in refused.reason
    assert result.model.SerializeToString() == model.SerializeToString()


@pytest.mark.parametrize("bad", [None, math.inf], ids=["finite", "inf"])
def test_a_constant_bias_in_external_data_is_read_to_prove_it_finite(tmp_path, rng, bad):
    """torch's dynamo exporter folds a fixed-shape causal mask or a position-bias table into an initializer
    and stores it as external data: its values are read from the model's folder (bounded size) to prove them
    finite, as an inline table's are; an infinite entry still refuses, and the reason calls it a constant."""
    model = _attention(mask="none", bias="table", seq_len=5)
    if bad is not None:
        (table,) = [t for t in model.graph.initializer if t.name == "position_table"]
        values = numpy_helper.to_array(table).copy()
        values[0, 1, 2] = -bad
        table.CopyFrom(numpy_helper.from_array(values, "position_table"))
    onnx.save(onnx.ModelProto.FromString(model.SerializeToString()), tmp_path / "m.onnx", save_as_external_data=True,
              all_tensors_to_one_file=True, location="m.data", size_threshold=0)
    source = onnx.load(tmp_path / "m.onnx", load_external_data=False)
    result = fuse_model(source, rules=RULES, base_dir=tmp_path)
    if bad is not None:
        (refused,) = result.report.refused
        assert "additive bias from a constant" in refused.reason and "not shown to be finite" in refused.reason
        return
    (block,) = result.report.fused
    assert block.details["mask"] == "additive bias"
    (tmp_path / "out").mkdir()
    fused = _saved_and_loaded(result, tmp_path / "out")
    x = rng.standard_normal((3, 5, D)).astype(np.float32)
    np.testing.assert_allclose(_run(fused, x), _run(model, x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("magnitude", [3.0, 300.0])
@pytest.mark.parametrize("form", ADDITIVE, ids=lambda f: "-".join(f"{k}={v}" for k, v in f.items()))
def test_additive_biases_fuse_as_attention_bias_and_match(form, magnitude, rng):
    """Any finite bias of the scores' type is MHA's attention_bias as it is: the graph's own tensor (its
    arithmetic stays in front of the op), expanded to [B|1, N|1, S, T]; no row guard (no row is hidden)."""
    form = {"mask": "none", "guard": True, **form}
    model = _attention(**form)
    result = _fuse(model)
    assert [b.rule for b in result.report.fused] == ["attention"], [r.reason for r in result.report.refused]
    (block,) = result.report.fused
    assert block.details["mask"] == "additive bias" and block.details["mask_input"] == "attention_bias"
    mha = _fused_node(result.model)
    attrs = {a.name: helper.get_attribute_value(a) for a in mha.attribute}
    assert "unidirectional" not in attrs and _attention_bias(mha) != "" and _no_mask_index(mha)
    assert not any(n.name.endswith("_hidden_rows") for n in result.model.graph.node)
    assert not any(n.op_type == "Softmax" for n in result.model.graph.node)
    npdt = onnx.helper.tensor_dtype_to_np_dtype(form.get("dtype", T.FLOAT))
    seq = form.get("seq_len", "seq")
    seq = seq if isinstance(seq, int) else 5
    if npdt == np.float16:
        magnitude = 3.0  # (as in test_hand_built_forms_fuse_and_match)
    x = (rng.standard_normal((6, seq, D)) * magnitude).astype(npdt)
    mask = np.array([[1] * 5, [1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [0] * 5, [0, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    want, got = _run(model, x, mask).astype(np.float64), _run(result.model, x, mask).astype(np.float64)
    assert not np.isnan(want).any() and not np.isnan(got).any()
    tol = 4e-3 if npdt == np.float16 else 1e-5
    assert np.max(np.abs(want - got)) <= tol * max(1.0, np.max(np.abs(want)))


# --- packed Q/K/V -----------------------------------------------------------------------------------------
def _matches(model, fused, dtype=T.FLOAT, rng=None, magnitude=3.0):
    """The fused model's outputs are the original's on ORT's CPU kernels (every output, NaN where it is)."""
    npdt = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    rng = rng or np.random.default_rng(1)
    x = (rng.standard_normal((6, 5, D)) * magnitude).astype(npdt)
    mask = np.array([[1] * 5, [1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [0] * 5, [0, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    feeds = {"x": x, "x2": x[::-1].copy(), "attention_mask": mask, "wq": rng.standard_normal((D, D)).astype(npdt)}
    names = {i.name for i in model.graph.input}
    feeds = {k: v for k, v in feeds.items() if k in names}
    assert_same_outputs(model, fused, feeds, dtype)


def assert_same_outputs(model, fused, feeds, dtype=T.FLOAT):
    """Every output of ``fused`` is ``model``'s on ORT's CPU kernels: NaN exactly where it is, the rest within
    the dtype's tolerance of the largest value."""
    tol = 4e-3 if dtype == T.FLOAT16 else 1e-5
    for want, got in zip(_session(model).run(None, feeds), _session(fused).run(None, feeds)):
        want, got = want.astype(np.float64), got.astype(np.float64)
        assert np.array_equal(np.isnan(want), np.isnan(got))
        ok = ~np.isnan(want)
        assert np.max(np.abs(want[ok] - got[ok])) <= tol * max(1.0, np.max(np.abs(want[ok])))


@pytest.mark.parametrize("dtype", [T.FLOAT, T.FLOAT16])
@pytest.mark.parametrize("mask", ["none", "padding", "causal", "causal+padding"])
def test_three_projections_pack_into_one_weight(mask, dtype):
    """BERT/ViT/CLIP: the three weights side by side [Wq | Wk | Wv] and the biases likewise, exactly (a
    concatenation of the stored values); the three MatMuls, Adds and their constants are gone."""
    model = _attention(mask=mask, fill=-math.inf, dtype=dtype)
    result = _fuse(model)
    (block,) = result.report.fused
    assert block.details["qkv"] == "packed" and block.details["qkv_form"] == "three MatMuls"
    node = _fused_node(result.model)
    assert node.op_type == "Attention" and node.input[0] == "x"
    stored = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    inits = {t.name: numpy_helper.to_array(t) for t in result.model.graph.initializer}
    np.testing.assert_array_equal(inits[node.input[1]], np.concatenate([stored["wq"], stored["wk"], stored["wv"]], axis=1))
    np.testing.assert_array_equal(inits[node.input[2]], np.concatenate([stored["bq"], stored["bk"], stored["bv"]]))
    assert inits[node.input[1]].dtype == onnx.helper.tensor_dtype_to_np_dtype(dtype)
    assert not {"wq", "wk", "wv", "bq", "bk", "bv"} & set(inits)  # read by nothing else: dropped
    assert not any(n.op_type == "MatMul" for n in result.model.graph.node)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs.get("unidirectional", 0) == int(mask == "causal")
    assert (_attention_bias(node) != "") == ("padding" in mask) and _no_mask_index(node)
    _matches(model, result.model, dtype)


def test_projections_without_bias_pack_a_zero_bias():
    """ORT's CUDA Attention splits the GEMM output into heads in its bias kernel: a bias is always given."""
    model = _attention(mask="padding", unbiased=True)
    result = _fuse(model)
    node = _fused_node(result.model)
    assert node.op_type == "Attention"
    inits = {t.name: numpy_helper.to_array(t) for t in result.model.graph.initializer}
    np.testing.assert_array_equal(inits[node.input[2]], np.zeros(3 * D, np.float32))
    _matches(model, result.model)


@pytest.mark.parametrize("dtype", [T.FLOAT, T.FLOAT16])
@pytest.mark.parametrize("mask", ["none", "causal", "causal+padding"])
def test_split_projection_reads_its_own_weight(mask, dtype):
    """GPT-2: c_attn's weight [D, 3D] and bias [3D] are already [Wq | Wk | Wv]: Attention reads them as they
    are (no new weight); the MatMul, its Add and the Split are gone."""
    model = _attention(mask=mask, fill=-math.inf, dtype=dtype, projections="split")
    result = _fuse(model)
    (block,) = result.report.fused
    assert block.details["qkv"] == "packed" and block.details["qkv_form"] == "one MatMul and a Split"
    node = _fused_node(result.model)
    assert node.op_type == "Attention" and list(node.input[:3]) == ["x", "w_qkv", "b_qkv"]
    assert len(result.model.graph.initializer) < len(model.graph.initializer)  # nothing was added for it
    assert not any(n.op_type in ("Split", "MatMul") for n in result.model.graph.node)
    _matches(model, result.model, dtype)


def test_weights_read_elsewhere_are_kept():
    """A weight another node also reads (tied) stays; the packed weight is a copy."""
    model = _attention(mask="padding", tied=True)
    result = _fuse(model)
    node = _fused_node(result.model)
    assert node.op_type == "Attention"
    inits = {t.name for t in result.model.graph.initializer}
    assert "wq" in inits and not {"wk", "wv"} & inits
    _matches(model, result.model)


def test_casts_of_one_tensor_are_one_input():
    """Each MatMul reading its own Cast of the same tensor (a converter's form) reads one tensor."""
    model = _attention(mask="padding", casts=True)
    result = _fuse(model)
    node = _fused_node(result.model)
    assert node.op_type == "Attention" and node.input[0] == "q_x"
    assert sum(n.op_type == "Cast" and n.input[0] == "x" for n in result.model.graph.node) == 1
    _matches(model, result.model)


SEPARATE = [
    ({"query_input": True}, "projections of different tensors"),
    ({"weight_input": True}, "the query weight 'wq' is not a constant"),
    ({"projection_output": True}, "the projection 'q_proj' is a graph output"),
    ({"projections": "split_kqv"}, "not read as query, key, value in that order"),
]


@pytest.mark.parametrize("form,reason", SEPARATE, ids=[r for _, r in SEPARATE])
def test_unpackable_projections_stay_separate(form, reason):
    """Projections that cannot be one GEMM keep today's form: the attention is still fused, into
    MultiHeadAttention reading them, and ``inspect`` says why they were not packed."""
    model = _attention(mask="padding", **form)
    result = _fuse(model)
    (block,) = result.report.fused
    assert block.op == "com.microsoft.MultiHeadAttention" and block.details["qkv"] == "separate"
    assert reason in block.details["qkv_separate_because"], block.details["qkv_separate_because"]
    assert _fused_node(result.model).op_type == "MultiHeadAttention"
    _matches(model, result.model)


def test_external_split_weight_is_read_where_it_is_stored(tmp_path):
    """c_attn's weight in external data: Attention reads the graph's own tensor, so the packed form needs no
    new tensor, and the optimized file (its data streamed) gives the original's outputs."""
    from onnxfuse.pipeline import optimize_file

    model = _attention(mask="causal+padding", fill=-math.inf, projections="split")
    onnx.save(onnx.ModelProto.FromString(model.SerializeToString()), tmp_path / "m.onnx",
              save_as_external_data=True, all_tensors_to_one_file=True, location="m.data", size_threshold=1024)
    report = optimize_file(tmp_path / "m.onnx", tmp_path / "out.onnx")
    (block,) = [b for b in report.fused if b.rule == "attention"]
    assert block.details["qkv"] == "packed"
    fused = onnx.load(tmp_path / "out.onnx")
    node = _fused_node(fused)
    assert node.op_type == "Attention" and node.input[1] == "w_qkv"
    _matches(model, fused)


def test_tied_layers_share_one_packed_weight():
    """Two attentions over the same three weights (ALBERT's shared layers) read one packed copy."""
    first = _attention(mask="none", guard=False)
    graph = first.graph
    # a second block reading the first one's output with the same weights
    suffix = "_2"
    second = []
    inits = {t.name for t in graph.initializer}
    for n in graph.node:
        m = onnx.NodeProto()
        m.CopyFrom(n)
        m.name = n.name + suffix
        m.input[:] = ["y" if i == "x" else (i if i in inits else i + suffix) for i in n.input]
        m.output[:] = [o + suffix for o in n.output]
        second.append(m)
    graph.node.extend(second)
    graph.output[0].name = "y" + suffix
    result = _fuse(first)
    nodes = [n for n in result.model.graph.node if n.op_type == "Attention"]
    assert len(nodes) == 2 and nodes[0].input[1] == nodes[1].input[1]
    assert sum(t.dims == [D, 3 * D] for t in result.model.graph.initializer) == 1


def test_an_attention_ort_already_fused_is_left_alone():
    nodes = [helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["y"], domain="com.microsoft", num_heads=2)]
    vi = [helper.make_tensor_value_info(n, T.FLOAT, [2, 5, D]) for n in "qkv"]
    graph = helper.make_graph(nodes, "fused", vi, [helper.make_tensor_value_info("y", T.FLOAT, [2, 5, D])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    result = fuse_model(model)
    assert result.report.fused == [] and result.report.refused == []
    assert result.model.SerializeToString() == model.SerializeToString()


def test_idempotent():
    first = _fuse(_load("bert_dynamo_op18.onnx")).model
    again = _fuse(first)
    assert again.report.fused == [] and again.report.refused == []


def test_default_rules_include_attention():
    assert "attention" in [r.name for r in default_rules()]


@pytest.mark.parametrize("opset", [11, 13, 18])
def test_row_guard_ops_are_written_for_the_models_opset(opset):
    """Unsqueeze and ReduceSum take their axes as an attribute before opset 13 and as an input from it on:
    the row guard's ops run in a model of either kind."""
    from onnxfuse.patterns.attention.mask_inputs import _with_axes

    class Names:
        def __init__(self):
            self.inits = []

        def name(self, proposal):
            return proposal

        def initializer(self, proposal, value):
            self.inits.append(numpy_helper.from_array(np.asarray(value), proposal))
            return proposal

    out = Names()
    nodes = [_with_axes(out, opset, "Unsqueeze", 13, "keep", "keep4", [0], "u_axes"),
             _with_axes(out, opset, "ReduceSum", 13, "keep4", "count", [1, 3], "r_axes", keepdims=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("keep", T.FLOAT, [2, 3, 4])],
                              [helper.make_tensor_value_info("count", T.FLOAT, [1, 1, 3, 1])], out.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    keep = (np.arange(24).reshape(2, 3, 4) % 3 == 0).astype(np.float32)
    (count,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"keep": keep})
    np.testing.assert_array_equal(count, keep[None].sum(axis=(1, 3), keepdims=True))
