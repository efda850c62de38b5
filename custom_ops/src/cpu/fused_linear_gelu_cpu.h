// FusedLinearGelu for ORT's CPU execution provider: one op instance per element type (float, float16,
// bfloat16); ORT picks the instance whose types match the node.
#pragma once

#include <onnxruntime_cxx_api.h>

namespace onnxfuse::cpu {

// Adds the float32, float16 and bfloat16 CPU op instances to `domain`. The instances are static: they
// outlive every session that uses them.
void AddCpuOps(Ort::CustomOpDomain& domain);

}  // namespace onnxfuse::cpu
