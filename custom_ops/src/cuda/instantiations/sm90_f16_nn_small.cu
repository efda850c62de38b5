// sm90 GEMM+bias+GELU tactics for f16, trans_b = 0 (W [K, N]): the small tiles of tactics.cuh. One file per (dtype,
// layout, tile group) so the CUTLASS 3 instantiations compile in parallel.
#include "cuda/kernels/sm90_gemm_gelu.cuh"

#define INSTANTIATE(name, TM, TN, TK, CM, CN, SCHED, EM, EN) \
  ONNXFUSE_SM90_TACTIC(onnxfuse::cuda::DType::kFloat16, false, TM, TN, TK, CM, CN, SCHED, EM, EN)
ONNXFUSE_SM90_TILES_16BIT_SMALL(INSTANTIATE)
