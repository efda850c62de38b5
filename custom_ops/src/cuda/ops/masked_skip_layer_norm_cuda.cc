// MaskedSkipLayerNormalization on ORT's CUDA provider: every tensor stays in GPU memory; one kernel on ORT's
// compute stream (masked_skip_layer_norm.h), no synchronization, no allocation.
#include "cuda/ops/masked_skip_layer_norm_cuda.h"

#include <string>

#include <cuda_runtime.h>

#include "domain.h"
#include "contract/masked_skip_layer_norm_common.h"
#include "status.h"
#include "cuda/kernels/masked_skip_layer_norm.h"

namespace onnxfuse {
namespace {

cuda::DType ToDType(ONNXTensorElementDataType t) {
  switch (t) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return cuda::DType::kFloat16;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return cuda::DType::kBFloat16;
    default: return cuda::DType::kFloat32;
  }
}

class MaskedSkipNormCudaKernel {
 public:
  explicit MaskedSkipNormCudaKernel(const OrtKernelInfo* info) : epsilon_(ReadEpsilonAttribute(info)) {}

  OrtStatusPtr ComputeV2(OrtKernelContext* context) {
    return GuardOpStatus(kMaskedSkipNormOpType, [&] { Compute(context); });
  }

 private:
  void Compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    const MaskedSkipNormTensors t = ReadMaskedSkipNormCall(ctx);
    const MaskedSkipNormShape& s = t.shape;
    if (s.rows.batch * s.rows.rows * s.rows.width == 0) return;
    const cuda::MaskedSkipNorm call{t.y,
                                    t.sum,
                                    t.input,
                                    t.skip,
                                    t.row_kept,
                                    t.gamma,
                                    t.beta,
                                    t.bias,
                                    s.rows.batch,
                                    s.rows.rows,
                                    s.rows.flag_rows,
                                    s.rows.flags_per_row,
                                    s.rows.width,
                                    s.skip_per_batch,
                                    epsilon_,
                                    ToDType(t.type)};
    const cudaError_t err =
        cuda::launch_masked_skip_layer_norm(call, static_cast<cudaStream_t>(ctx.GetGPUComputeStream()));
    if (err != cudaSuccess) {
      throw Ort::Exception(std::string("CUDA launch failed: ") + cudaGetErrorString(err), ORT_RUNTIME_EXCEPTION);
    }
  }

  const float epsilon_;
};

struct MaskedSkipNormCudaOp
    : Ort::CustomOpBase<MaskedSkipNormCudaOp, MaskedSkipNormCudaKernel, /*WithStatus=*/true> {
  explicit MaskedSkipNormCudaOp(ONNXTensorElementDataType type) : type_(type) {
    start_ver_ = kMaskedSkipNormSinceVersion;
  }
  OrtStatusPtr CreateKernelV2(const OrtApi& /*api*/, const OrtKernelInfo* info, void** kernel) const {
    *kernel = nullptr;
    return GuardOpStatus(kMaskedSkipNormOpType, [&] { *kernel = new MaskedSkipNormCudaKernel(info); });
  }
  const char* GetName() const { return kMaskedSkipNormOpType; }
  const char* GetExecutionProviderType() const { return "CUDAExecutionProvider"; }
  size_t GetInputTypeCount() const { return kMaskedSkipNormInputs; }
  ONNXTensorElementDataType GetInputType(size_t index) const { return MaskedSkipNormInputType(index, type_); }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t index) const {
    return MaskedSkipNormInputCharacteristic(index);
  }
  OrtMemType GetInputMemoryType(size_t /*index*/) const { return OrtMemTypeDefault; }  // all on the GPU
  size_t GetOutputTypeCount() const { return kMaskedSkipNormOutputs; }
  ONNXTensorElementDataType GetOutputType(size_t /*index*/) const { return type_; }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t index) const {
    return MaskedSkipNormOutputCharacteristic(index);
  }

 private:
  ONNXTensorElementDataType type_;
};

}  // namespace

void RegisterMaskedSkipNormCudaOps(Ort::CustomOpDomain& domain) {
  static MaskedSkipNormCudaOp op_float32(ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT);
  static MaskedSkipNormCudaOp op_float16(ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16);
  static MaskedSkipNormCudaOp op_bfloat16(ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16);
  domain.Add(&op_float32);
  domain.Add(&op_float16);
  domain.Add(&op_bfloat16);
}

}  // namespace onnxfuse
