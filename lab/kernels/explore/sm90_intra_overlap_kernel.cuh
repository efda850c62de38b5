// Issue #20's first idea, FlashAttention-3's intra-warpgroup overlap (hopper/mainloop_fwd_sm90_tma_gmma_ws.hpp,
// IntraWGOverlap), on the GEMM: each consumer warpgroup keeps two accumulator sets, issues the next tile's GMMAs
// and runs the previous tile's epilogue while they execute. Measured, lost everywhere (lab/kernels/NOTES.md, v9:
// 1.41-1.44x the shipped ping-pong kernels at K = 384, 1.30-1.39x at K = 768-1024); not shipped.
//
// Why it might win where ping-pong does not: in the ping-pong kernels one warpgroup (one warp per scheduler)
// runs a whole tile's epilogue while the other runs its main loop, and at K = 384 that epilogue (128 elements
// per thread) outlasts the main loop it should hide behind (NOTES v8: 85 % of issue slots empty, a dependent
// stretch). Here both warpgroups share every tile (cooperative, 64 rows each), so a tile's epilogue is spread
// over 8 warps (64 elements per thread), and it runs while the Tensor Cores work on the next tile.
//
// Schedule of one tile t per warpgroup (acc[t % 2] in flight, acc[(t - 1) % 2] holding tile t - 1):
//   k-block 0 issued; for each later k-block j: issue j, then the epilogue chunks due by j (tile t - 1's
//   32-column chunks, spread evenly over the k-blocks), then wait for k-block j - 1 and release its stage.
// So two k-blocks of GMMAs (~1000 cycles of Tensor Core work at 128x128x64 each) are queued while a chunk
// (16 elements per thread) runs. The last tile's epilogue runs after its main loop, as in the other kernels.
//
// The chunk epilogue is the shipped per-warp epilogue (custom_ops/src/cuda/kernels/sm90_warp_epilogue.cuh) cut into
// 32-column pieces: the same bias add, activation, rounding and stmatrix layout, so the outputs are bit-identical
// to the shipped kernels'. The read-back maps each 8-lane phase to rows r and r + 4 of one chunk, which the
// buffer's XOR swizzle puts in 8 different bank groups.
//
// Tiles: explore/tiles.h group O (schedule kIntraOverlapCooperative), through explore/configs.h.
#pragma once

#include <climits>
#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

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

// One 32-column chunk of a warp's 16 rows of a 64 x TileN warpgroup tile: act(acc + bias), rounded, staged through
// the warp's buffer (the shipped layout), stored as 16-byte vectors predicated on M and N.
template <class Element, int TileN>
struct Sm90ChunkEpilogue {
  using Whole = onnxfuse::cuda::Sm90WarpEpilogue<Element, TileN>;
  using Params = typename Whole::Params;
  using BiasPairs = typename Whole::BiasPairs;
  static constexpr int kChunkColumns = 32;
  static constexpr int kChunks = TileN / kChunkColumns;
  static constexpr int kBlocks = kChunkColumns / 8;  // GMMA column blocks (8 columns, 4 values per thread) per chunk
  static_assert(sizeof(Element) == 2 && TileN % 64 == 0, "16-bit outputs, at least 8 16-byte chunks per row");

