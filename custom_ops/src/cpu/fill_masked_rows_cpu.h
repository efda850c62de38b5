// FillMaskedRows (src/contract/fill_masked_rows_common.h) for ORT's CPU execution provider.
#pragma once

#include <onnxruntime_cxx_api.h>

namespace onnxfuse::cpu {

// Adds the float32, float16 and bfloat16 instances to `domain` (static: they outlive every session).
void AddFillMaskedRowsCpuOps(Ort::CustomOpDomain& domain);

}  // namespace onnxfuse::cpu
