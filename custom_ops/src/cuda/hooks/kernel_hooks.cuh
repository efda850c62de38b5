// The CUDA kernels' hook points, as the shipped library defines them: each compiles to nothing or to the
// shipped choice, so the kernels are exactly what they would be without hooks.
//
// A build that needs more (the kernel lab's experiment builds: extra activation codes, an epilogue timeline,
// tile-scheduler arguments from the environment; lab/kernels/hooks/kernel_hooks.cuh) supplies its own
// kernel_hooks.cuh earlier on the include path, and that one is compiled instead of this file. Hence this
// folder: the kernels include "kernel_hooks.cuh" through the include path (cmake/cuda.cmake adds
// src/cuda/hooks), and a header beside its includers would be found before any include path. A replacement
// defines every hook below, with the same meaning.
#pragma once

namespace onnxfuse::cuda::hooks {

// Host side, on every sm90 launch: adjusts the tile scheduler's arguments after the shipped choice
// (sm90_swizzle in tactics.cuh). kStreamK: the stream-K scheduler's arguments (splits, decomposition).
template <bool kStreamK, class SchedulerArguments>
inline void adjust_sm90_scheduler(SchedulerArguments&) {}

// Host side: sets the members ONNXFUSE_HOOK_ACTIVATION_PARAMS_MEMBERS adds to ActivationParams.
template <class ActivationParams>
inline void fill_activation_params(ActivationParams&) {}

}  // namespace onnxfuse::cuda::hooks

// Members added to ActivationParams (activation_math.cuh), the plain data every kernel receives with the
// activation: none.
#define ONNXFUSE_HOOK_ACTIVATION_PARAMS_MEMBERS

// `case` labels added to the switch on ActivationParams::act in apply_activation (activation_math.cuh), ahead
// of its default (the erf form): none. Expanded inside apply_activation<kPrecise, N>(float (&v)[N],
// const ActivationParams& p), where v is the fragment and p its ActivationParams.
#define ONNXFUSE_HOOK_ACTIVATION_CASES(v, p)
