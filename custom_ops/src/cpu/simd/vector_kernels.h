// The element-wise work of the CPU kernel: bias + activation over a block of fp32 GEMM output while it
// is still in cache, and fp16/bf16 <-> fp32 conversion of operand and result blocks.
//
// Two implementations behind one table: AVX2+FMA+F16C (vector_kernels_avx2.cc, compiled with those ISA
// flags) and portable scalar code (vector_kernels.cc). CpuVectorKernels() picks once per process from
// what the CPU reports, so the library runs on any x86-64 and uses the vector path where it exists.
#pragma once

#include <cstddef>
#include <cstdint>

#include "activation.h"

namespace onnxfuse::cpu {

struct VectorKernels {
  const char* name;
  // y[r*ldy + c] = act(y[r*ldy + c] + bias[c]) for r < rows, c < cols; bias may be nullptr.
  void (*bias_activation)(float* y, int64_t ldy, int64_t rows, int64_t cols, const float* bias, Activation act,
                          float alpha);
  void (*half_to_float)(const uint16_t* in, float* out, size_t n);
  void (*float_to_half)(const float* in, uint16_t* out, size_t n);  // round to nearest even
  void (*bfloat16_to_float)(const uint16_t* in, float* out, size_t n);
  void (*float_to_bfloat16)(const float* in, uint16_t* out, size_t n);  // round to nearest even
};

// The fastest implementation this CPU supports. ONNXFUSE_CPU_ISA=scalar forces the portable one
// (tests use it to check both paths against the same reference).
const VectorKernels& CpuVectorKernels();

const VectorKernels& ScalarVectorKernels();
// nullptr when the library was built without the AVX2 implementation.
const VectorKernels* Avx2VectorKernels();

}  // namespace onnxfuse::cpu
