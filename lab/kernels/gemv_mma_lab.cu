// gemv v6 (lab/kernels/NOTES.md): a 16-bit gemv kernel on Tensor Cores for 5-16 rows (issue #20's few-rows
// band), at every configuration worth timing, beside the gemv path as shipped
// (custom_ops/src/cuda/kernels/gemv_gelu.cu, included below so that its FMA kernel, launch and epilogue run in this
// process); for gemv_mma_probe.py (ctypes + torch). A product candidate: if it wins (NOTES.md says by which rule),
// the kernel and its launch move to gemv_gelu.cu as they are.
//
//   nvcc -std=c++17 -O3 -shared -Xcompiler=-fPIC -gencode=arch=compute_90a,code=sm_90a -I$CUTLASS/include \
//        -Icustom_ops/src -Icustom_ops/src/cuda/hooks lab/kernels/gemv_mma_lab.cu -o libgemv_mma_lab.so
// (CUTLASS: the nvidia-cutlass wheel's cutlass_library/source, as lab/kernels/build.sh finds it)
//
// Variants: 0 the gemv path as shipped (launch_gemv_gelu: the FMA kernel at the rows' power of two); 1.. the
// Tensor-Core kernel at kColTiles x kLaneK x kStages x k_split (ofg_variant_name spells them), its row tiles the
// fewest that hold M (up to 64 rows: the lab also asks how far the kernel reaches).
#include <cstdio>
#include <type_traits>

#include <cute/arch/copy_sm80.hpp>
#include <cute/arch/mma_sm80.hpp>

#include "lab_device.h"
#include "cuda/kernels/gemv_gelu.cu"  // the shipped kernels (their anonymous namespace is this translation unit's)

