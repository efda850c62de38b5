#include "contract/fused_linear_gelu_common.h"

#include <cmath>
#include <sstream>
#include <utility>

namespace onnxfuse {
namespace {

[[noreturn]] void Invalid(const std::string& message) { throw Ort::Exception(std::string(message), ORT_INVALID_ARGUMENT); }

// The C API tells an absent attribute from a present one only through its status, so these return
// false when the node does not carry the attribute (the schema default then applies).
bool TryGetString(const OrtKernelInfo* info, const char* name, std::string* out) {
  const OrtApi& api = Ort::GetApi();
  size_t size = 0;
  if (OrtStatus* st = api.KernelInfoGetAttribute_string(info, name, nullptr, &size)) {
    api.ReleaseStatus(st);
    return false;
  }
  std::string value(size, '\0');
  Ort::ThrowOnError(api.KernelInfoGetAttribute_string(info, name, value.data(), &size));
  value.resize(size > 0 ? size - 1 : 0);  // size counts the terminating NUL
  *out = std::move(value);
  return true;
}

bool TryGetFloat(const OrtKernelInfo* info, const char* name, float* out) {
  const OrtApi& api = Ort::GetApi();
  if (OrtStatus* st = api.KernelInfoGetAttribute_float(info, name, out)) {
    api.ReleaseStatus(st);
    return false;
  }
  return true;
}

bool TryGetInt(const OrtKernelInfo* info, const char* name, int64_t* out) {
  const OrtApi& api = Ort::GetApi();
  if (OrtStatus* st = api.KernelInfoGetAttribute_int64(info, name, out)) {
    api.ReleaseStatus(st);
    return false;
  }
  return true;
}

// The array forms: an absent attribute reads as false and leaves `out` empty.
bool TryGetInts(const OrtKernelInfo* info, const char* name, std::vector<int64_t>* out) {
  const OrtApi& api = Ort::GetApi();
  size_t size = 0;
  if (OrtStatus* st = api.KernelInfoGetAttributeArray_int64(info, name, nullptr, &size)) {
    api.ReleaseStatus(st);
    return false;
  }
  out->assign(size, 0);
  if (size > 0) Ort::ThrowOnError(api.KernelInfoGetAttributeArray_int64(info, name, out->data(), &size));
  return true;
}

bool TryGetStrings(const OrtKernelInfo* info, const char* name, std::vector<std::string>* out) {
  const OrtApi& api = Ort::GetApi();
  OrtAllocator* allocator = nullptr;
  Ort::ThrowOnError(api.GetAllocatorWithDefaultOptions(&allocator));
  char** strings = nullptr;
  size_t size = 0;
  if (OrtStatus* st = api.KernelInfoGetAttributeArray_string(info, name, allocator, &strings, &size)) {
    api.ReleaseStatus(st);
    return false;
  }
  // The array and each string belong to `allocator`: copy, then give every piece back.
  out->clear();
  for (size_t i = 0; i < size; ++i) {
    out->emplace_back(strings[i]);
    allocator->Free(allocator, strings[i]);
  }
  if (strings != nullptr) allocator->Free(allocator, strings);
  return true;
}

const char* TypeName(ONNXTensorElementDataType t) {
  switch (t) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return "float32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return "float16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return "bfloat16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: return "float64";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: return "int8";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8: return "uint8";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return "int32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return "int64";
    default: return "an unsupported element type";
  }
}

}  // namespace

Activation ParseApproximate(const std::string& name) {
  if (name == "none") return Activation::kGeluErf;
  if (name == "tanh") return Activation::kGeluTanh;
  if (name == "sigmoid") return Activation::kSigmoid;
  Invalid("attribute approximate='" + name + "' is not one of 'none', 'tanh', 'sigmoid'");
}

const char* ActivationName(Activation act) {
  switch (act) {
    case Activation::kGeluErf: return "none";
    case Activation::kGeluTanh: return "tanh";
    case Activation::kSigmoid: return "sigmoid";
  }
  return "?";
}

