// The activation as a CUTLASS epilogue functor. One functor serves both CUTLASS generations:
//  - CUTLASS 3 (sm90) Sm90Compute<CutlassActivation, ...> instantiates it with T = float (to find
//    `Arguments`) and with T = Array<float, N> (to apply it), passing the runtime ActivationParams;
//  - CUTLASS 2 (sm80) LinearCombinationGeneric<CutlassActivation, ...> does the same with its Params, which
//    derive from `Arguments`.
// The activation kind is a runtime argument, uniform over the launch: one kernel serves all three forms.
#pragma once

#include <cutlass/array.h>
#include <cutlass/cutlass.h>

#include "cuda/kernels/activation_math.cuh"

namespace onnxfuse::cuda {

template <class T, bool kPrecise>
struct CutlassActivationImpl;

template <bool kPrecise>
struct CutlassActivationImpl<float, kPrecise> {
  using Arguments = ActivationParams;
  static const bool kIsHeavy = true;
  CUTLASS_HOST_DEVICE float operator()(float x, Arguments const& p) const {
#if defined(__CUDA_ARCH__)
    return apply_activation<kPrecise>(x, p);
#else
    return x;  // never called on the host; present so host-device callers compile
#endif
  }
};

template <int N, bool kPrecise>
struct CutlassActivationImpl<cutlass::Array<float, N>, kPrecise> {
  using Arguments = ActivationParams;
  static const bool kIsHeavy = true;
  CUTLASS_HOST_DEVICE cutlass::Array<float, N> operator()(cutlass::Array<float, N> const& x,
                                                         Arguments const& p) const {
    cutlass::Array<float, N> y;
#if defined(__CUDA_ARCH__)
    float v[N];
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = x[i];
    apply_activation<kPrecise>(v, p);
#pragma unroll
    for (int i = 0; i < N; ++i) y[i] = v[i];
#else
    y = x;
#endif
    return y;
  }
};

// The fast forms for 16-bit outputs, the libm-accurate ones for fp32 outputs (activation_math.cuh).
template <class T>
using CutlassActivation = CutlassActivationImpl<T, false>;
template <class T>
using CutlassActivationPrecise = CutlassActivationImpl<T, true>;

// For a kernel whose output is Element: CutlassActivationFor<Element>::template Fn is the one-parameter
// functor template CUTLASS expects.
template <class Element>
struct CutlassActivationFor {
  template <class T>
  using Fn = CutlassActivationImpl<T, sizeof(Element) == 4>;
};

}  // namespace onnxfuse::cuda
