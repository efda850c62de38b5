"""lab/kernels/sass_diff.py's normalisation: what two builds of the same code differ in (nvcc's path-derived
module ids, in mangled and demangled names) must vanish, and nothing else may. The comparison itself needs
cuobjdump and object files, so it is run by hand (lab/results/sass_diff_*.txt); its rules are checked here."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "onnxfuse_lab_sass_diff", Path(__file__).resolve().parents[1] / "kernels" / "sass_diff.py")
sass_diff = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sass_diff)


def test_module_ids_in_mangled_names_vanish_with_their_length_prefix():
    # Two builds of sm80_f16.cu from different folders: the ids and the counter after them differ.
    a = "_ZN48_INTERNAL_b09a8256_11_sm80_f16_cu_c6d59a88_100164cuda3std3__45__cpo5beginE[1];"
    b = "_ZN48_INTERNAL_4d091276_11_sm80_f16_cu_fecb17ce_255484cuda3std3__45__cpo5beginE[1];"
    assert sass_diff._unmodule(a) == sass_diff._unmodule(b) == "_ZN<module>4cuda3std3__45__cpo5beginE[1];"
    # The counter may have another number of digits: the length prefix, not a guess, says where the id ends.
    c = "_ZN47_INTERNAL_b09a8256_11_sm80_f16_cu_c6d59a88_99994cuda3std3__45__cpo5beginE[1];"
    assert sass_diff._unmodule(c) == sass_diff._unmodule(a)


def test_anonymous_namespace_ids_vanish_in_mangled_and_demangled_names():
    mangled = ("_ZN8onnxfuse4cuda54_GLOBAL__N__4d091276_21_fallback_gemm_gelu_cu_fecb17ce25fallback_gemm_gelu_"
               "kernelIfLb1EEEvPKT_S5_S5_PS3_lllbNS0_16ActivationParamsE_param_2")
    assert sass_diff._unmodule(mangled) == (
        "_ZN8onnxfuse4cuda<module>25fallback_gemm_gelu_kernelIfLb1EEEvPKT_S5_S5_PS3_lllbNS0_16ActivationParamsE_param_2")
    demangled = "onnxfuse::cuda::_INTERNAL_b09a8256_11_sm80_f16_cu_c6d59a88_10016::cuda::std::x<int>"
    assert sass_diff._unmodule(demangled) == "onnxfuse::cuda::<module>::cuda::std::x<int>"


def test_code_and_ordinary_names_are_left_alone():
    for text in ("HMMA.16816.F32 R4, R8, R12, R4 ;  /* 0x0000000c0804723c */",
                 "_ZN7cutlass13device_kernelIN8onnxfuse4cuda22Sm90WarpEpilogueKernelE",
                 "ld.param.u64 %rd1, [_ZN5Li48E_INTERNALX_param_0];"):
        assert sass_diff._unmodule(text) == text


def test_labels_name_the_kernel_layer_tile_cluster_and_stages():
    ppo = ("void cutlass::device_kernel<onnxfuse::cuda::Sm90WarpEpilogueKernel<cutlass::gemm::collective::"
           "CollectiveMma<cutlass::gemm::MainloopSm90TmaGmmaWarpSpecialized<8, cute::tuple<cute::C<1>, cute::C<1>, "
           "cute::C<1> >, cutlass::gemm::KernelTmaWarpSpecializedPingpong>, cute::tuple<cute::C<64>, cute::C<128>, "
           "cute::C<64> >, cutlass::half_t, cute::tuple<long, cute::C<1>, long>>, cutlass::half_t> >(...)")
    assert sass_diff.label(ppo) == "Sm90WarpEpilogueKernel half_t 64x128x64 c1x1 8 stages Pingpong"
    fallback = ("void onnxfuse::cuda::(anonymous namespace)::fallback_gemm_gelu_kernel<__half, false>(__half const*, "
                "long, onnxfuse::cuda::ActivationParams)")
    assert sass_diff.label(fallback) == "onnxfuse::cuda::(anonymous namespace)::fallback_gemm_gelu_kernel<__half, false>"
