"""Can the fast erf-GELU (activation_math.cuh: x·σ(g(x)), g = logit∘Φ as x times a polynomial in x²) drop a
term? Its arithmetic emulated in float32 (each FMA rounded once, ex2 and the reciprocal rounded to float32, as
the GPU's MUFU results are to within 2^-22) over every finite fp16 value, judged by the bar of
tests/test_op_cuda.py::test_every_fp16_value_gives_finite_gelu: rel-L2 against float64 at most 1.05x that of ORT
(float64 rounded to fp16, as ORT's Gelu computes in float32 and rounds once), and every value with |x| <= 3
within ORT's error + 1 ulp. The shipped degree-4 polynomial first (the emulation must pass it), then degree-3
and degree-4 refits, weighted minimax on the output's error in fp16 ulps over [0, hi].

    python3 lab/kernels/erf_degree_check.py   (CPU only: numpy, scipy)
"""

from __future__ import annotations

import numpy as np
from scipy.special import erf, logit, ndtr

LOG2E = 1.4426950408889634
# erf_logit_h's constants (already times -log2(e)), highest power of x² first.
SHIPPED = [-3.2104162773359513e-06, 8.791040410119996e-05, 3.620447584555129e-04, -1.0522997257257635e-01,
           -2.302043776841872]


def f32(a):
    return np.asarray(a, np.float64).astype(np.float32).astype(np.float64)


def gelu64(x):
    return 0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))


def fast_gelu(x, coefs):
    """gelu_erf_fast in float32: h = x·P(x²), then x / (1 + 2^h)."""
    x = f32(x)
    x2 = f32(x * x)
    h = np.full_like(x, coefs[0])
    for c in coefs[1:]:
        h = f32(h * x2 + c)
    h = f32(h * x)
    with np.errstate(over="ignore"):
        d = f32(1.0 + f32(np.exp2(h)))
        y = f32(f32(1.0 / d) * x)
    y[np.isinf(d)] = 0.0  # __fdividef's limit: x / inf = 0
    return y


def ulp16(v):
    a = np.abs(v)
    return 2.0 ** (np.floor(np.log2(np.maximum(a, 2.0 ** -14))) - 10)


def judge(x, y, ref, ort):
    y = y.astype(np.float16).astype(np.float64)
    rel = lambda a: np.linalg.norm(a - ref) / np.linalg.norm(ref)  # noqa: E731
    err, u = np.abs(y - ref), ulp16(ref)
    core = np.abs(x) <= 3.0
    over = core & (err > np.maximum(np.abs(ort - ref), u) + u)
    return rel(y) / rel(ort), int(over.sum()), float(np.max(err[core] / u[core]))


def refit(degree, hi, rounds=80):
    """logit(Φ(x)) ≈ x·(c1 + c3 x² + ...), Lawson-weighted towards the largest error in fp16 ulps of the output."""
    xs = np.linspace(1e-4, hi, 20000)
    g = logit(ndtr(xs))
    a = np.stack([xs ** (2 * k + 1) for k in range(degree + 1)], 1)
    phi = ndtr(xs)
    # d output / d g = x·Φ·(1-Φ), in ulps of the smaller of the two outputs (x·Φ(x) and -x·Φ(-x))
    sens = xs * phi * (1 - phi) / np.maximum(np.minimum(ulp16(xs * phi), ulp16(xs * (1 - phi))), 2.0 ** -24)
    w = np.ones_like(xs)
    for _ in range(rounds):
        c, *_ = np.linalg.lstsq(a * np.sqrt(w)[:, None], g * np.sqrt(w), rcond=None)
        w = w * (np.abs(a @ c - g) * sens + 1e-30)
        w /= w.sum()
    return [ci * -LOG2E for ci in c[::-1]]


HEADER = "form | rel-L2 / ORT's (bar <= 1.05) | values with |x| <= 3 over ORT's + 1 ulp (bar 0) | worst there, ulp"


def all_fp16_values():
    """(every finite fp16 value, its GELU in float64, ORT's: that rounded to fp16), as float64 arrays."""
    bits = np.arange(2 ** 16, dtype=np.uint32).astype(np.uint16)
    x = bits.view(np.float16)
    x = x[np.isfinite(x)].astype(np.float64)
    ref = gelu64(x)
    return x, ref, f32(ref).astype(np.float16).astype(np.float64)


def main():
    x, ref, ort = all_fp16_values()
    print(HEADER)
    cases = [("shipped, degree 4", SHIPPED)]
    cases += [(f"degree 3 refit on [0, {hi}]", refit(3, hi)) for hi in (4.0, 4.5, 5.0, 6.0)]
    cases += [("degree 4 refit on [0, 7]", refit(4, 7.0))]
    for name, coefs in cases:
        ratio, over, worst = judge(x, fast_gelu(x, coefs), ref, ort)
        print(f"{name} | {ratio:.3f} | {over} | {worst:.2f}")


if __name__ == "__main__":
    main()
