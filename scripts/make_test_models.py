#!/usr/bin/env python3
"""Export the small random-weight transformer models that the exporter tests and the samples use.

Each family (BERT, GPT-2, ViT, CLIP text, BLOOM, ConvNeXt, T5 v1.1, GPT-NeoX, LLaMA, Gemma, Phi, Falcon, GPT-Neo) is a tiny Hugging Face
config with random weights, exported with torch.onnx's TorchScript exporter (``dynamo=False``) and its
dynamo exporter (``dynamo=True``) at opsets spread over 14-20, and some exports are post-processed with
ONNX Runtime's transformers optimizer and its float16 converter. Everything is seeded: running the script
twice writes the same graphs and weights.

    python scripts/make_test_models.py                 # writes tests/models/ and sample_models/
    python scripts/make_test_models.py --only bert     # one family (manifest entries of the rest kept)
    python scripts/make_test_models.py --only convnext --out /tmp/x   # elsewhere, to compare
    python scripts/make_test_models.py --only bert --exporter torchscript   # one exporter's files

Needs the ``export`` extra (``pip install -e ".[export]"``: torch, transformers, onnxscript). The tests
themselves need none of these: they load the committed files and ``tests/models/manifest.json``.

What is changed from the exporters' output, and only this: node ``metadata_props`` and ``doc_string``
fields are removed (the dynamo exporter writes the export machine's file paths and Python stack traces
there, several times the size of the weights). The graphs, GELU forms included, are as exported.

Expected fused counts come from the architecture (one Linear+GELU per feed-forward block), never from
what the rewriter produces.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import logging
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parent.parent
TESTS_DIR = ROOT / "tests" / "models"
SAMPLES_DIR = ROOT / "sample_models"
MANIFEST = TESTS_DIR / "manifest.json"
SEED = 20261129

# What each ORT contrib / ONNX activation becomes in FusedLinearGelu's `approximate` attribute.
ERF, TANH, SIGMOID = "none", "tanh", "sigmoid"
# GPT-2's, Phi's and GPT-Neo's activation_function "gelu_new", as their model code writes it.
GELU_NEW = "gelu_new: 0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x^3)))"


# --------------------------------------------------------------------------------------------------
# Family definitions: a model, example inputs, input specs for the tests, and the architecture facts.
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class InputSpec:
    name: str
    dtype: str  # numpy dtype name
    shape: list[int]  # the concrete shape the tests feed
    kind: str  # "int" (uniform in [low, high)), "ones", "normal"
    low: int = 0
    high: int = 0

    def example(self, rng: np.random.Generator) -> np.ndarray:
        if self.kind == "int":
            return rng.integers(self.low, self.high, size=self.shape).astype(self.dtype)
        if self.kind == "ones":
            return np.ones(self.shape, dtype=self.dtype)
        return rng.standard_normal(self.shape).astype(self.dtype)

    def to_dict(self) -> dict[str, Any]:
        d = {"name": self.name, "dtype": self.dtype, "shape": self.shape, "kind": self.kind}
        if self.kind == "int":
            d.update(low=self.low, high=self.high)
        return d


@dataclasses.dataclass
class Family:
    name: str  # file-name prefix
    hf_class: str
    config: dict[str, Any]
    build: Callable[[], Any]  # -> torch.nn.Module (the HF model, weights randomised)
    inputs: list[InputSpec]
    outputs: list[str]  # keys of the HF model output, in order
    dynamic: dict[str, dict[int, str]]  # input name -> {axis: symbolic name}
    fused_blocks: int  # Linear+GELU blocks in the architecture
    blocks_why: str
    approximate: str  # FusedLinearGelu approximate attribute the blocks must get
    gelu_form: str  # the activation as the model code writes it
    extra_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    ort: dict[str, Any] | None = None  # transformers-optimizer arguments, or None if unsupported
    ort_unsupported: str = ""
    dynamo_unsupported: str = ""  # why there is no dynamo export of this family
    family: str = ""  # the architecture, when `name` is a variant of it
    variant: str = ""
    refused_blocks: int = 0  # Linear+GELU-like blocks the rewriter must refuse (and leave as they are)
    refused_why: str = ("every Linear+GELU in the architecture is fusable: single consumer, constant 2-D weight, "
                        "[N] bias or none")

    def __post_init__(self):
        self.family = self.family or self.name


def _randomize(model, seed: int) -> None:
    """Give every parameter a scale that makes GELU inputs spread over roughly [-3, 3] and biases
    non-zero, so that a wrong approximation, a dropped bias or a transposed weight shows in the outputs
    (Hugging Face's own init, std 0.02 and zero biases, would hide all three)."""
    import torch
    from transformers.pytorch_utils import Conv1D

    gen = torch.Generator().manual_seed(seed)

    def normal_(p, std, mean=0.0):
        with torch.no_grad():
            p.copy_(torch.randn(p.shape, generator=gen) * std + mean)

    for name, p in sorted(model.named_parameters()):
        normal_(p, 0.5 if p.dim() >= 2 else 0.1)
    for _, mod in sorted(model.named_modules(), key=lambda kv: kv[0]):
        if isinstance(mod, torch.nn.Linear):
            normal_(mod.weight, mod.in_features**-0.5)
            if mod.bias is not None:
                normal_(mod.bias, 0.2)
        elif isinstance(mod, Conv1D):  # GPT-2: weight is [in, out]
            normal_(mod.weight, mod.weight.shape[0] ** -0.5)
            normal_(mod.bias, 0.2)
        elif isinstance(mod, torch.nn.Conv2d):
            fan_in = mod.weight[0].numel()
            normal_(mod.weight, fan_in**-0.5)
            if mod.bias is not None:
                normal_(mod.bias, 0.2)
        elif isinstance(mod, torch.nn.Embedding):
            normal_(mod.weight, 1.0)
        elif "norm" in type(mod).__name__.lower():
            if getattr(mod, "weight", None) is not None:
                normal_(mod.weight, 0.1, 1.0)
            if getattr(mod, "bias", None) is not None:
                normal_(mod.bias, 0.1)


def _hf(cls_name: str, config_cls: str, config: dict[str, Any], seed: int, randomize: bool = True) -> Callable[[], Any]:
    def build():
        import torch
        import transformers

        torch.manual_seed(seed)
        cfg = getattr(transformers, config_cls)(**config)
        model = getattr(transformers, cls_name)(cfg).eval()
        if randomize:
            _randomize(model, seed)
        return model

    return build


def _ids(name: str, vocab: int, shape=(2, 8)) -> InputSpec:
    return InputSpec(name, "int64", list(shape), "int", 0, vocab)


def _mask(name: str = "attention_mask", shape=(2, 8)) -> InputSpec:
    return InputSpec(name, "int64", list(shape), "ones")


_SEQ = {0: "batch", 1: "sequence"}


def bert() -> Family:
    """BERT encoder: each layer's BertIntermediate is Linear(H, 4H) + erf GELU."""
    cfg = dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
               intermediate_size=128, max_position_embeddings=128, hidden_act="gelu")
    return Family(
        "bert", "BertModel", cfg, _hf("BertModel", "BertConfig", cfg, SEED + 1),
        [_ids("input_ids", 128), _mask()], ["last_hidden_state", "pooler_output"],
        {"input_ids": _SEQ, "attention_mask": _SEQ},
        fused_blocks=2, blocks_why="2 layers x 1 intermediate Linear+GELU",
        approximate=ERF, gelu_form="torch gelu (erf)",
        ort=dict(model_type="bert", num_heads=2, hidden_size=32),
    )


