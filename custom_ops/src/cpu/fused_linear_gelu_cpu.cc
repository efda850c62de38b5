// The CPU kernel: Y = act(X·W(ᵀ) + B) as a grid of output tiles run on ORT's intra-op thread pool.
//
// Two ways to compute a tile, chosen once per process (packed_gemm.h):
//   - x86-64 with AVX2+FMA or AVX-512F: the packed GEMM, whose weight was packed once when the kernel
//     was created (constant W) and whose bias + activation run on each finished block while it is in L1;
//   - anywhere else: a single-threaded OpenBLAS GEMM on the tile, then bias + activation on the tile
//     while it is still in L2.
// Either way the fused op writes Y once, where the unfused graph makes three passes (MatMul, Add, Gelu).
//
// float16/bfloat16: operands are widened to float32, the GEMM accumulates in float32, and each tile is
// narrowed once after its activation (one rounding, at the very end). A constant weight is widened (and
// packed) once, when the kernel is created.
#include "cpu/fused_linear_gelu_cpu.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "domain.h"
#include "contract/fused_linear_gelu_common.h"
#include "cpu/element_rows.h"
#include "cpu/gemm/gemm.h"
#include "cpu/gemm/packed_gemm.h"
#include "cpu/parallel_for.h"
#include "cpu/simd/vector_kernels.h"

namespace onnxfuse::cpu {
namespace {

// Output tiling: tiles run in parallel on ORT's pool (handed out dynamically). A tile is 144 rows x 128
// columns: its packed panel slices for one K slice (128 x 256 floats, 128 KiB) and its block of Y (72 KiB)
// fit a core's L2 together, and 144 rows re-read each panel slice 24 times from L2 for one fetch from
// memory. Narrower tiles also give small-M problems enough of them for every thread (M = 128, N = 3072:
// 24 tiles), where 144 x 256-512 tiles gave fewer. Tile widths are multiples of the packed weight's panel
// width.
constexpr int64_t kTileM = 144;
constexpr int64_t kTileN = 128;

struct TilePlan {
  int64_t tile_m, tile_n, tiles_m, tiles_n;
};

TilePlan PlanTiles(int64_t M, int64_t N) {
  TilePlan p;
  p.tile_m = std::min<int64_t>(kTileM, M);
  p.tiles_m = (M + p.tile_m - 1) / p.tile_m;
  p.tile_n = std::min<int64_t>(kTileN, N);
  p.tiles_n = (N + p.tile_n - 1) / p.tile_n;
  return p;
}


template <typename T>
class FusedLinearGeluCpuKernel {
 public:
  explicit FusedLinearGeluCpuKernel(const OrtKernelInfo* info)
      : attrs_(ReadAttributes(info)), vk_(CpuVectorKernels()), packed_path_(PackedGemmAvailable()) {
    PrepareConstantWeight(info);
  }

  OrtStatus* ComputeV2(OrtKernelContext* raw_ctx) {
    return GuardStatus([&] { Compute(Ort::KernelContext(raw_ctx)); });
  }

 private:
  // A constant W (an initializer) is prepared once: packed for the AVX2 GEMM, or widened to float32
  // for the BLAS path. Compute checks the shape it was prepared for against the call's W.
  void PrepareConstantWeight(const OrtKernelInfo* info) {
    int is_constant = 0;
    Ort::ConstValue w = Ort::ConstKernelInfo(info).GetTensorConstantInput(1, &is_constant);
    if (!is_constant || !w) return;
    auto shape_info = w.GetTensorTypeAndShapeInfo();
    const std::vector<int64_t> shape = shape_info.GetShape();
    if (shape_info.GetElementType() != kElementType<T> || shape.size() != 2) return;  // Compute reports it
    const int64_t K = attrs_.trans_b ? shape[1] : shape[0];
    const int64_t N = attrs_.trans_b ? shape[0] : shape[1];
    if (K == 0 || N == 0) return;
    const size_t count = shape_info.GetElementCount();
    std::vector<float> wide;
    const float* wf;
    if constexpr (std::is_same_v<T, float>) {
      wf = w.GetTensorData<float>();
    } else {
      wide.resize(count);
      ToFloat(vk_, w.GetTensorData<T>(), wide.data(), count);
      wf = wide.data();
    }
    if (packed_path_) {
      constant_packed_ = AllocateAligned(PackedWeightFloats(K, N));
      PackWeightPanels(wf, attrs_.trans_b, K, N, 0, (N + kPanelWidth - 1) / kPanelWidth, constant_packed_.get());
    } else if constexpr (!std::is_same_v<T, float>) {
      constant_wide_ = std::move(wide);
    }
    constant_k_ = K;
    constant_n_ = N;
  }

