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

// C[kRows x 16] (row stride ldc) (+)= A[kRows x kc] (row stride lda) · W_panel slice, then, when kLast,
// act(· + bias). A is read in place: each k broadcasts one element of each of the kRows rows (kRows
// sequential streams the hardware prefetcher follows), so X is never copied.
template <int kRows, Activation kAct, bool kLast, bool kPrefetchB>
inline void MicroKernel(int64_t kc, const float* a, int64_t lda, const float* b, float* c, int64_t ldc,
                        bool accumulate, const float* bias, float alpha) {
  __m256 acc0[kRows], acc1[kRows];
#pragma GCC unroll 6
  for (int r = 0; r < kRows; ++r) {
    acc0[r] = accumulate ? _mm256_loadu_ps(c + r * ldc) : _mm256_setzero_ps();
    acc1[r] = accumulate ? _mm256_loadu_ps(c + r * ldc + 8) : _mm256_setzero_ps();
  }
#pragma GCC unroll 4
  for (int64_t k = 0; k < kc; ++k) {
    // The first rows against a panel slice bring it from L3/memory (one 64-byte line per k): fetch it
    // kPrefetchDistance steps ahead so the FMAs do not wait on it.
    if constexpr (kPrefetchB) _mm_prefetch(reinterpret_cast<const char*>(b + (k + kPrefetchDistance) * kNr), _MM_HINT_T0);
    const __m256 b0 = _mm256_load_ps(b + k * kNr);
    const __m256 b1 = _mm256_load_ps(b + k * kNr + 8);
#pragma GCC unroll 6
    for (int r = 0; r < kRows; ++r) {
      const __m256 av = _mm256_broadcast_ss(a + r * lda + k);
      acc0[r] = _mm256_fmadd_ps(av, b0, acc0[r]);
      acc1[r] = _mm256_fmadd_ps(av, b1, acc1[r]);
    }
  }
  if constexpr (kLast) {
    const __m256 bias0 = bias ? _mm256_loadu_ps(bias) : _mm256_setzero_ps();
    const __m256 bias1 = bias ? _mm256_loadu_ps(bias + 8) : _mm256_setzero_ps();
    const __m256 al = _mm256_set1_ps(alpha);
#pragma GCC unroll 6
    for (int r = 0; r < kRows; ++r) {
      acc0[r] = avx2::Activate<kAct>(_mm256_add_ps(acc0[r], bias0), al);
      acc1[r] = avx2::Activate<kAct>(_mm256_add_ps(acc1[r], bias1), al);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < kRows; ++r) {
    _mm256_storeu_ps(c + r * ldc, acc0[r]);
    _mm256_storeu_ps(c + r * ldc + 8, acc1[r]);
  }
}

template <int kRows, Activation kAct>
inline void RunMicroKernel(bool last, bool prefetch, int64_t kc, const float* a, int64_t lda, const float* b,
                           float* c, int64_t ldc, bool accumulate, const float* bias, float alpha) {
  if (prefetch) {
    if (last) return MicroKernel<kRows, kAct, true, true>(kc, a, lda, b, c, ldc, accumulate, bias, alpha);
    return MicroKernel<kRows, kAct, false, true>(kc, a, lda, b, c, ldc, accumulate, bias, alpha);
  }
  if (last) return MicroKernel<kRows, kAct, true, false>(kc, a, lda, b, c, ldc, accumulate, bias, alpha);
  return MicroKernel<kRows, kAct, false, false>(kc, a, lda, b, c, ldc, accumulate, bias, alpha);
}

template <Activation kAct>
inline void RunRows(int64_t rows, bool last, bool prefetch, int64_t kc, const float* a, int64_t lda,
                    const float* b, float* c, int64_t ldc, bool accumulate, const float* bias, float alpha) {
  switch (rows) {
    case 6: return RunMicroKernel<6, kAct>(last, prefetch, kc, a, lda, b, c, ldc, accumulate, bias, alpha);
    case 5: return RunMicroKernel<5, kAct>(last, prefetch, kc, a, lda, b, c, ldc, accumulate, bias, alpha);
    case 4: return RunMicroKernel<4, kAct>(last, prefetch, kc, a, lda, b, c, ldc, accumulate, bias, alpha);
    case 3: return RunMicroKernel<3, kAct>(last, prefetch, kc, a, lda, b, c, ldc, accumulate, bias, alpha);
    case 2: return RunMicroKernel<2, kAct>(last, prefetch, kc, a, lda, b, c, ldc, accumulate, bias, alpha);
    default: return RunMicroKernel<1, kAct>(last, prefetch, kc, a, lda, b, c, ldc, accumulate, bias, alpha);
  }
}

template <Activation kAct>
void Tile(const FusedTile& t) {
  for (int64_t pc = 0; pc < t.K; pc += kKc) {
    const int64_t kc = std::min(kKc, t.K - pc);
    const bool first = pc == 0;
    const bool last = pc + kc >= t.K;
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
        const float* a = t.a + s * t.lda + pc;
        float* c = t.c + s * t.ldc + j;
        if (width == kNr) {
          RunRows<kAct>(rows, last, s == 0, kc, a, t.lda, panel, c, t.ldc, !first, bias, t.alpha);
          continue;
        }
        // Ragged right edge: the zero-padded panel computes a full 16 columns into a local block; only
        // the valid columns are copied in and out.
        alignas(32) float block[kMr * kNr] = {};
        if (!first) {
          for (int64_t r = 0; r < rows; ++r) std::memcpy(block + r * kNr, c + r * t.ldc, sizeof(float) * width);
        }
        RunRows<kAct>(rows, last, s == 0, kc, a, t.lda, panel, block, kNr, !first, bias, t.alpha);
        for (int64_t r = 0; r < rows; ++r) std::memcpy(c + r * t.ldc, block + r * kNr, sizeof(float) * width);
      }
    }
  }
}

