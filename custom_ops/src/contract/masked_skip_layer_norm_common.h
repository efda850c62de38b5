// MaskedSkipLayerNormalization: ORT's SkipLayerNormalization in which the rows that row_kept does not keep
// take `input` as 0.
//
//   input    [B, S, D] float32, float16 or bfloat16
//   skip     [B, S, D], [1, S, D] or [S, D] (one skip for every batch entry), input's type
//   row_kept [B, S|1, K] or [B, 1, S|1, K] bool: FillMaskedRows' flags (fill_masked_rows_common.h)
//   gamma    [D]; beta, bias [D], each optional
//   epsilon  float attribute (default 1e-12, SkipLayerNormalization's)
//   Y        LayerNorm(sum) · gamma + beta over D, where sum = (row kept ? input : 0) + skip + bias, in float32
//   sum      optional second output: the sum in input's type (the residual stream of a pre-norm layer)
//
// Why it exists: the attention rule guards the query rows that see no key with FillMaskedRows (the sdpa
// export makes them 0). Its output goes through the output projection's MatMul (a zero row stays zero) into
// a SkipLayerNormalization; folding the guard into that normalization (onnxfuse/patterns/
// guard_into_skip_norm.py) removes one kernel a layer: the flags are read where the rows are read anyway.
// A row not kept never reads its input, so whatever the attention wrote there (NaN included) has no effect,
// as after the guard.
//
// What both providers' kernels share: the shapes' validation and the attribute.
#pragma once

#include <cstdint>
#include <vector>

#include <onnxruntime_cxx_api.h>

#include "contract/fill_masked_rows_common.h"

namespace onnxfuse {

struct MaskedSkipNormShape {
  MaskedRowsShape rows;  // B, S, the flags' layout, D (width) and the element size
  bool skip_per_batch;   // skip is [B, S, D]; otherwise one [S, D] for every batch entry
};

// A tensor's shape and element type, or absent (an optional input the node does not have).
struct TensorSpec {
  bool present = false;
  std::vector<int64_t> shape;
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
};

// Checks the five tensors (beta and bias may be absent). Throws Ort::Exception (ORT_INVALID_ARGUMENT)
// naming the input otherwise.
MaskedSkipNormShape ValidateMaskedSkipNorm(const TensorSpec& input, const TensorSpec& skip, const TensorSpec& kept,
                                           const TensorSpec& gamma, const TensorSpec& beta, const TensorSpec& bias);

// One call's tensors, validated (ValidateMaskedSkipNorm): the element type, the shape and every pointer, with
// beta, bias and sum null where the node has none. Y and the sum are the outputs ORT allocated for the call.
struct MaskedSkipNormTensors {
  MaskedSkipNormShape shape;
  ONNXTensorElementDataType type;
  const void* input;
  const void* skip;
  const bool* row_kept;
  const void* gamma;
  const void* beta;
  const void* bias;
  void* y;
  void* sum;
};
MaskedSkipNormTensors ReadMaskedSkipNormCall(Ort::KernelContext& context);

// Reads the `epsilon` attribute (SkipLayerNormalization's default when absent); it must be finite and >= 0.
float ReadEpsilonAttribute(const OrtKernelInfo* info);

// The op's declared inputs and outputs, shared by both providers' op classes: input, skip, row_kept, gamma
// required; beta and bias optional; Y required, the sum optional.
inline constexpr size_t kMaskedSkipNormInputs = 6;
inline constexpr size_t kMaskedSkipNormOutputs = 2;
inline OrtCustomOpInputOutputCharacteristic MaskedSkipNormInputCharacteristic(size_t index) {
  return index >= 4 ? OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_OPTIONAL
                    : OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_REQUIRED;
}
inline OrtCustomOpInputOutputCharacteristic MaskedSkipNormOutputCharacteristic(size_t index) {
  return index == 1 ? OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_OPTIONAL
                    : OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_REQUIRED;
}
inline ONNXTensorElementDataType MaskedSkipNormInputType(size_t index, ONNXTensorElementDataType type) {
  return index == 2 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL : type;
}

}  // namespace onnxfuse
