#include "cuda/dispatch/device_signature.h"

#include <map>
#include <mutex>

#ifndef ONNXFUSE_LIBRARY_VERSION
#error "ONNXFUSE_LIBRARY_VERSION (the project version) must be defined by the build (cmake/cuda.cmake)"
#endif

namespace onnxfuse::cuda {
namespace {

cudaError_t Compute(int device, std::string* out) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) return e;
  if (device < 0 || device >= count) return cudaErrorInvalidDevice;
  cudaDeviceProp prop{};
  e = cudaGetDeviceProperties(&prop, device);
  if (e != cudaSuccess) return e;
  // The runtime this library runs on is the static cudart it links (cmake/cuda.cmake), so this is the CUDA
  // version it was built with; the driver may be newer.
  int runtime = 0;
  e = cudaRuntimeGetVersion(&runtime);
  if (e != cudaSuccess) return e;
  *out = std::string(prop.name) + "|sm_" + std::to_string(prop.major) + std::to_string(prop.minor) + "|cuda " +
         std::to_string(runtime / 1000) + "." + std::to_string(runtime % 1000 / 10) + "|onnxfuse " +
         ONNXFUSE_LIBRARY_VERSION;
  return cudaSuccess;
}

}  // namespace

cudaError_t DeviceSignature(int device, std::string* out) {
  static std::mutex mutex;
  static std::map<int, std::string> known;  // only successes are kept: a failure may be transient
  std::lock_guard<std::mutex> lock(mutex);
  auto it = known.find(device);
  if (it == known.end()) {
    std::string signature;
    const cudaError_t e = Compute(device, &signature);
    if (e != cudaSuccess) return e;
    it = known.emplace(device, std::move(signature)).first;
  }
  *out = it->second;
  return cudaSuccess;
}

}  // namespace onnxfuse::cuda