  // `acc`: the warpgroup's fragment of a 64 x TileN tile at (m0, n0); value 4j + 2h + c is row 16·warp + lane/4 + 8h,
  // column 8j + 2(lane % 4) + c.
  template <int kChunk, class Accumulator>
  CUTLASS_DEVICE static void store(Accumulator const& acc, BiasPairs const& bias_pairs, Params const& p, int m0,
                                   int n0, int warp, int lane, Element* stage) {
    static_assert(decltype(cute::size(acc))::value == TileN / 2, "one 64-row block per warpgroup");
    float v[4 * kBlocks];
#pragma unroll
    for (int i = 0; i < 4 * kBlocks; ++i) {
      const auto two = reinterpret_cast<Element const*>(&bias_pairs[kChunk * kBlocks + i / 4]);
      v[i] = acc(4 * kBlocks * kChunk + i) + static_cast<float>(two[i & 1]);
    }
    onnxfuse::cuda::apply_activation<false>(v, p.act);

    const uint32_t stage_base = static_cast<uint32_t>(__cvta_generic_to_shared(stage));
    const int st_row = 8 * ((lane >> 3) & 1) + (lane & 7);
    const int st_block = lane >> 4;
#pragma unroll
    for (int s = 0; s < kBlocks / 2; ++s) {
      uint32_t r[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) r[i] = pack(v[8 * s + 2 * i], v[8 * s + 2 * i + 1]);
      const int chunk = (kChunk * kBlocks + 2 * s + st_block) ^ (st_row & 7);
      const uint32_t addr = stage_base + static_cast<uint32_t>((st_row * TileN + 8 * chunk) * sizeof(Element));
      asm volatile("stmatrix.sync.aligned.x4.m8n8.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]),
                   "r"(r[1]), "r"(r[2]), "r"(r[3]));
    }
    __syncwarp();

    const int row0 = m0 + 16 * warp;
#pragma unroll
    for (int it = 0; it < 16 * kBlocks / 32; ++it) {
      const int idx = 32 * it + lane;
      const int phase = idx >> 3, within = idx & 7;
      const int r = (phase & 3) + 8 * (phase >> 2) + 4 * (within >> 2);
      const int c = kChunk * kBlocks + (within & 3);
      const uint4 val = *reinterpret_cast<uint4 const*>(stage + r * TileN + 8 * (c ^ (r & 7)));
      if (row0 + r < p.M && n0 + 8 * c < p.N)
        *reinterpret_cast<uint4*>(p.y + static_cast<int64_t>(row0 + r) * p.ldy + n0 + 8 * c) = val;
    }
    __syncwarp();  // this chunk of the buffer is rewritten by the next tile
  }

  template <class Accumulator>
  CUTLASS_DEVICE static void store_chunk(int q, Accumulator const& acc, BiasPairs const& bias, Params const& p, int m0,
                                         int n0, int warp, int lane, Element* stage) {
    cute::for_each(cute::make_int_sequence<kChunks>{}, [&](auto Q) {
      if (q == decltype(Q)::value) store<decltype(Q)::value>(acc, bias, p, m0, n0, warp, lane, stage);
    });
  }

 private:
  CUTLASS_DEVICE static uint32_t pack(float lo, float hi) {
    if constexpr (std::is_same_v<Element, cutlass::half_t>) {
      const __half2 h = __floats2half2_rn(lo, hi);
      return *reinterpret_cast<uint32_t const*>(&h);
    } else {
      const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
      return *reinterpret_cast<uint32_t const*>(&h);
    }
  }
};

