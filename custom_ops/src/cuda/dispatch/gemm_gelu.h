// The contract between the ORT CUDA kernel (cuda/ops/fused_linear_gelu_cuda*.cc) and the GEMM+bias+GELU
// kernels (cuda/kernels/, instantiated in cuda/instantiations/). Plain data in, a cudaError_t out: no ORT types
// cross this line.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "activation.h"

namespace onnxfuse::cuda {

enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

struct GemmGeluArgs {
  DType dtype;
  Activation act;
  float alpha;      // sigmoid form only
  bool trans_b;     // true: W is [N, K] row-major (K-major); false: W is [K, N] row-major
  bool allow_tf32;  // float32 only: TF32 Tensor Cores (default, as ORT's MatMul) or strict fp32
  int64_t M, N, K;  // X is [M, K] row-major, Y is [M, N] row-major
  const void* x;
  const void* w;
  const void* bias;  // [N] or nullptr
  void* y;
};

// Device facts read once per kernel instance (cudaGetDeviceProperties is slow).
struct DeviceInfo {
  int device = 0;
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  int l2_bytes = 0;  // L2 cache size: decides the order in which a persistent kernel walks its output tiles
};

// What launch_gemm_gelu runs for one call: the tactic (an index into the dispatch table, -1 when no backend
// can take the problem) and the bytes of scratch it needs (0 for most; the caller allocates them with ORT's
// allocator). Choosing walks the shape table and asks candidates whether they fit: a caller plans once per
// call and launches that plan, rather than choosing again for the launch.
struct GemmGeluPlan {
  int tactic = -1;
  size_t workspace_bytes = 0;
  bool strict_f32 = false;  // float32 run in strict fp32 whatever args.allow_tf32 says (few rows, no swapped kernel)
};
GemmGeluPlan plan_gemm_gelu(const GemmGeluArgs& args, const DeviceInfo& dev);

// Enqueues exactly one kernel, the plan's, on `stream` (zero-size problems enqueue nothing). Never
// synchronizes. `plan` must come from plan_gemm_gelu for the same args and device. Returns
// cudaErrorNotSupported when the plan has no tactic.
cudaError_t launch_gemm_gelu(const GemmGeluPlan& plan, const GemmGeluArgs& args, const DeviceInfo& dev,
                             void* workspace, size_t workspace_bytes, cudaStream_t stream);

// Whether plan_gemm_gelu picks one of the few-rows kernels with the operands swapped (sm90_swap_ab.cuh) for
// these arguments: the path choice (path_choice.cc) gives such calls the fused path, where it would
// otherwise have run the fallback or, from 5 rows, the gemv kernel.
bool gemm_gelu_runs_swapped(const GemmGeluArgs& args, const DeviceInfo& dev);

// The name of the tactic launch_gemm_gelu would pick, for benchmarks and `onnxfuse inspect`-style reports.
const char* gemm_gelu_tactic_name(const GemmGeluArgs& args, const DeviceInfo& dev);

}  // namespace onnxfuse::cuda
