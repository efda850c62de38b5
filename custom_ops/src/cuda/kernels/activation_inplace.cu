// The second kernel of the fallback path: the activation in place over Y (cuBLASLt's GEMM + bias epilogue
// before it), or bias and activation from cuBLASLt's float32 product into Y.
//
// Memory-bound: it reads and writes Y once, so it moves 16 bytes per load and per store (8 fp16/bf16 or 4
// fp32 values) and walks Y with a grid-stride loop over a grid sized to the GPU rather than to Y. A Y whose
// base is not 16-byte aligned, or whose size is not a multiple of the vector, has a scalar head (up to the
// first aligned element) and a scalar tail.
//
// The math is the fused epilogue's (activation_math.cuh), with the same choice by output type (fp32 the
// libm-accurate forms, fp16/bf16 the fast ones), so both paths compute the same function of the same fp32
// pre-activation; here that pre-activation has been rounded to Y's type once, as in ORT's unfused graph.
#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/kernels/activation_inplace.h"
#include "cuda/kernels/activation_math.cuh"
#include "cuda/kernels/float_convert.cuh"
#include "cuda/dispatch/tactics.cuh"

namespace onnxfuse::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kVectorBytes = 16;
// Enough resident blocks to cover the memory latency (8 x 256 threads per SM); beyond that a grid only adds
// launch work.
constexpr int kBlocksPerSm = 8;

template <class T>
__device__ __forceinline__ void activate_one(T* p, const ActivationParams& act) {
  *p = from_float<T>(apply_activation<std::is_same_v<T, float>>(to_float(*p), act));
}

// y[0, head) and y[head + vectors·kPer, count) scalar; the vectors in between as 16-byte words.
template <class T>
__global__ void __launch_bounds__(kThreads) activation_inplace_kernel(T* __restrict__ y, int64_t count, int64_t head,
                                                                      int64_t vectors, ActivationParams act) {
  constexpr int kPer = kVectorBytes / static_cast<int>(sizeof(T));
  union Vector {
    uint4 bits;
    T v[kPer];
  };
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  uint4* body = reinterpret_cast<uint4*>(y + head);
  for (int64_t i = tid; i < vectors; i += stride) {
    Vector in;
    in.bits = body[i];
    float f[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) f[j] = to_float(in.v[j]);
    apply_activation<std::is_same_v<T, float>>(f, act);
    Vector out;
#pragma unroll
    for (int j = 0; j < kPer; ++j) out.v[j] = from_float<T>(f[j]);
    body[i] = out.bits;
  }
  // At most kPer - 1 elements on each side: the first threads take them.
  const int64_t tail_start = head + vectors * kPer;
  if (tid < head) activate_one(y + tid, act);
  if (tid < count - tail_start) activate_one(y + tail_start + tid, act);
}

template <class T>
cudaError_t launch(const GemmGeluArgs& a, const DeviceInfo& dev, cudaStream_t stream) {
  constexpr int64_t kPer = kVectorBytes / sizeof(T);
  T* y = static_cast<T*>(a.y);
  const int64_t count = a.M * a.N;
  // Elements before the first 16-byte boundary (an element-aligned base reaches one within kPer - 1).
  const uintptr_t misalign = reinterpret_cast<uintptr_t>(y) % kVectorBytes;
  int64_t head = misalign == 0 ? 0 : static_cast<int64_t>((kVectorBytes - misalign) / sizeof(T));
  if (head > count) head = count;
  const int64_t vectors = (count - head) / kPer;
  const int64_t work = vectors > kPer ? vectors : kPer;  // the scalar edges need kPer - 1 threads at most
  int64_t blocks = (work + kThreads - 1) / kThreads;
  const int64_t max_blocks = static_cast<int64_t>(dev.sm_count > 0 ? dev.sm_count : 1) * kBlocksPerSm;
  if (blocks > max_blocks) blocks = max_blocks;
  activation_inplace_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(y, count, head, vectors,
                                                                                     activation_params(a));
  return cudaGetLastError();
}

// Four consecutive elements per thread and step: one 16-byte load of the product, the bias of their columns
// (read through the read-only cache: N values shared by all M rows), one 8-byte store where Y allows it.
template <class T>
__global__ void __launch_bounds__(kThreads) bias_activation_from_fp32_kernel(const float* __restrict__ product,
                                                                              const T* __restrict__ bias,
                                                                              T* __restrict__ y, int64_t count,
                                                                              int64_t n_cols, bool y_vector_aligned,
                                                                              ActivationParams act) {
  const int64_t groups = count / 4;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t g = tid; g < groups; g += stride) {
    const float4 p = reinterpret_cast<const float4*>(product)[g];
    float f[4] = {p.x, p.y, p.z, p.w};
    if (bias != nullptr) {
      int64_t col = (g * 4) % n_cols;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        f[j] += to_float(__ldg(bias + col));
        col = col + 1 == n_cols ? 0 : col + 1;
      }
    }
    apply_activation<false>(f, act);
    union {
      uint2 bits;
      T v[4];
    } out;
