// The split-N cooperative kernel of lab/kernels/NOTES.md v7b: measured, lost everywhere, not shipped.
//
// One tile at a time per CTA, its columns split between the two consumer warpgroups: CUTLASS's cooperative
// main-loop collective with the warpgroups side by side along N instead of M, so that a tile may have 192 rows
// (an odd multiple of 64), whose tile counts fill the SMs evenly where 128-row tiles leave a partial last wave
// (4096 rows: 22 x 24 = 528 tiles of 192x128, 4.0 waves). Each warpgroup stores its half of the tile with the
// shipped per-warp epilogue (custom_ops/src/cuda/kernels/sm90_warp_epilogue.cuh). It is the shipped overlapped
// ping-pong kernel (sm90_warp_epilogue_kernel.cuh) with the warpgroups sharing each tile: both consume every
// stage, no order between their main loops, the tiled MMA spans both. It lost to ping-pong 128x128 by 9-30 %
// (4096x768x3072: 42.3 us vs 37.3): the epilogue is not overlapped, and both warpgroups read all of A from
// shared memory through 64-column GMMAs.
//
// Tiles: explore/tiles.h group N (schedule kSplitNCooperative), through explore/configs.h.
#pragma once

#include <climits>
#include <cstdint>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/cutlass.h>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/kernel/sm90_tile_scheduler.hpp>
#include <cutlass/kernel_hardware_info.hpp>
#include <cutlass/pipeline/pipeline.hpp>
#include <cutlass/util/packed_stride.hpp>

#include "configs.h"
#include "kernel_layer_tactic.cuh"
#include "cuda/kernels/sm90_gemm_gelu.cuh"
#include "cuda/kernels/sm90_warp_epilogue.cuh"
#include "cuda/kernels/sm90_warp_epilogue_kernel.cuh"

namespace ofk_explore {

// CUTLASS's TMA + GMMA main-loop collective for a tile split along N between the two consumer warpgroups (what
// CUTLASS's collective builder makes for its cooperative kernel, with the warpgroups side by side along N rather
// than M): each warpgroup runs GMMAs of (64 x TileN/2), TileM / 64 of them along M.
template <class Element, class LayoutA, class LayoutB, class TileShape, class ClusterShape, int CarveoutBytes>
struct Sm90SplitNMainloop {
  using Major = cute::GMMA::Major;
  static constexpr Major kMajorA = cutlass::gemm::collective::detail::gmma_ss_tag_to_major_A<Element, LayoutA>();
  static constexpr Major kMajorB = cutlass::gemm::collective::detail::gmma_ss_tag_to_major_B<Element, LayoutB>();
  using HalfTile = cute::Shape<cute::_64, cute::Int<cute::size<1>(TileShape{}) / 2>, cute::_64>;  // picks the GMMA
  using TiledMma = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float, HalfTile, kMajorA, kMajorB>(),
      cute::Layout<cute::Shape<cute::_1, cute::_2, cute::_1>>{}));
  using GmemTiledCopyA = decltype(cutlass::gemm::collective::detail::sm90_cluster_shape_to_tma_atom(
      cute::shape<1>(ClusterShape{})));
  using GmemTiledCopyB = decltype(cutlass::gemm::collective::detail::sm90_cluster_shape_to_tma_atom(
      cute::shape<0>(ClusterShape{})));
  using SmemLayoutAtomA = decltype(cutlass::gemm::collective::detail::ss_smem_selector<
                                   kMajorA, Element, decltype(cute::get<0>(TileShape{})), decltype(cute::get<2>(TileShape{}))>());
  using SmemLayoutAtomB = decltype(cutlass::gemm::collective::detail::ss_smem_selector<
                                   kMajorB, Element, decltype(cute::get<1>(TileShape{})), decltype(cute::get<2>(TileShape{}))>());
  static constexpr int kStages = cutlass::gemm::collective::detail::compute_stage_count_or_override<
      cutlass::gemm::collective::detail::sm90_smem_capacity_bytes, Element, Element, TileShape>(
      cutlass::gemm::collective::StageCountAutoCarveout<CarveoutBytes>{});
  using CollectiveOp = cutlass::gemm::collective::CollectiveMma<
      cutlass::gemm::MainloopSm90TmaGmmaWarpSpecialized<kStages, ClusterShape,
                                                        cutlass::gemm::KernelTmaWarpSpecializedCooperative>,
      TileShape, Element, cutlass::gemm::TagToStrideA_t<LayoutA>, Element, cutlass::gemm::TagToStrideB_t<LayoutB>,
      TiledMma, GmemTiledCopyA, SmemLayoutAtomA, void, cute::identity, GmemTiledCopyB, SmemLayoutAtomB, void,
      cute::identity>;
};

