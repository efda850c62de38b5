#!/usr/bin/env python3
"""Export the attention export corpus with the transformers, torch and optimum of the environment it runs in:
tiny random-weight models of the families users export, through each exporter that environment has.

    /work/venvs/tf4_36/bin/python scripts/exports/export_corpus.py --out /work/exports/tf4_36
    /work/venvs/tf5/bin/python scripts/exports/export_corpus.py --out /work/exports/tf5 --only bert --only llama
    ... --ort-gpu       # also ORT's transformers optimizer with use_gpu=True (needs onnxruntime-gpu and a GPU)

The environments come from ``scripts/exports/make_venvs.py`` (one per transformers generation: 4.36, 4.44,
4.57, 5.x). Per family (``FAMILIES``) and per exporter the environment has:

* ``torchscript``: ``torch.onnx.export(..., dynamo=False)`` (torch 2.1: the only exporter), opset 17;
* ``dynamo``: ``torch.onnx.export(..., dynamo=True)`` at opset 18, dynamic batch and sequence (torch >= 2.5);
* ``default``: ``torch.onnx.export`` with no exporter or opset argument, where torch's default is the dynamo
  exporter (torch >= 2.9), the data file as it writes it;
* ``optimum``: optimum's ``main_export`` (``optimum-cli export onnx``) of the saved model, its default opset
  and task, validation off (where optimum is installed);

with transformers' default attention implementation (sdpa where the version has it) and, for the families
where the eager code spells the mask or the softmax differently (``eager=True``), ``attn_implementation=
"eager"`` too. ONNX Runtime's transformers optimizer then runs as its documentation shows
(``optimize_model(path, model_type=..., num_heads=..., hidden_size=..., use_gpu=False)``, then
``convert_float_to_float16(keep_io_types=True)``) on the TorchScript exports of the families it has a model
type for; ``--ort-gpu`` adds the ``use_gpu=True`` variant, made on a GPU machine.

Everything is seeded (and the hash seed fixed): the weights are drawn as ``scripts/make_test_models.py``
draws them (a spread that makes a wrong mask or scale show in the outputs). What the exporters write is
kept, except node ``doc_string``/``metadata_props`` (the dynamo exporter's stack traces and paths). An
export that fails is recorded with its error line, not retried. ``<out>/records.json`` lists every export:
the family, the architecture's attention blocks (``attention_blocks``: layers x attentions per layer,
never what a rewriter finds), the versions, and the inputs a run feeds. ``tally_corpus.py`` reads it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import traceback
import warnings
from pathlib import Path
from typing import Any

if os.environ.get("PYTHONHASHSEED") != "0":
    # the exporters follow a set's order in places (make_test_models.py says where): one seed for every run
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "PYTHONHASHSEED": "0"})

import numpy as np  # noqa: E402
import onnx  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from make_test_models import _randomize  # noqa: E402  (the committed models' weights)

SEED = 20261205
EXPORT_SECONDS = 300  # one export; a dynamo export that runs longer is recorded as timed out
BATCH, SEQ = 2, 8


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    model_class: str  # what is exported: the bare model (last_hidden_state)
    config_class: str
    config: dict[str, Any]
    kind: str  # text | image | audio | seq2seq
    attention_blocks: int  # from the architecture: layers x attentions per layer
    blocks_why: str
    since: str = "4.0"  # the first transformers with this family
    eager: bool = False  # also exported with attn_implementation="eager"
    submodule: str = ""  # the part exported (Whisper: its encoder)
    optimum: tuple[str, str, str] | None = None  # (class saved, task, ONNX file of optimum's output)
    ort: dict[str, Any] | None = None  # ORT transformers optimizer: model_type, num_heads, hidden_size
    vocab: int = 0
    note: str = ""


BERT = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
            max_position_embeddings=16, hidden_act="gelu")
DECODER = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=32,
               max_position_embeddings=16)

FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("bert", "BertModel", "BertConfig", BERT, "text", 2, "2 layers x 1 self-attention", eager=True,
           optimum=("BertModel", "feature-extraction", "model.onnx"),
           ort=dict(model_type="bert", num_heads=2, hidden_size=32), vocab=64),
    Family("roberta", "RobertaModel", "RobertaConfig",
           dict(BERT, max_position_embeddings=24, pad_token_id=1), "text", 2, "2 layers x 1 self-attention",
           optimum=("RobertaModel", "feature-extraction", "model.onnx"), vocab=64),
    Family("distilbert", "DistilBertModel", "DistilBertConfig",
           dict(vocab_size=64, dim=32, n_layers=2, n_heads=2, hidden_dim=32, max_position_embeddings=16),
           "text", 2, "2 layers x 1 self-attention",
           optimum=("DistilBertModel", "feature-extraction", "model.onnx"),
           ort=dict(model_type="bert", num_heads=2, hidden_size=32), vocab=64),
    # all-MiniLM-L6-v2's attention: BERT with 32-wide heads (one head at hidden 32, the size budget's width)
    Family("minilm", "BertModel", "BertConfig", dict(BERT, num_attention_heads=1), "text", 2,
           "2 layers x 1 self-attention", optimum=("BertModel", "feature-extraction", "model.onnx"), vocab=64,
           note="MiniLM-class BERT (32-wide heads, as all-MiniLM-L6-v2; one of them)"),
    Family("vit", "ViTModel", "ViTConfig",
           dict(image_size=16, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=2,
                num_attention_heads=2, intermediate_size=32), "image", 2, "2 layers x 1 self-attention",
           optimum=("ViTModel", "feature-extraction", "model.onnx"),
           ort=dict(model_type="vit", num_heads=2, hidden_size=32)),
    Family("gpt2", "GPT2Model", "GPT2Config",
           dict(vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_positions=16, n_inner=32, use_cache=False,
                bos_token_id=1, eos_token_id=2), "text", 2, "2 blocks x 1 causal self-attention", eager=True,
           optimum=("GPT2LMHeadModel", "text-generation", "model.onnx"),
           ort=dict(model_type="gpt2", num_heads=2, hidden_size=32), vocab=64),
    # LLaMA-3-class: grouped key/value heads (4 query heads, 2 key/value heads), rope_theta 500000
    Family("llama", "LlamaModel", "LlamaConfig",
           dict(DECODER, num_key_value_heads=2, rope_theta=500000.0, hidden_act="silu"), "text", 2,
           "2 layers x 1 causal self-attention (grouped key/value heads)", eager=True,
           optimum=("LlamaForCausalLM", "text-generation", "model.onnx"), vocab=64),
    Family("qwen2", "Qwen2Model", "Qwen2Config",
           dict(DECODER, num_key_value_heads=2, use_sliding_window=False), "text", 2,
           "2 layers x 1 causal self-attention (grouped key/value heads, q/k/v biases)", since="4.37", eager=True,
           optimum=("Qwen2ForCausalLM", "text-generation", "model.onnx"), vocab=64),
    Family("phi", "PhiModel", "PhiConfig", dict(DECODER, partial_rotary_factor=0.5, hidden_act="gelu_new"),
           "text", 2, "2 layers x 1 causal self-attention (partial rotary)", since="4.36",
           optimum=("PhiForCausalLM", "text-generation", "model.onnx"), vocab=64),
    Family("mistral", "MistralModel", "MistralConfig", dict(DECODER, num_key_value_heads=2, sliding_window=4),
           "text", 2, "2 layers x 1 causal self-attention in a sliding window of 4 keys",
           optimum=("MistralForCausalLM", "text-generation", "model.onnx"), vocab=64),
    Family("whisper_encoder", "WhisperModel", "WhisperConfig",
           dict(d_model=32, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=32, num_mel_bins=16,
                max_source_positions=20, decoder_layers=1, decoder_attention_heads=4, decoder_ffn_dim=32,
                vocab_size=32, max_target_positions=16, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                decoder_start_token_id=1), "audio", 2, "2 encoder layers x 1 self-attention",
           submodule="encoder", optimum=("WhisperForConditionalGeneration", "automatic-speech-recognition",
                                         "encoder_model.onnx")),
    # ModernBERT: global attention every third layer, a local window of 4 keys elsewhere (banded)
    Family("modernbert", "ModernBertModel", "ModernBertConfig",
           dict(vocab_size=64, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=32,
                max_position_embeddings=16, local_attention=4, global_attn_every_n_layers=3, pad_token_id=0,
                bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2), "text", 3,
           "3 layers x 1 self-attention (layer 0 global, 1-2 local)", since="4.48",
           optimum=("ModernBertModel", "feature-extraction", "model.onnx"), vocab=64),
    Family("t5", "T5Model", "T5Config",
           dict(vocab_size=64, d_model=32, d_kv=16, d_ff=32, num_layers=2, num_decoder_layers=2, num_heads=2,
                relative_attention_num_buckets=8, relative_attention_max_distance=16, feed_forward_proj="relu",
                use_cache=False, decoder_start_token_id=0, pad_token_id=0), "seq2seq", 6,
           "2 encoder self + 2 decoder self + 2 cross attentions", vocab=64),
)}


def _version(text: str) -> tuple[int, ...]:
    out = []
    for part in text.split("+")[0].split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit())
        out.append(int(digits or 0))
    return tuple(out)


def _has_optimum() -> bool:
    try:
        from optimum.exporters.onnx import main_export  # noqa: F401
    except Exception:
        return False
    return True


# --- building and wrapping ------------------------------------------------------------------------


def build(fam: Family, attn: str | None, seed: int, cls: str | None = None):
    """The family's model with random weights; ``attn``: the attention implementation asked for (None: the
    version's default). Returns (module, the implementation it runs)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    config = getattr(transformers, fam.config_class)(**fam.config)
    model_class = getattr(transformers, cls or fam.model_class)
    if attn is None:
        model = model_class(config)
    else:
        model = model_class._from_config(config, attn_implementation=attn)
    model.eval()
    _randomize(model, seed)
    used = getattr(model.config, "_attn_implementation", None) or "eager"
    return model, used


