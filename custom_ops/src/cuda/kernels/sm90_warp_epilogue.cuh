// The epilogue of our sm90 kernel layer (sm90_warp_epilogue_kernel.cuh): D = act(acc + bias[n]) for one
// consumer warpgroup's tile, written by each warp on its own, with no barrier between warps.
//
// Why its own epilogue: CUTLASS's TMA epilogue stages the whole tile through one shared buffer under a
// warpgroup-wide named barrier with a fixed id, so CUTLASS's ping-pong kernel must run its two warpgroups'
// epilogues one after the other. At K <= 1024 that order sets the kernel's pace (lab/kernels/NOTES.md, v6).
// Here every warp owns its rows of the accumulator outright (a Hopper GMMA gives warp w of a warpgroup rows
// 16w..16w+15 of each 64-row block), so each warp can stage them through a private shared-memory buffer:
//   1. the bias of the thread's columns is read into registers before the tile's main loop (load_bias), or after
//      it where registers are short;
//   2. per 64-row block, add the bias (or, where registers are short, add_bias has added it to the whole tile
//      first), apply the activation in fp32, round to the output type, and write the warp's 16 rows to its buffer
//      with stmatrix (the accumulator's register layout is stmatrix's);
//   3. __syncwarp, then read the rows back as 16-byte vectors and store whole 512-byte row pairs to global
//      memory, predicated on the problem's edge (M rows; N is a multiple of 8, so a vector is all in or out).
// The buffer's 16-byte chunks are XOR-swizzled by row (chunk c of row r lives at c ^ (r & 7)), so both the
// stmatrix writes (8 rows, one chunk each) and the vector reads (8 chunks of one row) are free of bank conflicts.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_types.h>

#include "cuda/kernels/activation_math.cuh"

namespace onnxfuse::cuda {

template <class Element, int TileN>
struct Sm90WarpEpilogue {
  static constexpr int kRowsPerWarp = 16;
  static constexpr int kChunks = TileN / 8;  // 16-byte chunks (8 elements) per row: one GMMA column block each
  static constexpr int kStageElements = kRowsPerWarp * TileN;

  struct Params {
    Element* y = nullptr;          // [M, N] row-major, 16-byte aligned, ldy a multiple of 8
    int64_t ldy = 0;
    Element const* bias = nullptr;  // [N] or null (no bias)
    int M = 0, N = 0;
    ActivationParams act{};
  };

  // The bias of this thread's columns, two elements per register: columns n0 + 8j + 2(lane % 4) + {0, 1}.
  using BiasPairs = uint32_t[kChunks];

  CUTLASS_DEVICE static void load_bias(BiasPairs& pairs, Params const& p, int n0, int lane) {
    const int col = n0 + 2 * (lane & 3);
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      pairs[j] = 0;  // the zeros of an absent bias or of columns past N
      if (p.bias != nullptr && n0 + 8 * j < p.N)
        pairs[j] = *reinterpret_cast<uint32_t const*>(p.bias + col + 8 * j);
    }
  }

