// The device facts the kernels' launch code reads (gemm_gelu.h's DeviceInfo), for the lab's C ABIs: harness.cu and
// gemv_mma_lab.cu (the product reads them once per kernel instance through ORT's device).
#pragma once

#include <cuda_runtime.h>

#include "cuda/dispatch/gemm_gelu.h"

inline onnxfuse::cuda::DeviceInfo lab_device_info() {
  onnxfuse::cuda::DeviceInfo d;
  cudaGetDevice(&d.device);
  cudaDeviceGetAttribute(&d.cc_major, cudaDevAttrComputeCapabilityMajor, d.device);
  cudaDeviceGetAttribute(&d.cc_minor, cudaDevAttrComputeCapabilityMinor, d.device);
  cudaDeviceGetAttribute(&d.sm_count, cudaDevAttrMultiProcessorCount, d.device);
  cudaDeviceGetAttribute(&d.l2_bytes, cudaDevAttrL2CacheSize, d.device);
  return d;
}
