// Device math for the three activations, shared by every CUDA GEMM+GELU kernel so that all tactics
// compute the same function. Everything is in fp32 on the fp32 pre-activation (accumulator + bias).
//
// Two precisions, chosen by the output type:
//
// Fast (fp16/bf16 outputs). The epilogue is issue-bound: a 128x128 tile gives each consumer thread 128
// elements, so every instruction per element costs ~128 issue slots per warp, and an erf-GELU of ~25
// instructions (erff, or a rational erf) made the fused kernel clearly slower than the same kernel with a
// tanh-GELU (lab/kernels/NOTES.md, v2; lab/results/kernels_v2_fast_erf.json.gz). All three forms are written
// as x·σ(z) = x / (1 + e^(-z)), one ex2 and one rcp, branch-free:
//   erf    : Φ(x) = σ(g(x)) with g = logit∘Φ fitted by an odd degree-9 polynomial (weighted minimax on
//            [0, 7]; monotone on [-12, 12]); max abs error of x·Φ(x) is 3.3e-6 in fp32 arithmetic, far
//            under half an fp16/bf16 ulp wherever |GELU(x)| > 0.007.
//   tanh   : 0.5·(1 + tanh(u)) = σ(2u), so gelu_tanh(x) = x / (1 + e^(-2u)): no cancellation in the tail.
//   sigmoid: x·σ(alpha·x).
// Precise (fp32 outputs, where there is no output rounding to hide behind): erff, tanhf and expf as ONNX
// Runtime's own Gelu kernels use them, so the fused op is as accurate as the unfused one in strict fp32.
//
// Special values: NaN in gives NaN out (x multiplies every form); +inf gives +inf; very negative finite x
// gives -0 (e^(-z) overflowing to +inf divides to 0, never NaN); -inf gives NaN, as float64 does.
#pragma once

#include <cuda_runtime.h>

#include "activation.h"
#include "kernel_hooks.cuh"

namespace onnxfuse::cuda {

// The activation as it reaches a kernel: plain data, identical for every tactic.
struct ActivationParams {
  int act = 0;          // static_cast<int>(onnxfuse::Activation)
  float sigmoid_alpha = 1.702f;  // sigmoid form only (named apart from CUTLASS 2 epilogue alpha)
  ONNXFUSE_HOOK_ACTIVATION_PARAMS_MEMBERS
};

// log2(e): e^(-z) = 2^(h) with h = -z·log2(e). The fast forms fold -log2(e) into their constants, so each
// element costs one multiply less than __expf (which scales its argument before ex2.approx); every FP32
// instruction per element shows in the epilogue's time (lab/kernels/NOTES.md, v4).
constexpr float kLog2e = 1.4426950408889634f;

// 2^h in one MUFU op: ex2.approx.ftz.f32 (max relative error 2^-22), what __expf runs after its multiply.
__device__ __forceinline__ float fast_exp2(float h) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(h));
  return r;
}

// x / (1 + 2^h) = x·σ(-h·ln 2); __fdividef is rcp + mul (and returns 0 when the divisor overflows, which is
// the right limit here).
__device__ __forceinline__ float x_over_one_plus_exp2(float x, float h) {
  return __fdividef(x, 1.0f + fast_exp2(h));
}

// logit(Φ(x)) ≈ x·(c1 + c3·x² + c5·x⁴ + c7·x⁶ + c9·x⁸), here times -log2(e) (c1..c9 fitted as above, then
// scaled in float64), given x and x². Horner on x² with finite constants: an overflowing x² gives ±inf (never
// inf - inf), which the sigmoid maps to the right limit.
__device__ __forceinline__ float erf_logit_h(float x, float x2) {
  float h = -3.2104162773359513e-06f;
  h = fmaf(h, x2, 8.791040410119996e-05f);
  h = fmaf(h, x2, 3.620447584555129e-04f);
  h = fmaf(h, x2, -1.0522997257257635e-01f);
  h = fmaf(h, x2, -2.302043776841872f);
  return h * x;
}

__device__ __forceinline__ float gelu_erf_fast(float x) { return x_over_one_plus_exp2(x, erf_logit_h(x, x * x)); }

__device__ __forceinline__ float gelu_tanh_fast(float x) {
  // 2u = 2·√(2/π)·(x + 0.044715·x³) = x·(1.5957691 + 0.0713548·x²); h = -2u·log2(e).
  const float h = x * fmaf(-0.10294323958002442f, x * x, -2.302208198144325f);
  return x_over_one_plus_exp2(x, h);
}

__device__ __forceinline__ float gelu_erf_precise(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }

__device__ __forceinline__ float gelu_tanh_precise(float x) {
  const float u = 0.7978845608028654f * fmaf(0.044715f * x, x * x, x);
  return 0.5f * x * (1.0f + tanhf(u));
}

__device__ __forceinline__ float silu_alpha_precise(float x, float alpha) { return x / (1.0f + expf(-alpha * x)); }

// Applies the activation to a whole fragment. The switch is on a kernel-uniform value, outside the
// element loop: every thread takes the same branch, and each branch is a straight-line loop.
template <bool kPrecise, int N>
__device__ __forceinline__ void apply_activation(float (&v)[N], const ActivationParams& p) {
  switch (p.act) {
    case static_cast<int>(Activation::kGeluTanh):
#pragma unroll
      for (int i = 0; i < N; ++i) v[i] = kPrecise ? gelu_tanh_precise(v[i]) : gelu_tanh_fast(v[i]);
      break;
    case static_cast<int>(Activation::kSigmoid):
#pragma unroll
      for (int i = 0; i < N; ++i) {
        v[i] = kPrecise ? silu_alpha_precise(v[i], p.sigmoid_alpha)
                        : x_over_one_plus_exp2(v[i], (-kLog2e * p.sigmoid_alpha) * v[i]);
      }
      break;
    ONNXFUSE_HOOK_ACTIVATION_CASES(v, p)
    default:
#pragma unroll
      for (int i = 0; i < N; ++i) v[i] = kPrecise ? gelu_erf_precise(v[i]) : gelu_erf_fast(v[i]);
      break;
  }
}

template <bool kPrecise>
__device__ __forceinline__ float apply_activation(float v, const ActivationParams& p) {
  float a[1] = {v};
  apply_activation<kPrecise>(a, p);
  return a[0];
}

}  // namespace onnxfuse::cuda
