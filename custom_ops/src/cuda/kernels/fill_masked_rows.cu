// launch_fill_masked_rows (fill_masked_rows.h). A warp owns one row: its lanes read the row's K flags
// side by side and vote (masked_rows.cuh); a kept row in place costs the warp nothing more. A warp rather
// than a block per row: in place nearly every row is kept and the kernel is the flags' read, and four rows to
// a block make a quarter of the blocks to schedule (B=32, S=128: 1 024 instead of 4 096). GPT-2's guards with
// a block per row, a warp per row and the causal mask's own flags: bench/results/e2e_h200.md, "The row guard on
// the mask itself".
// Elements move as 16-byte vectors where the row's bytes and both pointers allow it (every hidden size of a
// transformer; a 768-wide float16 row is 96 vectors, three a lane), else one element at a time.
#include <algorithm>
#include <cstdint>

#include "cuda/kernels/fill_masked_rows.h"
#include "cuda/kernels/masked_rows.cuh"

namespace onnxfuse::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarpSize = 32;
constexpr int kRowsPerBlock = kThreads / kWarpSize;
constexpr int64_t kMaxGridX = 2147483647;

template <class Unit>
__global__ void __launch_bounds__(kThreads) fill_masked_rows_kernel(MaskedRows c, Unit fill, int64_t units) {
  const int64_t total_rows = c.batch * c.rows;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kRowsPerBlock;
  for (int64_t row = first; row < total_rows; row += stride) {  // warp-uniform: every lane votes
    const int64_t b = row / c.rows, r = row - b * c.rows;
    const bool* flags = row_flags(c.row_kept, b, r, c.flag_rows, c.flags_per_row);
    const bool kept = warp_any_flag(flags, c.flags_per_row, lane);
    if (kept && c.y == c.x) continue;
    Unit* dst = static_cast<Unit*>(c.y) + row * units;
    const Unit* src = static_cast<const Unit*>(c.x) + row * units;
    for (int64_t i = lane; i < units; i += kWarpSize) dst[i] = kept ? src[i] : fill;
  }
}

// The fill replicated over one 16-byte vector.
uint4 Replicated(uint32_t bits, int64_t element_bytes) {
  const uint32_t word = element_bytes == 4 ? bits : (bits & 0xffffu) | (bits << 16);
  return make_uint4(word, word, word, word);
}

}  // namespace

cudaError_t launch_fill_masked_rows(const MaskedRows& c, cudaStream_t stream) {
  const int64_t total_rows = c.batch * c.rows;
  if (total_rows <= 0 || c.width <= 0) return cudaSuccess;
  const int64_t row_bytes = c.width * c.element_bytes;
  const bool vectors = row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(c.x) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(c.y) % 16 == 0;
  const unsigned grid = static_cast<unsigned>(std::min((total_rows + kRowsPerBlock - 1) / kRowsPerBlock, kMaxGridX));
  if (vectors) {
    fill_masked_rows_kernel<uint4><<<grid, kThreads, 0, stream>>>(c, Replicated(c.fill_bits, c.element_bytes),
                                                                   row_bytes / 16);
  } else if (c.element_bytes == 4) {
    fill_masked_rows_kernel<uint32_t><<<grid, kThreads, 0, stream>>>(c, c.fill_bits, c.width);
  } else {
    fill_masked_rows_kernel<uint16_t><<<grid, kThreads, 0, stream>>>(c, static_cast<uint16_t>(c.fill_bits), c.width);
  }
  return cudaGetLastError();
}

}  // namespace onnxfuse::cuda
