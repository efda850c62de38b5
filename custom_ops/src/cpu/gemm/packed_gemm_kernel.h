// The packed GEMM with the fused epilogue, written once over a SIMD traits type S (simd_avx2.h,
// simd_avx512.h) and instantiated in each ISA's translation unit (packed_gemm_avx2.cc,
// packed_gemm_avx512.cc) with that ISA's blocking. See packed_gemm.h for the weight layout.
//
// Blocking, for one core's caches:
//   - per kKc-deep slice of K, the tile's packed panel slices (tile width x kKc floats) stay in L2 while
//     every 6-row sliver of the tile runs against them;
//   - one sliver's A (6 x kKc floats, read in place from row-major X) stays in L1 while the panel slices
//     stream past it (the order MLAS uses too). The other order, a panel slice in L1 and the slivers
//     streaming past it, was slower on one core at M = 128-1024 (AMD EPYC, AVX2): six A rows a sliver
//     re-read from L2 for every panel;
//   - the micro-kernel keeps a 6 x (16·kPanels) block of C in registers: per k, 16·kPanels/width loads
//     of W, 6 broadcasts of A and 6·16·kPanels/width FMAs. During its last steps it prefetches the start
//     of the panel slice the next call reads, so a new stream does not begin with an L2 miss;
//   - after the last K slice, the micro-kernel adds the bias to its registers and stores the block; once
//     the sliver has run against every panel, the activation runs over the sliver's rows (6 x the tile's
//     width: 3 KiB for the op's 128-column tiles, still in L1), four vectors in lockstep (activation_simd.h). Applied to the twelve
//     accumulators one at a time, the erf-GELU's dependency chains left the core idle for a larger share
//     of the tile's time. The pre-activation only ever lives in the output block it turns into, while that
//     block is in L1.
//   AVX2: kPanels 1 (12 ymm accumulators); AVX-512: kPanels 4 (24 zmm accumulators), so both are
//   FMA-bound rather than load-bound.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "cpu/simd/activation_simd.h"
#include "cpu/gemm/packed_gemm.h"

namespace onnxfuse::cpu::gemm_kernel {

constexpr int64_t kMr = 6;
constexpr int64_t kNr = kPanelWidth;
constexpr int64_t kPrefetchDistance = 16;

// C[kRows x 16·kPanels] (row stride ldc) (+)= A[kRows x kc] (row stride lda) · kPanels panel slices
// (b, b + panel_stride, ...), plus the bias when last. A is read in place: each k broadcasts one element
// of each of the kRows rows (kRows sequential streams the hardware prefetcher follows). `prefetch` fetches
// this call's own panel slices ahead (the first sliver brings them from L3/memory); `next_b`, when not
// null, is the panel slice the next call starts on: its first lines are fetched during the last steps.
template <class S, int kRows, int kPanels, bool kLast>
inline void MicroKernel(int64_t kc, const float* a, int64_t lda, const float* b, int64_t panel_stride, float* c,
                        int64_t ldc, bool accumulate, bool prefetch, const float* next_b, const float* bias) {
  using V = typename S::V;
  constexpr int kPerPanel = kNr / S::kWidth;
  constexpr int kCols = kPanels * kPerPanel;  // vectors per row
  V acc[kRows][kCols];
  auto step = [&](int64_t k, bool prefetch_own, const float* prefetch_next) __attribute__((always_inline)) {
    if (prefetch_next != nullptr) _mm_prefetch(reinterpret_cast<const char*>(prefetch_next), _MM_HINT_T0);
    V bv[kCols];
#pragma GCC unroll 4
    for (int p = 0; p < kPanels; ++p) {
      const float* bk = b + p * panel_stride + k * kNr;
      if (prefetch_own) _mm_prefetch(reinterpret_cast<const char*>(bk + kPrefetchDistance * kNr), _MM_HINT_T0);
#pragma GCC unroll 2
      for (int v = 0; v < kPerPanel; ++v) bv[p * kPerPanel + v] = S::load(bk + v * S::kWidth);
    }
#pragma GCC unroll 6
    for (int r = 0; r < kRows; ++r) {
      const V av = S::set1(a[r * lda + k]);
#pragma GCC unroll 4
      for (int v = 0; v < kCols; ++v) acc[r][v] = S::fmadd(av, bv[v], acc[r][v]);
    }
  };
  // Each K slice sums from zero and is added to C's running total once at the end (blocked summation, as
  // in ORT's own MLAS): the rounding error grows with the slice depth, not with all of K.
#pragma GCC unroll 6
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < kCols; ++v) acc[r][v] = S::zero();
  }
  // Straight loops, so no step carries a branch: own-slice prefetch or none, then a tail whose steps
  // fetch one line each of the next call's first slice.
  const int64_t tail_begin = next_b != nullptr ? std::max<int64_t>(0, kc - kPrefetchDistance) : kc;
  if (prefetch) {
#pragma GCC unroll 2
    for (int64_t k = 0; k < tail_begin; ++k) step(k, true, nullptr);
  } else {
#pragma GCC unroll 2
    for (int64_t k = 0; k < tail_begin; ++k) step(k, false, nullptr);
  }
