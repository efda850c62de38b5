#include "contract/fill_masked_rows_common.h"

#include <cmath>
#include <cstring>
#include <string>

#include "domain.h"
#include "contract/fused_linear_gelu_common.h"  // ShapeToString

namespace onnxfuse {
namespace {

[[noreturn]] void Invalid(const std::string& message) { throw Ort::Exception(std::string(message), ORT_INVALID_ARGUMENT); }

int64_t ElementBytes(ONNXTensorElementDataType type) {
  switch (type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT:
      return 4;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16:
      return 2;
    default:
      return 0;
  }
}

}  // namespace

MaskedRowsShape ValidateMaskedRows(const std::vector<int64_t>& x_shape, ONNXTensorElementDataType x_type,
                                   const std::vector<int64_t>& kept_shape, ONNXTensorElementDataType kept_type) {
  MaskedRowsShape s;
  s.element_bytes = ElementBytes(x_type);
  if (s.element_bytes == 0) Invalid("X must be float32, float16 or bfloat16");
  if (kept_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL) Invalid("row_kept must be bool");
  if (x_shape.size() != 3) Invalid("X must be [B, S, D], got " + ShapeToString(x_shape));
  for (int64_t d : x_shape) {
    if (d < 0) Invalid("X has a negative dimension: " + ShapeToString(x_shape));
  }
  s.batch = x_shape[0], s.rows = x_shape[1], s.width = x_shape[2];
  // [B, S|1, K], or [B, 1, S|1, K]: the attention mask's layout, its heads axis 1
  const size_t rank = kept_shape.size();
  const bool laid_out = (rank == 3 || (rank == 4 && kept_shape[1] == 1)) && kept_shape[0] == s.batch &&
                        kept_shape[rank - 1] >= 1 && (kept_shape[rank - 2] == s.rows || kept_shape[rank - 2] == 1);
  if (!laid_out) {
    Invalid("row_kept must be [B, S, K], [B, 1, K], [B, 1, S, K] or [B, 1, 1, K] (K >= 1) for X " +
            ShapeToString(x_shape) + ", got " + ShapeToString(kept_shape));
  }
  s.flag_rows = kept_shape[rank - 2];
  s.flags_per_row = kept_shape[rank - 1];
  return s;
}

float ReadFillAttribute(const OrtKernelInfo* info) {
  const OrtApi& api = Ort::GetApi();
  float fill = 0.0f;
  if (OrtStatus* st = api.KernelInfoGetAttribute_float(info, "fill", &fill)) {
    api.ReleaseStatus(st);  // absent: the schema's default
    return 0.0f;
  }
  return fill;
}

InPlaceReport::InPlaceReport(const OrtKernelInfo* info) : node_(Ort::ConstKernelInfo(info).GetNodeName()) {}

void InPlaceReport::Note(const Ort::KernelContext& context, bool in_place) {
  const Ort::Logger logger = context.GetLogger();
  // A run at a quieter level says nothing and leaves the saying to the first verbose one.
  if (logger.GetLoggingSeverityLevel() > ORT_LOGGING_LEVEL_VERBOSE || said_.exchange(true)) return;
  const std::string message =
      std::string(kFillMaskedRowsOpType) + " node '" + node_ + "': " +
      (in_place ? "runs in place (Y shares X's buffer)" : "copies the kept rows (ORT gave Y a buffer of its own)");
  ORT_CXX_LOG_NOEXCEPT(logger, ORT_LOGGING_LEVEL_VERBOSE, message.c_str());
}

uint32_t FillBits(float fill, ONNXTensorElementDataType type) {
  switch (type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: {
      uint32_t bits;
      std::memcpy(&bits, &fill, sizeof bits);
      return bits;
    }
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16:
      return Ort::Float16_t(fill).val;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16:
      return Ort::BFloat16_t(fill).val;
    default:
      Invalid("X must be float32, float16 or bfloat16");
  }
}

}  // namespace onnxfuse