def example_inputs(fam: Family, rng: np.random.Generator) -> tuple[list[str], list[np.ndarray], dict]:
    """(names, arrays, {name: {axis: symbol}}) of what the bare model is exported with."""
    seq = {0: "batch", 1: "sequence"}
    if fam.kind == "image":
        size = fam.config["image_size"]
        return (["pixel_values"], [rng.standard_normal((BATCH, 3, size, size)).astype(np.float32)],
                {"pixel_values": {0: "batch"}})
    if fam.kind == "audio":
        frames = 2 * fam.config["max_source_positions"]
        return (["input_features"],
                [rng.standard_normal((BATCH, fam.config["num_mel_bins"], frames)).astype(np.float32)],
                {"input_features": {0: "batch"}})
    ids = rng.integers(0, fam.vocab, (BATCH, SEQ)).astype(np.int64)
    mask = np.ones((BATCH, SEQ), np.int64)
    if fam.kind == "seq2seq":
        target = rng.integers(0, fam.vocab, (BATCH, 4)).astype(np.int64)
        return (["input_ids", "attention_mask", "decoder_input_ids"], [ids, mask, target],
                {"input_ids": seq, "attention_mask": seq, "decoder_input_ids": {0: "batch", 1: "target"}})
    return ["input_ids", "attention_mask"], [ids, mask], {"input_ids": seq, "attention_mask": seq}