template <class CollectiveMainloop_, class Element_>
class Sm90SplitNKernel
    : public onnxfuse::cuda::Sm90KernelLayerInterface<
          CollectiveMainloop_,
          typename onnxfuse::cuda::Sm90WarpEpilogue<Element_, cute::size<1>(typename CollectiveMainloop_::TileShape{}) / 2>::Params,
          2> {
 public:
  using Interface = onnxfuse::cuda::Sm90KernelLayerInterface<
      CollectiveMainloop_,
      typename onnxfuse::cuda::Sm90WarpEpilogue<Element_, cute::size<1>(typename CollectiveMainloop_::TileShape{}) / 2>::Params,
      2>;  // both consumer warpgroups on every tile, side by side along N
  ONNXFUSE_SM90_KERNEL_LAYER_NAMES(Interface);
  using Element = Element_;
  static constexpr int kGroupTileN = kTileN / 2;  // the columns of a tile one consumer warpgroup computes and stores
  using Epilogue = onnxfuse::cuda::Sm90WarpEpilogue<Element, kGroupTileN>;
  static constexpr int kConsumerWarps = onnxfuse::cuda::kSm90ConsumerWarps;
  static constexpr uint32_t kLoadRegisters = 40;  // the producer gives registers to the consumers, as shipped
  static constexpr uint32_t kMmaRegisters = 232;

  struct SharedStorage {
    struct PipelineStorage : cute::aligned_struct<16, cute::_1> {
      alignas(16) typename CollectiveMainloop::PipelineStorage mainloop;
    } pipelines;
    struct TensorStorage : cute::aligned_struct<128, cute::_1> {
      typename CollectiveMainloop::TensorStorage mainloop;
      alignas(128) cute::array_aligned<Element, kConsumerWarps * Epilogue::kStageElements> epilogue;
      static_assert(sizeof(epilogue) == onnxfuse::cuda::sm90_warp_epilogue_smem_bytes<Element, kGroupTileN>());
    } tensors;
  };
  static constexpr int SharedStorageSize = sizeof(SharedStorage);
  static_assert(SharedStorageSize <= 227 * 1024, "over the H100/H200 shared memory per block");

  CUTLASS_DEVICE void operator()(Params const& params, char* smem_buf) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using namespace cute;
    enum class Role { Producer = 0, Consumer0 = 1, Consumer1 = 2 };
    SharedStorage& shared = *reinterpret_cast<SharedStorage*>(smem_buf);
    const int lane = cutlass::canonical_lane_idx();
    const int warp = cutlass::canonical_warp_idx_sync();
    const int warp_in_group = warp % cutlass::NumWarpsPerWarpGroup;
    const int group_thread = int(threadIdx.x) % cutlass::NumThreadsPerWarpGroup;
    const auto role = Role(cutlass::canonical_warp_group_idx());

    if (warp == 0 && cute::elect_one_sync()) CollectiveMainloop::prefetch_tma_descriptors(params.mainloop);

    MainloopPipeline pipeline = Interface::make_pipeline(shared.pipelines.mainloop, params,
                                                         role == Role::Producer && warp_in_group == 0,
                                                         role != Role::Producer,  // both consume every stage
                                                         kMmaWarpGroups * cutlass::NumThreadsPerWarpGroup);
    auto cluster_wait = Interface::cluster_arrive();

    CollectiveMainloop mainloop;
    const auto problem = params.problem_shape;
    auto load_inputs = mainloop.load_init(problem, params.mainloop);
    const auto k_tiles = size<3>(get<0>(load_inputs));  // A's tiles: (BLK_M, BLK_K, m, k, l)

    typename CollectiveMainloop::PipelineState consume_state;
    TileScheduler scheduler{params.scheduler};
    auto work = scheduler.initial_work_tile_info(ClusterShape{});
    cluster_wait();

    if (role == Role::Producer) {
      cutlass::arch::warpgroup_reg_dealloc<kLoadRegisters>();
      if (warp_in_group == 0)
        Interface::produce(params, mainloop, pipeline, load_inputs, scheduler, work, lane, shared.tensors.mainloop);
    } else {
      cutlass::arch::warpgroup_reg_alloc<kMmaRegisters>();
      TiledMma tiled_mma;
      Element* stage = shared.tensors.epilogue.data() + (warp - cutlass::NumWarpsPerWarpGroup) * Epilogue::kStageElements;
      const int group = static_cast<int>(role) - static_cast<int>(Role::Consumer0);
      const int mma_thread = group * cutlass::NumThreadsPerWarpGroup + group_thread;  // the MMA spans both groups
      for (; work.is_valid(); work = scheduler.get_current_work()) {
        const int m0 = work.M_idx * kTileM, n0 = work.N_idx * kTileN + group * kGroupTileN;
        typename Epilogue::BiasPairs bias;
        Epilogue::load_bias(bias, params.epilogue, n0, lane);
        Tensor accumulators = partition_fragment_C(tiled_mma, take<0, 2>(TileShape{}));  // (MMA, MMA_M, MMA_N)

        mainloop.mma(pipeline, consume_state, accumulators, k_tiles, mma_thread, shared.tensors.mainloop,
                     params.mainloop);
        mainloop.mma_tail(pipeline, consume_state, k_tiles);
        consume_state.advance(k_tiles);

        Epilogue::store(accumulators, bias, params.epilogue, m0, n0, warp_in_group, lane, stage);
        scheduler.advance_to_next_work();
      }
    }
#endif
  }
};

}  // namespace ofk_explore