def gpt2() -> Family:
    """GPT-2: each block's MLP is Conv1D c_fc (addmm: Reshape→Gemm→Reshape or MatMul+Add) + gelu_new."""
    cfg = dict(vocab_size=128, n_embd=32, n_layer=2, n_head=2, n_positions=128, n_inner=128,
               activation_function="gelu_new", use_cache=False, bos_token_id=1, eos_token_id=2)
    return Family(
        "gpt2", "GPT2Model", cfg, _hf("GPT2Model", "GPT2Config", cfg, SEED + 2),
        [_ids("input_ids", 128), _mask()], ["last_hidden_state"], {"input_ids": _SEQ, "attention_mask": _SEQ},
        fused_blocks=2, blocks_why="2 blocks x 1 c_fc Conv1D + gelu_new",
        approximate=TANH, gelu_form=GELU_NEW,
        extra_kwargs={"use_cache": False},
        ort=dict(model_type="gpt2", num_heads=2, hidden_size=32),
    )


def vit() -> Family:
    """ViT encoder: each layer's ViTIntermediate is Linear + erf GELU."""
    cfg = dict(image_size=16, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=2,
               num_attention_heads=2, intermediate_size=128, hidden_act="gelu")
    return Family(
        "vit", "ViTModel", cfg, _hf("ViTModel", "ViTConfig", cfg, SEED + 3),
        [InputSpec("pixel_values", "float32", [2, 3, 16, 16], "normal")],
        ["last_hidden_state", "pooler_output"], {"pixel_values": {0: "batch"}},
        fused_blocks=2, blocks_why="2 layers x 1 intermediate Linear+GELU",
        approximate=ERF, gelu_form="torch gelu (erf)",
        ort=dict(model_type="vit", num_heads=2, hidden_size=32),
    )


def clip_text() -> Family:
    """CLIP text tower: each layer's CLIPMLP is fc1 + quick_gelu (x*sigmoid(1.702x))."""
    cfg = dict(vocab_size=128, hidden_size=32, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=2, max_position_embeddings=128, hidden_act="quick_gelu",
               eos_token_id=2, bos_token_id=0, pad_token_id=1, projection_dim=32)
    return Family(
        "clip_text", "CLIPTextModel", cfg, _hf("CLIPTextModel", "CLIPTextConfig", cfg, SEED + 4),
        [_ids("input_ids", 128), _mask()], ["last_hidden_state", "pooler_output"],
        {"input_ids": _SEQ, "attention_mask": _SEQ},
        fused_blocks=2, blocks_why="2 layers x 1 fc1 + quick_gelu",
        approximate=SIGMOID, gelu_form="quick_gelu: x*sigmoid(1.702*x)",
        ort=dict(model_type="clip", num_heads=2, hidden_size=32),
    )


def bloom() -> Family:
    """BLOOM: each block's MLP is dense_h_to_4h + bloom_gelu (x*0.5*(1+tanh(0.79788456*x*(1+0.044715*x*x))))."""
    cfg = dict(vocab_size=128, hidden_size=32, n_layer=2, n_head=2, use_cache=False)
    return Family(
        "bloom", "BloomModel", cfg, _hf("BloomModel", "BloomConfig", cfg, SEED + 5),
        [_ids("input_ids", 128), _mask()], ["last_hidden_state"],
        {"input_ids": _SEQ, "attention_mask": _SEQ},
        fused_blocks=2, blocks_why="2 blocks x 1 dense_h_to_4h + bloom_gelu",
        approximate=TANH, gelu_form="bloom_gelu: x*0.5*(1+tanh(0.79788456*x*(1+0.044715*x*x)))",
        extra_kwargs={"use_cache": False},
        ort_unsupported="the transformers optimizer has no bloom model type",
    )


def convnext() -> Family:
    """ConvNeXt: each block is dwconv → permute to NHWC → LayerNorm → pwconv1 (Linear on 4-D) + GELU."""
    cfg = dict(num_channels=3, patch_size=4, num_stages=2, hidden_sizes=[16, 32], depths=[2, 1],
               hidden_act="gelu", layer_scale_init_value=1.0, image_size=32)
    return Family(
        "convnext", "ConvNextModel", cfg, _hf("ConvNextModel", "ConvNextConfig", cfg, SEED + 6),
        [InputSpec("pixel_values", "float32", [2, 3, 32, 32], "normal")],
        ["last_hidden_state", "pooler_output"], {"pixel_values": {0: "batch"}},
        fused_blocks=3, blocks_why="depths [2, 1] = 3 blocks x 1 pwconv1 (4-D NHWC Linear) + GELU",
        approximate=ERF, gelu_form="torch gelu (erf) on a 4-D NHWC tensor",
        ort_unsupported="the transformers optimizer has no convnext model type",
    )