  bool HasConstantWeight(int64_t K, int64_t N) const { return constant_k_ == K && constant_n_ == N && K > 0; }

  void Compute(Ort::KernelContext ctx) {
    BoundCall call = BindCall(ctx, attrs_.trans_b);
    const Ort::ConstValue &x = call.x, &w = call.w, &b = call.b;
    const bool has_bias = b != nullptr;
    const LinearShape& s = call.shape;
    Ort::UnownedValue& y = call.y;
    if (s.M == 0 || s.N == 0) return;

    const int64_t M = s.M, K = s.K, N = s.N;
    T* y_data = y.GetTensorMutableData<T>();

    // X as float32: the input itself, or a widened copy.
    const float* xf = nullptr;
    std::vector<float> x_wide;
    if constexpr (std::is_same_v<T, float>) {
      xf = x.GetTensorData<float>();
    } else {
      x_wide.resize(static_cast<size_t>(M * K));
      WidenParallel(ctx, x.GetTensorData<T>(), x_wide.data(), M * K);
      xf = x_wide.data();
    }
    const float* bias = nullptr;
    std::vector<float> bias_wide;
    if (has_bias) {
      if constexpr (std::is_same_v<T, float>) {
        bias = b.GetTensorData<float>();
      } else {
        bias_wide.resize(static_cast<size_t>(N));
        ToFloat(vk_, b.GetTensorData<T>(), bias_wide.data(), static_cast<size_t>(N));
        bias = bias_wide.data();
      }
    }

    // W in the form the GEMM path wants: packed panels (AVX2/AVX-512) or a plain float32 matrix (BLAS).
    const float* packed_w = nullptr;
    const float* wf = nullptr;
    AlignedFloats packed_now;
    std::vector<float> w_wide;
    if (K > 0) {
      const bool constant = HasConstantWeight(K, N);
      if (packed_path_ && constant) {
        packed_w = constant_packed_.get();
      } else if (!packed_path_ && constant && !std::is_same_v<T, float>) {
        wf = constant_wide_.data();
      } else {
        if constexpr (std::is_same_v<T, float>) {
          wf = w.GetTensorData<float>();
        } else {
          w_wide.resize(static_cast<size_t>(K * N));
          WidenParallel(ctx, w.GetTensorData<T>(), w_wide.data(), K * N);
          wf = w_wide.data();
        }
        if (packed_path_) {
          packed_now = AllocateAligned(PackedWeightFloats(K, N));
          PackParallel(ctx, wf, K, N, packed_now.get());
          packed_w = packed_now.get();
        }
      }
    }

    const TilePlan plan = PlanTiles(M, N);
    ParallelFor(ctx, plan.tiles_m * plan.tiles_n, [&](int64_t t) {
      const int64_t m0 = (t / plan.tiles_n) * plan.tile_m;
      const int64_t n0 = (t % plan.tiles_n) * plan.tile_n;
      const int64_t m = std::min(plan.tile_m, M - m0);
      const int64_t n = std::min(plan.tile_n, N - n0);
      // float32 writes Y in place; float16/bfloat16 accumulate in a per-thread float32 block that is
      // narrowed into Y once, after the activation.
      float* c;
      int64_t ldc;
      thread_local std::vector<float> block;
      if constexpr (std::is_same_v<T, float>) {
        c = y_data + m0 * N + n0;
        ldc = N;
      } else {
        block.resize(static_cast<size_t>(plan.tile_m * plan.tile_n));
        c = block.data();
        ldc = n;
      }
      const float* a = xf + m0 * K;
      if (K == 0) {  // an empty product: Y = act(B)
        for (int64_t r = 0; r < m; ++r) std::fill(c + r * ldc, c + r * ldc + n, 0.0f);
        vk_.bias_activation(c, ldc, m, n, bias ? bias + n0 : nullptr, attrs_.activation, attrs_.alpha);
      } else if (packed_path_) {
        FusedGemmTile({a, K, packed_w, K, N, m, n0, n, c, ldc, bias, attrs_.activation, attrs_.alpha});
      } else {
        const float* bt = attrs_.trans_b ? wf + n0 * K : wf + n0;
        SgemmTile(attrs_.trans_b, m, n, K, a, K, bt, attrs_.trans_b ? K : N, c, ldc);
        vk_.bias_activation(c, ldc, m, n, bias ? bias + n0 : nullptr, attrs_.activation, attrs_.alpha);
      }
      if constexpr (!std::is_same_v<T, float>) {
        for (int64_t r = 0; r < m; ++r) FromFloat(vk_, c + r * ldc, y_data + (m0 + r) * N + n0, n);
      }
    });
  }

