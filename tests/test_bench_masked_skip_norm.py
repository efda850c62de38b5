"""bench/masked_skip_norm.py without a GPU: its three graphs compute what they stand for on ORT's CPU provider (the
masked op and the guarded graph agree with the float64 reference; ORT's normalization alone agrees on the rows
the mask keeps), its keep mask has rows that see no key, and the table reads the rows it is given."""

from __future__ import annotations


import numpy as np
import pytest

from onnxfuse.runtime import create_session

from tests.bench_scripts import load_bench_script

msn = load_bench_script("masked_skip_norm")


def test_the_keep_mask_is_causal_with_rows_that_see_no_key():
    keep = msn.keep_mask(4, 16, np.random.default_rng(0))
    assert keep.shape == (4, 1, 16, 16)
    assert not np.triu(keep[:, 0], 1).any()  # causal: no key after the query
    rows_kept = keep.any(axis=-1)[:, 0]
    assert not rows_kept[-1].any()  # the last batch entry is all padding
    assert rows_kept[0, -1] and not rows_kept.all()


@pytest.mark.parametrize("dtype,with_sum", [("fp32", True), ("fp16", False)])
def test_the_three_graphs_compute_what_they_stand_for(dtype, with_sum):
    b, s, d = 3, 8, 64
    rng = np.random.default_rng(1)
    npdt = msn._NUMPY_TYPE[dtype]
    feeds = {"x": rng.standard_normal((b, s, d)).astype(npdt), "skip": rng.standard_normal((b, s, d)).astype(npdt),
             "keep": msn.keep_mask(b, s, rng)}
    kept = feeds["keep"].any(axis=-1)[:, 0]
    tol = 1e-6 if dtype == "fp32" else 1e-3
    outputs = {}
    for variant in msn.VARIANTS:
        model = msn.build(variant, d, dtype, with_sum, np.random.default_rng(2))
        session = create_session(model, providers="cpu")
        y = session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})[0]
        want = msn.reference(feeds, model)
        outputs[variant] = y
        if variant == "ort":
            assert msn.rel_l2(y[kept], want[kept]) < tol
        else:
            assert msn.rel_l2(y, want) < tol
    assert not np.allclose(outputs["ort"][~kept], outputs["masked"][~kept])  # the guard matters there


def test_the_table_has_a_line_per_row():
    row = {"B": 32, "S": 128, "D": 768, "dtype": "fp16", "sum_output": True, "masked_gpu_us": 6.33,
           "guard+ort_gpu_us": 9.68, "ort_gpu_us": 5.53, "masked_over_ort": 1.145, "masked_relerr": 2.08e-4,
           "guard+ort_relerr": 3.35e-4}
    lines = msn.table([row, row]).splitlines()
    assert len(lines) == 4 and "| 32×128×768 | fp16 | yes | 6.33 | 9.68 | 5.53 | 1.145 |" in lines[2]


def test_the_verdict_judges_the_rows_the_rule_folds_against_what_they_replace():
    def row(d, dtype, masked, guarded):
        return {"D": d, "dtype": dtype, "masked_over_guard_ort": masked / guarded}

    # H200 rows: 768 fp16 and fp32 within the reach; 4096 fp16 past it (slower there, so the rule leaves it)
    rows = [row(768, "fp16", 6.33, 9.73), row(768, "fp32", 13.97, 22.06), row(4096, "fp16", 63.55, 54.04)]
    assert msn.verdict(rows).startswith("within the fold's reach, masked < guard + ORT SLN in every row: PASS")
    assert "2 rows; 1 past the reach" in msn.verdict(rows)
    assert ": FAIL" in msn.verdict([row(1536, "fp16", 10.0, 9.0)])  # a width the rule folds, slower: FAIL
    assert not msn.folded({"D": 776, "dtype": "fp32"}) and msn.folded({"D": 1536, "dtype": "fp16"})