def t5() -> Family:
    """T5 v1.1 encoder-decoder: each layer's T5DenseGatedActDense is gelu_new(x·wi_0) * (x·wi_1);
    the gelu branch (a bias-free Linear) is a Linear+GELU block."""
    cfg = dict(vocab_size=128, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_decoder_layers=2,
               num_heads=2, relative_attention_num_buckets=8, relative_attention_max_distance=16,
               feed_forward_proj="gated-gelu", tie_word_embeddings=False, use_cache=False,
               decoder_start_token_id=0, pad_token_id=0)
    return Family(
        "t5", "T5Model", cfg, _hf("T5Model", "T5Config", cfg, SEED + 7),
        [_ids("input_ids", 128), _mask(), _ids("decoder_input_ids", 128, (2, 4))],
        ["last_hidden_state"],
        {"input_ids": _SEQ, "attention_mask": _SEQ, "decoder_input_ids": {0: "batch", 1: "target"}},
        fused_blocks=4, blocks_why="(2 encoder + 2 decoder layers) x 1 gated wi_0 (no bias) + gelu_new",
        approximate=TANH, gelu_form="gelu_new on the gate branch, times the linear branch",
        extra_kwargs={"use_cache": False},
        ort=dict(model_type="t5", num_heads=2, hidden_size=32),
        dynamo_unsupported="torch 2.13's dynamo exporter fails in its decomposition step on T5Attention "
                           "(aten.view of the transposed attention output, static or dynamic shapes, "
                           "sdpa or eager attention)",
    )


def gpt_neox() -> Family:
    """GPT-NeoX (Pythia's config): each layer's MLP is dense_h_to_4h + erf GELU."""
    cfg = dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
               intermediate_size=128, max_position_embeddings=128, hidden_act="gelu", use_cache=False)
    return Family(
        "gpt_neox", "GPTNeoXModel", cfg, _hf("GPTNeoXModel", "GPTNeoXConfig", cfg, SEED + 8),
        [_ids("input_ids", 128), _mask()], ["last_hidden_state"],
        {"input_ids": _SEQ, "attention_mask": _SEQ},
        fused_blocks=2, blocks_why="2 layers x 1 dense_h_to_4h + GELU",
        approximate=ERF, gelu_form="torch gelu (erf)",
        extra_kwargs={"use_cache": False},
        ort=dict(model_type="gpt_neox", num_heads=2, hidden_size=32),
    )


def gpt_neox_fast() -> Family:
    """GPT-NeoX-20B's config: hidden_act gelu_fast, 0.5*x*(1+tanh(x*0.7978845608*(1+0.044715*x*x)))."""
    fam = gpt_neox()
    cfg = dict(fam.config, hidden_act="gelu_fast")
    return dataclasses.replace(
        fam, name="gpt_neox_fast", family="gpt_neox", variant="hidden_act gelu_fast (GPT-NeoX-20B's config)",
        config=cfg, build=_hf("GPTNeoXModel", "GPTNeoXConfig", cfg, SEED + 9),
        approximate=TANH, gelu_form="gelu_fast: 0.5*x*(1+tanh(x*0.7978845608*(1+0.044715*x*x)))",
        blocks_why="2 layers x 1 dense_h_to_4h + gelu_fast",
    )


def gpt_neox_tanh() -> Family:
    """GPT-NeoX with hidden_act gelu_pytorch_tanh, i.e. F.gelu(approximate="tanh"): ONNX Gelu(tanh) at opset 20."""
    fam = gpt_neox()
    cfg = dict(fam.config, hidden_act="gelu_pytorch_tanh")
    return dataclasses.replace(
        fam, name="gpt_neox_tanh", family="gpt_neox", variant="hidden_act gelu_pytorch_tanh (F.gelu approximate='tanh')",
        config=cfg, build=_hf("GPTNeoXModel", "GPTNeoXConfig", cfg, SEED + 10),
        approximate=TANH, gelu_form="F.gelu(x, approximate='tanh')",
        blocks_why="2 layers x 1 dense_h_to_4h + gelu_pytorch_tanh",
    )


def llama() -> Family:
    """LLaMA-3-class decoder: rotary heads, grouped K/V heads (4 query heads share 2 key/value heads through
    repeat_kv), RMSNorm and a SiLU-gated MLP, so no Linear+GELU block: the attention rule's model. Exported
    with the defaults (use_cache on: the cache's concatenation onto nothing stays in the graph)."""
    cfg = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=64, max_position_embeddings=32, hidden_act="silu")
    return Family(
        "llama", "LlamaModel", cfg, _hf("LlamaModel", "LlamaConfig", cfg, SEED + 12),
        [_ids("input_ids", 64), _mask()], ["last_hidden_state"], {"input_ids": _SEQ, "attention_mask": _SEQ},
        fused_blocks=0, blocks_why="SiLU-gated MLP (silu(gate) * up): no GELU",
        approximate=ERF, gelu_form="none (SiLU)",
        ort=None, ort_unsupported="the transformers optimizer has no llama model type",
    )


def gemma() -> Family:
    """Gemma-class decoder (Gemma-2B's shape of attention: one key/value head for all query heads), with
    GeGLU MLPs: gelu_pytorch_tanh(x·gate) * (x·up), the gate a bias-free Linear+GELU block."""
    cfg = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
               head_dim=8, intermediate_size=64, max_position_embeddings=32, hidden_activation="gelu_pytorch_tanh")
    return Family(
        "gemma", "GemmaModel", cfg, _hf("GemmaModel", "GemmaConfig", cfg, SEED + 13),
        [_ids("input_ids", 64), _mask()], ["last_hidden_state"], {"input_ids": _SEQ, "attention_mask": _SEQ},
        fused_blocks=2, blocks_why="2 layers x 1 gated gate_proj (no bias) + gelu_pytorch_tanh",
        approximate=TANH, gelu_form="F.gelu(x, approximate='tanh') on the gate branch, times the up branch",
        ort=None, ort_unsupported="the transformers optimizer has no gemma model type",
    )


def phi() -> Family:
    """Phi-2-class decoder: a partial rotary embedding (half of each head rotated, the rest passed through),
    q/k/v projections with biases, and a parallel MLP whose fc1 + gelu_new is a Linear+GELU block."""
    cfg = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
               max_position_embeddings=32, partial_rotary_factor=0.5, hidden_act="gelu_new")
    return Family(
        "phi", "PhiModel", cfg, _hf("PhiModel", "PhiConfig", cfg, SEED + 14),
        [_ids("input_ids", 64), _mask()], ["last_hidden_state"], {"input_ids": _SEQ, "attention_mask": _SEQ},
        fused_blocks=2, blocks_why="2 layers x 1 mlp.fc1 + gelu_new",
        approximate=TANH, gelu_form=GELU_NEW,
        ort=None, ort_unsupported="ORT 1.31's transformers optimizer, model type phi, fails on this export "
                                  "(onnx_model_phi.py's preprocessing iterates model functions, which only its "
                                  "own dynamo conversion writes: TypeError)",
        dynamo_unsupported="one Phi export (TorchScript) covers the partial rotary form; the LLaMA and Gemma "
                           "families have the dynamo exports of rotary decoders",
    )


