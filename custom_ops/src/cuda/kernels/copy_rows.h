// Copies a matrix of 16-bit or 32-bit elements from one row pitch to another: what lets rows that are not
// 16-byte vectors reach the kernels that need them (cuda/ops/staging.h). 16-bit: the fused path's
// Tensor-Core kernels read and write rows through TMA or 16-byte vectors, so K or N off a multiple of 8 (or an
// operand at an odd offset) used to leave them only the any-alignment WMMA kernel, far slower than ORT there
// (RunFusedStaged; the staged path against the fallback and ORT: bench/results/cuda_kernel_unaligned_staged_h200.json).
// float32: cuBLAS reads a narrow, deep W of rows off a multiple of 4 floats slower than the same W padded
// (RunFallbackStaged; lab/results/staged_fp32_probe_h200.txt). Staged through copies padded to 16-byte rows,
// the same problem runs on the aligned kernels.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace onnxfuse::cuda {

// dst[r, c] = src[r, c] for r < src_rows and c < src_cols, and 0 elsewhere in dst's [dst_rows, dst_cols]:
// zero-filled pad columns and rows (their zeros add exact zeros to a GEMM's sums), or a narrower copy back.
// Row r of a matrix starts `pitch` elements after row r - 1. Any element-aligned pointers; one kernel on
// `stream`, never synchronizes, nothing for an empty dst.
struct RowCopy {
  void* dst;
  int64_t dst_pitch, dst_rows, dst_cols;
  const void* src;
  int64_t src_pitch, src_rows, src_cols;
};
// element_bytes: 2 or 4 (cudaErrorInvalidValue otherwise).
cudaError_t launch_copy_rows(const RowCopy& copy, int element_bytes, cudaStream_t stream);

}  // namespace onnxfuse::cuda
