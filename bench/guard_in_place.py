"""Whether ONNX Runtime runs the attention rule's row guard (``ai.onnxfuse.FillMaskedRows``) in place, per
provider and graph-optimization level, on the models of bench/e2e.py built the same way (torch.onnx export
with sdpa attention, ORT's transformers optimizer + fp16 on CUDA, then onnxfuse).

Why: in place, a guard reads its flags and writes the rows it fills, nearly none; given a buffer of its own,
it copies every kept row (H200, float16, B=32: 4 µs a layer). Only ORT's memory planner decides, from the
shapes it can prove equal; the op says which it got, once per node, in ORT's verbose log. Each session runs
in a child process whose log is read here, and the graph ORT optimized (at its full level) is described
around each guard: what feeds it, what it feeds, and the shapes ORT holds for its input and output.

    python3 bench/guard_in_place.py --provider cuda            # on the GPU machine, tiny models (the plan
                                                               # does not depend on the sizes)
    python3 bench/guard_in_place.py --provider cpu --dtype fp32

Prints a line per model and level; ``--json`` writes the records. Exit 0 when every guard of every session
runs in place, 1 when some copy, 2 when a session could not run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LEVELS = ("ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL")
_SAID = re.compile(r"FillMaskedRows node '([^']*)': (runs in place|copies the kept rows)")


def run_session(model: str, provider: str, level: str, optimized: str | None, batch: int, sequence: int) -> None:
    """The child: one session at ``level`` with ORT's log at verbose, two runs on random inputs."""
    import onnx
    import onnxruntime as ort

    from onnxfuse.inputs import random_inputs
    from onnxfuse.runtime import create_session

    proto = onnx.load(model)
    so = ort.SessionOptions()
    so.log_severity_level = 0
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    if optimized:
        so.optimized_model_filepath = optimized
    shapes = {i.name: (batch, sequence) for i in proto.graph.input if i.name != "pixel_values"}
    feeds = random_inputs(proto, shapes, seed=0)
    session = create_session(model, provider, sess_options=so)
    for _ in range(2):
        session.run(None, feeds)


def said(stderr: str) -> dict[str, str]:
    """node name -> "in place" | "copies", from the op's verbose lines."""
    return {m.group(1): ("in place" if m.group(2) == "runs in place" else "copies") for m in _SAID.finditer(stderr)}


def describe_guards(path: str) -> list[dict]:
    """Each guard of an optimized graph: its producer and consumers, and the type/shape ORT holds for X, Y."""
    import onnx

    proto = onnx.load(path, load_external_data=False)
    shapes = {}
    for vi in list(proto.graph.value_info) + list(proto.graph.output) + list(proto.graph.input):
        t = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim] \
            if t.HasField("shape") else None
        shapes[vi.name] = {"elem_type": t.elem_type, "dims": dims}
    made_by = {out: n for n in proto.graph.node for out in n.output}
    guards = []
    for node in proto.graph.node:
        if node.op_type != "FillMaskedRows":
            continue
        x, y = node.input[0], node.output[0]
        producer = made_by.get(x)
        guards.append({
            "node": node.name,
            "x_from": f"{producer.domain or 'ai.onnx'}.{producer.op_type}" if producer else "graph input",
            "y_to": sorted({f"{n.domain or 'ai.onnx'}.{n.op_type}" for n in proto.graph.node if y in n.input}),
            "x": shapes.get(x), "y": shapes.get(y),
        })
    return guards


def build(spec, workdir: Path, dtype: str, provider: str, tiny: bool) -> Path:
    import e2e

    from onnxfuse.pipeline import optimize_file

    raw, base, fused = (workdir / f"{spec.name}.{kind}.onnx" for kind in ("raw", "ortopt", "onnxfuse"))
    e2e.export(spec, tiny, raw, "sdpa")
    e2e.ort_optimize(spec, tiny, raw, base, fp16=dtype == "fp16", use_gpu=provider == "cuda")
    optimize_file(str(base), str(fused))
    return fused


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--provider", choices=["cpu", "cuda"], default="cuda")
    parser.add_argument("--dtype", choices=["fp16", "fp32"], default=None, help="default: fp16 on cuda, fp32 on cpu")
    parser.add_argument("--models", default="bert-base,gpt2-small")
    parser.add_argument("--full", action="store_true", help="the full-size models (default: tiny ones)")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--sequence", type=int, default=16)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--child", nargs=3, metavar=("MODEL", "LEVEL", "OPTIMIZED"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        model, level, optimized = args.child
        run_session(model, args.provider, level, optimized or None, args.batch, args.sequence)
        return 0
    import e2e

    dtype = args.dtype or ("fp16" if args.provider == "cuda" else "fp32")
    specs = {s.name: s for s in e2e.SPECS}
    records, worst = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        for name in args.models.split(","):
            fused = build(specs[name], workdir, dtype, args.provider, tiny=not args.full)
            for level in LEVELS:
                optimized = str(workdir / f"{name}.{level}.onnx") if level == "ORT_ENABLE_ALL" else ""
                child = subprocess.run(
                    [sys.executable, __file__, "--provider", args.provider, "--batch", str(args.batch),
                     "--sequence", str(args.sequence), "--child", str(fused), level, optimized],
                    capture_output=True, text=True, env=os.environ | {"PYTHONUNBUFFERED": "1"})
                record = {"model": name, "provider": args.provider, "dtype": dtype, "level": level,
                          "returncode": child.returncode, "guards": said(child.stderr)}
                if child.returncode != 0:
                    record["error"] = child.stderr.strip().splitlines()[-1:]
                    worst = 2
                elif optimized:
                    record["optimized_graph"] = describe_guards(optimized)
                counts = {k: list(record["guards"].values()).count(k) for k in ("in place", "copies")}
                if counts["copies"] or not record["guards"]:
                    worst = max(worst, 1)
                records.append(record)
                print(f"{name} {args.provider} {dtype} {level}: {counts['in place']} in place, "
                      f"{counts['copies']} copy" + (f"  ERROR {record['error']}" if "error" in record else ""),
                      flush=True)
                for guard in record.get("optimized_graph", [])[:1]:
                    print(f"  first guard after ORT's optimizer: {json.dumps(guard)}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"command": " ".join(sys.argv), "records": records}, indent=1))
    return worst


if __name__ == "__main__":
    sys.exit(main())
