// The AVX2+FMA instantiation of the packed GEMM (packed_gemm_kernel.h), and the weight packing both
// ISAs share. Compiled with -mavx2 -mfma -mf16c; runs only where CpuIsa() chose it.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "cpu/gemm/packed_gemm.h"
#include "cpu/gemm/packed_gemm_kernel.h"
#include "cpu/simd/simd_avx2.h"

namespace onnxfuse::cpu {
namespace {

constexpr int64_t kNr = kPanelWidth;
// K slices of 256 (MLAS's slice too): a sliver's A is 6 KiB of a 32 KiB L1d, a 128-column tile's panel
// slices 128 KiB of a 512 KiB L2. Against 128-deep slices of 512-column tiles: half the C reloads, and tiles
// that leave L2 room for the C block. Each slice is summed from zero and added to C once, as MLAS does.
constexpr int64_t kKc = 256;

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

void FusedGemmTileAvx2(const FusedTile& t) { gemm_kernel::FusedTileFor<simd::Avx2, 1, kKc>(t); }

}  // namespace onnxfuse::cpu
