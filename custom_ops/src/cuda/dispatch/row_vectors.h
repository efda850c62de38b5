// Operands whose rows are 16-byte vectors (K and N multiples of 8 elements of 16 bits or 4 of float32, every
// operand at a 16-byte address): what the fused path's Tensor-Core kernels read and write, and what cuBLAS reads
// fastest. Other rows are staged through aligned copies padded to `vector` columns (RunFusedStaged,
// RunFallbackStaged in cuda/ops/fused_linear_gelu_cuda_paths.cc). The path choice (path_choice.h) and the staging
// ask these same questions, so they always agree on which operands need a copy.
#pragma once

#include <cstdint>

#include "cuda/dispatch/gemm_gelu.h"

namespace onnxfuse::cuda {

inline bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

inline int64_t ElementBytes(DType d) { return d == DType::kFloat32 ? 4 : 2; }
inline int64_t VectorElements(DType d) { return 16 / ElementBytes(d); }
inline int64_t RoundUpToVector(int64_t n, int64_t vector) { return (n + vector - 1) / vector * vector; }
inline bool RowsAreVectors(const void* p, int64_t cols, int64_t vector) {
  return Aligned16(p) && cols % vector == 0;
}
// A [rows, cols] operand the aligned kernels can read as it is on the padded problem: rows of 16-byte vectors
// and no rows to add (rows_pad, what the padded problem reads of them). The constructor and each call stage
// by this one test, so a constant staged once is the copy a call would have made.
inline bool ReadAsIs(const void* p, int64_t rows, int64_t cols, int64_t rows_pad, int64_t vector) {
  return RowsAreVectors(p, cols, vector) && rows == rows_pad;
}
inline bool RowsAreVectors(const GemmGeluArgs& a) {
  const int64_t v = VectorElements(a.dtype);
  return RowsAreVectors(a.x, a.K, v) && RowsAreVectors(a.w, a.trans_b ? a.K : a.N, v) && RowsAreVectors(a.y, a.N, v) &&
         (a.bias == nullptr || RowsAreVectors(a.bias, a.N, v));
}

}  // namespace onnxfuse::cuda
