// FillMaskedRows (src/contract/fill_masked_rows_common.h) for ONNX Runtime's CUDA execution provider.
#pragma once

#include <onnxruntime_cxx_api.h>

namespace onnxfuse {

// Adds the float32, float16 and bfloat16 CUDA instances to `domain` (static: they outlive every session).
void RegisterFillMaskedRowsCudaOps(Ort::CustomOpDomain& domain);

}  // namespace onnxfuse
