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
// gemm_gelu_dispatch.cu), far slower than ORT there (bench/results/cuda_kernel_fp32_few_rows_h200.json); the gemv
// kernel or the fallback takes it.
constexpr int64_t kStrictF32MaxRows = 16;
// 16-bit problems with at most this many rows and at least this many weights are bound by reading W, where
// cuBLASLt's GEMV-like kernels read it faster than the fused kernel's tiles.
constexpr int64_t kWeightBoundMaxRows = 16;
constexpr int64_t kWeightBoundMinWeights = int64_t{1} << 25;
// From this many weights on, 16-bit calls of 5-16 rows (beyond the gemv kernel's reach) run the fallback, ahead of
// the fused kernel and of ORT (8x1024x4096, 16x768x3072 fp16); below it the fused kernel is ahead (16x384x1536)
// (bench/results/cuda_kernel_never_slower_h200.md; every path:
// cuda_kernel_never_slower_h200_fill_rows_visit.json.gz).
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
// gemv kernel is faster than the fused kernel and ORT (bench/results/cuda_kernel_gemv_small_w_h200.md: fp16 and
// bf16, 5-8 rows of eight W from 128x512 to 1024x1536), ties at 640x2560, and loses from 12 rows (from 2^19
// weights on).
constexpr int64_t kGemv16BitSmallWeightMaxRows = 8;
constexpr int64_t kGemvF32MaxRows = 16;
// float32 on a narrow, deep W (N < K) still takes the gemv kernel at one or two rows where its rows are 16-byte
// vectors: exact fp32 where the fallback and ORT run TF32 (2 rows) or cuBLAS's own fp32 gemv. Rows that are
// not (K = 4095) it reads 4 bytes a load, too few in flight for DRAM: back to back, with W in L2, it was ahead of
// ORT at 4095x1023 (bench/results/cuda_kernel_fp32_narrow_gemv_h200.json), but after other work has left L2 full
// of dirty lines, as in a model, it fell behind the fallback and ORT (lab/results/replay_probe_h200.txt, "cold";
// lab/kernels/replay_probe.py), so those rows take the fallback. 4 rows: the fallback everywhere.
constexpr int64_t kGemvF32NarrowMaxRows = 2;
// The next two rules decide where the swapped few-rows kernels do not run (gemm_gelu_runs_swapped: before
// Hopper, W [K, N], float32 rows that are not 16-byte vectors); on Hopper those kernels read such a W faster
// still (lab/results/swap_ab_probe_h200.txt).
// float32 with TF32 from 17 rows up to this many, reading a W of kWeightBoundMinWeights or more: the fallback,
// whose cuBLASLt kernel reads W faster than the fused kernel's tiles (64x4096x16384, over two grids; at 128 rows
// the fused kernel is ahead again: bench/results/cuda_kernel_never_slower_h200.md).
constexpr int64_t kF32WeightBoundMaxRows = 64;
// In exact fp32; with TF32 allowed, 5-8 rows run on the path's Tensor-Core kernel (gemv_uses_tf32), ahead of the
// fallback and ORT at 8x4096x16384 (bench/results/cuda_kernel_fp32_tf32_gemv_h200.json; the replay grids of
// bench/results/cuda_kernel_never_slower_h200.md). From 9 rows that kernel computes two tiles of 8 rows and loses
// to ORT, and to the fallback where its timing keeps a 64-row kernel: the fallback takes 9-16 rows, as it does
// 17-64.
constexpr int64_t kGemvF32LargeWeightMaxRows = kGemvExactF32MaxRows;
constexpr int64_t kGemvTf32MaxRows = 8;
static_assert(kWeightBoundMinWeights == kGemvTf32MinWeights, "one notion of a large W");
// 16-bit rows that are not 16-byte vectors (K not a multiple of 8, or an operand at an odd offset): the gemv
// kernel reads W an element at a time, which at one or two rows of a W at least as wide as deep still beats
// the fallback's cuBLASLt kernels for such rows, in bfloat16 most, and at 4 rows no longer, nor for a narrow,
// deep W (770x3074 and 4095x1023: bench/results/cuda_kernel_unaligned_few_rows_h200.json).
constexpr int64_t kGemvUnaligned16BitMaxRows = 2;

// 16-bit rows that are not 16-byte vectors, beyond the gemv kernel's reach, on the fused path's Tensor-Core
// kernels through aligned copies (row_vectors.h; RunFusedStaged). From this many rows and this many
// multiply-adds, such calls run the fused path through those copies (up to three more small kernels); below
// either, the fallback, as before. Staged, the fused path is ahead of the fallback and ORT from 64x770x3074 to
// 16384x4095x1023, and behind the fallback on a tiny problem (300x37x5: launches, not work)
// (bench/results/cuda_kernel_unaligned_staged_h200.json).
constexpr int64_t kStagedFusedMinRows = 64;
constexpr int64_t kStagedFusedMinMultiplyAdds = int64_t{1} << 27;
bool StagedFusedPays(const GemmGeluArgs& a) {
  return a.M >= kStagedFusedMinRows && a.M >= kStagedFusedMinMultiplyAdds / a.K / a.N;  // K, N > 0 here
}

}  // namespace

