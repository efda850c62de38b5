// Candidate sm90 tiles measured by the kernel harness but not in the shipped lists (custom_ops/src/cuda/dispatch/
// tactics.cuh): what was tried and lost, kept so that a later kernel change can re-measure them in one build.
// One line each: X(name, TileM, TileN, TileK, ClusterM, ClusterN, schedule, EpiM, EpiN) (EpiM = 0: CUTLASS's
// epilogue subtile; configs.h turns a line into its kernel configuration), float16 with W [N, K] (trans_b = 1).
// Groups OFK_EXPLORE_TILES_<letter> of two or three tiles (cicc takes ~5 GB for three): build.sh compiles
// explore.cu once per group of the build's mode (OFK_EXPLORE_MODE_* at the end of this file), so the groups'
// instantiations compile side by side. Results: lab/results/kernels_v3_*.json and later
// (lab/kernels/NOTES.md, v3-v7).
#pragma once

// OFK_EXPLORE=tiles: the previous shipped 16-bit tiles, other clusters, stream-K.
#define OFK_EXPLORE_TILES_A(X)                                   \
  X(pp_128x128_c1, 128, 128, 64, 1, 1, kPingpong, 0, 0)          \
  X(coop_256x128_c2, 256, 128, 64, 2, 1, kCooperative, 0, 0)
#define OFK_EXPLORE_TILES_B(X)                                   \
  X(pp_128x128_c2x1, 128, 128, 64, 2, 1, kPingpong, 0, 0)        \
  X(pp_128x128_c2x2, 128, 128, 64, 2, 2, kPingpong, 0, 0)        \
  X(pp_64x128_c1x2, 64, 128, 64, 1, 2, kPingpong, 0, 0)
#define OFK_EXPLORE_TILES_C(X)                                   \
  X(pp_64x64_c1x2, 64, 64, 64, 1, 2, kPingpong, 0, 0)            \
  X(pp_64x64_c1x4, 64, 64, 64, 1, 4, kPingpong, 0, 0)            \
  X(coop_128x192_c1, 128, 192, 64, 1, 1, kCooperative, 0, 0)
#define OFK_EXPLORE_TILES_D(X)                                   \
  X(coop_128x192_c2x2, 128, 192, 64, 2, 2, kCooperative, 0, 0)   \
  X(coop_128x192_c1x2, 128, 192, 64, 1, 2, kCooperative, 0, 0)   \
  X(pp_128x192_c1, 128, 192, 64, 1, 1, kPingpong, 0, 0)
// Stream-K (cooperative only in CUTLASS 3): partial last waves spread over every SM.
#define OFK_EXPLORE_TILES_E(X)                                   \
  X(sk_128x128_c1, 128, 128, 64, 1, 1, kStreamK, 0, 0)           \
  X(sk_128x192_c1, 128, 192, 64, 1, 1, kStreamK, 0, 0)           \
  X(sk_256x128_c2, 256, 128, 64, 2, 1, kStreamK, 0, 0)
// OFK_EXPLORE=sched, round 2: 128-deep K steps (half the stage hand-offs per tile, 3-4 stages), for the
// K = 768 shapes where the main loop waits on its loads (lab/kernels/NOTES.md, v5).
#define OFK_EXPLORE_TILES_J(X)                                        \
  X(pp_128x128x128_c1x2_e64x128, 128, 128, 128, 1, 2, kPingpong, 64, 128) \
  X(pp_64x64x128_c1, 64, 64, 128, 1, 1, kPingpong, 0, 0)
// OFK_EXPLORE=sched, round 3: clusters along M for the tiles under a wave, so that the CTAs of one column of
// tiles share each W panel through TMA multicast (W is the large operand when M is small).
#define OFK_EXPLORE_TILES_K(X)                                        \
  X(pp_64x64_c2x1_e64x64, 64, 64, 64, 2, 1, kPingpong, 64, 64)        \
  X(pp_64x128_c2x1_e64x128, 64, 128, 64, 2, 1, kPingpong, 64, 128)
// OFK_EXPLORE=sched, round 4: what the overlapped ping-pong kernel's 64x64 and 64x128 tiles replaced: CUTLASS's
// ping-pong kernel on those tiles (lab/kernels/NOTES.md, v7). Its 128x128 tile, measured here from v7 on, ships
// since v8 (at K <= 512 beyond two waves).
#define OFK_EXPLORE_TILES_L(X)                                              \
  X(pp_64x64_c1_e64x64, 64, 64, 64, 1, 1, kPingpong, 64, 64)                \
  X(pp_64x128_c1_e64x128, 64, 128, 64, 1, 1, kPingpong, 64, 128)
#define OFK_EXPLORE_TILES_M(X) \
  X(coop_128x192_c2x1_e128x64, 128, 192, 64, 2, 1, kCooperative, 128, 64)
// OFK_EXPLORE=sched, round 5: tiles split along N between the two warpgroups (sm90_split_n_kernel.cuh), whose
// tile counts fill the SMs evenly where 128-row tiles leave a partial last wave (4096 rows: 22 x 24 = 528 tiles
// of 192x128, 4.0 waves; 6304 rows: 792, 6.0) (lab/kernels/NOTES.md, v7b).
#define OFK_EXPLORE_TILES_N(X)                                          \
  X(coopn_192x128_c1x2, 192, 128, 64, 1, 2, kSplitNCooperative, 0, 0)   \
  X(coopn_256x128_c1x2, 256, 128, 64, 1, 2, kSplitNCooperative, 0, 0)   \
  X(coopn_192x128_c1, 192, 128, 64, 1, 1, kSplitNCooperative, 0, 0)

