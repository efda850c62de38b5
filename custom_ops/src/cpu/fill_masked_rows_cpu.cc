// FillMaskedRows on the CPU: a pass over the rows, each reading its K flags until one is set. In place (Y's
// buffer is X's) it writes only the rows it fills; otherwise it copies each kept row and fills the others.
#include "cpu/fill_masked_rows_cpu.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "domain.h"
#include "contract/fill_masked_rows_common.h"
#include "status.h"

namespace onnxfuse::cpu {
namespace {

template <typename Unit>
void FillRow(char* row, int64_t width, uint32_t bits) {
  const Unit value = static_cast<Unit>(bits);
  Unit* out = reinterpret_cast<Unit*>(row);
  for (int64_t i = 0; i < width; ++i) out[i] = value;
}

class FillMaskedRowsCpuKernel {
 public:
  FillMaskedRowsCpuKernel(const OrtKernelInfo* info, ONNXTensorElementDataType type)
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
    const char* src = static_cast<const char*>(x.GetTensorRawData());
    char* dst = static_cast<char*>(y.GetTensorMutableRawData());
    const bool* flags = kept.GetTensorData<bool>();
    const bool in_place = src == dst;
    report_.Note(ctx, in_place);
    const int64_t row_bytes = s.width * s.element_bytes;
    for (int64_t b = 0; b < s.batch; ++b) {
      for (int64_t r = 0; r < s.rows; ++r) {
        const int64_t row = b * s.rows + r;
        const bool* row_flags = flags + (b * s.flag_rows + (s.flag_rows == 1 ? 0 : r)) * s.flags_per_row;
        if (std::find(row_flags, row_flags + s.flags_per_row, true) != row_flags + s.flags_per_row) {
          if (!in_place) std::memcpy(dst + row * row_bytes, src + row * row_bytes, row_bytes);
        } else if (s.element_bytes == 4) {
          FillRow<uint32_t>(dst + row * row_bytes, s.width, fill_bits_);
        } else {
          FillRow<uint16_t>(dst + row * row_bytes, s.width, fill_bits_);
        }
      }
    }
  }

  const uint32_t fill_bits_;  // `fill` in X's type
  InPlaceReport report_;
};

struct FillMaskedRowsCpuOp
    : Ort::CustomOpBase<FillMaskedRowsCpuOp, FillMaskedRowsCpuKernel, /*WithStatus=*/true> {
  explicit FillMaskedRowsCpuOp(ONNXTensorElementDataType type) : type_(type) {
    start_ver_ = kFillMaskedRowsSinceVersion;
    DeclareOutputIsInput(*this);
  }
  OrtStatusPtr CreateKernelV2(const OrtApi& /*api*/, const OrtKernelInfo* info, void** kernel) const {
    *kernel = nullptr;
    return GuardOpStatus(kFillMaskedRowsOpType, [&] { *kernel = new FillMaskedRowsCpuKernel(info, type_); });
  }
  const char* GetName() const { return kFillMaskedRowsOpType; }
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
  size_t GetInputTypeCount() const { return 2; }
  ONNXTensorElementDataType GetInputType(size_t index) const {
    return index == 0 ? type_ : ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL;
  }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t /*index*/) const { return type_; }

 private:
  ONNXTensorElementDataType type_;
};

}  // namespace

void AddFillMaskedRowsCpuOps(Ort::CustomOpDomain& domain) {
  static FillMaskedRowsCpuOp op_float32(ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT);
  static FillMaskedRowsCpuOp op_float16(ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16);
  static FillMaskedRowsCpuOp op_bfloat16(ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16);
  domain.Add(&op_float32);
  domain.Add(&op_float16);
  domain.Add(&op_bfloat16);
}

}  // namespace onnxfuse::cpu
