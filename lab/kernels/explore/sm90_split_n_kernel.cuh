// The split-N cooperative kernel of lab/kernels/NOTES.md v7b: measured, lost everywhere, not shipped.
//
// One tile at a time per CTA, its columns split between the two consumer warpgroups: CUTLASS's cooperative
// main-loop collective with the warpgroups side by side along N instead of M, so that a tile may have 192 rows
// (an odd multiple of 64), whose tile counts fill the SMs evenly where 128-row tiles leave a partial last wave
// (4096 rows: 22 x 24 = 528 tiles of 192x128, 4.0 waves). Each warpgroup stores its half of the tile with the
// shipped per-warp epilogue (custom_ops/src/cuda/sm90_warp_epilogue.cuh). It is the shipped overlapped
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
#include "sm90_gemm_gelu.cuh"
#include "sm90_warp_epilogue.cuh"
#include "sm90_warp_epilogue_kernel.cuh"

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

    using MainloopPipeline = typename CollectiveMainloop::MainloopPipeline;
    typename MainloopPipeline::Params pipeline_params;
    if (role == Role::Producer && warp_in_group == 0) pipeline_params.role = MainloopPipeline::ThreadCategory::Producer;
    if (role != Role::Producer) pipeline_params.role = MainloopPipeline::ThreadCategory::Consumer;
    pipeline_params.is_leader = group_thread == 0;
    pipeline_params.num_consumers = kMmaWarpGroups * cutlass::NumThreadsPerWarpGroup;  // both consume every stage
    pipeline_params.num_producers = CollectiveMainloop::NumProducerThreadEvents;
    pipeline_params.transaction_bytes = params.mainloop.tma_transaction_bytes;
    MainloopPipeline pipeline(shared.pipelines.mainloop, pipeline_params, ClusterShape{});

    // Barrier initialization must be visible to every CTA of the cluster before anyone uses it.
    auto cluster_wait = [] {
      if constexpr (size(ClusterShape{}) > 1) {
        cute::cluster_arrive_relaxed();
        return [] { cute::cluster_wait(); };
      } else {
        __syncthreads();
        return [] {};
      }
    }();

    CollectiveMainloop mainloop;
    const auto problem = params.problem_shape;
    auto load_inputs = mainloop.load_init(problem, params.mainloop);
    Tensor gA_mkl = get<0>(load_inputs);  // (BLK_M, BLK_K, m, k, l)
    Tensor gB_nkl = get<1>(load_inputs);  // (BLK_N, BLK_K, n, k, l)
    const auto k_tiles = size<3>(gA_mkl);

    typename CollectiveMainloop::PipelineState consume_state;
    auto produce_state = cutlass::make_producer_start_state<MainloopPipeline>();
    TileScheduler scheduler{params.scheduler};
    auto work = scheduler.initial_work_tile_info(ClusterShape{});
    cluster_wait();

    auto block_coord = [&](auto const& w) {
      return make_coord(idx2crd(w.M_idx, shape<2>(gA_mkl)), idx2crd(w.N_idx, shape<2>(gB_nkl)), _,
                        idx2crd(w.L_idx, shape<4>(gB_nkl)));
    };

    if (role == Role::Producer) {
      cutlass::arch::warpgroup_reg_dealloc<kLoadRegisters>();
      if (warp_in_group == 0) {
        for (; work.is_valid(); work = scheduler.get_current_work()) {
          mainloop.load(params.mainloop, pipeline, produce_state, load_inputs, block_coord(work),
                        cute::make_coord_iterator(shape<3>(gA_mkl)), k_tiles, lane, cute::block_rank_in_cluster(),
                        shared.tensors.mainloop);
          produce_state.advance(k_tiles);
          scheduler.advance_to_next_work();
        }
        // Keep the CTA alive until the consumers have released every stage (cluster peers multicast into it).
        mainloop.load_tail(pipeline, produce_state);
      }
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

// The tactic's kernel for a split-N configuration, as Sm90Tactic (sm90_gemm_gelu.cuh) uses it: the shipped
// Sm90Kernel's operand layouts and checks (16-bit only: the per-warp epilogue stores 16-bit outputs), this
// file's main loop and kernel.
template <DType D, bool TransB, int TileM, int TileN, int TileK, int ClusterM, int ClusterN>
struct Sm90Kernel<ofk_explore::Sm90SplitNConfig<D, TransB, TileM, TileN, TileK, ClusterM, ClusterN>> {
  static_assert(D != DType::kFloat32, "the per-warp epilogue stores 16-bit outputs only");
  using Element = typename Sm90Element<D>::type;
  static constexpr int kAlignment = 16 / sizeof(Element);  // TMA: 16-byte rows and base addresses
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = std::conditional_t<TransB, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  using TileShape = cute::Shape<cute::Int<TileM>, cute::Int<TileN>, cute::Int<TileK>>;
  using ClusterShape = cute::Shape<cute::Int<ClusterM>, cute::Int<ClusterN>, cute::_1>;
  using CollectiveMainloop =
      typename ofk_explore::Sm90SplitNMainloop<Element, LayoutA, LayoutB, TileShape, ClusterShape,
                                               sm90_warp_epilogue_smem_bytes<Element, TileN / 2>()>::CollectiveOp;
  using GemmKernel = ofk_explore::Sm90SplitNKernel<CollectiveMainloop, Element>;

  static bool shape_fits(const GemmGeluArgs& a, const DeviceInfo& dev) {
    const int64_t ldb = TransB ? a.K : a.N;
    return dev.cc_major == 9 && dev.cc_minor == 0 && a.dtype == D && a.trans_b == TransB && a.M > 0 && a.N > 0 &&
           a.K > 0 && a.M <= INT_MAX && a.N <= INT_MAX && a.K <= INT_MAX && a.K % kAlignment == 0 &&
           a.N % kAlignment == 0 && ldb % kAlignment == 0 && aligned_to(a.x, 16) && aligned_to(a.w, 16) &&
           aligned_to(a.y, 16) && (a.bias == nullptr || aligned_to(a.bias, 16));
  }

  static typename GemmKernel::Arguments make_arguments(const GemmGeluArgs& a, const DeviceInfo& dev) {
    auto args = sm90_mainloop_arguments<GemmKernel, Element>(a, dev, TileM, TileN, ClusterM, ClusterN);
    args.epilogue = sm90_warp_epilogue_params<decltype(args.epilogue), Element>(a);
    return args;
  }
};

}  // namespace onnxfuse::cuda
