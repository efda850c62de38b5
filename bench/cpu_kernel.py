#!/usr/bin/env python3
"""CPU kernel benchmark: the fused FusedLinearGelu node against ONNX Runtime's own unfused
MatMul + Add + Gelu (opset 20, ORT_ENABLE_ALL) on the CPU execution provider, in the same run.

Both models see the same X, W, b; both sessions use the same intra-op thread count (default 2, the
team's machines). Calls are interleaved (fused, unfused, MatMul alone, fused, ...) so a noisy neighbour
or a clock change shifts every column alike; each column reports the median of `--reps` calls after
warm-up. "MatMul alone" is ORT's MLAS GEMM with no bias and no activation: the floor a fused kernel is
measured against. The goal is fused / unfused <= 1.0 at every shape.

    python bench/cpu_kernel.py                    # the four issue shapes, fp32, 2 threads
    python bench/cpu_kernel.py --shapes 256x768x3072 --approximate tanh --dtype float16

Writes bench/results/cpu_kernel.json and cpu_kernel.md (or --out PREFIX).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from onnxfuse.domain import DOMAIN, OP_TYPE, DOMAIN_VERSION  # noqa: E402
from onnxfuse.runtime import create_session  # noqa: E402

ISSUE_SHAPES = [(128, 768, 3072), (1024, 768, 3072), (128, 1024, 4096), (2048, 1024, 4096)]
_TYPES = {"float32": (TensorProto.FLOAT, np.float32), "float16": (TensorProto.FLOAT16, np.float16)}


def _model(nodes, inputs, outputs, inits, domain=False) -> bytes:
    opsets = [helper.make_opsetid("", 20)] + ([helper.make_opsetid(DOMAIN, DOMAIN_VERSION)] if domain else [])
    graph = helper.make_graph(nodes, "bench", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=opsets, ir_version=10).SerializeToString()


def build_models(M, K, N, dtype, approximate, rng):
    _, np_t = _TYPES[dtype]
    w_kn = (rng.standard_normal((K, N)) / math.sqrt(K)).astype(np_t)
    b = (0.1 * rng.standard_normal(N)).astype(np_t)
    return models_for(M, K, N, w_kn, b, dtype, approximate)


def models_for(M, K, N, w_kn, b, dtype="float32", approximate="none"):
    """(fused, unfused, MatMul alone) as serialized models for X [M, K], W [K, N] and b [N]."""
    onnx_t, _ = _TYPES[dtype]
    x_info = helper.make_tensor_value_info("X", onnx_t, [M, K])
    y_info = helper.make_tensor_value_info("Y", onnx_t, [M, N])
    # Unfused, as an exporter writes it: X·W (W [K, N]) + b, then Gelu.
    unfused = _model(
        [
            helper.make_node("MatMul", ["X", "W"], ["mm"]),
            helper.make_node("Add", ["mm", "b"], ["pre"]),
            helper.make_node("Gelu", ["pre"], ["Y"], approximate=approximate),
        ],
        [x_info], [y_info],
        [numpy_helper.from_array(w_kn, "W"), numpy_helper.from_array(b, "b")],
    )
    matmul = _model([helper.make_node("MatMul", ["X", "W"], ["Y"])], [x_info], [y_info],
                    [numpy_helper.from_array(w_kn, "W")])
    # Fused, as `onnxfuse optimize` writes it: W stored once as [N, K] (transB=1).
    fused = _model(
        [helper.make_node(OP_TYPE, ["X", "W", "b"], ["Y"], domain=DOMAIN, approximate=approximate, transB=1)],
        [x_info], [y_info],
        [numpy_helper.from_array(np.ascontiguousarray(w_kn.T), "W"), numpy_helper.from_array(b, "b")],
        domain=True,
    )
    return fused, unfused, matmul


def measure(M, K, N, dtype, approximate, threads, reps, warmup, rng):
    fused_m, unfused_m, matmul_m = build_models(M, K, N, dtype, approximate, rng)
    so = lambda: session_options(threads)  # noqa: E731
    sessions = {
        "fused": create_session(fused_m, providers="cpu", sess_options=so()),
        "unfused": ort.InferenceSession(unfused_m, so(), providers=["CPUExecutionProvider"]),
        "matmul": ort.InferenceSession(matmul_m, so(), providers=["CPUExecutionProvider"]),
    }
    x = rng.standard_normal((M, K)).astype(_TYPES[dtype][1])
    feeds = {"X": x}
    outs = {name: s.run(None, feeds)[0] for name, s in sessions.items()}
    err = float(np.max(np.abs(outs["fused"].astype(np.float64) - outs["unfused"].astype(np.float64))))
    for _ in range(warmup):
        for s in sessions.values():
            s.run(None, feeds)
    times = {name: [] for name in sessions}
    for _ in range(reps):
        for name, s in sessions.items():
            t0 = time.perf_counter()
            s.run(None, feeds)
            times[name].append((time.perf_counter() - t0) * 1e3)
    med = {name: statistics.median(v) for name, v in times.items()}
    return {
        "M": M, "K": K, "N": N, "dtype": dtype, "approximate": approximate, "threads": threads, "reps": reps,
        "fused_ms": med["fused"], "unfused_ms": med["unfused"], "matmul_ms": med["matmul"],
        "ratio": med["fused"] / med["unfused"],
        "fused_gflops": 2 * M * K * N / med["fused"] / 1e6,
        "matmul_gflops": 2 * M * K * N / med["matmul"] / 1e6,
        "max_abs_diff_vs_unfused": err,
    }


def session_options(threads):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    # Calls of the three sessions are interleaved on the same cores: a pool that spins after its call
    # (ORT's default) steals the cores from the next session's call, which made every M = 128 call 2x
    # slower with 2 threads than with 1 (measured). Every session here blocks instead of spinning.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return so


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="*", help="MxKxN ... (default: the four issue shapes)")
    ap.add_argument("--dtype", choices=sorted(_TYPES), default="float32")
    ap.add_argument("--approximate", choices=["none", "tanh"], default="none")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "cpu_kernel"),
                    help="output prefix for .json and .md ('' to skip writing)")
    args = ap.parse_args(argv)
    shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shapes] if args.shapes else ISSUE_SHAPES
    rng = np.random.default_rng(0)
    load_before = os.getloadavg()[0]
    rows = []
    print(f"{'M×K×N':>18} {'fused ms':>9} {'unfused ms':>10} {'MatMul ms':>9} {'fused/unfused':>13} "
          f"{'fused GF/s':>10} {'MatMul GF/s':>11}")
    for M, K, N in shapes:
        r = measure(M, K, N, args.dtype, args.approximate, args.threads, args.reps, args.warmup, rng)
        rows.append(r)
        print(f"{f'{M}×{K}×{N}':>18} {r['fused_ms']:9.2f} {r['unfused_ms']:10.2f} {r['matmul_ms']:9.2f} "
              f"{r['ratio']:13.3f} {r['fused_gflops']:10.0f} {r['matmul_gflops']:11.0f}", flush=True)
    goal_met = all(r["ratio"] <= 1.0 for r in rows)
    print(f"goal fused/unfused <= 1.0 at every shape: {'met' if goal_met else 'NOT met'}")
    if args.out:
        meta = {
            "onnxruntime": ort.__version__, "machine": platform.machine(), "processor": _cpu_name(),
            "cpus": os.cpu_count(), "dtype": args.dtype, "approximate": args.approximate,
            "threads": args.threads, "goal_met": goal_met,
            "command": "python bench/cpu_kernel.py " + shlex.join(sys.argv[1:] if argv is None else argv),
            # Wall-clock ratios are only as clean as the machine: on a shared box both columns stretch.
            "load_average_1m_before_after": [load_before, os.getloadavg()[0]],
        }
        Path(args.out + ".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
        lines = [
            f"CPU kernel: fused FusedLinearGelu vs ORT {ort.__version__} MatMul+Add+Gelu, CPU EP, {args.dtype}, "
            f"approximate={args.approximate}, {args.threads} threads, {meta['processor']} ({meta['cpus']} CPUs), "
            f"median of {args.reps} interleaved calls; 1-minute load average {load_before:.1f} before, "
            f"{meta['load_average_1m_before_after'][1]:.1f} after. Command: `{meta['command']}`.",
            "",
            "| M×K×N | fused ms | unfused ms | MatMul alone ms | fused/unfused | fused GFLOP/s | MatMul GFLOP/s |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            lines.append(f"| {r['M']}×{r['K']}×{r['N']} | {r['fused_ms']:.2f} | {r['unfused_ms']:.2f} | "
                         f"{r['matmul_ms']:.2f} | {r['ratio']:.3f} | {r['fused_gflops']:.0f} | {r['matmul_gflops']:.0f} |")
        Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    return 0 if goal_met else 1


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


if __name__ == "__main__":
    sys.exit(main())
