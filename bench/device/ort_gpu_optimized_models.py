"""Run ONNX Runtime's transformers optimizer the way its documentation says for a GPU (``use_gpu=True``),
then its float16 converter, on committed raw exports: the models users deploy on CUDA, with the
``MemcpyFromHost`` / ``MemcpyToHost`` nodes ORT's CUDA session saves into them. Needs a CUDA GPU (ORT only
writes those nodes when its CUDA provider places the graph), so it runs on the device machine:

    python3 bench/device/ort_gpu_optimized_models.py OUT_DIR

It writes ``<model>_ortgpu.onnx`` (fp32) and ``<model>_ortgpu_fp16.onnx`` for each model below, and prints
per file the Memcpy nodes it holds and where they read from. The files are small (the tiny test configs of
``tests/models/manifest.json``): the ones a test needs are copied into ``tests/models/`` with a manifest
entry, the way ``scripts/make_test_models.py`` records its models.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# (committed raw export, ORT optimizer model_type): encoders with a padding mask and decoders with a causal one
MODELS = [
    ("bert_torchscript_op14.onnx", "bert"),
    ("bert_dynamo_op18.onnx", "bert"),
    ("gpt2_torchscript_op14.onnx", "gpt2"),
    ("llama_torchscript_op17.onnx", "bert"),
    ("phi_torchscript_op17.onnx", "bert"),
    ("vit_torchscript_op15.onnx", "vit"),
]


def main(out_dir: str) -> int:
    import onnx
    import onnxruntime as ort
    from onnxruntime.transformers.optimizer import optimize_model

    ort.preload_dlls()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    manifest = {e["file"]: e for e in json.loads((ROOT / "tests/models/manifest.json").read_text())["models"]}
    report = {}
    for name, model_type in MODELS:
        config = manifest[name]["config"]
        heads, hidden = config.get("num_attention_heads", 0), config.get("hidden_size", 0)
        src = ROOT / "tests/models" / name
        stem = name[: -len(".onnx")]
        try:
            opt = optimize_model(str(src), model_type=model_type, num_heads=heads, hidden_size=hidden,
                                 use_gpu=True, opt_level=None)
            opt.save_model_to_file(str(out / f"{stem}_ortgpu.onnx"))
            opt.convert_float_to_float16(keep_io_types=True)
            opt.save_model_to_file(str(out / f"{stem}_ortgpu_fp16.onnx"))
        except Exception as e:  # noqa: BLE001 - one model's failure is a line of the report
            report[name] = f"failed: {type(e).__name__}: {e}"
            print(f"{name}: {report[name]}", flush=True)
            continue
        for suffix in ("_ortgpu", "_ortgpu_fp16"):
            m = onnx.load(str(out / f"{stem}{suffix}.onnx"))
            memcpy = [n for n in m.graph.node if n.op_type.startswith("Memcpy")]
            producers = {o: n for n in m.graph.node for o in n.output}
            where = [f"{n.op_type}({producers[n.input[0]].op_type if n.input[0] in producers else n.input[0]})"
                     for n in memcpy]
            ops = Counter(n.op_type for n in m.graph.node)
            report[f"{stem}{suffix}"] = {"memcpy": where, "attention_ops": {k: v for k, v in ops.items()
                                                                             if "Attention" in k}}
            print(f"{stem}{suffix}: {len(memcpy)} Memcpy {where[:6]}; {report[f'{stem}{suffix}']['attention_ops']}",
                  flush=True)
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/ortgpu"))
