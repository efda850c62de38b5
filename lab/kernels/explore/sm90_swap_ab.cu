// Kernel lab only: GEMM + bias + activation for few rows with the operands swapped, Yᵀ = W·Xᵀ, on Hopper's
// TMA + GMMA main loop (CUTLASS 3). The question (lab/kernels/NOTES.md, "swap-AB for few rows"): at 9-64 rows
// of a large W the op's W [N, K] takes cuBLAS's TN kernels, slower than the NN kernel ORT's MatMul runs on
// W [K, N] (fp32 TF32 16x4096x16384: 73-75 µs with the activation against 65-68 for ORT's GEMM alone), and the
// fused kernel's tiles spend their MMA on rows that are not there. Swapped, W's rows are CUTLASS's M (tiles of
// 64-128 of them, streamed by TMA) and the few rows of X its N (tile 16 or 32): every byte of W is read once,
// by a pipelined copy engine, and the GMMA is issued for the rows that exist.
//   CUTLASS A = W [N, K] row-major (K-major), B = X [M, K] (K-major: CUTLASS's ColumnMajor B),
//   D = Yᵀ [N, M] column-major with leading dimension N (that is Y [M, N] row-major),
//   epilogue act(acc + bias[i]) with the bias a column broadcast (one value per row of D: per column of Y),
//   the activation the product's own functor (cutlass_activation.cuh).
// Built as a shared library for lab/kernels/swap_ab_probe.py (ctypes), which times it against cuBLAS in the
// same process:
//   nvcc -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr -Xcompiler=-fPIC -shared \
//     -gencode=arch=compute_90a,code=sm_90a -I$CUTLASS/include -I$CUTLASS/tools/util/include \
//     -Icustom_ops/src/cuda -Icustom_ops/src -Icustom_ops/src/cuda/hooks \
//     lab/kernels/explore/sm90_swap_ab.cu -o .device/lib/libswap_ab.so
#ifndef NDEBUG
#define NDEBUG
#endif

#include <cstdint>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/device_kernel.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/operations.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/util/packed_stride.hpp>

#include "cutlass_activation.cuh"

namespace ofk_swap_ab {

using onnxfuse::cuda::ActivationParams;

template <class Element, int TileM, int TileN, int TileK, bool kPingpong>
struct SwapAB {
  using ElementCompute = float;
  static constexpr int kAlignment = 16 / sizeof(Element);  // TMA: 16-byte rows and base addresses
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;

  using LayoutA = cutlass::layout::RowMajor;     // W [N, K]
  using LayoutB = cutlass::layout::ColumnMajor;  // X [M, K]
  using LayoutD = cutlass::layout::ColumnMajor;  // Yᵀ [N, M], leading dimension N
  using TileShape = cute::Shape<cute::Int<TileM>, cute::Int<TileN>, cute::Int<TileK>>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using MainloopSchedule = std::conditional_t<kPingpong, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                                              cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
  using EpilogueSchedule = std::conditional_t<kPingpong, cutlass::epilogue::TmaWarpSpecialized,
                                              cutlass::epilogue::TmaWarpSpecializedCooperative>;

  // act(acc + bias[i]): the bias runs along D's rows (W's rows, the op's N).
  using BiasCol = cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, Element, ElementCompute,
                                                              cute::Stride<cute::_1, cute::_0, int64_t>, kAlignment>;
  using AddBias = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::plus, ElementCompute, ElementCompute, kRound>,
      cutlass::epilogue::fusion::Sm90AccFetch, BiasCol>;
  using Fusion = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<onnxfuse::cuda::CutlassActivationFor<Element>::template Fn, Element,
                                             ElementCompute, kRound>,
      AddBias>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, ElementCompute, void, LayoutD, kAlignment, Element,
      LayoutD, kAlignment, EpilogueSchedule, Fusion>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA, kAlignment, Element, LayoutB,
      kAlignment, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      MainloopSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop, Epilogue>;

