// Weight packing (portable: it runs once per constant weight) and the choice of the AVX2 path.
#include "packed_gemm.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "vector_kernels.h"

namespace onnxfuse::cpu {

void PackWeightPanels(const float* w, bool trans_b, int64_t K, int64_t N, int64_t panel_begin, int64_t panel_end,
                      float* packed) {
  for (int64_t p = panel_begin; p < panel_end; ++p) {
    float* out = packed + p * K * kPanelWidth;
    const int64_t n0 = p * kPanelWidth;
    const int64_t width = std::min(kPanelWidth, N - n0);
    if (trans_b) {
      // W [N, K]: column j of op(W) is row n0+j of W, contiguous along K.
      if (width < kPanelWidth) std::memset(out, 0, sizeof(float) * K * kPanelWidth);
      for (int64_t j = 0; j < width; ++j) {
        const float* row = w + (n0 + j) * K;
        for (int64_t k = 0; k < K; ++k) out[k * kPanelWidth + j] = row[k];
      }
    } else {
      // W [K, N]: each panel row is a contiguous run of W's row k.
      for (int64_t k = 0; k < K; ++k) {
        float* dst = out + k * kPanelWidth;
        std::memcpy(dst, w + k * N + n0, sizeof(float) * width);
        if (width < kPanelWidth) std::memset(dst + width, 0, sizeof(float) * (kPanelWidth - width));
      }
    }
  }
}

bool PackedGemmAvailable() {
  const VectorKernels* avx2 = Avx2VectorKernels();
  return avx2 != nullptr && &CpuVectorKernels() == avx2;
}

#if !defined(ONNXFUSE_HAVE_AVX2_KERNELS)
void FusedGemmTile(const FusedTile&) { throw std::logic_error("the AVX2 GEMM is not part of this build"); }
#endif

}  // namespace onnxfuse::cpu
