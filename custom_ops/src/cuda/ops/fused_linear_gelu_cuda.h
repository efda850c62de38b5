// FusedLinearGelu for ONNX Runtime's CUDA execution provider: one kernel instance per element type
// (float32, float16, bfloat16), registered in the same custom-op domain as the CPU kernel.
//
// ops.cc calls RegisterCudaOps(domain) from RegisterCustomOps when the library is built with
// ONNXFUSE_WITH_CUDA (cmake/cuda.cmake). The ops registered here live for the whole process (static
// storage), as ORT requires of every OrtCustomOp added to a domain.
//
// Runtime behaviour, for users of the library:
// - the GEMM+bias+GELU runs as one kernel on ORT's compute stream (KernelContext::GetGPUComputeStream()),
//   never synchronizes, and allocates nothing per call except workspace from ORT's own GPU allocator;
// - float32 uses TF32 Tensor Cores by default where ORT's own MatMul does (K and N multiples of 4; other
//   shapes compute in full fp32, as cuBLAS does for them); the session config entry
//   `onnxfuse.strict_fp32` = "1" asks for full fp32 accuracy instead (read once when the session creates
//   the kernel):  so.add_session_config_entry("onnxfuse.strict_fp32", "1")
#pragma once

#include <onnxruntime_cxx_api.h>

namespace onnxfuse {

// Session config key that turns off TF32 for float32 nodes ("1": strict fp32, "0" or absent: TF32).
inline constexpr const char* kStrictFp32ConfigKey = "onnxfuse.strict_fp32";

// Adds the CUDA-provider FusedLinearGelu ops (one per element type) to `domain`.
void RegisterCudaOps(Ort::CustomOpDomain& domain);

}  // namespace onnxfuse
