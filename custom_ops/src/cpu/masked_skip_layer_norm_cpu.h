// MaskedSkipLayerNormalization (src/contract/masked_skip_layer_norm_common.h) for ORT's CPU execution provider.
#pragma once

#include <onnxruntime_cxx_api.h>

namespace onnxfuse::cpu {

// Adds the float32, float16 and bfloat16 instances to `domain` (static: they outlive every session).
void AddMaskedSkipNormCpuOps(Ort::CustomOpDomain& domain);

}  // namespace onnxfuse::cpu
