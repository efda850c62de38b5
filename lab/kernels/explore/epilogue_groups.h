// Kernel lab only (build.sh with OFK_EXPLORE=sched, through hooks/kernel_hooks.cuh): extra activation codes for
// the epilogue experiments of lab/kernels/NOTES.md v6, as `case` labels of apply_activation's switch
// (OFK_EXPLORE_ACTIVATION_CASES, custom_ops/src/cuda/kernels/activation_math.cuh):
//   -1            no activation, to measure what the epilogue's math costs
//   -2 / -3 / -4  the fast erf in chained groups of 2 / 4 / 8 elements: each group's first product (x·x)
//                 takes + (the previous group's last result & zero bits the compiler cannot see), so the
//                 values are unchanged but a group cannot start before the previous one ends
//   -5 / -6       tanh / sigmoid in chained groups of 8
//   -7 / -8       the shipped erf / no activation, with the epilogue timeline of epilogue_trace.h
// Issue #20 (NOTES.md v8): the erf form with one MUFU op per element instead of two. The compiler schedules
// the shipped form in groups of 16 elements, a run of FMA-pipe work and then a run of 32 MUFU ops (ex2, rcp)
// at 8 cycles each, so the MUFU pipe, not issue, sets the pace; 1/(1 + e) by Newton's iteration on the FMA pipe
// halves the MUFU run and gives its idle issue slots work:
//   -9            erf, 1/(1 + e) from a bit-trick seed (5 % error) and two Newton steps (6.4e-6 relative)
//   -10           erf, the same with three Newton steps (1e-7, MUFU rcp's accuracy)
//   -11           erf, two Newton steps for the odd elements and MUFU rcp for the even ones (both pipes busy)
//   -12           erf, shipped arithmetic software-pipelined in chunks of 8 (chunk c's ex2 and rcp issued next
//                 to chunk c + 1's polynomial); the same values as the shipped form
//   -13           tanh with two Newton steps, as -9
// The hook header is included ahead of activation_math.cuh's forms, so whatever calls them is written inside
// the cases (OFK_EXPLORE_ERF_LINKED, OFK_EXPLORE_TANH_LINKED), which expand in apply_activation, after the forms.
#pragma once

#include "epilogue_trace.h"

namespace ofk_explore {

template <int G, int N, class Form>
__device__ __forceinline__ void in_chained_groups(float (&v)[N], unsigned zero_bits, Form form) {
  if constexpr (N % G != 0) {  // sm80 and fallback fragments (1-8 elements): ungrouped
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = form(v[i], 0.0f);
  } else {
    float link = 0.0f;
#pragma unroll
    for (int g = 0; g < N; g += G) {
#pragma unroll
      for (int i = g; i < g + G; ++i) v[i] = form(v[i], link);
      link = __uint_as_float(__float_as_uint(v[g + G - 1]) & zero_bits);
    }
  }
}

// 0 at run time from a kernel parameter, so the compiler cannot fold it: the sign bit of the sigmoid alpha
// (the harness passes 1.702).
__device__ __forceinline__ unsigned zero_bits(float sigmoid_alpha) {
  return __float_as_uint(sigmoid_alpha) & 0x80000000u;
}

// 1/d for d = 1 + e, e = 2^h >= 0, by Newton's iteration from the bit-trick seed 0x7EF311C3 - bits(d) (relative
// error <= 5.1 % for every d): kSteps = 2 gives 6.4e-6, 3 gives fp32's own ~1e-7. d is clamped to 2^126 so that
// the seed stays a positive float (an infinite d would make it negative); x / d is then |x|·2^-126 for the
// pre-activations below about -13, against the shipped form's -0 (both under fp16 and bf16's resolution there).
template <int kSteps>
__device__ __forceinline__ float rcp_newton(float d) {
  d = fminf(d, 0x1p126f);
  float r = __int_as_float(0x7EF311C3 - __float_as_int(d));
#pragma unroll
  for (int i = 0; i < kSteps; ++i) r = fmaf(r, fmaf(-d, r, 1.0f), r);
  return r;
}

// Chunk c's MUFU work issued beside chunk c + 1's polynomial: the arithmetic of the shipped erf form, in another
// order in the source (the values are the same bit for bit).
template <int C, int N, class Logit, class Exp2, class Finish>
__device__ __forceinline__ void software_pipelined(float (&v)[N], Logit logit, Exp2 exp2, Finish finish) {
  if constexpr (N % C != 0 || N < 2 * C) {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = finish(v[i], exp2(logit(v[i])));
  } else {
    float h[C];
#pragma unroll
    for (int j = 0; j < C; ++j) h[j] = logit(v[j]);
#pragma unroll
    for (int c = 0; c < N; c += C) {
      float e[C];
#pragma unroll
      for (int j = 0; j < C; ++j) e[j] = exp2(h[j]);
      if (c + C < N) {
#pragma unroll
        for (int j = 0; j < C; ++j) h[j] = logit(v[c + C + j]);
      }
#pragma unroll
      for (int j = 0; j < C; ++j) v[c + j] = finish(v[c + j], e[j]);
    }
  }
}

}  // namespace ofk_explore

