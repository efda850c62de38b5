// The ORT side of the CUDA FusedLinearGelu kernel: reads the node once, validates each call's tensors,
// and hands plain pointers and sizes to launch_gemm_gelu (gemm_gelu.h) on ORT's compute stream.
//
// Thread safety: ORT may call Compute on one kernel instance from several threads at once (concurrent
// Session::Run). Everything the kernel keeps is written in its constructor and only read afterwards.
#include "fused_linear_gelu_cuda.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "../domain.h"
#include "../fused_linear_gelu_common.h"
#include "gemm_gelu.h"

namespace onnxfuse {
namespace {

constexpr const char* kCudaProvider = "CUDAExecutionProvider";

[[noreturn]] void Fail(OrtErrorCode code, const std::string& message) { throw Ort::Exception(std::string(message), code); }

const char* TypeName(ONNXTensorElementDataType t) {
  switch (t) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return "float32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return "float16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return "bfloat16";
    default: return "unsupported";
  }
}

cuda::DType ToDType(ONNXTensorElementDataType t) {
  switch (t) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return cuda::DType::kFloat16;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return cuda::DType::kBFloat16;
    default: return cuda::DType::kFloat32;
  }
}

std::string CudaErrorText(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")";
}

// "1" → true, "0" or absent → false; anything else is a configuration mistake worth reporting.
bool ReadStrictFp32(const OrtKernelInfo* info) {
  Ort::KeyValuePairs config = Ort::ConstKernelInfo{info}.GetConfigEntries();
  const char* value = config.GetValue(kStrictFp32ConfigKey);
  if (value == nullptr || std::strcmp(value, "0") == 0) return false;
  if (std::strcmp(value, "1") == 0) return true;
  Fail(ORT_INVALID_ARGUMENT, std::string("session config ") + kStrictFp32ConfigKey + "='" + value +
                                 "' must be '0' (TF32 Tensor Cores, the default) or '1' (strict fp32)");
}

