// The CPU kernels' element types: the ORT type of each, and rows widened to float32 or narrowed back through
// the vector kernels (vector_kernels.h), the one way the kernels convert.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <onnxruntime_cxx_api.h>

#include "cpu/simd/vector_kernels.h"

namespace onnxfuse::cpu {

template <typename T>
constexpr ONNXTensorElementDataType kElementType =
    std::is_same_v<T, float>           ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT
    : std::is_same_v<T, Ort::Float16_t> ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16
                                        : ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;

// Widen n elements of T to float32.
template <typename T>
void ToFloat(const VectorKernels& vk, const T* in, float* out, size_t n) {
  if constexpr (std::is_same_v<T, float>) {
    std::copy(in, in + n, out);
  } else if constexpr (std::is_same_v<T, Ort::Float16_t>) {
    vk.half_to_float(reinterpret_cast<const uint16_t*>(in), out, n);
  } else {
    vk.bfloat16_to_float(reinterpret_cast<const uint16_t*>(in), out, n);
  }
}

// Narrow n float32 elements to T (round to nearest even).
template <typename T>
void FromFloat(const VectorKernels& vk, const float* in, T* out, size_t n) {
  if constexpr (std::is_same_v<T, float>) {
    std::copy(in, in + n, out);
  } else if constexpr (std::is_same_v<T, Ort::Float16_t>) {
    vk.float_to_half(in, reinterpret_cast<uint16_t*>(out), n);
  } else {
    vk.float_to_bfloat16(in, reinterpret_cast<uint16_t*>(out), n);
  }
}

}  // namespace onnxfuse::cpu