namespace onnxfuse::cuda::lab {

// fp16 / bf16 on Tensor Cores: the FMA kernel (gemv_tn_kernel) spends one FMA per product and row, so from
// a few rows on it runs at the CUDA cores' pace, not W's (fp16 8x1024x4096: 5.4 µs where one row takes 3.0).
// As the TF32 kernel: Yᵀ = W·Xᵀ, 16 columns of W are the mma's M and 8 rows of X its N (mma.sync m16n8k16,
// 16-bit inputs, fp32 accumulation: products exact, sums in fp32 as the FMA kernel's), so few rows waste little
// and one instruction takes 2048 products. Lane (g = lane / 4, t = lane % 4) fetches kLaneK consecutive k
// (16-byte pieces) of its rows of W (columns g and g + 8 of each 16-column tile) and of X (row g of each 8-row
// tile); in a block of 4·kLaneK k, mma j takes the lane's words 2j (fragment slots 2t, 2t+1) and 2j+1 (slots
// 2t+8, 2t+9), the same map for W and X, so each sum runs over the right products.
// What bounds it is memory latency, not arithmetic: a warp owns 16 columns (the FMA kernel's warps own 4), so it
// must keep many blocks of k in flight. Loads into registers do not stay in flight: the compiler issues each just
// before its mma, one memory latency per block (NOTES.md, "gemv v6", round 1). So each lane copies its pieces
// with cp.async into a ring of kStages slots of its own in shared memory (kStages - 1 blocks in flight) and
// reads them back itself: no lane reads another's pieces, so no barrier. k_split warps of a block share a column
// group and take every k_split-th block; their sums meet in shared memory in slice order (the result does not
// depend on timing).
template <class T, int kRowTiles, int kColTiles, int kLaneK>
struct MmaGemvShape {
  static constexpr int kPieces = kLaneK / 8;                               // 16-byte pieces per row and block
  static constexpr int kLanePieces = (2 * kColTiles + kRowTiles) * kPieces;  // per lane and block: W's, then X's
  static constexpr int kBlockK = 4 * kLaneK;
};

template <class T>
__device__ __forceinline__ void mma_16bit(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  using Mma = std::conditional_t<std::is_same_v<T, __half>, cute::SM80_16x8x16_F32F16F16F32_TN,
                                 cute::SM80_16x8x16_F32BF16BF16F32_TN>;
  Mma::fma(d[0], d[1], d[2], d[3], a[0], a[1], a[2], a[3], b[0], b[1], d[0], d[1], d[2], d[3]);
}

// W [N, K] (transB = 1), 16-bit. kRowTiles tiles of 8 rows, kColTiles tiles of 16 columns per warp. Dynamic
// shared memory: the rings (launch_mma_config's kRingBytes).
template <class T, int kRowTiles, int kColTiles, int kLaneK, int kStages>
__global__ void __launch_bounds__(kThreads) gemv_mma_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                                            const T* __restrict__ bias, T* __restrict__ y, int M,
                                                            int64_t K, int64_t N, int k_split, ActivationParams act) {
  using Shape = MmaGemvShape<T, kRowTiles, kColTiles, kLaneK>;
  constexpr int kPieces = Shape::kPieces;
  constexpr int kLanePieces = Shape::kLanePieces;
  constexpr int kBlockK = Shape::kBlockK;
  constexpr int kTiles = kColTiles * kRowTiles;
  static_assert(kLaneK % 8 == 0 && kStages >= 2, "whole 16-byte pieces, and a block in flight");
  using Piece = cute::uint128_t;
  // W streams through L2 only (each piece is read once); X through L1 too, where the block's other column groups
  // read the same pieces.
  using CopyW = cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<Piece>;
  using CopyX = cute::SM80_CP_ASYNC_CACHEALWAYS_ZFILL<Piece>;
  extern __shared__ Piece ring[];  // [kWarps][kStages][kLanePieces][32]
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int slice = warp % k_split;
  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) * (kWarps / k_split) + warp / k_split) * (kColTiles * 16);
  const bool active = n0 < N;  // a whole warp past Y still takes part in the block's reduction

  // acc[c · kRowTiles + r]: the m16n8 tile of columns n0 + 16c.., rows 8r..: element i is column
  // g + 8·(i / 2), row 2t + i % 2 of the tile.
  float acc[kTiles][4] = {};

  if (active) {
    const T* rows[kLanePieces / kPieces];  // W's 2·kColTiles rows, then X's kRowTiles
#pragma unroll
    for (int c = 0; c < kColTiles; ++c)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t n = n0 + 16 * c + 8 * h + g;
        rows[2 * c + h] = w + (n < N ? n : N - 1) * K;  // past N: never stored
      }
