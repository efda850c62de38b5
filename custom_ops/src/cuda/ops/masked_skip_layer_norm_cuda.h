// MaskedSkipLayerNormalization (src/contract/masked_skip_layer_norm_common.h) for ORT's CUDA execution provider.
#pragma once

#include <onnxruntime_cxx_api.h>

namespace onnxfuse {

// Adds the float32, float16 and bfloat16 CUDA instances to `domain` (static: they outlive every session).
void RegisterMaskedSkipNormCudaOps(Ort::CustomOpDomain& domain);

}  // namespace onnxfuse
