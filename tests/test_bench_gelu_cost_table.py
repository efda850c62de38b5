"""bench/gelu_cost_table.py: the "GELU for free" verdicts from bench/cuda_kernel.py rows. Each goal must be
judged against its own bar (1.05x the plain GEMM below K = 1024, 1.00x from it; cuBLASLt's tanh epilogue; the
erf form for tanh and sigmoid; ORT's error), and a shape that meets them all must give no miss."""

from __future__ import annotations

import gzip
import json
import sys

from tests.bench_scripts import load_bench_script

gct = load_bench_script("gelu_cost_table")


def _row(m, k, n, form, fused, gemm=10.0, epilogue=12.0, err=1e-4, ort_err=2e-4, dtype="fp16"):
    return {"dtype": dtype, "M": m, "K": k, "N": n, "approximate": form, "fused_gpu_us": fused,
            "cublas_mm_gpu_us": gemm, "ort_matmul_gpu_us": gemm + 0.5, "cublaslt_tanh_gpu_us": epilogue,
            "fused_relerr": err, "unfused_relerr": ort_err, "fused_finite": True}


def _shape(m, k, n, erf, tanh, sigmoid, **kw):
    return [_row(m, k, n, "none", erf, **kw), _row(m, k, n, "tanh", tanh, **kw), _row(m, k, n, "sigmoid", sigmoid, **kw)]


def test_a_shape_within_every_goal_has_no_miss():
    table, misses = gct.build_table(_shape(4096, 384, 1536, 10.5, 10.4, 10.5))
    assert misses == []
    assert "| fp16 | 4096×384×1536 | 10.0 | 10.5 | **1.05** | 1.05 |" in table


def test_the_bar_is_1_05_below_k_1024_and_1_00_from_it():
    _, shallow = gct.build_table(_shape(4096, 768, 3072, 10.6, 10.6, 10.6))
    _, deep = gct.build_table(_shape(4096, 1024, 4096, 10.2, 10.2, 10.2))
    _, deep_met = gct.build_table(_shape(4096, 1024, 4096, 10.0, 10.0, 10.0))
    assert shallow == ["fp16 4096x768x3072: erf 1.06x the plain GEMM (goal <= 1.05x)"]
    assert deep == ["fp16 4096x1024x4096: erf 1.02x the plain GEMM (goal <= 1.00x)"]
    assert deep_met == []


def test_the_plain_gemm_is_the_faster_of_cublas_and_ort():
    rows = _shape(64, 384, 1536, 4.2, 4.2, 4.2, gemm=4.0)
    for r in rows:
        r["ort_matmul_gpu_us"] = 3.9
    _, misses = gct.build_table(rows)
    assert misses == ["fp16 64x384x1536: erf 1.08x the plain GEMM (goal <= 1.05x)"]


def test_erf_slower_than_the_tanh_epilogue_and_forms_slower_than_erf_are_misses():
    _, misses = gct.build_table(_shape(1, 768, 3072, 9.0, 9.1, 8.9, gemm=10.0, epilogue=8.5))
    assert misses == ["fp16 1x768x3072: erf 9.0 µs > cuBLASLt tanh epilogue 8.5 µs (1.06x)",
                      "fp16 1x768x3072: tanh 9.1 µs > erf 9.0 µs"]


def test_error_over_ort_and_non_finite_outputs_are_misses():
    rows = _shape(8, 384, 1536, 8.0, 8.0, 8.0)
    rows[1]["fused_relerr"] = 3e-4
    rows[2]["fused_finite"] = False
    _, misses = gct.build_table(rows)
    assert misses == ["fp16 8x384x1536 tanh: error 3.00e-04 against ORT's 2.00e-04",
                      "fp16 8x384x1536 sigmoid: error 1.00e-04 against ORT's 2.00e-04, not finite"]


def test_main_reads_gzipped_results_and_refuses_unreadable_ones(tmp_path, capsys):
    good = tmp_path / "r.json.gz"
    with gzip.open(good, "wt") as f:
        json.dump({"rows": _shape(4096, 384, 1536, 13.0, 12.0, 12.5)}, f)
    assert gct.main([str(good)]) == 0
    out = capsys.readouterr().out
    assert "**1.30**" in out and "Goals: 2 missed" in out
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert gct.main([str(bad)]) == 2
    assert capsys.readouterr().err.startswith("gelu_cost_table: error: cannot read the results")


def test_the_peer_epilogue_is_held_to_the_same_bar_and_counted():
    shallow_met = _shape(4096, 384, 1536, 12.0, 12.0, 12.0, gemm=10.0, epilogue=10.5)   # 1.05x at K < 1024: met
    shallow_missed = _shape(64, 768, 3072, 4.0, 4.0, 4.0, gemm=3.0, epilogue=3.2)       # 1.07x: missed
    deep_missed = _shape(4096, 1024, 4096, 50.0, 50.0, 50.0, gemm=48.0, epilogue=48.5)  # 1.01x at K >= 1024: missed
    rows = shallow_met + shallow_missed + deep_missed
    rows.append(dict(rows[0], dtype="fp32"))  # fp32 rows are outside the 16-bit goal
    assert gct.epilogue_within_goal(rows) == (1, 3)
    table, _ = gct.build_table(shallow_met)
    assert "| 10.5 | 1.05 | 1.14 |" in table  # epilogue µs, epilogue ÷ GEMM, erf ÷ epilogue


def test_erf_against_the_peer_epilogue_counts_from_unrounded_times():
    rows = (_shape(8, 384, 1536, 12.0, 12.0, 12.0, epilogue=12.0)          # 1.00: at or below
            + _shape(64, 384, 1536, 12.6, 12.6, 12.6, epilogue=12.0)       # 1.05: within
            + _shape(128, 384, 1536, 12.61, 12.61, 12.61, epilogue=12.0))  # 1.0508: prints 1.05, but beyond
    assert gct.erf_against_epilogue(rows) == (1, 2, 3)
