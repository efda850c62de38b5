#!/usr/bin/env python3
"""float32 on a narrow, deep W whose rows are not 16-byte vectors (K = 4095, N = 1023): does cuBLAS read it faster
once K is padded to 4096, by enough to pay for copying X into padded rows? No ONNX Runtime: torch only
(torch.backends.cuda.matmul.allow_tf32 = True, as ORT's MatMul runs float32).

GEMMs timed, each the GEMM alone (the activation kernel after it is the same in every layout):
  nn        X [M, K] · W [K, N]: the call ORT's MatMul makes on its unaligned rows;
  tn        X [M, K] · W [N, K]ᵀ: the in-node fallback's call today (the op's W layout), unaligned;
  tn_pk     X [M, K+1] · W [N, K+1]ᵀ, K padded, Y [M, N] at ld N (odd);
  tn_pkn    X [M, K+1] · W [N+1, K+1]ᵀ, K and N padded, Y [M, N+1];
  stage_x   the copy of X into rows of K+1 (the staged call's extra kernel).
Readings as in swap_ab_probe.py: warm (CUPTI, back to back) and cold (events after a 1 GiB write), median of --reps.

    python3 lab/kernels/staged_fp32_probe.py [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probe_timing import ProbeTimer  # noqa: E402  (lab/kernels/probe_timing.py)

ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 1024, 4096)
SHAPES_KN = ((4095, 1023), (770, 3074))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=None)
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args(argv)

    import torch

    torch.backends.cuda.matmul.allow_tf32 = True

    timer = ProbeTimer(torch, args.reps)
    cold_us, warm_us = timer.cold_us, timer.warm_us

    out = []
    for K, N in SHAPES_KN:
        torch.manual_seed(0)
        w = torch.randn(N, K, device="cuda") / K**0.5
        w_kn = w.t().contiguous()
        w_pk = torch.zeros(N, K + 1, device="cuda")
        w_pk[:, :K] = w
        w_pkn = torch.zeros(N + 1, K + 1, device="cuda")
        w_pkn[:N, :K] = w
        for M in ROWS:
            x = torch.randn(M, K, device="cuda")
            x_pk = torch.zeros(M, K + 1, device="cuda")
            x_pk[:, :K] = x
            ref = x.double() @ w.double().t()
            calls = {
                "nn": lambda: torch.mm(x, w_kn),
                "tn": lambda: torch.mm(x, w.t()),
                "tn_pk": lambda: torch.mm(x_pk, w_pk.t()),
                "tn_pkn": lambda: torch.mm(x_pk, w_pkn.t()),
                "stage_x": lambda: x_pk[:, :K].copy_(x),
            }
            cell = {"M": M, "K": K, "N": N}
            for name, fn in calls.items():
                cell[f"{name}_warm_us"], cell[f"{name}_cold_us"] = warm_us(fn), cold_us(fn)
                if name != "stage_x":
                    y = fn()[:, :N].double()
                    cell[f"{name}_relerr"] = ((y - ref).norm() / ref.norm()).item()
            out.append(cell)
            print(f"{M:>5}x{K}x{N} warm/cold µs: " + "  ".join(
                f"{n} {cell[n + '_warm_us']:.1f}/{cell[n + '_cold_us']:.1f}" for n in calls)
                + "  err " + " ".join(f"{n} {cell[n + '_relerr']:.1e}" for n in calls if n != "stage_x"), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
