// The CUDA FusedLinearGelu kernel: what one node keeps, and the steps of a call. Two files implement it:
//   fused_linear_gelu_cuda.cc        the ORT side: the node's attributes, the session config and the device read
//                                    once; each call's tensors bound and its path chosen
//                                    (cuda/dispatch/path_choice.h); the op ORT registers;
//   fused_linear_gelu_cuda_paths.cc  each path run on ORT's compute stream, with its scratch (scratch.h) and
//                                    its aligned copies (staging.h).
//
// Thread safety: ORT may call Compute on one kernel instance from several threads at once (concurrent
// Session::Run). Everything the kernel keeps is written in its constructor and only read afterwards (the
// staged copies of a constant W and B included), except the fallback's algorithm cache, which guards itself
// (CublasLtGemmBias).
#pragma once

#include <memory>
#include <string>

#include <cuda_runtime.h>
#include <onnxruntime_cxx_api.h>

#include "contract/fused_linear_gelu_common.h"
#include "cuda/dispatch/cublaslt_gemm_bias.h"
#include "cuda/dispatch/gemm_gelu.h"
#include "cuda/kernels/copy_rows.h"
#include "cuda/ops/staging.h"

namespace onnxfuse {

class FusedLinearGeluCudaKernel {
 public:
  FusedLinearGeluCudaKernel(const OrtKernelInfo* info, ONNXTensorElementDataType type);
  FusedLinearGeluCudaKernel(const FusedLinearGeluCudaKernel&) = delete;
  FusedLinearGeluCudaKernel& operator=(const FusedLinearGeluCudaKernel&) = delete;

  OrtStatusPtr ComputeV2(OrtKernelContext* context) const {
    return GuardStatus([&] { Compute(context); });
  }

 private:
  // fused_linear_gelu_cuda.cc
  void Compute(OrtKernelContext* context) const;
  std::string Describe(const LinearShape& s) const;  // the call, for error messages

  // fused_linear_gelu_cuda_paths.cc: the three paths, each with the aligned copies it may need.
  void RunFused(Ort::KernelContext& ctx, const cuda::GemmGeluArgs& args, const LinearShape& s,
                cudaStream_t stream) const;
  void RunFusedStaged(Ort::KernelContext& ctx, const cuda::GemmGeluArgs& args, const LinearShape& s,
                      cudaStream_t stream) const;
  void RunFallback(Ort::KernelContext& ctx, cuda::GemmGeluArgs args, const LinearShape& s, cudaStream_t stream) const;
  void RunFallbackStaged(Ort::KernelContext& ctx, const cuda::GemmGeluArgs& args, const void* w_aligned,
                         const LinearShape& s, cudaStream_t stream) const;
  void RunGemv(const cuda::GemmGeluArgs& args, const LinearShape& s, cudaStream_t stream) const;
  void CopyRows(const cuda::RowCopy& c, cuda::DType dtype, const char* what, const LinearShape& s,
                cudaStream_t stream) const;
  cuda::CublasLtGemmBias::Plan PlanFallbackGemm(const cuda::GemmGeluArgs& args, bool fp32_product,
                                                const LinearShape& s) const;
  void RunFallbackGemm(const cuda::CublasLtGemmBias::Plan& plan, const cuda::GemmGeluArgs& args, void* d,
                       void* workspace, const LinearShape& s, cudaStream_t stream) const;
  void FailOnActivationError(cudaError_t e, const LinearShape& s) const;

  const ONNXTensorElementDataType type_;
  const FusedLinearGeluAttributes attrs_;
  const CudaPathAttributes path_attrs_;
  const bool strict_fp32_;
  Ort::Allocator allocator_{nullptr};  // the node's GPU allocator: the staged constants' memory
  StagedConstants staged_;             // declared after allocator_, so destroyed (and its copies freed) before it
  Ort::MemoryInfo gpu_memory_{nullptr};
  cuda::DeviceInfo dev_{};
  std::unique_ptr<cuda::CublasLtGemmBias> gemm_bias_;  // null when cuBLASLt is unavailable
  std::string fallback_unavailable_;                  // why, then
  bool table_applies_ = false;                        // tuned_device is this device's signature
};

}  // namespace onnxfuse
