// How a candidate line of tiles.h, X(name, TileM, TileN, TileK, ClusterM, ClusterN, schedule, EpiM, EpiN), becomes
// a kernel configuration, float16 with W [N, K] (trans_b = 1). The schedule names one of the shipped
// Sm90Schedule values (custom_ops/src/cuda/dispatch/tactics.cuh: an Sm90Config, built by the shipped Sm90Kernel), or
// kSplitNCooperative, the lab's split-N kernel (sm90_split_n_kernel.cuh: its own configuration type, which that
// file's Sm90Kernel specialization builds; it has its own epilogue, so EpiM x EpiN are 0 x 0), or
// kIntraOverlapCooperative, the lab's two-accumulator kernel (sm90_intra_overlap_kernel.cuh, the same way; there
// EpiM is the k-blocks queued while an epilogue chunk runs, EpiN = 1 the serial control), or kWarpGroupsPingpong,
// the shipped overlapped ping-pong kernel with EpiM consumer warpgroups and the main-loop stages that EpiN
// warpgroups' staging buffers leave (sm90_warp_groups_tactic.cuh; EpiN = 0: EpiM's).
// Light (no CUTLASS), like tactics.cuh: harness.cu names the tactics, explore.cu instantiates them.
#pragma once

#include "cuda/dispatch/tactics.cuh"

namespace ofk_explore {

template <onnxfuse::cuda::DType D, bool TransB, int TileM, int TileN, int TileK, int ClusterM, int ClusterN>
struct Sm90SplitNConfig {};
template <onnxfuse::cuda::DType D, bool TransB, int TileM, int TileN, int TileK, int ClusterM, int ClusterN, int Ahead,
          bool Serial>
struct Sm90IntraOverlapConfig {};
template <onnxfuse::cuda::DType D, bool TransB, int TileM, int TileN, int TileK, int ClusterM, int ClusterN, int Groups,
          int CarveoutGroups>
struct Sm90WarpGroupsConfig {};

// The table entry of one candidate (its kernels are instantiated in explore.cu's object for its group).
template <class Config>
constexpr onnxfuse::cuda::Tactic tactic(const char* name) {
  using T = onnxfuse::cuda::Sm90Tactic<Config>;
  return onnxfuse::cuda::Tactic{name, &T::can_implement, &T::workspace, &T::run};
}

}  // namespace ofk_explore

#define OFK_EXPLORE_CONFIG(TM, TN, TK, CM, CN, SCHED, EM, EN) \
  OFK_EXPLORE_CONFIG_##SCHED(TM, TN, TK, CM, CN, SCHED, EM, EN)
#define OFK_EXPLORE_SHIPPED_CONFIG(TM, TN, TK, CM, CN, SCHED, EM, EN)                                             \
  onnxfuse::cuda::Sm90Config<onnxfuse::cuda::DType::kFloat16, true, TM, TN, TK, CM, CN,                           \
                             onnxfuse::cuda::Sm90Schedule::SCHED, EM, EN>
#define OFK_EXPLORE_CONFIG_kPingpong OFK_EXPLORE_SHIPPED_CONFIG
#define OFK_EXPLORE_CONFIG_kCooperative OFK_EXPLORE_SHIPPED_CONFIG
#define OFK_EXPLORE_CONFIG_kStreamK OFK_EXPLORE_SHIPPED_CONFIG
#define OFK_EXPLORE_CONFIG_kOverlappedPingpong OFK_EXPLORE_SHIPPED_CONFIG
#define OFK_EXPLORE_CONFIG_kSplitNCooperative(TM, TN, TK, CM, CN, SCHED, EM, EN) \
  ofk_explore::Sm90SplitNConfig<onnxfuse::cuda::DType::kFloat16, true, TM, TN, TK, CM, CN>
#define OFK_EXPLORE_CONFIG_kIntraOverlapCooperative(TM, TN, TK, CM, CN, SCHED, EM, EN) \
  ofk_explore::Sm90IntraOverlapConfig<onnxfuse::cuda::DType::kFloat16, true, TM, TN, TK, CM, CN, EM, EN != 0>
#define OFK_EXPLORE_CONFIG_kWarpGroupsPingpong(TM, TN, TK, CM, CN, SCHED, EM, EN) \
  ofk_explore::Sm90WarpGroupsConfig<onnxfuse::cuda::DType::kFloat16, true, TM, TN, TK, CM, CN, EM, EN>