// kAhead: k-blocks of GMMAs queued while an epilogue chunk runs (1: the collective's own depth); kSerial: the
// previous tile's epilogue before the next tile's main loop instead (the control).
template <class CollectiveMainloop_, class Element_, int kAhead, bool kSerial>
class Sm90IntraOverlapKernel
    : public onnxfuse::cuda::Sm90KernelLayerInterface<
          CollectiveMainloop_, typename Sm90ChunkEpilogue<Element_, cute::size<1>(typename CollectiveMainloop_::TileShape{})>::Params,
          2> {
 public:
  using Interface = onnxfuse::cuda::Sm90KernelLayerInterface<
      CollectiveMainloop_, typename Sm90ChunkEpilogue<Element_, cute::size<1>(typename CollectiveMainloop_::TileShape{})>::Params,
      2>;  // both consumer warpgroups on every tile, 64 rows each
  ONNXFUSE_SM90_KERNEL_LAYER_NAMES(Interface);
  using Element = Element_;
  static_assert(kTileM == 128, "two warpgroups of 64 rows");
  static_assert(kAhead == 1 || kAhead == 2, "warpgroup_wait<kAhead>: one or two k-blocks in flight");
  using Epilogue = Sm90ChunkEpilogue<Element, kTileN>;
  static constexpr int kConsumerWarps = onnxfuse::cuda::kSm90ConsumerWarps;
  static constexpr uint32_t kLoadRegisters = 40;
  static constexpr uint32_t kMmaRegisters = 232;  // two sets of 64 accumulators per thread

  struct SharedStorage {
    struct PipelineStorage : cute::aligned_struct<16, cute::_1> {
      alignas(16) typename CollectiveMainloop::PipelineStorage mainloop;
    } pipelines;
    struct TensorStorage : cute::aligned_struct<128, cute::_1> {
      typename CollectiveMainloop::TensorStorage mainloop;
      alignas(128) cute::array_aligned<Element, kConsumerWarps * Epilogue::Whole::kStageElements> epilogue;
    } tensors;
  };
  static constexpr int SharedStorageSize = sizeof(SharedStorage);
  static_assert(SharedStorageSize <= 227 * 1024, "over the H100/H200 shared memory per block");

  // One tile's main loop into `acc`, with the previous tile's epilogue (`prev`, at prev_m0 / prev_n0) when
  // kWithPrevious: interleaved with the k-blocks, kAhead k-blocks of GMMAs queued while a chunk runs, or, when
  // kSerial, all of it before the first k-block (the control: the same epilogue code, not overlapped). The stage
  // order and the GMMAs are CUTLASS's collective's (MainloopSm90TmaGmmaWarpSpecialized::mma), so the accumulators
  // are the same bits.
  template <bool kWithPrevious, class Pipeline, class PipelineState, class FragA, class FragB, class Acc>
  CUTLASS_DEVICE static void mma_tile(Pipeline& pipeline, PipelineState& read, FragA const& tCrA, FragB const& tCrB,
                                      Acc& acc, int k_tiles, Acc const& prev,
                                      typename Epilogue::BiasPairs const& prev_bias, int prev_m0, int prev_n0,
                                      Params const& params, int warp, int lane, Element* stage) {
    using namespace cute;
    TiledMma tiled_mma;
    PipelineState release = read;
    auto issue = [&](bool first) {
      pipeline.consumer_wait(read, pipeline.consumer_try_wait(read));
      const int s = read.index();
      warpgroup_fence_operand(acc);
      warpgroup_arrive();
      tiled_mma.accumulate_ = first ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
      CUTLASS_PRAGMA_UNROLL
      for (int kb = 0; kb < size<2>(tCrA); ++kb) {
        cute::gemm(tiled_mma, tCrA(_, _, kb, s), tCrB(_, _, kb, s), acc);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      ++read;
    };
    int chunks_done = 0;
    auto chunks_until = [&](int due) {
      for (; chunks_done < due && chunks_done < Epilogue::kChunks; ++chunks_done)
        Epilogue::store_chunk(chunks_done, prev, prev_bias, params.epilogue, prev_m0, prev_n0, warp, lane, stage);
    };
    if constexpr (kWithPrevious && kSerial) chunks_until(Epilogue::kChunks);
    const int ahead = k_tiles < kAhead ? k_tiles : kAhead;  // k-blocks issued before the first wait
    issue(true);
    for (int j = 1; j < ahead; ++j) issue(false);
    const int steps = k_tiles - ahead;  // k-blocks issued with a wait after them; the chunks spread over those
    for (int j = 1; j <= steps; ++j) {
      issue(false);
      if constexpr (kWithPrevious && !kSerial) chunks_until((j * Epilogue::kChunks + steps - 1) / steps);
      warpgroup_wait<kAhead>();
      warpgroup_fence_operand(acc);
      pipeline.consumer_release(release);
      ++release;
    }
    if constexpr (kWithPrevious) chunks_until(Epilogue::kChunks);
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc);
    for (int j = 0; j < ahead; ++j) {
      pipeline.consumer_release(release);
      ++release;
    }
  }

  CUTLASS_DEVICE void operator()(Params const& params, char* smem_buf) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using namespace cute;
    enum class Role { Producer = 0, Consumer0 = 1, Consumer1 = 2 };
    SharedStorage& shared = *reinterpret_cast<SharedStorage*>(smem_buf);
    const int lane = cutlass::canonical_lane_idx();
    const int warp = cutlass::canonical_warp_idx_sync();
    const int warp_in_group = warp % cutlass::NumWarpsPerWarpGroup;
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
    const int k_tiles = static_cast<int>(size<3>(get<0>(load_inputs)));  // A's tiles: (BLK_M, BLK_K, m, k, l)

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
      const int group = static_cast<int>(role) - static_cast<int>(Role::Consumer0);
      Element* stage =
          shared.tensors.epilogue.data() + (warp - cutlass::NumWarpsPerWarpGroup) * Epilogue::Whole::kStageElements;
      TiledMma tiled_mma;
      Tensor sA = make_tensor(make_smem_ptr(shared.tensors.mainloop.smem_A.data()),
                              typename CollectiveMainloop::SmemLayoutA{});  // (BLK_M, BLK_K, PIPE)
      Tensor sB = make_tensor(make_smem_ptr(shared.tensors.mainloop.smem_B.data()),
                              typename CollectiveMainloop::SmemLayoutB{});  // (BLK_N, BLK_K, PIPE)
      auto thread_mma = tiled_mma.get_slice(group * cutlass::NumThreadsPerWarpGroup);
      Tensor tCrA = thread_mma.make_fragment_A(thread_mma.partition_A(sA));  // (MMA, MMA_M, MMA_K, PIPE)
      Tensor tCrB = thread_mma.make_fragment_B(thread_mma.partition_B(sB));  // (MMA, MMA_N, MMA_K, PIPE)
      Tensor acc0 = partition_fragment_C(tiled_mma, take<0, 2>(TileShape{}));  // (MMA, MMA_M, MMA_N)
      Tensor acc1 = partition_fragment_C(tiled_mma, take<0, 2>(TileShape{}));
      typename Epilogue::BiasPairs bias0, bias1;
      int m0_0 = 0, n0_0 = 0, m0_1 = 0, n0_1 = 0;
      auto begin = [&](typename Epilogue::BiasPairs& bias, int& m0, int& n0) {
        m0 = work.M_idx * kTileM + 64 * group;  // this warpgroup's rows of the tile
        n0 = work.N_idx * kTileN;
        Epilogue::Whole::load_bias(bias, params.epilogue, n0, lane);
      };
      auto next = [&] {
        scheduler.advance_to_next_work();
        work = scheduler.get_current_work();
      };
      auto store_all = [&](auto const& acc, typename Epilogue::BiasPairs const& bias, int m0, int n0) {
        for (int q = 0; q < Epilogue::kChunks; ++q)
          Epilogue::store_chunk(q, acc, bias, params.epilogue, m0, n0, warp_in_group, lane, stage);
      };
      if (work.is_valid()) {
        begin(bias0, m0_0, n0_0);
        mma_tile<false>(pipeline, consume_state, tCrA, tCrB, acc0, k_tiles, acc1, bias1, 0, 0, params,
                        warp_in_group, lane, stage);
        next();
        while (true) {  // two tiles per trip, so that each accumulator set stays a register array
          if (!work.is_valid()) {
            store_all(acc0, bias0, m0_0, n0_0);
            break;
          }
          begin(bias1, m0_1, n0_1);
          mma_tile<true>(pipeline, consume_state, tCrA, tCrB, acc1, k_tiles, acc0, bias0, m0_0, n0_0, params,
                         warp_in_group, lane, stage);
          next();
          if (!work.is_valid()) {
            store_all(acc1, bias1, m0_1, n0_1);
            break;
          }
          begin(bias0, m0_0, n0_0);
          mma_tile<true>(pipeline, consume_state, tCrA, tCrB, acc0, k_tiles, acc1, bias1, m0_1, n0_1, params,
                         warp_in_group, lane, stage);
          next();
        }
      }
    }
