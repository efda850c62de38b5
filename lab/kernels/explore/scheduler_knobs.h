// Kernel lab only (build.sh with OFK_EXPLORE=sched, through hooks/kernel_hooks.cuh): the persistent tile
// scheduler's runtime arguments taken from the environment on every launch, so that run_device.py can sweep
// them in one process without a rebuild. The shipped library never includes this file.
//   OFK_RASTER   0 CUTLASS's heuristic (the default) | 1 along M | 2 along N
//   OFK_SWIZZLE  max swizzle size 1 | 2 | 4 | 8 (unset: the shipped choice, sm90_swizzle in tactics.cuh)
//   OFK_SPLITS   stream-K tactics: split-K factor (1: none)
//   OFK_DECOMP   stream-K tactics: 0 heuristic | 1 data-parallel | 2 split-K | 3 stream-K
// The enum values are CUTLASS's (RasterOrderOptions, DecompositionMode), cast to the argument's own type.
#pragma once

#include <cstdlib>

namespace ofk_explore {

inline int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

template <class SchedulerArguments>
void apply_scheduler_knobs(SchedulerArguments& s) {
  s.raster_order = static_cast<decltype(s.raster_order)>(env_int("OFK_RASTER", 0));
  s.max_swizzle_size = env_int("OFK_SWIZZLE", s.max_swizzle_size);  // unset: the shipped choice
}

template <class StreamKArguments>
void apply_stream_k_knobs(StreamKArguments& s) {
  s.splits = env_int("OFK_SPLITS", 1);
  s.decomposition_mode = static_cast<decltype(s.decomposition_mode)>(env_int("OFK_DECOMP", 0));
}

}  // namespace ofk_explore
