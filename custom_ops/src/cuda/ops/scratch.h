// Scratch for one call of a CUDA op: staged operands, cuBLASLt's workspace, a float32 product, a tactic's
// workspace. One block per need, carved into parts that each start 256-byte aligned (ScratchPart).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <onnxruntime_cxx_api.h>

#include "cuda/ops/errors.h"

namespace onnxfuse {

// Scratch for one call, returned when the call ends. It comes from ORT's GPU allocator on the call's compute
// stream (the C API's scratch buffer, as ORT's own kernels take theirs): the arena tags the block with that
// stream, so once freed it goes only to later work on the same stream, or to another stream after ORT has
// made it wait for this one. A session's concurrent runs each have a stream of their own, and a block taken
// without a stream (the allocator's plain Alloc) could go to another run while this call's kernels still
// read and write it.
class Workspace {
 public:
  Workspace(Ort::KernelContext& ctx, const OrtMemoryInfo& memory, size_t bytes) {
    if (bytes == 0) return;
    allocator_ = ctx.GetAllocator(memory);
    Ort::ThrowOnError(Ort::GetApi().KernelContext_GetScratchBuffer(ctx.GetOrtKernelContext(), &memory, bytes, &data_));
    if (data_ == nullptr) Fail(ORT_FAIL, "ORT's GPU allocator gave no scratch of " + std::to_string(bytes) + " bytes");
  }
  ~Workspace() {
    if (data_ != nullptr) allocator_.Free(data_);
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  void* data() const { return data_; }

 private:
  Ort::Allocator allocator_{nullptr};
  void* data_ = nullptr;
};

// The bytes one part of a scratch block takes: `bytes` rounded up to 256, so that the next part starts as
// aligned as the allocator's blocks do.
inline size_t ScratchPart(int64_t bytes) { return static_cast<size_t>((bytes + 255) / 256 * 256); }

}  // namespace onnxfuse
