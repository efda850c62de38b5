// The tactics behind launch_gemm_gelu: each one a kernel configuration with its own can_implement,
// workspace and run. This header is light (no CUTLASS): the dispatch table and the benchmark harness include
// it; the kernels are explicitly instantiated in the sm90_*.cu / sm80_*.cu files.
#pragma once

#include <cstddef>

#include "activation_math.cuh"
#include "gemm_gelu.h"

namespace onnxfuse::cuda {

using CanImplementFn = bool (*)(const GemmGeluArgs&, const DeviceInfo&);
using WorkspaceFn = size_t (*)(const GemmGeluArgs&, const DeviceInfo&);
using RunFn = cudaError_t (*)(const GemmGeluArgs&, const DeviceInfo&, void*, size_t, cudaStream_t);

struct Tactic {
  const char* name;
  CanImplementFn can_implement;  // shape, alignment, dtype, layout and architecture: false means "try the next"
  WorkspaceFn workspace;
  RunFn run;
};

// Hopper (sm_90a) CUTLASS 3 kernels: TMA loads, warp-specialized GMMA main loop, fused epilogue.
enum class Sm90Schedule : int {
  kPingpong,     // two consumer warpgroups on two tiles: one's epilogue overlaps the other's main loop
  kCooperative,  // two consumer warpgroups split one tile: larger tiles, epilogue not overlapped
};

template <DType D, bool TransB, int TileM, int TileN, int TileK, int ClusterM, int ClusterN, Sm90Schedule S>
struct Sm90Config {};

// The sm90 tactics, one line each: X(name, TileM, TileN, TileK, ClusterM, ClusterN, schedule). The same list is
// instantiated for every (16-bit dtype, layout) in sm90_<dtype>_<layout>.cu and listed by the dispatch table,
// so a tile added here exists everywhere. Each CUTLASS 3 instantiation costs ~1 min of nvcc on a 2-core
// machine and cicc takes ~5 GB for a file of three, so the list holds only tiles that win somewhere
// (bench/kernels/NOTES.md has the measurements). Why each:
//  pp_64x64_c1      ping-pong 64x64: 4x the CTAs of 128x128 for small M·N (well under one wave), where
//                   128x64 tiles left most SMs idle (7.9 us vs cuBLAS 3.7 at 128x768x3072)
//  pp_128x128_c1    ping-pong 128x128: one warpgroup's epilogue overlaps the other's main loop; about one
//                   wave of tiles (128x4096x16384) and ties elsewhere
//  coop_256x128_c2  cooperative 256x128, 2x1 cluster (B multicast): fewest bytes per FLOP; best from
//                   ~1.5 waves of 128x128 tiles up (1024..16384 x 768 x 3072, 8192x4096x16384)
#define ONNXFUSE_SM90_TILES_16BIT(X)                    \
  X(pp_64x64_c1, 64, 64, 64, 1, 1, kPingpong)           \
  X(pp_128x128_c1, 128, 128, 64, 1, 1, kPingpong)       \
  X(coop_256x128_c2, 256, 128, 64, 2, 1, kCooperative)

// TF32 GMMA takes K-major operands only, so these exist for trans_b = 1 (W [N, K]); K tile 32 = 128 bytes.
#define ONNXFUSE_SM90_TILES_TF32(X)                     \
  X(pp_64x64_c1, 64, 64, 32, 1, 1, kPingpong)           \
  X(pp_128x128_c1, 128, 128, 32, 1, 1, kPingpong)       \
  X(coop_256x128_c2, 256, 128, 32, 2, 1, kCooperative)

template <class Config>
struct Sm90Tactic {
  static bool can_implement(const GemmGeluArgs& args, const DeviceInfo& dev);
  static size_t workspace(const GemmGeluArgs& args, const DeviceInfo& dev);
  static cudaError_t run(const GemmGeluArgs& args, const DeviceInfo& dev, void* workspace, size_t workspace_bytes,
                         cudaStream_t stream);
};

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
inline ActivationParams activation_params(const GemmGeluArgs& a) {
  return ActivationParams{static_cast<int>(a.act), a.alpha};
}

// Benchmark and test hooks: every tactic by index, and a launch that forces one (still checking it fits).
int gemm_gelu_tactic_count();
const Tactic& gemm_gelu_tactic_at(int index);
cudaError_t launch_gemm_gelu_with_tactic(int index, const GemmGeluArgs& args, const DeviceInfo& dev, void* workspace,
                                         size_t workspace_bytes, cudaStream_t stream);

}  // namespace onnxfuse::cuda