// The shipped fast forms of activation_math.cuh with `link` added to their first product.
#define OFK_EXPLORE_ERF_LINKED \
  [](float x, float link) { return x_over_one_plus_exp2(x, erf_logit_h(x, fmaf(x, x, link))); }
#define OFK_EXPLORE_TANH_LINKED                                                                            \
  [](float x, float link) {                                                                                \
    return x_over_one_plus_exp2(x, x * fmaf(-0.10294323958002442f, fmaf(x, x, link), -2.302208198144325f)); \
  }

#define OFK_EXPLORE_ACTIVATION_CASES(v, p)                                                                 \
  case -1:                                                                                                 \
    break;                                                                                                 \
  case -2:                                                                                                 \
    ofk_explore::in_chained_groups<2>(v, ofk_explore::zero_bits(p.sigmoid_alpha), OFK_EXPLORE_ERF_LINKED);  \
    break;                                                                                                 \
  case -3:                                                                                                 \
    ofk_explore::in_chained_groups<4>(v, ofk_explore::zero_bits(p.sigmoid_alpha), OFK_EXPLORE_ERF_LINKED);  \
    break;                                                                                                 \
  case -4:                                                                                                 \
    ofk_explore::in_chained_groups<8>(v, ofk_explore::zero_bits(p.sigmoid_alpha), OFK_EXPLORE_ERF_LINKED);  \
    break;                                                                                                 \
  case -5:                                                                                                 \
    ofk_explore::in_chained_groups<8>(v, ofk_explore::zero_bits(p.sigmoid_alpha), OFK_EXPLORE_TANH_LINKED); \
    break;                                                                                                 \
  case -6: {                                                                                               \
    const float k = -kLog2e * p.sigmoid_alpha;                                                             \
    ofk_explore::in_chained_groups<8>(v, ofk_explore::zero_bits(p.sigmoid_alpha),                          \
                                      [k](float x, float l) { return x_over_one_plus_exp2(x, fmaf(k, x, l)); }); \
    break;                                                                                                 \
  }                                                                                                        \
  case -7:                                                                                                 \
    ofk_explore::trace_point(p.trace, 0);                                                                  \
    for (int i = 0; i < N; ++i) v[i] = kPrecise ? gelu_erf_precise(v[i]) : gelu_erf_fast(v[i]);           \
    ofk_explore::trace_point(p.trace, 1);                                                                  \
    break;                                                                                                 \
  case -8:                                                                                                 \
    ofk_explore::trace_point(p.trace, 0);                                                                  \
    ofk_explore::trace_point(p.trace, 1);                                                                  \
    break;                                                                                                 \
  case -9:                                                                                                 \
    _Pragma("unroll") for (int i = 0; i < N; ++i)                                                                            \
      v[i] = v[i] * ofk_explore::rcp_newton<2>(1.0f + fast_exp2(erf_logit_h(v[i], v[i] * v[i])));          \
    break;                                                                                                 \
  case -10:                                                                                                \
    _Pragma("unroll") for (int i = 0; i < N; ++i)                                                                            \
      v[i] = v[i] * ofk_explore::rcp_newton<3>(1.0f + fast_exp2(erf_logit_h(v[i], v[i] * v[i])));          \
    break;                                                                                                 \
  case -11:                                                                                                \
    _Pragma("unroll") for (int i = 0; i < N; ++i) {                                                                          \
      const float d = 1.0f + fast_exp2(erf_logit_h(v[i], v[i] * v[i]));                                   \
      v[i] = (i & 1) ? v[i] * ofk_explore::rcp_newton<2>(d) : __fdividef(v[i], d);                         \
    }                                                                                                      \
    break;                                                                                                 \
  case -12:                                                                                                \
    ofk_explore::software_pipelined<8>(                                                                    \
        v, [](float x) { return erf_logit_h(x, x * x); }, [](float h) { return fast_exp2(h); },            \
        [](float x, float e) { return __fdividef(x, 1.0f + e); });                                         \
    break;                                                                                                 \
  case -13:                                                                                                \
    _Pragma("unroll") for (int i = 0; i < N; ++i) {                                                                          \
      const float h = v[i] * fmaf(-0.10294323958002442f, v[i] * v[i], -2.302208198144325f);             \
      v[i] = v[i] * ofk_explore::rcp_newton<2>(1.0f + fast_exp2(h));                                       \
    }                                                                                                      \
    break;
