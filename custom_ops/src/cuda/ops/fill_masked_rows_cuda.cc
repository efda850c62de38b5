// FillMaskedRows on ORT's CUDA provider: X, the flags and Y stay in GPU memory; one kernel on ORT's compute
// stream (fill_masked_rows.h), no synchronization, no allocation.
#include "cuda/ops/fill_masked_rows_cuda.h"

#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "domain.h"
#include "contract/fill_masked_rows_common.h"
#include "status.h"
#include "cuda/kernels/fill_masked_rows.h"

namespace onnxfuse {
namespace {

class FillMaskedRowsCudaKernel {
 public:
  FillMaskedRowsCudaKernel(const OrtKernelInfo* info, ONNXTensorElementDataType type)
      : fill_bits_(FillBits(ReadFillAttribute(info), type)), report_(info) {}

  OrtStatusPtr ComputeV2(OrtKernelContext* context) {
    return GuardOpStatus(kFillMaskedRowsOpType, [&] { Compute(context); });
  }

 private:
  void Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    Ort::ConstValue x = ctx.GetInput(0), kept = ctx.GetInput(1);
    const auto x_info = x.GetTensorTypeAndShapeInfo(), kept_info = kept.GetTensorTypeAndShapeInfo();
    const std::vector<int64_t> x_shape = x_info.GetShape();
    const MaskedRowsShape s =
        ValidateMaskedRows(x_shape, x_info.GetElementType(), kept_info.GetShape(), kept_info.GetElementType());
    Ort::UnownedValue y = ctx.GetOutput(0, x_shape);
    if (s.batch * s.rows * s.width == 0) return;
    const cuda::MaskedRows call{y.GetTensorMutableRawData(), x.GetTensorRawData(), kept.GetTensorData<bool>(),
                                s.batch, s.rows, s.flag_rows, s.flags_per_row, s.width, s.element_bytes,
                                fill_bits_};
    report_.Note(ctx, call.y == call.x);
    const cudaError_t err =
        cuda::launch_fill_masked_rows(call, static_cast<cudaStream_t>(ctx.GetGPUComputeStream()));
    if (err != cudaSuccess) {
      throw Ort::Exception(std::string("CUDA launch failed: ") + cudaGetErrorString(err), ORT_RUNTIME_EXCEPTION);
    }
  }

  const uint32_t fill_bits_;  // `fill` in X's type
  InPlaceReport report_;
};

struct FillMaskedRowsCudaOp
    : Ort::CustomOpBase<FillMaskedRowsCudaOp, FillMaskedRowsCudaKernel, /*WithStatus=*/true> {
  explicit FillMaskedRowsCudaOp(ONNXTensorElementDataType type) : type_(type) {
    start_ver_ = kFillMaskedRowsSinceVersion;
    DeclareOutputIsInput(*this);
  }
  OrtStatusPtr CreateKernelV2(const OrtApi& /*api*/, const OrtKernelInfo* info, void** kernel) const {
    *kernel = nullptr;
    return GuardOpStatus(kFillMaskedRowsOpType, [&] { *kernel = new FillMaskedRowsCudaKernel(info, type_); });
  }
  const char* GetName() const { return kFillMaskedRowsOpType; }
  const char* GetExecutionProviderType() const { return "CUDAExecutionProvider"; }
  size_t GetInputTypeCount() const { return 2; }
  ONNXTensorElementDataType GetInputType(size_t index) const {
    return index == 0 ? type_ : ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL;
  }
  OrtMemType GetInputMemoryType(size_t /*index*/) const { return OrtMemTypeDefault; }  // both on the GPU
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t /*index*/) const { return type_; }

 private:
  ONNXTensorElementDataType type_;
};

}  // namespace

void RegisterFillMaskedRowsCudaOps(Ort::CustomOpDomain& domain) {
  static FillMaskedRowsCudaOp op_float32(ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT);
  static FillMaskedRowsCudaOp op_float16(ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16);
  static FillMaskedRowsCudaOp op_bfloat16(ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16);
  domain.Add(&op_float32);
  domain.Add(&op_float16);
  domain.Add(&op_bfloat16);
}

}  // namespace onnxfuse