class FusedLinearGeluCudaKernel {
 public:
  FusedLinearGeluCudaKernel(const OrtKernelInfo* info, ONNXTensorElementDataType type)
      : type_(type), attrs_(ReadAttributes(info)), strict_fp32_(ReadStrictFp32(info)) {
    // The device this node runs on is the one of the allocator ORT gives the kernel for its default
    // (GPU) memory; its memory info is also what Compute asks the context's allocator for.
    const OrtApi& api = Ort::GetApi();
    OrtAllocator* raw = nullptr;
    Ort::ThrowOnError(api.KernelInfoGetAllocator(info, OrtMemTypeDefault, &raw));
    Ort::Allocator allocator{raw};
    Ort::ConstMemoryInfo mem = allocator.GetInfo();
    gpu_memory_ = Ort::MemoryInfo(mem.GetAllocatorName().c_str(), mem.GetAllocatorType(), mem.GetDeviceId(),
                                  mem.GetMemoryType());

    // Device facts once per instance: cudaDeviceGetAttribute is cheap, but not free per call.
    dev_.device = mem.GetDeviceId();
    cudaError_t e = cudaDeviceGetAttribute(&dev_.cc_major, cudaDevAttrComputeCapabilityMajor, dev_.device);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&dev_.cc_minor, cudaDevAttrComputeCapabilityMinor, dev_.device);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&dev_.sm_count, cudaDevAttrMultiProcessorCount, dev_.device);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&dev_.l2_bytes, cudaDevAttrL2CacheSize, dev_.device);
    if (e != cudaSuccess) {
      Fail(ORT_FAIL, "cannot query CUDA device " + std::to_string(dev_.device) + ": " + CudaErrorText(e));
    }
    if (dev_.cc_major < 8) {
      Fail(ORT_NOT_IMPLEMENTED, "CUDA device " + std::to_string(dev_.device) + " has compute capability " +
                                    std::to_string(dev_.cc_major) + "." + std::to_string(dev_.cc_minor) +
                                    "; the library's CUDA kernels need 8.0 or newer (Ampere, Hopper and later)");
    }
  }

  OrtStatusPtr ComputeV2(OrtKernelContext* context) const {
    return GuardStatus([&] { Compute(context); });
  }

 private:
  void Compute(OrtKernelContext* context) const {
    Ort::KernelContext ctx(context);
    BoundCall call = BindCall(ctx, attrs_.trans_b);
    const Ort::ConstValue &x = call.x, &w = call.w, &b = call.b;
    const bool has_bias = b != nullptr;
    const LinearShape& s = call.shape;
    Ort::UnownedValue& y = call.y;
    if (s.M == 0 || s.N == 0) return;  // an empty output: nothing to compute, nothing to launch

    cuda::GemmGeluArgs args{};
    args.dtype = ToDType(type_);
    args.act = attrs_.activation;
    args.alpha = attrs_.alpha;
    args.trans_b = attrs_.trans_b;
    // TF32 where ORT's own MatMul gets it: cuBLAS takes its TF32 Tensor-Core kernels only for 16-byte aligned
    // rows (K and N multiples of 4 floats) and otherwise computes in full fp32. Matching that keeps the fused
    // node at least as accurate as the graph it replaced on every shape (measured on H200: K=100, N=70 gave
    // rel-L2 2e-7 in ORT against 3e-4 with TF32); such shapes run the slower any-alignment kernels anyway.
    args.allow_tf32 = !strict_fp32_ && s.K % 4 == 0 && s.N % 4 == 0;
    args.M = s.M;
    args.N = s.N;
    args.K = s.K;
    args.x = x.GetTensorRawData();
    args.w = w.GetTensorRawData();
    args.bias = has_bias ? b.GetTensorRawData() : nullptr;
    args.y = y.GetTensorMutableRawData();

    cudaStream_t stream = static_cast<cudaStream_t>(ctx.GetGPUComputeStream());
    if (stream == nullptr) {
      Fail(ORT_FAIL, "ORT gave no CUDA compute stream: the node is not running under CUDAExecutionProvider");
    }

    // Scratch, if the chosen tactic needs any, comes from ORT's GPU allocator and goes back to it when
    // this call returns: later work on the same stream is ordered after the kernel, as for ORT's own kernels.
    const cuda::GemmGeluPlan plan = cuda::plan_gemm_gelu(args, dev_);
    const size_t workspace_bytes = plan.workspace_bytes;
    Ort::Allocator allocator{nullptr};
    void* workspace = nullptr;
    struct Release {
      Ort::Allocator* a;
      void* p;
      ~Release() {
        if (p) a->Free(p);
      }
    } release{&allocator, nullptr};
    if (workspace_bytes > 0) {
      allocator = ctx.GetAllocator(*gpu_memory_);
      workspace = allocator.Alloc(workspace_bytes);
      release.p = workspace;
    }

    const cudaError_t e = cuda::launch_gemm_gelu(plan, args, dev_, workspace, workspace_bytes, stream);
    if (e != cudaSuccess) {
      const std::string what = std::string(TypeName(type_)) + " M=" + std::to_string(s.M) +
                               " K=" + std::to_string(s.K) + " N=" + std::to_string(s.N) +
                               " transB=" + (attrs_.trans_b ? "1" : "0") +
                               " approximate=" + ActivationName(attrs_.activation) + " on sm_" +
                               std::to_string(dev_.cc_major) + std::to_string(dev_.cc_minor);
      if (e == cudaErrorNotSupported) {
        Fail(ORT_NOT_IMPLEMENTED, "no CUDA kernel in this library can run " + what);
      }
      Fail(ORT_FAIL, std::string("CUDA kernel launch failed (tactic ") + cuda::gemm_gelu_tactic_name(args, dev_) +
                         ") for " + what + ": " + CudaErrorText(e));
    }
  }

  const ONNXTensorElementDataType type_;
  const FusedLinearGeluAttributes attrs_;
  const bool strict_fp32_;
  Ort::MemoryInfo gpu_memory_{nullptr};
  cuda::DeviceInfo dev_{};
};

struct FusedLinearGeluCudaOp
    : Ort::CustomOpBase<FusedLinearGeluCudaOp, FusedLinearGeluCudaKernel, /*WithStatus=*/true> {
  explicit FusedLinearGeluCudaOp(ONNXTensorElementDataType type) : type_(type) {}

  OrtStatusPtr CreateKernelV2(const OrtApi& /*api*/, const OrtKernelInfo* info, void** kernel) const {
    *kernel = nullptr;
    return GuardStatus([&] { *kernel = new FusedLinearGeluCudaKernel(info, type_); });
  }

  const char* GetName() const { return kOpType; }
  const char* GetExecutionProviderType() const { return kCudaProvider; }

  size_t GetInputTypeCount() const { return 3; }
  ONNXTensorElementDataType GetInputType(size_t /*index*/) const { return type_; }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t index) const {
    return index == 2 ? OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_OPTIONAL
                      : OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_REQUIRED;
  }
  // X, W and B all stay in the provider's (GPU) memory: ORT never copies the weights to the host.
  OrtMemType GetInputMemoryType(size_t /*index*/) const { return OrtMemTypeDefault; }

  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t /*index*/) const { return type_; }

 private:
  ONNXTensorElementDataType type_;
};

}  // namespace

void RegisterCudaOps(Ort::CustomOpDomain& domain) {
  // ORT keeps raw pointers to these for as long as any session uses the domain: static storage.
  static FusedLinearGeluCudaOp op_float32(ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT);
  static FusedLinearGeluCudaOp op_float16(ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16);
  static FusedLinearGeluCudaOp op_bfloat16(ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16);
  domain.Add(&op_float32);
  domain.Add(&op_float16);
  domain.Add(&op_bfloat16);
}

}  // namespace onnxfuse
