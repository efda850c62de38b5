"""bench/e2e_kernels.py's kernel grouping and its table: the GELU kernels' share of the baseline is the bound
it reports for issue #6's latency goal, so a kernel put in the wrong group would misstate that bound.
Profiling itself needs a GPU and runs on the device (bench/results/e2e_kernels_h200.md)."""

from __future__ import annotations

import sys

import pytest

from tests.bench_scripts import load_bench_script


sys.modules.setdefault("e2e", load_bench_script("e2e"))  # e2e_kernels imports bench/e2e.py by that name
ek = load_bench_script("e2e_kernels")

# Kernel names as CUPTI reported them on the H200 (bench/results/e2e_kernels_h200.json).
NAMES = {
    "nvjet_sm90_hsh_256x128_64x4_1x2_h_bz_coopA_NNT": "GEMM",
    "sm80_xmma_fprop_implicit_gemm_indexed_wo_smem_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x32x16": "GEMM",
    "void onnxruntime::contrib::cuda::VectorizedBiasGeluKernel<__half>(long, __half const*, __half const*, __half*)":
        "GELU (BiasGelu, FastGelu, Gelu)",
    "void onnxruntime::cuda::FastGeluKernel2<256u>(__half2, __half2, __half2, int, int, __half2 const*)":
        "GELU (BiasGelu, FastGelu, Gelu)",
    "_ZN7cutlass13device_kernelINS_4gemm6kernel13GemmUniversalIN8onnxfuse4cuda21CutlassActivationImplE":
        "onnxfuse FusedLinearGelu",
    "void onnxfuse::cuda::(anonymous namespace)::fill_masked_rows_kernel<unsigned int>(onnxfuse::cuda::MaskedRows)":
        "onnxfuse FillMaskedRows",
    "void onnxfuse::cuda::(anonymous namespace)::masked_skip_norm_registers<__half, 3>(onnxfuse::cuda::MaskedSkipNorm)":
        "onnxfuse MaskedSkipLayerNorm",
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_32_64x256x64_4x1x1_cga1x1x1_kernel0_0":
        "fused attention (MHA/Attention)",
    "void onnxruntime::cuda::_SoftmaxWarpForward<__half, __half, float, 8, true>(__half*)": "Softmax",
    "void onnxruntime::cuda::_IsNan<__half>(__half const*, bool*, int)": "IsNaN / Where",
    "void onnxruntime::contrib::cuda::SkipLayerNormKernelSmall<__half, 96u, 8, false>(__half*)": "layer norm",
    "void onnxruntime::cuda::_BinaryElementWise<__half, __half, __half, onnxruntime::cuda::OP_Add<__half>>": ek.OTHER,
}


@pytest.mark.parametrize("name", list(NAMES))
def test_each_kernel_lands_in_its_group(name):
    assert ek.group_of(name) == NAMES[name]


def test_summary_and_table_state_the_bound():
    baseline = ek.summarise({"nvjet_gemm": 700.0, "VectorizedBiasGeluKernel": 200.0, "SkipLayerNormKernel": 100.0})
    fused = ek.summarise({"nvjet_gemm": 400.0, "cutlass_onnxfuse_kernel": 450.0, "SkipLayerNormKernel": 100.0})
    assert baseline["total_us"] == 1000.0 and fused["total_us"] == 950.0
    assert baseline["groups_us"]["GELU (BiasGelu, FastGelu, Gelu)"] == 200.0
    record = {"model": "m", "batch": 32, "profiles": {"baseline": baseline, "onnxfuse": fused},
              "gelu_share_of_baseline": 0.2, "gpu_time_cut": 0.05}
    row = ek.table([record])[-1]
    assert row == "| m | 32 | 1000 | 200 (20.0 %) | 950 | 450 | +5.0 % |"


def test_without_a_gpu_it_says_so_and_exits_2(monkeypatch, capsys):
    monkeypatch.setattr(ek, "cuda_usable", lambda: False)
    monkeypatch.setattr(ek, "preload_cuda_libraries", lambda: None)
    assert ek.main(["--models", "bert-base"]) == 2
    assert "no usable CUDA execution provider" in capsys.readouterr().err
