// SIMD traits for AVX2 + FMA (8 floats): include only from files compiled with -mavx2 -mfma.
#pragma once

#include <immintrin.h>

namespace onnxfuse::cpu::simd {

struct Avx2 {
  using V = __m256;
  using M = __m256;  // all-ones lanes where true
  static constexpr int kWidth = 8;
  [[gnu::always_inline]] static V set1(float v) { return _mm256_set1_ps(v); }
  [[gnu::always_inline]] static V zero() { return _mm256_setzero_ps(); }
  [[gnu::always_inline]] static V load(const float* p) { return _mm256_loadu_ps(p); }
  [[gnu::always_inline]] static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  [[gnu::always_inline]] static V add(V a, V b) { return _mm256_add_ps(a, b); }
  [[gnu::always_inline]] static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  [[gnu::always_inline]] static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  [[gnu::always_inline]] static V div(V a, V b) { return _mm256_div_ps(a, b); }
  [[gnu::always_inline]] static V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  [[gnu::always_inline]] static V fnmadd(V a, V b, V c) { return _mm256_fnmadd_ps(a, b, c); }
  [[gnu::always_inline]] static V min(V a, V b) { return _mm256_min_ps(a, b); }
  [[gnu::always_inline]] static V max(V a, V b) { return _mm256_max_ps(a, b); }
  [[gnu::always_inline]] static V abs(V a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
  [[gnu::always_inline]] static V round_nearest(V a) {
    return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  [[gnu::always_inline]] static M less(V a, V b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
  [[gnu::always_inline]] static V select(M m, V if_true, V if_false) { return _mm256_blendv_ps(if_false, if_true, m); }
  [[gnu::always_inline]] static V and_mask(M m, V v) { return _mm256_and_ps(m, v); }
  [[gnu::always_inline]] static V pow2i(V n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  }
};

}  // namespace onnxfuse::cpu::simd
