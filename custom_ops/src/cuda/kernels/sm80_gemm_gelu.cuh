// Portable (sm_80+) GEMM + bias + activation on CUTLASS 2: cp.async multistage main loop on mma.sync
// Tensor Cores, and an epilogue D = act(acc + C) where C is the bias read as a row-major [M, N] operand with
// leading dimension 0 (every row reads bias[0..N)): the classic CUTLASS bias broadcast. Without a bias, beta
// is 0 and the epilogue never reads C. The pre-activation stays in registers.
//
// This serves GPUs other than Hopper, float32 with trans_b = 0 on Hopper (TF32 GMMA wants K-major B), and
// strict float32 (3xTF32). Shapes whose rows or pointers are not 16-byte aligned go to the any-alignment
// fallback instead (fallback_gemm_gelu.cu).
#pragma once

#include <climits>
#include <type_traits>

#include <cutlass/cutlass.h>
#include <cutlass/epilogue/thread/linear_combination_generic.h>
#include <cutlass/gemm/device/gemm_universal.h>

#include "cuda/kernels/cutlass_activation.cuh"
#include "cuda/dispatch/tactics.cuh"

namespace onnxfuse::cuda {

template <DType D>
struct Sm80Element;
template <>
struct Sm80Element<DType::kFloat16> { using type = cutlass::half_t; };
template <>
struct Sm80Element<DType::kBFloat16> { using type = cutlass::bfloat16_t; };
template <>
struct Sm80Element<DType::kFloat32> { using type = float; };

template <class Config>
struct Sm80Kernel;

template <DType D, bool TransB, Sm80Math Math>
struct Sm80Kernel<Sm80Config<D, TransB, Math>> {
  using Element = typename Sm80Element<D>::type;
  static constexpr bool kIs16Bit = sizeof(Element) == 2;
  static constexpr int kAlignment = 16 / sizeof(Element);  // 128-bit cp.async
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = std::conditional_t<TransB, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  using LayoutC = cutlass::layout::RowMajor;

  // 128x128 CTA tile, 2x2 warps of 64x64: the standard Ampere tile (K step 32 for 16-bit, 16 for fp32 so
  // both are 64 bytes of K per stage). 4 stages for 1xTF32/16-bit; 3xTF32 issues 3 MMAs per K step and
  // needs fewer stages to hide the loads.
  using ThreadblockShape = cutlass::gemm::GemmShape<128, 128, kIs16Bit ? 32 : 16>;
  using WarpShape = cutlass::gemm::GemmShape<64, 64, kIs16Bit ? 32 : 16>;
  using InstructionShape = cutlass::gemm::GemmShape<16, 8, kIs16Bit ? 16 : 8>;
  static constexpr int kStages = Math == Sm80Math::kFastF32 ? 3 : 4;
  using MathOp = std::conditional_t<Math == Sm80Math::kFastF32, cutlass::arch::OpMultiplyAddFastF32,
                                    cutlass::arch::OpMultiplyAdd>;

  using EpilogueOp = cutlass::epilogue::thread::LinearCombinationGeneric<
      CutlassActivationFor<Element>::template Fn, Element, kAlignment, float, float, cutlass::epilogue::thread::ScaleType::Default,
      cutlass::FloatRoundStyle::round_to_nearest, /*IsHeavy=*/true>;

  using Gemm = cutlass::gemm::device::GemmUniversal<
      Element, LayoutA, Element, LayoutB, Element, LayoutC, float, cutlass::arch::OpClassTensorOp,
      cutlass::arch::Sm80, ThreadblockShape, WarpShape, InstructionShape, EpilogueOp,
      cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<8>, kStages, kAlignment, kAlignment, MathOp>;

  static bool shape_fits(const GemmGeluArgs& a, const DeviceInfo& dev) {
    const bool math_ok = D != DType::kFloat32 ? Math == Sm80Math::kTensorOp
                                              : (Math == Sm80Math::kFastF32) == !a.allow_tf32;
    return dev.cc_major >= 8 && a.dtype == D && a.trans_b == TransB && math_ok && a.M > 0 && a.N > 0 &&
           a.K > 0 && a.M <= INT_MAX && a.N <= INT_MAX && a.K <= INT_MAX && a.K % kAlignment == 0 &&
           a.N % kAlignment == 0 && aligned_to(a.x, 16) && aligned_to(a.w, 16) && aligned_to(a.y, 16) &&
           (a.bias == nullptr || aligned_to(a.bias, 16));
  }

  static typename Gemm::Arguments make_arguments(const GemmGeluArgs& a) {
    const int M = static_cast<int>(a.M), N = static_cast<int>(a.N), K = static_cast<int>(a.K);
    typename EpilogueOp::Params epilogue(1.0f, a.bias != nullptr ? 1.0f : 0.0f);
    static_cast<ActivationParams&>(epilogue) = activation_params(a);
    return typename Gemm::Arguments(
        cutlass::gemm::GemmUniversalMode::kGemm, {M, N, K}, /*batch_count=*/1, epilogue, a.x, a.w,
        a.bias /* C: the bias row, ldc = 0 */, a.y, /*batch strides*/ 0, 0, 0, 0,
        /*lda=*/K, /*ldb=*/TransB ? K : N, /*ldc=*/0, /*ldd=*/N);
  }
};

template <class Config>
bool Sm80Tactic<Config>::can_implement(const GemmGeluArgs& a, const DeviceInfo& dev) {
  using K = Sm80Kernel<Config>;
  return K::shape_fits(a, dev) && K::Gemm::can_implement(K::make_arguments(a)) == cutlass::Status::kSuccess;
}

template <class Config>
size_t Sm80Tactic<Config>::workspace(const GemmGeluArgs& a, const DeviceInfo& dev) {
  using K = Sm80Kernel<Config>;
  return K::shape_fits(a, dev) ? K::Gemm::get_workspace_size(K::make_arguments(a)) : 0;
}

template <class Config>
cudaError_t Sm80Tactic<Config>::run(const GemmGeluArgs& a, const DeviceInfo& dev, void* workspace,
                                    size_t workspace_bytes, cudaStream_t stream) {
  using K = Sm80Kernel<Config>;
  if (!K::shape_fits(a, dev)) return cudaErrorNotSupported;
  const auto args = K::make_arguments(a);
  typename K::Gemm gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return cudaErrorNotSupported;
  if (K::Gemm::get_workspace_size(args) > workspace_bytes) return cudaErrorInvalidValue;
  if (gemm.initialize(args, workspace, stream) != cutlass::Status::kSuccess) return cudaErrorUnknown;
  if (gemm.run(stream) != cutlass::Status::kSuccess) {
    const cudaError_t err = cudaGetLastError();
    return err != cudaSuccess ? err : cudaErrorLaunchFailure;
  }
  return cudaGetLastError();
}

}  // namespace onnxfuse::cuda

#define ONNXFUSE_SM80_TACTIC(D, TRANS_B, MATH) \
  template struct onnxfuse::cuda::Sm80Tactic<  \
      onnxfuse::cuda::Sm80Config<onnxfuse::cuda::DType::D, TRANS_B, onnxfuse::cuda::Sm80Math::MATH>>;
