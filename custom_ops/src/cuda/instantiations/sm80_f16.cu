// Portable sm_80+ GEMM+bias+GELU for float16, both layouts of W.
#include "cuda/kernels/sm80_gemm_gelu.cuh"

ONNXFUSE_SM80_TACTIC(kFloat16, true, kTensorOp)
ONNXFUSE_SM80_TACTIC(kFloat16, false, kTensorOp)
