// AVX2 + FMA + F16C implementations of VectorKernels. This file alone is compiled with those ISA flags
// (see CMakeLists.txt); nothing here runs unless CpuVectorKernels() found the CPU supports them.
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
#include <immintrin.h>

#include <cstring>

#include "vector_kernels.h"

namespace onnxfuse::cpu {
namespace {

inline __m256 Exp(__m256 x) {
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
inline __m256 XSigmoid(__m256 x, __m256 t) {
  const __m256 e = Exp(_mm256_sub_ps(_mm256_setzero_ps(), t));
  return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

inline __m256 GeluTanh(__m256 x) {
  const __m256 x2 = _mm256_mul_ps(x, x);
  const __m256 inner = _mm256_fmadd_ps(_mm256_mul_ps(x2, _mm256_set1_ps(0.044715f)), x, x);
  return XSigmoid(x, _mm256_mul_ps(inner, _mm256_set1_ps(2.0f * 0.7978845608028654f)));
}

inline __m256 GeluErf(__m256 x) {
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
inline __m256 Activate(__m256 x, __m256 alpha) {
  if constexpr (kAct == Activation::kGeluErf) return GeluErf(x);
  if constexpr (kAct == Activation::kGeluTanh) return GeluTanh(x);
  if constexpr (kAct == Activation::kSigmoid) return XSigmoid(x, _mm256_mul_ps(alpha, x));
  return x;
}

// Tail columns go through the same vector code on a zero-padded copy, so every element of the output
// sees exactly one implementation of the math.
template <Activation kAct>
void BiasActivationRows(float* y, int64_t ldy, int64_t rows, int64_t cols, const float* bias, float alpha_value) {
  const __m256 alpha = _mm256_set1_ps(alpha_value);
  const int64_t full = cols & ~int64_t{7};
  const int64_t tail = cols - full;
  alignas(32) float bias_tail[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (bias != nullptr && tail > 0) std::memcpy(bias_tail, bias + full, sizeof(float) * tail);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = y + r * ldy;
    int64_t c = 0;
    if (bias != nullptr) {
      for (; c < full; c += 8) {
        const __m256 v = _mm256_add_ps(_mm256_loadu_ps(row + c), _mm256_loadu_ps(bias + c));
        _mm256_storeu_ps(row + c, Activate<kAct>(v, alpha));
      }
    } else {
      for (; c < full; c += 8) _mm256_storeu_ps(row + c, Activate<kAct>(_mm256_loadu_ps(row + c), alpha));
    }
    if (tail > 0) {
      alignas(32) float buf[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      std::memcpy(buf, row + full, sizeof(float) * tail);
      const __m256 v = _mm256_add_ps(_mm256_load_ps(buf), _mm256_load_ps(bias_tail));
      _mm256_store_ps(buf, Activate<kAct>(v, alpha));
      std::memcpy(row + full, buf, sizeof(float) * tail);
    }
  }
}

void BiasActivation(float* y, int64_t ldy, int64_t rows, int64_t cols, const float* bias, Activation act,
                    float alpha) {
  switch (act) {
    case Activation::kGeluErf: return BiasActivationRows<Activation::kGeluErf>(y, ldy, rows, cols, bias, alpha);
    case Activation::kGeluTanh: return BiasActivationRows<Activation::kGeluTanh>(y, ldy, rows, cols, bias, alpha);
    case Activation::kSigmoid: return BiasActivationRows<Activation::kSigmoid>(y, ldy, rows, cols, bias, alpha);
  }
}

void HalfToFloat(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  if (i < n) {
    alignas(16) uint16_t buf[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    alignas(32) float res[8];
    std::memcpy(buf, in + i, sizeof(uint16_t) * (n - i));
    _mm256_store_ps(res, _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(buf))));
    std::memcpy(out + i, res, sizeof(float) * (n - i));
  }
}

void FloatToHalf(const float* in, uint16_t* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
  }
  if (i < n) {
    alignas(32) float buf[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    alignas(16) uint16_t res[8];
    std::memcpy(buf, in + i, sizeof(float) * (n - i));
    _mm_store_si128(reinterpret_cast<__m128i*>(res), _mm256_cvtps_ph(_mm256_load_ps(buf), _MM_FROUND_TO_NEAREST_INT));
    std::memcpy(out + i, res, sizeof(uint16_t) * (n - i));
  }
}

inline __m256 BFloat16x8ToFloat(__m128i v) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
}

// Round to nearest even; NaNs stay NaNs (quiet bit forced so the truncated payload cannot become Inf).
inline __m128i FloatToBFloat16x8(__m256 f) {
  const __m256i u = _mm256_castps_si256(f);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
  const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q));
  const __m256i r = _mm256_blendv_epi8(rounded, nan, is_nan);
  // Pack 8 x u32 (each < 65536) to 8 x u16, keeping lane order.
  const __m256i packed = _mm256_packus_epi32(r, r);
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

void BFloat16ToFloat(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, BFloat16x8ToFloat(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  if (i < n) {
    alignas(16) uint16_t buf[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    alignas(32) float res[8];
    std::memcpy(buf, in + i, sizeof(uint16_t) * (n - i));
    _mm256_store_ps(res, BFloat16x8ToFloat(_mm_load_si128(reinterpret_cast<const __m128i*>(buf))));
    std::memcpy(out + i, res, sizeof(float) * (n - i));
  }
}

void FloatToBFloat16(const float* in, uint16_t* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), FloatToBFloat16x8(_mm256_loadu_ps(in + i)));
  if (i < n) {
    alignas(32) float buf[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    alignas(16) uint16_t res[8];
    std::memcpy(buf, in + i, sizeof(float) * (n - i));
    _mm_store_si128(reinterpret_cast<__m128i*>(res), FloatToBFloat16x8(_mm256_load_ps(buf)));
    std::memcpy(out + i, res, sizeof(uint16_t) * (n - i));
  }
}

const VectorKernels kAvx2 = {"avx2", BiasActivation, HalfToFloat, FloatToHalf, BFloat16ToFloat, FloatToBFloat16};

}  // namespace

const VectorKernels* Avx2VectorKernels() { return &kAvx2; }

}  // namespace onnxfuse::cpu