FusedLinearGeluAttributes ReadAttributes(const OrtKernelInfo* info) {
  FusedLinearGeluAttributes attrs;
  std::string approximate;
  if (TryGetString(info, "approximate", &approximate)) attrs.activation = ParseApproximate(approximate);
  float alpha = attrs.alpha;
  if (TryGetFloat(info, "alpha", &alpha)) {
    if (!std::isfinite(alpha)) Invalid("attribute alpha must be finite");
    attrs.alpha = alpha;
  }
  int64_t trans_b = 1;
  if (TryGetInt(info, "transB", &trans_b)) {
    if (trans_b != 0 && trans_b != 1) Invalid("attribute transB=" + std::to_string(trans_b) + " must be 0 or 1");
  }
  attrs.trans_b = trans_b == 1;
  return attrs;
}

const char* CudaPathName(CudaPath path) {
  switch (path) {
    case CudaPath::kAuto: return "auto";
    case CudaPath::kFused: return "fused";
    case CudaPath::kFallback: return "fallback";
    case CudaPath::kGemv: return "gemv";
  }
  return "?";
}

CudaPathAttributes ReadCudaPathAttributes(const OrtKernelInfo* info) {
  CudaPathAttributes attrs;
  std::string path;
  if (TryGetString(info, "cuda_path", &path)) {
    if (path == "auto") attrs.path = CudaPath::kAuto;
    else if (path == "fused") attrs.path = CudaPath::kFused;
    else if (path == "fallback") attrs.path = CudaPath::kFallback;
    else if (path == "gemv") attrs.path = CudaPath::kGemv;
    else Invalid("attribute cuda_path='" + path + "' is not one of 'auto', 'fused', 'fallback', 'gemv'");
  }
  TryGetString(info, "tuned_device", &attrs.tuned_device);
  std::vector<std::string> paths;
  TryGetInts(info, "tuned_max_rows", &attrs.tuned_max_rows);
  TryGetStrings(info, "tuned_paths", &paths);
  const std::vector<int64_t>& rows = attrs.tuned_max_rows;
  if (rows.size() != paths.size()) {
    Invalid("attributes tuned_max_rows (" + std::to_string(rows.size()) + " entries) and tuned_paths (" +
            std::to_string(paths.size()) + " entries) must have the same length");
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] <= 0) Invalid("attribute tuned_max_rows[" + std::to_string(i) + "]=" + std::to_string(rows[i]) + " must be > 0");
    if (i > 0 && rows[i] <= rows[i - 1]) {
      Invalid("attribute tuned_max_rows must be strictly ascending, but entry " + std::to_string(i) + " (" +
              std::to_string(rows[i]) + ") follows " + std::to_string(rows[i - 1]));
    }
    if (paths[i] == "fused") attrs.tuned_paths.push_back(CudaPath::kFused);
    else if (paths[i] == "fallback") attrs.tuned_paths.push_back(CudaPath::kFallback);
    else if (paths[i] == "gemv") attrs.tuned_paths.push_back(CudaPath::kGemv);
    else Invalid("attribute tuned_paths[" + std::to_string(i) + "]='" + paths[i] + "' is not 'fused', 'fallback' or 'gemv'");
    if (attrs.tuned_paths.back() == CudaPath::kGemv && (rows[i] > kGemvMaxRows || i + 1 == rows.size())) {
      Invalid("attribute tuned_paths[" + std::to_string(i) + "]='gemv' would run " +
              (i + 1 == rows.size() ? std::string("every row count beyond ") + std::to_string(rows[i]) + " (the last entry)"
                                    : "up to " + std::to_string(rows[i]) + " rows") +
              ", but the gemv path runs at most " + std::to_string(kGemvMaxRows));
    }
  }
  if (!attrs.tuned_device.empty() && rows.empty()) {
    Invalid("attribute tuned_device='" + attrs.tuned_device + "' names a device but tuned_max_rows/tuned_paths are "
            "absent: a tuning table needs at least one entry");
  }
  return attrs;
}