// OFK_EXPLORE=intra: issue #20's intra-warpgroup overlap (sm90_intra_overlap_kernel.cuh: two accumulator sets per
// consumer warpgroup, the previous tile's epilogue run while the next tile's GMMAs execute), and CUTLASS's
// cooperative kernel on the same tile, which runs the same main loop with its epilogue not overlapped
// (lab/kernels/NOTES.md, v9).
// Columns EpiM, EpiN of these lines: k-blocks of GMMAs queued while a chunk runs (1 or 2), and 1 for the control
// that runs the same chunks before the next tile's main loop (no overlap).
#define OFK_EXPLORE_TILES_O(X)                                              \
  X(ico_128x128_c1x2, 128, 128, 64, 1, 2, kIntraOverlapCooperative, 1, 0)   \
  X(ico2_128x128_c1x2, 128, 128, 64, 1, 2, kIntraOverlapCooperative, 2, 0)  \
  X(icos_128x128_c1x2, 128, 128, 64, 1, 2, kIntraOverlapCooperative, 1, 1)
#define OFK_EXPLORE_TILES_P(X)                                              \
  X(ico_128x128_c1, 128, 128, 64, 1, 1, kIntraOverlapCooperative, 1, 0)     \
  X(coop_128x128_c1x2, 128, 128, 64, 1, 2, kCooperative, 0, 0)

// OFK_EXPLORE=three: issue #20's third consumer warpgroup (sm90_warp_groups_tactic.cuh: the shipped overlapped
// ping-pong kernel with three warpgroups taking turns, two epilogues beside each main loop; lab/kernels/NOTES.md,
// v10), on the shipped kernel's 128x128 tile and clusters and on 64x128; and the control, the shipped two-warpgroup
// kernel with the 5 main-loop stages that three leave on 128x128 (6 as shipped).
// Columns EpiM, EpiN of these lines: consumer warpgroups, and the warpgroups whose staging the stages leave room for.
#define OFK_EXPLORE_TILES_Q(X)                                           \
  X(ppo3_128x128_c1x2, 128, 128, 64, 1, 2, kWarpGroupsPingpong, 3, 0)    \
  X(ppo3_128x128_c1, 128, 128, 64, 1, 1, kWarpGroupsPingpong, 3, 0)      \
  X(ppo3_64x128_c1, 64, 128, 64, 1, 1, kWarpGroupsPingpong, 3, 0)
#define OFK_EXPLORE_TILES_R(X) \
  X(ppo_128x128_c1x2_s5, 128, 128, 64, 1, 2, kWarpGroupsPingpong, 2, 3)

// OFK_EXPLORE=epi: epilogue subtiles the shipped list does not use (its winners moved there).
#define OFK_EXPLORE_TILES_F(X)                                              \
  X(pp_128x128_c1x2_e64x64, 128, 128, 64, 1, 2, kPingpong, 64, 64)          \
  X(pp_64x64_c1, 64, 64, 64, 1, 1, kPingpong, 0, 0)
#define OFK_EXPLORE_TILES_G(X)                                              \
  X(coop_128x192_c2x1, 128, 192, 64, 2, 1, kCooperative, 0, 0)              \
  X(coop_128x192_c2x1_e128x96, 128, 192, 64, 2, 1, kCooperative, 128, 96)
// Round 2: the 64xN ping-pong epilogue steps on the other ping-pong tiles and clusters.
#define OFK_EXPLORE_TILES_H(X)                                              \
  X(pp_128x128_c1_e64x128, 128, 128, 64, 1, 1, kPingpong, 64, 128)          \
  X(pp_128x128_c2x1_e64x128, 128, 128, 64, 2, 1, kPingpong, 64, 128)        \
  X(pp_64x128_c1, 64, 128, 64, 1, 1, kPingpong, 0, 0)
#define OFK_EXPLORE_TILES_I(X)                                              \
  X(pp_128x192_c1_e64x96, 128, 192, 64, 1, 1, kPingpong, 64, 96)            \
  X(coop_256x128_c2_e128x64, 256, 128, 64, 2, 1, kCooperative, 128, 64)

// The groups each build mode compiles into the harness, GROUP(letter) each, one line per mode: build.sh reads
// these lines for the objects it builds, harness.cu lists the groups' tactics past the shipped table.
#define OFK_EXPLORE_MODE_TILES(GROUP) GROUP(A) GROUP(B) GROUP(C) GROUP(D) GROUP(E)
#define OFK_EXPLORE_MODE_EPI(GROUP) GROUP(F) GROUP(G) GROUP(H) GROUP(I)
#define OFK_EXPLORE_MODE_SCHED(GROUP) GROUP(E) GROUP(J) GROUP(K) GROUP(L) GROUP(M) GROUP(N)
#define OFK_EXPLORE_MODE_GELU(GROUP) GROUP(L)
#define OFK_EXPLORE_MODE_INTRA(GROUP) GROUP(O) GROUP(P)
#define OFK_EXPLORE_MODE_THREE(GROUP) GROUP(Q) GROUP(R)