def falcon() -> Family:
    """Falcon-7B's decoder (multi-query: one key/value head that the products broadcast over the query's four,
    rotary, no biases): its sdpa call passes no scale and the head size is not a constant at export, so the
    graph computes 1/√(Shape(q)[-1]) and its square root on Q and on Kᵀ at run time; each MLP's
    dense_h_to_4h (no bias) + erf GELU is a Linear+GELU block."""
    cfg = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, multi_query=True,
               new_decoder_architecture=False, max_position_embeddings=32)
    return Family(
        "falcon", "FalconModel", cfg, _hf("FalconModel", "FalconConfig", cfg, SEED + 15),
        [_ids("input_ids", 64), _mask()], ["last_hidden_state"], {"input_ids": _SEQ, "attention_mask": _SEQ},
        fused_blocks=2, blocks_why="2 layers x 1 dense_h_to_4h (no bias) + GELU",
        approximate=ERF, gelu_form="torch gelu (erf)",
        ort=None, ort_unsupported="the transformers optimizer has no falcon model type",
        dynamo_unsupported="one Falcon export (TorchScript) covers its run-time scale; the LLaMA and Gemma "
                           "families have the dynamo exports of rotary decoders",
    )


def gpt_neo() -> Family:
    """GPT-Neo decoder (eager attention only: transformers has no sdpa form for it): its own attention code
    masks the unscaled product with a slice of a literal boolean buffer, Where(tril, Q·Kᵀ, finfo.min), the
    "local" layers' buffer banded to window_size keys, then adds the padding-and-causal mask; each MLP's
    c_fc + gelu_new is a Linear+GELU block. A window of 4 keys makes the local layers' band bite at 8 tokens;
    four layers, so that two layers read each buffer (the dynamo exporter then shares their slices)."""
    cfg = dict(vocab_size=32, hidden_size=16, num_layers=4, num_heads=2, attention_types=[[["global", "local"], 2]],
               window_size=4, intermediate_size=32, max_position_embeddings=16, activation_function="gelu_new",
               use_cache=False)
    return Family(
        "gpt_neo", "GPTNeoModel", cfg, _hf("GPTNeoModel", "GPTNeoConfig", cfg, SEED + 16),
        [_ids("input_ids", 32), _mask()], ["last_hidden_state"], {"input_ids": _SEQ, "attention_mask": _SEQ},
        fused_blocks=4, blocks_why="4 layers x 1 mlp.c_fc + gelu_new",
        approximate=TANH, gelu_form=GELU_NEW,
        extra_kwargs={"use_cache": False},
        ort=None, ort_unsupported="the transformers optimizer has no gpt_neo model type",
    )


def mistral() -> Family:
    """Mistral-7B-v0.1's decoder: LLaMA's (rotary heads, grouped key/value heads, RMSNorm, SiLU-gated MLP)
    with attention limited to a sliding window of keys, which transformers writes into the mask as
    ``kv_idx > q_idx - sliding_window`` beside the causal and padding terms. A window of 4 keys bites at 8
    tokens."""
    fam = llama()
    cfg = dict(fam.config, sliding_window=4)
    return dataclasses.replace(
        fam, name="mistral", family="mistral", hf_class="MistralModel", config=cfg,
        build=_hf("MistralModel", "MistralConfig", cfg, SEED + 17),
        ort_unsupported="the transformers optimizer has no mistral model type",
    )


def gpt_bigcode() -> Family:
    """GPTBigCode (SantaCoder / StarCoder): multi-query attention from one c_attn projection, which the model
    unsqueezes to [B, 1, S, D + 2H] and splits on its last axis, so the query's heads are reshaped from a 4-D
    split and the one key/value head stays [B, 1, L, H] (broadcast over the query's heads by the products);
    each MLP's c_fc + gelu_pytorch_tanh is a Linear+GELU block."""
    cfg = dict(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=32, n_inner=64, multi_query=True,
               activation_function="gelu_pytorch_tanh", use_cache=False)
    return Family(
        "gpt_bigcode", "GPTBigCodeModel", cfg, _hf("GPTBigCodeModel", "GPTBigCodeConfig", cfg, SEED + 18),
        [_ids("input_ids", 64), _mask()], ["last_hidden_state"], {"input_ids": _SEQ, "attention_mask": _SEQ},
        fused_blocks=2, blocks_why="2 blocks x 1 c_fc + gelu_pytorch_tanh",
        approximate=TANH, gelu_form="F.gelu(x, approximate='tanh')",
        extra_kwargs={"use_cache": False},
        ort=None, ort_unsupported="the transformers optimizer has no gpt_bigcode model type",
        dynamo_unsupported="one GPTBigCode export (TorchScript) covers its split of the unsqueezed projection "
                           "(the test models are at their size budget); the dynamo export fuses the same way",
    )


def gptj() -> Family:
    """GPT-J (CodeGen's attention too): the rotary embedding (interleaved, on the first rotary_dim of each
    head) applied to the query and key split [B, S, N, H] before their heads are transposed, so Kᵀ is one
    Transpose 0231 of a computed tensor; each MLP's fc_in + gelu_new is a Linear+GELU block."""
    cfg = dict(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=32, n_inner=64, rotary_dim=4,
               activation_function="gelu_new", use_cache=False)
    return Family(
        "gptj", "GPTJModel", cfg, _hf("GPTJModel", "GPTJConfig", cfg, SEED + 20),
        [_ids("input_ids", 64), _mask()], ["last_hidden_state"], {"input_ids": _SEQ, "attention_mask": _SEQ},
        fused_blocks=2, blocks_why="2 layers x 1 fc_in + gelu_new",
        approximate=TANH, gelu_form=GELU_NEW,
        extra_kwargs={"use_cache": False},
        ort=None, ort_unsupported="the transformers optimizer has no gptj model type",
        dynamo_unsupported="one GPT-J export (TorchScript) covers its rotary before the head transpose (the test "
                           "models are at their size budget); the dynamo export fuses the same way",
    )


