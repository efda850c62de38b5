// launch_masked_skip_layer_norm (masked_skip_layer_norm.h). A warp owns one row and holds it in registers as
// float32: its lanes load the row's flags, input and skip as 16-byte vectors side by side (a 768-wide float16
// row is 96 vectors, three a lane), vote on the flags, add, and reduce twice by shuffles (the mean, then the
// squared deviations about it: no cancellation of E[x²] - E[x]²); gamma, beta and bias are read per row from
// cache. The input is loaded before the vote settles, so the flags cost no round trip of their own; a row
// not kept discards it (a select, never a multiply: NaN there must not count). The bytes are the unfused
// normalization's: input and skip read once, Y (and the sum) written once.
#include <algorithm>
#include <cstdint>

#include "cuda/kernels/float_convert.cuh"
#include "cuda/kernels/masked_rows.cuh"
#include "cuda/kernels/masked_skip_layer_norm.h"

namespace onnxfuse::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarpSize = 32;
constexpr int kRowsPerBlock = kThreads / kWarpSize;
constexpr int kVectorBytes = 16;
constexpr int kMaxVectorsPerLane = static_cast<int>(kMaskedSkipNormMaxRowBytes / (kVectorBytes * kWarpSize));
static_assert(kMaxVectorsPerLane == 16, "the register kernel's instances below go to 16 vectors a lane");

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

template <class T>
struct Vec {
  static constexpr int kElements = kVectorBytes / static_cast<int>(sizeof(T));
  union {
    uint4 raw;
    T e[kElements];
  };
};

template <class T>
__device__ __forceinline__ Vec<T> load_vec(const void* base, int64_t index) {
  Vec<T> v;
  v.raw = __ldg(static_cast<const uint4*>(base) + index);
  return v;
}

// Rows of at most this many vectors a lane also hold gamma, beta and bias in registers, loaded with the row
// (1 536 bytes of float16 or 768 of float32 per lane and tensor at most): every load of the kernel is then
// issued before its first dependent step, one memory round trip where loading them after the vote and after
// the statistics took three. The later loads made GPT-2 small's folded normalizations slower than ORT's
// SkipLayerNormKernelSmall (bench/results/masked_skip_norm_h200.md, the earlier kernel as
// masked_skip_norm_h200_late_loads.json; in the model: e2e_kernels_h200_sdpa_masked_norm.md). Wider rows load
// them where they are used: three more arrays would spill the row's registers.
constexpr int kParamsWithRowVectors = 6;

// The row in registers: lane l holds vectors l, l + 32, ... (kVectors of them, the last ones past the row's
// end unused).
template <class T, int kVectors>
__global__ void __launch_bounds__(kThreads) masked_skip_norm_registers(MaskedSkipNorm c) {
  using V = Vec<T>;
  constexpr int E = V::kElements;
  constexpr bool kParamsWithRow = kVectors <= kParamsWithRowVectors;
  constexpr int P = kParamsWithRow ? kVectors : 1;  // (a one-vector placeholder where they are not held)
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (row >= c.batch * c.rows) return;  // warp-uniform
  const int64_t b = row / c.rows, r = row - b * c.rows;
  const int64_t vectors = c.width / E;
  const int64_t skip_row = c.skip_per_batch ? row : r;
  auto in_row = [&](int i) { return lane + i * kWarpSize < vectors; };

  V x[kVectors], sk[kVectors], bias[P], gamma[P], beta[P];
#pragma unroll
  for (int i = 0; i < kVectors; ++i) {
    const int64_t v = lane + i * kWarpSize;
    if (in_row(i)) {
      sk[i] = load_vec<T>(c.skip, skip_row * vectors + v);
      x[i] = load_vec<T>(c.input, row * vectors + v);
      if constexpr (kParamsWithRow) {
        gamma[i] = load_vec<T>(c.gamma, v);
        if (c.bias != nullptr) bias[i] = load_vec<T>(c.bias, v);
        if (c.beta != nullptr) beta[i] = load_vec<T>(c.beta, v);
      }
    }
  }
  const bool kept = warp_any_flag(row_flags(c.row_kept, b, r, c.flag_rows, c.flags_per_row), c.flags_per_row, lane);

  float s[kVectors][E];
  float total = 0.0f;
#pragma unroll
  for (int i = 0; i < kVectors; ++i) {
    if (in_row(i)) {
      if constexpr (!kParamsWithRow) {
        if (c.bias != nullptr) bias[0] = load_vec<T>(c.bias, lane + i * kWarpSize);
      }
      const V& add = bias[kParamsWithRow ? i : 0];
#pragma unroll
      for (int e = 0; e < E; ++e) {
        s[i][e] = to_float(sk[i].e[e]);
        if (kept) s[i][e] += to_float(x[i].e[e]);  // a select: NaN in a row not kept never counts
        if (c.bias != nullptr) s[i][e] += to_float(add.e[e]);
        total += s[i][e];
      }
    }
  }
  const float mean = warp_sum(total) / static_cast<float>(c.width);
  float squares = 0.0f;
#pragma unroll
  for (int i = 0; i < kVectors; ++i) {
    if (in_row(i)) {
#pragma unroll
      for (int e = 0; e < E; ++e) squares += (s[i][e] - mean) * (s[i][e] - mean);
    }
  }
  const float inv_std = 1.0f / sqrtf(warp_sum(squares) / static_cast<float>(c.width) + c.epsilon);

#pragma unroll
  for (int i = 0; i < kVectors; ++i) {
    const int64_t v = lane + i * kWarpSize;
    if (in_row(i)) {
      if constexpr (!kParamsWithRow) {
        gamma[0] = load_vec<T>(c.gamma, v);
        if (c.beta != nullptr) beta[0] = load_vec<T>(c.beta, v);
      }
      const V& scale = gamma[kParamsWithRow ? i : 0];
      const V& shift = beta[kParamsWithRow ? i : 0];
      V out, sum;
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const float add = c.beta != nullptr ? to_float(shift.e[e]) : 0.0f;
        out.e[e] = from_float<T>((s[i][e] - mean) * inv_std * to_float(scale.e[e]) + add);
        sum.e[e] = from_float<T>(s[i][e]);
      }
      static_cast<uint4*>(c.y)[row * vectors + v] = out.raw;
      if (c.sum != nullptr) static_cast<uint4*>(c.sum)[row * vectors + v] = sum.raw;
    }
  }
}

