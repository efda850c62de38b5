// A GEMM kernel with a per-warp epilogue (sm90_warp_epilogue.cuh): CUTLASS's collectives (TMA main loop, GMMA,
// tile scheduler) under a kernel layer of our own, whose consumer warpgroups never wait for each other's
// epilogue.
//
// Why: CUTLASS's ping-pong kernel orders its two consumer warpgroups twice per tile. Their main loops take turns
// on the Tensor Cores (so that one warpgroup's epilogue overlaps the other's main loop), and their epilogues
// take turns too, because both stage through the same shared-memory buffer under the same named barrier. When
// an epilogue outlasts a main loop, as GELU's does at K <= 1024, a warpgroup's epilogue waits for the other's
// (lab/kernels/NOTES.md, v6). Here the main loops keep their order and the epilogues have none: each warp
// stages its own rows through its own buffer. Shipped for the 64x64 and 64x128 ping-pong tiles, where it wins
// under two waves; at many waves it ties CUTLASS's kernel (lab/kernels/NOTES.md, v7;
// lab/results/kernels_v7_overlap.json.gz).
//
// Roles (128 threads per warpgroup): warp 0 of warpgroup 0 issues the TMA loads of every tile this CTA computes;
// the kMmaWarpGroups consumer warpgroups (2, or 3 with fewer registers each) take turns along the persistent tile
// walk, each running main loop -> epilogue per tile. Their main loops take turns on the Tensor Cores, so that the
// others' epilogues run during one's main loop.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/cutlass.h>
#include <cutlass/gemm/kernel/sm90_tile_scheduler.hpp>
#include <cutlass/kernel_hardware_info.hpp>
#include <cutlass/pipeline/pipeline.hpp>

#include "cuda/kernels/sm90_warp_epilogue.cuh"

namespace onnxfuse::cuda {

constexpr int kSm90ConsumerWarps = 2 * cutlass::NumWarpsPerWarpGroup;  // two consumer warpgroups

// Shared memory the epilogue takes from the main loop's stages: one staging buffer per consumer warp. Needed
// before the main-loop collective exists (its stage count is what is left), hence a function of the tile and
// the consumer warpgroups alone.
template <class Element, int TileN, int kMmaWarpGroups = 2>
constexpr int sm90_warp_epilogue_smem_bytes() {
  return kMmaWarpGroups * cutlass::NumWarpsPerWarpGroup * Sm90WarpEpilogue<Element, TileN>::kStageElements *
         static_cast<int>(sizeof(Element));
}

// CUTLASS's kernel interface as every kernel of this layer presents it to its tactic (sm90_gemm_gelu.cuh) and to
// cutlass::device_kernel: the arguments and parameters (the main-loop collective's, the epilogue's own, the
// persistent tile scheduler's), the checks, and the launch shape. A kernel adds its roles and its shared storage.
template <class CollectiveMainloop_, class EpilogueParams, int kMmaWarpGroups_>
struct Sm90KernelLayerInterface {
  using CollectiveMainloop = CollectiveMainloop_;
  using TileShape = typename CollectiveMainloop::TileShape;
  using TiledMma = typename CollectiveMainloop::TiledMma;
  using ClusterShape = typename CollectiveMainloop::DispatchPolicy::ClusterShape;
  using StrideA = typename CollectiveMainloop::StrideA;
  using StrideB = typename CollectiveMainloop::StrideB;
  using ProblemShape = cute::Shape<int, int, int, int>;  // M, N, K, L (L = 1)
  using TileScheduler = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90;
  static constexpr int kTileM = cute::size<0>(TileShape{});
  static constexpr int kTileN = cute::size<1>(TileShape{});
  static constexpr int kMmaWarpGroups = kMmaWarpGroups_;
  static constexpr uint32_t MaxThreadsPerBlock = (1 + kMmaWarpGroups) * cutlass::NumThreadsPerWarpGroup;
  static constexpr uint32_t MinBlocksPerMultiprocessor = 1;

  struct Arguments {
    ProblemShape problem_shape{};
    typename CollectiveMainloop::Arguments mainloop{};
    EpilogueParams epilogue{};
    cutlass::KernelHardwareInfo hw_info{};
    typename TileScheduler::Arguments scheduler{};
  };
  struct Params {
    ProblemShape problem_shape{};
    typename CollectiveMainloop::Params mainloop{};
    EpilogueParams epilogue{};
    cutlass::KernelHardwareInfo hw_info{};
    typename TileScheduler::Params scheduler{};
  };