def modernbert() -> Family:
    """ModernBERT: rotary heads unbound from one [B, S, 3, N, H] projection, global attention every third layer
    and a local window elsewhere (|k - q| <= local_attention / 2, beside the padding term: 2 at 8 tokens, so
    it bites), and a GeGLU MLP whose one Wi output is chunked in two, GELU on the first half."""
    cfg = dict(vocab_size=64, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64,
               max_position_embeddings=32, local_attention=4, global_attn_every_n_layers=3, pad_token_id=0,
               bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
    return Family(
        "modernbert", "ModernBertModel", cfg, _hf("ModernBertModel", "ModernBertConfig", cfg, SEED + 19),
        [_ids("input_ids", 64), _mask()], ["last_hidden_state"], {"input_ids": _SEQ, "attention_mask": _SEQ},
        fused_blocks=0, blocks_why="GeGLU from one Wi output chunked in two: no Linear+GELU block",
        approximate=ERF, gelu_form="torch gelu (erf) on the first half of Wi's output, times the second",
        ort=None, ort_unsupported="the transformers optimizer has no modernbert model type",
        dynamo_unsupported="one ModernBERT export (TorchScript) covers its global and local attention (the test "
                           "models are at their size budget); the dynamo export fuses the same way",
        refused_blocks=3, refused_why="3 layers x 1 GELU on a Slice of Wi's output (GeGLU chunk), not on a Linear",
    )


def distilbert() -> Family:
    """DistilBERT: each layer's FFN is lin1 + erf GELU."""
    cfg = dict(vocab_size=128, dim=32, n_layers=2, n_heads=2, hidden_dim=128, max_position_embeddings=128,
               activation="gelu")
    return Family(
        "distilbert", "DistilBertModel", cfg, _hf("DistilBertModel", "DistilBertConfig", cfg, SEED + 11),
        [_ids("input_ids", 128), _mask()], ["last_hidden_state"], {"input_ids": _SEQ, "attention_mask": _SEQ},
        fused_blocks=2, blocks_why="2 layers x 1 ffn.lin1 + GELU",
        approximate=ERF, gelu_form="torch gelu (erf)",
        ort=dict(model_type="bert", num_heads=2, hidden_size=32),
    )


# --- freshly initialised models: the framework's own init, as a new user exports one --------------------
# Hugging Face initialises biases to zero and LayerNorm gains to one, so every layer's FFN bias equals the
# first one's: the TorchScript exporter merges identical initializers and reads the duplicates through
# Identity nodes. Smaller FFNs and vocabularies than the random-weight models keep these files tiny.
FRESH_CONFIG: dict[str, dict[str, Any]] = {
    "bert": dict(vocab_size=64, intermediate_size=64, max_position_embeddings=32),
    "gpt2": dict(vocab_size=64, n_inner=64, n_positions=32),
    "vit": dict(intermediate_size=64),
    # a position table of 16 rows: the model runs at up to 16 tokens (compare must pick sizes it runs)
    "clip_text": dict(vocab_size=64, intermediate_size=64, max_position_embeddings=16),
    "bloom": dict(vocab_size=64),
    "gpt_neox": dict(vocab_size=64, intermediate_size=64, max_position_embeddings=32),
    "distilbert": dict(vocab_size=64, hidden_dim=64, max_position_embeddings=32),
}
FRESH_INIT = "framework-default initialisation (no _randomize): zero biases, unit LayerNorm gains"


def _fresh(make: Callable[[], Family]) -> Callable[[], Family]:
    def fresh() -> Family:
        fam = make()
        cfg = dict(fam.config, **FRESH_CONFIG[fam.name])
        vocab = cfg.get("vocab_size")
        inputs = [dataclasses.replace(i, high=vocab) if i.kind == "int" and vocab else i for i in fam.inputs]
        config_cls = fam.hf_class.removesuffix("Model") + "Config"
        why = "freshly initialised models are exported raw only; the post-processed forms are covered by the random-weight ones"
        return dataclasses.replace(
            fam, name=f"{fam.name}_freshinit", family=fam.family, variant=FRESH_INIT, config=cfg, inputs=inputs,
            build=_hf(fam.hf_class, config_cls, cfg, SEED + 100 + len(fam.name), randomize=False),
            ort=None, ort_unsupported=why, dynamo_unsupported=why)

    fresh.__name__ = f"{make.__name__}_freshinit"
    return fresh


_FRESH = tuple(_fresh(f) for f in (bert, gpt2, vit, clip_text, distilbert, bloom, gpt_neox))

FAMILIES: dict[str, Callable[[], Family]] = {
    f.__name__: f for f in (bert, gpt2, vit, clip_text, bloom, convnext, t5, gpt_neox, gpt_neox_fast, gpt_neox_tanh,
                            distilbert, llama, gemma, phi, falcon, gpt_neo, mistral, gpt_bigcode, modernbert,
                            gptj, *_FRESH)
}


# --------------------------------------------------------------------------------------------------
# What gets written: (family, exporter, opset, external data?) raw exports, then post-processed ones.
# --------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Export:
    family: str
    exporter: str  # torchscript | dynamo
    opset: int
    external: bool = False  # weights in a .data file next to the model
    fold: bool = True  # TorchScript do_constant_folding / dynamo optimize, as the exporters default
    static: bool = False  # dynamo without dynamic_shapes (its default): every dimension of the example fixed
    note: str = ""

    @property
    def stem(self) -> str:
        return (f"{self.family}_{self.exporter}_op{self.opset}" + ("" if self.fold else "_nofold")
                + ("_static" if self.static else ""))


EXPORTS: list[Export] = [
    Export("bert", "torchscript", 14),
    Export("bert", "torchscript", 16, fold=False,
           note="do_constant_folding=False: each weight reaches its MatMul through a Transpose node"),
    Export("bert", "torchscript", 17, external=True),
    Export("bert", "torchscript", 20, note="ONNX Gelu (opset 20)"),
    Export("bert", "dynamo", 18),
    Export("bert", "dynamo", 18, static=True,
           note="no dynamic_shapes (the exporter's default): its optimizer folds the position lookup into a "
                "constant [1, S, D]"),
    Export("bert", "dynamo", 23, note="ONNX Attention (opset 23): the dynamo exporter's sdpa"),
    Export("gpt2", "torchscript", 14),
    Export("gpt2", "dynamo", 18),
    Export("gpt2", "dynamo", 19, fold=False, note="optimize=False: the dynamo exporter's graph before its optimizer"),
    Export("vit", "torchscript", 15),
    Export("vit", "dynamo", 20, note="ONNX Gelu (opset 20)"),
    Export("clip_text", "torchscript", 16),
    Export("clip_text", "dynamo", 18),
    Export("bloom", "torchscript", 17),
    Export("bloom", "dynamo", 19),
    Export("convnext", "torchscript", 14),
    Export("convnext", "dynamo", 18),
    Export("t5", "torchscript", 15),
    Export("gpt_neox", "torchscript", 16),
    Export("gpt_neox", "dynamo", 20, note="ONNX Gelu (opset 20)"),
    Export("gpt_neox_fast", "torchscript", 18),
    Export("gpt_neox_tanh", "dynamo", 20, note="ONNX Gelu(approximate='tanh') (opset 20)"),
    Export("llama", "torchscript", 17),
    Export("llama", "dynamo", 18),
    Export("llama", "dynamo", 18, static=True,
           note="no dynamic_shapes (the exporter's default): constant shapes, so its optimizer folds repeat_kv's "
                "Reshape into the key's [B*N, L, H] Reshape in front of K transposed"),
    Export("gemma", "torchscript", 17),
    Export("gemma", "dynamo", 20, note="ONNX Gelu(approximate='tanh') (opset 20)"),
    Export("phi", "torchscript", 17),
    Export("falcon", "torchscript", 17),
    Export("gpt_neo", "torchscript", 17),
    Export("gpt_neo", "dynamo", 18),
    Export("mistral", "torchscript", 17),
    Export("mistral", "dynamo", 18),
    Export("gpt_bigcode", "torchscript", 17),
    Export("modernbert", "torchscript", 17),
    Export("gptj", "torchscript", 17),
    *(Export(f.__name__, "torchscript", 17, note="freshly initialised: layer 1 reads its FFN bias (equal to layer "
                                                  "0's) through an Identity") for f in _FRESH),
]

@dataclasses.dataclass(frozen=True)
class OrtPost:
    """One run of ORT's transformers optimizer (opt_level 0: its Python fusions only) on a raw export,
    optionally followed by its float16 converter."""

    source: str  # stem of the raw export
    suffix: str  # file name: <source>_<suffix>.onnx
    fp16: bool = False  # then convert_float_to_float16(keep_io_types=keep_io_types)
    keep_io_types: bool = True
    options: tuple[tuple[str, bool], ...] = ()  # FusionOptions attributes changed from the defaults
    op_block_list: tuple[str, ...] = ()  # float16 converter: op types left in float32 (Cast-wrapped)
    force_fp16_initializers: bool = False  # float16 converter: blocked ops' constants stored as float16 too
    folder: str = ""  # subfolder of tests/models/ (mixed_precision/: the GELU left in float32 between Casts)
    approximate: str | None = None  # when the options change the activation the graph computes
    why: str = ""

    @property
    def post(self) -> str:
        return "ort-fp16" if self.fp16 else "ort-optimizer"


def _both(source: str) -> list[OrtPost]:
    return [OrtPost(source, "ortopt"), OrtPost(source, "ortfp16", fp16=True)]


ORT_POST: list[OrtPost] = [
    *_both("bert_torchscript_op14"),
    *_both("bert_dynamo_op18"),
    *_both("gpt2_torchscript_op14"),
    *_both("vit_torchscript_op15"),
    *_both("clip_text_torchscript_op16"),
    *_both("t5_torchscript_op15"),
    *_both("gpt_neox_torchscript_op16"),
    OrtPost("bert_torchscript_op14", "ortopt_nobiasgelu", options=(("enable_bias_gelu", False),),
            why="--disable_bias_gelu: com.microsoft Gelu after a separate bias Add"),
    OrtPost("vit_torchscript_op15", "ortopt_geluapprox", options=(("enable_gelu_approximation", True),),
            approximate=TANH, why="--use_gelu_approximation: erf GELU rewritten to FastGelu (tanh)"),
    OrtPost("vit_torchscript_op15", "ortfp16io", fp16=True, keep_io_types=False,
            why="float16 inputs and outputs (keep_io_types=False)"),
    OrtPost("gpt2_torchscript_op14", "ortfp16_keepfastgelu", fp16=True, op_block_list=("FastGelu",),
            folder="mixed_precision",
            why="op_block_list=['FastGelu']: float16 MatMul, then Cast to float32, FastGelu with its float32 "
                "bias, Cast back to float16"),
    OrtPost("bert_torchscript_op14", "ortfp16_keepbiasgelu", fp16=True, op_block_list=("BiasGelu",),
            force_fp16_initializers=True, folder="mixed_precision",
            why="op_block_list=['BiasGelu'], force_fp16_initializers: float16 MatMul, Cast to float32, BiasGelu "
                "whose float16 bias is Cast to float32, Cast back to float16"),
]

@dataclasses.dataclass(frozen=True)
class Rewrite:
    """A raw export as another tool writes it back: models ONNX Runtime runs but onnx.checker rejects."""

    source: str  # stem of the raw export
    suffix: str
    post: str  # manifest "post"
    checker_error: str  # what onnx.checker says of the file (the tests hold the output to it)
    why: str


REWRITES: list[Rewrite] = [
    Rewrite("vit_torchscript_op15", "fp16raw", "ort-fp16-converter", "must be topologically sorted",
            "onnxruntime.transformers.float16.convert_float_to_float16(keep_io_types=True) on the raw export: "
            "the input Casts are appended at the end of the node list, out of topological order"),
    Rewrite("bert_freshinit_torchscript_op17", "gsunshaped", "graphsurgeon", "Field 'shape' of 'type' is required",
            "onnx-graphsurgeon import/export with the graph outputs' shapes unknown: outputs typed without a shape"),
]


def rewrite(src: Path, job: Rewrite, out: Path) -> None:
    model = onnx.load(str(src))
    if job.post == "ort-fp16-converter":
        from onnxruntime.transformers.float16 import convert_float_to_float16

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = convert_float_to_float16(model, keep_io_types=True)
    else:
        import onnx_graphsurgeon as gs

        graph = gs.import_onnx(model)
        for o in graph.outputs:
            o.shape = None
        model = gs.export_onnx(graph)
    try:
        onnx.checker.check_model(model, full_check=True)
        raise AssertionError(f"{out.name}: onnx.checker accepts it; it is meant to show {job.checker_error!r}")
    except onnx.checker.ValidationError as e:
        assert job.checker_error in str(e), str(e)
    onnx.save_model(_strip(model), str(out))


# Samples for users (copied from the raw exports under a friendlier name).
SAMPLES: dict[str, str] = {
    "tiny_bert.onnx": "bert_torchscript_op17",
    "tiny_gpt2.onnx": "gpt2_torchscript_op14",
    "tiny_clip_text_quickgelu.onnx": "clip_text_dynamo_op18",
}


# --------------------------------------------------------------------------------------------------


class _Wrapper:
    """nn.Module that takes the inputs positionally and returns a tuple of tensors (both exporters want
    that; transformers' forward takes keywords and returns a ModelOutput)."""

    def __new__(cls, model, fam: Family):
        import torch

        names = [s.name for s in fam.inputs]

        class Wrapped(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, *args):
                out = self.model(**dict(zip(names, args)), **fam.extra_kwargs)
                return tuple(out[k] for k in fam.outputs)

        return Wrapped().eval()


def _strip(model: onnx.ModelProto) -> onnx.ModelProto:
    def graph(g: onnx.GraphProto) -> None:
        g.doc_string = ""
        for n in g.node:
            n.doc_string = ""
            del n.metadata_props[:]
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    graph(a.g)
                for sub in a.graphs:
                    graph(sub)
        for v in list(g.value_info) + list(g.input) + list(g.output):
            del v.metadata_props[:]
        for t in g.initializer:
            del t.metadata_props[:]

    model.doc_string = ""
    del model.metadata_props[:]
    graph(model.graph)
    for f in model.functions:
        for n in f.node:
            n.doc_string = ""
            del n.metadata_props[:]
    return model


def _save(model: onnx.ModelProto, path: Path, external: bool) -> str | None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data_name = None
    if external:
        data_name = path.name + ".data"
        (path.parent / data_name).unlink(missing_ok=True)
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data_name, size_threshold=256, convert_attribute=False)
    else:
        onnx.save_model(model, str(path))
    return data_name


