#!/usr/bin/env python3
"""The swap-AB kernels (lab/kernels/explore/sm90_swap_ab.cu: Yᵀ = W·Xᵀ, W's rows tiled by TMA, the few rows of X
as the GMMA's N) against cuBLAS in the same process, at the row counts where the op's W [N, K] makes cuBLAS slower
than on ORT's W [K, N]. No ONNX Runtime: torch and the lab library only.

Peers, each with its bias and activation where the op has them:
  nn      torch.mm on W [K, N] (the layout of ORT's MatMul), then bias + GELU: what ORT's unfused graph runs;
  nn_gemm that GEMM alone (the floor the issue names: the plain GEMM);
  tn      torch.mm on W [N, K] (the op's layout, what the in-node fallback asks cuBLAS for), then bias + GELU.
Readings, µs per call: warm (CUPTI, calls back to back) and cold (CUDA events around each call made after a
1 GiB write, which leaves L2 full of other data, as a model's other layers do); the median of `--reps`.
Error: rel-L2 against float64 over the output.

    python3 lab/kernels/swap_ab_probe.py LIB.so [--json OUT]   (LIB.so: lab/kernels/explore/sm90_swap_ab.cu, built as it says)

Third round, the stream-K variants with the tile scheduler's arguments swept (a build with -Ilab/kernels/hooks
first on the include path, whose hooks read OFK_SPLITS / OFK_DECOMP at every launch: explore/scheduler_knobs.h),
on the narrow, deep W alone, with the cost of staging X into rows padded to 16 bytes (what a K of 4095 needs):

    python3 lab/kernels/swap_ab_probe.py LIB.so --shapes 4096,1024 --streamk-knobs 2:4 2:8 2:16 3:1 --stage-cost
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probe_timing import ProbeTimer  # noqa: E402  (lab/kernels/probe_timing.py)

# (K, N): the up-projections the product's swapped kernel takes, and a narrow, deep W (N < K), which it leaves to
# the fallback for want of strips to spread over the SMs (the stream-K variants' question, second round).
SHAPES_KN = ((4096, 16384), (1024, 4096), (768, 3072), (4096, 1024))
ROWS = {"fp32": (2, 4, 8, 9, 16, 32, 64), "fp16": (2, 4, 8, 16, 32, 64)}
ACTS = {"erf": 0, "tanh": 1}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("library")
    ap.add_argument("--json", default=None)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--act", default="erf", choices=tuple(ACTS))
    ap.add_argument("--shapes", nargs="+", default=None, metavar="K,N", help="(K, N) pairs; default: SHAPES_KN")
    ap.add_argument("--dtypes", nargs="+", default=("fp32", "fp16"), choices=tuple(ROWS))
    ap.add_argument("--streamk-knobs", nargs="+", default=(), metavar="DECOMP:SPLITS",
                    help="run each stream-K variant once per pair as well (OFK_DECOMP: 1 data-parallel, 2 split-K, "
                         "3 stream-K; OFK_SPLITS); needs the lab-hooks build")
    ap.add_argument("--stage-cost", action="store_true",
                    help="also time the copy of X into rows one element wider (the staged path's extra kernel)")
    args = ap.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split(",")) for s in args.shapes] if args.shapes else SHAPES_KN
    knobs = [tuple(int(v) for v in k.split(":")) for k in args.streamk_knobs]

    import torch
    import torch.nn.functional as F

    torch.backends.cuda.matmul.allow_tf32 = True  # what ORT's MatMul does with float32 (use_tf32, its default)
    lib = ctypes.CDLL(args.library)
    lib.ofk_swap_variant_name.restype = ctypes.c_char_p
    vp, ll = ctypes.c_void_p, ctypes.c_longlong
    lib.ofk_swap_run.argtypes = [ctypes.c_int, ctypes.c_int, vp, vp, vp, vp, ll, ll, ll, ctypes.c_int, vp]
    lib.ofk_swap_run.restype = ctypes.c_int
    # (index, name, dtype code, scheduler knobs or None): each stream-K variant once as built and once per knob pair.
    variants = []
    for i in range(lib.ofk_swap_variant_count()):
        name, code = lib.ofk_swap_variant_name(i).decode(), lib.ofk_swap_variant_dtype(i)
        variants.append((i, name, code, None))
        if "streamk" in name:
            variants += [(i, f"{name} d{d}s{n}", code, (d, n)) for d, n in knobs]
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    gelu = "none" if args.act == "erf" else "tanh"

    timer = ProbeTimer(torch, args.reps)
    cold_us, warm_us = timer.cold_us, timer.warm_us

    rows_out = []
    def set_knobs(kn):
        for var, value in zip(("OFK_DECOMP", "OFK_SPLITS"), kn or (None, None)):
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = str(value)

    for dt, code in (("fp32", 0), ("fp16", 1)):
        if dt not in args.dtypes:
            continue
        tt = {"fp32": torch.float32, "fp16": torch.float16}[dt]
        for K, N in shapes:
            torch.manual_seed(0)
            w = (torch.randn(N, K, device="cuda") / math.sqrt(K)).to(tt)
            w_kn = w.t().contiguous()
            b = (torch.randn(N, device="cuda") * 0.1).to(tt)
            for M in ROWS[dt]:
                x = torch.randn(M, K, device="cuda").to(tt)
                ref = F.gelu(x.double() @ w.double().t() + b.double(), approximate=gelu)
                y = torch.empty(M, N, device="cuda", dtype=tt)
                cell = {"dtype": dt, "M": M, "K": K, "N": N, "act": args.act}
                peers = {
                    "nn": lambda: F.gelu(torch.mm(x, w_kn) + b, approximate=gelu),
                    "nn_gemm": lambda: torch.mm(x, w_kn),
                    "tn": lambda: F.gelu(torch.mm(x, w.t()) + b, approximate=gelu),
                }
                if args.stage_cost:
                    x_wide = torch.zeros(M, K + 1, device="cuda", dtype=tt)
                    peers["stage_x"] = lambda: x_wide[:, :K].copy_(x)
                for name, fn in peers.items():
                    cell[f"{name}_warm_us"], cell[f"{name}_cold_us"] = warm_us(fn), cold_us(fn)
                    if name in ("nn", "tn"):
                        cell[f"{name}_relerr"] = ((fn().double() - ref).norm() / ref.norm()).item()
                stream = torch.cuda.current_stream().cuda_stream
                for i, name, vdt, kn in variants:
                    if vdt != code:
                        continue
                    set_knobs(kn)
                    run = (lambda i: lambda: lib.ofk_swap_run(i, ACTS[args.act], x.data_ptr(), w.data_ptr(), b.data_ptr(),
                                                              y.data_ptr(), M, N, K, sm_count, stream))(i)
                    y.fill_(float("nan"))
                    rc = run()
                    torch.cuda.synchronize()
                    if rc != 0:
                        cell[f"{name}_rc"] = rc
                        continue
                    cell[f"{name}_relerr"] = ((y.double() - ref).norm() / ref.norm()).item()
                    cell[f"{name}_warm_us"], cell[f"{name}_cold_us"] = warm_us(run), cold_us(run)
                set_knobs(None)
                rows_out.append(cell)
                ran = [(cell[f"{n}_cold_us"], n) for _, n, vdt, _ in variants if vdt == code and f"{n}_cold_us" in cell]
                head = (f"{dt} {M:>3}x{K}x{N}: cold µs nn {cell['nn_cold_us']:.1f} (gemm {cell['nn_gemm_cold_us']:.1f}) "
                        f"tn {cell['tn_cold_us']:.1f}")
                if ran:
                    us, n = min(ran)
                    warm = min((cell[f"{m}_warm_us"], m) for _, m in ran)
                    print(f"{head} | best swap {n} {us:.1f} (warm {cell[n + '_warm_us']:.1f}, err "
                          f"{cell[n + '_relerr']:.2e} vs nn {cell['nn_relerr']:.2e}) | warm µs nn "
                          f"{cell['nn_warm_us']:.1f} (gemm {cell['nn_gemm_warm_us']:.1f}), best swap {warm[1]} "
                          f"{warm[0]:.1f}" + (f", stage X {cell['stage_x_warm_us']:.1f}" if args.stage_cost else ""),
                          flush=True)
                else:
                    print(f"{head} | no swap variant ran: {cell}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows_out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
