// The few-rows kernel (gemv_gelu.h): W read once, every row's products in fp32 registers, the bias and the
// activation applied before the one store of Y.
//
// Two layouts, two ways of walking W so that each warp's loads stay contiguous:
//
//  transB = 0, W [K, N] (N contiguous): a block owns a strip of 32 bytes of columns (one DRAM sector per row
//    of W: 16 fp16/bf16 or 8 fp32 columns) and its 128 threads split K: each thread reads a 16-byte piece of
//    a row, kSlicesK rows apart. The strip's partial sums meet in registers (shuffles across the lanes that
//    share columns) and then in shared memory (across the block's warps).
//  transB = 1, W [N, K] (K contiguous): one to four warps own a group of kTnCols columns (4, or 8 for fp32 at
//    4 and 8 rows) and their 32 lanes walk K side by side, 16 bytes each, reading X's rows the same way; a
//    butterfly of shuffles sums the lanes, shared memory the warps.
//  transB = 1, float32 with TF32 allowed, 5-16 rows of a large W (gemv_uses_tf32): the products on TF32 Tensor
//    Cores (gemv_tf32_kernel below), the precision ORT's own MatMul has at those rows.
//
// Thin strips keep every SM busy at the N of real layers (3072 fp16 columns are 192 blocks). Rows up to the
// next power of two are computed (a template parameter: the accumulators must be registers), the rows beyond
// M read row M-1 again and are never stored.
//
// Precision: fp32 FMAs of exact products (TF32 products in the Tensor-Core case), summed in a fixed order (the
// result does not depend on timing); the epilogue's math is the other paths' (activation_math.cuh), precise for fp32 and fast for 16-bit
// outputs, rounded once.
#include "cuda/kernels/gemv_gelu.h"

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/kernels/activation_math.cuh"
#include "cuda/kernels/float_convert.cuh"
#include "cuda/dispatch/tactics.cuh"

namespace onnxfuse::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kSectorBytes = 32;
constexpr int kVectorBytes = 16;
// Rows of W each thread loads before the FMAs that use them (transB = 0): with 4 warps per block and several
// blocks per SM, enough bytes in flight to cover DRAM latency.
constexpr int kNnUnroll = 4;
// Columns per group (transB = 1). Each X vector a lane loads serves the group's columns only: every group
// reads all of X again (from L1/L2), so X's traffic is kRows / kTnCols times W's and grows with the rows (4x W's
// at 16 rows of 4 columns). 8 columns halve it where the sums still fit in registers: fp32 at 4 and 8 rows
// (up to 8x8 sums beside 8x4 floats of W); 16-bit W takes twice the registers per vector, 16 rows twice the
// sums, and at 1 or 2 rows X is at most half of W's traffic while 4 columns give twice the groups to spread
// a small N over the SMs. The float32 path at those rows: bench/results/cuda_kernel_fp32_few_rows_h200.json
// (`bench/cuda_kernel.py --paths`).
template <class T, int kRows>
constexpr int kTnCols = std::is_same_v<T, float> && (kRows == 4 || kRows == 8) ? 8 : 4;

template <class T>
constexpr int kPerVector = kVectorBytes / static_cast<int>(sizeof(T));

template <class T>
constexpr bool kPrecise = std::is_same_v<T, float>;

// kVec consecutive elements from p as floats: one 16-byte load when kVec fills it (p 16-byte aligned), else
// element loads.
template <class T, int kVec>
__device__ __forceinline__ void load_floats(const T* __restrict__ p, float (&f)[kVec]) {
  if constexpr (kVec * sizeof(T) == kVectorBytes) {
    union {
      uint4 bits;
      T v[kVec];
    } u;
    u.bits = __ldg(reinterpret_cast<const uint4*>(p));
#pragma unroll
    for (int j = 0; j < kVec; ++j) f[j] = to_float(u.v[j]);
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j) f[j] = to_float(__ldg(p + j));
  }
}

template <class T>
__device__ __forceinline__ float epilogue(float s, const T* __restrict__ bias, int64_t n, const ActivationParams& act) {
  if (bias != nullptr) s += to_float(__ldg(bias + n));
  return apply_activation<kPrecise<T>>(s, act);
}

