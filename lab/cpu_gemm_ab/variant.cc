// One variant of the CPU tile kernel for the A/B library (build.sh compiles this file once per variant with
// -Donnxfuse=<unique namespace> so each variant's inline templates stay distinct, -DTILE_FN=<name>, -DKC=<K
// slice depth>, and -I the variant's source tree).
#include "cpu/gemm/packed_gemm.h"
#include "cpu/gemm/packed_gemm_kernel.h"
#include "cpu/simd/simd_avx2.h"

extern "C" void TILE_FN(const void* tile) {
  onnxfuse::cpu::gemm_kernel::FusedTileFor<onnxfuse::cpu::simd::Avx2, 1, KC>(
      *static_cast<const onnxfuse::cpu::FusedTile*>(tile));
}
