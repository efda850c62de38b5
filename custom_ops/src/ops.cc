// The library's entry point: ORT calls RegisterCustomOps when a session registers the library
// (SessionOptions.register_custom_ops_library). It adds the `ai.onnxfuse` domain with FusedLinearGelu,
// FillMaskedRows and MaskedSkipLayerNormalization for the CPU provider and, in a CUDA build, for the CUDA provider.
#include <cstddef>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include <onnxruntime_cxx_api.h>  // ORT_API_MANUAL_INIT (CMakeLists.txt): the API comes from RegisterCustomOps

#include "cpu/fill_masked_rows_cpu.h"
#include "cpu/fused_linear_gelu_cpu.h"
#include "cpu/masked_skip_layer_norm_cpu.h"
#include "cpu/gemm/packed_gemm.h"
#include "domain.h"

#ifdef ONNXFUSE_WITH_CUDA
#include "cuda/dispatch/device_signature.h"
#include "cuda/ops/fill_masked_rows_cuda.h"
#include "cuda/ops/fused_linear_gelu_cuda.h"
#include "cuda/ops/masked_skip_layer_norm_cuda.h"
#endif

namespace {

// Every session that registers the library gets its own domain object; ORT keeps pointers into it, so
// the domains live until the process ends.
void KeepAlive(Ort::CustomOpDomain&& domain) {
  static std::mutex mutex;
  static std::vector<Ort::CustomOpDomain> domains;
  std::lock_guard<std::mutex> lock(mutex);
  domains.push_back(std::move(domain));
}

}  // namespace

// Which GEMM the CPU kernel runs in this process: "avx512", "avx2" (the packed GEMM with its fused epilogue)
// or "blas" (OpenBLAS, then the activation per tile). For `onnxfuse doctor`; needs no ORT.
extern "C" __attribute__((visibility("default"))) const char* OnnxfuseCpuGemm() {
  return onnxfuse::cpu::GemmIsaName(onnxfuse::cpu::PackedGemmIsa());
}

// The signature of CUDA device `device` that a tuning table must name in its tuned_device attribute to apply
// (src/cuda/dispatch/device_signature.h), written NUL-terminated into buf[len]: what `onnxfuse tune` records,
// computed by the same code the kernel checks with. Returns 0 on success; 1 when there is no such CUDA device or the
// library is built without CUDA; 2 when `len` is too small. buf holds "" on failure (when len > 0). Needs no ORT.
extern "C" __attribute__((visibility("default"))) int OnnxfuseCudaDeviceSignature(int device, char* buf, size_t len) {
  if (buf != nullptr && len > 0) buf[0] = '\0';
#ifdef ONNXFUSE_WITH_CUDA
  std::string signature;
  if (onnxfuse::cuda::DeviceSignature(device, &signature) != cudaSuccess) return 1;
  if (buf == nullptr || signature.size() + 1 > len) return 2;
  std::memcpy(buf, signature.c_str(), signature.size() + 1);
  return 0;
#else
  (void)device;
  return 1;
#endif
}

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  const OrtApi* api = api_base->GetApi(ORT_API_VERSION);
  if (api == nullptr) {
    // An older runtime: report through the oldest API table, which every runtime provides.
    const OrtApi* v1 = api_base->GetApi(1);
    const std::string message = std::string("onnxfuse_ops was built against ONNX Runtime API ") +
                                std::to_string(ORT_API_VERSION) + " but this onnxruntime is " +
                                api_base->GetVersionString() + "; upgrade onnxruntime";
    return v1 != nullptr ? v1->CreateStatus(ORT_FAIL, message.c_str()) : nullptr;
  }
  Ort::InitApi(api);
  try {
    Ort::CustomOpDomain domain{onnxfuse::kDomain};
    onnxfuse::cpu::AddCpuOps(domain);
    onnxfuse::cpu::AddFillMaskedRowsCpuOps(domain);
    onnxfuse::cpu::AddMaskedSkipNormCpuOps(domain);
#ifdef ONNXFUSE_WITH_CUDA
    // The CUDA provider's op instances (src/cuda/ops/fused_linear_gelu_cuda.h, fill_masked_rows_cuda.h,
    // masked_skip_layer_norm_cuda.h).
    onnxfuse::RegisterCudaOps(domain);
    onnxfuse::RegisterFillMaskedRowsCudaOps(domain);
    onnxfuse::RegisterMaskedSkipNormCudaOps(domain);
#endif
    Ort::UnownedSessionOptions(options).Add(domain);
    KeepAlive(std::move(domain));
    return nullptr;
  } catch (const Ort::Exception& e) {
    return api->CreateStatus(e.GetOrtErrorCode(), e.what());
  } catch (const std::exception& e) {
    return api->CreateStatus(ORT_FAIL, e.what());
  }
}
