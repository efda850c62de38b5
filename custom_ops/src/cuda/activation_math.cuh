// Device math for the three activations, shared by every CUDA GEMM+GELU kernel so that all tactics
// compute the same function. Everything is in fp32 on the fp32 pre-activation (accumulator + bias).
//
// Why not erff()/tanhf(): the epilogue runs once per output element while the main loop runs K/16 MMA
// steps per element, so at K = 768 the activation is a visible share of the kernel. Each form below is
// branch-free (no warp divergence on the sign or size of x) and uses one MUFU op (ex2 or rcp):
//   erf  : a minimax rational x·P(x²)/Q(x²) on [-4, 4] (degree 13/8; max abs error 4.2e-7 against
//          float64, i.e. a few fp32 ulp); outside [-4, 4] erf is ±1 in fp32, so the argument is clamped
//          and the result clamped to [-1, 1] so that 1 + erf(x) is exactly 0 for very negative x.
//   tanh : 0.5·(1 + tanh(u)) = σ(2u), so gelu_tanh(x) = x / (1 + e^(-2u)): one ex2 + one rcp, no
//          cancellation in the negative tail.
//   sigmoid: x·σ(alpha·x) = x / (1 + e^(-alpha·x)).
// Special values: NaN in gives NaN out (x multiplies every form); +inf gives +inf; very negative finite x
// gives -0 (never NaN: e^(-2u) overflowing to +inf divides to 0); -inf gives NaN, as float64 does.
#pragma once

#include <cuda_runtime.h>

#include "../activation.h"

namespace onnxfuse::cuda {

// The activation as it reaches a kernel: plain data, identical for every tactic.
struct ActivationParams {
  int act = 0;          // static_cast<int>(onnxfuse::Activation)
  float sigmoid_alpha = 1.702f;  // sigmoid form only (named apart from CUTLASS 2 epilogue alpha)
};

__device__ __forceinline__ float erf_rational(float x) {
  // Argument clamp: erf(±4) rounds to ±1 in fp32. fminf/fmaxf drop a NaN, which the caller's final
  // multiply by x restores.
  const float t = fminf(fmaxf(x, -4.0f), 4.0f);
  const float t2 = t * t;
  float p = -2.72614225801306e-10f;
  p = fmaf(p, t2, 2.77068142495902e-08f);
  p = fmaf(p, t2, -2.10102402082508e-06f);
  p = fmaf(p, t2, -5.69250639462346e-05f);
  p = fmaf(p, t2, -7.34990630326855e-04f);
  p = fmaf(p, t2, -2.95459980854025e-03f);
  p = fmaf(p, t2, -1.60960333262415e-02f);
  p = p * t;
  float q = -1.45660718464996e-05f;
  q = fmaf(q, t2, -2.13374055278905e-04f);
  q = fmaf(q, t2, -1.68282697438203e-03f);
  q = fmaf(q, t2, -7.37332916720468e-03f);
  q = fmaf(q, t2, -1.42647390514189e-02f);
  // q lies in [-0.27, -0.014]: far from 0 and from the range where __fdividef loses accuracy.
  return fminf(fmaxf(__fdividef(p, q), -1.0f), 1.0f);
}

__device__ __forceinline__ float gelu_erf(float x) {
  return 0.5f * x * (1.0f + erf_rational(x * 0.70710678118654752f));
}

// x / (1 + e^(-s·x)) with s·x computed by the caller; __expf is ex2.approx on a pre-scaled argument.
__device__ __forceinline__ float x_times_sigmoid(float x, float z) {
  return __fdividef(x, 1.0f + __expf(-z));
}

__device__ __forceinline__ float gelu_tanh(float x) {
  // 2u = 2·√(2/π)·(x + 0.044715·x³) = x·(1.5957691 + 0.0713548·x²)
  const float two_u = x * fmaf(0.0713548162726009f, x * x, 1.5957691216057308f);
  return x_times_sigmoid(x, two_u);
}

__device__ __forceinline__ float silu_alpha(float x, float alpha) { return x_times_sigmoid(x, alpha * x); }

// Applies the activation to a whole fragment. The switch is on a kernel-uniform value, outside the
// element loop: every thread takes the same branch, and each branch is a straight-line loop.
template <int N>
__device__ __forceinline__ void apply_activation(float (&v)[N], const ActivationParams& p) {
  switch (p.act) {
    case static_cast<int>(Activation::kGeluTanh):
#pragma unroll
      for (int i = 0; i < N; ++i) v[i] = gelu_tanh(v[i]);
      break;
    case static_cast<int>(Activation::kSigmoid):
#pragma unroll
      for (int i = 0; i < N; ++i) v[i] = silu_alpha(v[i], p.sigmoid_alpha);
      break;
    default:
#pragma unroll
      for (int i = 0; i < N; ++i) v[i] = gelu_erf(v[i]);
      break;
  }
}

__device__ __forceinline__ float apply_activation(float v, const ActivationParams& p) {
  float a[1] = {v};
  apply_activation(a, p);
  return a[0];
}

}  // namespace onnxfuse::cuda
