#!/usr/bin/env python3
"""In-process A/B of CPU tile-kernel variants against ORT's own MLAS: the variants of a build.sh library
(ctypes) and two ORT sessions on the CPU provider (MatMul alone, with its weight pre-packed as ORT does; and
the unfused MatMul + Add + Gelu the fused op replaces) take turns in one process, so a noisy machine slows
every column alike. On the 2-core machines this project runs on, consecutive processes differ by 30-50 %;
ratios measured this way held to a few percent.

    lab/cpu_gemm_ab/build.sh /tmp/ab.so cur:custom_ops/src:256:144:128 kc128:custom_ops/src:128:144:128
    python lab/cpu_gemm_ab/ab.py /tmp/ab.so 1024x768x3072 --threads 2 --reps 31

Prints, per column, the median ms, GFLOP/s, the ratio to MLAS's MatMul and to the unfused graph, and each
variant's largest difference from ORT's unfused output (fp32, erf GELU, X ~ N(0, 1), W ~ N(0, 1/K)).
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time

import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from cpu_kernel import models_for, session_options  # noqa: E402  (bench/cpu_kernel.py: the same peers)


def load(path: str):
    lib = ctypes.CDLL(path)
    lib.ab_name.restype = ctypes.c_char_p
    lib.ab_packed_floats.restype = ctypes.c_int64
    lib.ab_packed_floats.argtypes = [ctypes.c_int64] * 2
    lib.ab_pack.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    lib.ab_run.restype = ctypes.c_double
    lib.ab_run.argtypes = [ctypes.c_int, ctypes.c_int] + [ctypes.c_int64] * 3 + [ctypes.c_void_p] * 4
    return lib


def aligned(count: int) -> np.ndarray:
    """float32 zeros whose data starts on a 64-byte boundary (the packed weight's contract)."""
    raw = np.zeros(count + 16, np.float32)
    offset = (-raw.ctypes.data % 64) // 4
    return raw[offset:offset + count]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("library")
    ap.add_argument("shape", help="MxKxN")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=31)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args(argv)
    M, K, N = (int(v) for v in args.shape.lower().split("x"))
    lib = load(args.library)
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32)
    b = (0.1 * rng.standard_normal(N)).astype(np.float32)
    x = rng.standard_normal((M, K)).astype(np.float32)
    packed = aligned(lib.ab_packed_floats(K, N))
    w_nk = np.ascontiguousarray(w.T)  # named: a temporary's buffer could be freed before the call reads it
    lib.ab_pack(w_nk.ctypes.data, K, N, packed.ctypes.data)
    _, unfused_model, matmul_model = models_for(M, K, N, w, b)
    matmul = ort.InferenceSession(matmul_model, session_options(args.threads), providers=["CPUExecutionProvider"])
    unfused = ort.InferenceSession(unfused_model, session_options(args.threads), providers=["CPUExecutionProvider"])
    names = [lib.ab_name(i).decode() for i in range(lib.ab_count())]
    outputs = [np.zeros((M, N), np.float32) for _ in names]
    times: dict[str, list[float]] = {name: [] for name in ["MLAS MatMul", "ORT unfused"] + names}

    def ms(fn) -> float:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3

    for rep in range(args.warmup + args.reps):
        row = [ms(lambda: matmul.run(None, {"X": x})), ms(lambda: unfused.run(None, {"X": x}))]
        row += [lib.ab_run(i, args.threads, M, K, N, x.ctypes.data, packed.ctypes.data, b.ctypes.data,
                           outputs[i].ctypes.data) for i in range(len(names))]
        if rep >= args.warmup:
            for name, t in zip(times, row):
                times[name].append(t)
    reference = unfused.run(None, {"X": x})[0]
    mlas, unf = statistics.median(times["MLAS MatMul"]), statistics.median(times["ORT unfused"])
    print(f"{M}x{K}x{N}, {args.threads} threads, median of {args.reps} interleaved calls")
    for name, t in times.items():
        med = statistics.median(t)
        diff = f"  max |diff| vs ORT {np.abs(outputs[names.index(name)] - reference).max():.1e}" if name in names else ""
        print(f"  {name:14s} {med:9.3f} ms {2 * M * N * K / med / 1e6:7.1f} GF/s  /MLAS {med / mlas:.3f}  "
              f"/unfused {med / unf:.3f}{diff}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
