#include "cpu/gemm/gemm.h"

#include <cstring>
#include <mutex>

#include <cblas.h>  // OpenBLAS from PyPI's scipy-openblas32: symbols carry the scipy_ prefix

namespace onnxfuse::cpu {

void SgemmTile(bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
               int64_t ldb, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // BLAS would demand lda >= 1 and treat the empty product inconsistently: do it here.
    for (int64_t r = 0; r < m; ++r) std::memset(c + r * ldc, 0, sizeof(float) * n);
    return;
  }
  scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
                    static_cast<blasint>(n), static_cast<blasint>(k), 1.0f, a, static_cast<blasint>(lda), b,
                    static_cast<blasint>(ldb), 0.0f, c, static_cast<blasint>(ldc));
}

void ConfigureBlasThreading() {
  static std::once_flag once;
  std::call_once(once, [] { scipy_openblas_set_num_threads(1); });
}

}  // namespace onnxfuse::cpu
