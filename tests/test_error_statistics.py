"""The fused op is no less accurate than the unfused path it replaces.

Over M×N = 512×2048 = 1,048,576 output elements per dtype and GELU form, the CPU kernel of
FusedLinearGelu and ONNX Runtime's own unfused MatMul → Add → GELU are both measured against a float64
reference computed from the very same (already rounded) inputs. The fused kernel's p99 and max absolute
errors must stay within 1.05× the unfused path's. For float32 the max is judged over four seeds (the median
of the per-seed ratios): both paths then sum K in 256-deep blocks, so their errors have one distribution
and the max of one sample of 10^6 swings ±7-20 % between seeds.

The unfused peer:
* float32 and float16: ORT CPU running MatMul, Add and Gelu (or x·Sigmoid(1.702x)) in that type,
  with ORT's default graph optimizations, exactly as a user would run the unfused model;
* bfloat16: ORT's CPU provider has no bfloat16 MatMul/Add/Gelu kernels, so the peer is each op computed
  in float32 with its result rounded to bfloat16 between ops (Cast nodes), which is what an unfused
  bfloat16 execution stores between its kernels.
Inputs: X ~ N(0, 1), W ~ N(0, 1)/√K, b ~ N(0, 0.1), each rounded to the dtype before use.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxfuse.compare import run_session
from onnxfuse.domain import DOMAIN, OP_TYPE, DOMAIN_VERSION

M, K, N = 512, 768, 2048
ALPHA = 1.702
TOLERATED_RATIO = 1.05

DTYPES = {
    "float32": (TensorProto.FLOAT, np.dtype(np.float32)),
    "float16": (TensorProto.FLOAT16, np.dtype(np.float16)),
    "bfloat16": (TensorProto.BFLOAT16, np.dtype(ml_dtypes.bfloat16)),
}
# A sanity ceiling on the p99 error of either path: the ratio test alone would pass two broken paths.
P99_CEILING = {"float32": 1e-5, "float16": 4e-3, "bfloat16": 3e-2}



def _model(nodes, dtype: int, initializers, opsets) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "linear_gelu",
        [helper.make_tensor_value_info("x", dtype, [M, K])],
        [helper.make_tensor_value_info("y", dtype, [M, N])],
        initializers,
    )
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def fused_model(w_nk: np.ndarray, b: np.ndarray, dtype: int, approximate: str) -> onnx.ModelProto:
    node = helper.make_node(OP_TYPE, ["x", "W", "B"], ["y"], domain=DOMAIN, approximate=approximate, transB=1)
    if approximate == "sigmoid":
        node.attribute.append(helper.make_attribute("alpha", ALPHA))
    inits = [numpy_helper.from_array(w_nk, "W"), numpy_helper.from_array(b, "B")]
    return _model([node], dtype, inits, [helper.make_opsetid("", 20), helper.make_opsetid(DOMAIN, DOMAIN_VERSION)])


def _activation_nodes(src: str, dst: str, approximate: str, compute: int) -> tuple[list, list]:
    if approximate == "sigmoid":
        np_type = np.float32 if compute == TensorProto.FLOAT else helper.tensor_dtype_to_np_dtype(compute)
        alpha = numpy_helper.from_array(np.array(ALPHA, dtype=np_type), "alpha")
        nodes = [
            helper.make_node("Mul", [src, "alpha"], ["scaled"]),
            helper.make_node("Sigmoid", ["scaled"], ["gate"]),
            helper.make_node("Mul", [src, "gate"], [dst]),
        ]
        return nodes, [alpha]
    return [helper.make_node("Gelu", [src], [dst], approximate=approximate)], []


def unfused_model(w_nk: np.ndarray, b: np.ndarray, dtype: int, approximate: str) -> onnx.ModelProto:
    opsets = [helper.make_opsetid("", 20)]
    w_kn = np.ascontiguousarray(w_nk.T)
    if dtype != TensorProto.BFLOAT16:
        act, act_inits = _activation_nodes("pre", "y", approximate, dtype)
        nodes = [helper.make_node("MatMul", ["x", "W"], ["mm"]), helper.make_node("Add", ["mm", "B"], ["pre"]), *act]
        return _model(nodes, dtype, [numpy_helper.from_array(w_kn, "W"), numpy_helper.from_array(b, "B"), *act_inits], opsets)
    # bfloat16: every op in float32, its result stored as bfloat16 before the next op reads it
    f32, bf16 = TensorProto.FLOAT, TensorProto.BFLOAT16

    def round_trip(src: str, dst: str) -> list:
        return [helper.make_node("Cast", [src], [f"{dst}_bf16"], to=bf16), helper.make_node("Cast", [f"{dst}_bf16"], [dst], to=f32)]

    act, act_inits = _activation_nodes("pre_r", "act", approximate, f32)
    nodes = [
        helper.make_node("Cast", ["x"], ["xf"], to=f32),
        helper.make_node("Cast", ["W"], ["wf"], to=f32),
        helper.make_node("Cast", ["B"], ["bf"], to=f32),
        helper.make_node("MatMul", ["xf", "wf"], ["mm"]),
        *round_trip("mm", "mm_r"),
        helper.make_node("Add", ["mm_r", "bf"], ["pre"]),
        *round_trip("pre", "pre_r"),
        *act,
        helper.make_node("Cast", ["act"], ["y"], to=bf16),
    ]
    return _model(nodes, dtype, [numpy_helper.from_array(w_kn, "W"), numpy_helper.from_array(b, "B"), *act_inits], opsets)


def reference(x: np.ndarray, w_nk: np.ndarray, b: np.ndarray, approximate: str) -> np.ndarray:
    """float64 all the way, from the rounded inputs."""
    pre = x.astype(np.float64) @ w_nk.astype(np.float64).T + b.astype(np.float64)
    if approximate == "none":
        erf = np.vectorize(math.erf, otypes=[np.float64])
        return 0.5 * pre * (1.0 + erf(pre / math.sqrt(2.0)))
    if approximate == "tanh":
        return 0.5 * pre * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (pre + 0.044715 * pre**3)))
    return pre / (1.0 + np.exp(-ALPHA * pre))


def _run(model: onnx.ModelProto, x: np.ndarray, library: str | None) -> np.ndarray:
    import onnxruntime as ort

    options = ort.SessionOptions()
    if library:
        options.register_custom_ops_library(library)
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return run_session(session, {"x": x}, ["y"])["y"].astype(np.float64)


@pytest.mark.parametrize("approximate", ["none", "tanh", "sigmoid"])
@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_fused_error_distribution_is_no_worse_than_unfused(dtype_name, approximate, record_property, library_path):
    onnx_type, np_type = DTYPES[dtype_name]
    rng = np.random.default_rng(2026)
    x = rng.standard_normal((M, K), dtype=np.float32).astype(np_type)
    w_nk = (rng.standard_normal((N, K), dtype=np.float32) / math.sqrt(K)).astype(np_type)
    b = (rng.standard_normal(N, dtype=np.float32) * 0.1).astype(np_type)

    ref = reference(x, w_nk, b, approximate)
    fused = _run(fused_model(w_nk, b, onnx_type, approximate), x, library_path)
    unfused = _run(unfused_model(w_nk, b, onnx_type, approximate), x, None)
    assert fused.size == unfused.size == M * N >= 10**6

    err_fused, err_unfused = np.abs(fused - ref), np.abs(unfused - ref)
    p99_f, p99_u = np.quantile(err_fused, 0.99), np.quantile(err_unfused, 0.99)
    max_f, max_u = err_fused.max(), err_unfused.max()
    line = (
        f"{dtype_name} {approximate}: fused p99 {p99_f:.3g} max {max_f:.3g} | unfused p99 {p99_u:.3g} max {max_u:.3g}"
        f" | ratios p99 {p99_f / p99_u:.3f} max {max_f / max_u:.3f}"
    )
    record_property("errors", line)
    print(line)
    assert np.isfinite(fused).all()
    assert p99_u < P99_CEILING[dtype_name] and p99_f < P99_CEILING[dtype_name], line
    assert p99_f <= TOLERATED_RATIO * p99_u, line
    if dtype_name != "float32":  # float32's max: test_float32_max_error_is_no_worse_than_unfused
        assert max_f <= TOLERATED_RATIO * max_u, line


FLOAT32_SEEDS = (0, 1, 2, 3)


@pytest.mark.parametrize("approximate", ["none", "tanh", "sigmoid"])
def test_float32_max_error_is_no_worse_than_unfused(approximate, record_property, library_path):
    """The max of 10^6 fp32 rounding errors swings by ±7-20% between seeds for two kernels of equal
    accuracy, so one seed is a thin basis for a 1.05× bound on it: the median over four seeds (4·10^6
    elements) of the per-seed max ratio is a steadier one. Measured (erf): 0.92-1.02 per seed with the GEMM
    summing 256-deep K slices from zero, as MLAS does; 0.48-0.74 with 128-deep slices; 0.9-1.45 with
    OpenBLAS sgemm; 2.1-2.7 with one long K chain."""
    ratios = []
    for seed in FLOAT32_SEEDS:
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((M, K), dtype=np.float32)
        w_nk = (rng.standard_normal((N, K), dtype=np.float32) / math.sqrt(K)).astype(np.float32)
        b = (rng.standard_normal(N, dtype=np.float32) * 0.1).astype(np.float32)
        ref = reference(x, w_nk, b, approximate)
        fused = _run(fused_model(w_nk, b, TensorProto.FLOAT, approximate), x, library_path)
        unfused = _run(unfused_model(w_nk, b, TensorProto.FLOAT, approximate), x, None)
        ratios.append(float(np.abs(fused - ref).max() / np.abs(unfused - ref).max()))
    line = f"float32 {approximate} max-error ratios fused/unfused per seed: {', '.join(f'{r:.3f}' for r in ratios)}"
    record_property("errors", line)
    print(line)
    assert float(np.median(ratios)) <= TOLERATED_RATIO, line


@pytest.mark.parametrize("k", [64, 256, 768, 3072])
def test_float32_gemm_accumulation_is_no_worse_than_ort(k, record_property, library_path):
    """The GEMM alone, separated from the activation: with approximate="sigmoid" and alpha=0 the op
    computes (X·Wᵀ + B)·σ(0) = (X·Wᵀ + B)/2 exactly, so doubling its output gives the fused kernel's
    pre-activation bit for bit. Its error against float64 must match ORT's MatMul+Add (MLAS) at short
    and long reductions alike: MLAS adds K in blocks of 256, which halves the error of one long sum at
    K = 768."""
    rng = np.random.default_rng(11)
    m, n = 256, 1024  # 262,144 outputs per K: enough for a stable p99
    x = rng.standard_normal((m, k), dtype=np.float32)
    w_nk = (rng.standard_normal((n, k), dtype=np.float32) / math.sqrt(k)).astype(np.float32)
    b = (rng.standard_normal(n, dtype=np.float32) * 0.1).astype(np.float32)
    ref = x.astype(np.float64) @ w_nk.astype(np.float64).T + b

    def with_k(model: onnx.ModelProto) -> onnx.ModelProto:
        for value in (model.graph.input[0], model.graph.output[0]):
            dims = value.type.tensor_type.shape.dim
            dims[0].dim_value, dims[1].dim_value = m, (k if value is model.graph.input[0] else n)
        return model

    fused = with_k(fused_model(w_nk, b, TensorProto.FLOAT, "sigmoid"))
    for attr in fused.graph.node[0].attribute:
        if attr.name == "alpha":
            attr.f = 0.0
    unfused = with_k(_model(
        [helper.make_node("MatMul", ["x", "W"], ["mm"]), helper.make_node("Add", ["mm", "B"], ["y"])],
        TensorProto.FLOAT,
        [numpy_helper.from_array(np.ascontiguousarray(w_nk.T), "W"), numpy_helper.from_array(b, "B")],
        [helper.make_opsetid("", 20)],
    ))
    err_fused = np.abs(2.0 * _run(fused, x, library_path) - ref)
    err_unfused = np.abs(_run(unfused, x, None) - ref)
    p99_f, p99_u = np.quantile(err_fused, 0.99), np.quantile(err_unfused, 0.99)
    line = f"float32 GEMM+bias K={k}: fused p99 {p99_f:.3g} max {err_fused.max():.3g} | ORT p99 {p99_u:.3g} max {err_unfused.max():.3g}"
    record_property("errors", line)
    print(line)
    assert p99_f <= TOLERATED_RATIO * p99_u, line
