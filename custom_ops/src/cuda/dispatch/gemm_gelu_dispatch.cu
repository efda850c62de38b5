// launch_gemm_gelu: picks a tactic for (dtype, layout, shape, device) from a small ordered table and launches
// it. Order of preference: the sm90 tile the shape table names, the other sm90 tiles, the sm80 kernel, the
// any-alignment fallback. Each tactic's can_implement decides whether it takes the problem; one that refuses
// passes to the next, so an unusual shape costs speed, never a crash. Nothing here allocates, synchronizes or
// keeps mutable state (the rows' tactics are looked up by name once, in a thread-safe static, and only read
// after): concurrent calls from several ORT sessions are safe.
#include <array>
#include <cstdint>
#include <cstring>

#include "cuda/dispatch/tactics.cuh"

namespace onnxfuse::cuda {
namespace {

template <DType D, bool TransB, Sm80Math Math>
constexpr Tactic sm80_tactic(const char* name) {
  using T = Sm80Tactic<Sm80Config<D, TransB, Math>>;
  return Tactic{name, &T::can_implement, &T::workspace, &T::run};
}

size_t no_workspace(const GemmGeluArgs&, const DeviceInfo&) { return 0; }

#define SM90_16BIT(D, DN, TB, LN, name, TM, TN, TK, CM, CN, SCHED, EM, EN) \
  sm90_tactic<DType::D, TB, TM, TN, TK, CM, CN, Sm90Schedule::SCHED, EM, EN>("sm90_" DN "_" LN "_" #name),

// The whole table. Index order matters only inside one (dtype, layout): the first that fits wins unless
// the shape table below names a better one.
#define F16_TN(name, TM, TN, TK, CM, CN, SCHED, EM, EN) \
  SM90_16BIT(kFloat16, "f16", true, "tn", name, TM, TN, TK, CM, CN, SCHED, EM, EN)
#define F16_NN(name, TM, TN, TK, CM, CN, SCHED, EM, EN) \
  SM90_16BIT(kFloat16, "f16", false, "nn", name, TM, TN, TK, CM, CN, SCHED, EM, EN)
#define BF16_TN(name, TM, TN, TK, CM, CN, SCHED, EM, EN) \
  SM90_16BIT(kBFloat16, "bf16", true, "tn", name, TM, TN, TK, CM, CN, SCHED, EM, EN)
#define BF16_NN(name, TM, TN, TK, CM, CN, SCHED, EM, EN) \
  SM90_16BIT(kBFloat16, "bf16", false, "nn", name, TM, TN, TK, CM, CN, SCHED, EM, EN)
#define TF32_TN(name, TM, TN, TK, CM, CN, SCHED, EM, EN) \
  SM90_16BIT(kFloat32, "tf32", true, "tn", name, TM, TN, TK, CM, CN, SCHED, EM, EN)
#define SM90_SWAP(D, DN, name, TW, TX, TK, SCHED) \
  sm90_swap_tactic<DType::D, TW, TX, TK, Sm90Schedule::SCHED>("sm90_" DN "_tn_" #name),
#define F16_SWAP(name, TW, TX, TK, SCHED) SM90_SWAP(kFloat16, "f16", name, TW, TX, TK, SCHED)
#define BF16_SWAP(name, TW, TX, TK, SCHED) SM90_SWAP(kBFloat16, "bf16", name, TW, TX, TK, SCHED)
#define TF32_SWAP(name, TW, TX, TK, SCHED) SM90_SWAP(kFloat32, "tf32", name, TW, TX, TK, SCHED)

const Tactic kTactics[] = {
    ONNXFUSE_SM90_TILES_16BIT(F16_TN)   //
    ONNXFUSE_SM90_TILES_16BIT(F16_NN)   //
    ONNXFUSE_SM90_TILES_16BIT(BF16_TN)  //
    ONNXFUSE_SM90_TILES_16BIT(BF16_NN)  //
    ONNXFUSE_SM90_TILES_TF32(TF32_TN)   //
    ONNXFUSE_SM90_SWAP_TILES_16BIT(F16_SWAP)   //
    ONNXFUSE_SM90_SWAP_TILES_16BIT(BF16_SWAP)  //
    ONNXFUSE_SM90_SWAP_TILES_TF32(TF32_SWAP)   //
    sm80_tactic<DType::kFloat16, true, Sm80Math::kTensorOp>("sm80_f16_tn_128x128x32"),
    sm80_tactic<DType::kFloat16, false, Sm80Math::kTensorOp>("sm80_f16_nn_128x128x32"),
    sm80_tactic<DType::kBFloat16, true, Sm80Math::kTensorOp>("sm80_bf16_tn_128x128x32"),
    sm80_tactic<DType::kBFloat16, false, Sm80Math::kTensorOp>("sm80_bf16_nn_128x128x32"),
    sm80_tactic<DType::kFloat32, true, Sm80Math::kTensorOp>("sm80_tf32_tn_128x128x16"),
    sm80_tactic<DType::kFloat32, false, Sm80Math::kTensorOp>("sm80_tf32_nn_128x128x16"),
    sm80_tactic<DType::kFloat32, true, Sm80Math::kFastF32>("sm80_3xtf32_tn_128x128x16"),
    sm80_tactic<DType::kFloat32, false, Sm80Math::kFastF32>("sm80_3xtf32_nn_128x128x16"),
    Tactic{"fallback_wmma_64x64", &fallback_can_implement, &no_workspace, &fallback_run},
};
constexpr int kTacticCount = static_cast<int>(sizeof(kTactics) / sizeof(kTactics[0]));

// The shape table: which sm90 tile to try first, by operand width, by how many 128x128 output tiles the
// problem has relative to the number of SMs ("waves") and by K. The first row that matches wins; a tuner can
// rewrite the rows. Each row's tile was the fastest of its band, fp16 GPU time with the erf form
// (lab/results/kernels_v3_*.json, kernels_v7_overlap.json.gz, kernels_v8_forms_h200.txt and
// kernels_v10_three_groups_h200.txt; lab/kernels/NOTES.md v3, v7, v8 and v10; tactics.cuh says why each tile):
//  - up to a wave, the overlapped ping-pong kernel's 64x64 tiles (most CTAs), but 64x128 from a third to half a
//    wave and with K >= 1024;
//  - long K beyond a wave: ping-pong 128x128, X multicast, CUTLASS's epilogue steps (one more main-loop stage
//    than with 64x128 steps);
//  - 1-2 waves: overlapped 64x128 (ahead of cooperative 128x192 with W multicast);
//  - more, at K <= 512: the overlapped kernel on 128x128 with three consumer warpgroups, two epilogues beside
//    each main loop where a tile's epilogue outlasts its main loop (NOTES.md v10; the product A/B:
//    bench/results/cuda_kernel_three_groups_h200.md);
//  - more: ping-pong 128x128 with 64x128 epilogue steps (ahead of the overlapped kernel and of cooperative
//    128x192);
//  - TF32: cooperative 256x128 at 1-2 waves and at long K, where its larger MMA per byte wins, else ping-pong.
constexpr int64_t kAnyK = INT64_MAX;
struct ShapeRule {
  bool tf32;         // row for float32 (TF32) instead of 16-bit operands
  double max_waves;  // (M/128)·(N/128) / SMs at most this
  int64_t min_k;     // K at least this
  int64_t max_k;     // K at most this
  const char* tile;  // the tile's suffix in the tactic name
};
constexpr ShapeRule kShapeTable[] = {
    {false, 0.3, 0, kAnyK, "ppo_64x64_c1"},
    {false, 0.5, 0, kAnyK, "ppo_64x128_c1"},
    {false, 1.0, 1024, kAnyK, "ppo_64x128_c1"},
    {false, 1.0, 0, kAnyK, "ppo_64x64_c1"},
    {false, 1e300, 2048, kAnyK, "pp_128x128_c1x2"},
    {false, 2.0, 0, kAnyK, "ppo_64x128_c1"},
    {false, 1e300, 0, 512, "ppo3_128x128_c1x2"},
    {false, 1e300, 0, kAnyK, "pp_128x128_c1x2_e64x128"},
    {true, 0.5, 0, kAnyK, "pp_64x64_c1"},
    {true, 1.0, 0, kAnyK, "pp_128x128_c1"},
    {true, 2.0, 0, kAnyK, "coop_256x128_c2"},
    {true, 1e300, 2048, kAnyK, "coop_256x128_c2"},
    {true, 1e300, 0, kAnyK, "pp_128x128_c1"},
};

// Few rows of W [N, K] on Hopper: the kernels with the operands swapped (ONNXFUSE_SM90_SWAP_TILES_*), which
// read W once and compute only the rows that exist. Measured back to back, erf form, against the regular kernel
// and the fallback (lab/kernels/NOTES.md, "Swap-AB for few rows"; lab/results/swap_ab_probe_h200.txt and
// kernels_v9_swap_rows_h200.txt; bench/results/cuda_kernel_swap_rows_h200.md and the never-slower grids):
//  - W at least as wide as deep (N >= K, the up-projections this op fuses, where it was measured): a narrow, deep
//    W has too few strips of rows to spread over the SMs;
//  - 16-bit up to 32 rows (kSwap16BitMaxRows) of a W of 2^18 weights or more (kSwap16BitMinWeights): ahead of
//    both at 9-32 rows for every W from 256x1024 to 4096x16384; at 40-48 rows a tie below 2^21 weights and behind
//    from 768x3072 on, and at 64 rows the regular kernel is ahead. Below 2^18 weights a call is launch-bound and
//    the two are as quick. (At 5-8 rows of a W below 2^21 weights the op's gemv kernel runs before either:
//    path_choice.cc.)
//  - float32 on TF32 from 2 rows (kSwapF32MinRows): at one row ORT's MatMul runs cuBLAS's exact fp32
//    matrix-vector kernel, as the strict kernel does, where TF32 would not be exact (each path's error:
//    bench/results/cuda_kernel_fp32_narrow_gemv_h200.json);
//  - float32 on TF32 up to 32 rows (kSwapF32MaxRows) on 64-row strips, ahead of the strict kernel and of the
//    fallback; at 64 rows a tie with the regular kernel, which keeps them;
//  - float32 on TF32 up to 64 rows of a W of 2^25+ weights (kSwapLargeWeights) on 128x32 cooperative tiles,
//    ahead of the strict kernel and of the fallback.
constexpr int64_t kSwapMinWeights = int64_t{1} << 21;  // float32
constexpr int64_t kSwapLargeWeights = int64_t{1} << 25;
constexpr int64_t kSwap16BitMinWeights = int64_t{1} << 18;
constexpr int64_t kSwap16BitMaxRows = 32;
constexpr int64_t kSwapF32MinRows = 2;
constexpr int64_t kSwapF32MaxRows = 32;
constexpr int64_t kSwapF32LargeWeightMaxRows = 64;

// float32 with few rows runs in strict fp32 (3xTF32 or fp32 FMAs) where no swapped kernel takes it: at one row
// that is ORT's own precision (above). It is slow there (the forced fused path:
// bench/results/cuda_kernel_fp32_few_rows_h200.json); the built-in path choice gives such calls the gemv kernel
// or the fallback, so only a fused path forced by cuda_path runs it.
constexpr int64_t kStrictF32MaxRows = 16;

bool ends_with(const char* s, const char* suffix) {
  const size_t ls = std::strlen(s), lx = std::strlen(suffix);
  return ls >= lx && std::strcmp(s + ls - lx, suffix) == 0;
}

constexpr int kRuleCount = static_cast<int>(sizeof(kShapeTable) / sizeof(kShapeTable[0]));

// The sm90 tactics each shape-table row names (one per dtype and layout that has the tile), found by name
// once per process rather than on every call.
struct RuleTactics {
  int index[8];
  int count = 0;
};
const RuleTactics* rule_tactics() {
  static const auto table = [] {
    std::array<RuleTactics, kRuleCount> t{};
    for (int r = 0; r < kRuleCount; ++r)
      for (int i = 0; i < kTacticCount && t[r].count < 8; ++i)
        if (std::strncmp(kTactics[i].name, "sm90_", 5) == 0 && ends_with(kTactics[i].name, kShapeTable[r].tile))
          t[r].index[t[r].count++] = i;
    return t;
  }();
  return table.data();
}

int find_tactic(const char* name) {
  for (int i = 0; i < kTacticCount; ++i)
    if (std::strcmp(kTactics[i].name, name) == 0) return i;
  return -1;
}

// The swapped tactic the few-rows rule names for these arguments, or -1 (no rule, or the tile cannot take the
// problem: not Hopper, W [K, N], rows that are not 16-byte vectors, float32 without TF32).
int pick_swapped(const GemmGeluArgs& a, const DeviceInfo& dev) {
  if (!a.trans_b || a.M <= 0 || a.K <= 0 || a.N < a.K) return -1;
  const int64_t weights = a.K * a.N;
  static const int f16 = find_tactic("sm90_f16_tn_swap_64x16_pp"), bf16 = find_tactic("sm90_bf16_tn_swap_64x16_pp"),
                   tf32_strips = find_tactic("sm90_tf32_tn_swap_64x16_pp"),
                   tf32_wide = find_tactic("sm90_tf32_tn_swap_128x32_coop");
  int tactic = -1;
  if (a.dtype == DType::kFloat32) {
    const bool large_w = weights >= kSwapLargeWeights;
    if (weights < kSwapMinWeights || a.M < kSwapF32MinRows) return -1;
    if (large_w && a.M <= kSwapF32LargeWeightMaxRows) tactic = tf32_wide;
    else if (!large_w && a.M <= kSwapF32MaxRows) tactic = tf32_strips;
  } else if (weights >= kSwap16BitMinWeights && a.M <= kSwap16BitMaxRows) {
    tactic = a.dtype == DType::kFloat16 ? f16 : bf16;
  }
  return tactic >= 0 && kTactics[tactic].can_implement(a, dev) ? tactic : -1;
}

// The regular tactics: the shape table's sm90 tile, else the first in the table that takes the problem.
int pick_regular(const GemmGeluArgs& a, const DeviceInfo& dev) {
  if (dev.cc_major == 9 && dev.cc_minor == 0 && dev.sm_count > 0) {
    const double tiles = static_cast<double>((a.M + 127) / 128) * static_cast<double>((a.N + 127) / 128);
    const double waves = tiles / dev.sm_count;
    const bool tf32 = a.dtype == DType::kFloat32;
    for (int r = 0; r < kRuleCount; ++r) {
      const ShapeRule& rule = kShapeTable[r];
      if (rule.tf32 != tf32 || waves > rule.max_waves || a.K < rule.min_k || a.K > rule.max_k) continue;
      const RuleTactics& named = rule_tactics()[r];
      for (int j = 0; j < named.count; ++j)
        if (kTactics[named.index[j]].can_implement(a, dev)) return named.index[j];
      break;
    }
  }
  for (int i = 0; i < kTacticCount; ++i)
    if (kTactics[i].can_implement(a, dev)) return i;
  return -1;
}

bool empty_problem(const GemmGeluArgs& a) { return a.M == 0 || a.N == 0; }

// The arguments as the plan's tactic runs them.
GemmGeluArgs as_planned(GemmGeluArgs a, const GemmGeluPlan& plan) {
  if (plan.strict_f32) a.allow_tf32 = false;
  return a;
}

// The whole choice for a non-empty problem: the swapped tactic where the few-rows rule names one, else the
// regular tactics on the arguments the strict-fp32 rule leaves (plan.strict_f32). One call of pick_swapped: its
// can_implement builds CUTLASS's arguments, and this runs on every call.
GemmGeluPlan choose(const GemmGeluArgs& given, const DeviceInfo& dev) {
  GemmGeluPlan plan;
  plan.tactic = pick_swapped(given, dev);
  if (plan.tactic < 0) {
    plan.strict_f32 = given.dtype == DType::kFloat32 && given.M <= kStrictF32MaxRows;
    plan.tactic = pick_regular(as_planned(given, plan), dev);
  }
  return plan;
}

}  // namespace

int gemm_gelu_tactic_count() { return kTacticCount; }
const Tactic& gemm_gelu_tactic_at(int index) { return kTactics[index]; }

GemmGeluPlan plan_gemm_gelu(const GemmGeluArgs& given, const DeviceInfo& dev) {
  if (empty_problem(given) || given.M < 0 || given.N < 0 || given.K < 0) return GemmGeluPlan{};
  GemmGeluPlan plan = choose(given, dev);
  if (plan.tactic >= 0) plan.workspace_bytes = kTactics[plan.tactic].workspace(as_planned(given, plan), dev);
  return plan;
}

cudaError_t launch_gemm_gelu(const GemmGeluPlan& plan, const GemmGeluArgs& given, const DeviceInfo& dev,
                             void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const GemmGeluArgs args = as_planned(given, plan);
  if (args.M < 0 || args.N < 0 || args.K < 0) return cudaErrorInvalidValue;
  if (empty_problem(args)) return cudaSuccess;  // nothing to write; K = 0 alone still writes act(bias)
  if (plan.tactic < 0 || plan.tactic >= kTacticCount) return cudaErrorNotSupported;
  return kTactics[plan.tactic].run(args, dev, workspace, workspace_bytes, stream);
}

bool gemm_gelu_runs_swapped(const GemmGeluArgs& args, const DeviceInfo& dev) {
  return !empty_problem(args) && pick_swapped(args, dev) >= 0;
}

const char* gemm_gelu_tactic_name(const GemmGeluArgs& args, const DeviceInfo& dev) {
  if (empty_problem(args)) return "none (empty output)";
  const int i = choose(args, dev).tactic;
  return i < 0 ? "none (unsupported)" : kTactics[i].name;
}

cudaError_t launch_gemm_gelu_with_tactic(int index, const GemmGeluArgs& args, const DeviceInfo& dev,
                                         void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (index < 0 || index >= kTacticCount) return cudaErrorInvalidValue;
  if (empty_problem(args)) return cudaSuccess;
  if (!kTactics[index].can_implement(args, dev)) return cudaErrorNotSupported;
  return kTactics[index].run(args, dev, workspace, workspace_bytes, stream);
}

}  // namespace onnxfuse::cuda