#pragma GCC unroll 2
  for (int64_t k = tail_begin; k < kc; ++k) step(k, false, next_b + (k - tail_begin) * kNr);

  if (accumulate) {
#pragma GCC unroll 6
    for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 4
      for (int v = 0; v < kCols; ++v) acc[r][v] = S::add(S::load(c + r * ldc + v * S::kWidth), acc[r][v]);
    }
  }
  if constexpr (kLast) {
    V bias_v[kCols];
#pragma GCC unroll 4
    for (int v = 0; v < kCols; ++v) bias_v[v] = bias ? S::load(bias + v * S::kWidth) : S::zero();
#pragma GCC unroll 6
    for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 4
      for (int v = 0; v < kCols; ++v) acc[r][v] = S::add(acc[r][v], bias_v[v]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < kCols; ++v) S::store(c + r * ldc + v * S::kWidth, acc[r][v]);
  }
}

template <class S, int kPanels>
inline void RunRows(int64_t rows, bool last, int64_t kc, const float* a, int64_t lda, const float* b,
                    int64_t panel_stride, float* c, int64_t ldc, bool accumulate, bool prefetch, const float* next_b,
                    const float* bias) {
#define ONNXFUSE_ROWS(R)                                                                                   \
  case R:                                                                                                  \
    if (last) {                                                                                            \
      return MicroKernel<S, R, kPanels, true>(kc, a, lda, b, panel_stride, c, ldc, accumulate, prefetch,   \
                                              next_b, bias);                                               \
    }                                                                                                      \
    return MicroKernel<S, R, kPanels, false>(kc, a, lda, b, panel_stride, c, ldc, accumulate, prefetch,    \
                                             next_b, bias);
  switch (rows) {
    ONNXFUSE_ROWS(6)
    ONNXFUSE_ROWS(5)
    ONNXFUSE_ROWS(4)
    ONNXFUSE_ROWS(3)
    ONNXFUSE_ROWS(2)
    default:
      ONNXFUSE_ROWS(1)
  }
#undef ONNXFUSE_ROWS
}

// The packed slice of the panel holding column col, for K rows [pc, pc + kc).
inline const float* PanelSlice(const FusedTile& t, int64_t col, int64_t pc) {
  return t.packed_w + (col / kNr) * t.K * kNr + pc * kNr;
}

