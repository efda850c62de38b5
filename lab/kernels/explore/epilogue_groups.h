// Kernel lab only (build.sh with OFK_EXPLORE=sched, through hooks/kernel_hooks.cuh): extra activation codes for
// the epilogue experiments of lab/kernels/NOTES.md v6, as `case` labels of apply_activation's switch
// (OFK_EXPLORE_ACTIVATION_CASES, custom_ops/src/cuda/activation_math.cuh):
//   -1            no activation, to measure what the epilogue's math costs
//   -2 / -3 / -4  the fast erf in chained groups of 2 / 4 / 8 elements: each group's first product (x·x)
//                 takes + (the previous group's last result & zero bits the compiler cannot see), so the
//                 values are unchanged but a group cannot start before the previous one ends
//   -5 / -6       tanh / sigmoid in chained groups of 8
//   -7 / -8       the shipped erf / no activation, with the epilogue timeline of epilogue_trace.h
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
    break;