def wrapped(model, fam: Family, names: list[str]):
    """The model as a module whose forward takes ``names`` as named tensors (so that torch's dynamic_axes
    translate) and returns the last hidden state alone."""
    import torch

    inner = getattr(model, fam.submodule) if fam.submodule else model
    extra = {"use_cache": False} if fam.kind == "seq2seq" or "use_cache" in fam.config else {}

    class Text(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = inner

        def forward(self, input_ids, attention_mask):
            return self.model(input_ids=input_ids, attention_mask=attention_mask, **extra).last_hidden_state

    class Seq2Seq(Text):
        def forward(self, input_ids, attention_mask, decoder_input_ids):
            return self.model(input_ids=input_ids, attention_mask=attention_mask,
                              decoder_input_ids=decoder_input_ids, **extra).last_hidden_state

    class Image(Text):
        def forward(self, pixel_values):
            return self.model(pixel_values=pixel_values).last_hidden_state

    class Audio(Text):
        def forward(self, input_features):
            return self.model(input_features=input_features).last_hidden_state

    module = {"text": Text, "seq2seq": Seq2Seq, "image": Image, "audio": Audio}[fam.kind]()
    assert names == list(module.forward.__code__.co_varnames[1:1 + len(names)]), names
    return module.eval()


# --- the exporters --------------------------------------------------------------------------------


class _Timeout(Exception):
    pass


@contextlib.contextmanager
def _deadline(seconds: int):
    def fire(*_):
        raise _Timeout(f"no result in {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _dims(names, dynamic):
    import torch

    Dim = torch.export.Dim
    auto = getattr(Dim, "DYNAMIC", None) or getattr(Dim, "AUTO", None)
    return {n: {ax: auto for ax in dynamic[n]} for n in names if n in dynamic}


def torch_export(module, args, names, dynamic, exporter: str, path: Path, notes: dict) -> int | None:
    """Write ``path`` (and any data file the exporter writes beside it); the opset asked (None: default).
    ``notes`` gets what was done otherwise than asked."""
    import torch

    kwargs: dict[str, Any] = dict(input_names=names, output_names=["last_hidden_state"])
    newer = _version(torch.__version__) >= (2, 5)
    if exporter == "torchscript":
        if newer:
            kwargs["dynamo"] = False
        torch.onnx.export(module, args, str(path), opset_version=17, do_constant_folding=True,
                          dynamic_axes={**{n: dynamic[n] for n in names if n in dynamic},
                                        "last_hidden_state": {0: "batch"}}, **kwargs)
        return 17
    if exporter == "dynamo":
        try:
            program = torch.onnx.export(module, args, dynamo=True, opset_version=18,
                                        dynamic_shapes=_dims(names, dynamic), **kwargs)
        except Exception as e:  # noqa: BLE001 (torch 2.5 cannot convert every symbolic shape)
            # static shapes, as the exporter does without dynamic_shapes: the attention's form is the same
            notes["static"] = f"dynamic shapes failed ({_error_line(e)}); exported with the example's static shapes"
            program = torch.onnx.export(module, args, dynamo=True, opset_version=18, **kwargs)
        program.save(str(path))
        return 18
    # torch's default exporter, as a user calls it: the dynamic axes in the long-standing keyword
    torch.onnx.export(module, args, str(path), dynamic_axes={n: dynamic[n] for n in names if n in dynamic},
                      **kwargs)
    return None


def optimum_export(fam: Family, seed: int, out: Path) -> Path:
    """optimum's exporter on the saved model (its default opset, its task's inputs); returns the ONNX file."""
    from optimum.exporters.onnx import main_export

    cls, task, file = fam.optimum
    model, _ = build(fam, None, seed, cls)
    with tempfile.TemporaryDirectory() as saved, tempfile.TemporaryDirectory() as written:
        model.save_pretrained(saved)
        main_export(saved, written, task=task, do_validation=False, device="cpu")
        src = Path(written) / file
        m = onnx.load(str(src))
        onnx.save_model(_strip(m), str(out))
    return out


def ort_optimize(src: Path, fam: Family, out: Path, fp16: bool, use_gpu: bool) -> None:
    """ORT's transformers optimizer as its documentation shows it, then (``fp16``) its float16 converter."""
    from onnxruntime.transformers import optimizer

    logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)
    with contextlib.redirect_stdout(io.StringIO()):
        opt = optimizer.optimize_model(str(src), use_gpu=use_gpu, **fam.ort)
        if fp16:
            opt.convert_float_to_float16(keep_io_types=True)
        opt.save_model_to_file(str(out))
    onnx.save_model(_strip(onnx.load(str(out))), str(out))


# --- the records ----------------------------------------------------------------------------------


def input_specs(fam: Family, path: Path) -> list[dict[str, Any]]:
    """What a run feeds each graph input: shape (batch 2, sequence 8, the rest as the graph fixes them) and
    int (uniform in [low, high)) | mask | positions | normal."""
    m = onnx.load(str(path), load_external_data=False)
    initializers = {t.name for t in m.graph.initializer}
    specs = []
    for i in m.graph.input:
        if i.name in initializers:
            continue
        t = i.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name
        shape = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
        if i.name in ("input_features",):
            shape = [BATCH, fam.config["num_mel_bins"], 2 * fam.config["max_source_positions"]]
        elif i.name == "pixel_values":
            shape = [BATCH, 3, fam.config["image_size"], fam.config["image_size"]]
        else:
            shape = [s if s else (BATCH if k == 0 else SEQ) for k, s in enumerate(shape)]
        spec: dict[str, Any] = {"name": i.name, "dtype": dtype, "shape": shape}
        if "mask" in i.name:
            spec["kind"] = "mask"
        elif i.name == "position_ids":
            spec["kind"] = "positions"
        elif i.name == "token_type_ids":
            spec.update(kind="int", low=0, high=1)
        elif dtype.startswith("int"):
            spec.update(kind="int", low=0, high=fam.vocab)
        else:
            spec["kind"] = "normal"
        specs.append(spec)
    return specs


def _strip(model: onnx.ModelProto) -> onnx.ModelProto:
    """make_test_models.py's clean-up, for any onnx of the corpus (1.15 has no node metadata_props): the
    doc strings and metadata of nodes and values go, the graph stays as exported."""
    def clear(proto) -> None:
        if hasattr(proto, "doc_string"):
            proto.doc_string = ""
        if "metadata_props" in type(proto).DESCRIPTOR.fields_by_name:
            del proto.metadata_props[:]

    def graph(g: onnx.GraphProto) -> None:
        clear(g)
        for n in g.node:
            clear(n)
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    graph(a.g)
                for sub in a.graphs:
                    graph(sub)
        for v in list(g.value_info) + list(g.input) + list(g.output) + list(g.initializer):
            clear(v)

    model.doc_string = ""
    del model.metadata_props[:]
    graph(model.graph)
    for f in model.functions:
        for n in f.node:
            clear(n)
    return model


def _data_files(path: Path) -> list[str]:
    m = onnx.load(str(path), load_external_data=False)
    return sorted({kv.value for t in m.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL
                   for kv in t.external_data if kv.key == "location"})


def _clean(path: Path) -> None:
    """Strip the exporter's stack traces, keeping the weights where the exporter put them."""
    data = _data_files(path)
    m = onnx.load(str(path), load_external_data=False)
    _strip(m)
    onnx.save_model(m, str(path))
    assert _data_files(path) == data


def _error_line(e: BaseException) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))  # the exporters' terminal colours
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:400]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for the exports and records.json")
    ap.add_argument("--only", action="append", choices=sorted(FAMILIES), help="families to export")
    ap.add_argument("--exporter", action="append", choices=("torchscript", "dynamo", "default", "optimum"),
                    help="exporters to run (default: every one this environment has)")
    ap.add_argument("--ort-gpu", action="store_true",
                    help="also ORT's transformers optimizer with use_gpu=True (onnxruntime-gpu on a GPU machine)")
    args = ap.parse_args()

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    import transformers

    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    import onnxruntime

    tv, pv = _version(transformers.__version__), _version(torch.__version__)
    available = ["torchscript"] + (["dynamo"] if pv >= (2, 5) else []) + (["default"] if pv >= (2, 9) else [])
    available += ["optimum"] if _has_optimum() else []
    exporters = [e for e in available if not args.exporter or e in args.exporter]
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    records_path = out / "records.json"
    versions = {"python": sys.version.split()[0], "torch": torch.__version__,
                "transformers": transformers.__version__, "onnx": onnx.__version__,
                "onnxruntime": onnxruntime.__version__, "seed": SEED}
    if "optimum" in available:
        from importlib.metadata import version

        versions["optimum"] = version("optimum")
        with contextlib.suppress(Exception):
            versions["optimum-onnx"] = version("optimum-onnx")
    old = json.loads(records_path.read_text())["exports"] if records_path.exists() else []
    families = [f for f in FAMILIES.values() if not args.only or f.name in args.only]
    redo = {f.name for f in families}
    records = [r for r in old if r["family"] not in redo or r["exporter"].split("+")[0] not in exporters]
    unsupported = {}

    def save() -> None:
        body = {"versions": versions, "exporters": available, "unsupported": unsupported,
                "exports": sorted(records, key=lambda r: r["file"])}
        records_path.write_text(json.dumps(body, indent=1) + "\n")

    for k, fam in enumerate(families):
        seed = SEED + 10 * k
        if tv < _version(fam.since):
            unsupported[fam.name] = f"transformers {transformers.__version__} has no {fam.model_class}"
            print(f"{fam.name}: {unsupported[fam.name]}", flush=True)
            continue
        attns = [None, "eager"] if fam.eager else [None]
        for exporter in exporters:
            default_used = None  # what the version's default attention resolved to for this family
            for attn in (attns if exporter != "optimum" else [None]):
                if exporter == "optimum" and fam.optimum is None:
                    continue
                if attn == "eager" and default_used == "eager":
                    continue  # the default is the eager code already: the same export
                stem = fam.name + ("_eager" if attn else "") + f"_{exporter}"
                record: dict[str, Any] = {"family": fam.name, "model_class": fam.model_class,
                                          "config": fam.config, "exporter": exporter,
                                          "attention_blocks": fam.attention_blocks, "blocks_why": fam.blocks_why,
                                          "attn_asked": attn or "default", "post": "raw"}
                if fam.note:
                    record["note"] = fam.note
                tmp = out / f"{stem}.tmp.onnx"
                try:
                    with _deadline(EXPORT_SECONDS), warnings.catch_warnings(), \
                            contextlib.redirect_stdout(io.StringIO()):
                        warnings.simplefilter("ignore")
                        if exporter == "optimum":
                            optimum_export(fam, seed, tmp)
                            record["attn_used"] = "optimum's choice"
                            opset = None
                        else:
                            rng = np.random.default_rng(seed)
                            model, record["attn_used"] = build(fam, attn, seed)
                            default_used = default_used or record["attn_used"]
                            names, arrays, dynamic = example_inputs(fam, rng)
                            args_t = tuple(torch.from_numpy(a) for a in arrays)
                            with torch.no_grad():
                                opset = torch_export(wrapped(model, fam, names), args_t, names, dynamic, exporter,
                                                     tmp, record)
                except BaseException as e:  # noqa: BLE001 (an exporter's failure is a result)
                    if isinstance(e, KeyboardInterrupt):
                        raise
                    record.update(file=f"{stem}.onnx", status="export failed", error=_error_line(e))
                    print(f"{stem}: export failed: {record['error']}", flush=True)
                    if os.environ.get("EXPORT_TRACEBACK"):
                        traceback.print_exc()
                    for p in out.glob(f"{stem}.tmp.onnx*"):
                        p.unlink()
                    records.append(record)
                    save()
                    continue
                m = onnx.load(str(tmp), load_external_data=False)
                opset = {o.domain: o.version for o in m.opset_import}.get("", opset)
                final = out / f"{stem}_op{opset}.onnx"
                data = _data_files(tmp)
                if data:  # the exporter's data file as it wrote it (which tensors, their offsets), renamed
                    assert len(data) == 1, data
                    m = _strip(onnx.load(str(tmp), load_external_data=False))
                    for t in m.graph.initializer:
                        for kv in t.external_data:
                            if kv.key == "location":
                                kv.value = final.name + ".data"
                    shutil.move(str(out / data[0]), str(out / (final.name + ".data")))
                    onnx.save_model(m, str(final))
                    tmp.unlink()
                else:
                    shutil.move(str(tmp), str(final))
                    _clean(final)
                for p in out.glob(f"{stem}.tmp.onnx*"):
                    p.unlink()
                record.update(file=final.name, status="ok", opset=opset, external_data=_data_files(final) or None,
                              inputs=input_specs(fam, final),
                              bytes=sum(p.stat().st_size for p in out.glob(final.name + "*")))
                records.append(record)
                print(f"{final.name}: {record['bytes']} bytes, attention {record['attn_used']}", flush=True)
                save()
                if exporter == "torchscript" and attn is None and fam.ort:
                    for fp16 in (False, True):
                        for use_gpu in (False, True) if args.ort_gpu else (False,):
                            name = final.stem + ("_ortgpu" if use_gpu else "_ort") + ("fp16" if fp16 else "opt")
                            post = dict(record, file=f"{name}.onnx", post="ort-fp16" if fp16 else "ort-optimizer",
                                        ort_optimizer=dict(fam.ort, use_gpu=use_gpu), external_data=None)
                            try:
                                ort_optimize(final, fam, out / post["file"], fp16, use_gpu)
                                post.update(status="ok", inputs=input_specs(fam, out / post["file"]),
                                            bytes=(out / post["file"]).stat().st_size)
                                print(f"{post['file']}: {post['bytes']} bytes", flush=True)
                            except Exception as e:  # noqa: BLE001
                                post.update(status="ort optimizer failed", error=_error_line(e))
                                print(f"{post['file']}: {post['error']}", flush=True)
                            records.append(post)
                            save()
    save()
    print(f"{len(records)} records in {records_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