  static typename Kernel::Arguments arguments(const void* x, const void* w, const void* bias, void* y, int M, int N,
                                              int K, ActivationParams act, int sm_count) {
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    using StrideD = typename Kernel::StrideD;
    typename Kernel::Arguments args{};
    args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
    args.problem_shape = {N, M, K, 1};
    args.mainloop = {static_cast<const Element*>(w), cutlass::make_cute_packed_stride(StrideA{}, cute::make_shape(N, K, 1)),
                     static_cast<const Element*>(x), cutlass::make_cute_packed_stride(StrideB{}, cute::make_shape(M, K, 1))};
    // Sm90EVT arguments are {children..., node}: {{acc, bias, plus}, activation}.
    args.epilogue.thread = {{{}, {static_cast<const Element*>(bias)}, {}}, act};
    args.epilogue.ptr_C = nullptr;
    args.epilogue.dC = typename Kernel::StrideC{};
    args.epilogue.ptr_D = static_cast<Element*>(y);
    args.epilogue.dD = cutlass::make_cute_packed_stride(StrideD{}, cute::make_shape(N, M, 1));
    args.hw_info.device_id = 0;
    args.hw_info.sm_count = sm_count;
    return args;
  }

  static int run(const void* x, const void* w, const void* bias, void* y, int M, int N, int K, ActivationParams act,
                 int sm_count, cudaStream_t stream) {
    const auto args = arguments(x, w, bias, y, M, N, K, act, sm_count);
    if (!Kernel::can_implement(args)) return -2;
    // The tile scheduler's workspace, if it asks for one: one buffer for the process, grown as needed (lab only).
    static void* workspace = nullptr;
    static size_t workspace_bytes = 0;
    const size_t need = Kernel::get_workspace_size(args);
    if (need > workspace_bytes) {
      if (workspace != nullptr) cudaFree(workspace);
      workspace = nullptr;
      workspace_bytes = 0;
      if (cudaMalloc(&workspace, need) != cudaSuccess) return -3;
      workspace_bytes = need;
    }
    if (Kernel::initialize_workspace(args, workspace, stream) != cutlass::Status::kSuccess) return -3;
    typename Kernel::Params params = Kernel::to_underlying_arguments(args, workspace);
    constexpr int smem_bytes = Kernel::SharedStorageSize;
    cudaError_t e = cudaFuncSetAttribute(cutlass::device_kernel<Kernel>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         smem_bytes);
    if (e != cudaSuccess) return static_cast<int>(e);
    cudaLaunchConfig_t config{};
    config.gridDim = Kernel::get_grid_shape(params);
    config.blockDim = Kernel::get_block_shape();
    config.dynamicSmemBytes = smem_bytes;
    config.stream = stream;
    void* kernel_params[] = {&params};
    e = cudaLaunchKernelExC(&config, reinterpret_cast<const void*>(cutlass::device_kernel<Kernel>), kernel_params);
    return static_cast<int>(e);
  }
};

using RunFn = int (*)(const void*, const void*, const void*, void*, int, int, int, ActivationParams, int, cudaStream_t);
struct Variant {
  const char* name;
  int dtype;  // 0 float32 (TF32 GMMA), 1 float16, 2 bfloat16: the op's DType codes
  RunFn run;
};

// Tiles of W's rows (M) × X's rows (N) × K; "coop": two consumer warpgroups on one tile, "pp": ping-pong.
constexpr Variant kVariants[] = {
    {"tf32 128x16x32 coop", 0, SwapAB<float, 128, 16, 32, false>::run},
#ifndef OFK_SWAP_FIRST_ONLY  // a quick compile of one variant
    {"tf32 64x16x32 pp", 0, SwapAB<float, 64, 16, 32, true>::run},
    {"tf32 128x32x32 coop", 0, SwapAB<float, 128, 32, 32, false>::run},
    {"tf32 64x64x32 pp", 0, SwapAB<float, 64, 64, 32, true>::run},
    {"f16 128x16x64 coop", 1, SwapAB<cutlass::half_t, 128, 16, 64, false>::run},
    {"f16 64x16x64 pp", 1, SwapAB<cutlass::half_t, 64, 16, 64, true>::run},
    {"f16 128x32x64 coop", 1, SwapAB<cutlass::half_t, 128, 32, 64, false>::run},
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
  onnxfuse::cuda::ActivationParams p{};
  p.act = act;
  return ofk_swap_ab::kVariants[i].run(x, w, bias, y, static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), p,
                                       sm_count, static_cast<cudaStream_t>(stream));
}

}  // extern "C"
