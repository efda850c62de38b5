// The second kernel of the fallback path (cublaslt_gemm_bias.h wrote the GEMM): the node's activation over
// Y [M, N] in place (float32 nodes, Y = X·W(ᵀ) + B), or bias and activation from cuBLASLt's float32 product
// into Y (16-bit nodes, and float32 nodes run on padded copies).
#pragma once

#include <cuda_runtime.h>

#include "cuda/dispatch/gemm_gelu.h"

namespace onnxfuse::cuda {

// Enqueues one elementwise kernel on `stream` that replaces each of the M·N elements of args.y (args.dtype)
// by args.act of it (args.alpha for the sigmoid form). Any element-aligned args.y. Never synchronizes;
// enqueues nothing for an empty Y.
cudaError_t launch_activation_inplace(const GemmGeluArgs& args, const DeviceInfo& dev, cudaStream_t stream);

// Y = act(product + B) from the float32 product X·W(ᵀ) (cuBLASLt's output, 16-byte aligned, rows
// `product_pitch` floats apart, product_pitch >= N) with args.bias ([N] in args.dtype, or none), rounded once to
// args.dtype into args.y [M, N]. For 16-bit nodes (product_pitch N): the fused kernel's order of operations, so
// the two paths' errors match. For float32 nodes staged through padded rows (product_pitch > N): the copy
// back into Y in the same pass. One kernel on `stream`, never synchronizes; nothing for an empty Y.
cudaError_t launch_bias_activation_from_fp32(const GemmGeluArgs& args, const float* product, int64_t product_pitch,
                                             const DeviceInfo& dev, cudaStream_t stream);

}  // namespace onnxfuse::cuda