// transB = 0. Block b owns columns [b·kTileN, (b+1)·kTileN); thread (tx, ty) reads columns tx·kVec.. of rows
// ty, ty + kSlicesK, ...
template <class T, int kRows, int kVec>
__global__ void __launch_bounds__(kThreads) gemv_nn_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                                           const T* __restrict__ bias, T* __restrict__ y, int M,
                                                           int64_t K, int64_t N, ActivationParams act) {
  constexpr int kTileN = kSectorBytes / static_cast<int>(sizeof(T));
  constexpr int kLanesN = kTileN / kVec;  // threads side by side across the strip
  constexpr int kSlicesK = kThreads / kLanesN;
  static_assert(kLanesN <= 32 && (kLanesN & (kLanesN - 1)) == 0, "a warp must hold whole rows of the strip");
  const int tx = threadIdx.x % kLanesN;
  const int ty = threadIdx.x / kLanesN;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kTileN + tx * kVec;

  float acc[kRows][kVec];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int v = 0; v < kVec; ++v) acc[r][v] = 0.0f;

  // With kVec > 1, N is a multiple of kVec: a thread's columns are all inside Y or all beyond it.
  if (col < N) {
    const T* xr[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) xr[r] = x + static_cast<int64_t>(r < M ? r : M - 1) * K;
    const T* wc = w + col;
    int64_t k = ty;
    for (; k + (kNnUnroll - 1) * kSlicesK < K; k += kNnUnroll * kSlicesK) {
      float wv[kNnUnroll][kVec];
#pragma unroll
      for (int u = 0; u < kNnUnroll; ++u) load_floats<T, kVec>(wc + (k + u * kSlicesK) * N, wv[u]);
#pragma unroll
      for (int u = 0; u < kNnUnroll; ++u) {
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          const float xv = to_float(__ldg(xr[r] + k + u * kSlicesK));
#pragma unroll
          for (int v = 0; v < kVec; ++v) acc[r][v] = fmaf(xv, wv[u][v], acc[r][v]);
        }
      }
    }
    for (; k < K; k += kSlicesK) {
      float wv[kVec];
      load_floats<T, kVec>(wc + k * N, wv);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float xv = to_float(__ldg(xr[r] + k));
#pragma unroll
        for (int v = 0; v < kVec; ++v) acc[r][v] = fmaf(xv, wv[v], acc[r][v]);
      }
    }
  }

  // The K slices of one column: first the warp's lanes that share it (the lane bits above kLanesN), then
  // the warps, in shared memory, in warp order.
#pragma unroll
  for (int offset = kLanesN; offset < 32; offset <<= 1)
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int v = 0; v < kVec; ++v) acc[r][v] += __shfl_xor_sync(0xffffffffu, acc[r][v], offset);

  __shared__ float partial[kWarps][kRows][kTileN];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  if (lane < kLanesN) {
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int v = 0; v < kVec; ++v) partial[warp][r][tx * kVec + v] = acc[r][v];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kRows * kTileN; i += kThreads) {
    const int r = i / kTileN;
    const int c = i % kTileN;
    const int64_t n = static_cast<int64_t>(blockIdx.x) * kTileN + c;
    if (r >= M || n >= N) continue;
    float s = 0.0f;
#pragma unroll
    for (int wi = 0; wi < kWarps; ++wi) s += partial[wi][r][c];
    y[static_cast<int64_t>(r) * N + n] = from_float<T>(epilogue(s, bias, n, act));
  }
}

// transB = 1. Each group of kCols columns belongs to k_split warps of one block (1, 2 or kWarps: more warps
// where N alone gives too few to cover DRAM latency); warp `slice` of a group walks steps slice, slice +
// k_split, ... of K, lane l reading elements l·kVec.. of each step's 32·kVec, of the group's rows of W and of
// every row of X.
template <class T, int kRows, int kVec, int kCols>
__global__ void __launch_bounds__(kThreads) gemv_tn_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                                           const T* __restrict__ bias, T* __restrict__ y, int M,
                                                           int64_t K, int64_t N, int k_split, ActivationParams act) {
  constexpr int kOutputs = kRows * kCols;
  constexpr int kSlots = (kOutputs + 31) / 32;  // outputs per lane in the epilogue
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int slice = warp % k_split;
  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) * (kWarps / k_split) + warp / k_split) * kCols;
  const bool active = n0 < N;  // a whole warp past Y still takes part in the block's reduction

  float acc[kRows][kCols];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int c = 0; c < kCols; ++c) acc[r][c] = 0.0f;

  if (active) {
    const T* wr[kCols];
#pragma unroll
    for (int c = 0; c < kCols; ++c) wr[c] = w + (n0 + c < N ? n0 + c : N - 1) * K;  // past N: never stored
    const T* xr[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) xr[r] = x + static_cast<int64_t>(r < M ? r : M - 1) * K;
    const int64_t stride = static_cast<int64_t>(32) * kVec * k_split;
#pragma unroll 2
    for (int64_t k = (static_cast<int64_t>(slice) * 32 + lane) * kVec; k < K; k += stride) {
      float wv[kCols][kVec];
#pragma unroll
      for (int c = 0; c < kCols; ++c) load_floats<T, kVec>(wr[c] + k, wv[c]);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        float xv[kVec];
        load_floats<T, kVec>(xr[r] + k, xv);
#pragma unroll
        for (int c = 0; c < kCols; ++c)
#pragma unroll
          for (int v = 0; v < kVec; ++v) acc[r][c] = fmaf(xv[v], wv[c][v], acc[r][c]);
      }
    }
  }

