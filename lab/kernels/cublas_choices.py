#!/usr/bin/env python3
"""Which kernel cuBLAS runs for each shape: the plain GEMM (torch.mm) and cuBLASLt's bias + tanh-GELU epilogue
(torch._addmm_activation), fp16, W [N, K], with their GPU time from CUPTI (torch.profiler). On Hopper the names
of cuBLAS's nvjet kernels carry their configuration (tile MxN, K step x stages, cluster, schedule), which is
what to compare our tactic table against (lab/kernels/NOTES.md).

    python3 lab/kernels/cublas_choices.py > $OUT/cublas_choices.txt      (needs torch with CUDA)
"""
import torch
from torch.profiler import ProfilerActivity, profile

SHAPES = [(128, 768, 3072), (512, 768, 3072), (1024, 768, 3072), (1576, 768, 3072), (2048, 768, 3072),
          (4096, 768, 3072), (6304, 768, 3072), (16384, 768, 3072), (128, 1024, 4096), (1024, 1024, 4096),
          (4096, 1024, 4096)]


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    for M, K, N in SHAPES:
        x = torch.randn(M, K, device="cuda", dtype=torch.float16)
        w = torch.randn(N, K, device="cuda", dtype=torch.float16)
        b = torch.randn(N, device="cuda", dtype=torch.float16)
        calls = {"mm": lambda: torch.mm(x, w.t()),
                 "addmm_gelu": lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True)}
        for label, fn in calls.items():
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as p:
                for _ in range(20):
                    fn()
                torch.cuda.synchronize()
            kernels = {}
            for e in p.events():
                if str(getattr(e, "device_type", "")).endswith("CUDA") and not e.name.startswith("Memset"):
                    us = getattr(e, "device_time", None) or getattr(e, "cuda_time", 0.0)
                    n_t = kernels.setdefault(e.name, [0, 0.0])
                    n_t[0] += 1
                    n_t[1] += us
            for name, (n, us) in kernels.items():
                print(f"{M}x{K}x{N} {label:10s} {us / n:7.1f} us  {name}")


if __name__ == "__main__":
    main()
