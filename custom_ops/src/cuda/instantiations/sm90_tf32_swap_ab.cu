// sm90 GEMM+bias+GELU tactics for float32 (TF32 Tensor Cores) with few rows, the operands swapped
// (sm90_swap_ab.cuh): W [N, K] only.
#include "cuda/kernels/sm90_swap_ab.cuh"

#define INSTANTIATE(name, TW, TX, TK, SCHED) \
  ONNXFUSE_SM90_SWAP_TACTIC(onnxfuse::cuda::DType::kFloat32, TW, TX, TK, SCHED)
ONNXFUSE_SM90_SWAP_TILES_TF32(INSTANTIATE)
