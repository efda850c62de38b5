// launch_gemm_gelu: picks a tactic for (dtype, layout, shape, device) from a small ordered table and launches
// it. Order of preference: the sm90 tile the shape table names, the other sm90 tiles, the sm80 kernel, the
// any-alignment fallback. Each tactic's can_implement decides whether it takes the problem; one that refuses
// passes to the next, so an unusual shape costs speed, never a crash. Nothing here allocates, synchronizes or
// keeps mutable state (the rows' tactics are looked up by name once, in a thread-safe static, and only read
// after): concurrent calls from several ORT sessions are safe.
#include <array>
#include <cstring>

#include "tactics.cuh"

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

const Tactic kTactics[] = {
    ONNXFUSE_SM90_TILES_16BIT(F16_TN)   //
    ONNXFUSE_SM90_TILES_16BIT(F16_NN)   //
    ONNXFUSE_SM90_TILES_16BIT(BF16_TN)  //
    ONNXFUSE_SM90_TILES_16BIT(BF16_NN)  //
    ONNXFUSE_SM90_TILES_TF32(TF32_TN)   //
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
// rewrite the rows. Measured on H200, fp16 GPU us, erf form (lab/results/kernels_v3_*.json and
// kernels_v7_overlap.json.gz, lab/kernels/NOTES.md v3 and v7):
//  - up to a wave, the overlapped ping-pong kernel's 64x64 tiles (most CTAs; 128x768x3072 4.7, 512x768x3072
//    8.4), but 64x128 from a third to half a wave (197x768x3072: 6.5 vs 7.2) and with K >= 1024
//    (512x1024x4096: 10.1 vs 12.1; 128x4096x16384: 39.9 vs 42.9);
//  - long K beyond a wave: ping-pong 128x128, X multicast, CUTLASS's epilogue steps (one more main-loop
//    stage: 8192x4096x16384 1755 vs 2297 with 64x128 steps);
//  - 1-2 waves: overlapped 64x128 (1024x768x3072: 12.0 vs 12.7 for cooperative 128x192 with W multicast;
//    1024x1024x4096: 17.0 vs 25.4);
//  - more: ping-pong 128x128 with 64x128 epilogue steps (16384x768x3072: 132.3 vs 134.7 overlapped, 151.9
//    cooperative 128x192; 2048x768x3072: 21.0 vs 21.2 overlapped);
//  - TF32: cooperative 256x128 at 1-2 waves and at long K, where its larger MMA per byte wins
//    (8192x4096x16384: 3521 us vs 4309), else ping-pong.
struct ShapeRule {
  bool tf32;         // row for float32 (TF32) instead of 16-bit operands
  double max_waves;  // (M/128)·(N/128) / SMs at most this
  int64_t min_k;     // K at least this
  const char* tile;  // the tile's suffix in the tactic name
};
constexpr ShapeRule kShapeTable[] = {
    {false, 0.3, 0, "ppo_64x64_c1"},
    {false, 0.5, 0, "ppo_64x128_c1"},
    {false, 1.0, 1024, "ppo_64x128_c1"},
    {false, 1.0, 0, "ppo_64x64_c1"},
    {false, 1e300, 2048, "pp_128x128_c1x2"},
    {false, 2.0, 0, "ppo_64x128_c1"},
    {false, 1e300, 0, "pp_128x128_c1x2_e64x128"},
    {true, 0.5, 0, "pp_64x64_c1"},
    {true, 1.0, 0, "pp_128x128_c1"},
    {true, 2.0, 0, "coop_256x128_c2"},
    {true, 1e300, 2048, "coop_256x128_c2"},
    {true, 1e300, 0, "pp_128x128_c1"},
};

// float32 with few rows is bound by reading W, not by math: it runs at full fp32 accuracy (3xTF32 or
// fp32 FMAs) for free, matching cuBLAS, which uses no TF32 for such matrix-vector-like products.
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

int pick(const GemmGeluArgs& a, const DeviceInfo& dev) {
  if (dev.cc_major == 9 && dev.cc_minor == 0 && dev.sm_count > 0) {
    const double tiles = static_cast<double>((a.M + 127) / 128) * static_cast<double>((a.N + 127) / 128);
    const double waves = tiles / dev.sm_count;
    const bool tf32 = a.dtype == DType::kFloat32;
    for (int r = 0; r < kRuleCount; ++r) {
      const ShapeRule& rule = kShapeTable[r];
      if (rule.tf32 != tf32 || waves > rule.max_waves || a.K < rule.min_k) continue;
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

GemmGeluArgs effective(GemmGeluArgs a) {
  if (a.dtype == DType::kFloat32 && a.M <= kStrictF32MaxRows) a.allow_tf32 = false;
  return a;
}

}  // namespace

int gemm_gelu_tactic_count() { return kTacticCount; }
const Tactic& gemm_gelu_tactic_at(int index) { return kTactics[index]; }

GemmGeluPlan plan_gemm_gelu(const GemmGeluArgs& given, const DeviceInfo& dev) {
  const GemmGeluArgs args = effective(given);
  GemmGeluPlan plan;
  if (empty_problem(args) || args.M < 0 || args.N < 0 || args.K < 0) return plan;
  plan.tactic = pick(args, dev);
  if (plan.tactic >= 0) plan.workspace_bytes = kTactics[plan.tactic].workspace(args, dev);
  return plan;
}

cudaError_t launch_gemm_gelu(const GemmGeluPlan& plan, const GemmGeluArgs& given, const DeviceInfo& dev,
                             void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const GemmGeluArgs args = effective(given);
  if (args.M < 0 || args.N < 0 || args.K < 0) return cudaErrorInvalidValue;
  if (empty_problem(args)) return cudaSuccess;  // nothing to write; K = 0 alone still writes act(bias)
  if (plan.tactic < 0 || plan.tactic >= kTacticCount) return cudaErrorNotSupported;
  return kTactics[plan.tactic].run(args, dev, workspace, workspace_bytes, stream);
}

const char* gemm_gelu_tactic_name(const GemmGeluArgs& given, const DeviceInfo& dev) {
  const GemmGeluArgs args = effective(given);
  if (empty_problem(args)) return "none (empty output)";
  const int i = pick(args, dev);
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
