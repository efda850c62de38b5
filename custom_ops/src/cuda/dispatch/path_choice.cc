// The CUDA FusedLinearGelu's path choice (path_choice.h): the built-in rule's thresholds, each with the
// measurements behind it, and the tuning table's lookup.
#include "cuda/dispatch/path_choice.h"

#include <cstddef>
#include <vector>

#include "cuda/dispatch/row_vectors.h"
#include "cuda/kernels/gemv_gelu.h"

namespace onnxfuse::cuda {

static_assert(onnxfuse::kGemvMaxRows == kGemvMaxRows, "the attribute contract's gemv row limit is the kernel's");

namespace {

// float32 with at most this many rows: the fused dispatch runs it in strict fp32 (kStrictF32MaxRows in
// gemm_gelu_dispatch.cu), 5-7x slower than ORT there; the gemv kernel or the fallback takes it.
constexpr int64_t kStrictF32MaxRows = 16;
// 16-bit problems with at most this many rows and at least this many weights are bound by reading W, where
// cuBLASLt's GEMV-like kernels read it faster than the fused kernel's tiles.
constexpr int64_t kWeightBoundMaxRows = 16;
constexpr int64_t kWeightBoundMinWeights = int64_t{1} << 25;
// From this many weights on, 16-bit calls of 5-16 rows (beyond the gemv kernel's reach) run the fallback:
// 8x1024x4096 fp16 5.0 µs against the fused kernel's 6.4 and ORT's 6.3, 16x768x3072 4.7 / 5.0 / 6.3; below
// it the fused kernel is ahead (16x384x1536 3.6 / 4.0 fallback).
constexpr int64_t kFewRowsFallbackMinWeights = int64_t{1} << 21;
// The gemv kernel's measured reach (transB = 1, the layout the optimizer writes for constant weights): 16-bit
// with up to 4 rows below kWeightBoundMinWeights weights (8 below kFewRowsFallbackMinWeights), or one row of any
// W; float32 with up to 16 rows below that size, or up to 4 rows of any W (8 columns per group at 4 rows:
// gemv_gelu.cu), where W is at
// least as wide as it is deep (N >= K: the up-projections this op fuses; a narrow, deep W leaves too few
// columns to spread over the SMs, but for one or two float32 rows: kGemvF32NarrowMaxRows).
constexpr int64_t kGemv16BitMaxRows = 4;
// A W below kFewRowsFallbackMinWeights gives 5-8 rows to the regular fused kernel otherwise (the swapped kernel
// and the few-rows fallback start at that size), whose 64-row tiles compute 56+ rows that are not there: there the
// gemv kernel takes 0.72-0.96x the fused kernel's time (bench/results/cuda_kernel_gemv_small_w_h200.md: fp16 and
// bf16, 5-8 rows of eight W from 128x512 to 1024x1536; 8x384x1536 fp16 2.99 µs against 3.51, ORT 5.08), ties at
// 640x2560 (0.97-1.03), and loses from 12 rows (1.27-1.52x from 2^19 weights on).
constexpr int64_t kGemv16BitSmallWeightMaxRows = 8;
constexpr int64_t kGemvF32MaxRows = 16;
// float32 on a narrow, deep W (N < K) still takes the gemv kernel at one or two rows where its rows are 16-byte
// vectors: exact fp32 where the fallback and ORT run TF32 (2 rows) or cuBLAS's own fp32 gemv. Rows that are
// not (K = 4095) it reads 4 bytes a load, too few in flight for DRAM: back to back, with W in L2, it led
// (4095x1023, GPU µs gemv / fallback / ORT: 1 row 10.8 / 8.7 / 11.1; 2 rows 9.2 / 14.1 / 15.0), but after other
// work has left L2 full of dirty lines, as in a model, it ran 24.9 / 10.0 / 13.6 and 20.8 / 17.6 / 17.4
// (lab/kernels/replay_probe.py, "cold"), so those rows take the fallback. 4 rows: the fallback everywhere.
constexpr int64_t kGemvF32NarrowMaxRows = 2;
// The next two rules decide where the swapped few-rows kernels do not run (gemm_gelu_runs_swapped: before
// Hopper, W [K, N], float32 rows that are not 16-byte vectors); on Hopper those kernels read such a W faster
// still (16x4096x16384 66.4 µs, 64 rows 69.2).
// float32 with TF32 from 17 rows up to this many, reading a W of kWeightBoundMinWeights or more: the fallback,
// whose cuBLASLt kernel reads W faster than the fused kernel's tiles (64x4096x16384, GPU µs fallback / fused /
// ORT: 72.5-75.0 / 96.5-101.2 / 131-133 over two grids; at 128 rows 83 / 79 / 102: the fused kernel again).
constexpr int64_t kF32WeightBoundMaxRows = 64;
// In exact fp32; with TF32 allowed, 5-8 rows run on the path's Tensor-Core kernel (gemv_uses_tf32): 8x4096x16384
// 68.1-68.8 µs against the fallback's 74.6-90 and ORT's 72.6-75.2 (three replay grids). From 9 rows that
// kernel computes two tiles of 8 rows and loses (16 rows: 79-81 µs against the fallback's 74-76 where its
// timing keeps a 64-row kernel, and ORT's 74-78): the fallback takes 9-16 rows, as it does 17-64.
constexpr int64_t kGemvF32LargeWeightMaxRows = kGemvExactF32MaxRows;
constexpr int64_t kGemvTf32MaxRows = 8;
static_assert(kWeightBoundMinWeights == kGemvTf32MinWeights, "one notion of a large W");
// 16-bit rows that are not 16-byte vectors (K not a multiple of 8, or an operand at an odd offset): the gemv
// kernel reads W an element at a time, which at one or two rows of a W at least as wide as deep still beats
// the fallback's cuBLASLt kernels for such rows, in bfloat16 most (gemv / fallback / ORT, GPU µs, 770x3074:
// bf16 1 row 6.6 / 9.2 / 7.6, 2 rows 5.2 / 6.2 / 11.0; fp16 1 row 6.7 / 6.1 / 7.7, 2 rows 5.3 / 6.9 / 9.6), and
// at 4 rows no longer (9.1-9.3 / 6.9-9.3), nor for a narrow, deep W (4095x1023 fp16, 1 row: 13.7 / 8.4).
constexpr int64_t kGemvUnaligned16BitMaxRows = 2;

// 16-bit rows that are not 16-byte vectors, beyond the gemv kernel's reach, on the fused path's Tensor-Core
// kernels through aligned copies (row_vectors.h; RunFusedStaged). From this many rows and this many
// multiply-adds, such calls run the fused path through those copies (up to three more small kernels); below
// either, the fallback, as before. Measured on H200, fp16 GPU µs,
// staged / fallback / ORT: 64x770x3074 8.3 / 11.1 / 15.4, 4096x770x3074 72.0 / 146.1 / 214.7,
// 16384x4095x1023 290.1 / 1053.6 / 1072.7; but 300x37x5 6.4 / 3.2 (launches, not work).
constexpr int64_t kStagedFusedMinRows = 64;
constexpr int64_t kStagedFusedMinMultiplyAdds = int64_t{1} << 27;
bool StagedFusedPays(const GemmGeluArgs& a) {
  return a.M >= kStagedFusedMinRows && a.M >= kStagedFusedMinMultiplyAdds / a.K / a.N;  // K, N > 0 here
}

}  // namespace

// float32 on the fallback whose rows are not 16-byte vectors: on a narrow, deep W (N < K) of at least this many
// weights, cuBLAS's kernels for the unaligned rows read W far below DRAM speed, and the same problem with K and N
// padded to multiples of 4 runs 1.5-3x faster, the copy of X included (lab/results/staged_fp32_probe_h200.txt,
// GPU µs of the GEMM alone back to back / after a 1 GiB write, 4095x1023: ORT's MatMul on W [K, N] / the op's
// W [N, K] / padded, and the copy of X: 2 rows 12.4 / 12.4 / 8.1 and 1.3, cold 17.3 / 18.8 / 14.2; 64 rows
// 13.6 / 14.7 / 8.9 and 2.0; 1024 rows 75.6 / 76.6 / 34.3 and 11.6; 4096 rows 254.5 / 260.8 / 88.0 and 50.7).
// Padding K alone gained nothing (12.0 at 2 rows): Y's rows must be vectors too. A W at least as wide as deep
// gains nothing either (770x3074: 10.5 / 11.0 / 11.3 at 2 rows). At one row cuBLAS runs its exact fp32 GEMV,
// as ORT does, in either layout (7.5 / 6.6 + 0.8 for the copy): left as it is. The padded problem takes
// cuBLAS's TF32 kernels exactly where the unpadded one did at that size (error 3.0e-4 both, 2.1e-7 at one row).
constexpr int64_t kStagedFallbackMinWeights = int64_t{1} << 21;
bool StagedFallbackPays(const GemmGeluArgs& a) {
  return a.dtype == DType::kFloat32 && a.M >= kStagedFallbackMinRows && a.N < a.K &&
         a.K * a.N >= kStagedFallbackMinWeights && !RowsAreVectors(a);
}

namespace {

// The built-in choice, where neither cuda_path nor a tuning table for this device decides. Measured on H200
// (bench/results/cuda_kernel_gemv_h200.md and cuda_kernel_never_slower_h200.md: `bench/cuda_kernel.py --grid
// never-slower --paths`; GPU µs by CUPTI, fused / fallback / gemv / ORT's unfused MatMul+Add+Gelu):
//  - on Hopper, few rows of a W [N, K] at least as wide as deep (16-bit: up to 32 rows of 2^18+ weights; float32
//    with TF32: 2-32 rows of 2^21+, 64 of 2^25+): the fused path, whose dispatch runs its few-rows kernels with the
//    operands swapped (gemm_gelu_runs_swapped; the numbers in gemm_gelu_dispatch.cu); before them the gemv
//    kernel where it reaches (BuiltInPath). The rules below decide everything else:
//  - few rows, transB = 1: the gemv kernel: fp16 1x768x3072 5.1 / 4.5 / 2.5 / 5.5, 4x1024x4096 6.6 / 4.9 /
//    4.3 / 6.3; fp32 8x1024x4096 139 / 10.2 / 6.8 / 11.0, 16x768x3072 106 / 10.3 / 8.7 / 10.2, 16x1000x3000
//    137 / 12.7 / 10.8 / 11.3, 2x4096x16384 491 / 85.9 / 65.5 / 70.7, 4x4096x16384 491 / 82.0 / 65.6 / 70.7
//    (cuda_kernel_fp32_few_rows_h200.json). Beyond its reach it loses: 8x4096x16384 fp16 39.0 / 35.0 /
//    63.1 / 35.6; 8x4096x16384 fp32 490 / 78.6 / 78.2 / 72.0 in exact fp32, where ORT's MatMul runs TF32
//    Tensor Cores on W as [K, N] (65-68 µs for the GEMM; every cuBLAS call on this op's [N, K] takes 76-84:
//    lab/results/cublas_fp32_few_rows_h200.txt): with TF32 allowed the gemv path runs its TF32 kernel there
//    (gemv_uses_tf32) up to kGemvTf32MaxRows rows: 68-69 µs at 8 rows;
//  - fp16/bf16 with 5-16 rows of a W of 2^21 weights or more: the fallback (kFewRowsFallbackMinWeights);
//  - fp16/bf16 whose rows are not 16-byte aligned (K or N not a multiple of 8, or an operand at an odd offset)
//    run the fused path on aligned copies (RunFusedStaged) from 64 rows of enough work (StagedFusedPays:
//    4096x770x3074 72 / 146 / 215, 16384x4095x1023 290 / 1054 / 1073), else the fallback, but gemv at one or two
//    rows (kGemvUnaligned16BitMaxRows); the fused path's any-alignment WMMA kernel (606 µs at 4096x770x3074)
//    runs only K = 0 and float32 forced to the fused path;
//  - fp16/bf16 with up to 16 rows and a large W: 8x4096x16384 fp16 as above: fallback;
//  - float32 without TF32 in the fused path (onnxfuse.strict_fp32, or K or N not a multiple of 4) or with
//    at most kStrictF32MaxRows rows (which it runs strictly), beyond the gemv kernel's reach: the fallback
//    (from 2 rows of a large, narrow, deep W whose rows are not 16-byte vectors, on padded copies:
//    StagedFallbackPays; 4095x1023 GPU µs auto / ORT: 2 rows 11.3 / 14.6, 64 rows 13.1 / 16.6, 1024 rows
//    49.2 / 88.1, 16384 rows 513 / 1144); with TF32 up to kF32WeightBoundMaxRows rows of a large W: the
//    fallback as well;
//  - everywhere else the fused path, 1.1-3.3x faster than ORT (4096x768x3072 fp16 48 / 53 / 134 wall).
// `onnxfuse tune` writes per-node tables that override this on the measured device.
bool GemvReaches(const GemmGeluArgs& a) {
  if (!a.trans_b || a.M > kGemvMaxRows) return false;
  const bool large_w = a.K * a.N >= kWeightBoundMinWeights;
  if (a.dtype == DType::kFloat32) {
    if (a.N < a.K) return a.M <= kGemvF32NarrowMaxRows && !large_w && gemv_reads_vectors(a);
    if (!large_w) return a.M <= kGemvF32MaxRows;
    return a.M <= kGemvF32LargeWeightMaxRows || (gemv_uses_tf32(a) && a.M <= kGemvTf32MaxRows);
  }
  if (!gemv_reads_vectors(a)) return a.M <= kGemvUnaligned16BitMaxRows && a.N >= a.K && !large_w;
  if (a.M == 1) return true;
  if (a.K * a.N < kFewRowsFallbackMinWeights) return a.M <= kGemv16BitSmallWeightMaxRows;
  return a.M <= kGemv16BitMaxRows && !large_w;
}

// Where the swapped few-rows kernels run (gemm_gelu_runs_swapped), the gemv kernel still comes first wherever it
// reaches in 16-bit: up to 4 rows (GPU µs on H200, gemv / swapped: fp16 4x768x3072 3.4 / 4.1, 4x1024x4096 4.1 /
// 4.8; from 5 rows the swapped kernel: 8x1024x4096 5.4 / 4.4), and up to 8 below kFewRowsFallbackMinWeights (5-8
// rows in 0.72-0.90x the regular kernel's time where the swapped kernel takes 0.80-0.97x, 256x1024 to 1024x1536;
// bench/results/cuda_kernel_gemv_small_w_h200.md, lab/results/kernels_v9_swap_rows_h200.txt; but at 640x2560, where
// the swapped kernel would be ahead: 0.85x against 0.97-1.02x). float32, which gemv reaches up to 16 rows, keeps it
// up to 4 (exact there) and runs the swapped kernel from 5 (fp32 8x768x3072 6.2 / 5.3, 16x1024x4096 10.7 / 5.9).
constexpr int64_t kGemvF32BeforeSwappedMaxRows = 4;

}  // namespace

CudaPath BuiltInPath(const GemmGeluArgs& a, const DeviceInfo& dev) {
  if (gemm_gelu_runs_swapped(a, dev)) {
    const bool gemv_first = GemvReaches(a) && (a.dtype != DType::kFloat32 || a.M <= kGemvF32BeforeSwappedMaxRows);
    return gemv_first ? CudaPath::kGemv : CudaPath::kFused;
  }
  if (GemvReaches(a)) return CudaPath::kGemv;
  if (a.dtype == DType::kFloat32) {
    if (!a.allow_tf32 || a.M <= kStrictF32MaxRows) return CudaPath::kFallback;
    const bool weight_bound = a.M <= kF32WeightBoundMaxRows && a.K * a.N >= kWeightBoundMinWeights;
    return weight_bound ? CudaPath::kFallback : CudaPath::kFused;
  }
  if (!RowsAreVectors(a)) return StagedFusedPays(a) ? CudaPath::kFused : CudaPath::kFallback;
  const bool weight_bound = a.M <= kWeightBoundMaxRows && a.K * a.N >= kFewRowsFallbackMinWeights;
  return weight_bound ? CudaPath::kFallback : CudaPath::kFused;
}

namespace {

// The tuning table's path for a call of `rows` rows: the path of the first bound rows <= tuned_max_rows[i], the
// last path beyond the last bound (the table's contract: contract/fused_linear_gelu_common.h).
CudaPath TunedPath(const CudaPathAttributes& attrs, int64_t rows) {
  const std::vector<int64_t>& bounds = attrs.tuned_max_rows;
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (rows <= bounds[i]) return attrs.tuned_paths[i];
  }
  return attrs.tuned_paths.back();
}

}  // namespace

CudaPath ChooseCudaPath(const GemmGeluArgs& a, const DeviceInfo& dev, const CudaPathAttributes& attrs,
                        bool table_applies, bool fallback_available) {
  if (a.K == 0) return CudaPath::kFused;
  if (attrs.path != CudaPath::kAuto) return attrs.path;
  CudaPath chosen = BuiltInPath(a, dev);
  if (table_applies) chosen = TunedPath(attrs, a.M);
  return chosen == CudaPath::kFallback && !fallback_available ? CudaPath::kFused : chosen;
}

}  // namespace onnxfuse::cuda
