// The kernel lab's hook points: the replacement of the shipped custom_ops/src/cuda/hooks/kernel_hooks.cuh that
// build.sh's OFK_EXPLORE=sched build puts first on the include path (-Ilab/kernels/hooks), so that every kernel
// of that build, the shipped ones included, carries the lab's instruments:
//   - the tile scheduler's arguments from the environment on every sm90 launch (explore/scheduler_knobs.h);
//   - an epilogue timeline buffer in ActivationParams (explore/epilogue_trace.h);
//   - extra activation codes: no activation, chained groups, traced epilogues (explore/epilogue_groups.h).
// It defines every hook of the shipped header, with the same meaning.
#pragma once

#include "../explore/epilogue_groups.h"
#include "../explore/epilogue_trace.h"
#include "../explore/scheduler_knobs.h"

namespace onnxfuse::cuda::hooks {

template <bool kStreamK, class SchedulerArguments>
inline void adjust_sm90_scheduler(SchedulerArguments& s) {
  ofk_explore::apply_scheduler_knobs(s);
  if constexpr (kStreamK) ofk_explore::apply_stream_k_knobs(s);
}

template <class ActivationParams>
inline void fill_activation_params(ActivationParams& p) {
  p.trace = ofk_explore::trace_buffer;  // null unless run_device.py's trace mode set one (ofk_set_trace)
}

}  // namespace onnxfuse::cuda::hooks

#define ONNXFUSE_HOOK_ACTIVATION_PARAMS_MEMBERS unsigned long long* trace = nullptr;
#define ONNXFUSE_HOOK_ACTIVATION_CASES(v, p) OFK_EXPLORE_ACTIVATION_CASES(v, p)
