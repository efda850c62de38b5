// StagedConstants (staging.h): a node's constant W and B copied once into rows of 16-byte vectors.
#include "cuda/ops/staging.h"

#include <cstddef>
#include <vector>

#include <cuda_runtime.h>

#include "cuda/dispatch/path_choice.h"
#include "cuda/dispatch/row_vectors.h"
#include "cuda/ops/errors.h"

namespace onnxfuse {
namespace {

// Makes `device` current for a scope (the constructor may run on a thread whose current device differs).
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != device) cudaSetDevice(device);
    else previous_ = -1;
  }
  ~DeviceScope() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;
};

// A stream of the constructor's own (ORT gives a kernel its stream only in Compute), destroyed with the scope.
class OwnedStream {
 public:
  OwnedStream() = default;
  ~OwnedStream() {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  cudaError_t create() { return cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); }
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

}  // namespace

void StagedConstants::Stage(const OrtKernelInfo* info, cuda::DType dtype, bool trans_b, int device,
                            Ort::Allocator* allocator) {
  allocator_ = allocator;
  const bool fp32 = dtype == cuda::DType::kFloat32;
  const int64_t v = cuda::VectorElements(dtype), bytes = cuda::ElementBytes(dtype);
  Ort::ConstKernelInfo kernel_info{info};
  auto constant = [&](size_t index) -> Ort::ConstValue {
    if (kernel_info.GetInputCount() <= index) return Ort::ConstValue{nullptr};
    int is_constant = 0;
    Ort::ConstValue v = kernel_info.GetTensorConstantInput(index, &is_constant);
    if (!is_constant || v == nullptr) return Ort::ConstValue{nullptr};
    if (v.GetTensorMemoryInfo().GetDeviceType() != OrtMemoryInfoDeviceType_GPU) return Ort::ConstValue{nullptr};
    return v;
  };
  Ort::ConstValue w = constant(1);
  if (w == nullptr) return;
  const std::vector<int64_t> w_shape = w.GetTensorTypeAndShapeInfo().GetShape();
  if (w_shape.size() != 2 || w_shape[0] <= 0 || w_shape[1] <= 0) return;
  const int64_t w_rows = w_shape[0], w_cols = w_shape[1];
  const int64_t n = trans_b ? w_rows : w_cols, k = trans_b ? w_cols : w_rows;
  if (fp32) {
    cuda::GemmGeluArgs shape{};  // the node's (K, N) at the fewest rows the staged fallback takes
    shape.dtype = cuda::DType::kFloat32;
    shape.M = cuda::kStagedFallbackMinRows, shape.K = k, shape.N = n;
    shape.trans_b = trans_b;
    shape.w = w.GetTensorRawData();
    if (!cuda::StagedFallbackPays(shape)) return;
  }
  const int64_t w_rows_pad = cuda::RoundUpToVector(w_rows, v), w_cols_pad = cuda::RoundUpToVector(w_cols, v);

  // What was staged is released here on any failure: a Stage that throws leaves nothing behind.
  try {
    DeviceScope device_scope(device);
    OwnedStream stream;
    cudaError_t e = stream.create();
    auto stage = [&](const Ort::ConstValue& value, int64_t rows, int64_t cols, int64_t rows_pad, int64_t cols_pad,
                     StagedOperand* out) {
      if (e != cudaSuccess || cuda::ReadAsIs(value.GetTensorRawData(), rows, cols, rows_pad, v)) return;
      out->data = allocator_->Alloc(static_cast<size_t>(rows_pad * cols_pad * bytes));
      out->source = value.GetTensorRawData();
      e = cuda::launch_copy_rows(PaddedCopy(out->data, out->source, rows, cols, rows_pad, cols_pad),
                                 static_cast<int>(bytes), stream.get());
    };
    // W's padded rows matter too: [N, K] padded to N8 rows (N4 for float32), [K, N] to K8 (K4).
    stage(w, w_rows, w_cols, w_rows_pad, w_cols_pad, &w_);
    Ort::ConstValue b = constant(2);
    if (b != nullptr && !fp32) {
      const std::vector<int64_t> b_shape = b.GetTensorTypeAndShapeInfo().GetShape();
      if (b_shape.size() == 1 && b_shape[0] == n) stage(b, 1, n, 1, cuda::RoundUpToVector(n, v), &b_);
    }
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream.get());
    if (e != cudaSuccess) Fail(ORT_FAIL, "staging the constant W and B in aligned rows failed: " + CudaErrorText(e));
  } catch (...) {
    Release();
    throw;
  }
}

void StagedConstants::Release() {
  for (StagedOperand* op : {&w_, &b_}) {
    if (op->data != nullptr) allocator_->Free(op->data);
    *op = StagedOperand{};
  }
}

const void* StagedConstants::AlignedWeight(const cuda::GemmGeluArgs& args) const {
  const int64_t v = cuda::VectorElements(args.dtype);
  const int64_t w_rows = args.trans_b ? args.N : args.K, w_cols = args.trans_b ? args.K : args.N;
  if (cuda::ReadAsIs(args.w, w_rows, w_cols, cuda::RoundUpToVector(w_rows, v), v)) return args.w;
  return w_.data != nullptr && w_.source == args.w ? w_.data : nullptr;
}

}  // namespace onnxfuse
