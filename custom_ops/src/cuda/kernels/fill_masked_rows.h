// The CUDA kernel of FillMaskedRows (src/contract/fill_masked_rows_common.h): memory-bound, one warp per row.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace onnxfuse::cuda {

// Y [B, S, D] = X, with each row none of whose K flags row_kept[b, S|1, 0..K) is set holding `fill_bits`
// (an element of `element_bytes` = 2 or 4 bytes). When y == x only the filled rows are written; a kept
// row's warp reads its flags and moves on. One kernel on `stream`, never synchronizes, nothing for an
// empty X.
struct MaskedRows {
  void* y;
  const void* x;
  const bool* row_kept;
  int64_t batch, rows, flag_rows, flags_per_row, width, element_bytes;
  uint32_t fill_bits;
};
cudaError_t launch_fill_masked_rows(const MaskedRows& call, cudaStream_t stream);

}  // namespace onnxfuse::cuda
