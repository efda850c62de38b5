// The shipped overlapped ping-pong kernel (custom_ops/src/cuda/kernels/sm90_warp_epilogue_kernel.cuh) with three
// consumer warpgroups instead of two (issue #20; lab/kernels/NOTES.md, v10), and its control: two warpgroups with the
// main-loop stages that three leave.
//
// Why three might win: at K <= 512 a warpgroup's epilogue of a 128x128 tile outlasts the other warpgroup's main
// loop (NOTES v8: 85 % of issue slots empty, one warp per scheduler running a dependent stretch while the Tensor
// Cores wait). With three warpgroups taking turns on the Tensor Cores, two epilogues run beside each main loop: a
// warpgroup's period is one main loop plus one epilogue for three tiles' worth of main loops, and two warps per
// scheduler share the epilogue's latency. The price: 160 registers per consumer thread (FlashAttention-3's split,
// 32 left to the producer), the bias read after the main loop, and 12 warps' staging buffers (48 KB at 128
// columns) taken from the main loop's stages (5 of 128x128x64 instead of 6). The control has the same stages with
// two warpgroups, so that a difference between it and three is the third warpgroup's, not the lost stage's.
//
// Tiles: explore/tiles.h group Q (schedule kWarpGroupsPingpong: EpiM = consumer warpgroups, EpiN = the warpgroups
// whose staging buffers the main loop's stage count leaves room for, 0 = the same), through explore/configs.h.
#pragma once

#include "configs.h"
#include "kernel_layer_tactic.cuh"
#include "cuda/kernels/sm90_gemm_gelu.cuh"
#include "cuda/kernels/sm90_warp_epilogue_kernel.cuh"

namespace onnxfuse::cuda {

// The tactic's kernel for a warpgroup-count configuration, as Sm90Tactic (sm90_gemm_gelu.cuh) uses it: the layer's
// operand layouts, checks and arguments (kernel_layer_tactic.cuh), CUTLASS's ping-pong main-loop collective (one
// warpgroup per tile), the shipped kernel with Groups consumer warpgroups.
template <DType D, bool TransB, int TileM, int TileN, int TileK, int ClusterM, int ClusterN, int Groups,
          int CarveoutGroups>
struct Sm90Kernel<
    ofk_explore::Sm90WarpGroupsConfig<D, TransB, TileM, TileN, TileK, ClusterM, ClusterN, Groups, CarveoutGroups>>
    : ofk_explore::KernelLayerTactic<D, TransB, TileM, TileN, TileK, ClusterM, ClusterN> {
  using Base = ofk_explore::KernelLayerTactic<D, TransB, TileM, TileN, TileK, ClusterM, ClusterN>;
  using Element = typename Base::Element;
  static constexpr int kCarveoutGroups = CarveoutGroups > 0 ? CarveoutGroups : Groups;
  static_assert(kCarveoutGroups >= Groups, "the kernel needs its own warps' staging buffers");
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, typename Base::LayoutA, Base::kAlignment, Element,
      typename Base::LayoutB, Base::kAlignment, float, typename Base::TileShape, typename Base::ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<sm90_warp_epilogue_smem_bytes<Element, TileN, kCarveoutGroups>()>,
      cutlass::gemm::KernelTmaWarpSpecializedPingpong>::CollectiveOp;
  using GemmKernel = Sm90WarpEpilogueKernel<CollectiveMainloop, Element, Groups>;

  static typename GemmKernel::Arguments make_arguments(const GemmGeluArgs& a, const DeviceInfo& dev) {
    return Base::template arguments<GemmKernel>(a, dev);
  }
};

}  // namespace onnxfuse::cuda
