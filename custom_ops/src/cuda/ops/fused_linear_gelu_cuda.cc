// The ORT side of the CUDA FusedLinearGelu kernel (fused_linear_gelu_cuda_kernel.h): reads the node once,
// validates each call's tensors, chooses the call's path and hands plain pointers and sizes to it on ORT's
// compute stream (fused_linear_gelu_cuda_paths.cc runs them):
//   "fused":    launch_gemm_gelu (gemm_gelu.h), one GEMM+bias+activation kernel; 16-bit rows that are not
//               16-byte vectors reach it through aligned copies (copy_rows.h, RunFusedStaged);
//   "fallback": cuBLASLt's GEMM with its bias epilogue (cublaslt_gemm_bias.h), then the activation in place
//               (activation_inplace.h): ORT's own two kernels, for the shapes where the fused path has only
//               its any-alignment kernel and would run slower than the graph it replaced; float32 on a large,
//               narrow, deep W whose rows are not 16-byte vectors through padded copies (RunFallbackStaged);
//   "gemv":     launch_gemv_gelu (gemv_gelu.h), one kernel for calls with at most 16 rows, bound by reading W.
// The node's cuda_path / tuned_* attributes (fused_linear_gelu_common.h) steer the choice
// (cuda/dispatch/path_choice.h).
#include "cuda/ops/fused_linear_gelu_cuda.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include <cuda_runtime.h>

#include "contract/fused_linear_gelu_common.h"
#include "cuda/dispatch/cublaslt_gemm_bias.h"
#include "cuda/dispatch/device_signature.h"
#include "cuda/dispatch/gemm_gelu.h"
#include "cuda/dispatch/path_choice.h"
#include "cuda/dispatch/row_vectors.h"
#include "cuda/ops/errors.h"
#include "cuda/ops/fused_linear_gelu_cuda_kernel.h"
#include "domain.h"

namespace onnxfuse {
namespace {

constexpr const char* kCudaProvider = "CUDAExecutionProvider";

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

// "1" → true, "0" or absent → false; anything else is a configuration mistake worth reporting.
bool ReadStrictFp32(const OrtKernelInfo* info) {
  Ort::KeyValuePairs config = Ort::ConstKernelInfo{info}.GetConfigEntries();
  const char* value = config.GetValue(kStrictFp32ConfigKey);
  if (value == nullptr || std::strcmp(value, "0") == 0) return false;
  if (std::strcmp(value, "1") == 0) return true;
  Fail(ORT_INVALID_ARGUMENT, std::string("session config ") + kStrictFp32ConfigKey + "='" + value +
                                 "' must be '0' (TF32 Tensor Cores, the default) or '1' (strict fp32)");
}

}  // namespace

FusedLinearGeluCudaKernel::FusedLinearGeluCudaKernel(const OrtKernelInfo* info, ONNXTensorElementDataType type)
    : type_(type),
      attrs_(ReadAttributes(info)),
      path_attrs_(ReadCudaPathAttributes(info)),
      strict_fp32_(ReadStrictFp32(info)) {
  // The device this node runs on is the one of the allocator ORT gives the kernel for its default
  // (GPU) memory; its memory info is also what Compute asks the context's allocator for.
  const OrtApi& api = Ort::GetApi();
  OrtAllocator* raw = nullptr;
  Ort::ThrowOnError(api.KernelInfoGetAllocator(info, OrtMemTypeDefault, &raw));
  allocator_ = Ort::Allocator{raw};
  Ort::ConstMemoryInfo mem = allocator_.GetInfo();
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

  // The fallback exists where cuBLASLt loads; a forced fallback without it fails each call (Compute), so a
  // session still opens and the message says why.
  if (cuda::CublasLtAvailable(&fallback_unavailable_)) {
    gemm_bias_ = std::make_unique<cuda::CublasLtGemmBias>(dev_.device);
  }
  staged_.Stage(info, ToDType(type_), attrs_.trans_b, dev_.device, &allocator_);
  // The tuning table applies only on the device, CUDA runtime and library version it was measured with.
  if (!path_attrs_.tuned_device.empty()) {
    std::string signature;
    table_applies_ = cuda::DeviceSignature(dev_.device, &signature) == cudaSuccess &&
                     signature == path_attrs_.tuned_device;
  }
}

std::string FusedLinearGeluCudaKernel::Describe(const LinearShape& s) const {
  return std::string(TypeName(type_)) + " M=" + std::to_string(s.M) + " K=" + std::to_string(s.K) +
         " N=" + std::to_string(s.N) + " transB=" + (attrs_.trans_b ? "1" : "0") +
         " approximate=" + ActivationName(attrs_.activation) + " on sm_" + std::to_string(dev_.cc_major) +
         std::to_string(dev_.cc_minor);
}

void FusedLinearGeluCudaKernel::Compute(OrtKernelContext* context) const {
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
  // The fused path's TF32 tactics need 16-byte aligned rows (K and N multiples of 4 floats); other shapes
  // would run its strict any-alignment kernel, so the built-in rule sends them to the fallback, where cuBLAS
  // decides TF32 per shape exactly as for ORT's MatMul (RunFallback). ORT's own choice varies with the shape: at
  // 770x3074 full fp32 for one row, TF32 from two (each cell's error: bench/results/cuda_kernel_never_slower_h200.md's
  // grids).
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

  const CudaPath path =
      cuda::ChooseCudaPath(args, dev_, path_attrs_, table_applies_, /*fallback_available=*/gemm_bias_ != nullptr);
  switch (path) {
    case CudaPath::kFallback: RunFallback(ctx, args, s, stream); return;
    case CudaPath::kGemv: RunGemv(args, s, stream); return;
    default: break;
  }

  if (args.dtype != cuda::DType::kFloat32 && args.K > 0 && !cuda::RowsAreVectors(args)) {
    RunFusedStaged(ctx, args, s, stream);
    return;
  }
  RunFused(ctx, args, s, stream);
}

namespace {

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
