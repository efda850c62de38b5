// What the lab's tactics on our sm90 kernel layer (sm90_split_n_kernel.cuh, sm90_intra_overlap_kernel.cuh) share
// with the shipped one (Sm90Kernel in sm90_gemm_gelu.cuh): the operands' layouts, the checks a problem must pass
// (16-bit, rows of 16-byte vectors for TMA) and the arguments (the main loop's, the per-warp epilogue's). A tactic
// adds its main-loop collective and its kernel (GemmKernel), as Sm90Tactic uses them.
#pragma once

#include <climits>
#include <cstdint>
#include <type_traits>

#include "cuda/kernels/sm90_gemm_gelu.cuh"

namespace ofk_explore {

template <onnxfuse::cuda::DType D, bool TransB, int TileM, int TileN, int TileK, int ClusterM, int ClusterN>
struct KernelLayerTactic {
  static_assert(D != onnxfuse::cuda::DType::kFloat32, "the per-warp epilogue stores 16-bit outputs only");
  using Element = typename onnxfuse::cuda::Sm90Element<D>::type;
  static constexpr int kAlignment = 16 / sizeof(Element);  // TMA: 16-byte rows and base addresses
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = std::conditional_t<TransB, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  using TileShape = cute::Shape<cute::Int<TileM>, cute::Int<TileN>, cute::Int<TileK>>;
  using ClusterShape = cute::Shape<cute::Int<ClusterM>, cute::Int<ClusterN>, cute::_1>;

  static bool shape_fits(const onnxfuse::cuda::GemmGeluArgs& a, const onnxfuse::cuda::DeviceInfo& dev) {
    using onnxfuse::cuda::aligned_to;
    const int64_t ldb = TransB ? a.K : a.N;
    return dev.cc_major == 9 && dev.cc_minor == 0 && a.dtype == D && a.trans_b == TransB && a.M > 0 && a.N > 0 &&
           a.K > 0 && a.M <= INT_MAX && a.N <= INT_MAX && a.K <= INT_MAX && a.K % kAlignment == 0 &&
           a.N % kAlignment == 0 && ldb % kAlignment == 0 && aligned_to(a.x, 16) && aligned_to(a.w, 16) &&
           aligned_to(a.y, 16) && (a.bias == nullptr || aligned_to(a.bias, 16));
  }

  template <class GemmKernel>
  static typename GemmKernel::Arguments arguments(const onnxfuse::cuda::GemmGeluArgs& a,
                                                  const onnxfuse::cuda::DeviceInfo& dev) {
    auto args = onnxfuse::cuda::sm90_mainloop_arguments<GemmKernel, Element>(a, dev, TileM, TileN, ClusterM, ClusterN);
    args.epilogue = onnxfuse::cuda::sm90_warp_epilogue_params<decltype(args.epilogue), Element>(a);
    return args;
  }
};

}  // namespace ofk_explore