#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int c = 0; c < kCols; ++c) acc[r][c] += __shfl_xor_sync(0xffffffffu, acc[r][c], offset);

  // Every lane now holds every sum of its warp; lane l takes outputs l, l + 32, ... (row-major over rows x
  // columns).
  float mine[kSlots] = {};
#pragma unroll
  for (int j = 0; j < kOutputs; ++j)
    if (j % 32 == lane) mine[j / 32] = acc[j / kCols][j % kCols];

  if (k_split > 1) {  // the group's slices meet in shared memory; its first warp sums them in slice order
    __shared__ float partial[kWarps][kOutputs];
#pragma unroll
    for (int s = 0; s < kSlots; ++s)
      if (s * 32 + lane < kOutputs) partial[warp][s * 32 + lane] = mine[s];
    __syncthreads();
    if (slice != 0) return;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      if (s * 32 + lane >= kOutputs) continue;
      float sum = 0.0f;
      for (int t = 0; t < k_split; ++t) sum += partial[warp + t][s * 32 + lane];
      mine[s] = sum;
    }
  }
  if (!active) return;
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int j = s * 32 + lane;
    const int r = j / kCols;
    const int64_t n = n0 + j % kCols;
    if (j < kOutputs && r < M && n < N) y[static_cast<int64_t>(r) * N + n] = from_float<T>(epilogue(mine[s], bias, n, act));
  }
}

// float32 on TF32 Tensor Cores, for 5-16 rows of a large W in sessions that allow TF32 (gemv_uses_tf32): there
// the FMA kernel above re-reads X through L2 for every column group and runs at L2's pace, behind ORT's own
// MatMul, which runs a TF32 Tensor-Core GEMM there (cutlass s1688: lab/results/cublas_fp32_few_rows_h200.txt;
// the paths against ORT: bench/results/cuda_kernel_fp32_tf32_gemv_h200.json), so TF32 is the precision the
// user's unfused model has there.
// The products are taken transposed, Yᵀ = W·Xᵀ: 16 columns of W are the mma's M and up to 8 rows of X its N
// (mma.sync m16n8k8), so a few rows waste nothing and the warp issues one instruction per 1024 products; what
// is left is reading W (how: WLoad; launch_tf32 says which the shipped launch uses and why).
// The order of k inside a block of 32: lane (g = lane / 4, t = lane % 4) loads 8 consecutive k (two 16-byte
// vectors, one DRAM sector) of its rows of W and of X; mma j of the block takes k = 8t + 2j into the fragment
// slot t and 8t + 2j + 1 into slot t + 4. A and B use the same map, so each sum is over the right products.
// Inputs are rounded to TF32 (cvt.rna) rather than truncated. Measured against the FMA kernel and other tiles,
// splits and load policies (lab/kernels/NOTES.md, "gemv v3").
__device__ __forceinline__ uint32_t to_tf32(float f) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(f));
  return r;
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// How the TF32 kernel reads W (X is always read through L1): kL1, plainly through L1 (__ldg); kNoL1, past L1
// (L1::no_allocate); kEvictFirst, through L1 but first to leave it, so X stays; the *256 forms also ask L2 to
// fetch the 256-byte block around each load (L2::256B).
enum class WLoad { kL1, kNoL1, kEvictFirst, kL1Fetch256, kEvictFirstFetch256 };

