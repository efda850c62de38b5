// The CPU kernel's fast path on x86-64 with AVX2+FMA or AVX-512F: a cache-blocked GEMM whose weight is
// packed once into the micro-kernel's layout; after the last K slice the bias is added in registers and the
// activation runs on each finished 6-row sliver while it is in L1 (packed_gemm_kernel.h).
//
// Why not the BLAS here: ORT's own MatMul packs a constant weight once at session start, while a BLAS call
// repacks W on every call; at M=128 that packing alone left OpenBLAS behind ORT's MatMul on this project's
// machines (AMD EPYC, AVX2, 2 cores), so no epilogue fusion could win it back (the kernel as shipped against
// ORT: bench/results/cpu_kernel.md).
// OpenBLAS stays the portable path (CPUs without AVX2, see fused_linear_gelu_cpu.cc). The price of the
// packed copy: a constant weight is held twice (ORT keeps the initializer), in float32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>

#include "activation.h"

namespace onnxfuse::cpu {

// The packed weight: ceil(N/16) column panels; panel p holds K rows of 16 floats (columns 16p..16p+15
// of op(W) = [K, N]), zero past N. Panels are 64-byte aligned.
inline constexpr int64_t kPanelWidth = 16;

inline int64_t PackedWeightFloats(int64_t K, int64_t N) {
  return ((N + kPanelWidth - 1) / kPanelWidth) * K * kPanelWidth;
}

struct AlignedFree {
  void operator()(float* p) const { std::free(p); }
};
using AlignedFloats = std::unique_ptr<float[], AlignedFree>;

inline AlignedFloats AllocateAligned(int64_t count) {
  const size_t bytes = ((static_cast<size_t>(count) * sizeof(float) + 63) / 64) * 64;
  void* p = std::aligned_alloc(64, bytes == 0 ? 64 : bytes);
  if (p == nullptr) throw std::bad_alloc();
  return AlignedFloats(static_cast<float*>(p));
}

// Packs panels [panel_begin, panel_end) of W (float32; [N, K] when trans_b, else [K, N]) into `packed`
// (laid out for all panels, PackedWeightFloats(K, N) floats). Panels are independent: callers split the
// range over threads.
void PackWeightPanels(const float* w, bool trans_b, int64_t K, int64_t N, int64_t panel_begin, int64_t panel_end,
                      float* packed);

// One output tile: C[0:m, 0:n] = act(A[0:m, :] · op(W)[:, n0:n0+n] + bias[n0:n0+n]).
struct FusedTile {
  const float* a;         // A rows of this tile, row stride lda, K columns
  int64_t lda;
  const float* packed_w;  // the whole packed weight
  int64_t K, N;
  int64_t m;              // rows in the tile
  int64_t n0, n;          // first column (a multiple of kPanelWidth) and column count
  float* c;               // C[0][0] of the tile, row stride ldc
  int64_t ldc;
  const float* bias;      // the full bias [N] or nullptr
  Activation act;
  float alpha;
};

// The widest packed-GEMM instantiation this build has and this CPU runs: AVX-512F, else AVX2+FMA+F16C,
// else none (the BLAS path). ONNXFUSE_CPU_ISA=avx2 caps it at AVX2; =scalar turns it off.
enum class GemmIsa { kNone, kAvx2, kAvx512 };
GemmIsa PackedGemmIsa();
const char* GemmIsaName(GemmIsa isa);
inline bool PackedGemmAvailable() { return PackedGemmIsa() != GemmIsa::kNone; }

// Computes one tile with the chosen ISA's micro-kernel. K must be > 0.
void FusedGemmTile(const FusedTile& tile);
void FusedGemmTileAvx2(const FusedTile& tile);
void FusedGemmTileAvx512(const FusedTile& tile);

}  // namespace onnxfuse::cpu
