#!/usr/bin/env python3
"""The 16-bit Tensor-Core gemv kernel (lab/kernels/gemv_mma_lab.cu) at each configuration, against the gemv path as
shipped (its FMA kernel) and cuBLAS in the same process. No ONNX Runtime: torch and the lab library.

Issue #20's few-rows band: at 8-128 rows of K <= 1024 the fused node runs 1.18-1.35x the best plain GEMM
(bench/results/gelu_cost_grid_h200.md), a few µs where the regular and swapped kernels are latency-bound. The
Tensor-Core gemv kernel reads W once with 16-byte cp.async copies (no TMA, no cluster, no persistent scheduler)
and runs 2048 products per instruction, so its question is how close to a read of W it gets as rows grow.

Peers, on the same X, W and bias:
  gemm     the faster of torch.mm on W [K, N] (ORT's MatMul layout) and on W [N, K]: the plain GEMM, no bias;
  lt_tanh  cuBLASLt's tanh-GELU epilogue with the bias (torch._addmm_activation), the issue's second bar.
Readings, µs per call: warm (CUPTI, calls back to back, as the grid) and, for the peers, the path as shipped and
each row count's fastest configuration, cold (CUDA events after a 1 GiB write; includes the
launch gap, so compare cold with cold only). Error: rel-L2 against float64 over the output, beside the unfused
path's (mm in the dtype, bias, GELU: what ORT runs); outputs poisoned with NaN before each checked call.

    python3 lab/kernels/gemv_mma_probe.py LIB.so [--json OUT] [--dtypes fp16 bf16] [--rows 1 4 8 ...]
    compute-sanitizer --tool memcheck python3 lab/kernels/gemv_mma_probe.py LIB.so --check-only --shapes 384,1536
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probe_timing import ProbeTimer  # noqa: E402  (lab/kernels/probe_timing.py)

# (K, N): the grid's up-projections, a narrow deep W, and a tail shape (N not a multiple of 16, K of 32) that the
# checks need and the timings ignore.
SHAPES_KN = ((384, 1536), (512, 2048), (768, 3072), (1024, 4096), (4096, 16384), (4096, 1024))
TAIL_KN = (776, 1000)
ROWS = (1, 4, 5, 8, 12, 16, 32, 64)
GEMV_MAX_ROWS = 16  # the path's contract (kGemvMaxRows): the shipped variant and the FMA kernel stop there
DTYPES = {"fp16": 1, "bf16": 2}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("library")
    ap.add_argument("--json", default=None)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--dtypes", nargs="+", default=tuple(DTYPES), choices=tuple(DTYPES))
    ap.add_argument("--rows", nargs="+", type=int, default=ROWS)
    ap.add_argument("--shapes", nargs="+", default=None, metavar="K,N")
    ap.add_argument("--check-only", action="store_true",
                    help="errors only, no timing (small enough for compute-sanitizer memcheck)")
    args = ap.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split(",")) for s in args.shapes] if args.shapes else SHAPES_KN

    import torch
    import torch.nn.functional as F

    lib = ctypes.CDLL(args.library)
    lib.ofg_variant_name.restype = ctypes.c_char_p
    vp, ll = ctypes.c_void_p, ctypes.c_longlong
    lib.ofg_launch.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ll, ll, ll, vp, vp, vp, vp, vp]
    lib.ofg_launch.restype = ctypes.c_int
    variants = [(i, lib.ofg_variant_name(i).decode()) for i in range(lib.ofg_variant_count())]
    timer = ProbeTimer(torch, args.reps)
    cells, failures = [], []

    for dt in args.dtypes:
        tt = {"fp16": torch.float16, "bf16": torch.bfloat16}[dt]
        for K, N in list(shapes) + [TAIL_KN]:
            timed = (K, N) != TAIL_KN and not args.check_only
            torch.manual_seed(0)
            w = (torch.randn(N, K, device="cuda") / math.sqrt(K)).to(tt)
            w_kn = w.t().contiguous()
            b = (torch.randn(N, device="cuda") * 0.1).to(tt)
            for M in args.rows:
                x = torch.randn(M, K, device="cuda").to(tt)
                ref = F.gelu(x.double() @ w.double().t() + b.double())
                y = torch.empty(M, N, device="cuda", dtype=tt)
                stream = torch.cuda.current_stream().cuda_stream
                unfused = F.gelu(torch.mm(x, w_kn) + b)
                cell = {"dtype": dt, "M": M, "K": K, "N": N,
                        "unfused_relerr": ((unfused.double() - ref).norm() / ref.norm()).item()}
                if timed:
                    peers = {"gemm_nn": lambda: torch.mm(x, w_kn), "gemm_tn": lambda: torch.mm(x, w.t()),
                             "lt_tanh": lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True)}
                    for name, fn in peers.items():
                        cell[f"{name}_warm_us"], cell[f"{name}_cold_us"] = timer.warm_us(fn), timer.cold_us(fn)
                    cell["gemm_warm_us"] = min(cell["gemm_nn_warm_us"], cell["gemm_tn_warm_us"])
                    cell["gemm_cold_us"] = min(cell["gemm_nn_cold_us"], cell["gemm_tn_cold_us"])
                runs = {}
                for i, name in variants:
                    run = (lambda i: lambda: lib.ofg_launch(i, DTYPES[dt], 0, M, N, K, x.data_ptr(), w.data_ptr(),
                                                            b.data_ptr(), y.data_ptr(), stream))(i)
                    y.fill_(float("nan"))
                    rc = run()
                    torch.cuda.synchronize()
                    if rc != 0:
                        continue  # not this variant's rows (the shipped path stops at 16) or its ring too large
                    err = ((y.double() - ref).norm() / ref.norm()).item()
                    cell[f"{name}_relerr"] = err
                    if not math.isfinite(err) or err > cell["unfused_relerr"]:
                        failures.append(f"{dt} {M}x{K}x{N} {name}: rel-L2 {err:.3e} > unfused {cell['unfused_relerr']:.3e}")
                    if timed:
                        cell[f"{name}_warm_us"] = timer.warm_us(run)
                        runs[name] = run
                if timed:
                    mma = [(cell[f"{n}_warm_us"], n) for n in runs if n.startswith("mma")]
                    best_us, best = min(mma)
                    cell["best_mma"] = best
                    for name in {best, "shipped"} & set(runs):
                        cell[f"{name}_cold_us"] = timer.cold_us(runs[name])
                    gemm = cell["gemm_warm_us"]
                    line = (f"{dt} {M:>3}x{K}x{N}: warm µs gemm {gemm:.2f} lt_tanh {cell['lt_tanh_warm_us']:.2f} | "
                            f"best mma {best} {best_us:.2f} ({best_us / gemm:.2f}x gemm)")
                    if "shipped" in runs:
                        line += f" | shipped {cell['shipped_warm_us']:.2f} ({cell['shipped_warm_us'] / gemm:.2f}x)"
                    line += (f" | cold gemm {cell['gemm_cold_us']:.1f} mma {cell[best + '_cold_us']:.1f} | err "
                             f"{cell[best + '_relerr'] / cell['unfused_relerr']:.2f}x unfused")
                    print(line, flush=True)
                cells.append(cell)
    print(f"checks: {len(failures)} over the unfused path's error or not finite")
    for f in failures:
        print("  FAIL", f)
    if args.json:
        Path(args.json).write_text(json.dumps({"cells": cells, "failures": failures}, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
