// The GEMM of the fallback path: Y = X·W(ᵀ) + B by cuBLASLt (its bias epilogue), on the caller's stream. The
// activation follows in a second kernel (activation_inplace.h); together they are the kernels ORT's own
// MatMul + BiasGelu graph runs, for the shapes where the one-kernel path has only its any-alignment kernel.
//
// cuBLASLt is loaded at run time (dlopen of libcublasLt.so.<CUDA major>, once per process), never linked:
// the library loads without it, and the fallback is then simply unavailable. Whenever ORT's CUDA provider
// runs, it has loaded that library already, so the dlopen finds the copy in the process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "cuda/dispatch/gemm_gelu.h"

namespace onnxfuse::cuda {

// The fallback's name where a tactic name is reported (benchmarks, error messages).
inline constexpr const char* kFallbackPathName = "cublaslt_bias+act_inplace";

// Whether libcublasLt.so.<major> could be loaded and has every function used here. Loads it on the first
// call (thread-safe); later calls only read. `why`, when given, receives the reason it is unavailable.
bool CublasLtAvailable(std::string* why = nullptr);

// One node's cuBLASLt state: a handle for its device, and the algorithm chosen per problem. The heuristic's first
// answer is not always its fastest where W is read by few rows (float32 4-16 rows of 4096x16384 behind ORT's MatMul:
// bench/results/cuda_kernel_fp32_few_rows_h200.json, lab/results/cublas_fp32_few_rows_h200.txt), so small problems
// time the heuristic's candidates on their first call outside a CUDA-graph capture, in interleaved rounds, and keep
// the fastest (the way ORT's and PyTorch's TunableOp tune on first use); below 64 rows of a W of 2^25 weights or
// more, the heuristic's answers for 64 rows join them where cuBLASLt accepts them for the rows asked. Only candidates
// of the first answer's numerical kind are timed (FMA or Tensor Cores, and their input precision), so timing changes
// speed, never precision. The choices are the process's, per device and problem: a model's identical layers time
// once, and every session in the process runs the same algorithm for the same problem (the same bits; another process
// may settle on another). Thread-safe: ORT calls Compute on one kernel instance from several threads at once. The
// handle is only read after it is created (cuBLASLt takes stream and workspace per call, so a handle has no per-call
// state and cuBLAS documents its functions as callable from several threads with one handle), under this object's
// mutex; the process's choices are under their own, held only for a lookup except on a problem's first calls (its
// heuristic in plan(), its timing in run()); a settled choice is never written again, so run() reads it without a
// lock.
class CublasLtGemmBias {
 public:
  explicit CublasLtGemmBias(int device);  // nothing happens on the device until the first plan()
  ~CublasLtGemmBias();
  CublasLtGemmBias(const CublasLtGemmBias&) = delete;
  CublasLtGemmBias& operator=(const CublasLtGemmBias&) = delete;

  struct Choice;  // one problem's candidates and the algorithm settled on (cublaslt_gemm_bias.cc)
  struct Plan {
    void* handle = nullptr;  // cublasLtHandle_t
    Choice* choice = nullptr;
    size_t workspace_bytes = 0;  // what the settled algorithm, or while unsettled every candidate, needs
    bool fp32_product = false;   // D is the fp32 product X·W(ᵀ), no bias (see plan())
  };

  // The plan for `args` (M, N, K > 0): the cached choice, or on a problem's first call cuBLASLt's heuristic
  // (host work only, no GPU sync; ORT's first runs of a CUDA-graph session are not captured, so the captured
  // runs find the cache filled). False with `error` set when cuBLASLt is unavailable or has no algorithm.
  // fp32_product: D is the float32 accumulator X·W(ᵀ) without the bias, for a 16-bit node whose bias and
  // activation then apply to it before the one rounding to Y's type (as the fused kernel does); otherwise D
  // is Y itself, X·W(ᵀ) + B in args.dtype (the bias epilogue).
  bool plan(const GemmGeluArgs& args, bool fp32_product, Plan* out, std::string* error);

  // Enqueues D = X·W(ᵀ) (+ B unless the plan's fp32_product) on `stream` with the settled algorithm; D is `d`
  // (M×N of float32 for fp32_product, else args.y). Once settled: no host allocation, no synchronization,
  // capturable in a CUDA graph. A problem's first call settles it: where it has several candidates and the
  // stream is not capturing, each runs a few times into D on `stream`, in interleaved rounds (timed by events,
  // which waits for the stream), and the fastest is kept; under capture the heuristic's first answer is.
  // False with `error` set when cuBLASLt refuses the call.
  bool run(const Plan& plan, const GemmGeluArgs& args, void* d, void* workspace, size_t workspace_bytes,
           cudaStream_t stream, std::string* error);

 private:
  // Everything the heuristic's answer depends on: the problem, the compute type and the pointers' alignments.
  struct Key {
    int device;
    int64_t M, N, K;
    int dtype;
    bool trans_b, bias, tf32, fp32_product;
    uint32_t align_x, align_w, align_y, align_bias;
    bool operator<(const Key& o) const;
  };
  Key key_of(const GemmGeluArgs& args, bool fp32_product) const;

  const int device_;
  std::mutex mutex_;        // guards handle_'s creation
  void* handle_ = nullptr;  // cublasLtHandle_t, created on the first plan() (on device_), destroyed with this
  struct Choices;                  // the process's choices, per device and problem (never erased: a Plan points in)
  static Choices& process_choices();

  // Times the unsettled choice's candidates (under the choices' mutex) and settles it on the fastest.
  static bool settle(Choice* choice, void* handle, const GemmGeluArgs& args, bool fp32_product, void* d,
                     void* workspace, size_t workspace_bytes, cudaStream_t stream, std::string* error);
};

}  // namespace onnxfuse::cuda
