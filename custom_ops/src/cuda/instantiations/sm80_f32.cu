// Portable sm_80+ GEMM+bias+GELU for float32, both layouts of W: TF32 Tensor Cores (the default, as ORT's
// MatMul) and 3xTF32 for strict fp32 (allow_tf32 = false).
#include "cuda/kernels/sm80_gemm_gelu.cuh"

ONNXFUSE_SM80_TACTIC(kFloat32, true, kTensorOp)
ONNXFUSE_SM80_TACTIC(kFloat32, false, kTensorOp)
ONNXFUSE_SM80_TACTIC(kFloat32, true, kFastF32)
ONNXFUSE_SM80_TACTIC(kFloat32, false, kFastF32)
