// Hopper GEMM + bias + activation for few rows, with the operands swapped: Yᵀ = act(W·Xᵀ + bias), one CUTLASS 3
// kernel (TMA loads, warp-specialized GMMA main loop, the activation in the epilogue on the fp32 accumulator:
// the pre-activation never reaches global memory), for W [N, K] (trans_b = 1).
//
// Why swapped: a GMMA's M is 64 rows per warpgroup, so at 5-64 rows of X the regular kernel's tiles spend most
// of their Tensor-Core work on rows that are not there, and cuBLAS on the op's W [N, K] reads W slower than the
// NN kernel ORT's MatMul runs on W [K, N]. With W as CUTLASS's A, W's rows are the GMMA's M (tiles of 64-128,
// streamed once by TMA) and X's few rows its N (a tile of 16 or 32): the kernel reads W at the copy engine's
// rate and computes only the rows that exist. Against torch on W [K, N] (ORT's layout) and on W [N, K], with the
// activation, it was ahead at 16 rows in fp32 (TF32) and fp16: lab/results/swap_ab_probe_h200.txt
// (lab/kernels/NOTES.md, "Swap-AB for few rows"; lab/kernels/swap_ab_probe.py).
//
// Layouts in CUTLASS's terms: A = W [N, K] row-major (K-major), B = X [M, K] K-major (CUTLASS's ColumnMajor B),
// D = Yᵀ [N, M] column-major with leading dimension N, which is Y [M, N] row-major. The bias runs along D's
// rows: a column broadcast, whose null pointer reads as zeros (no bias). TF32 GMMA takes K-major operands
// only, which both are here, so float32 runs on Tensor Cores too.
//
// The tactic interface (shape_fits, make_arguments, GemmKernel, ClusterShape) is Sm90Kernel's, so the launch
// code of sm90_gemm_gelu.cuh (Sm90Tactic) runs these kernels unchanged. Included only by the sm90_*_swap_ab.cu
// instantiation files (compiled for sm_90a).
#pragma once

#include "cuda/kernels/sm90_gemm_gelu.cuh"

namespace onnxfuse::cuda {

template <DType D, int TileW, int TileX, int TileK, Sm90Schedule S>
struct Sm90Kernel<Sm90SwapConfig<D, TileW, TileX, TileK, S>> {
  static_assert(S != Sm90Schedule::kOverlappedPingpong, "the overlapped kernel layer computes Y = X·Wᵀ only");
  using Element = typename Sm90Element<D>::type;
  using ElementAccumulator = float;
  using ElementCompute = float;
  static constexpr int kAlignment = 16 / sizeof(Element);  // TMA: 16-byte rows and base addresses

  using LayoutA = cutlass::layout::RowMajor;     // W [N, K]
  using LayoutB = cutlass::layout::ColumnMajor;  // X [M, K]
  using LayoutD = cutlass::layout::ColumnMajor;  // Yᵀ [N, M]
  using TileShape = cute::Shape<cute::Int<TileW>, cute::Int<TileX>, cute::Int<TileK>>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  static constexpr bool kPingpong = S == Sm90Schedule::kPingpong;
  using MainloopSchedule = std::conditional_t<kPingpong, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                                              cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
  using EpilogueSchedule = std::conditional_t<kPingpong, cutlass::epilogue::TmaWarpSpecialized,
                                              cutlass::epilogue::TmaWarpSpecializedCooperative>;
  // Stream-K (cooperative): the MAC iterations dealt evenly to the SMs, partial tiles reduced in a workspace in a
  // fixed order before the epilogue, so a W of few strips still fills the chip.
  using TileScheduler = std::conditional_t<S == Sm90Schedule::kStreamK, cutlass::gemm::StreamKScheduler, void>;

  // act(acc + bias[i]), i along W's rows: the regular kernels' epilogue with the bias as a column broadcast.
  using BiasColumn = cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, Element, ElementCompute,
                                                                 cute::Stride<cute::_1, cute::_0, int64_t>, kAlignment>;
  using Fusion = Sm90BiasActivation<Element, BiasColumn>;
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator, ElementCompute,
      void, LayoutD, kAlignment,  // no C operand
      Element, LayoutD, kAlignment, EpilogueSchedule, Fusion>::CollectiveOp;
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA, kAlignment, Element, LayoutB,
      kAlignment, ElementAccumulator, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      MainloopSchedule>::CollectiveOp;
  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, CollectiveMainloop,
                                                          CollectiveEpilogue, TileScheduler>;

  // Y's rows are D's columns at stride N, so N, like K, must keep 16-byte rows.
  static bool shape_fits(const GemmGeluArgs& a, const DeviceInfo& dev) {
    return dev.cc_major == 9 && dev.cc_minor == 0 && a.dtype == D && a.trans_b &&
           (D != DType::kFloat32 || a.allow_tf32) && a.M > 0 && a.N > 0 && a.K > 0 && a.M <= INT_MAX &&
           a.N <= INT_MAX && a.K <= INT_MAX && a.K % kAlignment == 0 && a.N % kAlignment == 0 &&
           aligned_to(a.x, 16) && aligned_to(a.w, 16) && aligned_to(a.y, 16) &&
           (a.bias == nullptr || aligned_to(a.bias, 16));
  }

  static typename GemmKernel::Arguments make_arguments(const GemmGeluArgs& a, const DeviceInfo& dev) {
    const int M = static_cast<int>(a.M), N = static_cast<int>(a.N), K = static_cast<int>(a.K);
    using StrideA = typename GemmKernel::StrideA;
    using StrideB = typename GemmKernel::StrideB;
    typename GemmKernel::Arguments args{};
    args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
    args.problem_shape = {N, M, K, 1};  // CUTLASS's M is W's rows, its N the rows of X
    args.mainloop = {static_cast<const Element*>(a.w), cutlass::make_cute_packed_stride(StrideA{}, cute::make_shape(N, K, 1)),
                     static_cast<const Element*>(a.x), cutlass::make_cute_packed_stride(StrideB{}, cute::make_shape(M, K, 1))};
    set_bias_activation_epilogue<GemmKernel, Element>(args, a, N, M);  // D = Yᵀ [N, M]
    args.hw_info.device_id = dev.device;
    args.hw_info.sm_count = dev.sm_count;
    hooks::adjust_sm90_scheduler<S == Sm90Schedule::kStreamK>(args.scheduler);
    return args;
  }
};

}  // namespace onnxfuse::cuda

// One line per tactic in the sm90_*_swap_ab.cu files.
#define ONNXFUSE_SM90_SWAP_TACTIC(D, TW, TX, TK, SCHED) \
  template struct onnxfuse::cuda::Sm90Tactic<        \
      onnxfuse::cuda::Sm90SwapConfig<D, TW, TX, TK, onnxfuse::cuda::Sm90Schedule::SCHED>>;
