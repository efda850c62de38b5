// The portable implementations and the choice between them.
#include "cpu/simd/vector_kernels.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#include <onnxruntime_cxx_api.h>

namespace onnxfuse::cpu {
namespace {

inline float ActivateScalar(float x, Activation act, float alpha) {
  switch (act) {
    case Activation::kGeluErf: return 0.5f * x * std::erfc(-x * 0.70710678118654752f);
    case Activation::kGeluTanh: {
      // 0.5·x·(1 + tanh(u)) == x·σ(2u): one exp, no cancellation for negative x.
      const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
      return x / (1.0f + std::exp(-2.0f * u));
    }
    case Activation::kSigmoid: return x / (1.0f + std::exp(-alpha * x));
  }
  return x;
}

void BiasActivationScalar(float* y, int64_t ldy, int64_t rows, int64_t cols, const float* bias, Activation act,
                          float alpha) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = y + r * ldy;
    for (int64_t c = 0; c < cols; ++c) row[c] = ActivateScalar(row[c] + (bias ? bias[c] : 0.0f), act, alpha);
  }
}

void HalfToFloatScalar(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = Ort::Float16_t::FromBits(in[i]).ToFloat();
}
void FloatToHalfScalar(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = Ort::Float16_t(in[i]).val;
}
void BFloat16ToFloatScalar(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = Ort::BFloat16_t::FromBits(in[i]).ToFloat();
}
void FloatToBFloat16Scalar(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = Ort::BFloat16_t(in[i]).val;
}

const VectorKernels kScalar = {"scalar",          BiasActivationScalar,  HalfToFloatScalar,
                               FloatToHalfScalar, BFloat16ToFloatScalar, FloatToBFloat16Scalar};

const VectorKernels& Choose() {
  const char* forced = std::getenv("ONNXFUSE_CPU_ISA");
  if (forced != nullptr && std::strcmp(forced, "scalar") == 0) return kScalar;
#if defined(__x86_64__) || defined(_M_X64)
  const VectorKernels* avx2 = Avx2VectorKernels();
  if (avx2 != nullptr && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c")) {
    return *avx2;
  }
#endif
  return kScalar;
}

}  // namespace

const VectorKernels& ScalarVectorKernels() { return kScalar; }

const VectorKernels& CpuVectorKernels() {
  static const VectorKernels& chosen = Choose();
  return chosen;
}

#if !defined(ONNXFUSE_HAVE_AVX2_KERNELS)
const VectorKernels* Avx2VectorKernels() { return nullptr; }
#endif

}  // namespace onnxfuse::cpu
