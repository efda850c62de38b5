// launch_copy_rows (copy_rows.h): memory-bound, one pass over dst.
//
// The rows it copies are, by construction, not 16-byte vectors on at least one side, so a thread does not own a run
// of consecutive elements (its 8 element accesses would each touch a different 32-byte sector: 8x the L2 traffic of
// the bytes moved). Instead the kElems elements of a thread are kThreads apart, so every warp access covers 32
// adjacent elements, and elements move in pairs (32-bit words) where both matrices allow it: even pitches, widths and
// addresses, as for 770x3074. The grid's y dimension walks rows, its x dimension column blocks: no 64-bit division
// per thread.
#include <algorithm>
#include <cstdint>

#include "cuda/kernels/copy_rows.h"

namespace onnxfuse::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kElems = 8;  // per thread, kThreads apart
constexpr int64_t kMaxGridRows = 65535;

template <class Unit>
__global__ void __launch_bounds__(kThreads) copy_rows_kernel(RowCopy c) {
  const Unit* src = static_cast<const Unit*>(c.src);
  Unit* dst = static_cast<Unit*>(c.dst);
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kThreads * kElems + threadIdx.x;
  for (int64_t r = blockIdx.y; r < c.dst_rows; r += gridDim.y) {
    const bool src_row = r < c.src_rows;
    Unit v[kElems];
#pragma unroll
    for (int j = 0; j < kElems; ++j) {
      const int64_t col = col0 + j * kThreads;
      v[j] = src_row && col < c.src_cols ? src[r * c.src_pitch + col] : Unit{0};
    }
#pragma unroll
    for (int j = 0; j < kElems; ++j) {
      const int64_t col = col0 + j * kThreads;
      if (col < c.dst_cols) dst[r * c.dst_pitch + col] = v[j];
    }
  }
}

bool Even(int64_t v) { return v % 2 == 0; }

}  // namespace

cudaError_t launch_copy_rows(const RowCopy& c, int element_bytes, cudaStream_t stream) {
  if (element_bytes != 2 && element_bytes != 4) return cudaErrorInvalidValue;
  if (c.dst_rows <= 0 || c.dst_cols <= 0) return cudaSuccess;
  const uintptr_t pair_bytes = 2 * static_cast<uintptr_t>(element_bytes);
  const bool pairs = Even(c.dst_pitch) && Even(c.dst_cols) && Even(c.src_pitch) && Even(c.src_cols) &&
                     reinterpret_cast<uintptr_t>(c.dst) % pair_bytes == 0 &&
                     reinterpret_cast<uintptr_t>(c.src) % pair_bytes == 0;
  RowCopy units = c;
  if (pairs) {
    units.dst_pitch /= 2, units.dst_cols /= 2, units.src_pitch /= 2, units.src_cols /= 2;
  }
  const int64_t per_block = int64_t{kThreads} * kElems;
  const dim3 grid(static_cast<unsigned>((units.dst_cols + per_block - 1) / per_block),
                  static_cast<unsigned>(std::min(units.dst_rows, kMaxGridRows)));
  if (element_bytes == 2 && pairs) {
    copy_rows_kernel<uint32_t><<<grid, kThreads, 0, stream>>>(units);
  } else if (element_bytes == 2) {
    copy_rows_kernel<uint16_t><<<grid, kThreads, 0, stream>>>(units);
  } else if (pairs) {
    copy_rows_kernel<uint64_t><<<grid, kThreads, 0, stream>>>(units);
  } else {
    copy_rows_kernel<uint32_t><<<grid, kThreads, 0, stream>>>(units);
  }
  return cudaGetLastError();
}

}  // namespace onnxfuse::cuda
