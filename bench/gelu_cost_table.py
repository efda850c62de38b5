#!/usr/bin/env python3
"""What GELU costs the fused kernel over the plain GEMM, per shape, from ``bench/cuda_kernel.py`` JSON files:
the ratio table and the verdicts of the "GELU for free" goals, as markdown.

The goals, per dtype and M×K×N, fp16/bf16:

* exact erf: fused GPU time <= 1.05x the best plain GEMM (the faster of cuBLAS's ``mm`` and ORT's MatMul, both
  without bias, measured in the same run), <= 1.00x at K >= 1024;
* exact erf <= cuBLASLt's tanh-GELU epilogue (``torch._addmm_activation``, the cheaper form);
* the tanh and sigmoid forms no slower than exact erf;
* every form's error <= ORT's unfused path's, outputs finite.

A comparison has no tolerance here: the ratio is printed and the reader sees how far a miss is. The JSON files
must come from runs with ``--forms none tanh sigmoid`` (rows of a missing form show "-").

The table also prints what the peer's own fused epilogue costs over the same GEMM ("epilogue ÷ GEMM") and counts
the cells where it would meet the first goal: cuBLASLt applies a cheaper GELU than exact erf, so that count is
the reference for what an epilogue can cost on the GPU that ran the grid.

    python3 bench/gelu_cost_table.py bench/results/gelu_cost_grid_h200_fp16.json.gz ... > table.md
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

FORMS = ("none", "tanh", "sigmoid")
DEEP_K = 1024  # from this K the goal is the plain GEMM's time itself
GOAL_SHALLOW, GOAL_DEEP = 1.05, 1.00


def load_rows(paths: list[Path]) -> list[dict]:
    rows = []
    for p in paths:
        opener = gzip.open if p.suffix == ".gz" else open
        with opener(p, "rt") as f:
            rows += json.load(f)["rows"]
    return rows


def best_gemm_us(r: dict) -> float:
    return min(r["cublas_mm_gpu_us"], r["ort_matmul_gpu_us"])


def goal_for(k: int) -> float:
    return GOAL_DEEP if k >= DEEP_K else GOAL_SHALLOW


def _cell(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def build_table(rows: list[dict]) -> tuple[str, list[str]]:
    """The markdown table and the list of misses (one line each)."""
    by_shape: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        if r.get("dtype") == "fp32" or "fused_gpu_us" not in r:
            continue
        by_shape.setdefault((r["dtype"], r["M"], r["K"], r["N"]), {})[r["approximate"]] = r
    lines = [
        "| dtype | M×K×N | best GEMM µs | erf µs | **erf ÷ GEMM** | goal | tanh ÷ GEMM | sigmoid ÷ GEMM | "
        "cuBLASLt tanh epilogue µs | epilogue ÷ GEMM | erf ÷ epilogue | tanh ÷ erf | sigmoid ÷ erf | error ÷ ORT's (erf/tanh/sigmoid) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    misses = []
    for (dtype, m, k, n), forms in sorted(by_shape.items(), key=lambda kv: (kv[0][0] != "fp16", kv[0][2], kv[0][1])):
        where = f"{dtype} {m}x{k}x{n}"
        erf = forms.get("none")
        if erf is None:
            continue
        gemm = best_gemm_us(erf)
        ratio = erf["fused_gpu_us"] / gemm
        goal = goal_for(k)
        if ratio > goal:
            misses.append(f"{where}: erf {ratio:.2f}x the plain GEMM (goal <= {goal:.2f}x)")
        epi = erf.get("cublaslt_tanh_gpu_us")
        if epi is not None and erf["fused_gpu_us"] > epi:
            misses.append(f"{where}: erf {erf['fused_gpu_us']:.1f} µs > cuBLASLt tanh epilogue {epi:.1f} µs "
                          f"({erf['fused_gpu_us'] / epi:.2f}x)")
        per_form = {}
        for form in FORMS:
            r = forms.get(form)
            if r is None:
                continue
            per_form[form] = r
            if not r["fused_finite"] or r["fused_relerr"] > r["unfused_relerr"]:
                misses.append(f"{where} {form}: error {r['fused_relerr']:.2e} against ORT's {r['unfused_relerr']:.2e}"
                              f"{'' if r['fused_finite'] else ', not finite'}")
            if form != "none" and r["fused_gpu_us"] > erf["fused_gpu_us"]:
                misses.append(f"{where}: {form} {r['fused_gpu_us']:.1f} µs > erf {erf['fused_gpu_us']:.1f} µs")

        def over_gemm(form):
            r = per_form.get(form)
            return None if r is None else r["fused_gpu_us"] / best_gemm_us(r)

        def over_erf(form):
            r = per_form.get(form)
            return None if r is None else r["fused_gpu_us"] / erf["fused_gpu_us"]

        errors = "/".join(_cell(per_form[f]["fused_relerr"] / per_form[f]["unfused_relerr"], ".2f") if f in per_form
                          else "-" for f in FORMS)
        lines.append(
            f"| {dtype} | {m}×{k}×{n} | {gemm:.1f} | {erf['fused_gpu_us']:.1f} | **{ratio:.2f}** | {goal:.2f} | "
            f"{_cell(over_gemm('tanh'), '.2f')} | {_cell(over_gemm('sigmoid'), '.2f')} | {_cell(epi, '.1f')} | "
            f"{_cell(None if epi is None else epi / gemm, '.2f')} | "
            f"{_cell(None if epi is None else erf['fused_gpu_us'] / epi, '.2f')} | {_cell(over_erf('tanh'), '.2f')} | "
            f"{_cell(over_erf('sigmoid'), '.2f')} | {errors} |")
    return "\n".join(lines), misses


def _erf_rows_with_epilogue(rows: list[dict]) -> list[dict]:
    """The 16-bit exact-erf rows that have both the fused node's time and cuBLASLt's tanh epilogue's: the cells the
    peer comparisons count."""
    return [r for r in rows if r.get("dtype") != "fp32" and r.get("approximate") == "none"
            and "fused_gpu_us" in r and r.get("cublaslt_tanh_gpu_us") is not None]


def epilogue_within_goal(rows: list[dict]) -> tuple[int, int]:
    """(cells where cuBLASLt's tanh epilogue is within the first goal's bar over the best plain GEMM, cells that
    have an epilogue time): what the peer's own fused GELU achieves against the bar the fused node is held to."""
    cells = _erf_rows_with_epilogue(rows)
    met = sum(r["cublaslt_tanh_gpu_us"] / best_gemm_us(r) <= goal_for(r["K"]) for r in cells)
    return met, len(cells)


