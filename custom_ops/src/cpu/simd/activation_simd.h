// The vector activations, written once over a SIMD traits type S (simd_avx2.h, simd_avx512.h) and
// compiled into each ISA's files: the epilogue of the packed GEMM (packed_gemm_avx2.cc,
// packed_gemm_avx512.cc) and the block-wise one (vector_kernels_avx2.cc).
//
// S provides: V (a float vector), M (a lane mask), set1, zero, add, sub, mul, div, fmadd, fnmadd, min,
// max, abs, round_nearest, less (-> M), select(M, if_true, if_false), and_mask(M, v) (v where M, else 0),
// and pow2i(V n) = 2^n for integral n in [-126, 127].
//
// Every function takes B independent vectors and advances them one operation at a time ("lockstep"):
// consecutive instructions are then independent, so the out-of-order core overlaps the long polynomial
// chains of B vectors. One vector at a time, an erf-GELU is latency-bound (its polynomial is one chain of
// dependent steps); four in lockstep overlap four chains. The per-element arithmetic is the same for any B,
// so results do not depend on how a caller batches.
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

#include <cstdint>

#include "activation.h"

namespace onnxfuse::cpu::simd {

// for (i in 0..B): statement — the lockstep loop, fully unrolled.
#define ONNXFUSE_EACH(i) _Pragma("GCC unroll 8") for (int i = 0; i < B; ++i)

// exp(x) for x <= 0 down to -87.3 when kNarrow (2^n with n >= -126 in one step), for any x otherwise.
template <class S, int B, bool kNarrow = false>
[[gnu::always_inline]] inline void ExpN(typename S::V (&x)[B]) {
  using V = typename S::V;
  // exp(x) = 2^n · exp(r), n = round(x / ln2), r = x - n·ln2 in [-ln2/2, ln2/2].
  V n[B], p[B];
  if constexpr (!kNarrow) {
    ONNXFUSE_EACH(i) x[i] = S::min(S::max(x[i], S::set1(-87.3f)), S::set1(88.7f));
  }
  ONNXFUSE_EACH(i) n[i] = S::round_nearest(S::mul(x[i], S::set1(1.44269504088896341f)));
  ONNXFUSE_EACH(i) x[i] = S::fnmadd(n[i], S::set1(0.693359375f), x[i]);  // ln2 high part (exact product)
  ONNXFUSE_EACH(i) x[i] = S::fnmadd(n[i], S::set1(-2.12194440e-4f), x[i]);  // ln2 low part
  ONNXFUSE_EACH(i) p[i] = S::fmadd(S::set1(1.0f / 5040.0f), x[i], S::set1(1.0f / 720.0f));
  ONNXFUSE_EACH(i) p[i] = S::fmadd(p[i], x[i], S::set1(1.0f / 120.0f));
  ONNXFUSE_EACH(i) p[i] = S::fmadd(p[i], x[i], S::set1(1.0f / 24.0f));
  ONNXFUSE_EACH(i) p[i] = S::fmadd(p[i], x[i], S::set1(1.0f / 6.0f));
  ONNXFUSE_EACH(i) p[i] = S::fmadd(p[i], x[i], S::set1(0.5f));
  ONNXFUSE_EACH(i) p[i] = S::fmadd(p[i], x[i], S::set1(1.0f));
  ONNXFUSE_EACH(i) p[i] = S::fmadd(p[i], x[i], S::set1(1.0f));
  if constexpr (kNarrow) {
    ONNXFUSE_EACH(i) x[i] = S::mul(p[i], S::pow2i(n[i]));
  } else {
    // 2^n in two halves, so n down to -126 and up to 128 both stay representable.
    V half[B];
    ONNXFUSE_EACH(i) half[i] = S::round_nearest(S::mul(n[i], S::set1(0.5f)));
    ONNXFUSE_EACH(i) x[i] = S::mul(S::mul(p[i], S::pow2i(half[i])), S::pow2i(S::sub(n[i], half[i])));
  }
}

// x / (1 + exp(-t)): the sigmoid form with t = alpha·x, and the tanh form with t = 2·√(2/π)(x + 0.044715x³).
// t is overwritten.
template <class S, int B>
[[gnu::always_inline]] inline void XSigmoidN(typename S::V (&x)[B], typename S::V (&t)[B]) {
  ONNXFUSE_EACH(i) t[i] = S::sub(S::zero(), t[i]);
  ExpN<S, B>(t);
  ONNXFUSE_EACH(i) x[i] = S::div(x[i], S::add(S::set1(1.0f), t[i]));
}

template <class S, int B>
[[gnu::always_inline]] inline void GeluTanhN(typename S::V (&x)[B]) {
  typename S::V t[B];
  ONNXFUSE_EACH(i) t[i] = S::fmadd(S::mul(S::mul(x[i], x[i]), S::set1(0.044715f)), x[i], x[i]);
  ONNXFUSE_EACH(i) t[i] = S::mul(t[i], S::set1(2.0f * 0.7978845608028654f));
  XSigmoidN<S, B>(x, t);
}

template <class S, int B>
[[gnu::always_inline]] inline void GeluErfN(typename S::V (&x)[B]) {
  using V = typename S::V;
  V z[B], az[B], phi_inner[B], q[B], a[B];
  ONNXFUSE_EACH(i) z[i] = S::mul(x[i], S::set1(0.70710678118654752f));
  ONNXFUSE_EACH(i) az[i] = S::abs(z[i]);

  // Inner piece: Φ = 0.5 + 0.5·erf(z), erf(z) = z·P(z²).
  V z2[B];
  ONNXFUSE_EACH(i) z2[i] = S::mul(z[i], z[i]);
  ONNXFUSE_EACH(i) phi_inner[i] = S::fmadd(S::set1(-5.986208510e-04f), z2[i], S::set1(4.992181038e-03f));
  ONNXFUSE_EACH(i) phi_inner[i] = S::fmadd(phi_inner[i], z2[i], S::set1(-2.676586123e-02f));
  ONNXFUSE_EACH(i) phi_inner[i] = S::fmadd(phi_inner[i], z2[i], S::set1(1.128179275e-01f));
  ONNXFUSE_EACH(i) phi_inner[i] = S::fmadd(phi_inner[i], z2[i], S::set1(-3.761249112e-01f));
  ONNXFUSE_EACH(i) phi_inner[i] = S::fmadd(phi_inner[i], z2[i], S::set1(1.128379149e+00f));
  ONNXFUSE_EACH(i) phi_inner[i] = S::fmadd(S::mul(z[i], phi_inner[i]), S::set1(0.5f), S::set1(0.5f));

  // Outer piece: erfc(|z|) = exp(Q(|z|)); Φ = 0.5·erfc(|z|) for x < 0, 1 - 0.5·erfc(|z|) for x > 0.
  // Q(a) for a in [0, 4.5] lies in [-23, 0]: the narrow exp applies.
  ONNXFUSE_EACH(i) a[i] = S::min(az[i], S::set1(4.5f));
  ONNXFUSE_EACH(i) q[i] = S::fmadd(S::set1(-9.570363657e-08f), a[i], S::set1(3.737564066e-06f));
  ONNXFUSE_EACH(i) q[i] = S::fmadd(q[i], a[i], S::set1(-6.600967446e-05f));
  ONNXFUSE_EACH(i) q[i] = S::fmadd(q[i], a[i], S::set1(7.042322763e-04f));
  ONNXFUSE_EACH(i) q[i] = S::fmadd(q[i], a[i], S::set1(-5.120123123e-03f));
  ONNXFUSE_EACH(i) q[i] = S::fmadd(q[i], a[i], S::set1(2.720148407e-02f));
  ONNXFUSE_EACH(i) q[i] = S::fmadd(q[i], a[i], S::set1(-1.111671490e-01f));
  ONNXFUSE_EACH(i) q[i] = S::fmadd(q[i], a[i], S::set1(-6.308879440e-01f));
  ONNXFUSE_EACH(i) q[i] = S::fmadd(q[i], a[i], S::set1(-1.130687870e+00f));
  ONNXFUSE_EACH(i) q[i] = S::fmadd(q[i], a[i], S::set1(4.142074826e-04f));
  ExpN<S, B, /*kNarrow=*/true>(q);
  ONNXFUSE_EACH(i) q[i] = S::and_mask(S::less(az[i], S::set1(4.5f)), S::mul(q[i], S::set1(0.5f)));  // ½erfc
  ONNXFUSE_EACH(i) q[i] = S::select(S::less(x[i], S::zero()), q[i], S::sub(S::set1(1.0f), q[i]));  // Φ outer
  ONNXFUSE_EACH(i) x[i] = S::mul(x[i], S::select(S::less(az[i], S::set1(0.921875f)), phi_inner[i], q[i]));
}

template <class S, Activation kAct, int B>
[[gnu::always_inline]] inline void ActivateN(typename S::V (&x)[B], typename S::V alpha) {
  if constexpr (kAct == Activation::kGeluErf) {
    GeluErfN<S, B>(x);
  } else if constexpr (kAct == Activation::kGeluTanh) {
    GeluTanhN<S, B>(x);
  } else if constexpr (kAct == Activation::kSigmoid) {
    typename S::V t[B];
    ONNXFUSE_EACH(i) t[i] = S::mul(alpha, x[i]);
    XSigmoidN<S, B>(x, t);
  }
}

#undef ONNXFUSE_EACH

template <class S, Activation kAct>
[[gnu::always_inline]] inline typename S::V Activate(typename S::V x, typename S::V alpha) {
  typename S::V v[1] = {x};
  ActivateN<S, kAct, 1>(v, alpha);
  return v[0];
}

// act over a rows x cols block (row stride ld) in place; cols a multiple of S::kWidth. Four vectors at a
// time in lockstep.
template <class S, Activation kAct>
inline void ActivateBlock(float* y, int64_t ld, int64_t rows, int64_t cols, float alpha_value) {
  using V = typename S::V;
  constexpr int kBatch = 4;
  const V alpha = S::set1(alpha_value);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = y + r * ld;
    int64_t c = 0;
    for (; c + kBatch * S::kWidth <= cols; c += kBatch * S::kWidth) {
      V v[kBatch];
      for (int i = 0; i < kBatch; ++i) v[i] = S::load(row + c + i * S::kWidth);
      ActivateN<S, kAct, kBatch>(v, alpha);
      for (int i = 0; i < kBatch; ++i) S::store(row + c + i * S::kWidth, v[i]);
    }
    for (; c < cols; c += S::kWidth) S::store(row + c, Activate<S, kAct>(S::load(row + c), alpha));
  }
}

}  // namespace onnxfuse::cpu::simd
