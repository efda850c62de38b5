// The ORT side of the CUDA FusedLinearGelu kernel: reads the node once, validates each call's tensors,
// chooses the call's path and hands plain pointers and sizes to it on ORT's compute stream:
//   "fused":    launch_gemm_gelu (gemm_gelu.h), one GEMM+bias+activation kernel; 16-bit rows that are not
//               16-byte vectors reach it through aligned copies (copy_rows.h, RunFusedStaged);
//   "fallback": cuBLASLt's GEMM with its bias epilogue (cublaslt_gemm_bias.h), then the activation in place
//               (activation_inplace.h): ORT's own two kernels, for the shapes where the fused path has only
//               its any-alignment kernel and would run slower than the graph it replaced; float32 on a large,
//               narrow, deep W whose rows are not 16-byte vectors through padded copies (RunFallbackStaged);
//   "gemv":     launch_gemv_gelu (gemv_gelu.h), one kernel for calls with at most 16 rows, bound by reading W.
// The node's cuda_path / tuned_* attributes (fused_linear_gelu_common.h) steer the choice (ChoosePath).
//
// Thread safety: ORT may call Compute on one kernel instance from several threads at once (concurrent
// Session::Run). Everything the kernel keeps is written in its constructor and only read afterwards (the
// staged copies of a constant W and B included), except the fallback's algorithm cache, which guards itself
// (CublasLtGemmBias).
#include "cuda/ops/fused_linear_gelu_cuda.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "domain.h"
#include "contract/fused_linear_gelu_common.h"
#include "cuda/kernels/activation_inplace.h"
#include "cuda/kernels/copy_rows.h"
#include "cuda/dispatch/cublaslt_gemm_bias.h"
#include "cuda/dispatch/device_signature.h"
#include "cuda/dispatch/gemm_gelu.h"
#include "cuda/kernels/gemv_gelu.h"

namespace onnxfuse {
namespace {

static_assert(kGemvMaxRows == cuda::kGemvMaxRows, "the attribute contract's gemv row limit is the kernel's");

constexpr const char* kCudaProvider = "CUDAExecutionProvider";

[[noreturn]] void Fail(OrtErrorCode code, const std::string& message) { throw Ort::Exception(std::string(message), code); }

const char* TypeName(ONNXTensorElementDataType t) {
  switch (t) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return "float32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return "float16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return "bfloat16";
    default: return "unsupported";
  }
}

cuda::DType ToDType(ONNXTensorElementDataType t) {
  switch (t) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return cuda::DType::kFloat16;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return cuda::DType::kBFloat16;
    default: return cuda::DType::kFloat32;
  }
}

std::string CudaErrorText(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")";
}