def erf_against_epilogue(rows: list[dict], slack: float = 1.05) -> tuple[int, int, int]:
    """(cells where exact erf is at or below cuBLASLt's tanh epilogue, cells within ``slack`` times it, cells that
    have both times), from the unrounded times."""
    ratios = [r["fused_gpu_us"] / r["cublaslt_tanh_gpu_us"] for r in _erf_rows_with_epilogue(rows)]
    return sum(q <= 1.0 for q in ratios), sum(q <= slack for q in ratios), len(ratios)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", nargs="+", type=Path, help="bench/cuda_kernel.py results (.json or .json.gz)")
    args = ap.parse_args(argv)
    try:
        rows = load_rows(args.json)
    except (OSError, ValueError, KeyError) as e:
        print(f"gelu_cost_table: error: cannot read the results: {e}", file=sys.stderr)
        return 2
    table, misses = build_table(rows)
    print(table)
    print()
    peer_met, peer_cells = epilogue_within_goal(rows)
    print(f"cuBLASLt's tanh epilogue within the same bar over the GEMM: {peer_met} of {peer_cells} cells")
    below, within, cells = erf_against_epilogue(rows)
    print(f"exact erf against cuBLASLt's tanh epilogue: at or below it at {below} of {cells} cells, "
          f"within 1.05x at {within}")
    print(f"Goals: {'all met' if not misses else f'{len(misses)} missed'}")
    for m in misses:
        print(f"- {m}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
