// What every provider's FusedLinearGelu kernel shares: reading the node's attributes, validating the
// inputs' shapes and types, and turning exceptions into ORT statuses at the API boundary.
//
// Provider-neutral on purpose: no BLAS, no CUDA. A kernel calls ReadAttributes() once when it is
// created and ValidateShapes()/ValidateTypes() on every Compute; both throw Ort::Exception with
// ORT_INVALID_ARGUMENT and a message that names the node's input, which GuardStatus() returns to ORT
// as an error status (never an abort).
#pragma once

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include <onnxruntime_cxx_api.h>

#include "activation.h"
#include "status.h"

namespace onnxfuse {

struct FusedLinearGeluAttributes {
  Activation activation = Activation::kGeluErf;
  float alpha = 1.702f;  // sigmoid form only: x·σ(alpha·x)
  bool trans_b = true;   // true: W is [N, K]; false: W is [K, N]
};

// Which CUDA path a call takes (src/cuda/dispatch/path_choice.h): the one-kernel GEMM+bias+activation,
// cuBLASLt's GEMM with its bias epilogue followed by the activation in place, or the few-rows kernel
// (src/cuda/kernels/gemv_gelu.h) for calls with at most kGemvMaxRows rows.
enum class CudaPath : int { kAuto = 0, kFused = 1, kFallback = 2, kGemv = 3 };

// The "gemv" path's row limit, part of the attribute contract below (the CUDA side asserts it is its own).
inline constexpr int64_t kGemvMaxRows = 16;

// The node's optional path attributes (the contract both the CUDA kernel and `onnxfuse tune` follow):
//   cuda_path       "auto" (default) | "fused" | "fallback" | "gemv": the last three force that path ("gemv"
//                   fails a call with more than kGemvMaxRows rows);
//   tuned_device    the device signature the table below was measured on ("" = no table);
//   tuned_max_rows  ascending row bounds (> 0), and
//   tuned_paths     one "fused"|"fallback"|"gemv" per bound: a call with M rows takes the path of the first
//                   bound M <= tuned_max_rows[i], and the last path beyond the last bound. "gemv" only where
//                   its entry covers at most kGemvMaxRows rows: a bound <= kGemvMaxRows, never the last entry.
// The CPU kernel never reads them (it has one path).
struct CudaPathAttributes {
  CudaPath path = CudaPath::kAuto;
  std::string tuned_device;
  std::vector<int64_t> tuned_max_rows;
  std::vector<CudaPath> tuned_paths;  // kFused, kFallback or kGemv, one per bound
};

// X [..., K] · W(ᵀ) → Y [..., N], seen as one [M, K] x [K, N] GEMM (M = product of X's leading dims).
struct LinearShape {
  int64_t M = 0, K = 0, N = 0;
  std::vector<int64_t> y_shape;
};

// Reads `approximate` (none | tanh | sigmoid), `alpha` and `transB`; absent attributes take the
// schema's defaults. Throws Ort::Exception(ORT_INVALID_ARGUMENT) on an unknown value.
FusedLinearGeluAttributes ReadAttributes(const OrtKernelInfo* info);

// Reads cuda_path, tuned_device, tuned_max_rows and tuned_paths; absent attributes take the defaults above.
// Throws Ort::Exception(ORT_INVALID_ARGUMENT) on an unknown path name or a malformed table (lengths differ,
// bounds not strictly ascending or not positive, "gemv" where it would cover more than kGemvMaxRows rows,
// tuned_device set without a table).
CudaPathAttributes ReadCudaPathAttributes(const OrtKernelInfo* info);
const char* CudaPathName(CudaPath path);

// Parses the `approximate` string: the one place that maps names to Activation values.
Activation ParseApproximate(const std::string& name);
const char* ActivationName(Activation act);

// Checks X rank >= 2, W rank 2, matching K, B [N] when present, and no negative dims.
// `b_shape` is nullptr when the optional bias is absent.
LinearShape ValidateShapes(const std::vector<int64_t>& x_shape, const std::vector<int64_t>& w_shape,
                           const std::vector<int64_t>* b_shape, bool trans_b);

// All inputs share one element type, and it is float32, float16 or bfloat16.
// `b_type` is ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED when the bias is absent.
void ValidateTypes(ONNXTensorElementDataType x_type, ONNXTensorElementDataType w_type,
                   ONNXTensorElementDataType b_type);

std::string ShapeToString(const std::vector<int64_t>& shape);

// One call's inputs, validated, and its output allocated: the first step of every provider's Compute.
struct BoundCall {
  Ort::ConstValue x, w, b;  // b holds nullptr when the optional bias is absent
  LinearShape shape;
  Ort::UnownedValue y;
};

// Reads X, W and the optional B from `ctx`, checks their types and shapes (ValidateTypes/ValidateShapes)
// and allocates Y [..., N]. Throws Ort::Exception(ORT_INVALID_ARGUMENT) on bad input.
BoundCall BindCall(Ort::KernelContext& ctx, bool trans_b);

// Runs `fn` and converts whatever it throws into an OrtStatus* for ORT (status.h), prefixed "FusedLinearGelu".
template <typename Fn>
OrtStatus* GuardStatus(Fn&& fn) noexcept {
  return GuardOpStatus("FusedLinearGelu", std::forward<Fn>(fn));
}

}  // namespace onnxfuse
