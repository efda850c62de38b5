// Aligned copies of FusedLinearGelu operands whose rows are not 16-byte vectors (cuda/dispatch/row_vectors.h):
// PaddedCopy describes one such copy, made per call in scratch (RunFusedStaged, RunFallbackStaged) or once for a
// constant; StagedConstants keeps a node's constant W and B copied once, when ORT creates the kernel.
#pragma once

#include <cstdint>

#include <onnxruntime_cxx_api.h>

#include "cuda/dispatch/gemm_gelu.h"
#include "cuda/kernels/copy_rows.h"

namespace onnxfuse {

// The copy of a [rows, cols] operand into [rows_pad, cols_pad] rows padded with zeros.
inline cuda::RowCopy PaddedCopy(void* dst, const void* src, int64_t rows, int64_t cols, int64_t rows_pad,
                                int64_t cols_pad) {
  return {dst, cols_pad, rows_pad, cols_pad, src, cols, rows, cols};
}

// W and B copied once into rows of 16-byte vectors (RunFusedStaged's layout), where this is a 16-bit node
// whose W or B is a constant initializer in GPU memory with rows that are not: at 4095x1023, copying W
// on every call would cost about as much as the GEMM at a few hundred rows. For a float32 node, W alone
// (RunFallbackStaged reads B as it is), where the staged fallback can take its calls (StagedFallbackPays:
// a narrow, deep W of enough weights); other float32 nodes keep no copy. Anything else (a graph input, a
// shape the call will reject) is left to Compute.
//
// Written once (Stage, from the kernel's constructor) and only read afterwards, so concurrent Compute calls
// may read it. The copies live in `allocator`'s memory until this object is destroyed.
class StagedConstants {
 public:
  StagedConstants() = default;
  ~StagedConstants() { Release(); }
  StagedConstants(const StagedConstants&) = delete;
  StagedConstants& operator=(const StagedConstants&) = delete;

  // Stages the constant W and B of the node `info` describes where that pays (above), on `device`, in memory
  // from `allocator` (the node's GPU allocator, which must outlive this object). On a CUDA error it releases
  // what it staged and throws.
  void Stage(const OrtKernelInfo* info, cuda::DType dtype, bool trans_b, int device, Ort::Allocator* allocator);

  // W in rows of 16-byte vectors for the padded problem (RunFusedStaged, RunFallbackStaged): W itself where its
  // rows already are and none are missing, the constructor's copy of a constant W, or null (a W given at run
  // time, which the fused path copies per call and the float32 fallback leaves unstaged).
  const void* AlignedWeight(const cuda::GemmGeluArgs& args) const;

  // B's copy when `bias` is the constant it was made from, else null.
  const void* Bias(const void* bias) const { return b_.data != nullptr && b_.source == bias ? b_.data : nullptr; }

 private:
  // A constant operand's copy in rows of 16-byte vectors, and the initializer's address it was made from
  // (a call passes that address for that input).
  struct StagedOperand {
    void* data = nullptr;
    const void* source = nullptr;
  };

  void Release();

  Ort::Allocator* allocator_ = nullptr;  // the node's GPU allocator, owned by the kernel
  StagedOperand w_, b_;
};

}  // namespace onnxfuse
