"""MaskedSkipLayerNormalization on the GPU against what it replaces, in the same process: GPU time (CUPTI) of

* ``masked``: ``ai.onnxfuse.MaskedSkipLayerNormalization`` (the row guard folded into the normalization);
* ``guard+ort``: ``ai.onnxfuse.FillMaskedRows`` then ORT's ``SkipLayerNormalization`` (the graph before the fold);
* ``ort``: ORT's ``SkipLayerNormalization`` alone (what the eager export runs: no guard at all, the floor),

and the masked op's error against a float64 reference of its contract, next to ORT's own error against it.
Shapes of the transformers the fold serves: B×S rows of hidden size D, the flags the attention mask's own
``[B, 1, S, S]`` with a causal keep and left padding (rows that see no key), with and without the sum output
(the residual stream of a pre-norm layer, GPT-2's).

    python3 bench/masked_skip_norm.py --json $OUT/masked_skip_norm.json      (on the GPU machine)

Prints a table and the verdict the rule stands on: within its reach (rows of at most
``guard_into_skip_norm.MAX_ROW_BYTES``) the masked op is faster than the guarded graph it replaces; rows past it
are measured, not judged. ``masked ÷ ORT alone`` says how far each is from the eager export's normalization.
Never fails on the verdict.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from onnxfuse.domain import DOMAIN, DOMAIN_VERSION, FILL_MASKED_ROWS, MASKED_SKIP_NORM  # noqa: E402

EPSILON = 1e-5
# (B, S, D, dtype, sum output): BERT-base and GPT-2 small at batch 32 and 8, BERT-large's width, float32
SHAPES = [(32, 128, 768, "fp16", True), (32, 128, 768, "fp16", False), (8, 128, 768, "fp16", True),
          (32, 128, 1024, "fp16", False), (32, 128, 4096, "fp16", True), (32, 128, 768, "fp32", True)]
VARIANTS = ("masked", "guard+ort", "ort")
_ONNX_TYPE = {"fp16": T.FLOAT16, "fp32": T.FLOAT}
_NUMPY_TYPE = {"fp16": np.float16, "fp32": np.float32}


def build(variant: str, d: int, dtype: str, with_sum: bool, rng) -> onnx.ModelProto:
    """One normalization of the variant, every tensor a graph input of the type but gamma, beta, bias."""
    t, npdt = _ONNX_TYPE[dtype], _NUMPY_TYPE[dtype]
    inits = [numpy_helper.from_array((1 + 0.1 * rng.standard_normal(d)).astype(npdt), "gamma"),
             numpy_helper.from_array((0.1 * rng.standard_normal(d)).astype(npdt), "beta"),
             numpy_helper.from_array((0.2 * rng.standard_normal(d)).astype(npdt), "bias")]
    inputs = [helper.make_tensor_value_info("x", t, ["B", "S", d]),
              helper.make_tensor_value_info("skip", t, ["B", "S", d]),
              helper.make_tensor_value_info("keep", T.BOOL, ["B", 1, "S", "S"])]
    outputs = ["y", "sum"] if with_sum else ["y"]
    ort_outputs = ["y", "", "", "sum"] if with_sum else ["y"]
    if variant == "masked":
        nodes = [helper.make_node(MASKED_SKIP_NORM, ["x", "skip", "keep", "gamma", "beta", "bias"], outputs,
                                  domain=DOMAIN, epsilon=EPSILON)]
    else:
        first = "x"
        nodes = []
        if variant == "guard+ort":
            nodes.append(helper.make_node(FILL_MASKED_ROWS, ["x", "keep"], ["guarded"], domain=DOMAIN))
            first = "guarded"
        nodes.append(helper.make_node("SkipLayerNormalization", [first, "skip", "gamma", "beta", "bias"],
                                      ort_outputs, domain="com.microsoft", epsilon=EPSILON))
    graph = helper.make_graph(nodes, variant, inputs if variant != "ort" else inputs[:2],
                              [helper.make_tensor_value_info(o, t, ["B", "S", d]) for o in outputs], inits)
    return helper.make_model(graph, ir_version=9, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1), helper.make_opsetid(DOMAIN, DOMAIN_VERSION)])


def keep_mask(b: int, s: int, rng) -> np.ndarray:
    """The attention mask's keep [B, 1, S, S]: causal, with left padding of random length per batch entry
    (its first rows see no key) and one entry all padding."""
    causal = np.tril(np.ones((s, s), bool))
    pad = rng.integers(0, s // 4, size=b)
    pad[-1] = s
    keys_kept = np.arange(s)[None, :] >= pad[:, None]
    return (causal[None] & keys_kept[:, None, :])[:, None]


def reference(feeds: dict, model: onnx.ModelProto) -> np.ndarray:
    """Y of the contract in float64."""
    init = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in model.graph.initializer}
    kept = feeds["keep"].any(axis=-1)[:, 0]
    total = np.where(kept[..., None], feeds["x"].astype(np.float64), 0.0) + feeds["skip"].astype(np.float64) + init["bias"]
    mean = total.mean(axis=-1, keepdims=True)
    var = ((total - mean) ** 2).mean(axis=-1, keepdims=True)
    return (total - mean) / np.sqrt(var + EPSILON) * init["gamma"] + init["beta"]


def rel_l2(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want))


def run(shapes, reps: int, warmup: int) -> list[dict]:
    import torch
    from cupti import kernel_times_us, require_kernels

    from onnxfuse.runtime import create_session

    rows = []
    for b, s, d, dtype, with_sum in shapes:
        rng = np.random.default_rng(0)
        npdt = _NUMPY_TYPE[dtype]
        feeds = {"x": rng.standard_normal((b, s, d)).astype(npdt), "skip": rng.standard_normal((b, s, d)).astype(npdt),
                 "keep": keep_mask(b, s, rng)}
        row = {"B": b, "S": s, "D": d, "dtype": dtype, "sum_output": with_sum}
        for variant in VARIANTS:
            model = build(variant, d, dtype, with_sum, np.random.default_rng(1))
            session = create_session(model, providers="cuda", cpu_fallback=False, quiet=True)
            names = [i.name for i in session.get_inputs()]
            on_gpu = {n: torch.from_numpy(feeds[n]).cuda() for n in names}
            outs = {o.name: torch.empty((b, s, d), dtype=on_gpu["x"].dtype, device="cuda") for o in session.get_outputs()}
            binding = session.io_binding()
            for n, tensor in {**on_gpu, **outs}.items():
                bind = binding.bind_input if n in on_gpu else binding.bind_output
                bind(n, "cuda", 0, _NUMPY_TYPE[dtype] if tensor.dtype != torch.bool else np.bool_,
                     list(tensor.shape), tensor.data_ptr())
            call = lambda: session.run_with_iobinding(binding)  # noqa: E731
            per_kernel = require_kernels(kernel_times_us(call, reps, warmup))
            row[f"{variant}_gpu_us"] = sum(per_kernel.values())
            row[f"{variant}_kernels"] = {k[:120]: round(v, 3) for k, v in per_kernel.items()}
            call()
            torch.cuda.synchronize()
            y = outs["y"].float().cpu().numpy()
            if variant == "ort":  # no guard: its rows not kept differ by design; the error is over the kept rows
                kept = feeds["keep"].any(axis=-1)[:, 0]
                row["ort_relerr_kept_rows"] = rel_l2(y[kept], reference(feeds, model)[kept])
            else:
                row[f"{variant}_relerr"] = rel_l2(y, reference(feeds, model))
            del session, binding, on_gpu, outs
        row["masked_over_ort"] = row["masked_gpu_us"] / row["ort_gpu_us"]
        row["masked_over_guard_ort"] = row["masked_gpu_us"] / row["guard+ort_gpu_us"]
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if not k.endswith("_kernels")}), flush=True)
    return rows


def table(rows: list[dict]) -> str:
    out = ["| B×S×D | dtype | sum | masked µs | guard + ORT SLN µs | ORT SLN alone µs | masked ÷ ORT alone | "
           "error masked / guard+ORT (rel-L2 vs fp64) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['B']}×{r['S']}×{r['D']} | {r['dtype']} | {'yes' if r['sum_output'] else 'no'} | "
                   f"{r['masked_gpu_us']:.2f} | {r['guard+ort_gpu_us']:.2f} | {r['ort_gpu_us']:.2f} | "
                   f"{r['masked_over_ort']:.3f} | {r['masked_relerr']:.2e} / {r['guard+ort_relerr']:.2e} |")
    return "\n".join(out)


def folded(row: dict) -> bool:
    """Whether the rule folds rows of this width and type (guard_into_skip_norm's reach)."""
    from onnxfuse.patterns.guard_into_skip_norm import MAX_ROW_BYTES

    return row["D"] * (2 if row["dtype"] == "fp16" else 4) <= MAX_ROW_BYTES


def verdict(rows: list[dict]) -> str:
    """The masked op against the guarded graph it replaces, over the rows the rule folds."""
    judged = [r for r in rows if folded(r)]
    worst = max(r["masked_over_guard_ort"] for r in judged)
    return (f"within the fold's reach, masked < guard + ORT SLN in every row: {'PASS' if worst < 1.0 else 'FAIL'} "
            f"(worst {worst:.3f}, {len(judged)} rows; {len(rows) - len(judged)} past the reach, measured only)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=50, help="profiled calls per variant (mean)")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--json", default=None, help="write the rows and the command here")
    args = ap.parse_args(argv)
    from onnxfuse.runtime import cuda_unusable_reason, preload_cuda_libraries

    preload_cuda_libraries()
    if (why := cuda_unusable_reason()) is not None:
        print(f"masked_skip_norm: no CUDA provider: {why}", file=sys.stderr)
        return 2
    rows = run(SHAPES, args.reps, args.warmup)
    print(table(rows))
    print(verdict(rows))
    if args.json:
        meta = {"command": "python3 bench/masked_skip_norm.py " + " ".join(sys.argv[1:] if argv is None else argv),
                "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "library": os.environ.get("ONNXFUSE_LIBRARY"), "method": f"CUPTI sum of kernel times, mean of "
                f"{args.reps} calls after {args.warmup}, IO binding on the GPU"}
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
