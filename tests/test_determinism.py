"""Idempotence and determinism: optimizing twice equals optimizing once, byte for byte (model and data file),
and the bytes do not depend on the interpreter's hash seed (set iteration order), across separate processes.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.graphs import Builder, block, build_gated, build_mlp, input_shape

REPO = Path(__file__).resolve().parent.parent

# Optimizes every model in SRC into OUT/once/<name> and then OUT/once/<name> into OUT/twice/<name>, and
# prints {path: sha256} of everything written, and the inspect reports without their timings.
DRIVER = r"""
import hashlib, json, os, sys
from onnxfuse.pipeline import inspect_file, optimize_file
src, out = sys.argv[1], sys.argv[2]
digests, reports = {}, {}
for name in sorted(os.listdir(src)):
    if not name.endswith(".onnx"):
        continue
    once = os.path.join(out, "once", name)
    twice = os.path.join(out, "twice", name)
    os.makedirs(os.path.dirname(once), exist_ok=True)
    os.makedirs(os.path.dirname(twice), exist_ok=True)
    optimize_file(os.path.join(src, name), once)
    second = optimize_file(once, twice)
    assert not second.fused, (name, second.fused)
    report = inspect_file(os.path.join(src, name)).to_dict()
    report.pop("seconds", None)
    report.pop("model", None)
    reports[name] = report
for root, _, files in os.walk(out):
    for f in files:
        p = os.path.join(root, f)
        digests[os.path.relpath(p, out)] = hashlib.sha256(open(p, "rb").read()).hexdigest()
print(json.dumps({"digests": digests, "reports": reports}, sort_keys=True))
"""


def _many_forms() -> onnx.ModelProto:
    """Every GELU family and Linear form in one graph, with tied weights and a refused block (set-ordered
    code paths: tied-weight sharing, dead-code removal, unique names)."""
    b = Builder()
    x = "x"
    for gelu, linear in [("onnx:none", "matmul"), ("tanh:pow", "reshape_gemm"), ("ms:BiasGelu", "matmul"),
                         ("erf:keras:mul", "matmul"), ("sigmoid", "reshape_gemm"), ("tanh:bloom", "matmul"),
                         ("ms:FastGelu+bias", "matmul"), ("erf:assoc:div", "matmul")]:
        x = block(b, x, gelu, linear, k=16, n=16)
    leak = block(b, x, "onnx:tanh", "matmul", k=16, n=16)
    b.output(b.tensors["linear_out"], ["batch", "seq", 16])  # a graph-output intermediate: refused
    shape = input_shape("matmul", 3, 16)
    return b.model([("x", shape)], [(leak, shape)])


def _external(folder: Path) -> None:
    """A model with external weights to transpose (MatMul W[K,N]) and to copy (Gemm transB=1)."""
    rng = np.random.default_rng(3)
    k, n = 64, 96
    inits = [numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), "w_fc"),
             numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b_fc"),
             numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), "w_g"),
             numpy_helper.from_array(rng.standard_normal(k).astype(np.float32), "b_g")]
    nodes = [helper.make_node("MatMul", ["x", "w_fc"], ["mm"], name="fc"),
             helper.make_node("Add", ["b_fc", "mm"], ["pre"], name="bias"),
             helper.make_node("Gelu", ["pre"], ["h"], name="gelu"),
             helper.make_node("Reshape", ["h", "flat"], ["h2"], name="flatten"),
             helper.make_node("Gemm", ["h2", "w_g", "b_g"], ["g"], name="gemm", transB=1, alpha=0.5),
             helper.make_node("Gelu", ["g"], ["y"], name="gelu2", approximate="tanh")]
    inits.append(numpy_helper.from_array(np.array([-1, n], dtype=np.int64), "flat"))
    graph = helper.make_graph(nodes, "ext", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", k])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    onnx.save_model(model, folder / "external.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
                    location="external.onnx.data", size_threshold=0)


def _run(src: Path, out: Path, hashseed: str) -> dict:
    env = {**os.environ, "PYTHONHASHSEED": hashseed, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(src), str(out)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_optimize_is_idempotent_and_independent_of_the_hash_seed(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    onnx.save(_many_forms(), src / "forms.onnx")
    onnx.save(build_mlp(layers=4, gelu="tanh:mul"), src / "mlp.onnx")
    onnx.save(build_gated("erf:pytorch:mul"), src / "gated.onnx")
    _external(src)
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in src.iterdir()}

    runs = {seed: _run(src, tmp_path / f"out-{seed}", seed) for seed in ("0", "1", "4242")}

    first = runs["0"]
    # every model fused something, and the external one kept its weights external
    assert {"once/forms.onnx", "once/external.onnx", "once/external.onnx.data"} <= set(first["digests"])
    assert first["reports"]["forms.onnx"]["fused"] == 8 and first["reports"]["forms.onnx"]["refused"] == 1
    assert first["reports"]["external.onnx"]["fused"] == 2
    for seed, run in runs.items():
        assert run == first, f"PYTHONHASHSEED={seed} gave other bytes or reports"
    # optimizing twice equals once: same file names in another folder, same bytes
    once = {k.removeprefix("once/"): v for k, v in first["digests"].items() if k.startswith("once/")}
    twice = {k.removeprefix("twice/"): v for k, v in first["digests"].items() if k.startswith("twice/")}
    assert once == twice
    # the inputs were not touched
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in src.iterdir()} == before