#define ONNXFUSE_LD4(qualifiers)                                                                  \
  asm("ld.global.nc" qualifiers ".v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), \
      "=f"(v.w) : "l"(p))

template <WLoad kLoad>
__device__ __forceinline__ float4 load4(const float* p) {
  float4 v;
  if constexpr (kLoad == WLoad::kL1) {
    v = __ldg(reinterpret_cast<const float4*>(p));
  } else if constexpr (kLoad == WLoad::kNoL1) {
    ONNXFUSE_LD4(".L1::no_allocate");
  } else if constexpr (kLoad == WLoad::kEvictFirst) {
    ONNXFUSE_LD4(".L1::evict_first");
  } else if constexpr (kLoad == WLoad::kL1Fetch256) {
    ONNXFUSE_LD4(".L2::256B");
  } else {
    ONNXFUSE_LD4(".L1::evict_first.L2::256B");
  }
  return v;
}
#undef ONNXFUSE_LD4

// kCount floats of a row from k; K is a multiple of 4, so each 16-byte piece is inside K or past it (zeros).
template <WLoad kLoad, int kCount>
__device__ __forceinline__ void load_run(const float* row, int64_t k, int64_t K, float (&v)[kCount]) {
#pragma unroll
  for (int q = 0; q < kCount / 4; ++q) {
    const float4 f = k + 4 * q < K ? load4<kLoad>(row + k + 4 * q) : make_float4(0.f, 0.f, 0.f, 0.f);
    v[4 * q] = f.x;
    v[4 * q + 1] = f.y;
    v[4 * q + 2] = f.z;
    v[4 * q + 3] = f.w;
  }
}

// W [N, K] (transB = 1). kRowTiles tiles of 8 rows, kColTiles tiles of 16 columns per warp; each lane loads
// kLaneK consecutive k of its rows (the block of k is 4·kLaneK: the map above with 8t -> kLaneK·t and j up to
// kLaneK / 2); kSplit warps of a block share a column group and take every kSplit-th block of k, their sums
// meeting in shared memory in slice order (deterministic). The shipped configuration is launch_tf32's; the
// lab times the others.
template <int kRowTiles, int kColTiles, int kSplit, WLoad kLoadW, int kLaneK = 8>
__global__ void __launch_bounds__(kThreads) gemv_tf32_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                                             const float* __restrict__ bias, float* __restrict__ y,
                                                             int M, int64_t K, int64_t N, ActivationParams act) {
  constexpr int kGroups = kWarps / kSplit;
  constexpr int kTiles = kColTiles * kRowTiles;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int slice = warp % kSplit;
  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) * kGroups + warp / kSplit) * (kColTiles * 16);
  const bool active = n0 < N;  // a whole warp past Y still takes part in the block's reduction

  // acc[c · kRowTiles + r]: the m16n8 tile of columns n0 + 16c.., rows 8r..: element i is column
  // g + 8·(i / 2), row 2t + i % 2 of the tile.
  float acc[kTiles][4] = {};

  if (active) {
    const float* wr[kColTiles][2];
#pragma unroll
    for (int c = 0; c < kColTiles; ++c)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t n = n0 + 16 * c + 8 * h + g;
        wr[c][h] = w + (n < N ? n : N - 1) * K;  // past N: never stored
      }
    const float* xr[kRowTiles];
#pragma unroll
    for (int r = 0; r < kRowTiles; ++r) xr[r] = x + static_cast<int64_t>(8 * r + g < M ? 8 * r + g : M - 1) * K;
    constexpr int kBlockK = 4 * kLaneK;
    const int64_t blocks = (K + kBlockK - 1) / kBlockK;