  static bool can_implement(Arguments const& args) {
    return CollectiveMainloop::can_implement(args.problem_shape, args.mainloop) &&
           TileScheduler::can_implement(args.scheduler);
  }
  static size_t get_workspace_size(Arguments const&) { return 0; }
  static cutlass::Status initialize_workspace(Arguments const&, void* = nullptr, cudaStream_t = nullptr) {
    return cutlass::Status::kSuccess;
  }

  static Params to_underlying_arguments(Arguments const& args, void*) {
    cutlass::KernelHardwareInfo hw_info{args.hw_info.device_id, args.hw_info.sm_count, 0};
    if (hw_info.sm_count <= 0)
      hw_info.sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(hw_info.device_id);
    return {args.problem_shape, CollectiveMainloop::to_underlying_arguments(args.problem_shape, args.mainloop, nullptr),
            args.epilogue, hw_info,
            TileScheduler::to_underlying_arguments(args.problem_shape, TileShape{}, ClusterShape{}, hw_info,
                                                   args.scheduler, nullptr)};
  }

  static dim3 get_grid_shape(Params const& params) {
    typename TileScheduler::Arguments args{};
    args.max_swizzle_size = 1 << params.scheduler.log_swizzle_size_;
    args.raster_order = params.scheduler.raster_order_ == TileScheduler::RasterOrder::AlongN
                            ? TileScheduler::RasterOrderOptions::AlongN
                            : TileScheduler::RasterOrderOptions::AlongM;
    return TileScheduler::get_grid_shape(params.scheduler, params.problem_shape, TileShape{}, ClusterShape{},
                                         params.hw_info, args);
  }
  static dim3 get_block_shape() { return dim3(MaxThreadsPerBlock, 1, 1); }

  // Device side, what every kernel of the layer does the same way.
  using MainloopPipeline = typename CollectiveMainloop::MainloopPipeline;

  // The main loop's stage pipeline: warp 0 of warpgroup 0 produces (TMA loads), the consumer warpgroups consume,
  // and `consumer_threads` of them release each stage (one warpgroup where each has its own tiles, both where they
  // share every tile).
  CUTLASS_DEVICE static MainloopPipeline make_pipeline(typename CollectiveMainloop::PipelineStorage& storage,
                                                       Params const& params, bool producer_warp, bool consumer,
                                                       int consumer_threads) {
    typename MainloopPipeline::Params pipeline_params;
    if (producer_warp) pipeline_params.role = MainloopPipeline::ThreadCategory::Producer;
    if (consumer) pipeline_params.role = MainloopPipeline::ThreadCategory::Consumer;
    pipeline_params.is_leader = int(threadIdx.x) % cutlass::NumThreadsPerWarpGroup == 0;
    pipeline_params.num_consumers = consumer_threads;
    pipeline_params.num_producers = CollectiveMainloop::NumProducerThreadEvents;
    pipeline_params.transaction_bytes = params.mainloop.tma_transaction_bytes;
    return MainloopPipeline(storage, pipeline_params, ClusterShape{});
  }

  // Barrier initialization must be visible to every CTA of the cluster before anyone uses it: arrives now; the
  // returned function waits.
  CUTLASS_DEVICE static auto cluster_arrive() {
    if constexpr (cute::size(ClusterShape{}) > 1) {
      cute::cluster_arrive_relaxed();
      return [] { cute::cluster_wait(); };
    } else {
      __syncthreads();
      return [] {};
    }
  }