// 8x8 transpose of rows r[0..7] (in registers).
inline void Transpose8x8(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r[0] = _mm256_permute2f128_ps(u0, u4, 0x20), r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  r[2] = _mm256_permute2f128_ps(u2, u6, 0x20), r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  r[4] = _mm256_permute2f128_ps(u0, u4, 0x31), r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  r[6] = _mm256_permute2f128_ps(u2, u6, 0x31), r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// One panel of W [N, K] (trans_b): columns n0..n0+15 of op(W) are rows of W, so the panel is a
// transpose, done 8x8 in registers for full blocks and element-wise at the edges.
void PackTransposedPanel(const float* w, int64_t K, int64_t N, int64_t n0, float* out) {
  const int64_t width = std::min(kNr, N - n0);
  int64_t k = 0;
  if (width == kNr) {
    for (; k + 8 <= K; k += 8) {
      for (int half = 0; half < 2; ++half) {
        __m256 r[8];
        for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(w + (n0 + half * 8 + i) * K + k);
        Transpose8x8(r);
        for (int i = 0; i < 8; ++i) _mm256_store_ps(out + (k + i) * kNr + half * 8, r[i]);
      }
    }
  }
  for (; k < K; ++k) {
    float* dst = out + k * kNr;
    for (int64_t j = 0; j < width; ++j) dst[j] = w[(n0 + j) * K + k];
    for (int64_t j = width; j < kNr; ++j) dst[j] = 0.0f;
  }
}

}  // namespace

void PackWeightPanels(const float* w, bool trans_b, int64_t K, int64_t N, int64_t panel_begin, int64_t panel_end,
                      float* packed) {
  for (int64_t p = panel_begin; p < panel_end; ++p) {
    float* out = packed + p * K * kNr;
    const int64_t n0 = p * kNr;
    if (trans_b) {
      PackTransposedPanel(w, K, N, n0, out);
      continue;
    }
    // W [K, N]: each panel row is a contiguous run of W's row k.
    const int64_t width = std::min(kNr, N - n0);
    for (int64_t k = 0; k < K; ++k) {
      float* dst = out + k * kNr;
      std::memcpy(dst, w + k * N + n0, sizeof(float) * width);
      if (width < kNr) std::memset(dst + width, 0, sizeof(float) * (kNr - width));
    }
  }
}

void FusedGemmTile(const FusedTile& t) {
  switch (t.act) {
    case Activation::kGeluErf: return Tile<Activation::kGeluErf>(t);
    case Activation::kGeluTanh: return Tile<Activation::kGeluTanh>(t);
    case Activation::kSigmoid: return Tile<Activation::kSigmoid>(t);
  }
}

}  // namespace onnxfuse::cpu
