// The choice of the AVX2 path (the packing and the GEMM itself are in packed_gemm_avx2.cc).
#include "packed_gemm.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "vector_kernels.h"

namespace onnxfuse::cpu {

bool PackedGemmAvailable() {
  const VectorKernels* avx2 = Avx2VectorKernels();
  return avx2 != nullptr && &CpuVectorKernels() == avx2;
}

#if !defined(ONNXFUSE_HAVE_AVX2_KERNELS)
void PackWeightPanels(const float*, bool, int64_t, int64_t, int64_t, int64_t, float*) {
  throw std::logic_error("the AVX2 GEMM is not part of this build");
}
void FusedGemmTile(const FusedTile&) { throw std::logic_error("the AVX2 GEMM is not part of this build"); }
#endif

}  // namespace onnxfuse::cpu
