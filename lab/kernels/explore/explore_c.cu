// Exploration tiles, group C (tiles.h), float16, trans_b = 1.
#include "sm90_gemm_gelu.cuh"
#include "tiles.h"

#define INSTANTIATE(name, TM, TN, TK, CM, CN, SCHED, EM, EN) \
  ONNXFUSE_SM90_TACTIC(onnxfuse::cuda::DType::kFloat16, true, TM, TN, TK, CM, CN, SCHED, EM, EN)
OFK_EXPLORE_TILES_C(INSTANTIATE)
