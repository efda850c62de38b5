// Hopper GEMM + bias + activation on CUTLASS 3: TMA loads into a multistage smem ring, a warp-specialized
// GMMA main loop (ping-pong or cooperative), and an epilogue visitor tree that computes
//     D = act(acc + bias[n])
// in registers on the fp32 accumulator: the pre-activation never reaches global memory, and there is no C
// operand load (ElementC = void). The bias is a row broadcast read straight into registers (sm90_bias_row.cuh)
// whose null pointer means "no bias" (zeros), so one instantiation serves bias and no-bias.
//
// Included only by the sm90_*.cu instantiation files (compiled for sm_90a).
#pragma once

// Device-side asserts inside CUTLASS/CuTe become calls that make ptxas serialize the wgmma pipeline
// (warning C7510): the kernels are always built without them, whatever the build type.
#ifndef NDEBUG
#define NDEBUG
#endif

#include <atomic>
#include <climits>
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

#include "cuda/kernels/cutlass_activation.cuh"
#include "cuda/kernels/sm90_bias_row.cuh"
#include "cuda/kernels/sm90_warp_epilogue_kernel.cuh"
#include "kernel_hooks.cuh"
#include "cuda/dispatch/tactics.cuh"

namespace onnxfuse::cuda {

template <DType D>
struct Sm90Element;
template <>
struct Sm90Element<DType::kFloat16> { using type = cutlass::half_t; };
template <>
struct Sm90Element<DType::kBFloat16> { using type = cutlass::bfloat16_t; };
template <>
struct Sm90Element<DType::kFloat32> { using type = float; };  // float operands run on TF32 GMMA

// The epilogue visitor tree of every sm90 kernel here, act(acc + bias) on the fp32 accumulator with one rounding to
// Element. BiasNode reads the bias: a row broadcast for Y = X·Wᵀ (sm90_bias_row.cuh), a column broadcast for the
// swapped Yᵀ = W·Xᵀ (sm90_swap_ab.cuh).
template <class Element, class BiasNode>
using Sm90BiasActivation = cutlass::epilogue::fusion::Sm90EVT<
    cutlass::epilogue::fusion::Sm90Compute<CutlassActivationFor<Element>::template Fn, Element, float,
                                           cutlass::FloatRoundStyle::round_to_nearest>,
    cutlass::epilogue::fusion::Sm90EVT<cutlass::epilogue::fusion::Sm90Compute<cutlass::plus, float, float,
                                                                              cutlass::FloatRoundStyle::round_to_nearest>,
                                       cutlass::epilogue::fusion::Sm90AccFetch, BiasNode>>;

// The arguments of that epilogue in a CUTLASS kernel: the bias and the activation from `a`, no C operand, and D =
// a.y, packed as a [rows, cols] matrix in the kernel's D layout.
template <class GemmKernel, class Element>
void set_bias_activation_epilogue(typename GemmKernel::Arguments& args, const GemmGeluArgs& a, int rows, int cols) {
  // Sm90EVT arguments are {children..., node}: {{acc, bias, plus}, activation}.
  args.epilogue.thread = {{{}, {static_cast<const Element*>(a.bias)}, {}}, activation_params(a)};
  args.epilogue.ptr_C = nullptr;
  args.epilogue.dC = typename GemmKernel::StrideC{};
  args.epilogue.ptr_D = static_cast<Element*>(a.y);
  args.epilogue.dD = cutlass::make_cute_packed_stride(typename GemmKernel::StrideD{}, cute::make_shape(rows, cols, 1));
}

// What every sm90 kernel of Y = act(X·Wᵀ + bias) here takes from `a` but its epilogue: the problem, X and W for
// the main loop, the device, and the persistent tile walk (the swizzle for TileM x TileN tiles in clusters of
// ClusterM x ClusterN; stream-K kernels let the lab's hook adjust their decomposition).
template <class GemmKernel, class Element, bool kStreamK = false>
typename GemmKernel::Arguments sm90_mainloop_arguments(const GemmGeluArgs& a, const DeviceInfo& dev, int tile_m,
                                                       int tile_n, int cluster_m, int cluster_n) {
  const int M = static_cast<int>(a.M), N = static_cast<int>(a.N), K = static_cast<int>(a.K);
  using StrideA = typename GemmKernel::StrideA;
  using StrideB = typename GemmKernel::StrideB;
  const StrideA stride_a = cutlass::make_cute_packed_stride(StrideA{}, cute::make_shape(M, K, 1));
  const StrideB stride_b = cutlass::make_cute_packed_stride(StrideB{}, cute::make_shape(N, K, 1));
  typename GemmKernel::Arguments args{};
  args.problem_shape = {M, N, K, 1};
  args.mainloop = {static_cast<const Element*>(a.x), stride_a, static_cast<const Element*>(a.w), stride_b};
  args.hw_info.device_id = dev.device;
  args.hw_info.sm_count = dev.sm_count;
  args.scheduler.max_swizzle_size = sm90_swizzle(a, dev, tile_m, tile_n, cluster_m, cluster_n);
  hooks::adjust_sm90_scheduler<kStreamK>(args.scheduler);
  return args;
}

// The per-warp epilogue's parameters (our kernel layer, sm90_warp_epilogue.cuh): Y, the bias, the activation.
template <class EpilogueParams, class Element>
EpilogueParams sm90_warp_epilogue_params(const GemmGeluArgs& a) {
  const int M = static_cast<int>(a.M), N = static_cast<int>(a.N);
  return {static_cast<Element*>(a.y), N, static_cast<const Element*>(a.bias), M, N, activation_params(a)};
}

template <class Config>
struct Sm90Kernel;

template <DType D, bool TransB, int TileM, int TileN, int TileK, int ClusterM, int ClusterN, Sm90Schedule S,
          int EpiM, int EpiN>
struct Sm90Kernel<Sm90Config<D, TransB, TileM, TileN, TileK, ClusterM, ClusterN, S, EpiM, EpiN>> {
  using Element = typename Sm90Element<D>::type;
  using ElementAccumulator = float;
  using ElementCompute = float;
  static constexpr int kAlignment = 16 / sizeof(Element);  // TMA: 16-byte rows and base addresses

