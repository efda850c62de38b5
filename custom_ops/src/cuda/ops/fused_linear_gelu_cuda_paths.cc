// The CUDA FusedLinearGelu kernel's three paths (fused_linear_gelu_cuda_kernel.h), each run on the call's
// compute stream with the scratch it needs from ORT's allocator (scratch.h) and, for rows that are not 16-byte
// vectors, the aligned copies that make them readable by the fast kernels (staging.h). Which path a call takes
// is decided before (cuda/dispatch/path_choice.h).
#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include "cuda/dispatch/path_choice.h"
#include "cuda/dispatch/row_vectors.h"
#include "cuda/kernels/activation_inplace.h"
#include "cuda/kernels/copy_rows.h"
#include "cuda/kernels/gemv_gelu.h"
#include "cuda/ops/errors.h"
#include "cuda/ops/fused_linear_gelu_cuda_kernel.h"
#include "cuda/ops/scratch.h"
#include "cuda/ops/staging.h"

namespace onnxfuse {

// One kernel: launch_gemm_gelu's tactic, with the scratch it needs, if any (Workspace).
void FusedLinearGeluCudaKernel::RunFused(Ort::KernelContext& ctx, const cuda::GemmGeluArgs& args,
                                         const LinearShape& s, cudaStream_t stream) const {
  const cuda::GemmGeluPlan plan = cuda::plan_gemm_gelu(args, dev_);
  const size_t workspace_bytes = plan.workspace_bytes;
  Workspace workspace(ctx, *gpu_memory_, workspace_bytes);
  const cudaError_t e = cuda::launch_gemm_gelu(plan, args, dev_, workspace.data(), workspace_bytes, stream);
  if (e != cudaSuccess) {
    const std::string what = Describe(s);
    if (e == cudaErrorNotSupported) {
      Fail(ORT_NOT_IMPLEMENTED, "no CUDA kernel in this library can run " + what);
    }
    Fail(ORT_FAIL, std::string("CUDA kernel launch failed (tactic ") + cuda::gemm_gelu_tactic_name(args, dev_) +
                       ") for " + what + ": " + CudaErrorText(e));
  }
}

// 16-bit rows that are not 16-byte vectors, on the fused path's Tensor-Core kernels: each such operand is
// copied with its K and N padded to multiples of 8 (zeros: they add exact zeros to every sum, and the
// extra output columns are never read), the GEMM runs on the copies, and the product's rows are copied back
// into Y. A constant W and B were staged once in the constructor; X, Y, and a W or B that is a graph input
// are staged per call in scratch. Up to four kernels, the activation still inside the GEMM.
// float32 stays on the fallback for such shapes (BuiltInPath): there cuBLAS chooses TF32 or full fp32 per
// shape for ORT's MatMul, and the fallback asks it the same way (on padded copies too where that pays:
// RunFallbackStaged).
void FusedLinearGeluCudaKernel::RunFusedStaged(Ort::KernelContext& ctx, const cuda::GemmGeluArgs& args,
                                               const LinearShape& s, cudaStream_t stream) const {
  const int64_t v = cuda::VectorElements(args.dtype), bytes = cuda::ElementBytes(args.dtype);
  const int64_t k_pad = cuda::RoundUpToVector(args.K, v), n_pad = cuda::RoundUpToVector(args.N, v);
  const int64_t w_rows = args.trans_b ? args.N : args.K, w_cols = args.trans_b ? args.K : args.N;
  const int64_t w_rows_pad = args.trans_b ? n_pad : k_pad, w_cols_pad = args.trans_b ? k_pad : n_pad;
  const bool stage_x = !cuda::RowsAreVectors(args.x, args.K, v);
  const bool stage_y = !cuda::RowsAreVectors(args.y, args.N, v);
  // W as given or its copy from the constructor (AlignedWeight), else a copy now; the same for B.
  const void* w_aligned = staged_.AlignedWeight(args);
  const bool stage_w = w_aligned == nullptr;
  const bool b_ready = args.bias == nullptr || cuda::ReadAsIs(args.bias, 1, args.N, 1, v);
  const void* b_copy = staged_.Bias(args.bias);
  const bool b_staged = b_copy != nullptr;
  const bool stage_b = !b_ready && !b_staged;

  // One scratch block, 256-byte aligned parts: X, Y, W, B as this call stages them.
  auto part = [bytes](int64_t elements) { return static_cast<size_t>((elements * bytes + 255) / 256 * 256); };
  const size_t x_bytes = stage_x ? part(args.M * k_pad) : 0, y_bytes = stage_y ? part(args.M * n_pad) : 0;
  const size_t w_bytes = stage_w ? part(k_pad * n_pad) : 0, b_bytes = stage_b ? part(n_pad) : 0;
  Workspace staging(ctx, *gpu_memory_, x_bytes + y_bytes + w_bytes + b_bytes);
  char* next = static_cast<char*>(staging.data());
  auto take = [&next](size_t bytes) {
    void* p = bytes > 0 ? next : nullptr;
    next += bytes;
    return p;
  };
  void* x_pad = take(x_bytes);
  void* y_pad = take(y_bytes);
  void* w_pad = take(w_bytes);
  void* b_pad = take(b_bytes);

  cuda::GemmGeluArgs padded = args;
  padded.K = k_pad;
  padded.N = n_pad;
  if (stage_x) padded.x = x_pad;
  if (stage_y) padded.y = y_pad;
  padded.w = stage_w ? w_pad : w_aligned;
  if (!b_ready) padded.bias = b_staged ? b_copy : b_pad;
  auto copy = [&](const cuda::RowCopy& c, const char* what) { CopyRows(c, args.dtype, what, s, stream); };
  if (stage_x) copy(PaddedCopy(x_pad, args.x, args.M, args.K, args.M, k_pad), "X");
  if (stage_w) copy(PaddedCopy(w_pad, args.w, w_rows, w_cols, w_rows_pad, w_cols_pad), "W");
  if (stage_b) copy(PaddedCopy(b_pad, args.bias, 1, args.N, 1, n_pad), "B");
  RunFused(ctx, padded, s, stream);
  if (stage_y) copy({args.y, args.N, args.M, args.N, y_pad, n_pad, args.M, n_pad}, "Y");
}

void FusedLinearGeluCudaKernel::CopyRows(const cuda::RowCopy& c, cuda::DType dtype, const char* what,
                                         const LinearShape& s, cudaStream_t stream) const {
  const cudaError_t e = cuda::launch_copy_rows(c, static_cast<int>(cuda::ElementBytes(dtype)), stream);
  if (e != cudaSuccess) {
    Fail(ORT_FAIL, std::string("staging ") + what + " failed for " + Describe(s) + ": " + CudaErrorText(e));
  }
}

// Two kernels on `stream`. float32: cuBLASLt's GEMM with the bias epilogue into Y, then the activation over Y
// in place. fp16/bf16: cuBLASLt's GEMM into a float32 product (scratch), then bias, activation and the one
// rounding to Y's type in one kernel, in the fused kernel's order (rounding the pre-activation to 16 bits
// first, as ORT's unfused graph does, would add a rounding; each path's error against float64:
// bench/results/cuda_kernel_unaligned_staged_h200.json).
void FusedLinearGeluCudaKernel::RunFallback(Ort::KernelContext& ctx, cuda::GemmGeluArgs args, const LinearShape& s,
                                            cudaStream_t stream) const {
  if (gemm_bias_ == nullptr) {
    Fail(ORT_FAIL, std::string("cuda_path='fallback' needs cuBLASLt, which is unavailable: ") + fallback_unavailable_ +
                       " (onnxruntime's CUDA provider loads it; is this session's CUDA the library's major?)");
  }
  // TF32 exactly as ORT's MatMul gets it: its CUDA provider allows TF32 (use_tf32, on by default) and lets
  // cuBLAS choose per shape; this path asks the same library the same way. Where ORT's own error is TF32's (at
  // 770x3074 from two rows on: bench/results/cuda_kernel_never_slower_h200.md's grids), strict fp32 here only
  // lost time.
  if (args.dtype == cuda::DType::kFloat32) args.allow_tf32 = !strict_fp32_;
  if (cuda::StagedFallbackPays(args)) {
    const void* w_aligned = staged_.AlignedWeight(args);
    if (w_aligned != nullptr) {
      RunFallbackStaged(ctx, args, w_aligned, s, stream);
      return;
    }
  }
  const bool fp32_product = args.dtype != cuda::DType::kFloat32;
  const cuda::CublasLtGemmBias::Plan plan = PlanFallbackGemm(args, fp32_product, s);
  // One scratch block: the float32 product first (256-byte aligned, as the allocator's blocks), then
  // cuBLASLt's workspace.
  const size_t product_bytes = fp32_product ? ScratchPart(args.M * args.N * int64_t{4}) : 0;
  Workspace workspace(ctx, *gpu_memory_, product_bytes + plan.workspace_bytes);
  char* scratch = static_cast<char*>(workspace.data());
  void* d = fp32_product ? static_cast<void*>(scratch) : args.y;
  RunFallbackGemm(plan, args, d, scratch + product_bytes, s, stream);
  const cudaError_t e =
      fp32_product ? cuda::launch_bias_activation_from_fp32(args, static_cast<const float*>(d), args.N, dev_, stream)
                   : cuda::launch_activation_inplace(args, dev_, stream);
  FailOnActivationError(e, s);
}

// float32 on a large, narrow, deep W whose rows are not 16-byte vectors (StagedFallbackPays): the fallback's
// GEMM on the problem padded to multiples of 4 in K and N, where cuBLAS reads W at DRAM speed. X is copied
// into padded rows when its own are not vectors, W is `w_aligned` (the constructor's copy of a constant W, or
// W itself), the GEMM writes the padded product (no bias) to scratch, and one kernel adds B, applies the
// activation and writes Y's own rows: three kernels at most, where the plain fallback runs two.
void FusedLinearGeluCudaKernel::RunFallbackStaged(Ort::KernelContext& ctx, const cuda::GemmGeluArgs& args,
                                                  const void* w_aligned, const LinearShape& s,
                                                  cudaStream_t stream) const {
  const int64_t v = cuda::VectorElements(args.dtype);
  const int64_t k_pad = cuda::RoundUpToVector(args.K, v), n_pad = cuda::RoundUpToVector(args.N, v);
  const bool stage_x = !cuda::RowsAreVectors(args.x, args.K, v);
  // The padded product and X's copy first: cuBLASLt's choice depends on its operands' alignments, so the
  // plan is made for the pointers the GEMM will read and write; its workspace after.
  const size_t product_bytes = ScratchPart(args.M * n_pad * int64_t{4});
  const size_t x_bytes = stage_x ? ScratchPart(args.M * k_pad * int64_t{4}) : 0;
  Workspace staging(ctx, *gpu_memory_, product_bytes + x_bytes);
  char* scratch = static_cast<char*>(staging.data());
  cuda::GemmGeluArgs padded = args;
  padded.K = k_pad;
  padded.N = n_pad;
  padded.w = w_aligned;
  padded.bias = nullptr;  // added with the activation, from B as it is
  padded.y = scratch;
  if (stage_x) padded.x = scratch + product_bytes;
  const cuda::CublasLtGemmBias::Plan plan = PlanFallbackGemm(padded, /*fp32_product=*/false, s);
  Workspace lt_workspace(ctx, *gpu_memory_, plan.workspace_bytes);
  if (stage_x) {
    CopyRows(PaddedCopy(scratch + product_bytes, args.x, args.M, args.K, args.M, k_pad), args.dtype, "X", s, stream);
  }
  RunFallbackGemm(plan, padded, padded.y, lt_workspace.data(), s, stream);
  FailOnActivationError(
      cuda::launch_bias_activation_from_fp32(args, static_cast<const float*>(padded.y), n_pad, dev_, stream), s);
}

cuda::CublasLtGemmBias::Plan FusedLinearGeluCudaKernel::PlanFallbackGemm(const cuda::GemmGeluArgs& args,
                                                                        bool fp32_product,
                                                                        const LinearShape& s) const {
  std::string error;
  cuda::CublasLtGemmBias::Plan plan;
  if (!gemm_bias_->plan(args, fp32_product, &plan, &error)) {
    Fail(ORT_FAIL, std::string(cuda::kFallbackPathName) + " cannot run " + Describe(s) + ": " + error);
  }
  return plan;
}

void FusedLinearGeluCudaKernel::RunFallbackGemm(const cuda::CublasLtGemmBias::Plan& plan,
                                                const cuda::GemmGeluArgs& args, void* d, void* workspace,
                                                const LinearShape& s, cudaStream_t stream) const {
  std::string error;
  void* lt_workspace = plan.workspace_bytes > 0 ? workspace : nullptr;
  if (!gemm_bias_->run(plan, args, d, lt_workspace, plan.workspace_bytes, stream, &error)) {
    Fail(ORT_FAIL, std::string(cuda::kFallbackPathName) + " GEMM failed for " + Describe(s) + ": " + error);
  }
}

void FusedLinearGeluCudaKernel::FailOnActivationError(cudaError_t e, const LinearShape& s) const {
  if (e != cudaSuccess) {
    Fail(ORT_FAIL, std::string(cuda::kFallbackPathName) + " activation kernel launch failed for " + Describe(s) +
                       ": " + CudaErrorText(e));
  }
}

// One kernel; the table's contract keeps "auto" within its rows, a forced "gemv" may not be.
void FusedLinearGeluCudaKernel::RunGemv(const cuda::GemmGeluArgs& args, const LinearShape& s,
                                        cudaStream_t stream) const {
  if (args.M > cuda::kGemvMaxRows) {
    Fail(ORT_INVALID_ARGUMENT, "cuda_path='gemv' runs at most " + std::to_string(cuda::kGemvMaxRows) +
                                   " rows; this call has M=" + std::to_string(args.M) + " (" + Describe(s) + ")");
  }
  const cudaError_t e = cuda::launch_gemv_gelu(args, dev_, stream);
  if (e != cudaSuccess) {
    Fail(ORT_FAIL,
         std::string(cuda::kGemvPathName) + " kernel launch failed for " + Describe(s) + ": " + CudaErrorText(e));
  }
}

}  // namespace onnxfuse
