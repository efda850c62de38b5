// The one place the CPU kernel touches the BLAS: single-threaded fp32 GEMM on one output tile.
// Parallelism comes from running many tiles at once on ORT's intra-op thread pool, so the BLAS is kept
// to one thread (ConfigureBlasThreading) and never competes with ORT's threads for the cores.
#pragma once

#include <cstdint>

namespace onnxfuse::cpu {

// C[m, n] (row stride ldc) = A[m, k] (row stride lda) · op(B), where op(B) = Bᵀ with B [n, k] (row
// stride ldb) when trans_b, else B [k, n]. C is overwritten. k == 0 gives C = 0.
void SgemmTile(bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
               int64_t ldb, float* c, int64_t ldc);

// Keeps the BLAS single-threaded (called once, when the library registers its ops).
void ConfigureBlasThreading();

}  // namespace onnxfuse::cpu
