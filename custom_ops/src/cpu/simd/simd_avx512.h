// SIMD traits for AVX-512F (16 floats): include only from files compiled with -mavx512f.
#pragma once

#include <immintrin.h>

namespace onnxfuse::cpu::simd {

struct Avx512 {
  using V = __m512;
  using M = __mmask16;
  static constexpr int kWidth = 16;
  [[gnu::always_inline]] static V set1(float v) { return _mm512_set1_ps(v); }
  [[gnu::always_inline]] static V zero() { return _mm512_setzero_ps(); }
  [[gnu::always_inline]] static V load(const float* p) { return _mm512_loadu_ps(p); }
  [[gnu::always_inline]] static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  [[gnu::always_inline]] static V add(V a, V b) { return _mm512_add_ps(a, b); }
  [[gnu::always_inline]] static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  [[gnu::always_inline]] static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  [[gnu::always_inline]] static V div(V a, V b) { return _mm512_div_ps(a, b); }
  [[gnu::always_inline]] static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  [[gnu::always_inline]] static V fnmadd(V a, V b, V c) { return _mm512_fnmadd_ps(a, b, c); }
  [[gnu::always_inline]] static V min(V a, V b) { return _mm512_min_ps(a, b); }
  [[gnu::always_inline]] static V max(V a, V b) { return _mm512_max_ps(a, b); }
  [[gnu::always_inline]] static V abs(V a) { return _mm512_abs_ps(a); }
  [[gnu::always_inline]] static V round_nearest(V a) {
    return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  [[gnu::always_inline]] static M less(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
  [[gnu::always_inline]] static V select(M m, V if_true, V if_false) { return _mm512_mask_blend_ps(m, if_false, if_true); }
  [[gnu::always_inline]] static V and_mask(M m, V v) { return _mm512_maskz_mov_ps(m, v); }
  [[gnu::always_inline]] static V pow2i(V n) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
  }
};

}  // namespace onnxfuse::cpu::simd