#pragma unroll
    for (int r = 0; r < kRowTiles; ++r)
      rows[2 * kColTiles + r] = x + static_cast<int64_t>(8 * r + g < M ? 8 * r + g : M - 1) * K;  // past M: never stored
    Piece* mine = ring + static_cast<int64_t>(warp) * kStages * kLanePieces * 32 + lane;
    const int64_t blocks = (K + kBlockK - 1) / kBlockK;
    const int64_t count = blocks > slice ? (blocks - slice + k_split - 1) / k_split : 0;  // this warp's blocks
    // Block i of this warp (k from (slice + i·k_split)·kBlockK) into slot i % kStages; pieces past K are zeros.
    // One commit group per block, empty past the last, so that waiting for "all but kStages - 2" always means
    // "block i has landed".
    auto fetch = [&](int64_t i) {
      if (i < count) {
        const int64_t k = (slice + i * k_split) * kBlockK + kLaneK * t;
        Piece* slot = mine + (i % kStages) * kLanePieces * 32;
#pragma unroll
        for (int r = 0; r < kLanePieces / kPieces; ++r)
#pragma unroll
          for (int q = 0; q < kPieces; ++q) {
            const int64_t kq = k + 8 * q;
            const bool inside = kq < K;
            const Piece& src = *reinterpret_cast<const Piece*>(rows[r] + (inside ? kq : 0));
            if (r < 2 * kColTiles) CopyW::copy(src, slot[(r * kPieces + q) * 32], inside);
            else CopyX::copy(src, slot[(r * kPieces + q) * 32], inside);
          }
      }
      cute::cp_async_fence();
    };
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) fetch(s);
    for (int64_t i = 0; i < count; ++i) {
      cute::cp_async_wait<kStages - 2>();
      Piece v[kLanePieces];
      const Piece* slot = mine + (i % kStages) * kLanePieces * 32;
#pragma unroll
      for (int p = 0; p < kLanePieces; ++p) v[p] = slot[p * 32];
      fetch(i + kStages - 1);  // into the slot read in the last iteration
#pragma unroll
      for (int q = 0; q < kPieces; ++q)
#pragma unroll
        for (int half = 0; half < 2; ++half) {  // the piece's words (0, 1), then (2, 3)
          uint32_t b[kRowTiles][2];
#pragma unroll
          for (int r = 0; r < kRowTiles; ++r) {
            const uint32_t* words = reinterpret_cast<const uint32_t*>(&v[(2 * kColTiles + r) * kPieces + q]);
            b[r][0] = words[2 * half];
            b[r][1] = words[2 * half + 1];
          }
#pragma unroll
          for (int c = 0; c < kColTiles; ++c) {
            const uint32_t* lo = reinterpret_cast<const uint32_t*>(&v[(2 * c) * kPieces + q]);
            const uint32_t* hi = reinterpret_cast<const uint32_t*>(&v[(2 * c + 1) * kPieces + q]);
            const uint32_t a[4] = {lo[2 * half], hi[2 * half], lo[2 * half + 1], hi[2 * half + 1]};
#pragma unroll
            for (int r = 0; r < kRowTiles; ++r) mma_16bit<T>(acc[c * kRowTiles + r], a, b[r]);
          }
        }
    }
    cute::cp_async_wait<0>();  // the empty groups past the last block
  }

  if (k_split > 1) {
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
        for (int q = 0; q < k_split; ++q) s += partial[warp + q][tile][i][lane];
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
      if (m < M && n < N) y[static_cast<int64_t>(m) * N + n] = from_float<T>(epilogue(acc[tile][i], bias, n, act));
    }
}

// The Tensor-Core kernel at one configuration: kRowTiles·8 rows at most, k_split warps per column group (1, 2
// or kWarps). Its ring of shared memory may pass the 48 KB a launch gets unasked: the attribute is set once per
// configuration (thread-safe: a function-local static).
template <class T, int kRowTiles, int kColTiles, int kLaneK, int kStages>
cudaError_t launch_mma_config(const GemmGeluArgs& a, int k_split, cudaStream_t stream) {
  if (a.M > 8 * kRowTiles || (k_split != 1 && k_split != 2 && k_split != kWarps)) return cudaErrorInvalidValue;
  constexpr size_t kRingBytes =
      sizeof(cute::uint128_t) * kWarps * kStages * MmaGemvShape<T, kRowTiles, kColTiles, kLaneK>::kLanePieces * 32;
  auto kernel = gemv_mma_kernel<T, kRowTiles, kColTiles, kLaneK, kStages>;
  static const cudaError_t attribute =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kRingBytes));
  if (attribute != cudaSuccess) return attribute;
  const int64_t block_cols = static_cast<int64_t>(kWarps / k_split) * kColTiles * 16;
  const unsigned blocks = static_cast<unsigned>((a.N + block_cols - 1) / block_cols);
  kernel<<<blocks, kThreads, kRingBytes, stream>>>(static_cast<const T*>(a.x), static_cast<const T*>(a.w),
                                                  static_cast<const T*>(a.bias), static_cast<T*>(a.y),
                                                  static_cast<int>(a.M), a.K, a.N, k_split, activation_params(a));
  return cudaGetLastError();
}


struct Config {
  int col_tiles, lane_k, stages, k_split;
};
constexpr Config kConfigs[] = {
    {1, 8, 4, 4}, {1, 8, 8, 4}, {1, 8, 8, 2}, {1, 8, 16, 4}, {1, 16, 4, 4},
    {1, 16, 8, 4}, {1, 8, 8, 1}, {2, 8, 8, 4}, {1, 16, 4, 2}, {2, 16, 4, 4},
};
constexpr int kConfigCount = static_cast<int>(sizeof(kConfigs) / sizeof(kConfigs[0]));
constexpr int kLabMaxRows = 64;

