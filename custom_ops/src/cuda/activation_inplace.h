// The second kernel of the fallback path: the node's activation applied in place over Y [M, N], after
// cuBLASLt wrote Y = X·W(ᵀ) + B (cublaslt_gemm_bias.h).
#pragma once

#include <cuda_runtime.h>

#include "gemm_gelu.h"

namespace onnxfuse::cuda {

// Enqueues one elementwise kernel on `stream` that replaces each of the M·N elements of args.y (args.dtype)
// by args.act of it (args.alpha for the sigmoid form). Any element-aligned args.y. Never synchronizes;
// enqueues nothing for an empty Y.
cudaError_t launch_activation_inplace(const GemmGeluArgs& args, const DeviceInfo& dev, cudaStream_t stream);

}  // namespace onnxfuse::cuda
