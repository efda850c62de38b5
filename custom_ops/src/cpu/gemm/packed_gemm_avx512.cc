// The AVX-512F instantiation of the packed GEMM (packed_gemm_kernel.h): four 16-column panels per
// step, 24 zmm accumulators. Compiled with -mavx512f; runs only where CpuIsa() chose it.
#include "cpu/gemm/packed_gemm.h"
#include "cpu/gemm/packed_gemm_kernel.h"
#include "cpu/simd/simd_avx512.h"

namespace onnxfuse::cpu {

// K slices of 256, as on AVX2: a sliver's A (6 KiB) stays in L1 while four panels at a time stream past it.
void FusedGemmTileAvx512(const FusedTile& t) { gemm_kernel::FusedTileFor<simd::Avx512, 4, 256>(t); }

}  // namespace onnxfuse::cpu
