// sm90 GEMM+bias+GELU tactics for float32 on TF32 Tensor Cores, trans_b = 1 (W [N, K]): TF32 GMMA reads
// K-major operands only; float32 with trans_b = 0 runs on the sm80 tactics.
#include "cuda/kernels/sm90_gemm_gelu.cuh"

#define INSTANTIATE(name, TM, TN, TK, CM, CN, SCHED, EM, EN) \
  ONNXFUSE_SM90_TACTIC(onnxfuse::cuda::DType::kFloat32, true, TM, TN, TK, CM, CN, SCHED, EM, EN)
ONNXFUSE_SM90_TILES_TF32(INSTANTIATE)
