// Vector (AVX2 + FMA) activations shared by every AVX2-compiled file of the CPU kernel: the bias+GELU
// epilogue of the packed GEMM (packed_gemm_avx2.cc) and the block-wise one (vector_kernels_avx2.cc).
// Include only from files compiled with -mavx2 -mfma.
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

#include <immintrin.h>

#include "../activation.h"

namespace onnxfuse::cpu::avx2 {

[[gnu::always_inline]] inline __m256 Exp(__m256 x) {
  // exp(x) = 2^n · exp(r), n = round(x / ln2), r = x - n·ln2 in [-ln2/2, ln2/2].
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.7f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);   // ln2 high part (exact product)
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);        // ln2 low part
  __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  // 2^n in two halves, so n down to -126-ish and up to 128 both stay representable.
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i half = _mm256_srai_epi32(ni, 1);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, _mm256_set1_epi32(127)), 23));
  const __m256 s2 = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, half), _mm256_set1_epi32(127)), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

// x / (1 + exp(-t)): the sigmoid form with t = alpha·x, and the tanh form with t = 2·√(2/π)(x + 0.044715x³).
[[gnu::always_inline]] inline __m256 XSigmoid(__m256 x, __m256 t) {
  const __m256 e = Exp(_mm256_sub_ps(_mm256_setzero_ps(), t));
  return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

[[gnu::always_inline]] inline __m256 GeluTanh(__m256 x) {
  const __m256 x2 = _mm256_mul_ps(x, x);
  const __m256 inner = _mm256_fmadd_ps(_mm256_mul_ps(x2, _mm256_set1_ps(0.044715f)), x, x);
  return XSigmoid(x, _mm256_mul_ps(inner, _mm256_set1_ps(2.0f * 0.7978845608028654f)));
}

[[gnu::always_inline]] inline __m256 GeluErf(__m256 x) {
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  const __m256 z = _mm256_mul_ps(x, _mm256_set1_ps(0.70710678118654752f));
  const __m256 az = _mm256_andnot_ps(sign_mask, z);

  // Inner piece: Φ = 0.5 + 0.5·erf(z), erf(z) = z·P(z²).
  const __m256 z2 = _mm256_mul_ps(z, z);
  __m256 p = _mm256_set1_ps(-5.986208510e-04f);
  p = _mm256_fmadd_ps(p, z2, _mm256_set1_ps(4.992181038e-03f));
  p = _mm256_fmadd_ps(p, z2, _mm256_set1_ps(-2.676586123e-02f));
  p = _mm256_fmadd_ps(p, z2, _mm256_set1_ps(1.128179275e-01f));
  p = _mm256_fmadd_ps(p, z2, _mm256_set1_ps(-3.761249112e-01f));
  p = _mm256_fmadd_ps(p, z2, _mm256_set1_ps(1.128379149e+00f));
  const __m256 phi_inner = _mm256_fmadd_ps(_mm256_mul_ps(z, p), _mm256_set1_ps(0.5f), _mm256_set1_ps(0.5f));

  // Outer piece: erfc(|z|) = exp(Q(|z|)); Φ = 0.5·erfc(|z|) for x < 0, 1 - 0.5·erfc(|z|) for x > 0.
  const __m256 a = _mm256_min_ps(az, _mm256_set1_ps(4.5f));
  __m256 q = _mm256_set1_ps(-9.570363657e-08f);
  q = _mm256_fmadd_ps(q, a, _mm256_set1_ps(3.737564066e-06f));
  q = _mm256_fmadd_ps(q, a, _mm256_set1_ps(-6.600967446e-05f));
  q = _mm256_fmadd_ps(q, a, _mm256_set1_ps(7.042322763e-04f));
  q = _mm256_fmadd_ps(q, a, _mm256_set1_ps(-5.120123123e-03f));
  q = _mm256_fmadd_ps(q, a, _mm256_set1_ps(2.720148407e-02f));
  q = _mm256_fmadd_ps(q, a, _mm256_set1_ps(-1.111671490e-01f));
  q = _mm256_fmadd_ps(q, a, _mm256_set1_ps(-6.308879440e-01f));
  q = _mm256_fmadd_ps(q, a, _mm256_set1_ps(-1.130687870e+00f));
  q = _mm256_fmadd_ps(q, a, _mm256_set1_ps(4.142074826e-04f));
  __m256 half_erfc = _mm256_mul_ps(Exp(q), _mm256_set1_ps(0.5f));
  half_erfc = _mm256_and_ps(half_erfc, _mm256_cmp_ps(az, _mm256_set1_ps(4.5f), _CMP_LT_OQ));
  const __m256 negative = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ);
  const __m256 phi_outer =
      _mm256_blendv_ps(_mm256_sub_ps(_mm256_set1_ps(1.0f), half_erfc), half_erfc, negative);

  const __m256 inner = _mm256_cmp_ps(az, _mm256_set1_ps(0.921875f), _CMP_LT_OQ);
  return _mm256_mul_ps(x, _mm256_blendv_ps(phi_outer, phi_inner, inner));
}

template <Activation kAct>
[[gnu::always_inline]] inline __m256 Activate(__m256 x, __m256 alpha) {
  if constexpr (kAct == Activation::kGeluErf) return GeluErf(x);
  if constexpr (kAct == Activation::kGeluTanh) return GeluTanh(x);
  if constexpr (kAct == Activation::kSigmoid) return XSigmoid(x, _mm256_mul_ps(alpha, x));
  return x;
}

}  // namespace onnxfuse::cpu::avx2