  // Adds the bias to every accumulator of the tile at once, for a kernel whose registers cannot hold the bias's
  // 2·kChunks fp32 values through the activation blocks (three consumer warpgroups: 160 registers, 128 of them
  // accumulators); store<kBiasAdded = true> then skips the addition. The same fp32 additions as store's, so the
  // same outputs.
  template <class Accumulator>
  CUTLASS_DEVICE static void add_bias(Accumulator& acc, BiasPairs const& bias_pairs) {
    check_fragment(acc);
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const auto two = reinterpret_cast<Element const*>(&bias_pairs[j]);
      const float b[2] = {static_cast<float>(two[0]), static_cast<float>(two[1])};
#pragma unroll
      for (int mm = 0; mm < decltype(cute::size<1>(acc))::value; ++mm) {
#pragma unroll
        for (int i = 4 * j; i < 4 * j + 4; ++i) acc(i, mm, 0) += b[i & 1];
      }
    }
  }

  // `acc` is the warpgroup's accumulator fragment for a (64·MmaM) x TileN tile whose origin is (m0, n0): per
  // 64-row block mm, value 4j + 2h + c is row 16·warp + lane/4 + 8h, column 8j + 2(lane % 4) + c.
  // kBiasAdded: add_bias has run (`bias_pairs` is not read).
  template <bool kBiasAdded = false, class Accumulator>
  CUTLASS_DEVICE static void store(Accumulator const& acc, BiasPairs const& bias_pairs, Params const& p, int m0,
                                   int n0, int warp, int lane, Element* stage) {
    check_fragment(acc);
    float bias[2 * kChunks];
    if constexpr (!kBiasAdded) {
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        const auto two = reinterpret_cast<Element const*>(&bias_pairs[j]);
        bias[2 * j] = static_cast<float>(two[0]);
        bias[2 * j + 1] = static_cast<float>(two[1]);
      }
    }
    const uint32_t stage_base = static_cast<uint32_t>(__cvta_generic_to_shared(stage));
    // stmatrix .x4: lane l names the row address of matrix l / 8, row l % 8; matrix i holds column block
    // 2s + i / 2, rows 8·(i % 2) + 0..7 of the warp's 16.
    const int st_row = 8 * ((lane >> 3) & 1) + (lane & 7);
    const int st_block = lane >> 4;

#pragma unroll
    for (int mm = 0; mm < decltype(cute::size<1>(acc))::value; ++mm) {
      float v[4 * kChunks];
#pragma unroll
      for (int i = 0; i < 4 * kChunks; ++i) {
        if constexpr (kBiasAdded)
          v[i] = acc(i, mm, 0);
        else
          v[i] = acc(i, mm, 0) + bias[2 * (i / 4) + (i & 1)];
      }
      apply_activation<false>(v, p.act);

#pragma unroll
      for (int s = 0; s < kChunks / 2; ++s) {
        uint32_t r[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) r[i] = pack(v[8 * s + 2 * i], v[8 * s + 2 * i + 1]);
        const int chunk = (2 * s + st_block) ^ (st_row & 7);
        const uint32_t addr = stage_base + static_cast<uint32_t>((st_row * TileN + 8 * chunk) * sizeof(Element));
        asm volatile("stmatrix.sync.aligned.x4.m8n8.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]),
                     "r"(r[1]), "r"(r[2]), "r"(r[3]));
      }
      __syncwarp();

      const int row0 = m0 + 64 * mm + kRowsPerWarp * warp;
#pragma unroll
      for (int it = 0; it < kRowsPerWarp * kChunks / 32; ++it) {
        const int idx = 32 * it + lane;
        const int r = idx / kChunks, c = idx % kChunks;
        const uint4 val = *reinterpret_cast<uint4 const*>(stage + r * TileN + 8 * (c ^ (r & 7)));
        if (row0 + r < p.M && n0 + 8 * c < p.N)
          *reinterpret_cast<uint4*>(p.y + static_cast<int64_t>(row0 + r) * p.ldy + n0 + 8 * c) = val;
      }
      __syncwarp();  // the buffer is rewritten by the next block
    }
  }

 private:
  template <class Accumulator>
  CUTLASS_DEVICE static void check_fragment(Accumulator const& acc) {
    static_assert(sizeof(Element) == 2, "16-bit outputs only (fp32 runs CUTLASS's epilogue at libm accuracy)");
    static_assert(TileN % 64 == 0, "the swizzle needs at least 8 16-byte chunks per staged row");
    static_assert(decltype(cute::size<0>(acc))::value == 4 * kChunks && decltype(cute::size<2>(acc))::value == 1,
                  "one GMMA atom spans the tile's columns");
  }

  // Round two fp32 values to the output type (round to nearest even, as CUTLASS's converters do) and pack them.
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

}  // namespace onnxfuse::cuda
