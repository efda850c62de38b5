// How the CUDA FusedLinearGelu's ORT side reports a failure: an Ort::Exception with ORT's error code, which
// GuardStatus (contract/fused_linear_gelu_common.h) turns into the status ORT returns to its caller.
#pragma once

#include <string>

#include <cuda_runtime.h>
#include <onnxruntime_cxx_api.h>

namespace onnxfuse {

[[noreturn]] inline void Fail(OrtErrorCode code, const std::string& message) {
  throw Ort::Exception(std::string(message), code);
}

// "cudaErrorX (its description)": what a message says about a CUDA error.
inline std::string CudaErrorText(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")";
}

}  // namespace onnxfuse