// "1" → true, "0" or absent → false; anything else is a configuration mistake worth reporting.
bool ReadStrictFp32(const OrtKernelInfo* info) {
  Ort::KeyValuePairs config = Ort::ConstKernelInfo{info}.GetConfigEntries();
  const char* value = config.GetValue(kStrictFp32ConfigKey);
  if (value == nullptr || std::strcmp(value, "0") == 0) return false;
  if (std::strcmp(value, "1") == 0) return true;
  Fail(ORT_INVALID_ARGUMENT, std::string("session config ") + kStrictFp32ConfigKey + "='" + value +
                                 "' must be '0' (TF32 Tensor Cores, the default) or '1' (strict fp32)");
}

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
constexpr int64_t kGemvF32LargeWeightMaxRows = cuda::kGemvExactF32MaxRows;
constexpr int64_t kGemvTf32MaxRows = 8;
static_assert(kWeightBoundMinWeights == cuda::kGemvTf32MinWeights, "one notion of a large W");
// 16-bit rows that are not 16-byte vectors (K not a multiple of 8, or an operand at an odd offset): the gemv
// kernel reads W an element at a time, which at one or two rows of a W at least as wide as deep still beats
// the fallback's cuBLASLt kernels for such rows, in bfloat16 most (gemv / fallback / ORT, GPU µs, 770x3074:
// bf16 1 row 6.6 / 9.2 / 7.6, 2 rows 5.2 / 6.2 / 11.0; fp16 1 row 6.7 / 6.1 / 7.7, 2 rows 5.3 / 6.9 / 9.6), and
// at 4 rows no longer (9.1-9.3 / 6.9-9.3), nor for a narrow, deep W (4095x1023 fp16, 1 row: 13.7 / 8.4).
constexpr int64_t kGemvUnaligned16BitMaxRows = 2;

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Operands whose rows are 16-byte vectors (K and N multiples of 8 elements of 16 bits or 4 of float32, every
// operand at a 16-byte address): what the fused path's Tensor-Core kernels read and write, and what cuBLAS reads
// fastest. Other rows are staged through aligned copies padded to `vector` columns (RunFusedStaged,
// RunFallbackStaged).
int64_t ElementBytes(cuda::DType d) { return d == cuda::DType::kFloat32 ? 4 : 2; }
int64_t VectorElements(cuda::DType d) { return 16 / ElementBytes(d); }
int64_t RoundUpToVector(int64_t n, int64_t vector) { return (n + vector - 1) / vector * vector; }
bool RowsAreVectors(const void* p, int64_t cols, int64_t vector) { return Aligned16(p) && cols % vector == 0; }
// A [rows, cols] operand the aligned kernels can read as it is on the padded problem: rows of 16-byte vectors
// and no rows to add (rows_pad, what the padded problem reads of them). The constructor and each call stage
// by this one test, so a constant staged once is the copy a call would have made.
bool ReadAsIs(const void* p, int64_t rows, int64_t cols, int64_t rows_pad, int64_t vector) {
  return RowsAreVectors(p, cols, vector) && rows == rows_pad;
}
// The copy of a [rows, cols] operand into [rows_pad, cols_pad] rows padded with zeros.
cuda::RowCopy PaddedCopy(void* dst, const void* src, int64_t rows, int64_t cols, int64_t rows_pad, int64_t cols_pad) {
  return {dst, cols_pad, rows_pad, cols_pad, src, cols, rows, cols};
}
bool RowsAreVectors(const cuda::GemmGeluArgs& a) {
  const int64_t v = VectorElements(a.dtype);
  return RowsAreVectors(a.x, a.K, v) && RowsAreVectors(a.w, a.trans_b ? a.K : a.N, v) && RowsAreVectors(a.y, a.N, v) &&
         (a.bias == nullptr || RowsAreVectors(a.bias, a.N, v));
}
// From this many rows and this many multiply-adds, such 16-bit calls run the fused path through those copies
// (up to three more small kernels); below either, the fallback, as before. Measured on H200, fp16 GPU µs,
// staged / fallback / ORT: 64x770x3074 8.3 / 11.1 / 15.4, 4096x770x3074 72.0 / 146.1 / 214.7,
// 16384x4095x1023 290.1 / 1053.6 / 1072.7; but 300x37x5 6.4 / 3.2 (launches, not work).
constexpr int64_t kStagedFusedMinRows = 64;
constexpr int64_t kStagedFusedMinMultiplyAdds = int64_t{1} << 27;
bool StagedFusedPays(const cuda::GemmGeluArgs& a) {
  return a.M >= kStagedFusedMinRows && a.M >= kStagedFusedMinMultiplyAdds / a.K / a.N;  // K, N > 0 here
}

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
constexpr int64_t kStagedFallbackMinRows = 2;
constexpr int64_t kStagedFallbackMinWeights = int64_t{1} << 21;
bool StagedFallbackPays(const cuda::GemmGeluArgs& a) {
  return a.dtype == cuda::DType::kFloat32 && a.M >= kStagedFallbackMinRows && a.N < a.K &&
         a.K * a.N >= kStagedFallbackMinWeights && !RowsAreVectors(a);
}

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
bool GemvReaches(const cuda::GemmGeluArgs& a) {
  if (!a.trans_b || a.M > kGemvMaxRows) return false;
  const bool large_w = a.K * a.N >= kWeightBoundMinWeights;
  if (a.dtype == cuda::DType::kFloat32) {
    if (a.N < a.K) return a.M <= kGemvF32NarrowMaxRows && !large_w && cuda::gemv_reads_vectors(a);
    if (!large_w) return a.M <= kGemvF32MaxRows;
    return a.M <= kGemvF32LargeWeightMaxRows || (cuda::gemv_uses_tf32(a) && a.M <= kGemvTf32MaxRows);
  }
  if (!cuda::gemv_reads_vectors(a)) return a.M <= kGemvUnaligned16BitMaxRows && a.N >= a.K && !large_w;
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

CudaPath BuiltInPath(const cuda::GemmGeluArgs& a, const cuda::DeviceInfo& dev) {
  if (cuda::gemm_gelu_runs_swapped(a, dev)) {
    const bool gemv_first = GemvReaches(a) && (a.dtype != cuda::DType::kFloat32 || a.M <= kGemvF32BeforeSwappedMaxRows);
    return gemv_first ? CudaPath::kGemv : CudaPath::kFused;
  }
  if (GemvReaches(a)) return CudaPath::kGemv;
  if (a.dtype == cuda::DType::kFloat32) {
    if (!a.allow_tf32 || a.M <= kStrictF32MaxRows) return CudaPath::kFallback;
    const bool weight_bound = a.M <= kF32WeightBoundMaxRows && a.K * a.N >= kWeightBoundMinWeights;
    return weight_bound ? CudaPath::kFallback : CudaPath::kFused;
  }
  if (!RowsAreVectors(a)) return StagedFusedPays(a) ? CudaPath::kFused : CudaPath::kFallback;
  const bool weight_bound = a.M <= kWeightBoundMaxRows && a.K * a.N >= kFewRowsFallbackMinWeights;
  return weight_bound ? CudaPath::kFallback : CudaPath::kFused;
}

class FusedLinearGeluCudaKernel {
 public:
  FusedLinearGeluCudaKernel(const OrtKernelInfo* info, ONNXTensorElementDataType type)
      : type_(type),
        attrs_(ReadAttributes(info)),
        path_attrs_(ReadCudaPathAttributes(info)),
        strict_fp32_(ReadStrictFp32(info)) {
    // The device this node runs on is the one of the allocator ORT gives the kernel for its default
    // (GPU) memory; its memory info is also what Compute asks the context's allocator for.
    const OrtApi& api = Ort::GetApi();
    OrtAllocator* raw = nullptr;
    Ort::ThrowOnError(api.KernelInfoGetAllocator(info, OrtMemTypeDefault, &raw));
    allocator_ = Ort::Allocator{raw};
    Ort::ConstMemoryInfo mem = allocator_.GetInfo();
    gpu_memory_ = Ort::MemoryInfo(mem.GetAllocatorName().c_str(), mem.GetAllocatorType(), mem.GetDeviceId(),
                                  mem.GetMemoryType());

    // Device facts once per instance: cudaDeviceGetAttribute is cheap, but not free per call.
    dev_.device = mem.GetDeviceId();
    cudaError_t e = cudaDeviceGetAttribute(&dev_.cc_major, cudaDevAttrComputeCapabilityMajor, dev_.device);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&dev_.cc_minor, cudaDevAttrComputeCapabilityMinor, dev_.device);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&dev_.sm_count, cudaDevAttrMultiProcessorCount, dev_.device);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&dev_.l2_bytes, cudaDevAttrL2CacheSize, dev_.device);
    if (e != cudaSuccess) {
      Fail(ORT_FAIL, "cannot query CUDA device " + std::to_string(dev_.device) + ": " + CudaErrorText(e));
    }
    if (dev_.cc_major < 8) {
      Fail(ORT_NOT_IMPLEMENTED, "CUDA device " + std::to_string(dev_.device) + " has compute capability " +
                                    std::to_string(dev_.cc_major) + "." + std::to_string(dev_.cc_minor) +
                                    "; the library's CUDA kernels need 8.0 or newer (Ampere, Hopper and later)");
    }

    // The fallback exists where cuBLASLt loads; a forced fallback without it fails each call (Compute), so a
    // session still opens and the message says why.
    if (cuda::CublasLtAvailable(&fallback_unavailable_)) gemm_bias_ = std::make_unique<cuda::CublasLtGemmBias>(dev_.device);
    StageConstants(info);
    // The tuning table applies only on the device, CUDA runtime and library version it was measured with.
    if (!path_attrs_.tuned_device.empty()) {
      std::string signature;
      table_applies_ = cuda::DeviceSignature(dev_.device, &signature) == cudaSuccess &&
                       signature == path_attrs_.tuned_device;
    }
  }

  ~FusedLinearGeluCudaKernel() { ReleaseStagedConstants(); }
  FusedLinearGeluCudaKernel(const FusedLinearGeluCudaKernel&) = delete;
  FusedLinearGeluCudaKernel& operator=(const FusedLinearGeluCudaKernel&) = delete;

  OrtStatusPtr ComputeV2(OrtKernelContext* context) const {
    return GuardStatus([&] { Compute(context); });
  }

 private:
  // The path of one call: forced by cuda_path, else the tuning table where it applies, else BuiltInPath. K = 0
  // (Y = act(B), no GEMM at all) always takes the fused path, the only one that handles it; "auto" where
  // cuBLASLt is missing takes the fused path instead of the fallback.
  CudaPath ChoosePath(const cuda::GemmGeluArgs& a) const {
    if (a.K == 0) return CudaPath::kFused;
    if (path_attrs_.path != CudaPath::kAuto) return path_attrs_.path;
    CudaPath chosen = BuiltInPath(a, dev_);
    if (table_applies_) {
      const std::vector<int64_t>& rows = path_attrs_.tuned_max_rows;
      chosen = path_attrs_.tuned_paths.back();
      for (size_t i = 0; i < rows.size(); ++i) {
        if (a.M <= rows[i]) {
          chosen = path_attrs_.tuned_paths[i];
          break;
        }
      }
    }
    return chosen == CudaPath::kFallback && gemm_bias_ == nullptr ? CudaPath::kFused : chosen;
  }

  std::string Describe(const LinearShape& s) const {
    return std::string(TypeName(type_)) + " M=" + std::to_string(s.M) + " K=" + std::to_string(s.K) +
           " N=" + std::to_string(s.N) + " transB=" + (attrs_.trans_b ? "1" : "0") +
           " approximate=" + ActivationName(attrs_.activation) + " on sm_" + std::to_string(dev_.cc_major) +
           std::to_string(dev_.cc_minor);
  }

  void Compute(OrtKernelContext* context) const {
    Ort::KernelContext ctx(context);
    BoundCall call = BindCall(ctx, attrs_.trans_b);
    const Ort::ConstValue &x = call.x, &w = call.w, &b = call.b;
    const bool has_bias = b != nullptr;
    const LinearShape& s = call.shape;
    Ort::UnownedValue& y = call.y;
    if (s.M == 0 || s.N == 0) return;  // an empty output: nothing to compute, nothing to launch

    cuda::GemmGeluArgs args{};
    args.dtype = ToDType(type_);
    args.act = attrs_.activation;
    args.alpha = attrs_.alpha;
    args.trans_b = attrs_.trans_b;
    // The fused path's TF32 tactics need 16-byte aligned rows (K and N multiples of 4 floats); other shapes
    // would run its strict any-alignment kernel, so the built-in rule sends them to the fallback, where cuBLAS
    // decides TF32 per shape exactly as for ORT's MatMul (RunFallback). ORT's own choice varies with the shape:
    // on the H200 K=100, N=70 ran in full fp32 (rel-L2 2e-7) while 770x3074 ran TF32 (3e-4).
    args.allow_tf32 = !strict_fp32_ && s.K % 4 == 0 && s.N % 4 == 0;
    args.M = s.M;
    args.N = s.N;
    args.K = s.K;
    args.x = x.GetTensorRawData();
    args.w = w.GetTensorRawData();
    args.bias = has_bias ? b.GetTensorRawData() : nullptr;
    args.y = y.GetTensorMutableRawData();

    cudaStream_t stream = static_cast<cudaStream_t>(ctx.GetGPUComputeStream());
    if (stream == nullptr) {
      Fail(ORT_FAIL, "ORT gave no CUDA compute stream: the node is not running under CUDAExecutionProvider");
    }

    switch (ChoosePath(args)) {
      case CudaPath::kFallback: RunFallback(ctx, args, s, stream); return;
      case CudaPath::kGemv: RunGemv(args, s, stream); return;
      default: break;
    }

    if (args.dtype != cuda::DType::kFloat32 && args.K > 0 && !RowsAreVectors(args)) {
      RunFusedStaged(ctx, args, s, stream);
      return;
    }
    RunFused(ctx, args, s, stream);
  }

  // One kernel: launch_gemm_gelu's tactic, with the scratch it needs, if any (Workspace).
  void RunFused(Ort::KernelContext& ctx, const cuda::GemmGeluArgs& args, const LinearShape& s, cudaStream_t stream) const {
    const cuda::GemmGeluPlan plan = cuda::plan_gemm_gelu(args, dev_);
    const size_t workspace_bytes = plan.workspace_bytes;
    Workspace workspace(ctx, *gpu_memory_, workspace_bytes);
    const cudaError_t e = cuda::launch_gemm_gelu(plan, args, dev_, workspace.data(), workspace_bytes, stream);
    if (e != cudaSuccess) {
      const std::string what = Describe(s);
      if (e == cudaErrorNotSupported) {
        Fail(ORT_NOT_IMPLEMENTED, "no CUDA kernel in this library can run " + what);
      }
      Fail(ORT_FAIL, std::string("CUDA kernel launch failed (tactic ") + cuda::gemm_gelu_tactic_name(args, dev_) +
                         ") for " + what + ": " + CudaErrorText(e));
    }
  }

  // 16-bit rows that are not 16-byte vectors, on the fused path's Tensor-Core kernels: each such operand is
  // copied with its K and N padded to multiples of 8 (zeros: they add exact zeros to every sum, and the
  // extra output columns are never read), the GEMM runs on the copies, and the product's rows are copied back
  // into Y. A constant W and B were staged once in the constructor; X, Y, and a W or B that is a graph input
  // are staged per call in scratch. Up to four kernels, the activation still inside the GEMM.
  // float32 stays on the fallback for such shapes (BuiltInPath): there cuBLAS chooses TF32 or full fp32 per
  // shape for ORT's MatMul, and the fallback asks it the same way (on padded copies too where that pays:
  // RunFallbackStaged).
  void RunFusedStaged(Ort::KernelContext& ctx, const cuda::GemmGeluArgs& args, const LinearShape& s,
                      cudaStream_t stream) const {
    const int64_t v = VectorElements(args.dtype), bytes = ElementBytes(args.dtype);
    const int64_t k_pad = RoundUpToVector(args.K, v), n_pad = RoundUpToVector(args.N, v);
    const int64_t w_rows = args.trans_b ? args.N : args.K, w_cols = args.trans_b ? args.K : args.N;
    const int64_t w_rows_pad = args.trans_b ? n_pad : k_pad, w_cols_pad = args.trans_b ? k_pad : n_pad;
    const bool stage_x = !RowsAreVectors(args.x, args.K, v);
    const bool stage_y = !RowsAreVectors(args.y, args.N, v);
    // W as given or its copy from the constructor (AlignedWeight), else a copy now; the same for B.
    const void* w_aligned = AlignedWeight(args);
    const bool stage_w = w_aligned == nullptr;
    const bool b_ready = args.bias == nullptr || ReadAsIs(args.bias, 1, args.N, 1, v);
    const bool b_staged = staged_b_.data != nullptr && staged_b_.source == args.bias;
    const bool stage_b = !b_ready && !b_staged;

    // One scratch block, 256-byte aligned parts: X, Y, W, B as this call stages them.
    auto part = [bytes](int64_t elements) { return static_cast<size_t>((elements * bytes + 255) / 256 * 256); };
    const size_t x_bytes = stage_x ? part(args.M * k_pad) : 0, y_bytes = stage_y ? part(args.M * n_pad) : 0;
    const size_t w_bytes = stage_w ? part(k_pad * n_pad) : 0, b_bytes = stage_b ? part(n_pad) : 0;
    Workspace staging(ctx, *gpu_memory_, x_bytes + y_bytes + w_bytes + b_bytes);
    char* next = static_cast<char*>(staging.data());
    auto take = [&next](size_t bytes) {
      void* p = bytes > 0 ? next : nullptr;
      next += bytes;
      return p;
    };
    void* x_pad = take(x_bytes);
    void* y_pad = take(y_bytes);
    void* w_pad = take(w_bytes);
    void* b_pad = take(b_bytes);

    cuda::GemmGeluArgs padded = args;
    padded.K = k_pad;
    padded.N = n_pad;
    if (stage_x) padded.x = x_pad;
    if (stage_y) padded.y = y_pad;
    padded.w = stage_w ? w_pad : w_aligned;
    if (!b_ready) padded.bias = b_staged ? staged_b_.data : b_pad;
    auto copy = [&](const cuda::RowCopy& c, const char* what) { CopyRows(c, args.dtype, what, s, stream); };
    if (stage_x) copy(PaddedCopy(x_pad, args.x, args.M, args.K, args.M, k_pad), "X");
    if (stage_w) copy(PaddedCopy(w_pad, args.w, w_rows, w_cols, w_rows_pad, w_cols_pad), "W");
    if (stage_b) copy(PaddedCopy(b_pad, args.bias, 1, args.N, 1, n_pad), "B");
    RunFused(ctx, padded, s, stream);
    if (stage_y) copy({args.y, args.N, args.M, args.N, y_pad, n_pad, args.M, n_pad}, "Y");
  }

  void CopyRows(const cuda::RowCopy& c, cuda::DType dtype, const char* what, const LinearShape& s,
                cudaStream_t stream) const {
    const cudaError_t e = cuda::launch_copy_rows(c, static_cast<int>(ElementBytes(dtype)), stream);
    if (e != cudaSuccess) Fail(ORT_FAIL, std::string("staging ") + what + " failed for " + Describe(s) + ": " + CudaErrorText(e));
  }

  // W and B copied once into rows of 16-byte vectors (RunFusedStaged's layout), where this is a 16-bit node
  // whose W or B is a constant initializer in GPU memory with rows that are not: at 4095x1023, copying W
  // on every call would cost about as much as the GEMM at a few hundred rows. For a float32 node, W alone
  // (RunFallbackStaged reads B as it is), where the staged fallback can take its calls (StagedFallbackPays:
  // a narrow, deep W of enough weights); other float32 nodes keep no copy. Anything else (a graph input, a
  // shape the call will reject) is left to Compute.
  void StageConstants(const OrtKernelInfo* info) {
    const bool fp32 = type_ == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    const int64_t v = VectorElements(ToDType(type_)), bytes = ElementBytes(ToDType(type_));
    Ort::ConstKernelInfo kernel_info{info};
    auto constant = [&](size_t index) -> Ort::ConstValue {
      if (kernel_info.GetInputCount() <= index) return Ort::ConstValue{nullptr};
      int is_constant = 0;
      Ort::ConstValue v = kernel_info.GetTensorConstantInput(index, &is_constant);
      if (!is_constant || v == nullptr) return Ort::ConstValue{nullptr};
      if (v.GetTensorMemoryInfo().GetDeviceType() != OrtMemoryInfoDeviceType_GPU) return Ort::ConstValue{nullptr};
      return v;
    };
    Ort::ConstValue w = constant(1);
    if (w == nullptr) return;
    const std::vector<int64_t> w_shape = w.GetTensorTypeAndShapeInfo().GetShape();
    if (w_shape.size() != 2 || w_shape[0] <= 0 || w_shape[1] <= 0) return;
    const int64_t w_rows = w_shape[0], w_cols = w_shape[1];
    const int64_t n = attrs_.trans_b ? w_rows : w_cols, k = attrs_.trans_b ? w_cols : w_rows;
    if (fp32) {
      cuda::GemmGeluArgs shape{};  // the node's (K, N) at the fewest rows the staged fallback takes
      shape.dtype = cuda::DType::kFloat32;
      shape.M = kStagedFallbackMinRows, shape.K = k, shape.N = n;
      shape.trans_b = attrs_.trans_b;
      shape.w = w.GetTensorRawData();
      if (!StagedFallbackPays(shape)) return;
    }
    const int64_t w_rows_pad = RoundUpToVector(w_rows, v), w_cols_pad = RoundUpToVector(w_cols, v);

    // A constructor that throws runs no destructor: what was staged is released here on any failure.
    try {
      DeviceScope device(dev_.device);
      OwnedStream stream;
      cudaError_t e = stream.create();
      auto stage = [&](const Ort::ConstValue& value, int64_t rows, int64_t cols, int64_t rows_pad, int64_t cols_pad,
                       StagedOperand* out) {
        if (e != cudaSuccess || ReadAsIs(value.GetTensorRawData(), rows, cols, rows_pad, v)) return;
        out->data = allocator_.Alloc(static_cast<size_t>(rows_pad * cols_pad * bytes));
        out->source = value.GetTensorRawData();
        e = cuda::launch_copy_rows(PaddedCopy(out->data, out->source, rows, cols, rows_pad, cols_pad),
                                   static_cast<int>(bytes), stream.get());
      };
      // W's padded rows matter too: [N, K] padded to N8 rows (N4 for float32), [K, N] to K8 (K4).
      stage(w, w_rows, w_cols, w_rows_pad, w_cols_pad, &staged_w_);
      Ort::ConstValue b = constant(2);
      if (b != nullptr && !fp32) {
        const std::vector<int64_t> b_shape = b.GetTensorTypeAndShapeInfo().GetShape();
        if (b_shape.size() == 1 && b_shape[0] == n) stage(b, 1, n, 1, RoundUpToVector(n, v), &staged_b_);
      }
      if (e == cudaSuccess) e = cudaStreamSynchronize(stream.get());
      if (e != cudaSuccess) Fail(ORT_FAIL, "staging the constant W and B in aligned rows failed: " + CudaErrorText(e));
    } catch (...) {
      ReleaseStagedConstants();
      throw;
    }
  }

  void ReleaseStagedConstants() {
    for (StagedOperand* op : {&staged_w_, &staged_b_}) {
      if (op->data != nullptr) allocator_.Free(op->data);
      *op = StagedOperand{};
    }
  }

  // Two kernels on `stream`. float32: cuBLASLt's GEMM with the bias epilogue into Y, then the activation over Y
  // in place. fp16/bf16: cuBLASLt's GEMM into a float32 product (scratch), then bias, activation and the one
  // rounding to Y's type in one kernel, in the fused kernel's order (rounding the pre-activation to 16 bits
  // first, as ORT's unfused graph does, measured 1.18x ORT's own error at 64x770x3074 fp16).
  void RunFallback(Ort::KernelContext& ctx, cuda::GemmGeluArgs args, const LinearShape& s, cudaStream_t stream) const {
    if (gemm_bias_ == nullptr) {
      Fail(ORT_FAIL, std::string("cuda_path='fallback' needs cuBLASLt, which is unavailable: ") + fallback_unavailable_ +
                         " (onnxruntime's CUDA provider loads it; is this session's CUDA the library's major?)");
    }
    // TF32 exactly as ORT's MatMul gets it: its CUDA provider allows TF32 (use_tf32, on by default) and lets
    // cuBLAS choose per shape; this path asks the same library the same way. Measured on H200: ORT's error at
    // 4096x770x3074 and at one row is TF32's (3e-4), so strict fp32 here only lost time (1.6-2.5x ORT).
    if (args.dtype == cuda::DType::kFloat32) args.allow_tf32 = !strict_fp32_;
    if (StagedFallbackPays(args)) {
      const void* w_aligned = AlignedWeight(args);
      if (w_aligned != nullptr) {
        RunFallbackStaged(ctx, args, w_aligned, s, stream);
        return;
      }
    }
    const bool fp32_product = args.dtype != cuda::DType::kFloat32;
    const cuda::CublasLtGemmBias::Plan plan = PlanFallbackGemm(args, fp32_product, s);
    // One scratch block: the float32 product first (256-byte aligned, as the allocator's blocks), then
    // cuBLASLt's workspace.
    const size_t product_bytes = fp32_product ? ScratchPart(args.M * args.N * int64_t{4}) : 0;
    Workspace workspace(ctx, *gpu_memory_, product_bytes + plan.workspace_bytes);
    char* scratch = static_cast<char*>(workspace.data());
    void* d = fp32_product ? static_cast<void*>(scratch) : args.y;
    RunFallbackGemm(plan, args, d, scratch + product_bytes, s, stream);
    const cudaError_t e =
        fp32_product ? cuda::launch_bias_activation_from_fp32(args, static_cast<const float*>(d), args.N, dev_, stream)
                     : cuda::launch_activation_inplace(args, dev_, stream);
    FailOnActivationError(e, s);
  }

  // float32 on a large, narrow, deep W whose rows are not 16-byte vectors (StagedFallbackPays): the fallback's
  // GEMM on the problem padded to multiples of 4 in K and N, where cuBLAS reads W at DRAM speed. X is copied
  // into padded rows when its own are not vectors, W is `w_aligned` (the constructor's copy of a constant W, or
  // W itself), the GEMM writes the padded product (no bias) to scratch, and one kernel adds B, applies the
  // activation and writes Y's own rows: three kernels at most, where the plain fallback runs two.
  void RunFallbackStaged(Ort::KernelContext& ctx, const cuda::GemmGeluArgs& args, const void* w_aligned,
                         const LinearShape& s, cudaStream_t stream) const {
    const int64_t v = VectorElements(args.dtype);
    const int64_t k_pad = RoundUpToVector(args.K, v), n_pad = RoundUpToVector(args.N, v);
    const bool stage_x = !RowsAreVectors(args.x, args.K, v);
    // The padded product and X's copy first: cuBLASLt's choice depends on its operands' alignments, so the
    // plan is made for the pointers the GEMM will read and write; its workspace after.
    const size_t product_bytes = ScratchPart(args.M * n_pad * int64_t{4});
    const size_t x_bytes = stage_x ? ScratchPart(args.M * k_pad * int64_t{4}) : 0;
    Workspace staging(ctx, *gpu_memory_, product_bytes + x_bytes);
    char* scratch = static_cast<char*>(staging.data());
    cuda::GemmGeluArgs padded = args;
    padded.K = k_pad;
    padded.N = n_pad;
    padded.w = w_aligned;
    padded.bias = nullptr;  // added with the activation, from B as it is
    padded.y = scratch;
    if (stage_x) padded.x = scratch + product_bytes;
    const cuda::CublasLtGemmBias::Plan plan = PlanFallbackGemm(padded, /*fp32_product=*/false, s);
    Workspace lt_workspace(ctx, *gpu_memory_, plan.workspace_bytes);
    if (stage_x) CopyRows(PaddedCopy(scratch + product_bytes, args.x, args.M, args.K, args.M, k_pad), args.dtype, "X", s, stream);
    RunFallbackGemm(plan, padded, padded.y, lt_workspace.data(), s, stream);
    FailOnActivationError(
        cuda::launch_bias_activation_from_fp32(args, static_cast<const float*>(padded.y), n_pad, dev_, stream), s);
  }

  // W in rows of 16-byte vectors for the padded problem (RunFusedStaged, RunFallbackStaged): W itself where its
  // rows already are and none are missing, the constructor's copy of a constant W, or null (a W given at run
  // time, which the fused path copies per call and the float32 fallback leaves unstaged).
  const void* AlignedWeight(const cuda::GemmGeluArgs& args) const {
    const int64_t v = VectorElements(args.dtype);
    const int64_t w_rows = args.trans_b ? args.N : args.K, w_cols = args.trans_b ? args.K : args.N;
    if (ReadAsIs(args.w, w_rows, w_cols, RoundUpToVector(w_rows, v), v)) return args.w;
    return staged_w_.data != nullptr && staged_w_.source == args.w ? staged_w_.data : nullptr;
  }

  static size_t ScratchPart(int64_t bytes) { return static_cast<size_t>((bytes + 255) / 256 * 256); }

  cuda::CublasLtGemmBias::Plan PlanFallbackGemm(const cuda::GemmGeluArgs& args, bool fp32_product,
                                                const LinearShape& s) const {
    std::string error;
    cuda::CublasLtGemmBias::Plan plan;
    if (!gemm_bias_->plan(args, fp32_product, &plan, &error)) {
      Fail(ORT_FAIL, std::string(cuda::kFallbackPathName) + " cannot run " + Describe(s) + ": " + error);
    }
    return plan;
  }

  void RunFallbackGemm(const cuda::CublasLtGemmBias::Plan& plan, const cuda::GemmGeluArgs& args, void* d,
                       void* workspace, const LinearShape& s, cudaStream_t stream) const {
    std::string error;
    void* lt_workspace = plan.workspace_bytes > 0 ? workspace : nullptr;
    if (!gemm_bias_->run(plan, args, d, lt_workspace, plan.workspace_bytes, stream, &error)) {
      Fail(ORT_FAIL, std::string(cuda::kFallbackPathName) + " GEMM failed for " + Describe(s) + ": " + error);
    }
  }

  void FailOnActivationError(cudaError_t e, const LinearShape& s) const {
    if (e != cudaSuccess) {
      Fail(ORT_FAIL, std::string(cuda::kFallbackPathName) + " activation kernel launch failed for " + Describe(s) +
                         ": " + CudaErrorText(e));
    }
  }

  // One kernel; the table's contract keeps "auto" within its rows, a forced "gemv" may not be.
  void RunGemv(const cuda::GemmGeluArgs& args, const LinearShape& s, cudaStream_t stream) const {
    if (args.M > cuda::kGemvMaxRows) {
      Fail(ORT_INVALID_ARGUMENT, "cuda_path='gemv' runs at most " + std::to_string(cuda::kGemvMaxRows) +
                                     " rows; this call has M=" + std::to_string(args.M) + " (" + Describe(s) + ")");
    }
    const cudaError_t e = cuda::launch_gemv_gelu(args, dev_, stream);
    if (e != cudaSuccess) {
      Fail(ORT_FAIL, std::string(cuda::kGemvPathName) + " kernel launch failed for " + Describe(s) + ": " + CudaErrorText(e));
    }
  }

  // Scratch for one call, returned when the call ends. It comes from ORT's GPU allocator on the call's compute
  // stream (the C API's scratch buffer, as ORT's own kernels take theirs): the arena tags the block with that
  // stream, so once freed it goes only to later work on the same stream, or to another stream after ORT has
  // made it wait for this one. A session's concurrent runs each have a stream of their own, and a block taken
  // without a stream (the allocator's plain Alloc) could go to another run while this call's kernels still
  // read and write it.
  class Workspace {
   public:
    Workspace(Ort::KernelContext& ctx, const OrtMemoryInfo& memory, size_t bytes) {
      if (bytes == 0) return;
      allocator_ = ctx.GetAllocator(memory);
      Ort::ThrowOnError(Ort::GetApi().KernelContext_GetScratchBuffer(ctx.GetOrtKernelContext(), &memory, bytes, &data_));
      if (data_ == nullptr) Fail(ORT_FAIL, "ORT's GPU allocator gave no scratch of " + std::to_string(bytes) + " bytes");
    }
    ~Workspace() {
      if (data_ != nullptr) allocator_.Free(data_);
    }
    Workspace(const Workspace&) = delete;
    Workspace& operator=(const Workspace&) = delete;
    void* data() const { return data_; }

   private:
    Ort::Allocator allocator_{nullptr};
    void* data_ = nullptr;
  };

  // Makes `device` current for a scope (the constructor may run on a thread whose current device differs).
  class DeviceScope {
   public:
    explicit DeviceScope(int device) {
      if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != device) cudaSetDevice(device);
      else previous_ = -1;
    }
    ~DeviceScope() {
      if (previous_ >= 0) cudaSetDevice(previous_);
    }
    DeviceScope(const DeviceScope&) = delete;
    DeviceScope& operator=(const DeviceScope&) = delete;

   private:
    int previous_ = -1;
  };

  // A stream of the constructor's own (ORT gives a kernel its stream only in Compute), destroyed with the scope.
  class OwnedStream {
   public:
    OwnedStream() = default;
    ~OwnedStream() {
      if (stream_ != nullptr) cudaStreamDestroy(stream_);
    }
    OwnedStream(const OwnedStream&) = delete;
    OwnedStream& operator=(const OwnedStream&) = delete;
    cudaError_t create() { return cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); }
    cudaStream_t get() const { return stream_; }

   private:
    cudaStream_t stream_ = nullptr;
  };

  // A constant operand's copy in rows of 16-byte vectors, and the initializer's address it was made from
  // (a call passes that address for that input).
  struct StagedOperand {
    void* data = nullptr;
    const void* source = nullptr;
  };

  const ONNXTensorElementDataType type_;
  const FusedLinearGeluAttributes attrs_;
  const CudaPathAttributes path_attrs_;
  const bool strict_fp32_;
  Ort::Allocator allocator_{nullptr};  // the node's GPU allocator: the staged constants' memory
  StagedOperand staged_w_, staged_b_;
  Ort::MemoryInfo gpu_memory_{nullptr};
  cuda::DeviceInfo dev_{};
  std::unique_ptr<cuda::CublasLtGemmBias> gemm_bias_;  // null when cuBLASLt is unavailable
  std::string fallback_unavailable_;                  // why, then
  bool table_applies_ = false;                        // tuned_device is this device's signature
};

