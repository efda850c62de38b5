// The candidate tiles of one group of tiles.h (OFK_EXPLORE_TILES_<group>), float16 with W [N, K]: build.sh
// compiles this file once per group of its mode, with -DOFK_EXPLORE_GROUP=<letter>, into explore_<letter>.o,
// so that the groups' CUTLASS instantiations compile side by side.
#include "cuda/kernels/sm90_gemm_gelu.cuh"

#include "configs.h"
#include "sm90_intra_overlap_kernel.cuh"
#include "sm90_split_n_kernel.cuh"
#include "sm90_warp_groups_tactic.cuh"
#include "tiles.h"

#ifndef OFK_EXPLORE_GROUP
#error "compile with -DOFK_EXPLORE_GROUP=<letter of a group in explore/tiles.h> (build.sh does)"
#endif

#define OFK_EXPLORE_PASTE(a, b) a##b
#define OFK_EXPLORE_GROUP_TILES(group) OFK_EXPLORE_PASTE(OFK_EXPLORE_TILES_, group)  // expands group first
#define INSTANTIATE(name, TM, TN, TK, CM, CN, SCHED, EM, EN) \
  template struct onnxfuse::cuda::Sm90Tactic<OFK_EXPLORE_CONFIG(TM, TN, TK, CM, CN, SCHED, EM, EN)>;
OFK_EXPLORE_GROUP_TILES(OFK_EXPLORE_GROUP)(INSTANTIATE)
