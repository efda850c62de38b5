// The "gemv" path of the CUDA FusedLinearGelu kernel: Y = act(X·W(ᵀ) + B) in one kernel for calls with at
// most kGemvMaxRows rows (batch-1 decoding, single requests, small batches of vectors).
//
// With so few rows the problem is bound by reading W once: a GEMM kernel's tiles (64-128 rows of X) are
// mostly empty, and cuBLAS(Lt) answers with its own GEMV-like kernels plus, in ORT's graph, a second kernel
// for the bias and activation. This kernel reads W with 16-byte vector loads spread over every SM, keeps the
// products of all rows in fp32 registers (exact fp32 FMAs on CUDA cores: no TF32 rounding of the inputs, and
// 16-bit inputs widened exactly), sums the K slices in registers and shared memory, and applies the bias and
// the activation before the one store of Y: the pre-activation never reaches memory.
// One exception to exact fp32 (gemv_uses_tf32): float32 with more rows than kGemvExactF32MaxRows of a W of at
// least kGemvTf32MinWeights, in a session that allows TF32, runs on TF32 Tensor Cores, as ORT's own MatMul does
// at those rows (its cuBLAS call is a TF32 GEMM from two rows on).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "cuda/dispatch/gemm_gelu.h"

namespace onnxfuse::cuda {

// The most rows one call may have (the accumulators of every row live in each thread's registers).
inline constexpr int64_t kGemvMaxRows = 16;
inline constexpr const char* kGemvPathName = "gemv_gelu";
// float32 rows the exact kernel keeps at any W, and the W size from which more rows go to Tensor Cores.
inline constexpr int64_t kGemvExactF32MaxRows = 4;
inline constexpr int64_t kGemvTf32MinWeights = int64_t{1} << 25;

// Enqueues exactly one kernel on `stream` (nothing for an empty Y); never synchronizes. Any K (0 gives
// Y = act(B)), N, transB and element-aligned pointers: 16-byte vector loads where W's rows (and, for transB,
// X's) allow them, element loads otherwise. Returns cudaErrorInvalidValue unless 1 <= M <= kGemvMaxRows.
cudaError_t launch_gemv_gelu(const GemmGeluArgs& args, const DeviceInfo& dev, cudaStream_t stream);

// Whether launch_gemv_gelu reads W (and, with transB, X) in 16-byte vectors for these arguments: rows of W (of
// X) a multiple of 16 bytes, pointers 16-byte aligned. Otherwise it reads elements, several times slower at
// long K (bench/results/cuda_kernel_gemv_h200.md), which the built-in path choice needs to know.
bool gemv_reads_vectors(const GemmGeluArgs& args);

// Whether launch_gemv_gelu runs these arguments on TF32 Tensor Cores (float32, TF32 allowed, transB = 1, vector
// reads, kGemvExactF32MaxRows < M <= kGemvMaxRows, K·N >= kGemvTf32MinWeights) rather than in exact fp32.
bool gemv_uses_tf32(const GemmGeluArgs& args);

}  // namespace onnxfuse::cuda