def export(fam: Family, exp: Export, path: Path) -> str | None:
    import torch

    model = fam.build()
    rng = np.random.default_rng(SEED)
    args = tuple(torch.from_numpy(s.example(rng)) for s in fam.inputs)
    wrapped = _Wrapper(model, fam)
    names = [s.name for s in fam.inputs]
    tmpdir = tempfile.TemporaryDirectory()
    tmp = Path(tmpdir.name) / "export.onnx"
    kwargs: dict[str, Any] = dict(input_names=names, output_names=fam.outputs, opset_version=exp.opset)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        if exp.exporter == "torchscript":
            torch.onnx.export(wrapped, args, str(tmp), dynamo=False, do_constant_folding=exp.fold,
                              dynamic_axes={n: fam.dynamic[n] for n in names if n in fam.dynamic}, **kwargs)
        else:
            dyn = tuple({ax: torch.export.Dim.DYNAMIC for ax in fam.dynamic.get(n, {})} or None for n in names)
            prog = torch.onnx.export(wrapped, args, dynamo=True, optimize=exp.fold,
                                     dynamic_shapes=None if exp.static else (dyn,),
                                     external_data=False, **kwargs)
            prog.save(str(tmp))
    m = onnx.load(str(tmp))
    tmpdir.cleanup()
    _strip(m)
    onnx.checker.check_model(m, full_check=True)
    return _save(m, path, exp.external)