#endif
  }
};

}  // namespace ofk_explore

namespace onnxfuse::cuda {

// The tactic's kernel for an intra-overlap configuration, as Sm90Tactic (sm90_gemm_gelu.cuh) uses it: the layer's
// operand layouts, checks and arguments (kernel_layer_tactic.cuh), CUTLASS's cooperative main-loop collective, this
// file's kernel.
template <DType D, bool TransB, int TileM, int TileN, int TileK, int ClusterM, int ClusterN, int Ahead, bool Serial>
struct Sm90Kernel<ofk_explore::Sm90IntraOverlapConfig<D, TransB, TileM, TileN, TileK, ClusterM, ClusterN, Ahead, Serial>>
    : ofk_explore::KernelLayerTactic<D, TransB, TileM, TileN, TileK, ClusterM, ClusterN> {
  using Base = ofk_explore::KernelLayerTactic<D, TransB, TileM, TileN, TileK, ClusterM, ClusterN>;
  using Element = typename Base::Element;
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, typename Base::LayoutA, Base::kAlignment, Element,
      typename Base::LayoutB, Base::kAlignment, float, typename Base::TileShape, typename Base::ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<sm90_warp_epilogue_smem_bytes<Element, TileN>()>,
      cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;
  using GemmKernel = ofk_explore::Sm90IntraOverlapKernel<CollectiveMainloop, Element, Ahead, Serial>;

  static typename GemmKernel::Arguments make_arguments(const GemmGeluArgs& a, const DeviceInfo& dev) {
    return Base::template arguments<GemmKernel>(a, dev);
  }
};

}  // namespace onnxfuse::cuda