  // Widening is memory-bound: chunks of 64K elements spread it over the pool without fine-grained tasks.
  void WidenParallel(const Ort::KernelContext& ctx, const T* in, float* out, int64_t count) {
    constexpr int64_t kChunk = 1 << 16;
    ParallelFor(ctx, (count + kChunk - 1) / kChunk, [&](int64_t i) {
      const int64_t begin = i * kChunk;
      ToFloat(vk_, in + begin, out + begin, static_cast<size_t>(std::min(kChunk, count - begin)));
    });
  }

  void PackParallel(const Ort::KernelContext& ctx, const float* wf, int64_t K, int64_t N, float* packed) {
    const int64_t panels = (N + kPanelWidth - 1) / kPanelWidth;
    constexpr int64_t kPanelsPerTask = 8;
    ParallelFor(ctx, (panels + kPanelsPerTask - 1) / kPanelsPerTask, [&](int64_t i) {
      const int64_t begin = i * kPanelsPerTask;
      PackWeightPanels(wf, attrs_.trans_b, K, N, begin, std::min(panels, begin + kPanelsPerTask), packed);
    });
  }

  const FusedLinearGeluAttributes attrs_;
  const VectorKernels& vk_;
  const bool packed_path_;  // packed GEMM with the fused epilogue; else BLAS + block epilogue
  // A constant W prepared at creation (for K = constant_k_, N = constant_n_).
  AlignedFloats constant_packed_;     // packed path
  std::vector<float> constant_wide_;  // BLAS path, float16/bfloat16
  int64_t constant_k_ = -1, constant_n_ = -1;
};

template <typename T>
struct FusedLinearGeluCpuOp
    : Ort::CustomOpBase<FusedLinearGeluCpuOp<T>, FusedLinearGeluCpuKernel<T>, /*WithStatus=*/true> {
  OrtStatusPtr CreateKernelV2(const OrtApi& /*api*/, const OrtKernelInfo* info, void** kernel) const {
    return GuardStatus([&] { *kernel = new FusedLinearGeluCpuKernel<T>(info); });
  }
  const char* GetName() const { return kOpType; }
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
  size_t GetInputTypeCount() const { return 3; }
  ONNXTensorElementDataType GetInputType(size_t /*index*/) const { return kElementType<T>; }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t index) const {
    return index == 2 ? OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_OPTIONAL
                      : OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_REQUIRED;
  }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t /*index*/) const { return kElementType<T>; }
};

}  // namespace

void AddCpuOps(Ort::CustomOpDomain& domain) {
  ConfigureBlasThreading();
  static const FusedLinearGeluCpuOp<float> op_float;
  static const FusedLinearGeluCpuOp<Ort::Float16_t> op_half;
  static const FusedLinearGeluCpuOp<Ort::BFloat16_t> op_bfloat16;
  domain.Add(&op_float);
  domain.Add(&op_half);
  domain.Add(&op_bfloat16);
}

}  // namespace onnxfuse::cpu