// The tile's ragged last panel (fewer than 16 valid columns) for one sliver: the zero-padded panel computes
// 16 columns into a local block; only the valid ones are copied in and out.
template <class S, Activation kAct>
inline void RunRaggedPanel(const FusedTile& t, int64_t pc, int64_t kc, bool first, bool last, int64_t s, int64_t j) {
  const int64_t col = t.n0 + j;
  const int64_t width = t.n - j;
  const int64_t rows = std::min(kMr, t.m - s);
  alignas(64) float bias_pad[kNr] = {};
  if (t.bias != nullptr) std::memcpy(bias_pad, t.bias + col, sizeof(float) * width);
  float* c = t.c + s * t.ldc + j;
  alignas(64) float block[kMr * kNr] = {};
  if (!first) {
    for (int64_t r = 0; r < rows; ++r) std::memcpy(block + r * kNr, c + r * t.ldc, sizeof(float) * width);
  }
  RunRows<S, 1>(rows, last, kc, t.a + s * t.lda + pc, t.lda, PanelSlice(t, col, pc), t.K * kNr, block, kNr, !first,
                s == 0, PanelSlice(t, t.n0, pc), t.bias ? bias_pad : nullptr);
  if (last) simd::ActivateBlock<S, kAct>(block, kNr, rows, kNr, t.alpha);
  for (int64_t r = 0; r < rows; ++r) std::memcpy(c + r * t.ldc, block + r * kNr, sizeof(float) * width);
}

// One 6-row sliver of the tile against every panel of one K slice; after the last slice, the activation
// over the sliver's finished rows. The first sliver brings each panel slice from memory, so it
// prefetches ahead along the panel.
template <class S, int kMaxPanels, Activation kAct>
inline void RunSliver(const FusedTile& t, int64_t pc, int64_t kc, bool first, bool last, int64_t s) {
  const int64_t rows = std::min(kMr, t.m - s);
  const float* a = t.a + s * t.lda + pc;
  float* c = t.c + s * t.ldc;
  const bool prefetch = s == 0;
  auto bias = [&](int64_t j) { return t.bias ? t.bias + t.n0 + j : nullptr; };
  // The slice a call that ends at column j hands over to: the next panel, or the tile's first one (where
  // the next sliver starts).
  auto next = [&](int64_t j) { return PanelSlice(t, t.n0 + (j < t.n ? j : 0), pc); };
  const int64_t full_cols = t.n / kNr * kNr;
  int64_t j = 0;
  for (; j + kMaxPanels * kNr <= full_cols; j += kMaxPanels * kNr) {
    RunRows<S, kMaxPanels>(rows, last, kc, a, t.lda, PanelSlice(t, t.n0 + j, pc), t.K * kNr, c + j, t.ldc, !first,
                           prefetch, next(j + kMaxPanels * kNr), bias(j));
  }
  for (; j < full_cols; j += kNr) {
    RunRows<S, 1>(rows, last, kc, a, t.lda, PanelSlice(t, t.n0 + j, pc), t.K * kNr, c + j, t.ldc, !first, prefetch,
                  next(j + kNr), bias(j));
  }
  if (last) simd::ActivateBlock<S, kAct>(c, t.ldc, rows, full_cols, t.alpha);
  if (j < t.n) RunRaggedPanel<S, kAct>(t, pc, kc, first, last, s, j);
}

template <class S, int kMaxPanels, int64_t kKc, Activation kAct>
void Tile(const FusedTile& t) {
  for (int64_t pc = 0; pc < t.K; pc += kKc) {
    const int64_t kc = std::min(kKc, t.K - pc);
    const bool first = pc == 0;
    const bool last = pc + kc >= t.K;
    for (int64_t s = 0; s < t.m; s += kMr) RunSliver<S, kMaxPanels, kAct>(t, pc, kc, first, last, s);
  }
}

template <class S, int kMaxPanels, int64_t kKc>
void FusedTileFor(const FusedTile& t) {
  switch (t.act) {
    case Activation::kGeluErf: return Tile<S, kMaxPanels, kKc, Activation::kGeluErf>(t);
    case Activation::kGeluTanh: return Tile<S, kMaxPanels, kKc, Activation::kGeluTanh>(t);
    case Activation::kSigmoid: return Tile<S, kMaxPanels, kKc, Activation::kSigmoid>(t);
  }
}

}  // namespace onnxfuse::cpu::gemm_kernel
