"""Issue #20's idea "packed half2/bf16x2 arithmetic where the bar allows", on paper: the fast erf-GELU's
polynomial h = x·P(x²) computed in fp16 (HMUL2/HFMA2 on two elements per instruction, each op rounded once to
fp16; x is an exact fp16 value in this test), the rest (2^h, 1 + 2^h, the reciprocal, the product) in float32 as
shipped, or in half precision as well. Judged over every finite fp16 value by the bar of
tests/test_op_cuda.py::test_every_fp16_value_gives_finite_gelu, as erf_degree_check.py judges its forms.
bf16x2 (8-bit significands) is not tried: fp16's 11 bits already fail.

    python3 lab/kernels/erf_half2_check.py   (CPU only: numpy, scipy)
"""

from __future__ import annotations

import numpy as np

from erf_degree_check import HEADER, SHIPPED, all_fp16_values, f32, fast_gelu, judge, ulp16


def f16(a):
    with np.errstate(over="ignore"):
        return np.asarray(a, np.float64).astype(np.float16).astype(np.float64)


def half2_gelu(x, coefs, mufu16=False):
    """h = x·P(x²) in fp16 (an FMA's product of fp16 operands is exact in float64: one rounding, as HFMA2),
    then x / (1 + 2^h) in float32; ``mufu16``: 2^h and the reciprocal rounded to fp16 too."""
    x = f16(x)
    x2 = f16(x * x)
    h = np.full_like(x, f16(coefs[0]))
    for c in coefs[1:]:
        h = f16(h * x2 + f16(c))
    h = f16(h * x)
    with np.errstate(over="ignore"):
        e = f32(np.exp2(h))
        e = f16(e) if mufu16 else e
        d = f32(1.0 + e)
        r = f32(1.0 / d)
        r = f16(r) if mufu16 else r
        y = f32(r * x)
    y[np.isinf(d)] = 0.0
    return y


def main():
    x, ref, ort = all_fp16_values()
    print(HEADER)
    forms = [("shipped, float32 (control)", fast_gelu(x, SHIPPED)),
             ("polynomial in half2, the rest float32", half2_gelu(x, SHIPPED)),
             ("polynomial, 2^h and reciprocal in half precision", half2_gelu(x, SHIPPED, mufu16=True))]
    for name, y in forms:
        ratio, over, worst = judge(x, y, ref, ort)
        print(f"{name} | {ratio:.3f} | {over} | {worst:.2f}")
    y = forms[1][1].astype(np.float16).astype(np.float64)
    err, u = np.abs(y - ref), ulp16(ref)
    bad = (np.abs(x) <= 3.0) & (err > np.maximum(np.abs(ort - ref), u) + u)
    print(f"polynomial in half2 misses at x in [{x[bad].min():.3g}, {x[bad].max():.3g}]: "
          f"{int((x[bad] < 0).sum())} of {int(bad.sum())} negative")


if __name__ == "__main__":
    main()