def ort_optimize(src: Path, fam: Family, post: OrtPost, out: Path) -> None:
    from onnxruntime.transformers import optimizer
    from onnxruntime.transformers.fusion_options import FusionOptions

    logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)
    options = FusionOptions(fam.ort["model_type"])
    for name, value in post.options:
        assert hasattr(options, name), name
        setattr(options, name, value)
    with contextlib.redirect_stdout(io.StringIO()):
        opt = optimizer.optimize_model(str(src), opt_level=0, use_gpu=False, optimization_options=options, **fam.ort)
        if post.fp16:
            kw: dict[str, Any] = {"keep_io_types": post.keep_io_types}
            if post.op_block_list:
                kw["op_block_list"] = list(post.op_block_list)
            if post.force_fp16_initializers:
                kw["force_fp16_initializers"] = True
            opt.convert_float_to_float16(**kw)
        opt.save_model_to_file(str(out))
    onnx.save_model(_strip(onnx.load(str(out))), str(out))


def _counts(path: Path) -> dict[str, int]:
    m = onnx.load(str(path), load_external_data=False)
    out: dict[str, int] = {}
    for n in m.graph.node:
        key = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
        out[key] = out.get(key, 0) + 1
    return out


def _gelu_ops(counts: dict[str, int]) -> dict[str, int]:
    keys = ("Gelu", "Erf", "Tanh", "Sigmoid", "Pow", "com.microsoft.Gelu", "com.microsoft.BiasGelu",
            "com.microsoft.FastGelu", "com.microsoft.QuickGelu", "Gemm", "MatMul")
    return {k: counts[k] for k in keys if k in counts}