#pragma unroll 2
    for (int64_t kb = slice; kb < blocks; kb += kSplit) {
      const int64_t k = kb * kBlockK + kLaneK * t;
      float wv[kColTiles][2][kLaneK];
      float xv[kRowTiles][kLaneK];
#pragma unroll
      for (int c = 0; c < kColTiles; ++c)
#pragma unroll
        for (int h = 0; h < 2; ++h) load_run<kLoadW, kLaneK>(wr[c][h], k, K, wv[c][h]);
#pragma unroll
      for (int r = 0; r < kRowTiles; ++r) load_run<WLoad::kL1, kLaneK>(xr[r], k, K, xv[r]);
#pragma unroll
      for (int j = 0; j < kLaneK / 2; ++j) {
        uint32_t b[kRowTiles][2];
#pragma unroll
        for (int r = 0; r < kRowTiles; ++r) {
          b[r][0] = to_tf32(xv[r][2 * j]);
          b[r][1] = to_tf32(xv[r][2 * j + 1]);
        }
#pragma unroll
        for (int c = 0; c < kColTiles; ++c) {
          const uint32_t a[4] = {to_tf32(wv[c][0][2 * j]), to_tf32(wv[c][1][2 * j]), to_tf32(wv[c][0][2 * j + 1]),
                                 to_tf32(wv[c][1][2 * j + 1])};
#pragma unroll
          for (int r = 0; r < kRowTiles; ++r) mma_tf32(acc[c * kRowTiles + r], a, b[r]);
        }
      }
    }
  }

  if constexpr (kSplit > 1) {
    __shared__ float partial[kWarps][kTiles][4][32];
#pragma unroll
    for (int tile = 0; tile < kTiles; ++tile)
#pragma unroll
      for (int i = 0; i < 4; ++i) partial[warp][tile][i][lane] = acc[tile][i];
    __syncthreads();
    if (slice != 0) return;
#pragma unroll
    for (int tile = 0; tile < kTiles; ++tile)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float s = 0.0f;
#pragma unroll
        for (int q = 0; q < kSplit; ++q) s += partial[warp + q][tile][i][lane];
        acc[tile][i] = s;
      }
  }
  if (!active) return;
#pragma unroll
  for (int tile = 0; tile < kTiles; ++tile)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t n = n0 + 16 * (tile / kRowTiles) + g + 8 * (i / 2);
      const int m = 8 * (tile % kRowTiles) + 2 * t + i % 2;
      if (m < M && n < N) y[static_cast<int64_t>(m) * N + n] = epilogue(acc[tile][i], bias, n, act);
    }
}

// Warps per SM the transB = 1 kernel aims for before it splits K among more warps, and the steps of K each
// warp keeps at least when it does (bench/results/cuda_kernel_gemv_h200.md): a split lifts a narrow, deep W
// (1x4095x1023 bf16, 256 column groups with 128 steps each), but where each warp is left one or two steps its
// butterfly of shuffles costs more than the steps (8x1024x4096 fp16, four steps).
constexpr int64_t kTnWarpsPerSm = 16;
constexpr int64_t kTnMinStepsPerWarp = 8;

// 1, 2 or kWarps: the fewest warps per group of `cols` columns that give every SM kTnWarpsPerSm warps, while
// each warp keeps kTnMinStepsPerWarp steps of K.
int tn_k_split(int64_t K, int64_t N, int cols, int vec, const DeviceInfo& dev) {
  const int64_t groups = (N + cols - 1) / cols;
  const int64_t steps = (K + 32 * vec - 1) / (32 * vec);
  const int64_t target = kTnWarpsPerSm * (dev.sm_count > 0 ? dev.sm_count : 1);
  int split = 1;
  while (split < kWarps && groups * split < target && steps >= kTnMinStepsPerWarp * 2 * split) split *= 2;
  return split;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % kVectorBytes == 0; }

}  // namespace

bool gemv_uses_tf32(const GemmGeluArgs& a) {
  return a.dtype == DType::kFloat32 && a.allow_tf32 && a.trans_b && a.M > kGemvExactF32MaxRows &&
         a.M <= kGemvMaxRows && a.K * a.N >= kGemvTf32MinWeights && gemv_reads_vectors(a);
}

bool gemv_reads_vectors(const GemmGeluArgs& a) {
  const int64_t per_vector = kVectorBytes / static_cast<int64_t>(dtype_bytes(a.dtype));
  if (!a.trans_b) return a.N % per_vector == 0 && aligned16(a.w);  // W's rows: N elements
  return a.K % per_vector == 0 && aligned16(a.w) && aligned16(a.x);  // W's and X's rows: K elements
}

