// Any-alignment GEMM + bias + activation on Tensor Cores (WMMA, sm_80+): the tactic of last resort.
//
// The fast paths need 16-byte rows and pointers (TMA, cp.async.16). This kernel loads X and W one element
// at a time with bounds checks into shared memory, so it takes every shape and pointer: K or N odd, views
// at odd offsets, K = 0 (Y = act(bias)), transB 0 or 1. It is simple rather than fast: a 64x64 CTA tile,
// four warps of 32x32, one shared-memory stage. The accumulator goes through shared memory once for the
// epilogue, which adds the bias and applies the activation in fp32 before the only global store.
// float32 runs on TF32 Tensor Cores, or, when strict fp32 is asked, on plain fp32 FMAs from the same shared
// memory tiles (this path is for odd shapes; speed is secondary to giving exactly the asked precision).
#include <mma.h>

#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/kernels/activation_math.cuh"
#include "cuda/kernels/float_convert.cuh"
#include "cuda/dispatch/tactics.cuh"

namespace onnxfuse::cuda {
namespace {

constexpr int kTileM = 64;
constexpr int kTileN = 64;
constexpr int kThreads = 128;

// Per element type: the WMMA shape and fragment element type. 16-bit: m16n16k16; float: m16n16k8 TF32.
template <class T>
struct WmmaTraits {
  static constexpr int kK = 16;      // K per MMA
  static constexpr int kTileK = 32;  // K per shared-memory stage
  using Frag = T;
  using Smem = T;
};
template <>
struct WmmaTraits<float> {
  static constexpr int kK = 8;
  static constexpr int kTileK = 16;
  using Frag = nvcuda::wmma::precision::tf32;
  using Smem = float;
};

// kStrictF32: fp32 FMAs instead of TF32 MMAs; only for T = float.
template <class T, bool kStrictF32>
__global__ void __launch_bounds__(kThreads) fallback_gemm_gelu_kernel(const T* __restrict__ x,
                                                                      const T* __restrict__ w,
                                                                      const T* __restrict__ bias, T* __restrict__ y,
                                                                      int64_t M, int64_t N, int64_t K, bool trans_b,
                                                                      ActivationParams act) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using namespace nvcuda;
  using Traits = WmmaTraits<T>;
  using Smem = typename Traits::Smem;
  constexpr int kTileK = Traits::kTileK;
  // Row padding keeps every fragment start 32-byte aligned (WMMA's rule) and staggers the banks.
  constexpr int kLd = kTileK + 32 / static_cast<int>(sizeof(Smem));
  constexpr int kLdC = kTileN + 4;
  struct Operands {
    Smem a[kTileM][kLd];  // X tile, [m][k]
    Smem b[kTileN][kLd];  // W tile, [n][k] (column-major B)
  };
  union SharedStorage {
    Operands ab;
    float c[kTileM][kLdC];  // the accumulator tile, for the epilogue
  };
  __shared__ __align__(128) SharedStorage smem;

  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * kTileM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kTileN;
  const int warp = threadIdx.x / 32;
  const int warp_m = (warp / 2) * 32, warp_n = (warp % 2) * 32;

  wmma::fragment<wmma::accumulator, 16, 16, Traits::kK, float> acc[2][2];
  float strict_acc[kStrictF32 ? 32 : 1] = {};
  float strict_err[kStrictF32 ? 32 : 1] = {};
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

