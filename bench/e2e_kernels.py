"""Where one inference's GPU time goes, before and after onnxfuse: every CUDA kernel of BERT-base, GPT-2
small and ViT-B/16 (the models of bench/e2e.py, built the same way: torch.onnx export, ORT's transformers
optimizer + fp16, then onnxfuse) at one batch size, read by CUPTI through torch.profiler (GPU time only:
host overhead and launch gaps excluded), grouped by what each kernel does.

Why: the fusion removes the GELU kernels (ORT's BiasGelu / FastGelu) and replaces the FFN's up-projection
GEMM with one kernel. Their share of the baseline's GPU time bounds what the fusion can save: a fused kernel
running exactly at the speed of the GEMM it replaces cuts the time by the GELU kernels' share, no more.
The table puts that bound beside what the fused model achieves, so a latency goal can be judged against
what is physically on the table.

On the H200 (after steps 1-3 of bench/device/build_library.sh, carrying ``.device/lib``):

    export PYTHONPATH=/tmp/site:$PWD ONNXFUSE_LIBRARY=$PWD/.device/lib/libonnxfuse_ops.so \\
        LD_LIBRARY_PATH=$PWD/.device/lib PYTHONUNBUFFERED=1 && python3 bench/e2e_kernels.py --out $OUT

Writes ``e2e_kernels.json`` and ``e2e_kernels.md`` to OUT (default ``$OUT``, else ``bench/results``).
Here, at toy size on a machine without a GPU, nothing can be profiled: the script says so and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import e2e  # noqa: E402  (bench/e2e.py: the same models, built the same way)
from cupti import kernel_times_us, require_kernels  # noqa: E402
import onnx  # noqa: E402

from onnxfuse.measure.device_run import DeviceRun, output_shapes  # noqa: E402
from onnxfuse.measure.environment import environment  # noqa: E402
from onnxfuse.pipeline import optimize_file  # noqa: E402
from onnxfuse.inputs import random_inputs  # noqa: E402
from onnxfuse.runtime import create_session, cuda_usable, preload_cuda_libraries  # noqa: E402

# Kernel groups, first match wins (lower-case substrings of the kernel's name).
GROUPS = (
    # the row guard of sdpa exports (ai.onnxfuse FillMaskedRows), before the FusedLinearGelu group's "onnxfuse"
    ("onnxfuse FillMaskedRows", ("fill_masked_rows",)),
    # ... and that guard folded into the layer norm behind the projection (MaskedSkipLayerNormalization)
    ("onnxfuse MaskedSkipLayerNorm", ("masked_skip_norm",)),
    ("onnxfuse FusedLinearGelu", ("onnxfuse", "cutlassactivation")),
    ("GELU (BiasGelu, FastGelu, Gelu)", ("gelu",)),
    # ORT's fused attention kernels (flash, cuDNN SDPA, memory-efficient/CUTLASS FMHA, its unfused fallback)
    ("fused attention (MHA/Attention)", ("fmha", "flash", "mha", "attention", "cudnn", "sdpa", "attn")),
    # what an unfused attention leaves: softmax, torch's NaN guard, the mask's Where
    ("Softmax", ("softmax",)),
    ("IsNaN / Where", ("isnan", "where")),
    ("layer norm", ("layernorm", "layer_norm", "skiplayer")),
    ("GEMM", ("gemm", "xmma", "nvjet", "cutlass", "cublas", "sm90_", "sm80_", "wgmma")),
)
OTHER = "other (casts, adds, copies, ...)"


def group_of(kernel_name: str) -> str:
    name = kernel_name.lower()
    for group, keys in GROUPS:
        if any(k in name for k in keys):
            return group
    return OTHER


def summarise(per_kernel: dict[str, float]) -> dict:
    groups: dict[str, float] = {}
    for name, us in per_kernel.items():
        groups[group_of(name)] = groups.get(group_of(name), 0.0) + us
    top = sorted(per_kernel.items(), key=lambda kv: -kv[1])[:10]
    return {
        "total_us": round(sum(per_kernel.values()), 1),
        "groups_us": {g: round(us, 1) for g, us in sorted(groups.items(), key=lambda kv: -kv[1])},
        "top_kernels_us": [[name[:160], round(us, 1)] for name, us in top],
    }


def run_model(spec: e2e.Spec, batch: int, sequence: int, reps: int, workdir: Path, attn: str,
              exporter: str = "torchscript", opset: int = 17) -> dict:
    raw, base, fused = (workdir / f"{spec.name}.{kind}.onnx" for kind in ("raw", "ortopt", "onnxfuse"))
    e2e.export(spec, False, raw, attn, exporter, opset)
    e2e.ort_optimize(spec, False, raw, base, fp16=True, use_gpu=True)
    raw.unlink()
    report = optimize_file(str(base), str(fused))
    if spec.images:
        shapes = {spec.inputs[0]: (batch, 3, spec.full["image_size"], spec.full["image_size"])}
    else:
        shapes = {name: (batch, sequence) for name in spec.inputs}
    record = {"model": spec.name, "batch": batch, "attn": attn, "exporter": exporter, "opset": opset, "fused_blocks": len(report.fused),
              "fused_by_op": report.fused_by_op, "profiles": {}}
    for role, path in (("baseline", base), ("onnxfuse", fused)):
        proto = onnx.load(str(path), load_external_data=False)
        feeds = random_inputs(proto, shapes, seed=0)
        session = create_session(str(path), "cuda")
        run = DeviceRun(session, feeds, output_shapes(session, feeds))
        record["profiles"][role] = summarise(require_kernels(kernel_times_us(run, reps=reps, warmup=5)))
        e2e.log(f"{spec.name} B={batch} {role}: {record['profiles'][role]['total_us']} us of GPU time per inference")
    b, f = record["profiles"]["baseline"], record["profiles"]["onnxfuse"]
    gelu = b["groups_us"].get("GELU (BiasGelu, FastGelu, Gelu)", 0.0)
    record["gelu_share_of_baseline"] = round(gelu / b["total_us"], 4)
    record["gpu_time_cut"] = round(1.0 - f["total_us"] / b["total_us"], 4)
    for path in (base, fused):
        path.unlink()
        Path(f"{path}.data").unlink(missing_ok=True)
    return record


def table(records: list[dict]) -> list[str]:
    lines = [
        "| model | batch | baseline GPU µs | GELU kernels µs (share = the bound) | + onnxfuse GPU µs | fused kernels µs | GPU time cut |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in records:
        b, f = r["profiles"]["baseline"], r["profiles"]["onnxfuse"]
        gelu = b["groups_us"].get("GELU (BiasGelu, FastGelu, Gelu)", 0.0)
        ours = f["groups_us"].get("onnxfuse FusedLinearGelu", 0.0)
        lines.append(
            f"| {r['model']} | {r['batch']} | {b['total_us']:.0f} | {gelu:.0f} ({100 * r['gelu_share_of_baseline']:.1f} %) "
            f"| {f['total_us']:.0f} | {ours:.0f} | {100 * r['gpu_time_cut']:+.1f} % |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(e2e.DEFAULT_MODELS), help="of: " + ", ".join(s.name for s in e2e.SPECS))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--sequence", type=int, default=e2e.SEQUENCE)
    parser.add_argument("--reps", type=int, default=20, help="profiled inferences per model and role")
    parser.add_argument("--out", default=os.environ.get("OUT") or "bench/results")
    parser.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa", help="attention implementation of the export")
    parser.add_argument("--exporter", choices=["torchscript", "dynamo"], default="torchscript", help="torch.onnx's exporter")
    parser.add_argument("--opset", type=int, default=17, help="the export's opset")
    args = parser.parse_args(argv)
    preload_cuda_libraries()
    if not cuda_usable():
        print("e2e_kernels: no usable CUDA execution provider here; run it on a GPU machine", file=sys.stderr)
        return 2
    wanted = [s for s in e2e.SPECS if s.name in args.models.split(",")]
    start = time.perf_counter()
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for spec in wanted:
            records.append(run_model(spec, args.batch, args.sequence, args.reps, Path(tmp), args.attn, args.exporter,
                                     args.opset))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python3 bench/e2e_kernels.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    meta = {"command": command, "seconds": round(time.perf_counter() - start, 1), "environment": environment()}
    (out / "e2e_kernels.json").write_text(json.dumps(meta | {"records": records}, indent=2) + "\n")
    lines = table(records)
    header = [
        f"GPU time of one inference by kernel group, fp16 after ORT's transformers optimizer, CUPTI (torch.profiler), "
        f"mean of {args.reps} inferences. Command: `{command}`.",
        "",
        "The GELU kernels' share of the baseline is the most a Linear+GELU fusion can cut if the fused kernel runs",
        "at exactly the speed of the GEMM it replaces.",
        "",
    ]
    groups = [""]
    for r in records:
        for role in ("baseline", "onnxfuse"):
            g = r["profiles"][role]["groups_us"]
            groups.append(f"- {r['model']} {role}: " + ", ".join(f"{k} {v:.0f}" for k, v in g.items()))
    (out / "e2e_kernels.md").write_text("\n".join(header + lines + groups) + "\n")
    print("\n".join(lines + groups))
    return 0


if __name__ == "__main__":
    sys.exit(main())