  // The producer warp's whole part: the TMA loads of every tile this CTA computes, in the scheduler's order from
  // `work`, then the wait that keeps the CTA alive until the consumers have released every stage (cluster peers
  // multicast into it).
  template <class LoadInputs, class WorkTile>
  CUTLASS_DEVICE static void produce(Params const& params, CollectiveMainloop& mainloop, MainloopPipeline& pipeline,
                                     LoadInputs& load_inputs, TileScheduler& scheduler, WorkTile work, int lane,
                                     typename CollectiveMainloop::TensorStorage& storage) {
    using namespace cute;
    Tensor gA_mkl = get<0>(load_inputs);  // (BLK_M, BLK_K, m, k, l)
    Tensor gB_nkl = get<1>(load_inputs);  // (BLK_N, BLK_K, n, k, l)
    const auto k_tiles = size<3>(gA_mkl);
    auto produce_state = cutlass::make_producer_start_state<MainloopPipeline>();
    for (; work.is_valid(); work = scheduler.get_current_work()) {
      const auto block_coord = make_coord(idx2crd(work.M_idx, shape<2>(gA_mkl)), idx2crd(work.N_idx, shape<2>(gB_nkl)),
                                          _, idx2crd(work.L_idx, shape<4>(gB_nkl)));
      mainloop.load(params.mainloop, pipeline, produce_state, load_inputs, block_coord,
                    cute::make_coord_iterator(shape<3>(gA_mkl)), k_tiles, lane, cute::block_rank_in_cluster(), storage);
      produce_state.advance(k_tiles);
      scheduler.advance_to_next_work();
    }
    mainloop.load_tail(pipeline, produce_state);
  }
};

// The names a kernel of this layer takes from its interface (a dependent base: not found without these).
#define ONNXFUSE_SM90_KERNEL_LAYER_NAMES(Interface)                    \
  using typename Interface::CollectiveMainloop;                         \
  using typename Interface::TileShape;                                  \
  using typename Interface::TiledMma;                                   \
  using typename Interface::ClusterShape;                               \
  using typename Interface::TileScheduler;                              \
  using typename Interface::Params;                                     \
  using typename Interface::MainloopPipeline;                           \
  using Interface::kTileM;                                              \
  using Interface::kTileN;                                              \
  using Interface::kMmaWarpGroups

// Consumer warpgroups with a tile each: the CTA's consumers work on kMmaWarpGroups tiles at once.
template <class CollectiveMainloop, class Element, int kMmaWarpGroups>
using Sm90WarpEpilogueInterface = Sm90KernelLayerInterface<
    CollectiveMainloop,
    typename Sm90WarpEpilogue<Element, cute::size<1>(typename CollectiveMainloop::TileShape{})>::Params,
    kMmaWarpGroups>;

template <class CollectiveMainloop_, class Element_, int kMmaWarpGroups_ = 2>
class Sm90WarpEpilogueKernel : public Sm90WarpEpilogueInterface<CollectiveMainloop_, Element_, kMmaWarpGroups_> {
 public:
  using Interface = Sm90WarpEpilogueInterface<CollectiveMainloop_, Element_, kMmaWarpGroups_>;
  ONNXFUSE_SM90_KERNEL_LAYER_NAMES(Interface);
  using Element = Element_;
  using Epilogue = Sm90WarpEpilogue<Element, kTileN>;
  static_assert(kMmaWarpGroups == 2 || kMmaWarpGroups == 3, "two or three consumer warpgroups");

  static constexpr int kConsumerWarps = kMmaWarpGroups * cutlass::NumWarpsPerWarpGroup;
  // The producer warpgroup gives registers to the consumers (setmaxnreg): CUTLASS's ping-pong split for two
  // consumer warpgroups (128 fp32 accumulators per thread for a 128x128 tile, room to spare), FlashAttention-3's
  // for three (a 128x128 tile's accumulators and little else). All of the SM's 64K registers either way.
  static constexpr uint32_t kLoadRegisters = kMmaWarpGroups == 2 ? 40 : 32;
  static constexpr uint32_t kMmaRegisters = kMmaWarpGroups == 2 ? 232 : 160;
  static_assert((kLoadRegisters + kMmaWarpGroups * kMmaRegisters) * cutlass::NumThreadsPerWarpGroup <= 64 * 1024);
  // With three, the bias is read after the main loop (16 more live registers through it do not fit in 160) and
  // added into the accumulators before the activation blocks (Epilogue::add_bias), so that its 32 fp32 values are
  // not live through them. Held as two warpgroups hold them, the bf16 128x128 kernel had 440 bytes of spill stores
  // (ptxas -v), most inside the activation blocks; added first, 32 bytes in either type (lab/kernels/NOTES.md, v10).
  static constexpr bool kBiasBeforeMainLoop = kMmaWarpGroups == 2;
  // The main loops' turns on the Tensor Cores: warpgroup 0, 1, (2,) 0, 1, ...
  using MmaOrderBarrier = cutlass::OrderedSequenceBarrier<1, kMmaWarpGroups>;

  struct SharedStorage {
    struct PipelineStorage : cute::aligned_struct<16, cute::_1> {
      alignas(16) typename CollectiveMainloop::PipelineStorage mainloop;
      alignas(16) typename MmaOrderBarrier::SharedStorage mma_order;
    } pipelines;
    struct TensorStorage : cute::aligned_struct<128, cute::_1> {
      typename CollectiveMainloop::TensorStorage mainloop;
      alignas(128) cute::array_aligned<Element, kConsumerWarps * Epilogue::kStageElements> epilogue;
      static_assert(sizeof(epilogue) == sm90_warp_epilogue_smem_bytes<Element, kTileN, kMmaWarpGroups>());
    } tensors;
  };
  static constexpr int SharedStorageSize = sizeof(SharedStorage);
  static_assert(SharedStorageSize <= 227 * 1024, "over the H100/H200 shared memory per block");

