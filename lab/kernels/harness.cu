// A C ABI over the kernel dispatch, for run_device.py (ctypes + torch tensors): no ONNX Runtime needed to
// check and time the kernels on their own.
#include <chrono>

#include <cuda_runtime.h>

#include "cuda/dispatch/gemm_gelu.h"
#include "lab_device.h"
#include "cuda/dispatch/tactics.cuh"

// An exploration build (build.sh with OFK_EXPLORE=tiles, epi, intra, three, sched or gelu) adds the candidate tiles of its mode's
// groups (lab/kernels/explore/tiles.h), reachable here by index past the shipped table's end.
#if defined(OFK_EXPLORE_TILES_BUILD)
#define OFK_EXPLORE_MODE OFK_EXPLORE_MODE_TILES
#elif defined(OFK_EXPLORE_EPI_BUILD)
#define OFK_EXPLORE_MODE OFK_EXPLORE_MODE_EPI
#elif defined(OFK_EXPLORE_INTRA_BUILD)
#define OFK_EXPLORE_MODE OFK_EXPLORE_MODE_INTRA
#elif defined(OFK_EXPLORE_THREE_BUILD)
#define OFK_EXPLORE_MODE OFK_EXPLORE_MODE_THREE
#elif defined(OFK_EXPLORE_GELU_BUILD)  // before SCHED: a gelu build defines both (same hook points)
#define OFK_EXPLORE_MODE OFK_EXPLORE_MODE_GELU
#elif defined(OFK_EXPLORE_SCHED_BUILD)
#define OFK_EXPLORE_MODE OFK_EXPLORE_MODE_SCHED
#endif
#ifdef OFK_EXPLORE_MODE
#include "explore/configs.h"
#include "explore/tiles.h"
#endif

using namespace onnxfuse::cuda;

namespace {
GemmGeluArgs make_args(int dtype, int act, float alpha, int trans_b, int allow_tf32, long long M, long long N,
                       long long K, const void* x, const void* w, const void* bias, void* y) {
  GemmGeluArgs a{};
  a.dtype = static_cast<DType>(dtype);
  a.act = static_cast<onnxfuse::Activation>(act);
  a.alpha = alpha;
  a.trans_b = trans_b != 0;
  a.allow_tf32 = allow_tf32 != 0;
  a.M = M; a.N = N; a.K = K;
  a.x = x; a.w = w; a.bias = bias; a.y = y;
  return a;
}

// The candidate tiles measured but not in the shipped table, as tactics.
#ifdef OFK_EXPLORE_MODE
#define OFK_EXTRA(name, TM, TN, TK, CM, CN, SCHED, EM, EN) \
  ofk_explore::tactic<OFK_EXPLORE_CONFIG(TM, TN, TK, CM, CN, SCHED, EM, EN)>("sm90_f16_tn_" #name),
#define OFK_EXTRA_GROUP(group) OFK_EXPLORE_TILES_##group(OFK_EXTRA)
const Tactic kExtra[] = {OFK_EXPLORE_MODE(OFK_EXTRA_GROUP)};
constexpr int kExtraCount = static_cast<int>(sizeof(kExtra) / sizeof(kExtra[0]));
#else
const Tactic* const kExtra = nullptr;
constexpr int kExtraCount = 0;
#endif

__global__ void empty_kernel() {}

template <class F>
double host_ns_per_call(int iters, F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) f();
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / iters;
}

const Tactic& tactic_at(int i) {
  return i < gemm_gelu_tactic_count() ? gemm_gelu_tactic_at(i) : kExtra[i - gemm_gelu_tactic_count()];
}
}  // namespace

