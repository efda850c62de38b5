"""Same-process A/B of two kernel-harness builds (lab/kernels/build.sh), e.g. before and after a kernel
change: for each shape, dtype and activation form, the dispatch's kernel of build A and of build B, timed in
interleaved rounds (CUPTI GPU time, medians), and whether the two builds' outputs are bit-identical.
Separate processes drift by more than the changes this is for (the H200 runs these shapes at its power cap).

    python3 lab/kernels/ab_builds.py LIB_A.so LIB_B.so OUT.json [--shapes MxKxN,...] [--rounds 5]

Each library is loaded on its own (ctypes, RTLD_LOCAL), so both keep their own tactic tables and statics.
"""
import argparse
import ctypes
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from cupti import kernel_times_us  # noqa: E402  (bench/cupti.py)

DT = {"fp16": (1, torch.float16), "bf16": (2, torch.bfloat16)}
FORMS = {"erf": 0, "tanh": 1, "sigmoid": 2}
# The K = 768 and 1024 shapes where the epilogue sets the pace, the other families, and edges (a
# partial last tile in M and in N, a tile-sized problem).
SHAPES = ("128x768x3072,1024x768x3072,4096x768x3072,6304x768x3072,16384x768x3072,4096x1024x4096,"
          "128x4096x16384,2048x4096x16384,4097x768x3000,100x256x136")


def load(path):
    lib = ctypes.CDLL(os.path.abspath(path))
    lib.ofk_launch.restype = ctypes.c_int
    lib.ofk_dispatch_name.restype = ctypes.c_char_p
    return lib


def args(dt, form, M, N, K, x, w, b, y):
    p = lambda t: ctypes.c_void_p(t.data_ptr() if t is not None else 0)  # noqa: E731
    return (DT[dt][0], FORMS[form], ctypes.c_float(1.702), 1, 1, ctypes.c_longlong(M), ctypes.c_longlong(N),
            ctypes.c_longlong(K), p(x), p(w), p(b), p(y))


WORKSPACE_BYTES = 64 << 20  # the dispatch's tactics here need none; stream-K would


def launcher(lib, a, ws):
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    return lambda: lib.ofk_launch(-1, *a, ctypes.c_void_p(ws.data_ptr()), ctypes.c_ulonglong(WORKSPACE_BYTES), stream)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lib_a")
    ap.add_argument("lib_b")
    ap.add_argument("out")
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dtypes", default="fp16,bf16")
    ap.add_argument("--no-bias", action="store_true", help="also every case without a bias")
    o = ap.parse_args()
    libs = {"a": load(o.lib_a), "b": load(o.lib_b)}
    ws = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    rows = []
    for spec in o.shapes.split(","):
        M, K, N = (int(v) for v in spec.split("x"))
        for dt in o.dtypes.split(","):
            g = torch.Generator(device="cuda").manual_seed(M * 7 + N * 13 + K)
            x = torch.randn(M, K, device="cuda", generator=g).to(DT[dt][1])
            w = (torch.randn(N, K, device="cuda", generator=g) / K ** 0.5).to(DT[dt][1])
            for bias in (True, False) if o.no_bias else (True,):
                b = (torch.randn(N, device="cuda", generator=g) * 0.1).to(DT[dt][1]) if bias else None
                for form in FORMS:
                    ys = {k: torch.full((M, N), float("nan"), device="cuda", dtype=DT[dt][1]) for k in libs}
                    run = {k: launcher(lib, args(dt, form, M, N, K, x, w, b, ys[k]), ws) for k, lib in libs.items()}
                    rc = {k: fn() for k, fn in run.items()}
                    torch.cuda.synchronize()
                    same = all(v == 0 for v in rc.values()) and torch.equal(ys["a"].view(torch.int16),
                                                                            ys["b"].view(torch.int16))
                    got = {k: [] for k in libs}
                    for _ in range(o.rounds):
                        for k, fn in run.items():
                            got[k].append(sum(kernel_times_us(fn, reps=10, warmup=3).values()))
                    a, bb = statistics.median(got["a"]), statistics.median(got["b"])
                    name = libs["b"].ofk_dispatch_name(*args(dt, form, M, N, K, x, w, b, ys["b"])).decode()
                    r = {"M": M, "K": K, "N": N, "dtype": dt, "form": form, "bias": bias, "tactic_b": name,
                         "a_us": a, "b_us": bb, "b_over_a": bb / a if a else float("nan"), "bit_identical": same,
                         "rc": rc, "all": got}
                    rows.append(r)
                    print(f"{M}x{K}x{N} {dt} {form}{'' if bias else ' no bias'} {name.split('_', 3)[-1]}: "
                          f"A {a:.1f} us  B {bb:.1f} us  B/A {r['b_over_a']:.3f}  bit-identical {same}", flush=True)
    with open(o.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "lib_a": o.lib_a, "lib_b": o.lib_b, "rows": rows}, f,
                  indent=1)
    if not all(r["bit_identical"] for r in rows):
        sys.exit("outputs differ between the builds")


if __name__ == "__main__":
    main()