  // X [M, K] row-major = K-major A. W [N, K] (trans_b) = K-major B = CUTLASS ColumnMajor B;
  // W [K, N] = N-major B = RowMajor B. Y [M, N] row-major.
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = std::conditional_t<TransB, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  using LayoutD = cutlass::layout::RowMajor;

  using TileShape = cute::Shape<cute::Int<TileM>, cute::Int<TileN>, cute::Int<TileK>>;
  using ClusterShape = cute::Shape<cute::Int<ClusterM>, cute::Int<ClusterN>, cute::_1>;
  // Our kernel layer (sm90_warp_epilogue_kernel.cuh: per-warp epilogues, no order between the warpgroups'
  // epilogues) or CUTLASS's kernels.
  static constexpr bool kOwnKernel = S == Sm90Schedule::kOverlappedPingpong || S == Sm90Schedule::kOverlappedPingpong3;
  static constexpr int kConsumerGroups = S == Sm90Schedule::kOverlappedPingpong3 ? 3 : 2;  // our kernel's
  static constexpr bool kPingpong = S == Sm90Schedule::kPingpong || kOwnKernel;
  using MainloopSchedule = std::conditional_t<kPingpong, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                                              cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
  using EpilogueSchedule = std::conditional_t<kPingpong, cutlass::epilogue::TmaWarpSpecialized,
                                              cutlass::epilogue::TmaWarpSpecializedCooperative>;
  // Persistent data-parallel tiles (void = CUTLASS's default), or stream-K: the MAC iterations of all tiles
  // dealt evenly to the SMs, partial tiles reduced in a workspace in a fixed order (deterministic).
  using TileScheduler =
      std::conditional_t<S == Sm90Schedule::kStreamK, cutlass::gemm::StreamKScheduler, void>;

  using EpilogueTile = std::conditional_t<EpiM == 0, cutlass::epilogue::collective::EpilogueTileAuto,
                                          cute::Shape<cute::Int<EpiM>, cute::Int<EpiN>>>;

  // CUTLASS's epilogue: a visitor tree act(acc + bias_row[n]).
  using Fusion = Sm90BiasActivation<Element, Sm90BiasRow<Element, ElementCompute, kAlignment>>;
  // Named here and instantiated only where used: our kernel has an epilogue of its own.
  using EpilogueBuilder = cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape, EpilogueTile, ElementAccumulator,
      ElementCompute,
      void, LayoutD, kAlignment,  // no C operand
      Element, LayoutD, kAlignment, EpilogueSchedule, Fusion>;

  // The shared memory the epilogue keeps from the main loop's stages: CUTLASS's staging buffers, or our kernel's
  // per-warp buffers.
  static constexpr int epilogue_smem_bytes() {
    if constexpr (kOwnKernel)
      return sm90_warp_epilogue_smem_bytes<Element, TileN, kConsumerGroups>();
    else
      return static_cast<int>(sizeof(typename EpilogueBuilder::CollectiveOp::SharedStorage));
  }
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA, kAlignment, Element, LayoutB,
      kAlignment, ElementAccumulator, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<epilogue_smem_bytes()>, MainloopSchedule>::CollectiveOp;

  struct OwnKernel {
    using type = Sm90WarpEpilogueKernel<CollectiveMainloop, Element, kConsumerGroups>;
  };
  struct CutlassKernel {
    using type = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, CollectiveMainloop,
                                                      typename EpilogueBuilder::CollectiveOp, TileScheduler>;
  };
  using GemmKernel = typename std::conditional_t<kOwnKernel, OwnKernel, CutlassKernel>::type;

  static bool shape_fits(const GemmGeluArgs& a, const DeviceInfo& dev) {
    const int64_t ldb = TransB ? a.K : a.N;
    return dev.cc_major == 9 && dev.cc_minor == 0 && a.dtype == D && a.trans_b == TransB &&
           (D != DType::kFloat32 || a.allow_tf32) && a.M > 0 && a.N > 0 && a.K > 0 && a.M <= INT_MAX &&
           a.N <= INT_MAX && a.K <= INT_MAX && a.K % kAlignment == 0 && a.N % kAlignment == 0 &&
           ldb % kAlignment == 0 && aligned_to(a.x, 16) && aligned_to(a.w, 16) && aligned_to(a.y, 16) &&
           (a.bias == nullptr || aligned_to(a.bias, 16));
  }

