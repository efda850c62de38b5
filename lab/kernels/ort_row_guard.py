#!/usr/bin/env python3
"""What the attention rule's row guard costs in ORT's CUDA kernels, by the form it is written in.

The guard ``Where(rows, y, 0)`` keeps each attention output row that sees no key at the graph's value. With
``rows`` [B, S|1, 1] broadcast over the hidden size ORT runs its general ternary kernel (per-element index
arithmetic); with every operand either whole or a scalar it runs ``_TenaryElementWiseSimple``. This times, by
CUPTI, twelve guards in a row (one per layer of a base-size model) on [B, S, D] float16 for each form:

* ``bcast_rows``: rows [B, S, 1] (padding with causality), ``bcast_batch``: rows [B, 1, 1] (padding alone);
* ``full``: rows expanded once to [B, S, D] (one Expand shared by the twelve guards);
* ``mul``: y · rows as float16 0/1 [B·S, 1] over y viewed as [B·S, D] (ORT's per-channel broadcast kernel).

    python3 lab/kernels/ort_row_guard.py > $OUT/ort_row_guard.txt   (needs torch with CUDA, for CUPTI)
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.cupti import kernel_times_us  # noqa: E402

import onnxruntime as ort  # noqa: E402

ort.set_default_logger_severity(3)

B, S, D, LAYERS = 32, 128, 768, 12


def model(form: str):
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT16, [B, S, D])
    rows_shape = {"bcast_rows": [B, S, 1], "bcast_batch": [B, 1, 1], "full": [B, S, 1], "mul": [B, S, 1]}[form]
    rows = helper.make_tensor_value_info("rows", TensorProto.BOOL, rows_shape)
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT16, [B, S, D])
    inits = [numpy_helper.from_array(np.array(0, np.float16), "zero"),
             numpy_helper.from_array(np.array([B, S, D], np.int64), "full_shape"),
             numpy_helper.from_array(np.array([B * S, D], np.int64), "flat"),
             numpy_helper.from_array(np.array([B * S, 1], np.int64), "flat_rows"),
             numpy_helper.from_array(np.array([B, S, D], np.int64), "back")]
    nodes, cond, prev = [], "rows", "y"
    if form == "full":
        nodes.append(helper.make_node("Expand", ["rows", "full_shape"], ["rows_full"]))
        cond = "rows_full"
    if form == "mul":
        nodes += [helper.make_node("Cast", ["rows"], ["rows_h"], to=TensorProto.FLOAT16),
                  helper.make_node("Reshape", ["rows_h", "flat_rows"], ["rows_flat"])]
    for i in range(LAYERS):
        nxt = "out" if i == LAYERS - 1 else f"g{i}"
        if form == "mul":
            nodes += [helper.make_node("Reshape", [prev, "flat"], [f"f{i}"]),
                      helper.make_node("Mul", [f"f{i}", "rows_flat"], [f"m{i}"]),
                      helper.make_node("Reshape", [f"m{i}", "back"], [nxt])]
        else:
            nodes.append(helper.make_node("Where", [cond, prev, "zero"], [nxt]))
        prev = nxt
    graph = helper.make_graph(nodes, form, [y, rows], [out], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def main() -> None:
    print(f"onnxruntime {ort.__version__}; {LAYERS} guards on [{B}, {S}, {D}] float16")
    rng = np.random.default_rng(0)
    y = rng.standard_normal((B, S, D)).astype(np.float16)
    for form in ("bcast_rows", "bcast_batch", "full", "mul"):
        m = model(form)
        rows = rng.random([d.dim_value for d in m.graph.input[1].type.tensor_type.shape.dim]) > 0.1
        sess = ort.InferenceSession(m.SerializeToString(), providers=["CUDAExecutionProvider"])
        binding = sess.io_binding()
        binding.bind_ortvalue_input("y", ort.OrtValue.ortvalue_from_numpy(y, "cuda", 0))
        binding.bind_ortvalue_input("rows", ort.OrtValue.ortvalue_from_numpy(rows, "cuda", 0))
        binding.bind_output("out", "cuda")
        per_kernel = kernel_times_us(lambda: sess.run_with_iobinding(binding), reps=20, warmup=5)
        total = sum(per_kernel.values())
        names = "; ".join(f"{n[:90]} {us:.1f}" for n, us in sorted(per_kernel.items(), key=lambda kv: -kv[1]))
        print(f"{form:12s} {total:7.1f} us per {LAYERS} guards  {names}", flush=True)


if __name__ == "__main__":
    main()
