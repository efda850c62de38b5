// The CUDA kernel of MaskedSkipLayerNormalization (src/contract/masked_skip_layer_norm_common.h): memory-bound, one
// warp per row.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "cuda/dispatch/gemm_gelu.h"  // DType

namespace onnxfuse::cuda {

// The widest row the register kernel holds: 16 vectors of 16 bytes a lane (4096 float16/bfloat16 or 2048
// float32 elements). Wider rows, and rows that are not 16-byte vectors, run a kernel that reads the row three
// times. onnxfuse/patterns/guard_into_skip_norm.py folds a guard only into rows within this reach.
inline constexpr int64_t kMaskedSkipNormMaxRowBytes = 8192;

// Y [B, S, D] = LayerNorm((row kept ? input : 0) + skip + bias) · gamma + beta over D, statistics in float32;
// sum (if not null) = the sum before normalizing, in the tensor type. skip is [B, S, D] (skip_per_batch) or
// [S, D]; beta and bias may be null. One kernel on `stream`, never synchronizes, nothing for no rows.
struct MaskedSkipNorm {
  void* y;
  void* sum;
  const void* input;
  const void* skip;
  const bool* row_kept;
  const void* gamma;
  const void* beta;
  const void* bias;
  int64_t batch, rows, flag_rows, flags_per_row, width;
  bool skip_per_batch;
  float epsilon;
  DType dtype;
};
cudaError_t launch_masked_skip_layer_norm(const MaskedSkipNorm& call, cudaStream_t stream);

}  // namespace onnxfuse::cuda
