// float <-> the kernels' element types (float, __half, __nv_bfloat16), rounding to nearest even: one spelling
// for every elementwise kernel and epilogue written without CUTLASS's converters.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace onnxfuse::cuda {

template <class T>
__device__ __forceinline__ float to_float(T v) { return static_cast<float>(v); }
template <>
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
template <>
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }

}  // namespace onnxfuse::cuda
