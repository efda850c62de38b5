// The tactics behind launch_gemm_gelu: each one a kernel configuration with its own can_implement,
// workspace and run. This header is light (no CUTLASS): the dispatch table and the benchmark harness include
// it; the kernels are explicitly instantiated in the sm90_*.cu / sm80_*.cu files.
#pragma once

#include <cstddef>

#include "cuda/kernels/activation_math.cuh"
#include "cuda/dispatch/gemm_gelu.h"
#include "kernel_hooks.cuh"

namespace onnxfuse::cuda {

using CanImplementFn = bool (*)(const GemmGeluArgs&, const DeviceInfo&);
using WorkspaceFn = size_t (*)(const GemmGeluArgs&, const DeviceInfo&);
using RunFn = cudaError_t (*)(const GemmGeluArgs&, const DeviceInfo&, void*, size_t, cudaStream_t);

struct Tactic {
  const char* name;
  CanImplementFn can_implement;  // shape, alignment, dtype, layout and architecture: false means "try the next"
  WorkspaceFn workspace;
  RunFn run;  // called only where can_implement said yes for the same arguments
};

// Hopper (sm_90a) CUTLASS 3 kernels: TMA loads, warp-specialized GMMA main loop, fused epilogue.
enum class Sm90Schedule : int {
  kPingpong,     // two consumer warpgroups on two tiles: one's epilogue overlaps the other's main loop
  kCooperative,  // two consumer warpgroups split one tile: larger tiles, epilogue not overlapped
  kStreamK,      // cooperative, with the work split along K too (stream-K): every SM busy at 1-2 waves
  kOverlappedPingpong,  // ping-pong whose two warpgroups' epilogues may overlap (sm90_warp_epilogue_kernel.cuh)
  kOverlappedPingpong3,  // the same kernel with three consumer warpgroups: two epilogues beside each main loop
};

// EpiM x EpiN: the CUTLASS epilogue's subtile (the overlapped kernel ignores them), the piece of the tile stored per step through shared memory (M must be
// 64 for ping-pong, 128 for cooperative); 0 x 0 lets CUTLASS choose (64x32 ping-pong, 128x32 cooperative).
template <DType D, bool TransB, int TileM, int TileN, int TileK, int ClusterM, int ClusterN, Sm90Schedule S,
          int EpiM, int EpiN>
struct Sm90Config {};

// The sm90 tactics, one line each: X(name, TileM, TileN, TileK, ClusterM, ClusterN, schedule, EpiM, EpiN). The
// same lists are instantiated for every (16-bit dtype, layout) in sm90_<dtype>_<layout>_{small,large}.cu and
// listed by the dispatch table, so a tile added here exists everywhere. Each CUTLASS 3 instantiation costs
// ~1 min of nvcc on a 2-core machine and cicc takes ~5 GB for a file of three, so a file holds at most three
// and the lists hold only tiles that win somewhere (lab/kernels/NOTES.md has the measurements,
// lab/kernels/explore/ the candidates that lost). Why each, fp16 GPU time with the erf form:
//  ppo_64x64_c1         overlapped ping-pong 64x64 (sm90_warp_epilogue_kernel.cuh: the two warpgroups'
//                       epilogues are not ordered): the most CTAs, for up to a wave of 128x128 tiles at short K
//                       (ahead of CUTLASS's ping-pong 64x64 and 128x128; NOTES.md v7,
//                       lab/results/kernels_v7_overlap.json.gz)
//  ppo_64x128_c1        overlapped ping-pong 64x128: a third to half a wave (ahead of CUTLASS's 64x128), up to a
//                       wave with K >= 1024 (ahead of 64x64) and 1-2 waves (ahead of cooperative 128x192; v7)
//  pp_128x128_c1x2_e64x128  CUTLASS's ping-pong 128x128, X tile multicast to a 1x2 cluster, 64x128 epilogue
//                       steps (half the steps of CUTLASS's 64x32 choice, each with its barrier and TMA store):
//                       many waves at K <= 1024 (a tie with the overlapped kernel at 4096 rows, ahead of it beyond)
//  pp_128x128_c1x2      the same with CUTLASS's epilogue steps, whose smaller staging buffer leaves one more
//                       main-loop stage: long K (ahead of 64x128 steps there)
//  ppo3_128x128_c1x2    the overlapped kernel on the 128x128 tile with three consumer warpgroups: many waves at
//                       K <= 512, where a tile's epilogue outlasts its main loop and two epilogues run beside each
//                       main loop (ahead of two warpgroups: NOTES.md v10,
//                       lab/results/kernels_v10_three_groups_h200.txt, bench/results/cuda_kernel_three_groups_h200.md;
//                       two warpgroups beat CUTLASS's ping-pong there, v8, lab/results/kernels_v8_forms_h200.txt); a
//                       tie at K = 768 and a loss at 1024 (v10)
#define ONNXFUSE_SM90_TILES_16BIT_SMALL(X)                              \
  X(ppo_64x64_c1, 64, 64, 64, 1, 1, kOverlappedPingpong, 0, 0)          \
  X(ppo_64x128_c1, 64, 128, 64, 1, 1, kOverlappedPingpong, 0, 0)
#define ONNXFUSE_SM90_TILES_16BIT_LARGE(X)                              \
  X(pp_128x128_c1x2_e64x128, 128, 128, 64, 1, 2, kPingpong, 64, 128)    \
  X(pp_128x128_c1x2, 128, 128, 64, 1, 2, kPingpong, 0, 0)              \
  X(ppo3_128x128_c1x2, 128, 128, 64, 1, 2, kOverlappedPingpong3, 0, 0)
#define ONNXFUSE_SM90_TILES_16BIT(X) ONNXFUSE_SM90_TILES_16BIT_SMALL(X) ONNXFUSE_SM90_TILES_16BIT_LARGE(X)

// TF32 GMMA takes K-major operands only, so these exist for trans_b = 1 (W [N, K]); K tile 32 = 128 bytes.
#define ONNXFUSE_SM90_TILES_TF32(X)                               \
  X(pp_64x64_c1, 64, 64, 32, 1, 1, kPingpong, 0, 0)               \
  X(pp_128x128_c1, 128, 128, 32, 1, 1, kPingpong, 0, 0)           \
  X(coop_256x128_c2, 256, 128, 32, 2, 1, kCooperative, 0, 0)

template <class Config>
struct Sm90Tactic {
  static bool can_implement(const GemmGeluArgs& args, const DeviceInfo& dev);
  static size_t workspace(const GemmGeluArgs& args, const DeviceInfo& dev);
  static cudaError_t run(const GemmGeluArgs& args, const DeviceInfo& dev, void* workspace, size_t workspace_bytes,
                         cudaStream_t stream);
};

// The table entry of one sm90 configuration (its kernels are instantiated in an sm90_*.cu file).
template <DType D, bool TransB, int TM, int TN, int TK, int CM, int CN, Sm90Schedule S, int EM, int EN>
constexpr Tactic sm90_tactic(const char* name) {
  using T = Sm90Tactic<Sm90Config<D, TransB, TM, TN, TK, CM, CN, S, EM, EN>>;
  return Tactic{name, &T::can_implement, &T::workspace, &T::run};
}

// Hopper kernels for few rows with the operands swapped (sm90_swap_ab.cuh): Yᵀ = W·Xᵀ, W's rows tiled by
// TileW (the GMMA's M), X's rows by TileX (its N); W [N, K] only; CUTLASS's ping-pong, cooperative or stream-K
// schedules (not the overlapped kernel layer), no cluster.
template <DType D, int TileW, int TileX, int TileK, Sm90Schedule S>
struct Sm90SwapConfig {};

// The swapped tiles, one line each: X(name, TileW, TileX, TileK, schedule). Measured with the erf form, back to
// back (lab/kernels/NOTES.md, "Swap-AB for few rows"; lab/results/swap_ab_probe_h200.txt and
// swap_ab_probe_h200_round2.txt):
//  swap_64x16_pp    the most CTAs (one 64-row strip of W each), one tile of X's rows up to 16: every shape up
//                   to 16 rows, and 17-32 float32 rows of a W under 2^25 weights (ahead of 128x16 cooperative
//                   and of wider tiles of X's rows)
//  swap_128x32_coop float32 from 9 to 64 rows of a W of 2^25+ weights: one strip of W per SM, read once for
//                   up to 32 rows (ahead of 64x16 at 32 rows and of ping-pong 64x64 at 64, a tie at 16)
#define ONNXFUSE_SM90_SWAP_TILES_16BIT(X) X(swap_64x16_pp, 64, 16, 64, kPingpong)
#define ONNXFUSE_SM90_SWAP_TILES_TF32(X)    \
  X(swap_64x16_pp, 64, 16, 32, kPingpong)   \
  X(swap_128x32_coop, 128, 32, 32, kCooperative)

// The table entry of one swapped configuration (instantiated in an sm90_*_swap_ab.cu file).
template <DType D, int TW, int TX, int TK, Sm90Schedule S>
constexpr Tactic sm90_swap_tactic(const char* name) {
  using T = Sm90Tactic<Sm90SwapConfig<D, TW, TX, TK, S>>;
  return Tactic{name, &T::can_implement, &T::workspace, &T::run};
}

// Ampere-class (sm_80+) CUTLASS 2 kernels: cp.async multistage main loop on mma.sync, epilogue with the bias as
// a row-broadcast C operand (ldc = 0).
enum class Sm80Math : int {
  kTensorOp,     // fp16/bf16 operands, or fp32 operands on TF32 Tensor Cores
  kFastF32,      // fp32 operands on 3xTF32 (big·big + big·small + small·big): fp32-level accuracy
};

template <DType D, bool TransB, Sm80Math Math>
struct Sm80Config {};

template <class Config>
struct Sm80Tactic {
  static bool can_implement(const GemmGeluArgs& args, const DeviceInfo& dev);
  static size_t workspace(const GemmGeluArgs& args, const DeviceInfo& dev);
  static cudaError_t run(const GemmGeluArgs& args, const DeviceInfo& dev, void* workspace, size_t workspace_bytes,
                         cudaStream_t stream);
};

// Any-alignment Tensor-Core kernel (WMMA) for sm_80+: scalar, bounds-checked loads, so it takes every shape
// and pointer the fast paths refuse (K or N odd, unaligned views, K = 0).
bool fallback_can_implement(const GemmGeluArgs& args, const DeviceInfo& dev);
cudaError_t fallback_run(const GemmGeluArgs& args, const DeviceInfo& dev, void* workspace, size_t workspace_bytes,
                         cudaStream_t stream);

// Shared helpers.
inline bool aligned_to(const void* p, size_t bytes) { return (reinterpret_cast<uintptr_t>(p) % bytes) == 0; }
inline size_t dtype_bytes(DType d) { return d == DType::kFloat32 ? 4 : 2; }
// The persistent sm90 kernels walk their output tiles along one dimension by default: each wave of tiles then
// reads one whole operand (all of W, or all of X) and a few panels of the other. When both operands are
// larger than about half of L2, neither stays there between waves and every wave streams one of them from
// DRAM again. Swizzling the walk into groups of 8 tiles keeps each wave's panels of both operands small
// enough to stay in L2. CUTLASS rounds both tile counts up to a multiple of swizzle x cluster and walks the
// padding too, so the swizzle is used only where that adds at most 3 % of tiles (fp32 2048x4096x16384 on
// cooperative 256x128 tiles, 8 tile rows padded to 16, ran far slower). Swizzle 8 against 1 (lab/kernels/NOTES.md,
// v5; lab/results/kernels_v5_swizzle.json): ahead where both operands outgrow L2 (fp16 8192x4096x16384,
// 4096x4096x16384), behind where an operand fits in L2 (fp16 2048x4096x16384, 16384x768x3072).
constexpr int kSm90WideSwizzle = 8;
inline int sm90_swizzle(const GemmGeluArgs& a, const DeviceInfo& dev, int tile_m, int tile_n, int cluster_m,
                        int cluster_n) {
  const double elem = static_cast<double>(dtype_bytes(a.dtype));
  const double x_bytes = static_cast<double>(a.M) * static_cast<double>(a.K) * elem;
  const double w_bytes = static_cast<double>(a.N) * static_cast<double>(a.K) * elem;
  const double half_l2 = 0.5 * static_cast<double>(dev.l2_bytes);
  if (dev.l2_bytes <= 0 || x_bytes <= half_l2 || w_bytes <= half_l2) return 1;
  const auto round_up = [](int64_t v, int64_t to) { return (v + to - 1) / to * to; };
  const int64_t ctas_m = round_up((a.M + tile_m - 1) / tile_m, cluster_m);
  const int64_t ctas_n = round_up((a.N + tile_n - 1) / tile_n, cluster_n);
  const double padded = static_cast<double>(round_up(ctas_m, kSm90WideSwizzle * cluster_m)) *
                        static_cast<double>(round_up(ctas_n, kSm90WideSwizzle * cluster_n));
  return padded <= 1.03 * static_cast<double>(ctas_m) * static_cast<double>(ctas_n) ? kSm90WideSwizzle : 1;
}

inline ActivationParams activation_params(const GemmGeluArgs& a) {
  ActivationParams p{static_cast<int>(a.act), a.alpha};
  hooks::fill_activation_params(p);
  return p;
}

// Benchmark and test hooks: every tactic by index, and a launch that forces one (still checking it fits).
int gemm_gelu_tactic_count();
const Tactic& gemm_gelu_tactic_at(int index);
cudaError_t launch_gemm_gelu_with_tactic(int index, const GemmGeluArgs& args, const DeviceInfo& dev, void* workspace,
                                         size_t workspace_bytes, cudaStream_t stream);

}  // namespace onnxfuse::cuda