  for (int64_t k0 = 0; k0 < K; k0 += kTileK) {
    // X: consecutive threads walk k (the contiguous axis).
    for (int i = threadIdx.x; i < kTileM * kTileK; i += kThreads) {
      const int r = i / kTileK, c = i % kTileK;
      const int64_t m = m0 + r, k = k0 + c;
      smem.ab.a[r][c] = (m < M && k < K) ? x[m * K + k] : T(0.0f);
    }
    // W: walk its contiguous axis too (k for [N, K], n for [K, N]).
    for (int i = threadIdx.x; i < kTileN * kTileK; i += kThreads) {
      int r, c;
      if (trans_b) { r = i / kTileK; c = i % kTileK; } else { c = i / kTileN; r = i % kTileN; }
      const int64_t n = n0 + r, k = k0 + c;
      smem.ab.b[r][c] = (n < N && k < K) ? (trans_b ? w[n * K + k] : w[k * N + n]) : T(0.0f);
    }
    __syncthreads();
    if constexpr (kStrictF32) {
      // Thread t owns row t/2, columns (t%2)*32 .. +32 of the tile. A plain running fp32 sum over K loses
      // ~sqrt(K) roundings (more than cuBLAS's blocked fp32 sum loses), so each dot product is
      // compensated (Ogita-Rump-Oishi Dot2: the exact product error from an FMA, the exact sum error from
      // TwoSum), which is as accurate as summing in twice the precision.
      const int r = threadIdx.x / 2, c0 = (threadIdx.x % 2) * 32;
#pragma unroll 2
      for (int kk = 0; kk < kTileK; ++kk) {
        const float a = smem.ab.a[r][kk];
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          const float b = smem.ab.b[c0 + j][kk];
          const float p = a * b;
          const float p_err = fmaf(a, b, -p);  // a·b = p + p_err exactly
          const float s = strict_acc[j] + p;
          const float b_virtual = s - strict_acc[j];
          const float s_err = (strict_acc[j] - (s - b_virtual)) + (p - b_virtual);  // acc + p = s + s_err
          strict_acc[j] = s;
          strict_err[j] += s_err + p_err;
        }
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < kTileK; kk += Traits::kK) {
        wmma::fragment<wmma::matrix_a, 16, 16, Traits::kK, typename Traits::Frag, wmma::row_major> fa[2];
        wmma::fragment<wmma::matrix_b, 16, 16, Traits::kK, typename Traits::Frag, wmma::col_major> fb[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          wmma::load_matrix_sync(fa[i], &smem.ab.a[warp_m + 16 * i][kk], kLd);
          wmma::load_matrix_sync(fb[i], &smem.ab.b[warp_n + 16 * i][kk], kLd);
        }
        if constexpr (std::is_same_v<T, float>) {
#pragma unroll
          for (int i = 0; i < 2; ++i) {
#pragma unroll
            for (int e = 0; e < fa[i].num_elements; ++e) fa[i].x[e] = wmma::__float_to_tf32(fa[i].x[e]);
#pragma unroll
            for (int e = 0; e < fb[i].num_elements; ++e) fb[i].x[e] = wmma::__float_to_tf32(fb[i].x[e]);
          }
        }
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
      }
    }
    __syncthreads();
  }

  // Epilogue: accumulators -> shared memory -> act(acc + bias) -> one store per element.
  if constexpr (kStrictF32) {
    const int r = threadIdx.x / 2, c0 = (threadIdx.x % 2) * 32;
#pragma unroll
    for (int j = 0; j < 32; ++j)  // an overflowed sum keeps its inf (its error term would be NaN)
      smem.c[r][c0 + j] = isfinite(strict_acc[j]) ? strict_acc[j] + strict_err[j] : strict_acc[j];
  } else {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j)
        wmma::store_matrix_sync(&smem.c[warp_m + 16 * i][warp_n + 16 * j], acc[i][j], kLdC, wmma::mem_row_major);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kTileM * kTileN; i += kThreads) {
    const int r = i / kTileN, c = i % kTileN;
    const int64_t m = m0 + r, n = n0 + c;
    if (m < M && n < N) {
      float v = smem.c[r][c];
      if (bias != nullptr) v += to_float(bias[n]);
      // fp32 outputs get the libm-accurate forms, 16-bit outputs the fast ones (activation_math.cuh).
      y[m * N + n] = from_float<T>(apply_activation<std::is_same_v<T, float>>(v, act));
    }
  }
#endif
}

template <class T, bool kStrictF32>
cudaError_t launch(const GemmGeluArgs& a, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((a.M + kTileM - 1) / kTileM), static_cast<unsigned>((a.N + kTileN - 1) / kTileN));
  fallback_gemm_gelu_kernel<T, kStrictF32><<<grid, kThreads, 0, stream>>>(
      static_cast<const T*>(a.x), static_cast<const T*>(a.w), static_cast<const T*>(a.bias), static_cast<T*>(a.y),
      a.M, a.N, a.K, a.trans_b, activation_params(a));
  return cudaGetLastError();
}

}  // namespace

bool fallback_can_implement(const GemmGeluArgs& a, const DeviceInfo& dev) {
  // Element-aligned pointers are all it asks; grid limits: M/64 < 2^31, N/64 < 65536.
  const size_t e = dtype_bytes(a.dtype);
  return dev.cc_major >= 8 && a.M > 0 && a.N > 0 && a.K >= 0 && (a.M + kTileM - 1) / kTileM < (int64_t{1} << 31) &&
         (a.N + kTileN - 1) / kTileN < 65536 && aligned_to(a.x, e) && aligned_to(a.w, e) && aligned_to(a.y, e) &&
         (a.bias == nullptr || aligned_to(a.bias, e));
}

cudaError_t fallback_run(const GemmGeluArgs& a, const DeviceInfo& dev, void*, size_t, cudaStream_t stream) {
  if (!fallback_can_implement(a, dev)) return cudaErrorNotSupported;
  switch (a.dtype) {
    case DType::kFloat16: return launch<__half, false>(a, stream);
    case DType::kBFloat16: return launch<__nv_bfloat16, false>(a, stream);
    case DType::kFloat32: return a.allow_tf32 ? launch<float, false>(a, stream) : launch<float, true>(a, stream);
  }
  return cudaErrorNotSupported;
}

}  // namespace onnxfuse::cuda