namespace onnxfuse::cuda {

// The tactic's kernel for a split-N configuration, as Sm90Tactic (sm90_gemm_gelu.cuh) uses it: the layer's operand
// layouts, checks and arguments (kernel_layer_tactic.cuh), this file's main loop and kernel.
template <DType D, bool TransB, int TileM, int TileN, int TileK, int ClusterM, int ClusterN>
struct Sm90Kernel<ofk_explore::Sm90SplitNConfig<D, TransB, TileM, TileN, TileK, ClusterM, ClusterN>>
    : ofk_explore::KernelLayerTactic<D, TransB, TileM, TileN, TileK, ClusterM, ClusterN> {
  using Base = ofk_explore::KernelLayerTactic<D, TransB, TileM, TileN, TileK, ClusterM, ClusterN>;
  using Element = typename Base::Element;
  using CollectiveMainloop =
      typename ofk_explore::Sm90SplitNMainloop<Element, typename Base::LayoutA, typename Base::LayoutB,
                                               typename Base::TileShape, typename Base::ClusterShape,
                                               sm90_warp_epilogue_smem_bytes<Element, TileN / 2>()>::CollectiveOp;
  using GemmKernel = ofk_explore::Sm90SplitNKernel<CollectiveMainloop, Element>;

  static typename GemmKernel::Arguments make_arguments(const GemmGeluArgs& a, const DeviceInfo& dev) {
    return Base::template arguments<GemmKernel>(a, dev);
  }
};

}  // namespace onnxfuse::cuda