  static typename GemmKernel::Arguments make_arguments(const GemmGeluArgs& a, const DeviceInfo& dev) {
    auto args = sm90_mainloop_arguments<GemmKernel, Element, S == Sm90Schedule::kStreamK>(a, dev, TileM, TileN,
                                                                                         ClusterM, ClusterN);
    if constexpr (kOwnKernel) {
      args.epilogue = sm90_warp_epilogue_params<decltype(args.epilogue), Element>(a);
    } else {
      args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
      set_bias_activation_epilogue<GemmKernel, Element>(args, a, static_cast<int>(a.M), static_cast<int>(a.N));
    }
    return args;
  }
};

template <class Config>
bool Sm90Tactic<Config>::can_implement(const GemmGeluArgs& a, const DeviceInfo& dev) {
  using K = Sm90Kernel<Config>;
  if (!K::shape_fits(a, dev)) return false;
  return K::GemmKernel::can_implement(K::make_arguments(a, dev));
}

template <class Config>
size_t Sm90Tactic<Config>::workspace(const GemmGeluArgs& a, const DeviceInfo& dev) {
  using K = Sm90Kernel<Config>;
  if (!K::shape_fits(a, dev)) return 0;
  return K::GemmKernel::get_workspace_size(K::make_arguments(a, dev));
}

// The dynamic shared memory a kernel launches with (above the 48 KB default) is a per-device attribute of the
// kernel: set once per device here, where CUTLASS's device adapter sets it again before every launch, along
// with the non-portable cluster size flag that clusters of 2 CTAs do not need. Two racing first calls both
// set it, which is harmless; devices past 63 simply set it every time.
template <class GemmKernel>
cudaError_t allow_dynamic_smem_once(int device, int smem_bytes) {
  static std::atomic<uint64_t> done_on{0};
  const uint64_t bit = device >= 0 && device < 64 ? uint64_t{1} << device : 0;
  if (bit != 0 && (done_on.load(std::memory_order_acquire) & bit) != 0) return cudaSuccess;
  const cudaError_t e = cudaFuncSetAttribute(cutlass::device_kernel<GemmKernel>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (e == cudaSuccess) done_on.fetch_or(bit, std::memory_order_release);
  return e;
}

// Precondition: can_implement(a, dev) (the dispatch and launch_gemm_gelu_with_tactic check it first).
template <class Config>
cudaError_t Sm90Tactic<Config>::run(const GemmGeluArgs& a, const DeviceInfo& dev, void* workspace,
                                    size_t workspace_bytes, cudaStream_t stream) {
  using K = Sm90Kernel<Config>;
  using GemmKernel = typename K::GemmKernel;
  if (!K::shape_fits(a, dev)) return cudaErrorNotSupported;
  const auto args = K::make_arguments(a, dev);
  if (GemmKernel::get_workspace_size(args) > workspace_bytes) return cudaErrorInvalidValue;
  if (GemmKernel::initialize_workspace(args, workspace, stream) != cutlass::Status::kSuccess) return cudaErrorUnknown;
  typename GemmKernel::Params params = GemmKernel::to_underlying_arguments(args, workspace);

  constexpr int smem_bytes = GemmKernel::SharedStorageSize;
  if (const cudaError_t e = allow_dynamic_smem_once<GemmKernel>(dev.device, smem_bytes); e != cudaSuccess) return e;
  // The launch CUTLASS's adapter makes, without its per-call attribute calls: grid and block from the kernel,
  // the cluster shape as a launch attribute.
  cudaLaunchConfig_t config{};
  config.gridDim = GemmKernel::get_grid_shape(params);
  config.blockDim = GemmKernel::get_block_shape();
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = cute::size<0>(typename K::ClusterShape{});
  cluster.val.clusterDim.y = cute::size<1>(typename K::ClusterShape{});
  cluster.val.clusterDim.z = 1;
  if (cluster.val.clusterDim.x * cluster.val.clusterDim.y > 1) {
    config.attrs = &cluster;
    config.numAttrs = 1;
  }
  void* kernel_params[] = {&params};
  return cudaLaunchKernelExC(&config, reinterpret_cast<const void*>(cutlass::device_kernel<GemmKernel>),
                             kernel_params);
}

}  // namespace onnxfuse::cuda

// One line per tactic in the sm90_*.cu files.
#define ONNXFUSE_SM90_TACTIC(D, TRANS_B, TM, TN, TK, CM, CN, SCHED, EM, EN) \
  template struct onnxfuse::cuda::Sm90Tactic<                               \
      onnxfuse::cuda::Sm90Config<D, TRANS_B, TM, TN, TK, CM, CN, onnxfuse::cuda::Sm90Schedule::SCHED, EM, EN>>;
