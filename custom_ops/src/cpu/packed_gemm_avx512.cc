// The AVX-512F instantiation of the packed GEMM (packed_gemm_kernel.h): four 16-column panels per
// step, 24 zmm accumulators. Compiled with -mavx512f; runs only where CpuIsa() chose it.
#include "packed_gemm.h"
#include "packed_gemm_kernel.h"
#include "simd_avx512.h"

namespace onnxfuse::cpu {

// Four 16 x 128 panel slices are 32 KiB, within a 48 KiB L1d with room for the A slivers.
void FusedGemmTileAvx512(const FusedTile& t) { gemm_kernel::FusedTileFor<simd::Avx512, 4, 128>(t); }

}  // namespace onnxfuse::cpu
