// AVX2 + FMA + F16C implementations of VectorKernels. This file alone is compiled with those ISA flags
// (see CMakeLists.txt); nothing here runs unless CpuVectorKernels() found the CPU supports them.
// The activation math lives in activation_simd.h.
#include <cstring>

#include "cpu/simd/activation_simd.h"
#include "cpu/simd/simd_avx2.h"
#include "cpu/simd/vector_kernels.h"

namespace onnxfuse::cpu {
namespace {

template <Activation kAct>
inline __m256 Activate(__m256 x, __m256 alpha) {
  return simd::Activate<simd::Avx2, kAct>(x, alpha);
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