// float32 on the fallback whose rows are not 16-byte vectors: on a narrow, deep W (N < K) of at least this many
// weights, cuBLAS's kernels for the unaligned rows read W far below DRAM speed, and the same problem with K and N
// padded to multiples of 4 runs faster, the copy of X included, from 2 rows to 4096, back to back and after a
// 1 GiB write (lab/results/staged_fp32_probe_h200.txt, 4095x1023: ORT's MatMul on W [K, N], the op's W [N, K],
// padded, and the copy of X). Padding K alone gained nothing: Y's rows must be vectors too. A W at least as wide
// as deep gains nothing either (770x3074). At one row cuBLAS runs its exact fp32 GEMV, as ORT does, in either
// layout: left as it is. The padded problem takes cuBLAS's TF32 kernels exactly where the unpadded one did at
// that size (the same error, in the same file).
constexpr int64_t kStagedFallbackMinWeights = int64_t{1} << 21;
bool StagedFallbackPays(const GemmGeluArgs& a) {
  return a.dtype == DType::kFloat32 && a.M >= kStagedFallbackMinRows && a.N < a.K &&
         a.K * a.N >= kStagedFallbackMinWeights && !RowsAreVectors(a);
}

namespace {

// The built-in choice, where neither cuda_path nor a tuning table for this device decides. Measured
// (bench/results/cuda_kernel_gemv_h200.md and cuda_kernel_never_slower_h200.md: `bench/cuda_kernel.py --grid
// never-slower --paths`; GPU time by CUPTI of the fused path, the fallback, the gemv kernel and ORT's unfused
// MatMul+Add+Gelu):
//  - on Hopper, few rows of a W [N, K] at least as wide as deep (16-bit: up to 32 rows of 2^18+ weights; float32
//    with TF32: 2-32 rows of 2^21+, 64 of 2^25+): the fused path, whose dispatch runs its few-rows kernels with the
//    operands swapped (gemm_gelu_runs_swapped; the measurements in gemm_gelu_dispatch.cu); before them the gemv
//    kernel where it reaches (BuiltInPath). The rules below decide everything else:
//  - few rows, transB = 1: the gemv kernel, ahead of the other paths and of ORT in 16-bit and in float32, where
//    the fused path runs strict fp32 and is far behind (cuda_kernel_fp32_few_rows_h200.json). Beyond its reach
//    it loses: at 8x4096x16384 in 16-bit, and in float32 in exact fp32, where ORT's MatMul runs TF32 Tensor
//    Cores on W as [K, N] (every cuBLAS call on this op's [N, K] is slower than that GEMM:
//    lab/results/cublas_fp32_few_rows_h200.txt): with TF32 allowed the gemv path runs its TF32 kernel there
//    (gemv_uses_tf32) up to kGemvTf32MaxRows rows (cuda_kernel_fp32_tf32_gemv_h200.json);
//  - fp16/bf16 with 5-16 rows of a W of 2^21 weights or more: the fallback (kFewRowsFallbackMinWeights);
//  - fp16/bf16 whose rows are not 16-byte aligned (K or N not a multiple of 8, or an operand at an odd offset)
//    run the fused path on aligned copies (RunFusedStaged) from 64 rows of enough work (StagedFusedPays:
//    cuda_kernel_unaligned_staged_h200.json), else the fallback, but gemv at one or two rows
//    (kGemvUnaligned16BitMaxRows); the fused path's any-alignment WMMA kernel, far slower, runs only K = 0 and
//    float32 forced to the fused path;
//  - fp16/bf16 with up to 16 rows and a large W: 8x4096x16384 fp16 as above: fallback;
//  - float32 without TF32 in the fused path (onnxfuse.strict_fp32, or K or N not a multiple of 4) or with
//    at most kStrictF32MaxRows rows (which it runs strictly), beyond the gemv kernel's reach: the fallback
//    (from 2 rows of a large, narrow, deep W whose rows are not 16-byte vectors, on padded copies:
//    StagedFallbackPays, ahead of ORT from 2 rows to 16384 at 4095x1023: cuda_kernel_never_slower_h200.md,
//    "float32 on padded copies for a narrow, deep W"); with TF32 up to kF32WeightBoundMaxRows rows of a large W:
//    the fallback as well;
//  - everywhere else the fused path, faster than ORT (cuda_kernel_never_slower_h200.md).
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
// reaches in 16-bit: up to 4 rows (ahead of the swapped kernel, which is ahead from 5 rows), and up to 8 below
// kFewRowsFallbackMinWeights (5-8 rows of 256x1024 to 1024x1536, where gemv takes less of the regular kernel's time
// than the swapped kernel does; of those sizes only at 640x2560 would the swapped kernel be ahead, and gemv runs
// there too): bench/results/cuda_kernel_gemv_small_w_h200.md, cuda_kernel_swap_rows_h200.md,
// lab/results/kernels_v9_swap_rows_h200.txt. float32, which gemv reaches up to 16 rows, keeps it up to 4 (exact
// there) and runs the swapped kernel from 5, where that kernel is ahead.
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