namespace {

template <class T, int kRows>
cudaError_t launch_rows(const GemmGeluArgs& a, const DeviceInfo& dev, cudaStream_t stream) {
  constexpr int kVec = kPerVector<T>;
  const T* x = static_cast<const T*>(a.x);
  const T* w = static_cast<const T*>(a.w);
  const T* bias = static_cast<const T*>(a.bias);
  T* y = static_cast<T*>(a.y);
  const int m = static_cast<int>(a.M);
  const ActivationParams act = activation_params(a);
  if (!a.trans_b) {
    constexpr int64_t kTileN = kSectorBytes / sizeof(T);
    const unsigned blocks = static_cast<unsigned>((a.N + kTileN - 1) / kTileN);
    if (gemv_reads_vectors(a)) {
      gemv_nn_kernel<T, kRows, kVec><<<blocks, kThreads, 0, stream>>>(x, w, bias, y, m, a.K, a.N, act);
    } else {
      gemv_nn_kernel<T, kRows, 1><<<blocks, kThreads, 0, stream>>>(x, w, bias, y, m, a.K, a.N, act);
    }
  } else {
    constexpr int kCols = kTnCols<T, kRows>;
    const bool vec = gemv_reads_vectors(a);
    const int k_split = tn_k_split(a.K, a.N, kCols, vec ? kVec : 1, dev);
    const int64_t block_cols = static_cast<int64_t>(kWarps / k_split) * kCols;
    const unsigned blocks = static_cast<unsigned>((a.N + block_cols - 1) / block_cols);
    if (vec) {
      gemv_tn_kernel<T, kRows, kVec, kCols><<<blocks, kThreads, 0, stream>>>(x, w, bias, y, m, a.K, a.N, k_split, act);
    } else {
      gemv_tn_kernel<T, kRows, 1, kCols><<<blocks, kThreads, 0, stream>>>(x, w, bias, y, m, a.K, a.N, k_split, act);
    }
  }
  return cudaGetLastError();
}

// The shipped TF32 configuration: one 16-column tile per warp, K split four ways (every warp of a block on one
// group), W read through L1 (__ldg). Reading W past L1 (L1::no_allocate) was a little faster back to back, but
// timed after other work has left L2 full of dirty lines, as a model's layers do, it lost by far more
// (lab/kernels/NOTES.md, "gemv v5"; lab/results/gemv_tf32_dirty_v5_h200.txt).
cudaError_t launch_tf32(const GemmGeluArgs& a, cudaStream_t stream) {
  constexpr int kColTiles = 1;
  constexpr int kSplit = 4;
  const int64_t block_cols = static_cast<int64_t>(kWarps / kSplit) * kColTiles * 16;
  const unsigned blocks = static_cast<unsigned>((a.N + block_cols - 1) / block_cols);
  const auto* x = static_cast<const float*>(a.x);
  const auto* w = static_cast<const float*>(a.w);
  const auto* bias = static_cast<const float*>(a.bias);
  auto* y = static_cast<float*>(a.y);
  const int m = static_cast<int>(a.M);
  if (a.M <= 8) {
    gemv_tf32_kernel<1, kColTiles, kSplit, WLoad::kL1><<<blocks, kThreads, 0, stream>>>(x, w, bias, y, m, a.K, a.N, activation_params(a));
  } else {
    gemv_tf32_kernel<2, kColTiles, kSplit, WLoad::kL1><<<blocks, kThreads, 0, stream>>>(x, w, bias, y, m, a.K, a.N, activation_params(a));
  }
  return cudaGetLastError();
}

template <class T>
cudaError_t launch_typed(const GemmGeluArgs& a, const DeviceInfo& dev, cudaStream_t stream) {
  if (a.M <= 1) return launch_rows<T, 1>(a, dev, stream);
  if (a.M <= 2) return launch_rows<T, 2>(a, dev, stream);
  if (a.M <= 4) return launch_rows<T, 4>(a, dev, stream);
  if (a.M <= 8) return launch_rows<T, 8>(a, dev, stream);
  return launch_rows<T, 16>(a, dev, stream);
}
static_assert(kGemvMaxRows == 16, "launch_typed instantiates row counts up to kGemvMaxRows");

}  // namespace

cudaError_t launch_gemv_gelu(const GemmGeluArgs& a, const DeviceInfo& dev, cudaStream_t stream) {
  if (a.M < 1 || a.M > kGemvMaxRows || a.N < 0 || a.K < 0) return cudaErrorInvalidValue;
  if (a.N == 0) return cudaSuccess;
  const size_t elem = dtype_bytes(a.dtype);
  for (const void* p : {a.x, a.w, a.bias, static_cast<const void*>(a.y)}) {
    if (reinterpret_cast<uintptr_t>(p) % elem != 0) return cudaErrorMisalignedAddress;
  }
  switch (a.dtype) {
    case DType::kFloat16: return launch_typed<__half>(a, dev, stream);
    case DType::kBFloat16: return launch_typed<__nv_bfloat16>(a, dev, stream);
    case DType::kFloat32: return gemv_uses_tf32(a) ? launch_tf32(a, stream) : launch_typed<float>(a, dev, stream);
  }
  return cudaErrorNotSupported;
}

}  // namespace onnxfuse::cuda