  CUTLASS_DEVICE void operator()(Params const& params, char* smem_buf) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using namespace cute;
    enum class Role { Producer = 0, Consumer0 = 1, Consumer1 = 2, Consumer2 = 3 };  // by warpgroup
    SharedStorage& shared = *reinterpret_cast<SharedStorage*>(smem_buf);
    const int lane = cutlass::canonical_lane_idx();
    const int warp = cutlass::canonical_warp_idx_sync();
    const int warp_in_group = warp % cutlass::NumWarpsPerWarpGroup;
    const int group_thread = int(threadIdx.x) % cutlass::NumThreadsPerWarpGroup;
    const auto role = Role(cutlass::canonical_warp_group_idx());

    if (warp == 0 && cute::elect_one_sync()) CollectiveMainloop::prefetch_tma_descriptors(params.mainloop);

    // One warpgroup consumes each stage: the one whose tile it belongs to.
    MainloopPipeline pipeline = Interface::make_pipeline(shared.pipelines.mainloop, params,
                                                         role == Role::Producer && warp_in_group == 0,
                                                         role != Role::Producer, cutlass::NumThreadsPerWarpGroup);

    typename MmaOrderBarrier::Params order_params;
    order_params.group_id = cutlass::canonical_warp_group_idx() - static_cast<int>(Role::Consumer0);
    order_params.group_size = cutlass::NumThreadsPerWarpGroup;
    MmaOrderBarrier mma_order(shared.pipelines.mma_order, order_params);

    auto cluster_wait = Interface::cluster_arrive();

    CollectiveMainloop mainloop;
    const auto problem = params.problem_shape;
    auto load_inputs = mainloop.load_init(problem, params.mainloop);
    const auto k_tiles = size<3>(get<0>(load_inputs));  // A's tiles: (BLK_M, BLK_K, m, k, l)

    typename CollectiveMainloop::PipelineState consume_state;
    TileScheduler scheduler{params.scheduler};
    // Consumer c starts c tiles and their stages later. Written out per consumer rather than as an advance by c:
    // the two-warpgroup kernels then compile to the code they had before the count became a parameter
    // (lab/results/sass_diff_three_groups.txt; the general form moved their register allocation).
    if (role == Role::Consumer1) {
      scheduler.advance_to_next_work();
      consume_state.advance(k_tiles);
    }
    if constexpr (kMmaWarpGroups == 3) {
      if (role == Role::Consumer2) {
        scheduler.advance_to_next_work(2);
        consume_state.advance(2 * k_tiles);
      }
    }
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
      for (; work.is_valid(); work = scheduler.get_current_work()) {
        const int m0 = work.M_idx * kTileM, n0 = work.N_idx * kTileN;
        // The bias is read before this warpgroup's turn on the Tensor Cores where registers allow: its latency
        // hides in the wait.
        typename Epilogue::BiasPairs bias;
        if constexpr (kBiasBeforeMainLoop) Epilogue::load_bias(bias, params.epilogue, n0, lane);
        Tensor accumulators = partition_fragment_C(tiled_mma, take<0, 2>(TileShape{}));  // (MMA, MMA_M, MMA_N)

        mma_order.wait();
        mainloop.mma(pipeline, consume_state, accumulators, k_tiles, group_thread, shared.tensors.mainloop,
                     params.mainloop);
        mma_order.arrive();  // the next warpgroup's main loop may start
        if constexpr (!kBiasBeforeMainLoop) Epilogue::load_bias(bias, params.epilogue, n0, lane);
        mainloop.mma_tail(pipeline, consume_state, k_tiles);
        consume_state.advance(k_tiles * kMmaWarpGroups);  // skip the other warpgroups' stages

        if constexpr (kBiasBeforeMainLoop) {
          Epilogue::store(accumulators, bias, params.epilogue, m0, n0, warp_in_group, lane, stage);
        } else {
          Epilogue::add_bias(accumulators, bias);
          Epilogue::template store<true>(accumulators, bias, params.epilogue, m0, n0, warp_in_group, lane, stage);
        }
        scheduler.advance_to_next_work(kMmaWarpGroups);
      }
    }
#endif
  }
};

}  // namespace onnxfuse::cuda
