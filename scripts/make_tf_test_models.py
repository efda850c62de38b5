#!/usr/bin/env python3
"""Export the tiny Keras models of tests/models/ through tf2onnx, and record them in its manifest.

Keras ``Dense`` on a 3-D input is ``tf.tensordot``, which tf2onnx writes as ``Reshape(X, [-1, K]) → MatMul
→ Reshape(shape computed from Shape(X))``, followed by ``Add(bias)`` when the bias is not zero (tf2onnx
drops an all-zero bias). Each model is a two-layer encoder (LayerNorm, Dense + GELU, Dense, residual) with
the batch and sequence dims dynamic:

* ``keras_encoder_tf2onnx_op13``: biases drawn at random, GELU as Hugging Face's TF models write it
  (``0.5·x·(1 + erf(x/√2))`` with ``tf.math.erf``): the tensordot with its bias Add;
* ``keras_encoder_freshinit_tf2onnx_op17``: Keras' default initialisation (zero biases): the tensordot
  without an Add;
* ``keras_dense_tanh_tf2onnx_op15``: random biases, Keras' own ``gelu(approximate=True)``;
* ``keras_dense_tanh_tf2onnx_op15_ortopt``: that one after ONNX Runtime's transformers optimizer with
  ``model_type="bert_tf"`` (its GELU becomes ``com.microsoft.FastGelu``; the tensordot stays).

    /work/tfvenv/bin/python scripts/make_tf_test_models.py   # a venv with the export-tf extra

Needs the ``export-tf`` extra (``pip install ".[export-tf]"`` in a venv of its own: tensorflow-cpu and
tf2onnx pin a protobuf and numpy of their own). Seeded, with the hash seed fixed and the initializers
sorted by name (the one change made to tf2onnx's output): two runs write the same weights and ops; only
the name that tf2onnx keeps for constants it merges (0.5, 1.0, shape vectors shared by both layers) can
differ from run to run, so the files are equivalent rather than byte-identical. Expected counts
come from the architecture (one Dense+GELU per layer), never from the rewriter.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
if os.environ.get("PYTHONHASHSEED") != "0":
    # tf2onnx orders initializers and picks among merged duplicates by set iteration: fix the hash seed so
    # two runs write the same bytes.
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "PYTHONHASHSEED": "0"})

import numpy as np  # noqa: E402
import onnx  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "tests" / "models" / "manifest.json"
SEED = 20261201
HIDDEN, FFN, LAYERS = 32, 64, 2
PREFIX = "keras_"


def _erf_gelu(x):
    import tensorflow as tf

    # as transformers' TF models wrote it (modeling_tf_utils / activations_tf.gelu)
    return 0.5 * x * (1.0 + tf.math.erf(x / tf.cast(tf.sqrt(2.0), x.dtype)))


def _tanh_gelu(x):
    import keras

    return keras.activations.gelu(x, approximate=True)


MODELS = {
    # stem: (activation, random biases, opset, approximate, gelu form)
    "keras_encoder_tf2onnx_op13": (_erf_gelu, True, 13, "none", "tf.math.erf GELU (Hugging Face's TF gelu)"),
    "keras_encoder_freshinit_tf2onnx_op17": (_erf_gelu, False, 17, "none",
                                             "tf.math.erf GELU, Keras default init (zero biases)"),
    "keras_dense_tanh_tf2onnx_op15": (_tanh_gelu, True, 15, "tanh", "keras.activations.gelu(approximate=True)"),
}


def build(activation, random_bias: bool, seed: int):
    import keras

    keras.utils.set_random_seed(seed)
    bias = "random_normal" if random_bias else "zeros"
    x = inp = keras.Input((None, HIDDEN), name="x")
    for layer in range(LAYERS):
        h = keras.layers.LayerNormalization(name=f"layer{layer}_norm")(x)
        h = keras.layers.Dense(FFN, activation=activation, bias_initializer=bias, name=f"layer{layer}_ffn_in")(h)
        h = keras.layers.Dense(HIDDEN, bias_initializer=bias, name=f"layer{layer}_ffn_out")(h)
        x = keras.layers.Add(name=f"layer{layer}_residual")([x, h])
    return keras.Model(inp, x, name="encoder")


def export(stem: str, out_dir: Path) -> dict:
    import tensorflow as tf
    import tf2onnx

    activation, random_bias, opset, approximate, form = MODELS[stem]
    model = build(activation, random_bias, SEED + len(stem))
    spec = (tf.TensorSpec((None, None, HIDDEN), tf.float32, name="x"),)
    proto, _ = tf2onnx.convert.from_keras(model, input_signature=spec, opset=opset)
    proto.producer_version = ""  # the converter's build string is not part of the model
    # tf2onnx lists initializers in an order that changes from run to run: by name, so runs agree
    inits = sorted(proto.graph.initializer, key=lambda t: t.name)
    proto.graph.ClearField("initializer")
    proto.graph.initializer.extend(inits)
    onnx.checker.check_model(proto, full_check=True)
    path = out_dir / f"{stem}.onnx"
    onnx.save_model(proto, str(path))
    ops: dict[str, int] = {}
    for n in proto.graph.node:
        if n.op_type in ("Erf", "Tanh", "Pow", "Gemm", "MatMul"):
            ops[n.op_type] = ops.get(n.op_type, 0) + 1
    family = stem.split("_tf2onnx")[0].replace("_freshinit", "")
    return {
        "file": path.name,
        "family": family,
        **({"variant": "Keras default initialisation (zero biases: tf2onnx writes no bias Add)"}
           if "freshinit" in stem else {}),
        "keras_model": f"{LAYERS} x (LayerNormalization, Dense({FFN}) + GELU, Dense({HIDDEN}), residual Add)",
        "exporter": "tf2onnx",
        "opset": opset,
        "post": "raw",
        "dtype": "float32",
        "external_data": None,
        "expected_fused": LAYERS,
        "expected_fused_why": f"{LAYERS} layers x 1 Dense (tensordot on a 3-D input) + GELU",
        "expected_approximate": approximate,
        "expected_refused": 0,
        "expected_refused_why": "every Dense+GELU is a tensordot of X over its last axis with a constant kernel",
        "gelu_form": form,
        "inputs": [{"name": "x", "dtype": "float32", "shape": [2, 8, HIDDEN], "kind": "normal"}],
        "outputs": [o.name for o in proto.graph.output],
        "ops": dict(sorted(ops.items())),
        "bytes": path.stat().st_size,
        "generator": {"tensorflow": tf.__version__, "tf2onnx": tf2onnx.__version__, "onnx": onnx.__version__,
                      "seed": SEED},
    }


# (source stem, ORT transformers-optimizer arguments): the Keras exports as ORT's optimizer rewrites them
ORT_POST = {"keras_dense_tanh_tf2onnx_op15": dict(model_type="bert_tf", num_heads=2, hidden_size=HIDDEN)}


def ort_optimize(entry: dict, out_dir: Path) -> dict:
    import logging

    import onnxruntime
    from onnxruntime.transformers import optimizer

    logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)
    src = out_dir / entry["file"]
    args = ORT_POST[src.stem]
    path = out_dir / f"{src.stem}_ortopt.onnx"
    opt = optimizer.optimize_model(str(src), opt_level=0, use_gpu=False, **args)
    opt.save_model_to_file(str(path))
    proto = onnx.load(str(path))
    ops: dict[str, int] = {}
    for n in proto.graph.node:
        key = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
        if key in ("Erf", "Tanh", "Pow", "Gemm", "MatMul", "com.microsoft.FastGelu", "com.microsoft.BiasGelu",
                   "com.microsoft.Gelu"):
            ops[key] = ops.get(key, 0) + 1
    return {**entry, "file": path.name, "post": "ort-optimizer", "ort_optimizer": dict(args, opt_level=0),
            "ops": dict(sorted(ops.items())), "bytes": path.stat().st_size,
            "generator": {**entry["generator"], "onnxruntime": onnxruntime.__version__}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="write the models here instead of tests/models/ (manifest untouched)")
    args = ap.parse_args(argv)
    out_dir = args.out or MANIFEST.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    entries = [export(stem, out_dir) for stem in MODELS]
    entries += [ort_optimize(e, out_dir) for e in list(entries) if Path(e["file"]).stem in ORT_POST]
    for e in entries:
        print(f"wrote {out_dir / e['file']}", e["ops"], f"{e['bytes']} bytes")
    if args.out is None:
        manifest = json.loads(MANIFEST.read_text())
        kept = [m for m in manifest["models"] if not m["file"].startswith(PREFIX)]
        manifest["models"] = sorted(kept + entries, key=lambda m: m["file"])
        MANIFEST.write_text(json.dumps(manifest, indent=1) + "\n")
        print(f"updated {MANIFEST.relative_to(ROOT)} ({len(entries)} Keras models)")
    return 0


if __name__ == "__main__":
    np.random.seed(SEED)
    sys.exit(main())