std::string ShapeToString(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

LinearShape ValidateShapes(const std::vector<int64_t>& x_shape, const std::vector<int64_t>& w_shape,
                           const std::vector<int64_t>* b_shape, bool trans_b) {
  if (x_shape.size() < 2) Invalid("input X must have rank >= 2 ([..., K]), got shape " + ShapeToString(x_shape));
  if (w_shape.size() != 2) {
    Invalid("input W must have rank 2 (" + std::string(trans_b ? "[N, K]" : "[K, N]") + "), got shape " +
            ShapeToString(w_shape));
  }
  for (int64_t d : x_shape)
    if (d < 0) Invalid("input X has a negative dimension: " + ShapeToString(x_shape));
  for (int64_t d : w_shape)
    if (d < 0) Invalid("input W has a negative dimension: " + ShapeToString(w_shape));

  LinearShape s;
  s.K = x_shape.back();
  const int64_t w_k = trans_b ? w_shape[1] : w_shape[0];
  s.N = trans_b ? w_shape[0] : w_shape[1];
  if (w_k != s.K) {
    Invalid("K mismatch: X " + ShapeToString(x_shape) + " has K=" + std::to_string(s.K) + " but W " +
            ShapeToString(w_shape) + (trans_b ? " (transB=1: [N, K])" : " (transB=0: [K, N])") + " has K=" +
            std::to_string(w_k));
  }
  if (b_shape != nullptr && !(b_shape->size() == 1 && (*b_shape)[0] == s.N)) {
    Invalid("input B must have shape [N] = [" + std::to_string(s.N) + "], got " + ShapeToString(*b_shape));
  }
  s.M = 1;
  for (size_t i = 0; i + 1 < x_shape.size(); ++i) s.M *= x_shape[i];
  s.y_shape.assign(x_shape.begin(), x_shape.end());
  s.y_shape.back() = s.N;
  return s;
}

void ValidateTypes(ONNXTensorElementDataType x_type, ONNXTensorElementDataType w_type,
                   ONNXTensorElementDataType b_type) {
  if (x_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT && x_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 &&
      x_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16) {
    Invalid(std::string("input X is ") + TypeName(x_type) + "; supported: float32, float16, bfloat16");
  }
  if (w_type != x_type) Invalid(std::string("input W is ") + TypeName(w_type) + " but X is " + TypeName(x_type));
  if (b_type != ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED && b_type != x_type) {
    Invalid(std::string("input B is ") + TypeName(b_type) + " but X is " + TypeName(x_type));
  }
}

BoundCall BindCall(Ort::KernelContext& ctx, bool trans_b) {
  BoundCall call{ctx.GetInput(0), ctx.GetInput(1),
                 ctx.GetInputCount() > 2 ? ctx.GetInput(2) : Ort::ConstValue{nullptr}, {}, Ort::UnownedValue{nullptr}};
  const bool has_bias = call.b != nullptr;
  auto x_info = call.x.GetTensorTypeAndShapeInfo();
  auto w_info = call.w.GetTensorTypeAndShapeInfo();
  std::vector<int64_t> b_shape;
  ONNXTensorElementDataType b_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  if (has_bias) {
    auto b_info = call.b.GetTensorTypeAndShapeInfo();
    b_shape = b_info.GetShape();
    b_type = b_info.GetElementType();
  }
  ValidateTypes(x_info.GetElementType(), w_info.GetElementType(), b_type);
  call.shape = ValidateShapes(x_info.GetShape(), w_info.GetShape(), has_bias ? &b_shape : nullptr, trans_b);
  call.y = ctx.GetOutput(0, call.shape.y_shape);
  return call;
}

}  // namespace onnxfuse
