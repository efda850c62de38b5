// Kernel lab: the few-rows kernel with the operands swapped, Yᵀ = W·Xᵀ (the product's sm90_swap_ab.cuh), in more
// tiles than the product ships, for lab/kernels/swap_ab_probe.py (ctypes), which times them against cuBLAS in the
// same process. The question it answered (lab/kernels/NOTES.md, "Swap-AB for few rows"): at 9-64 rows of a large
// W the op's W [N, K] took cuBLAS's TN kernels, slower than the NN kernel ORT's MatMul runs on W [K, N], and the
// fused kernel's tiles spent their MMA on rows that are not there. Each variant runs through the product's own
// tactic code (Sm90Tactic over Sm90SwapConfig), so what the probe times is what the product would run.
// Built as a shared library:
//   nvcc -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr -Xcompiler=-fPIC -shared \
//     -gencode=arch=compute_90a,code=sm_90a -I$CUTLASS/include -I$CUTLASS/tools/util/include \
//     -Icustom_ops/src -Icustom_ops/src/cuda/hooks \
//     lab/kernels/explore/sm90_swap_ab.cu -o .device/lab_lib/libswap_ab.so
#include <cstdint>

#include "cuda/kernels/sm90_swap_ab.cuh"

namespace ofk_swap_ab {

using namespace onnxfuse::cuda;

// One configuration through the product's own tactic code (can_implement, workspace, launch): 0, a cudaError_t,
// -2 where it cannot take the problem, -3 where its workspace failed.
template <DType D, int TileW, int TileX, int TileK, Sm90Schedule S>
int run(const void* x, const void* w, const void* bias, void* y, int64_t M, int64_t N, int64_t K, int act,
        int sm_count, cudaStream_t stream) {
  using T = Sm90Tactic<Sm90SwapConfig<D, TileW, TileX, TileK, S>>;
  GemmGeluArgs a{};
  a.dtype = D;
  a.act = static_cast<onnxfuse::Activation>(act);
  a.alpha = 1.702f;  // the sigmoid form's QuickGELU constant
  a.trans_b = true;
  a.allow_tf32 = true;
  a.M = M;
  a.N = N;
  a.K = K;
  a.x = x;
  a.w = w;
  a.bias = bias;
  a.y = y;
  DeviceInfo dev{};
  if (cudaGetDevice(&dev.device) != cudaSuccess) return -3;
  dev.cc_major = 9;
  dev.sm_count = sm_count;
  if (!T::can_implement(a, dev)) return -2;
  // The tile scheduler's workspace, if it asks for one: one buffer for the process, grown as needed (lab only).
  static void* workspace = nullptr;
  static size_t workspace_bytes = 0;
  const size_t need = T::workspace(a, dev);
  if (need > workspace_bytes) {
    if (workspace != nullptr) cudaFree(workspace);
    workspace = nullptr;
    workspace_bytes = 0;
    if (cudaMalloc(&workspace, need) != cudaSuccess) return -3;
    workspace_bytes = need;
  }
  return static_cast<int>(T::run(a, dev, workspace, workspace_bytes, stream));
}

using RunFn = int (*)(const void*, const void*, const void*, void*, int64_t, int64_t, int64_t, int, int, cudaStream_t);
struct Variant {
  const char* name;
  int dtype;  // 0 float32 (TF32 GMMA), 1 float16, 2 bfloat16: the op's DType codes
  RunFn run;
};

// Tiles of W's rows (M) × X's rows (N) × K; "coop": two consumer warpgroups on one tile, "pp": ping-pong,
// "streamk": cooperative with the MAC iterations dealt evenly to the SMs (a W of few 128-row strips, as a narrow,
// deep one, still fills the chip; second round of the probe).
constexpr Sm90Schedule kPP = Sm90Schedule::kPingpong, kCoop = Sm90Schedule::kCooperative,
                       kStreamK = Sm90Schedule::kStreamK;
constexpr Variant kVariants[] = {
    {"tf32 128x16x32 coop", 0, run<DType::kFloat32, 128, 16, 32, kCoop>},
#ifndef OFK_SWAP_FIRST_ONLY  // a quick compile of one variant
    {"tf32 64x16x32 pp", 0, run<DType::kFloat32, 64, 16, 32, kPP>},
    {"tf32 128x32x32 coop", 0, run<DType::kFloat32, 128, 32, 32, kCoop>},
    {"tf32 64x64x32 pp", 0, run<DType::kFloat32, 64, 64, 32, kPP>},
    {"tf32 128x16x32 streamk", 0, run<DType::kFloat32, 128, 16, 32, kStreamK>},
    {"tf32 128x32x32 streamk", 0, run<DType::kFloat32, 128, 32, 32, kStreamK>},
    {"f16 128x16x64 coop", 1, run<DType::kFloat16, 128, 16, 64, kCoop>},
    {"f16 64x16x64 pp", 1, run<DType::kFloat16, 64, 16, 64, kPP>},
    {"f16 128x32x64 coop", 1, run<DType::kFloat16, 128, 32, 64, kCoop>},
    {"f16 128x16x64 streamk", 1, run<DType::kFloat16, 128, 16, 64, kStreamK>},
    {"f16 128x32x64 streamk", 1, run<DType::kFloat16, 128, 32, 64, kStreamK>},
#endif
};

}  // namespace ofk_swap_ab

extern "C" {

int ofk_swap_variant_count() { return static_cast<int>(sizeof(ofk_swap_ab::kVariants) / sizeof(ofk_swap_ab::kVariants[0])); }
const char* ofk_swap_variant_name(int i) { return ofk_swap_ab::kVariants[i].name; }
int ofk_swap_variant_dtype(int i) { return ofk_swap_ab::kVariants[i].dtype; }

// Y [M, N] = act(X [M, K] · W [N, K]ᵀ + bias [N]) on `stream`; 0 or a cudaError_t, -2 where the variant cannot
// take the problem (K or N not a multiple of 16 bytes, unaligned pointers), -3 where its workspace failed.
// act: 0 erf, 1 tanh, 2 sigmoid (onnxfuse::Activation).
int ofk_swap_run(int i, int act, const void* x, const void* w, const void* bias, void* y, long long M, long long N,
                 long long K, int sm_count, void* stream) {
  return ofk_swap_ab::kVariants[i].run(x, w, bias, y, M, N, K, act, sm_count, static_cast<cudaStream_t>(stream));
}

}  // extern "C"
