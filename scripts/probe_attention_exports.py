#!/usr/bin/env python3
"""Export the encoder families issue #18 names beside the committed ones (RoBERTa, DeiT, CLIP vision, the
Whisper encoder) with transformers' defaults, and check that onnxfuse fuses every attention and matches the
original on ORT's CPU provider: raw from both exporters, and after ORT's transformers optimizer in float32
and with its float16 converter. Nothing is written to the repository (the committed test models are at their
size budget); the exports go to ``--out``.

    python scripts/probe_attention_exports.py --out /tmp/probe      # needs the ``export`` extra

Exit status 0 when every attention of every variant fuses and the outputs agree (relative to the largest
magnitude: 1e-5 in float32, 4e-3 in float16, the attention tests' tolerances), 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx

TOLERANCE = {False: 1e-5, True: 4e-3}  # by float16
ORT_TYPES = {"roberta": "bert", "deit": "vit", "clip_vision": "clip", "whisper_encoder": "bert"}
SEQ, BATCH = 9, 3


def models():
    """name -> (module, input names, kind): tiny random-weight configs, two layers of four heads."""
    import torch
    import transformers

    torch.manual_seed(0)
    small = dict(num_hidden_layers=2, num_attention_heads=4, hidden_size=32, intermediate_size=64)
    whisper = transformers.WhisperConfig(d_model=32, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=64,
                                         num_mel_bins=16, max_source_positions=20, decoder_layers=1,
                                         decoder_attention_heads=4, decoder_ffn_dim=64, vocab_size=64, pad_token_id=0,
                                         bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    return {
        "roberta": (transformers.RobertaModel(transformers.RobertaConfig(vocab_size=64, max_position_embeddings=40,
                                                                         **small)),
                    ["input_ids", "attention_mask"], "text"),
        "deit": (transformers.DeiTModel(transformers.DeiTConfig(image_size=32, patch_size=8, **small),
                                        add_pooling_layer=False), ["pixel_values"], "image"),
        "clip_vision": (transformers.CLIPVisionModel(transformers.CLIPVisionConfig(image_size=32, patch_size=8,
                                                                                   **small)),
                        ["pixel_values"], "image"),
        "whisper_encoder": (transformers.WhisperModel(whisper).encoder, ["input_features"], "audio"),
    }


def export(name, model, names, kind, exporter: str, path: Path) -> None:
    import torch

    class Positional(torch.nn.Module):  # positional inputs, a tuple of outputs
        def __init__(self):
            super().__init__()
            self.model = model.eval()

        def forward(self, *args):
            return (self.model(**dict(zip(names, args))).last_hidden_state,)

    if kind == "text":
        ids = torch.randint(0, 64, (2, 8))
        args, dynamic = (ids, torch.ones_like(ids)), {n: {0: "batch", 1: "sequence"} for n in names}
    elif kind == "image":
        args, dynamic = (torch.randn(2, 3, 32, 32),), {names[0]: {0: "batch"}}
    else:
        args, dynamic = (torch.randn(2, 16, 40),), {names[0]: {0: "batch"}}
    with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            torch.onnx.export(Positional(), args, str(path), dynamo=True, opset_version=18, input_names=names,
                              output_names=["y"], dynamic_shapes=(tuple(dynamic[n] for n in names),),
                              external_data=False)
        else:
            torch.onnx.export(Positional(), args, str(path), dynamo=False, opset_version=17, input_names=names,
                              output_names=["y"], dynamic_axes={**dynamic, "y": {0: "batch"}})


def variants(name: str, path: Path):
    """(label, model): the raw export, then ORT's optimizer in float32 and with its float16 converter."""
    from onnxruntime.transformers import optimizer

    yield "raw", onnx.load(path)
    logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)
    for fp16 in (False, True):
        with contextlib.redirect_stdout(io.StringIO()):
            opt = optimizer.optimize_model(str(path), model_type=ORT_TYPES[name], num_heads=4, hidden_size=32,
                                           opt_level=0)
            if fp16:
                opt.convert_float_to_float16(keep_io_types=True)
        yield ("ortfp16" if fp16 else "ortopt"), opt.model


def feeds_for(session, rng) -> dict:
    feeds = {}
    for i in session.get_inputs():
        if i.name == "input_ids":
            feeds[i.name] = rng.integers(0, 64, (BATCH, SEQ)).astype(np.int64)
        elif i.name == "attention_mask":  # right, left and no padding
            mask = np.ones((BATCH, SEQ), np.int64)
            mask[1, 5:], mask[2, :3] = 0, 0
            feeds[i.name] = mask
        elif i.name == "pixel_values":
            feeds[i.name] = rng.standard_normal((BATCH, 3, 32, 32)).astype(np.float32)
        else:
            feeds[i.name] = rng.standard_normal((BATCH, 16, 40)).astype(np.float32)
    return feeds


def main() -> int:
    import onnxruntime as ort

    from onnxfuse.fuse import fuse_model
    from onnxfuse.runtime import get_library_path

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="where the exports go")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    so = ort.SessionOptions()
    so.register_custom_ops_library(get_library_path())
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the graphs as written
    so.log_severity_level = 3
    rng, ok = np.random.default_rng(0), True
    print("| model | exporter | variant | attentions fused | refused | max error (relative) |")
    print("|---|---|---|---|---|---|")
    for name, (model, names, kind) in models().items():
        for exporter in ("torchscript", "dynamo"):
            path = out / f"{name}_{exporter}.onnx"
            export(name, model, names, kind, exporter, path)
            for label, original in variants(name, path):
                result = fuse_model(original)
                fused = sum(b.rule == "attention" for b in result.report.fused)
                refused = [r.reason for r in result.report.refused if r.rule == "attention"]
                a, b = (ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
                        for m in (original, result.model))
                feeds = feeds_for(a, rng)
                want, got = (np.asarray(s.run(None, feeds)[0], np.float64) for s in (a, b))
                err = float(np.max(np.abs(want - got)) / max(1.0, np.max(np.abs(want))))
                good = fused == 2 and not refused and err <= TOLERANCE[label == "ortfp16"]
                ok &= good
                print(f"| {name} | {exporter} | {label} | {fused} | {'; '.join(refused) or '-'} | {err:.1e}"
                      f"{'' if good else ' FAIL'} |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
