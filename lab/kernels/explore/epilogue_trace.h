// Kernel lab only (build.sh with OFK_EXPLORE=sched, through hooks/kernel_hooks.cuh): a timeline of the
// epilogue. With a trace buffer set (ofk_set_trace in harness.cu), the activation codes -7 (erf) and -8 (no
// activation) make lane 0 of every warp that runs the activation record the SM's clock when its fragment's math
// starts and when it ends, with the SM, the warp and the CTA: run_device.py's `trace` mode turns that into, per
// SM and consumer warpgroup, how long the math takes, how far apart the epilogue steps of one tile are, and how
// the two warpgroups' epilogues follow each other (lab/kernels/NOTES.md, v6).
// Buffer: [0] a record counter, then records of two u64: the clock, and smid | warp << 8 | end << 16 |
// blockIdx.x << 20.
#pragma once

namespace ofk_explore {

inline unsigned long long* trace_buffer = nullptr;  // host side: what the next launches record into
constexpr unsigned kTraceCapacity = 1u << 20;        // records

#ifdef __CUDACC__
__device__ __forceinline__ void trace_point(unsigned long long* buf, unsigned end) {
  if (buf == nullptr || (threadIdx.x & 31) != 0) return;
  unsigned long long clock;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(clock)::"memory");
  unsigned smid;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  const unsigned long long slot = atomicAdd(buf, 1ull);
  if (slot >= kTraceCapacity) return;
  buf[1 + 2 * slot] = clock;
  buf[2 + 2 * slot] = smid | (threadIdx.x / 32) << 8 | end << 16 | static_cast<unsigned long long>(blockIdx.x) << 20;
}
#endif

}  // namespace ofk_explore
