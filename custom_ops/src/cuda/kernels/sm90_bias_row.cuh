// The bias of the sm90 epilogue: a row vector broadcast down the tile's rows, which each thread reads for its
// own output columns straight from global memory into registers when a tile's epilogue begins.
//
// Why not CUTLASS's Sm90RowBroadcast: it stages the row through shared memory at every tile (one element per
// thread from global memory, a barrier of the consumer warpgroup, then shared-memory loads that queue behind
// the other warpgroup's GMMA operand reads). At K <= 1024 the ping-pong kernel is epilogue-bound: the two
// warpgroups' epilogues run back to back and set the kernel's pace (lab/kernels/NOTES.md, v6), so that
// hand-off is time of the whole kernel. This is CUTLASS's own pattern for a column vector (Sm90ColBroadcast:
// every thread loads exactly the elements its accumulators need, vectorized, predicated on the problem's edge)
// applied to the row.
//
// Register cost: the bias of all of a thread's columns in the tile, held for the tile's whole epilogue: 32
// floats for the ping-pong 128x128 tile (what Sm90RowBroadcast holds per epilogue step there), 48 for the
// cooperative 128x192 tile with its three 128x64 steps (16 per step before); every sm90 kernel still fits in
// 168 registers per thread with no spills.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp>

namespace onnxfuse::cuda {

template <class ElementInput, class ElementCompute, int Alignment>
struct Sm90BiasRow {
  struct SharedStorage {};

  struct Arguments {
    ElementInput const* ptr_row = nullptr;  // N values; null means no bias (zeros)
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return args;
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const&) {
    return true;
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*, cudaStream_t,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }

  CUTLASS_HOST_DEVICE Sm90BiasRow() {}
  CUTLASS_HOST_DEVICE Sm90BiasRow(Params const& params, SharedStorage const&) : params(params) {}

  Params params;

  CUTLASS_DEVICE bool is_producer_load_needed() const { return false; }
  CUTLASS_DEVICE bool is_C_load_needed() const { return false; }
  CUTLASS_DEVICE bool is_zero() const { return params.ptr_row == nullptr; }

  template <class... Args>
  CUTLASS_DEVICE auto get_producer_load_callbacks(cutlass::epilogue::fusion::ProducerLoadArgs<Args...> const&) {
    return cutlass::epilogue::fusion::EmptyProducerLoadCallbacks{};
  }

  template <class GTensor, class RTensor, class CTensor, class ThrResidue>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE ConsumerStoreCallbacks(GTensor tCgRow_, RTensor tCrRow_, CTensor tCcRow_, ThrResidue residue_,
                                          Params const& params_)
        : tCgRow(tCgRow_), tCrRow(tCrRow_), tCcRow(tCcRow_), residue(residue_), params(params_) {
      if (params.ptr_row == nullptr) cute::fill(tCrRow, ElementCompute(0));
    }

    GTensor tCgRow;  // (CPY,CPY_M,CPY_N,EPI_M,EPI_N) the bias under each accumulator this thread stores
    RTensor tCrRow;  // (CPY,CPY_M,CPY_N,EPI_M,EPI_N) the same in registers, stride 0 down the rows
    CTensor tCcRow;  // (CPY,CPY_M,CPY_N,EPI_M,EPI_N) their output coordinates, for the problem's edge
    ThrResidue residue;
    Params const& params;

    CUTLASS_DEVICE void begin() {
      using namespace cute;
      if (params.ptr_row == nullptr) return;
      // One load per distinct column (filter_zeros drops the stride-0 row modes), vectorized where a thread's
      // columns are contiguous; columns past N read nothing and stay 0.
      Tensor tCgRow_flt = filter_zeros(tCgRow);
      Tensor tCrRow_flt = make_tensor_like<ElementInput>(filter_zeros(tCrRow));
      Tensor tCcRow_flt = filter_zeros(tCcRow, tCgRow.stride());
      clear(tCrRow_flt);
      constexpr auto MCL = decltype(max_common_layout(tCgRow_flt, tCrRow_flt)){};
      constexpr int V = cute::min(Alignment, size(MCL));
      if constexpr (V > 1) {
        using VecType = uint_bit_t<V * sizeof_bits_v<ElementInput>>;
        Tensor tCgRow_vec = recast<VecType>(coalesce(tCgRow_flt));
        Tensor tCrRow_vec = recast<VecType>(coalesce(tCrRow_flt));
        Tensor tCcRow_vec = tensor<1>(zipped_divide(tCcRow_flt, MCL.compose(Int<V>{})));
        Tensor tCpRow_vec = cute::lazy::transform(tCcRow_vec, [&](auto const& c) { return elem_less(c, residue); });
        copy_if(tCpRow_vec, tCgRow_vec, tCrRow_vec);
      } else {
        Tensor tCpRow_flt = cute::lazy::transform(tCcRow_flt, [&](auto const& c) { return elem_less(c, residue); });
        copy_if(tCpRow_flt, tCgRow_flt, tCrRow_flt);
      }

      constexpr int FrgSize = size(tCrRow_flt);
      using FrgInput = cutlass::Array<ElementInput, FrgSize>;
      using FrgCompute = cutlass::Array<ElementCompute, FrgSize>;
      Tensor tCrRow_input_frg = recast<FrgInput>(coalesce(tCrRow_flt));
      Tensor tCrRow_compute_frg = recast<FrgCompute>(filter(tCrRow));
      tCrRow_compute_frg(_0{}) =
          cutlass::NumericArrayConverter<ElementCompute, ElementInput, FrgSize>{}(tCrRow_input_frg(_0{}));
    }

    template <typename ElementAccumulator, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<ElementCompute, FragmentSize> visit(
        cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v, int epi_m, int epi_n) {
      cutlass::Array<ElementCompute, FragmentSize> frg_row;
      auto tCrRow_mn = tCrRow(cute::_, cute::_, cute::_, epi_m, epi_n);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i) frg_row[i] = tCrRow_mn(epi_v * FragmentSize + i);
      return frg_row;
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    using namespace cute;
    auto [M, N, K, L] = args.problem_shape_mnkl;
    // Y[m, n] takes bias[n]: stride 0 along M (and L: one bias for the batch).
    auto layout = make_layout(make_layout(M, _0{}), make_layout(N), make_layout(L, _0{}));
    Tensor mRow = make_tensor(make_gmem_ptr(params.ptr_row), layout);
    Tensor tCgRow = cutlass::epilogue::fusion::sm90_partition_for_epilogue<ReferenceSrc>(
        mRow, args.tile_shape_mnk, args.tile_coord_mnkl, args.epi_tile, args.tiled_copy, args.thread_idx);
    Tensor tCrRow = make_tensor_like<ElementCompute>(tCgRow);  // keeps the stride-0 row modes: one register a column
    return ConsumerStoreCallbacks<decltype(tCgRow), decltype(tCrRow), decltype(args.tCcD), decltype(args.residue_tCcD)>(
        tCgRow, tCrRow, args.tCcD, args.residue_tCcD, params);
  }
};

}  // namespace onnxfuse::cuda
