#!/usr/bin/env python3
"""float32 with few rows of a large W: which cuBLAS call reads W as fast as ORT's MatMul does.

ORT's CUDA MatMul (and Gemm) for float32 is one legacy ``cublasSgemm`` on its own handle, with
``CUBLAS_TF32_TENSOR_OP_MATH`` while its ``use_tf32`` option is on (the default). The fallback path of the op
calls cuBLASLt instead, and at 4-16 rows of 4096x16384 it measured 84-88 µs against ORT's 72-77 µs
(bench/results/cuda_kernel_never_slower_h200.md). This times, by CUPTI, in one process:

* ``ort_matmul``: ORT's MatMul with W [K, N] (what an unfused graph runs);
* ``ort_gemm_tb``: ORT's Gemm with transB = 1, W [N, K] (the layout the optimizer writes for the op);
* ``sgemm_nn`` / ``sgemm_tn``: ``cublasSgemm`` through ctypes on a handle of our own, for both layouts, with
  the TF32 math mode and with the default one.

    python3 lab/kernels/cublas_fp32_few_rows.py > $OUT/cublas_fp32_few_rows.txt   (needs torch with CUDA)
"""
from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np
import torch
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.cupti import kernel_times_us  # noqa: E402

import onnxruntime as ort  # noqa: E402

ort.set_default_logger_severity(3)

ROWS = (1, 2, 4, 8, 16)
SHAPES = ((4096, 16384), (1024, 4096), (768, 3072), (1000, 3000), (4095, 1023))
OP_N, OP_T = 0, 1
DEFAULT_MATH, TF32_MATH = 0, 3


def cublas():
    torch.cuda.init()  # torch's cuBLAS (CUDA 12 or 13) is then in the process
    for soname in ("libcublas.so.13", "libcublas.so.12"):
        try:
            lib = ctypes.CDLL(soname)
            break
        except OSError:
            continue
    handle = ctypes.c_void_p()
    assert lib.cublasCreate_v2(ctypes.byref(handle)) == 0
    lib.cublasSgemm_v2.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                   ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                   ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    lib.cublasSetStream_v2(handle, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    return lib, handle


def ort_session(K: int, N: int, trans_b: bool, w: np.ndarray) -> ort.InferenceSession:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", K])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", N])
    weight = numpy_helper.from_array(w.T.copy() if trans_b else w, "w")
    node = (helper.make_node("Gemm", ["x", "w"], ["y"], transB=1) if trans_b else
            helper.make_node("MatMul", ["x", "w"], ["y"]))
    model = helper.make_model(helper.make_graph([node], "g", [x], [y], [weight]),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CUDAExecutionProvider"])
    return sess


def main() -> None:
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, onnxruntime {ort.__version__}")
    lib, handle = cublas()
    one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
    rng = np.random.default_rng(0)
    for K, N in SHAPES:
        w = rng.standard_normal((K, N), dtype=np.float32)
        w_kn = torch.from_numpy(w).cuda()          # [K, N]
        w_nk = w_kn.t().contiguous()               # [N, K]
        sessions = {tb: ort_session(K, N, tb, w) for tb in (False, True)}
        for M in ROWS:
            x = torch.randn(M, K, device="cuda")
            y = torch.empty(M, N, device="cuda")
            x_ort = ort.OrtValue.ortvalue_from_numpy(x.cpu().numpy(), "cuda", 0)
            calls = {}
            for tb, sess in sessions.items():
                binding = sess.io_binding()
                binding.bind_ortvalue_input("x", x_ort)
                binding.bind_output("y", "cuda")
                calls["ort_gemm_tb" if tb else "ort_matmul"] = (lambda s=sess, b=binding: s.run_with_iobinding(b))

            def sgemm(trans_b: bool, math: int):
                def run():
                    lib.cublasSetMathMode(handle, math)
                    # row-major Y[M,N] = X·W is column-major Yᵀ[N,M] = op(W)·Xᵀ
                    if trans_b:
                        lib.cublasSgemm_v2(handle, OP_T, OP_N, N, M, K, ctypes.byref(one), w_nk.data_ptr(), K,
                                           x.data_ptr(), K, ctypes.byref(zero), y.data_ptr(), N)
                    else:
                        lib.cublasSgemm_v2(handle, OP_N, OP_N, N, M, K, ctypes.byref(one), w_kn.data_ptr(), N,
                                           x.data_ptr(), K, ctypes.byref(zero), y.data_ptr(), N)
                return run

            for tb in (False, True):
                for math, label in ((TF32_MATH, "tf32"), (DEFAULT_MATH, "fp32")):
                    calls[f"sgemm_{'tn' if tb else 'nn'}_{label}"] = sgemm(tb, math)
            for label, fn in calls.items():
                per_kernel = kernel_times_us(fn, reps=30, warmup=5)
                total = sum(us for name, us in per_kernel.items() if not name.startswith("Memcpy"))
                names = "; ".join(f"{name[:70]} {us:.1f}" for name, us in sorted(per_kernel.items(), key=lambda kv: -kv[1]))
                print(f"{M}x{K}x{N} {label:14s} {total:8.1f} us  {names}", flush=True)


if __name__ == "__main__":
    main()
