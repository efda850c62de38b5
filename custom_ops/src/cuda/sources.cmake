# The CUDA kernel sources (relative to src/cuda/), included by cmake/cuda.cmake; nvcc compiles them into one
# object library. The instantiations/sm90_* files hold Hopper-only (sm_90a) CUTLASS 3 kernels, compiled for
# sm_90a alone (cmake/cuda.cmake), sm90_*_swap_ab.cu among them: the few-rows kernels with the operands swapped.
# The others are the portable sm_80+ tactics, the dispatch table, the few-rows (gemv) kernel and the fallback
# path's in-place activation, the staging copy, the attention's row guard and the normalization it folds into.
# One instantiation file per (dtype, layout[, tile group]) so that a parallel build compiles the long CUTLASS
# instantiations side by side.
set(ONNXFUSE_CUDA_KERNEL_SOURCES
  dispatch/gemm_gelu_dispatch.cu
  kernels/gemv_gelu.cu
  instantiations/sm90_f16_tn_large.cu
  instantiations/sm90_f16_tn_small.cu
  instantiations/sm90_f16_nn_large.cu
  instantiations/sm90_f16_nn_small.cu
  instantiations/sm90_bf16_tn_large.cu
  instantiations/sm90_bf16_tn_small.cu
  instantiations/sm90_bf16_nn_large.cu
  instantiations/sm90_bf16_nn_small.cu
  instantiations/sm90_tf32_tn.cu
  instantiations/sm90_f16_swap_ab.cu
  instantiations/sm90_bf16_swap_ab.cu
  instantiations/sm90_tf32_swap_ab.cu
  instantiations/sm80_f16.cu
  instantiations/sm80_bf16.cu
  instantiations/sm80_f32.cu
  kernels/fallback_gemm_gelu.cu
  kernels/activation_inplace.cu
  kernels/copy_rows.cu
  kernels/fill_masked_rows.cu
  kernels/masked_skip_layer_norm.cu
)
