// The device signature a tuning table is measured under and checked against (the `tuned_device` attribute):
// "<GPU name>|sm_<major><minor>|cuda <cudart major.minor>|onnxfuse <library version>", for example
// "NVIDIA H200|sm_90|cuda 13.0|onnxfuse 0.2.0". A table measured on another GPU, CUDA runtime or library
// build does not apply: the kernels it timed may differ.
#pragma once

#include <string>

#include <cuda_runtime.h>

namespace onnxfuse::cuda {

// The signature of CUDA device `device`, computed once per device per process (cudaGetDeviceProperties is
// slow, and every kernel instance asks). Thread-safe. Returns the CUDA error that prevented it (no driver,
// no such device) and leaves `out` untouched then.
cudaError_t DeviceSignature(int device, std::string* out);

}  // namespace onnxfuse::cuda