template <class T, int kRowTiles>
cudaError_t run_rows(const GemmGeluArgs& a, const Config& c, cudaStream_t s) {
  const int key = c.col_tiles * 10000 + c.lane_k * 100 + c.stages;
  switch (key) {
    case 10804: return launch_mma_config<T, kRowTiles, 1, 8, 4>(a, c.k_split, s);
    case 10808: return launch_mma_config<T, kRowTiles, 1, 8, 8>(a, c.k_split, s);
    case 10816: return launch_mma_config<T, kRowTiles, 1, 8, 16>(a, c.k_split, s);
    case 11604: return launch_mma_config<T, kRowTiles, 1, 16, 4>(a, c.k_split, s);
    case 11608: return launch_mma_config<T, kRowTiles, 1, 16, 8>(a, c.k_split, s);
    case 20808: return launch_mma_config<T, kRowTiles, 2, 8, 8>(a, c.k_split, s);
    case 21604: return launch_mma_config<T, kRowTiles, 2, 16, 4>(a, c.k_split, s);
  }
  return cudaErrorInvalidValue;
}

template <class T>
cudaError_t run_config(const GemmGeluArgs& a, const Config& c, cudaStream_t s) {
  if (a.M <= 8) return run_rows<T, 1>(a, c, s);
  if (a.M <= 16) return run_rows<T, 2>(a, c, s);
  if (a.M <= 32) return run_rows<T, 4>(a, c, s);
  return run_rows<T, 8>(a, c, s);
}

}  // namespace onnxfuse::cuda::lab

using namespace onnxfuse::cuda;

extern "C" {

int ofg_variant_count() { return lab::kConfigCount + 1; }

// "shipped", or "mma_c{col tiles}_k{lane k}_r{ring stages}_s{k split}".
const char* ofg_variant_name(int v) {
  static char names[lab::kConfigCount + 1][32];
  if (v == 0) return "shipped";
  if (v < 0 || v > lab::kConfigCount) return "";
  const lab::Config& c = lab::kConfigs[v - 1];
  snprintf(names[v], sizeof(names[v]), "mma_c%d_k%d_r%d_s%d", c.col_tiles, c.lane_k, c.stages, c.k_split);
  return names[v];
}

// dtype 1 float16, 2 bfloat16; act 0 erf, 1 tanh, 2 sigmoid (alpha 1.702). W [N, K]. Returns a cudaError_t.
int ofg_launch(int variant, int dtype, int act, long long M, long long N, long long K, const void* x, const void* w,
               const void* bias, void* y, void* stream) {
  static const DeviceInfo dev = lab_device_info();
  GemmGeluArgs a{};
  a.dtype = static_cast<DType>(dtype);
  a.act = static_cast<onnxfuse::Activation>(act);
  a.alpha = 1.702f;
  a.trans_b = true;
  a.M = M; a.N = N; a.K = K;
  a.x = x; a.w = w; a.bias = bias; a.y = y;
  auto s = static_cast<cudaStream_t>(stream);
  if (a.dtype == DType::kFloat32 || M < 1 || M > lab::kLabMaxRows || !gemv_reads_vectors(a)) return cudaErrorInvalidValue;
  const bool f16 = a.dtype == DType::kFloat16;
  if (variant == 0) return M <= kGemvMaxRows ? launch_gemv_gelu(a, dev, s) : cudaErrorInvalidValue;
  if (variant < 0 || variant > lab::kConfigCount) return cudaErrorInvalidValue;
  const lab::Config& c = lab::kConfigs[variant - 1];
  return f16 ? lab::run_config<__half>(a, c, s) : lab::run_config<__nv_bfloat16>(a, c, s);
}

}  // extern "C"
