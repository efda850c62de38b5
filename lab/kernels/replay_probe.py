#!/usr/bin/env python3
"""Where a grid cell's wall time goes: the same variants as `bench/cuda_kernel.py --grid`, measured four ways.

The grid judges GPU time by CUPTI over back-to-back calls (W stays in L2 when it fits) and wall time by CUDA-graph
replays interleaved across variants (each variant's W is evicted by the others'). Where the two verdicts disagree
(auto faster on the GPU, slower on the wall) this probe tells which the cell's truth is:

  warm   CUPTI, back-to-back calls of one plain session (the grid's GPU column);
  cold   CUPTI, each call after a write of a buffer larger than L2 (what a layer of a model sees: every other
         layer's weights passed through L2 since its last call);
  replay CUPTI over the interleaved graph replays themselves: the kernels' time inside the wall measurement;
  wall   host wall of those replays, interleaved, and of each variant's replays back to back.

    python3 lab/kernels/replay_probe.py --library $ONNXFUSE_LIBRARY --cells fp32:1:4095:1023 fp32:8:4096:16384
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import cuda_kernel as ck  # noqa: E402  (bench/cuda_kernel.py)

FLUSH_BYTES = 1 << 30  # past any L2 (H200: 60 MiB) and every variant's W


def kernel_spans(events, labels):
    """Per label (a host range around one synchronized call): sum of the kernels' durations inside it (µs), and
    their count."""
    kernels = [(e.time_range.start, e.time_range.end, e.name) for e in events
               if str(getattr(e, "device_type", "")).endswith("CUDA") and not e.name.startswith("seg")]
    ranges = {e.name: (e.time_range.start, e.time_range.end) for e in events if e.name in labels}
    out = {}
    for label in labels:
        s, t = ranges[label]
        inside = [(a, b, n) for a, b, n in kernels if s <= a and b <= t]
        out[label] = (sum(b - a for a, b, _ in inside), len(inside), sorted({n[:60] for *_, n in inside}))
    return out


def probe(bench, dt, M, K, N, form, variants, rounds, flush):
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    tt = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dt]
    torch.manual_seed(0)
    x = torch.randn(M, K, device="cuda", dtype=tt)
    W = (torch.randn(N, K, device="cuda", dtype=torch.float32) / math.sqrt(K)).to(tt)
    B = (torch.randn(N, device="cuda", dtype=torch.float32) * 0.1).to(tt)
    models = {v: ck.build_model("unfused" if v == "unfused" else "fused", "M", K, N, dt, W, B, form,
                                cuda_path=v if v in ck.CUDA_PATHS else None) for v in variants}
    ys = {v: torch.empty(M, N, device="cuda", dtype=tt) for v in variants}
    cell = {"dtype": dt, "M": M, "K": K, "N": N, "approximate": form}

    def profiled(calls_in_order, before=None):
        labels = [f"seg{i}" for i in range(len(calls_in_order))]
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            for label, (_, fn) in zip(labels, calls_in_order):
                if before is not None:
                    before()
                with record_function(label):
                    torch.cuda.synchronize()
                    fn()
                    torch.cuda.synchronize()
        spans = kernel_spans(p.events(), set(labels))
        per = {}
        for label, (v, _) in zip(labels, calls_in_order):
            per.setdefault(v, []).append(spans[label])
        return {v: {"us": statistics.median(s[0] for s in xs), "kernels": xs[0][1], "names": xs[0][2]}
                for v, xs in per.items()}

    plain = {v: bench.session(models[v], cuda_graph=False) for v in variants}
    pb = {v: bench.bind(plain[v], x, ys[v]) for v in variants}
    prun = {v: functools.partial(plain[v].run_with_iobinding, pb[v]) for v in variants}
    for v in variants:
        for _ in range(bench.warmup):
            prun[v]()
    warm = profiled([(v, prun[v]) for v in variants for _ in range(rounds)])
    cold = profiled([(v, prun[v]) for _ in range(rounds) for v in variants], before=lambda: flush.zero_())
    for v in variants:
        cell[f"{v}_warm_us"] = warm[v]["us"]
        cell[f"{v}_cold_us"] = cold[v]["us"]
        cell[f"{v}_kernels"] = warm[v]["names"]
    del pb, plain, prun

    graphed = {v: bench.session(models[v], cuda_graph=True) for v in variants}
    calls = {}
    for v in variants:
        calls[v] = functools.partial(graphed[v].run_with_iobinding, bench.bind(graphed[v], x, ys[v]))
        for _ in range(bench.warmup):
            calls[v]()
    order = ck.interleaved_rounds(list(variants), rounds)
    replay = profiled([(v, calls[v]) for _, v in order])
    inter = ck.interleaved_wall_us(calls, rounds)
    for v in variants:
        cell[f"{v}_replay_us"] = replay[v]["us"]
        cell[f"{v}_replay_kernels"] = replay[v]["kernels"]
        cell[f"{v}_wall_interleaved_us"] = inter[v]
        ts = []
        for _ in range(rounds):
            t = time.perf_counter()
            calls[v]()
            ts.append(time.perf_counter() - t)
        cell[f"{v}_wall_solo_us"] = statistics.median(ts) * 1e6
    del calls, graphed
    torch.cuda.empty_cache()
    return cell


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--library", required=True)
    ap.add_argument("--cells", nargs="+", required=True, help="dtype:M:K:N[:form]")
    ap.add_argument("--variants", nargs="+", default=["auto", "fused", "fallback", "gemv", "unfused"])
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    import torch

    bench = ck.Bench(args.library, warmup=10, reps=args.rounds, prof_reps=args.rounds, pyc=ck.PyCudaDevice())
    flush = torch.empty(FLUSH_BYTES // 4, device="cuda", dtype=torch.float32)
    out = []
    for spec in args.cells:
        dt, M, K, N, *rest = spec.split(":")
        M, K, N = int(M), int(K), int(N)
        variants = [v for v in args.variants if not ck.path_skip_reason(v, M)]
        cell = probe(bench, dt, M, K, N, rest[0] if rest else "none", variants, args.rounds, flush)
        out.append(cell)
        print(f"\n{spec}")
        print(f"  {'variant':9} {'warm':>7} {'cold':>7} {'replay':>7} {'wall-il':>8} {'wall-solo':>9}  kernels")
        for v in variants:
            print(f"  {v:9} {cell[v + '_warm_us']:7.1f} {cell[v + '_cold_us']:7.1f} {cell[v + '_replay_us']:7.1f} "
                  f"{cell[v + '_wall_interleaved_us']:8.1f} {cell[v + '_wall_solo_us']:9.1f}  {cell[v + '_kernels']}",
                  flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
