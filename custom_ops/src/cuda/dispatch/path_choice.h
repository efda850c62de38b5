// Which of its three paths one call of the CUDA FusedLinearGelu takes:
//   "fused":    launch_gemm_gelu (gemm_gelu.h), one GEMM+bias+activation kernel;
//   "fallback": cuBLASLt's GEMM with its bias epilogue (cublaslt_gemm_bias.h), then the activation in place;
//   "gemv":     launch_gemv_gelu (cuda/kernels/gemv_gelu.h), one kernel for calls with at most 16 rows.
// The node's cuda_path forces one; else its tuning table, where the table applies to this device (the tuned_*
// attributes, contract/fused_linear_gelu_common.h); else the built-in rule (BuiltInPath), whose thresholds and
// the measurements behind them are in path_choice.cc. Plain functions of the call's arguments and the device's
// facts: no ORT calls, nothing launched, so a rule can be read (and changed) without the kernel around it.
#pragma once

#include <cstdint>

#include "contract/fused_linear_gelu_common.h"  // CudaPath, CudaPathAttributes: the attribute contract
#include "cuda/dispatch/gemm_gelu.h"

namespace onnxfuse::cuda {

// The path of one call: forced by cuda_path, else the tuning table where it applies (`table_applies`: its
// tuned_device is this device's signature), else BuiltInPath. K = 0 (Y = act(B), no GEMM at all) always takes
// the fused path, the only one that handles it; a fallback chosen where cuBLASLt is missing
// (`fallback_available` false) takes the fused path instead. A forced path is returned as it is.
CudaPath ChooseCudaPath(const GemmGeluArgs& a, const DeviceInfo& dev, const CudaPathAttributes& attrs,
                        bool table_applies, bool fallback_available);

// The built-in choice, where neither cuda_path nor a tuning table for this device decides.
CudaPath BuiltInPath(const GemmGeluArgs& a, const DeviceInfo& dev);

// float32 on the fallback whose rows are not 16-byte vectors (row_vectors.h), on a large, narrow, deep W: the
// fallback runs on copies padded to 16-byte rows (RunFallbackStaged), where cuBLAS reads W at DRAM speed.
// kStagedFallbackMinRows is the fewest rows it takes; the kernel's constructor asks at that many rows whether a
// constant W is worth staging once.
inline constexpr int64_t kStagedFallbackMinRows = 2;
bool StagedFallbackPays(const GemmGeluArgs& a);

}  // namespace onnxfuse::cuda