#pragma unroll
    for (int j = 0; j < 4; ++j) out.v[j] = from_float<T>(f[j]);
    if (y_vector_aligned) {
      reinterpret_cast<uint2*>(y)[g] = out.bits;
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) y[g * 4 + j] = out.v[j];
    }
  }
  // The last count % 4 elements: the first threads take them.
  const int64_t i = groups * 4 + tid;
  if (i < count) {
    float v = product[i];
    if (bias != nullptr) v += to_float(bias[i % n_cols]);
    y[i] = from_float<T>(apply_activation<false>(v, act));
  }
}

// A product whose rows are not Y's (a float32 node staged through padded rows: product_pitch > N), or a float32
// Y: the grid's y dimension walks rows, its x dimension blocks of columns (as copy_rows.cu), so each warp access
// covers 32 adjacent columns of one row and no thread divides by N. Element loads and stores: the padded
// product's rows are 16-byte vectors, Y's (N off a multiple of 4) are not.
constexpr int kRowElements = 4;  // per thread, kThreads apart
constexpr int64_t kMaxGridRows = 65535;

template <class T>
__global__ void __launch_bounds__(kThreads) bias_activation_from_rows_kernel(const float* __restrict__ product,
                                                                              int64_t product_pitch,
                                                                              const T* __restrict__ bias,
                                                                              T* __restrict__ y, int64_t rows,
                                                                              int64_t n_cols, ActivationParams act) {
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kThreads * kRowElements + threadIdx.x;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
#pragma unroll
    for (int j = 0; j < kRowElements; ++j) {
      const int64_t col = col0 + j * kThreads;
      if (col >= n_cols) break;
      float v = product[r * product_pitch + col];
      if (bias != nullptr) v += to_float(__ldg(bias + col));
      y[r * n_cols + col] = from_float<T>(apply_activation<std::is_same_v<T, float>>(v, act));
    }
  }
}

template <class T>
cudaError_t launch_from_rows(const GemmGeluArgs& a, const float* product, int64_t product_pitch, cudaStream_t stream) {
  const int64_t per_block = int64_t{kThreads} * kRowElements;
  const dim3 grid(static_cast<unsigned>((a.N + per_block - 1) / per_block),
                  static_cast<unsigned>(a.M < kMaxGridRows ? a.M : kMaxGridRows));
  bias_activation_from_rows_kernel<T><<<grid, kThreads, 0, stream>>>(
      product, product_pitch, static_cast<const T*>(a.bias), static_cast<T*>(a.y), a.M, a.N, activation_params(a));
  return cudaGetLastError();
}

template <class T>
cudaError_t launch_from_fp32(const GemmGeluArgs& a, const float* product, const DeviceInfo& dev, cudaStream_t stream) {
  T* y = static_cast<T*>(a.y);
  const int64_t count = a.M * a.N;
  const int64_t work = count / 4 > 4 ? count / 4 : 4;  // the tail needs 3 threads at most
  int64_t blocks = (work + kThreads - 1) / kThreads;
  const int64_t max_blocks = static_cast<int64_t>(dev.sm_count > 0 ? dev.sm_count : 1) * kBlocksPerSm;
  if (blocks > max_blocks) blocks = max_blocks;
  const bool y_vector_aligned = reinterpret_cast<uintptr_t>(y) % (4 * sizeof(T)) == 0;
  bias_activation_from_fp32_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      product, static_cast<const T*>(a.bias), y, count, a.N, y_vector_aligned, activation_params(a));
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_bias_activation_from_fp32(const GemmGeluArgs& a, const float* product, int64_t product_pitch,
                                             const DeviceInfo& dev, cudaStream_t stream) {
  if (a.M < 0 || a.N < 0 || product_pitch < a.N) return cudaErrorInvalidValue;
  if (a.M == 0 || a.N == 0) return cudaSuccess;
  if (reinterpret_cast<uintptr_t>(product) % 16 != 0 || reinterpret_cast<uintptr_t>(a.y) % dtype_bytes(a.dtype) != 0 ||
      (a.bias != nullptr && reinterpret_cast<uintptr_t>(a.bias) % dtype_bytes(a.dtype) != 0)) {
    return cudaErrorMisalignedAddress;
  }
  const bool dense = product_pitch == a.N;
  switch (a.dtype) {
    case DType::kFloat16:
      return dense ? launch_from_fp32<__half>(a, product, dev, stream)
                   : launch_from_rows<__half>(a, product, product_pitch, stream);
    case DType::kBFloat16:
      return dense ? launch_from_fp32<__nv_bfloat16>(a, product, dev, stream)
                   : launch_from_rows<__nv_bfloat16>(a, product, product_pitch, stream);
    case DType::kFloat32: return launch_from_rows<float>(a, product, product_pitch, stream);
  }
  return cudaErrorNotSupported;
}

cudaError_t launch_activation_inplace(const GemmGeluArgs& a, const DeviceInfo& dev, cudaStream_t stream) {
  if (a.M < 0 || a.N < 0) return cudaErrorInvalidValue;
  if (a.M == 0 || a.N == 0) return cudaSuccess;
  if (reinterpret_cast<uintptr_t>(a.y) % dtype_bytes(a.dtype) != 0) return cudaErrorMisalignedAddress;
  switch (a.dtype) {
    case DType::kFloat16: return launch<__half>(a, dev, stream);
    case DType::kBFloat16: return launch<__nv_bfloat16>(a, dev, stream);
    case DType::kFloat32: return launch<float>(a, dev, stream);
  }
  return cudaErrorNotSupported;
}

}  // namespace onnxfuse::cuda
