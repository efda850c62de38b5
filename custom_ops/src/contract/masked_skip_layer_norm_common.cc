#include "contract/masked_skip_layer_norm_common.h"

#include <cmath>
#include <string>

#include "contract/fused_linear_gelu_common.h"  // ShapeToString

namespace onnxfuse {
namespace {

[[noreturn]] void Invalid(const std::string& message) { throw Ort::Exception(std::string(message), ORT_INVALID_ARGUMENT); }

// SkipLayerNormalization's default epsilon (ORT's kDefaultSkipLayerNormEpsilon).
constexpr float kDefaultEpsilon = 1e-12f;

void CheckVector(const TensorSpec& t, const char* name, ONNXTensorElementDataType type, int64_t width) {
  if (t.type != type) Invalid(std::string(name) + " must have input's element type");
  if (t.shape.size() != 1 || t.shape[0] != width) {
    Invalid(std::string(name) + " must be [" + std::to_string(width) + "] (input's last dimension), got " +
            ShapeToString(t.shape));
  }
}

}  // namespace

MaskedSkipNormShape ValidateMaskedSkipNorm(const TensorSpec& input, const TensorSpec& skip, const TensorSpec& kept,
                                           const TensorSpec& gamma, const TensorSpec& beta, const TensorSpec& bias) {
  MaskedSkipNormShape s;
  try {
    s.rows = ValidateMaskedRows(input.shape, input.type, kept.shape, kept.type);
  } catch (const Ort::Exception& e) {
    // FillMaskedRows' validation names its X; this op calls that tensor `input`.
    std::string message = e.what();
    if (message.rfind("X ", 0) == 0) message = "input " + message.substr(2);
    Invalid(message);
  }
  if (skip.type != input.type) Invalid("skip must have input's element type");
  const int64_t b = s.rows.batch, rows = s.rows.rows, d = s.rows.width;
  const std::vector<int64_t> per_batch{b, rows, d}, shared_3d{1, rows, d}, shared_2d{rows, d};
  if (skip.shape == per_batch) {
    s.skip_per_batch = true;
  } else if (skip.shape == shared_3d || skip.shape == shared_2d) {
    s.skip_per_batch = false;
  } else {
    Invalid("skip must be [B, S, D], [1, S, D] or [S, D] for input " + ShapeToString(input.shape) + ", got " +
            ShapeToString(skip.shape));
  }
  CheckVector(gamma, "gamma", input.type, d);
  if (beta.present) CheckVector(beta, "beta", input.type, d);
  if (bias.present) CheckVector(bias, "bias", input.type, d);
  return s;
}

namespace {

// The spec of input `index` of the call (absent where the node has no such input).
TensorSpec InputSpec(const Ort::KernelContext& context, size_t index) {
  TensorSpec spec;
  if (index >= context.GetInputCount()) return spec;
  Ort::ConstValue value = context.GetInput(index);
  if (static_cast<const OrtValue*>(value) == nullptr) return spec;
  const auto info = value.GetTensorTypeAndShapeInfo();
  spec.present = true;
  spec.shape = info.GetShape();
  spec.type = info.GetElementType();
  return spec;
}

const void* Data(const Ort::KernelContext& context, const TensorSpec& spec, size_t index) {
  return spec.present ? context.GetInput(index).GetTensorRawData() : nullptr;
}

}  // namespace

MaskedSkipNormTensors ReadMaskedSkipNormCall(Ort::KernelContext& context) {
  const TensorSpec input = InputSpec(context, 0), skip = InputSpec(context, 1), kept = InputSpec(context, 2),
                   gamma = InputSpec(context, 3), beta = InputSpec(context, 4), bias = InputSpec(context, 5);
  MaskedSkipNormTensors t;
  t.shape = ValidateMaskedSkipNorm(input, skip, kept, gamma, beta, bias);
  t.type = input.type;
  t.input = Data(context, input, 0);
  t.skip = Data(context, skip, 1);
  t.row_kept = static_cast<const bool*>(Data(context, kept, 2));
  t.gamma = Data(context, gamma, 3);
  t.beta = Data(context, beta, 4);
  t.bias = Data(context, bias, 5);
  t.y = context.GetOutput(0, input.shape).GetTensorMutableRawData();
  t.sum = nullptr;
  if (context.GetOutputCount() > 1) {
    Ort::UnownedValue sum = context.GetOutput(1, input.shape);
    if (static_cast<OrtValue*>(sum) != nullptr) t.sum = sum.GetTensorMutableRawData();
  }
  return t;
}

float ReadEpsilonAttribute(const OrtKernelInfo* info) {
  const OrtApi& api = Ort::GetApi();
  float epsilon = kDefaultEpsilon;
  if (OrtStatus* st = api.KernelInfoGetAttribute_float(info, "epsilon", &epsilon)) {
    api.ReleaseStatus(st);  // absent: the schema's default
    return kDefaultEpsilon;
  }
  if (!std::isfinite(epsilon) || epsilon < 0.0f) {
    Invalid("epsilon must be finite and >= 0, got " + std::to_string(epsilon));
  }
  return epsilon;
}

}  // namespace onnxfuse
