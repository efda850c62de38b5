// Portable sm_80+ GEMM+bias+GELU for bfloat16, both layouts of W.
#include "cuda/kernels/sm80_gemm_gelu.cuh"

ONNXFUSE_SM80_TACTIC(kBFloat16, true, kTensorOp)
ONNXFUSE_SM80_TACTIC(kBFloat16, false, kTensorOp)
