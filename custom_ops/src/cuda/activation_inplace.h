// The second kernel of the fallback path (cublaslt_gemm_bias.h wrote the GEMM): the node's activation over
// Y [M, N] in place (float32 nodes, Y = X·W(ᵀ) + B), or bias and activation from cuBLASLt's float32 product
// into Y (16-bit nodes).
#pragma once

#include <cuda_runtime.h>

#include "gemm_gelu.h"

namespace onnxfuse::cuda {

// Enqueues one elementwise kernel on `stream` that replaces each of the M·N elements of args.y (args.dtype)
// by args.act of it (args.alpha for the sigmoid form). Any element-aligned args.y. Never synchronizes;
// enqueues nothing for an empty Y.
cudaError_t launch_activation_inplace(const GemmGeluArgs& args, const DeviceInfo& dev, cudaStream_t stream);

// For 16-bit nodes: Y = act(product + B) from the float32 product X·W(ᵀ) [M, N] (cuBLASLt's fp32 output,
// 16-byte aligned) with args.bias ([N] in args.dtype, or none), rounded once to args.dtype into args.y: the
// fused kernel's order of operations, so the two paths' errors match. One kernel on `stream`, never
// synchronizes; nothing for an empty Y.
cudaError_t launch_bias_activation_from_fp32(const GemmGeluArgs& args, const float* product, const DeviceInfo& dev,
                                             cudaStream_t stream);

}  // namespace onnxfuse::cuda
