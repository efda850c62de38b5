#!/usr/bin/env python3
"""Host cost of the fused node against ONNX Runtime's own nodes for the same block, where the GPU work is too
small to hide it.

Without CUDA graphs a small batch is bound by the CPU: every node's kernel call (argument checks, choosing a
kernel, the launch itself) runs on the host while the GPU idles. A fusion that saves GPU time but costs more
host time per node makes small batches slower, so this measures that cost on its own:

* a chain of L Linear+bias+GELU layers (D -> D, fp16 by default), once as ``FusedLinearGelu`` nodes and once
  as the graph exporters write (MatMul -> Add -> Gelu, opset 20), at a few row counts M where each layer's GPU
  work takes a few microseconds;
* wall time per run (IO binding, no CUDA graph, the two sessions interleaved: ``onnxfuse.measure.timing.measure``),
  per layer;
* ORT's profiler: host microseconds per node call, by op type (ORT's ``*_kernel_time`` events time each
  kernel's compute function on the host);
* with ``--gpu-time`` (needs torch with CUDA): GPU kernel time per run from CUPTI, to show the GPU is not
  what bounds these runs.

    python3 bench/host_overhead.py --provider cuda --json $OUT/host_overhead.json

It prints a table and the ratio of the fused chain's wall time per layer to the unfused one's (< 1: the fused
node costs less host time than the nodes it replaces). ``--other-library OTHER.so`` adds the fused chain run
by a second build of the op library to the same interleaved group: an A/B of two builds within one process
(separate processes differ by more than the change being measured). ``--provider cpu`` runs the same on the
CPU kernel.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
from onnx import helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from onnxfuse.atomic import write_json  # noqa: E402
from onnxfuse.measure.device_run import DeviceRun, output_shapes  # noqa: E402
from onnxfuse.measure.op_bench import DTYPES, initializer, random_input  # noqa: E402
from onnxfuse.measure.timing import TimingPolicy, measure  # noqa: E402
from onnxfuse.domain import DOMAIN, OP_TYPE, DOMAIN_VERSION  # noqa: E402
from onnxfuse.runtime import create_session  # noqa: E402

BASELINE_OPSET = 20  # the first opset with a Gelu op


def chain_models(layers: int, width: int, dtype: str = "fp16", seed: int = 0):
    """(fused, unfused) ModelProtos of ``layers`` Linear+bias+GELU blocks, X[M, D] -> Y[M, D], M symbolic."""
    rng = np.random.default_rng(seed)
    elem = DTYPES[dtype]
    fused_nodes, unfused_nodes, fused_init, unfused_init = [], [], [], []
    prev = "X"
    for i in range(layers):
        w_nk = rng.standard_normal((width, width), dtype=np.float32) / np.sqrt(width)
        bias = rng.standard_normal(width, dtype=np.float32) * 0.1
        out = "Y" if i == layers - 1 else f"h{i}"
        fused_init += [initializer(w_nk, dtype, f"W{i}"), initializer(bias, dtype, f"B{i}")]
        unfused_init += [initializer(w_nk.T.copy(), dtype, f"W{i}"), initializer(bias, dtype, f"B{i}")]
        fused_nodes.append(helper.make_node(OP_TYPE, [prev, f"W{i}", f"B{i}"], [out], name=f"fused{i}",
                                            domain=DOMAIN, approximate="none", transB=1))
        unfused_nodes += [
            helper.make_node("MatMul", [prev, f"W{i}"], [f"xw{i}"], name=f"matmul{i}"),
            helper.make_node("Add", [f"xw{i}", f"B{i}"], [f"xwb{i}"], name=f"add{i}"),
            helper.make_node("Gelu", [f"xwb{i}"], [out], name=f"gelu{i}"),
        ]
        prev = out
    x = helper.make_tensor_value_info("X", elem, ["M", width])
    y = helper.make_tensor_value_info("Y", elem, ["M", width])
    fused = helper.make_model(helper.make_graph(fused_nodes, "fused_chain", [x], [y], fused_init),
                              opset_imports=[helper.make_opsetid("", BASELINE_OPSET),
                                             helper.make_opsetid(DOMAIN, DOMAIN_VERSION)])
    unfused = helper.make_model(helper.make_graph(unfused_nodes, "linear_gelu_chain", [x], [y], unfused_init),
                                opset_imports=[helper.make_opsetid("", BASELINE_OPSET)])
    for model in (fused, unfused):
        model.ir_version = 9  # what ORT 1.20+ reads
    return fused, unfused


def node_host_us(profile_file: str) -> dict[str, list[float]]:
    """Host µs of every node call in an ORT profile, by op type (``<node>_kernel_time`` events)."""
    with open(profile_file) as f:
        events = json.load(f)
    by_op: dict[str, list[float]] = {}
    for event in events:
        args, name = event.get("args") or {}, event.get("name", "")
        if event.get("cat") == "Node" and name.endswith("_kernel_time") and "op_name" in args:
            by_op.setdefault(args["op_name"], []).append(float(event["dur"]))
    return by_op


def profiled_host_cost(model: bytes, provider: str, feeds: dict, runs: int, library: str | None = None) -> dict:
    """Median host µs per node call by op type over ``runs`` profiled runs after the first (which includes
    one-off setup)."""
    with tempfile.TemporaryDirectory(prefix="onnxfuse-host-") as tmp:
        session = create_session(model, provider, profile_dir=tmp, library_path=library)
        run = DeviceRun(session, feeds, output_shapes(session, feeds))
        for _ in range(runs):
            run()
        by_op = node_host_us(session.end_profiling())
    per_op = {}
    for op, durations in by_op.items():
        calls_per_run = len(durations) // (runs + 1)  # output_shapes ran once more
        steady = durations[calls_per_run:]
        per_op[op] = {"median_us": statistics.median(steady), "calls_per_run": calls_per_run}
    return per_op


def gpu_us_per_run(run, reps: int) -> float | None:
    try:
        from cupti import kernel_times_us  # bench/cupti.py
    except ImportError:
        return None
    return sum(kernel_times_us(run, reps=reps, warmup=3).values())


def bench(layers: int, width: int, rows: list[int], dtype: str, provider: str, budget_s: float,
          profile_runs: int, gpu_time: bool, other_library: str | None = None) -> list[dict]:
    """One row per M. ``other_library``: a second build of the op library, whose fused chain ("fused_other")
    runs in the same interleaved group, so that two builds compare within one process."""
    fused, unfused = (m.SerializeToString() for m in chain_models(layers, width, dtype))
    variants = {"fused": (fused, None), "unfused": (unfused, None)}
    if other_library:
        variants["fused_other"] = (fused, other_library)
    results = []
    for m in rows:
        feeds = {"X": random_input((m, width), dtype, seed=m)}
        runs = {}
        for name, (model, library) in variants.items():
            session = create_session(model, provider, library_path=library)
            runs[name] = DeviceRun(session, feeds, output_shapes(session, feeds))
        timings = measure(list(runs.values()), TimingPolicy(budget_s=budget_s, rel_tol=0.02))
        row = {"M": m, "K": width, "N": width, "layers": layers, "dtype": dtype, "provider": provider}
        if other_library:
            row["other_library"] = other_library
        for (name, run), t in zip(runs.items(), timings):
            model, library = variants[name]
            row[name] = {"wall": t.to_dict(), "wall_us_per_layer": t.median_ms * 1e3 / layers,
                         "host_us_by_op": profiled_host_cost(model, provider, feeds, profile_runs, library)}
            row[name]["host_us_per_layer"] = sum(
                v["median_us"] * v["calls_per_run"] for v in row[name]["host_us_by_op"].values()) / layers
            if gpu_time and provider == "cuda":
                g = gpu_us_per_run(run, reps=50)
                if g is not None:
                    row[name]["gpu_us_per_layer"] = g / layers
        row["wall_ratio"] = row["fused"]["wall_us_per_layer"] / row["unfused"]["wall_us_per_layer"]
        row["host_ratio"] = row["fused"]["host_us_per_layer"] / row["unfused"]["host_us_per_layer"]
        if other_library:
            row["wall_ratio_to_other"] = row["fused"]["wall_us_per_layer"] / row["fused_other"]["wall_us_per_layer"]
        results.append(row)
        print(line(row), flush=True)
        del runs
    return results


def line(r: dict) -> str:
    def ops(d):
        return ", ".join(f"{op} {v['median_us']:.1f}" for op, v in sorted(d["host_us_by_op"].items()))

    gpu = ""
    if "gpu_us_per_layer" in r["fused"]:
        gpu = f" | GPU us/layer {r['fused']['gpu_us_per_layer']:.1f} vs {r['unfused']['gpu_us_per_layer']:.1f}"
    other = ""
    if "fused_other" in r:
        other = (f" | other library's fused {r['fused_other']['wall_us_per_layer']:6.1f} us/layer "
                 f"(this / other x{r['wall_ratio_to_other']:.2f})")
    return (f"M={r['M']:<5d} wall us/layer fused {r['fused']['wall_us_per_layer']:6.1f} unfused "
            f"{r['unfused']['wall_us_per_layer']:6.1f} (x{r['wall_ratio']:.2f}) | host us/layer "
            f"{r['fused']['host_us_per_layer']:5.1f} vs {r['unfused']['host_us_per_layer']:5.1f} "
            f"(x{r['host_ratio']:.2f}) | per call: {ops(r['fused'])}; {ops(r['unfused'])}{gpu}{other}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--provider", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--rows", default="1,16,128", help="comma-separated M values")
    p.add_argument("--dtype", default="fp16", choices=tuple(DTYPES))
    p.add_argument("--budget", type=float, default=3.0, help="seconds of interleaved timing per row count")
    p.add_argument("--profile-runs", type=int, default=200)
    p.add_argument("--gpu-time", action="store_true", help="GPU kernel time per run from CUPTI (torch)")
    p.add_argument("--other-library", help="a second build of the op library: its fused chain joins the same "
                   "interleaved timing, for an A/B of two builds within one process")
    p.add_argument("--json", help="write every number here")
    a = p.parse_args(argv)
    rows = bench(a.layers, a.width, [int(v) for v in a.rows.split(",")], a.dtype, a.provider, a.budget,
                 a.profile_runs, a.gpu_time, a.other_library)
    if a.json:
        write_json(a.json, {"command": " ".join(sys.argv), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
