"""bench/e2e.py's table and goal verdicts (the device run prints them; a wrong verdict would misreport
the issue's goal). Building and timing the models needs torch and a GPU: that part runs on the device."""

from __future__ import annotations


import pytest

from tests.bench_scripts import load_bench_script

e2e = load_bench_script("e2e")


def _timing(ms: float, stable: bool = True) -> dict:
    return {"median_ms": ms, "p90_ms": ms * 1.1, "stable": stable}


def _run(latencies: dict[int, tuple[float, float]]) -> dict:
    """batch -> (baseline ms, onnxfuse ms), as bench.ModelBenchReport.to_dict() writes them."""
    return {"results": [
        {"batch": b, "baseline": _timing(base), "optimized": _timing(opt), "speedup": base / opt}
        for b, (base, opt) in latencies.items()
    ]}


def test_goal_met_and_missed():
    records = [
        {"model": "bert-base", "runs": {"default": _run({1: (2.0, 1.9), 8: (2.1, 2.0), 32: (3.4, 3.0)})}},
        # 9.1 % lower latency at B=32 is short of the 10 % goal; B=1 slower
        {"model": "gpt2-small", "runs": {"default": _run({1: (2.0, 2.02), 8: (2.5, 2.4), 32: (4.4, 4.0)})}},
    ]
    bert, gpt2 = e2e.verdicts(records)
    assert "never slower: PASS" in bert and "B=32 latency cut +11.8%" in bert and bert.endswith("PASS")
    assert "never slower: FAIL (worst 0.990× at B=1)" in gpt2
    assert "B=32 latency cut +9.1% (goal ≥ 10%): FAIL" in gpt2


def test_table_rows_and_failed_runs():
    records = [
        {"model": "vit-b16", "runs": {
            "default": _run({1: (1.0, 0.8), 32: (4.0, 3.0)}),
            "cuda_graph": {"error": "BadInputError: This session cannot use the CUDA Graph feature"},
        }},
    ]
    lines = e2e.table(records, 128)
    assert lines[2] == "| vit-b16 | 1 images | off | 1.000 / 1.100 | 0.800 / 0.880 | 1.250× | +20.0% |"
    assert lines[3].startswith("| vit-b16 | 32 images | off |")
    assert lines[4] == "| vit-b16 | – | on | not measured: BadInputError: This session cannot use the CUDA Graph feature | | | |"
    assert e2e.verdicts(records) == [
        "vit-b16 [default]: never slower: PASS (worst 1.250× at B=1); B=32 latency cut +25.0% (goal ≥ 10%): PASS"
    ]


# (hidden, layers) as published: ModernBERT-base has 22 layers, BERT-large 24 of 1024, all-MiniLM-L6-v2 6 of 384
PUBLISHED = {"modernbert-base": (768, 22), "bert-large": (1024, 24), "minilm-l6": (384, 6)}


@pytest.mark.parametrize("name", [s.name for s in e2e.SPECS])
def test_full_size_configs_are_the_published_ones(name):
    spec = next(s for s in e2e.SPECS if s.name == name)
    hidden = spec.full.get("hidden_size", spec.full.get("n_embd"))
    layers = spec.full.get("num_hidden_layers", spec.full.get("n_layer", spec.full.get("num_layers")))
    assert (hidden, layers) == PUBLISHED.get(name, (768, 12))
    if name == "vit-b16":
        assert (spec.full["image_size"], spec.full["patch_size"]) == (224, 16)


def test_sdpa_export_goal():
    """On the default (sdpa) export the B=32 goal is a 1.6× speedup, judged next to the 10 % one."""
    records = [
        {"model": "vit-b16", "attn": "sdpa", "runs": {"default": _run({1: (2.0, 1.5), 32: (16.4, 9.6)})}},
        {"model": "bert-base", "attn": "sdpa", "runs": {"default": _run({1: (2.0, 1.9), 32: (8.0, 6.0)})}},
        {"model": "gpt2-small", "attn": "eager", "runs": {"default": _run({32: (8.0, 6.0)})}},
        # the rotary decoders are held to the 10 % goal only (issue #18 sets 1.6× for the three above)
        {"model": "llama-160m", "attn": "sdpa", "runs": {"default": _run({32: (5.2, 4.4)})}},
    ]
    vit, bert, gpt2, llama = e2e.verdicts(records)
    assert vit.endswith("sdpa export B=32 speedup 1.71× (goal ≥ 1.6×): PASS")
    assert bert.endswith("sdpa export B=32 speedup 1.33× (goal ≥ 1.6×): FAIL")
    assert "sdpa" not in gpt2
    assert llama.endswith("(goal ≥ 10%): PASS") and "sdpa" not in llama


def test_ort_placement_is_the_optimizer_run_users_make():
    # none: the Python fusions alone, as before (use_gpu follows the provider, no session runs);
    # gpu/cpu: its documented run (opt_level 1) with use_gpu=True (Memcpy nodes saved) or False
    assert e2e.ort_settings("none", "cuda") == (True, 0)
    assert e2e.ort_settings("none", "cpu") == (False, 0)
    assert e2e.ort_settings("gpu", "cuda") == (True, 1)
    assert e2e.ort_settings("cpu", "cuda") == (False, 1)
