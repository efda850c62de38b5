// The vector activations, written once over a SIMD traits type S (simd_avx2.h, simd_avx512.h) and
// compiled into each ISA's files: the epilogue of the packed GEMM (packed_gemm_avx2.cc,
// packed_gemm_avx512.cc) and the block-wise one (vector_kernels_avx2.cc).
//
// S provides: V (a float vector), M (a lane mask), set1, zero, add, sub, mul, div, fmadd, fnmadd, min,
// max, abs, round_nearest, less (-> M), select(M, if_true, if_false), and_mask(M, v) (v where M, else 0),
// and pow2i(V n) = 2^n for integral n in [-126, 127].
//
// The activations use no libm call: exp is Cody-Waite range reduction plus a degree-7 Taylor polynomial
// (relative error < 1 ulp on the reduced range), and erf follows the two-piece scheme ORT's MLAS uses:
//   |z| < 0.921875           erf(z)  = z·P(z²)        P: degree 5
//   0.921875 <= |z| < 4.5    erfc(z) = exp(Q(|z|))    Q: degree 9, fitted to log(erfc)
//   |z| >= 4.5               erfc(z) = 0 in float32 terms (< 2e-10)
// P and Q are least-squares fits on Chebyshev nodes against float64 erf/erfc (P weighted for relative
// error). Measured in float32 Horner evaluation: erf relative error < 1.8e-7 on the inner piece, erfc
// absolute error < 5e-8 on the outer one. GELU is written as x·Φ(x) with Φ built from erfc for x < 0,
// so the negative tail keeps its relative accuracy instead of cancelling in 1 + erf.
#pragma once

#include "../activation.h"

namespace onnxfuse::cpu::simd {

template <class S>
[[gnu::always_inline]] inline typename S::V Exp(typename S::V x) {
  // exp(x) = 2^n · exp(r), n = round(x / ln2), r = x - n·ln2 in [-ln2/2, ln2/2].
  x = S::min(S::max(x, S::set1(-87.3f)), S::set1(88.7f));
  const auto n = S::round_nearest(S::mul(x, S::set1(1.44269504088896341f)));
  auto r = S::fnmadd(n, S::set1(0.693359375f), x);  // ln2 high part (exact product)
  r = S::fnmadd(n, S::set1(-2.12194440e-4f), r);     // ln2 low part
  auto p = S::set1(1.0f / 5040.0f);
  p = S::fmadd(p, r, S::set1(1.0f / 720.0f));
  p = S::fmadd(p, r, S::set1(1.0f / 120.0f));
  p = S::fmadd(p, r, S::set1(1.0f / 24.0f));
  p = S::fmadd(p, r, S::set1(1.0f / 6.0f));
  p = S::fmadd(p, r, S::set1(0.5f));
  p = S::fmadd(p, r, S::set1(1.0f));
  p = S::fmadd(p, r, S::set1(1.0f));
  // 2^n in two halves, so n down to -126 and up to 128 both stay representable.
  const auto half = S::round_nearest(S::mul(n, S::set1(0.5f)));
  return S::mul(S::mul(p, S::pow2i(half)), S::pow2i(S::sub(n, half)));
}

// x / (1 + exp(-t)): the sigmoid form with t = alpha·x, and the tanh form with t = 2·√(2/π)(x + 0.044715x³).
template <class S>
[[gnu::always_inline]] inline typename S::V XSigmoid(typename S::V x, typename S::V t) {
  const auto e = Exp<S>(S::sub(S::zero(), t));
  return S::div(x, S::add(S::set1(1.0f), e));
}

template <class S>
[[gnu::always_inline]] inline typename S::V GeluTanh(typename S::V x) {
  const auto x2 = S::mul(x, x);
  const auto inner = S::fmadd(S::mul(x2, S::set1(0.044715f)), x, x);
  return XSigmoid<S>(x, S::mul(inner, S::set1(2.0f * 0.7978845608028654f)));
}

template <class S>
[[gnu::always_inline]] inline typename S::V GeluErf(typename S::V x) {
  const auto z = S::mul(x, S::set1(0.70710678118654752f));
  const auto az = S::abs(z);

  // Inner piece: Φ = 0.5 + 0.5·erf(z), erf(z) = z·P(z²).
  const auto z2 = S::mul(z, z);
  auto p = S::set1(-5.986208510e-04f);
  p = S::fmadd(p, z2, S::set1(4.992181038e-03f));
  p = S::fmadd(p, z2, S::set1(-2.676586123e-02f));
  p = S::fmadd(p, z2, S::set1(1.128179275e-01f));
  p = S::fmadd(p, z2, S::set1(-3.761249112e-01f));
  p = S::fmadd(p, z2, S::set1(1.128379149e+00f));
  const auto phi_inner = S::fmadd(S::mul(z, p), S::set1(0.5f), S::set1(0.5f));

  // Outer piece: erfc(|z|) = exp(Q(|z|)); Φ = 0.5·erfc(|z|) for x < 0, 1 - 0.5·erfc(|z|) for x > 0.
  const auto a = S::min(az, S::set1(4.5f));
  auto q = S::set1(-9.570363657e-08f);
  q = S::fmadd(q, a, S::set1(3.737564066e-06f));
  q = S::fmadd(q, a, S::set1(-6.600967446e-05f));
  q = S::fmadd(q, a, S::set1(7.042322763e-04f));
  q = S::fmadd(q, a, S::set1(-5.120123123e-03f));
  q = S::fmadd(q, a, S::set1(2.720148407e-02f));
  q = S::fmadd(q, a, S::set1(-1.111671490e-01f));
  q = S::fmadd(q, a, S::set1(-6.308879440e-01f));
  q = S::fmadd(q, a, S::set1(-1.130687870e+00f));
  q = S::fmadd(q, a, S::set1(4.142074826e-04f));
  const auto half_erfc = S::and_mask(S::less(az, S::set1(4.5f)), S::mul(Exp<S>(q), S::set1(0.5f)));
  const auto phi_outer = S::select(S::less(x, S::zero()), half_erfc, S::sub(S::set1(1.0f), half_erfc));
  return S::mul(x, S::select(S::less(az, S::set1(0.921875f)), phi_inner, phi_outer));
}

template <class S, Activation kAct>
[[gnu::always_inline]] inline typename S::V Activate(typename S::V x, typename S::V alpha) {
  if constexpr (kAct == Activation::kGeluErf) return GeluErf<S>(x);
  if constexpr (kAct == Activation::kGeluTanh) return GeluTanh<S>(x);
  if constexpr (kAct == Activation::kSigmoid) return XSigmoid<S>(x, S::mul(alpha, x));
  return x;
}

}  // namespace onnxfuse::cpu::simd