// Any width and alignment: the row read three times, an element at a time (sum, squared deviations, output).
// The same float32 sum each pass, so the statistics and the output agree.
template <class T>
__global__ void __launch_bounds__(kThreads) masked_skip_norm_elements(MaskedSkipNorm c) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (row >= c.batch * c.rows) return;  // warp-uniform
  const int64_t b = row / c.rows, r = row - b * c.rows, d = c.width;
  const bool kept = warp_any_flag(row_flags(c.row_kept, b, r, c.flag_rows, c.flags_per_row), c.flags_per_row, lane);
  const T* input = static_cast<const T*>(c.input) + row * d;
  const T* skip = static_cast<const T*>(c.skip) + (c.skip_per_batch ? row : r) * d;
  const T* bias = static_cast<const T*>(c.bias);
  auto element = [&](int64_t i) {
    float s = to_float(skip[i]);
    if (kept) s += to_float(input[i]);
    if (bias != nullptr) s += to_float(bias[i]);
    return s;
  };
  float total = 0.0f;
  for (int64_t i = lane; i < d; i += kWarpSize) total += element(i);
  const float mean = warp_sum(total) / static_cast<float>(d);
  float squares = 0.0f;
  for (int64_t i = lane; i < d; i += kWarpSize) squares += (element(i) - mean) * (element(i) - mean);
  const float inv_std = 1.0f / sqrtf(warp_sum(squares) / static_cast<float>(d) + c.epsilon);
  const T* gamma = static_cast<const T*>(c.gamma);
  const T* beta = static_cast<const T*>(c.beta);
  T* y = static_cast<T*>(c.y) + row * d;
  T* sum = c.sum != nullptr ? static_cast<T*>(c.sum) + row * d : nullptr;
  for (int64_t i = lane; i < d; i += kWarpSize) {
    const float s = element(i);
    y[i] = from_float<T>((s - mean) * inv_std * to_float(gamma[i]) + (beta != nullptr ? to_float(beta[i]) : 0.0f));
    if (sum != nullptr) sum[i] = from_float<T>(s);
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % kVectorBytes == 0; }

template <class T, int kVectors>
cudaError_t LaunchRegisters(const MaskedSkipNorm& c, int vectors_per_lane, unsigned grid, cudaStream_t stream) {
  if constexpr (kVectors > kMaxVectorsPerLane) {
    return cudaErrorInvalidValue;  // unreachable: the caller checked the row's width
  } else if (vectors_per_lane == kVectors) {
    masked_skip_norm_registers<T, kVectors><<<grid, kThreads, 0, stream>>>(c);
    return cudaGetLastError();
  } else {
    return LaunchRegisters<T, kVectors + 1>(c, vectors_per_lane, grid, stream);
  }
}

template <class T>
cudaError_t Launch(const MaskedSkipNorm& c, cudaStream_t stream) {
  const int64_t total_rows = c.batch * c.rows;
  const unsigned grid = static_cast<unsigned>((total_rows + kRowsPerBlock - 1) / kRowsPerBlock);
  const int64_t row_bytes = c.width * static_cast<int64_t>(sizeof(T));
  const bool vectors = row_bytes % kVectorBytes == 0 && row_bytes <= kMaskedSkipNormMaxRowBytes &&
                       Aligned16(c.input) && Aligned16(c.skip) && Aligned16(c.gamma) && Aligned16(c.y) &&
                       (c.beta == nullptr || Aligned16(c.beta)) && (c.bias == nullptr || Aligned16(c.bias)) &&
                       (c.sum == nullptr || Aligned16(c.sum));
  if (!vectors) {
    masked_skip_norm_elements<T><<<grid, kThreads, 0, stream>>>(c);
    return cudaGetLastError();
  }
  const int64_t row_vectors = row_bytes / kVectorBytes;
  const int vectors_per_lane = static_cast<int>((row_vectors + kWarpSize - 1) / kWarpSize);
  return LaunchRegisters<T, 1>(c, vectors_per_lane, grid, stream);
}

}  // namespace

cudaError_t launch_masked_skip_layer_norm(const MaskedSkipNorm& c, cudaStream_t stream) {
  if (c.batch * c.rows <= 0 || c.width <= 0) return cudaSuccess;
  if (c.batch * c.rows > static_cast<int64_t>(UINT32_MAX) * kRowsPerBlock) return cudaErrorInvalidConfiguration;
  switch (c.dtype) {
    case DType::kFloat16: return Launch<__half>(c, stream);
    case DType::kBFloat16: return Launch<__nv_bfloat16>(c, stream);
    default: return Launch<float>(c, stream);
  }
}

}  // namespace onnxfuse::cuda
