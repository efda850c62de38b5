// The row flags of FillMaskedRows and MaskedSkipLayerNormalization, read by one warp: row (b, r) of a
// [B, S, D] tensor is kept when any of its K flags row_kept[b, S|1, 0..K) is set.
#pragma once

#include <cstdint>

namespace onnxfuse::cuda {

// The first of row (b, r)'s K flags in a [B, flag_rows, K] array (flag_rows = S, or 1: one set for every row
// of a batch entry).
__device__ __forceinline__ const bool* row_flags(const bool* row_kept, int64_t b, int64_t r, int64_t flag_rows,
                                                 int64_t flags_per_row) {
  return row_kept + (b * flag_rows + (flag_rows == 1 ? 0 : r)) * flags_per_row;
}

// Whether any of the K flags at `flags` is set. Every lane of the warp must call it (it votes); the lanes
// read the flags side by side, four to a load where they are 4-byte aligned and K is a multiple of 4 (the
// attention mask's row of 128 keys is one coalesced 128-byte read).
__device__ __forceinline__ bool warp_any_flag(const bool* flags, int64_t flags_per_row, int lane) {
  constexpr int kWarpSize = 32;
  bool any = false;
  if (flags_per_row % 4 == 0 && reinterpret_cast<uintptr_t>(flags) % 4 == 0) {
    const uint32_t* words = reinterpret_cast<const uint32_t*>(flags);
    for (int64_t k = lane; k < flags_per_row / 4; k += kWarpSize) any |= words[k] != 0u;
  } else {
    for (int64_t k = lane; k < flags_per_row; k += kWarpSize) any |= flags[k];
  }
  return __any_sync(0xffffffffu, any);
}

}  // namespace onnxfuse::cuda