struct FusedLinearGeluCudaOp
    : Ort::CustomOpBase<FusedLinearGeluCudaOp, FusedLinearGeluCudaKernel, /*WithStatus=*/true> {
  explicit FusedLinearGeluCudaOp(ONNXTensorElementDataType type) : type_(type) {}

  OrtStatusPtr CreateKernelV2(const OrtApi& /*api*/, const OrtKernelInfo* info, void** kernel) const {
    *kernel = nullptr;
    return GuardStatus([&] { *kernel = new FusedLinearGeluCudaKernel(info, type_); });
  }

  const char* GetName() const { return kOpType; }
  const char* GetExecutionProviderType() const { return kCudaProvider; }

  size_t GetInputTypeCount() const { return 3; }
  ONNXTensorElementDataType GetInputType(size_t /*index*/) const { return type_; }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t index) const {
    return index == 2 ? OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_OPTIONAL
                      : OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_REQUIRED;
  }
  // X, W and B all stay in the provider's (GPU) memory: ORT never copies the weights to the host.
  OrtMemType GetInputMemoryType(size_t /*index*/) const { return OrtMemTypeDefault; }

  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t /*index*/) const { return type_; }

 private:
  ONNXTensorElementDataType type_;
};

}  // namespace

void RegisterCudaOps(Ort::CustomOpDomain& domain) {
  // ORT keeps raw pointers to these for as long as any session uses the domain: static storage.
  static FusedLinearGeluCudaOp op_float32(ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT);
  static FusedLinearGeluCudaOp op_float16(ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16);
  static FusedLinearGeluCudaOp op_bfloat16(ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16);
  domain.Add(&op_float32);
  domain.Add(&op_float16);
  domain.Add(&op_bfloat16);
}

}  // namespace onnxfuse