extern "C" {

int ofk_tactic_count() { return gemm_gelu_tactic_count() + kExtraCount; }
const char* ofk_tactic_name(int i) { return tactic_at(i).name; }

#ifdef OFK_EXPLORE_SCHED_BUILD  // built with the lab's hook points (hooks/kernel_hooks.cuh)
// The epilogue timeline buffer of explore/epilogue_trace.h for the launches that follow (null: none).
void ofk_set_trace(void* buffer) { ofk_explore::trace_buffer = static_cast<unsigned long long*>(buffer); }
#endif

// tactic < 0: the dispatch's own choice. Returns a cudaError_t.
int ofk_launch(int tactic, int dtype, int act, float alpha, int trans_b, int allow_tf32, long long M, long long N,
               long long K, const void* x, const void* w, const void* bias, void* y, void* workspace,
               unsigned long long workspace_bytes, void* stream) {
  static const DeviceInfo dev = lab_device_info();
  const GemmGeluArgs a = make_args(dtype, act, alpha, trans_b, allow_tf32, M, N, K, x, w, bias, y);
  auto s = static_cast<cudaStream_t>(stream);
  if (tactic < 0) return launch_gemm_gelu(plan_gemm_gelu(a, dev), a, dev, workspace, workspace_bytes, s);
  if (tactic < gemm_gelu_tactic_count()) return launch_gemm_gelu_with_tactic(tactic, a, dev, workspace, workspace_bytes, s);
  if (a.M == 0 || a.N == 0) return cudaSuccess;
  const Tactic& t = tactic_at(tactic);
  return t.can_implement(a, dev) ? t.run(a, dev, workspace, workspace_bytes, s) : cudaErrorNotSupported;
}

// 1 when the tactic takes this problem.
int ofk_can_implement(int tactic, int dtype, int act, float alpha, int trans_b, int allow_tf32, long long M,
                      long long N, long long K, const void* x, const void* w, const void* bias, void* y) {
  static const DeviceInfo dev = lab_device_info();
  const GemmGeluArgs a = make_args(dtype, act, alpha, trans_b, allow_tf32, M, N, K, x, w, bias, y);
  return tactic_at(tactic).can_implement(a, dev) ? 1 : 0;
}

unsigned long long ofk_workspace(int dtype, int act, float alpha, int trans_b, int allow_tf32, long long M,
                                 long long N, long long K, const void* x, const void* w, const void* bias, void* y) {
  static const DeviceInfo dev = lab_device_info();
  return plan_gemm_gelu(make_args(dtype, act, alpha, trans_b, allow_tf32, M, N, K, x, w, bias, y), dev).workspace_bytes;
}

const char* ofk_dispatch_name(int dtype, int act, float alpha, int trans_b, int allow_tf32, long long M, long long N,
                              long long K, const void* x, const void* w, const void* bias, void* y) {
  static const DeviceInfo dev = lab_device_info();
  return gemm_gelu_tactic_name(make_args(dtype, act, alpha, trans_b, allow_tf32, M, N, K, x, w, bias, y), dev);
}

// Host nanoseconds per call of the dispatch's launch path (what the ORT kernel's Compute adds on top of ORT's
// own bookkeeping), of its tactic choice + workspace query alone, and of launching an empty kernel (the
// floor), each over `iters` calls without synchronizing (the GPU queue absorbs them; keep iters small).
// out[0] = plan + launch, out[1] = plan_gemm_gelu alone, out[2] = empty kernel launch, out[3] = the two
// cudaFuncSetAttribute calls CUTLASS makes before each launch of a clustered kernel with > 48 KB of smem.
int ofk_host_ns(int dtype, int act, int trans_b, long long M, long long N, long long K, const void* x,
                const void* w, const void* bias, void* y, void* stream, int iters, double* out) {
  static const DeviceInfo dev = lab_device_info();
  const GemmGeluArgs a = make_args(dtype, act, 1.702f, trans_b, 1, M, N, K, x, w, bias, y);
  auto s = static_cast<cudaStream_t>(stream);
  cudaError_t e = cudaSuccess;
  out[0] = host_ns_per_call(iters, [&] {
    if (e == cudaSuccess) e = launch_gemm_gelu(plan_gemm_gelu(a, dev), a, dev, nullptr, 0, s);
  });
  out[1] = host_ns_per_call(iters, [&] { (void)plan_gemm_gelu(a, dev); });
  out[2] = host_ns_per_call(iters, [&] { empty_kernel<<<1, 32, 0, s>>>(); });
  out[3] = host_ns_per_call(iters, [&] {
    cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 << 10);
  });
  return e != cudaSuccess ? e : cudaGetLastError();
}

}  // extern "C"