def entry(fam: Family, exporter: str, opset: int, post: str, file: str, data_file: str | None) -> dict[str, Any]:
    path = TESTS_DIR / file
    dtype = "float16" if post == "ort-fp16" else "float32"
    return {
        "file": file,
        "family": fam.family,
        **({"variant": fam.variant} if fam.variant else {}),
        "hf_class": fam.hf_class,
        "config": fam.config,
        "exporter": exporter,
        "opset": opset,
        "post": post,
        "dtype": dtype,
        "external_data": data_file,
        "expected_fused": fam.fused_blocks,
        "expected_fused_why": fam.blocks_why,
        "expected_approximate": fam.approximate,
        "expected_refused": fam.refused_blocks,
        "expected_refused_why": fam.refused_why,
        "gelu_form": fam.gelu_form,
        "inputs": [s.to_dict() for s in fam.inputs],
        "outputs": fam.outputs,
        "ops": _gelu_ops(_counts(path)),
        "bytes": path.stat().st_size + ((TESTS_DIR / data_file).stat().st_size if data_file else 0),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", choices=sorted(FAMILIES), help="families to (re)write")
    ap.add_argument("--exporter", action="append", choices=("torchscript", "dynamo"),
                    help="only (re)write the exports of these exporters (the manifest entries of the rest kept)")
    ap.add_argument("--out", type=Path, help="write tests/models/ and sample_models/ under this folder instead "
                                              "of the checkout (to compare with the committed files)")
    args = ap.parse_args(argv)
    only = set(args.only or FAMILIES)
    if args.out is not None:
        global TESTS_DIR, SAMPLES_DIR, MANIFEST
        TESTS_DIR = args.out / "tests" / "models"
        SAMPLES_DIR = args.out / "sample_models"
        MANIFEST = TESTS_DIR / "manifest.json"
        TESTS_DIR.mkdir(parents=True, exist_ok=True)
        SAMPLES_DIR.mkdir(parents=True, exist_ok=True)

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    import transformers

    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)

    old = json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {"models": []}
    exporters = set(args.exporter or ("torchscript", "dynamo"))
    models = {m["file"]: m for m in old["models"]
              if m["file"].split("/")[-1].split("_op")[0].rsplit("_", 1)[0] not in only
              or m["exporter"] not in exporters}
    families = {name: make() for name, make in FAMILIES.items()}
    unsupported = {name: fam.ort_unsupported for name, fam in families.items() if fam.ort is None}
    no_dynamo = {name: fam.dynamo_unsupported for name, fam in families.items() if fam.dynamo_unsupported}
    # (distilbert: exported freshly initialised only, the ORT and dynamo forms of its encoder are BERT's)
    unsupported.setdefault("distilbert", "exported freshly initialised only (distilbert_freshinit); its encoder's "
                                         "ORT-processed forms are covered by BERT's")
    no_dynamo.setdefault("distilbert", "exported freshly initialised only (distilbert_freshinit)")

    for exp in EXPORTS:
        if exp.family not in only or exp.exporter not in exporters:
            continue
        fam, exporter, opset = families[exp.family], exp.exporter, exp.opset
        s = exp.stem
        file = s + ".onnx"
        data = export(fam, exp, TESTS_DIR / file)
        models[file] = entry(fam, exporter, opset, "raw", file, data)
        models[file]["constant_folding"] = exp.fold
        if exp.note:
            models[file]["note"] = exp.note
        print(f"wrote tests/models/{file}" + (f" (+ {data})" if data else ""), models[file]["ops"],
              f"{models[file]['bytes']} bytes")
        for post in (p for p in ORT_POST if p.source == s):
            assert fam.ort is not None, exp.family
            f = (f"{post.folder}/" if post.folder else "") + f"{s}_{post.suffix}.onnx"
            (TESTS_DIR / f).parent.mkdir(parents=True, exist_ok=True)
            ort_optimize(TESTS_DIR / file, fam, post, TESTS_DIR / f)
            e = models[f] = entry(fam, exporter, opset, post.post, f, None)
            e["ort_optimizer"] = dict(fam.ort, opt_level=0, **dict(post.options))
            if post.fp16:
                e["ort_fp16"] = {"keep_io_types": post.keep_io_types}
                if post.op_block_list:
                    e["ort_fp16"].update(op_block_list=list(post.op_block_list),
                                         force_fp16_initializers=post.force_fp16_initializers)
            if post.why:
                e["post_why"] = post.why
            if post.approximate:
                e["expected_approximate"] = post.approximate
            if not post.keep_io_types:
                for spec in e["inputs"]:
                    if spec["dtype"] == "float32":
                        spec["dtype"] = "float16"
            print(f"wrote tests/models/{f}", e["ops"], f"{e['bytes']} bytes")
        for job in (j for j in REWRITES if j.source == s):
            f = f"{s}_{job.suffix}.onnx"
            rewrite(TESTS_DIR / file, job, TESTS_DIR / f)
            e = models[f] = entry(fam, exporter, opset, job.post, f, None)
            if job.post == "ort-fp16-converter":
                e["dtype"] = "float16"
            e.update(input_checker_error=job.checker_error, post_why=job.why)
            print(f"wrote tests/models/{f}", e["ops"], f"{e['bytes']} bytes")

    for sample, src in SAMPLES.items():
        fam_name = src.split("_torchscript")[0].split("_dynamo")[0]
        if fam_name not in only:
            continue
        m = onnx.load(str(TESTS_DIR / (src + ".onnx")))  # external data, if any, is loaded inline
        _save(m, SAMPLES_DIR / sample, external=False)
        print(f"wrote sample_models/{sample} (from tests/models/{src}.onnx)")

    manifest = {
        "about": "Tiny random-weight (and freshly initialised) exports of Hugging Face models, made by "
                 "scripts/make_test_models.py; Keras models through tf2onnx, made by "
                 "scripts/make_tf_test_models.py. expected_* come from the architecture, not from the "
                 "rewriter's output.",
        "fields": {
            "exporter / opset / post": "torch.onnx exporter (torchscript: dynamo=False; dynamo: dynamo=True), "
                                       "default-domain opset, and raw | ort-optimizer | ort-fp16",
            "dtype": "the compute dtype of the graph (float16 after the float16 converter)",
            "external_data": "the data file next to the model, or null",
            "expected_fused": "Linear+GELU blocks in the architecture, each must become one FusedLinearGelu",
            "expected_approximate": "the approximate attribute every fused node must get",
            "expected_refused": "blocks the rewriter must refuse (and leave as they are)",
            "inputs": "what the tests feed: shape, and int (uniform in [low, high)) | ones | normal",
            "ops": "counts of the GELU-related ops in the file, for orientation",
            "input_checker_error": "what onnx.checker says of a file ONNX Runtime runs (the output may repeat "
                                   "it, never add another)",
        },
        "generator": {"torch": torch.__version__, "transformers": transformers.__version__,
                      "onnx": onnx.__version__, "seed": SEED},
        "ort_optimizer_unsupported": unsupported,
        "dynamo_unsupported": no_dynamo,
        "samples": SAMPLES,
        "models": sorted(models.values(), key=lambda m: m["file"]),
    }
    MANIFEST.write_text(json.dumps(manifest, indent=1) + "\n")
    total = sum(p.stat().st_size for d in (TESTS_DIR, SAMPLES_DIR) for p in d.rglob("*") if p.is_file())
    print(f"wrote tests/models/manifest.json ({len(models)} models); tests/models + sample_models: {total} bytes")
    return 0


if __name__ == "__main__":
    # String hashing is randomised per process, and some exports follow a set's order (ModernBERT's two rotary
    # embeddings came out in either order, a byte-different file each time): one fixed seed for every run.
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "PYTHONHASHSEED": "0"})
    sys.exit(main())
