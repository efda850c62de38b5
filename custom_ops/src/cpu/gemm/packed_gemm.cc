// The choice of the AVX2 path (the packing and the GEMM itself are in packed_gemm_avx2.cc).
#include "cpu/gemm/packed_gemm.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "cpu/simd/vector_kernels.h"

namespace onnxfuse::cpu {

namespace {

GemmIsa ChooseIsa() {
  const VectorKernels* avx2 = Avx2VectorKernels();
  if (avx2 == nullptr || &CpuVectorKernels() != avx2) return GemmIsa::kNone;  // scalar forced or no AVX2
#if defined(ONNXFUSE_HAVE_AVX512_KERNELS)
  const char* forced = std::getenv("ONNXFUSE_CPU_ISA");
  const bool capped = forced != nullptr && std::strcmp(forced, "avx2") == 0;
  if (!capped && __builtin_cpu_supports("avx512f")) return GemmIsa::kAvx512;
#endif
  return GemmIsa::kAvx2;
}

}  // namespace

GemmIsa PackedGemmIsa() {
  static const GemmIsa isa = ChooseIsa();
  return isa;
}

const char* GemmIsaName(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::kAvx512: return "avx512";
    case GemmIsa::kAvx2: return "avx2";
    case GemmIsa::kNone: break;
  }
  return "blas";
}

void FusedGemmTile(const FusedTile& tile) {
  if (PackedGemmIsa() == GemmIsa::kAvx512) return FusedGemmTileAvx512(tile);
  FusedGemmTileAvx2(tile);
}

#if !defined(ONNXFUSE_HAVE_AVX2_KERNELS)
void PackWeightPanels(const float*, bool, int64_t, int64_t, int64_t, int64_t, float*) {
  throw std::logic_error("the packed GEMM is not part of this build");
}
void FusedGemmTileAvx2(const FusedTile&) { throw std::logic_error("the AVX2 GEMM is not part of this build"); }
#endif
#if !defined(ONNXFUSE_HAVE_AVX512_KERNELS)
void FusedGemmTileAvx512(const FusedTile&) { throw std::logic_error("the AVX-512 GEMM is not part of this build"); }
#endif

}  // namespace onnxfuse::cpu
