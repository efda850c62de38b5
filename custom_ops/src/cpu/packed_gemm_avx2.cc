// The AVX2+FMA GEMM with the fused epilogue (compiled with -mavx2 -mfma; see packed_gemm.h for why).
//
// Blocking, for one core's caches (32 KiB L1d, 512 KiB L2 on the team's EPYC; sane on any AVX2 part):
//   - the weight is pre-packed into 16-column panels (packed_gemm.h), so the inner loop streams it
//     with aligned loads and no per-call packing of a constant weight;
//   - per kKc-deep slice of K, the tile's rows of A are packed into 6-row slivers (k-major), an
//     m x kKc block that stays in L2 while every panel of the tile reuses it;
//   - a 16 x kKc panel slice (16 KiB) stays in L1 while all slivers of the tile run against it;
//   - the micro-kernel keeps a 6 x 16 block of C in 12 ymm registers: per k, 2 loads of W, 6
//     broadcasts of A, 12 FMAs. After the last K slice it adds the bias and applies the activation to
//     those registers and stores the finished values: the pre-activation never reaches memory.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "activation_avx2.h"
#include "packed_gemm.h"

namespace onnxfuse::cpu {
namespace {

constexpr int64_t kMr = 6;
constexpr int64_t kNr = kPanelWidth;  // 16 = two ymm
constexpr int64_t kKc = 256;
constexpr int64_t kPrefetchDistance = 16;

// A rows [0, m) x columns [0, kc) (row stride lda) -> slivers of kMr rows, k-major, zero rows past m.
void PackA(const float* a, int64_t lda, int64_t m, int64_t kc, float* out) {
  for (int64_t s = 0; s < m; s += kMr) {
    float* dst = out + s * kc;  // sliver s/kMr starts at (s/kMr) * kMr * kc
    const int64_t rows = std::min(kMr, m - s);
    for (int64_t r = 0; r < rows; ++r) {
      const float* src = a + (s + r) * lda;
      for (int64_t k = 0; k < kc; ++k) dst[k * kMr + r] = src[k];
    }
    for (int64_t r = rows; r < kMr; ++r)
      for (int64_t k = 0; k < kc; ++k) dst[k * kMr + r] = 0.0f;
  }
}

// C[6 x 16] (row stride ldc) (+)= A_sliver · W_panel over kc, then, when kLast, act(· + bias).
template <Activation kAct, bool kLast, bool kPrefetchB>
inline void MicroKernel(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, bool accumulate,
                        const float* bias, float alpha) {
  __m256 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
  if (accumulate) {
    c00 = _mm256_loadu_ps(c + 0 * ldc), c01 = _mm256_loadu_ps(c + 0 * ldc + 8);
    c10 = _mm256_loadu_ps(c + 1 * ldc), c11 = _mm256_loadu_ps(c + 1 * ldc + 8);
    c20 = _mm256_loadu_ps(c + 2 * ldc), c21 = _mm256_loadu_ps(c + 2 * ldc + 8);
    c30 = _mm256_loadu_ps(c + 3 * ldc), c31 = _mm256_loadu_ps(c + 3 * ldc + 8);
    c40 = _mm256_loadu_ps(c + 4 * ldc), c41 = _mm256_loadu_ps(c + 4 * ldc + 8);
    c50 = _mm256_loadu_ps(c + 5 * ldc), c51 = _mm256_loadu_ps(c + 5 * ldc + 8);
  } else {
    c00 = c01 = c10 = c11 = c20 = c21 = c30 = c31 = c40 = c41 = c50 = c51 = _mm256_setzero_ps();
  }
#pragma GCC unroll 4
  for (int64_t k = 0; k < kc; ++k) {
    // The first sliver against a panel slice brings it from L3/memory (one 64-byte line per k): fetch
    // it kPrefetchDistance steps ahead so the FMAs do not wait on it.
    if constexpr (kPrefetchB) _mm_prefetch(reinterpret_cast<const char*>(b + (k + kPrefetchDistance) * kNr), _MM_HINT_T0);
    const __m256 b0 = _mm256_load_ps(b + k * kNr);
    const __m256 b1 = _mm256_load_ps(b + k * kNr + 8);
    const float* ak = a + k * kMr;
    __m256 av = _mm256_broadcast_ss(ak + 0);
    c00 = _mm256_fmadd_ps(av, b0, c00), c01 = _mm256_fmadd_ps(av, b1, c01);
    av = _mm256_broadcast_ss(ak + 1);
    c10 = _mm256_fmadd_ps(av, b0, c10), c11 = _mm256_fmadd_ps(av, b1, c11);
    av = _mm256_broadcast_ss(ak + 2);
    c20 = _mm256_fmadd_ps(av, b0, c20), c21 = _mm256_fmadd_ps(av, b1, c21);
    av = _mm256_broadcast_ss(ak + 3);
    c30 = _mm256_fmadd_ps(av, b0, c30), c31 = _mm256_fmadd_ps(av, b1, c31);
    av = _mm256_broadcast_ss(ak + 4);
    c40 = _mm256_fmadd_ps(av, b0, c40), c41 = _mm256_fmadd_ps(av, b1, c41);
    av = _mm256_broadcast_ss(ak + 5);
    c50 = _mm256_fmadd_ps(av, b0, c50), c51 = _mm256_fmadd_ps(av, b1, c51);
  }
  if constexpr (kLast) {
    const __m256 bias0 = bias ? _mm256_loadu_ps(bias) : _mm256_setzero_ps();
    const __m256 bias1 = bias ? _mm256_loadu_ps(bias + 8) : _mm256_setzero_ps();
    const __m256 al = _mm256_set1_ps(alpha);
    using avx2::Activate;
    c00 = Activate<kAct>(_mm256_add_ps(c00, bias0), al), c01 = Activate<kAct>(_mm256_add_ps(c01, bias1), al);
    c10 = Activate<kAct>(_mm256_add_ps(c10, bias0), al), c11 = Activate<kAct>(_mm256_add_ps(c11, bias1), al);
    c20 = Activate<kAct>(_mm256_add_ps(c20, bias0), al), c21 = Activate<kAct>(_mm256_add_ps(c21, bias1), al);
    c30 = Activate<kAct>(_mm256_add_ps(c30, bias0), al), c31 = Activate<kAct>(_mm256_add_ps(c31, bias1), al);
    c40 = Activate<kAct>(_mm256_add_ps(c40, bias0), al), c41 = Activate<kAct>(_mm256_add_ps(c41, bias1), al);
    c50 = Activate<kAct>(_mm256_add_ps(c50, bias0), al), c51 = Activate<kAct>(_mm256_add_ps(c51, bias1), al);
  }
  _mm256_storeu_ps(c + 0 * ldc, c00), _mm256_storeu_ps(c + 0 * ldc + 8, c01);
  _mm256_storeu_ps(c + 1 * ldc, c10), _mm256_storeu_ps(c + 1 * ldc + 8, c11);
  _mm256_storeu_ps(c + 2 * ldc, c20), _mm256_storeu_ps(c + 2 * ldc + 8, c21);
  _mm256_storeu_ps(c + 3 * ldc, c30), _mm256_storeu_ps(c + 3 * ldc + 8, c31);
  _mm256_storeu_ps(c + 4 * ldc, c40), _mm256_storeu_ps(c + 4 * ldc + 8, c41);
  _mm256_storeu_ps(c + 5 * ldc, c50), _mm256_storeu_ps(c + 5 * ldc + 8, c51);
}

template <Activation kAct>
inline void RunMicroKernel(bool last, bool prefetch, int64_t kc, const float* a, const float* b, float* c,
                           int64_t ldc, bool accumulate, const float* bias, float alpha) {
  if (prefetch) {
    if (last) {
      MicroKernel<kAct, true, true>(kc, a, b, c, ldc, accumulate, bias, alpha);
    } else {
      MicroKernel<kAct, false, true>(kc, a, b, c, ldc, accumulate, bias, alpha);
    }
  } else if (last) {
    MicroKernel<kAct, true, false>(kc, a, b, c, ldc, accumulate, bias, alpha);
  } else {
    MicroKernel<kAct, false, false>(kc, a, b, c, ldc, accumulate, bias, alpha);
  }
}

// A thread's scratch for the packed A block; grows to the largest tile it has seen, never shrinks.
float* PackBuffer(int64_t floats) {
  thread_local AlignedFloats buffer;
  thread_local int64_t capacity = 0;
  if (floats > capacity) {
    buffer = AllocateAligned(floats);
    capacity = floats;
  }
  return buffer.get();
}

template <Activation kAct>
void Tile(const FusedTile& t) {
  const int64_t m_padded = (t.m + kMr - 1) / kMr * kMr;
  float* apack = PackBuffer(m_padded * std::min(kKc, t.K));
  for (int64_t pc = 0; pc < t.K; pc += kKc) {
    const int64_t kc = std::min(kKc, t.K - pc);
    const bool first = pc == 0;
    const bool last = pc + kc >= t.K;
    PackA(t.a + pc, t.lda, t.m, kc, apack);
    for (int64_t j = 0; j < t.n; j += kNr) {
      const int64_t col = t.n0 + j;
      const float* panel = t.packed_w + (col / kNr) * t.K * kNr + pc * kNr;
      const int64_t width = std::min(kNr, t.n - j);
      const float* bias = t.bias ? t.bias + col : nullptr;
      alignas(32) float bias_pad[kNr];
      if (bias != nullptr && width < kNr) {  // the panel's zero columns get a zero bias
        std::memset(bias_pad, 0, sizeof(bias_pad));
        std::memcpy(bias_pad, bias, sizeof(float) * width);
        bias = bias_pad;
      }
      for (int64_t s = 0; s < t.m; s += kMr) {
        const int64_t rows = std::min(kMr, t.m - s);
        const float* a = apack + s * kc;
        float* c = t.c + s * t.ldc + j;
        if (rows == kMr && width == kNr) {
          RunMicroKernel<kAct>(last, s == 0, kc, a, panel, c, t.ldc, !first, bias, t.alpha);
          continue;
        }
        // Ragged edge: run the same kernel on a full 6x16 block, copy the valid part in and out.
        alignas(32) float block[kMr * kNr] = {};
        if (!first) {
          for (int64_t r = 0; r < rows; ++r) std::memcpy(block + r * kNr, c + r * t.ldc, sizeof(float) * width);
        }
        RunMicroKernel<kAct>(last, s == 0, kc, a, panel, block, kNr, !first, bias, t.alpha);
        for (int64_t r = 0; r < rows; ++r) std::memcpy(c + r * t.ldc, block + r * kNr, sizeof(float) * width);
      }
    }
  }
}

}  // namespace

void FusedGemmTile(const FusedTile& t) {
  switch (t.act) {
    case Activation::kGeluErf: return Tile<Activation::kGeluErf>(t);
    case Activation::kGeluTanh: return Tile<Activation::kGeluTanh>(t);
    case Activation::kSigmoid: return Tile<Activation::kSigmoid>(t);
  }
}

}  // namespace onnxfuse::cpu
