# The CUDA kernel sources (relative to src/cuda/), included by cmake/cuda.cmake. The sm90_* files hold
# Hopper-only (sm_90a) CUTLASS 3 kernels (their sm_80 pass compiles to empty guarded bodies that are never
# launched), sm90_*_swap_ab.cu among them: the few-rows kernels with the operands swapped. The others are the
# portable sm_80+ tactics, the dispatch table, the few-rows (gemv) kernel and the fallback path's in-place
# activation, the staging copy, the attention's row guard and the normalization it folds into. One file per
# (dtype, layout[, tile group]) so that a parallel build compiles the long CUTLASS instantiations side by side.
set(ONNXFUSE_CUDA_KERNEL_SOURCES
  gemm_gelu_dispatch.cu
  gemv_gelu.cu
  sm90_f16_tn_large.cu
  sm90_f16_tn_small.cu
  sm90_f16_nn_large.cu
  sm90_f16_nn_small.cu
  sm90_bf16_tn_large.cu
  sm90_bf16_tn_small.cu
  sm90_bf16_nn_large.cu
  sm90_bf16_nn_small.cu
  sm90_tf32_tn.cu
  sm90_f16_swap_ab.cu
  sm90_bf16_swap_ab.cu
  sm90_tf32_swap_ab.cu
  sm80_f16.cu
  sm80_bf16.cu
  sm80_f32.cu
  fallback_gemm_gelu.cu
  activation_inplace.cu
  copy_rows.cu
  fill_masked_rows.cu
  masked_skip_layer_norm.cu
)
