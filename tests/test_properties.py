"""Differential property tests: random valid graphs of chained Linear+GELU blocks, built from every form and
knob of the Linear+GELU rule (docs/patterns.md, "Linear + GELU"), are optimized and then judged against the
original.

Per example:
* the output passes ``onnx.checker`` (full check, shape inference included);
* every output is within the accuracy gate's per-dtype tolerance of the original's (both run in
  ``onnx.reference``; the fused op through the float64 oracle of ``tests/reference_ops.py``);
* a block that must not fuse (a leaked intermediate, a graph-output intermediate, a near-miss constant,
  Gemm transA, a batched or misaxed operand, a dtype outside T, alpha on a run-time weight) is left
  bit-identical — its nodes and their constants byte for byte — and every other block is fused;
* every block the report lists as refused is bit-identical too.

A sampled subset also runs through ONNX Runtime with the real CPU kernel. CI runs the ``ci`` profile
(derandomized, 2,000 examples); ``HYPOTHESIS_PROFILE=explore`` draws fresh random examples
(``HYPOTHESIS_EXAMPLES`` of them, default 20,000).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import onnx
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from onnxfuse.domain import DOMAIN, OP_TYPE
from onnxfuse.fuse import fuse_model
from tests.graphs import (BIAS_GELU_FORMS, GELU_FORMS, LINEAR_FORMS, NP_DTYPES, ONNX_DTYPES, REFERENCE,
                          Builder, block)
from tests.reference_ops import run

settings.register_profile("ci", max_examples=2000, deadline=None, derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("explore", max_examples=int(os.environ.get("HYPOTHESIS_EXAMPLES", "20000")),
                          deadline=None, derandomize=False,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("quick", max_examples=100, deadline=None, derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")

# The accuracy gate's defaults (onnxfuse compare): rtol = atol per dtype.
TOL = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2, "float64": 1e-7}
EPS = {"float32": float(np.finfo(np.float32).eps), "float16": float(np.finfo(np.float16).eps),
       "bfloat16": 2.0 ** -7, "float64": float(np.finfo(np.float64).eps)}
ALL_FORMS = [*GELU_FORMS, *BIAS_GELU_FORMS]
# The constants each decomposed form is made of (sigmoid's alpha is kept as written: not a near miss).
ROLES = {
    **{f: (("sqrt2" if f.endswith("div") else "inv_sqrt2"), "one", "half") for f in GELU_FORMS if f.startswith("erf")},
    "tanh:pow": ("cubic", "sqrt_2_over_pi", "one", "half"),
    "tanh:mul": ("cubic", "sqrt_2_over_pi", "one", "half"),
    "tanh:bloom": ("cubic", "sqrt_2_over_pi", "one", "half"),
}
LEAD = [2, 3, 4]  # leading dims of the activation (concrete, so misaxed biases are valid ONNX)


@dataclass
class BlockSpec:
    gelu: str
    linear: str
    bias: bool
    n: int
    swap: bool
    const_style: str
    w_as_node: bool = False
    w_dynamic: bool = False
    bias_shape: tuple | None = None
    alpha: float | None = None
    beta: float | None = None
    trans_a: bool = False
    batched: bool = False
    near_miss: tuple | None = None  # (role, relative change)
    leak: tuple | None = None  # ("consumer" | "output", role of the intermediate)
    sigmoid_alpha: float | None = None
    # filled while building
    nodes: list = field(default_factory=list)
    roles: dict = field(default_factory=dict)
    k: int = 0


@dataclass
class GraphSpec:
    dtype: str
    cast_wrap: bool
    rank: int
    k: int
    blocks: list
    seed: int

    def unsure(self, blk: BlockSpec) -> bool:
        """Whether the rewriter may refuse ``blk`` without being wrong: a bias of rank > 2 anywhere after an op
        onnx's shape inference cannot see through (a com.microsoft GELU) — the input's rank is then unknown,
        and such a bias could raise the output's rank."""
        i = self.blocks.index(blk)
        return (blk.bias_shape is not None and len(blk.bias_shape) > 2
                and any(b.gelu.startswith("ms:") for b in self.blocks[:i]) and self.must_refuse(blk) is None)

    def must_refuse(self, blk: BlockSpec) -> str | None:
        """Why ``blk`` must stay as written (None: it must fuse)."""
        if self.dtype == "float64":
            return "dtype outside T"
        if blk.trans_a:
            return "Gemm transA=1"
        if blk.batched:
            return "batched W"
        if blk.near_miss:
            return "near-miss constant"
        if blk.leak:
            return "leaked intermediate"
        if blk.sigmoid_alpha is not None and blk.sigmoid_alpha != REFERENCE["sigmoid_alpha"]:
            return "sigmoid scale is not QuickGELU's 1.702 (SiLU and others are not GELU)"
        if blk.bias_shape is not None:
            dims = blk.bias_shape
            out_rank = 2 if blk.linear.startswith("gemm") else self.rank
            if dims[-1] != blk.n or any(d != 1 for d in dims[:-1]) or len(dims) > out_rank:
                return "bias not broadcast over the last axis"
        if blk.w_dynamic and blk.alpha not in (None, 1.0):
            return "Gemm alpha on a run-time weight"
        return None


# --- strategies -----------------------------------------------------------------------------------------
@st.composite
def block_specs(draw, *, rank: int, k: int, dtype: str, act_dtype: str, first: bool, single: bool):
    linear_choices = ["matmul", "reshape_gemm"] + (["gemm:transB0", "gemm:transB1"] if rank == 2 else [])
    linear = draw(st.sampled_from(linear_choices))
    gelu = draw(st.sampled_from(ALL_FORMS))
    if dtype == "float64":  # com.microsoft ops have no float64 kernels anywhere: ONNX and decomposed forms
        gelu = draw(st.sampled_from([f for f in GELU_FORMS if not f.startswith("ms:")]))
    n = draw(st.integers(1, 8))
    spec = BlockSpec(gelu=gelu, linear=linear, bias=draw(st.booleans()), n=n, swap=draw(st.booleans()),
                     const_style=draw(st.sampled_from(["initializer", "node", "one_element"])))
    spec.w_as_node = draw(st.booleans())
    spec.w_dynamic = draw(st.sampled_from([False, False, False, True]))
    is_gemm = linear != "matmul"
    if is_gemm and draw(st.booleans()):
        spec.alpha = draw(st.sampled_from([0.5, 2.0, -1.25, 1.0]))
    if is_gemm and spec.bias and draw(st.booleans()):
        spec.beta = draw(st.sampled_from([0.5, 2.0, -0.75, 1.0]))
    # bias shapes: [N] and its broadcast-equivalent forms, and misaxed ones that are still valid ONNX
    if spec.bias and gelu not in BIAS_GELU_FORMS and draw(st.integers(0, 2)) == 0:
        out_rank = 2 if linear.startswith(("gemm", "reshape_gemm")) else rank
        m_dim = LEAD[0] if linear.startswith("gemm") and draw(st.booleans()) and first and single else None
        lead = (LEAD[: rank - 1] if linear == "matmul" else [m_dim or LEAD[0]])
        choices = [(1, n), (1, 1, n)[: out_rank + 1]]
        if linear == "matmul":
            choices += [(lead[-1], 1), (lead[-1], n)]
        elif linear.startswith("gemm"):
            choices += [(lead[-1], 1)] if m_dim else []
        spec.bias_shape = tuple(draw(st.sampled_from(choices)))
        if linear.startswith("gemm") and len(spec.bias_shape) > 2:
            spec.bias_shape = (1, n)
        if linear == "reshape_gemm":
            spec.bias_shape = spec.bias_shape if len(spec.bias_shape) <= 2 and spec.bias_shape[0] == 1 else (1, n)
        if m_dim is None and linear.startswith("gemm") and spec.bias_shape[0] != 1:
            spec.bias_shape = (1, n)
    if linear.startswith("gemm") and first and single and rank == 2 and draw(st.integers(0, 2)) == 0:
        spec.trans_a = True
        spec.bias_shape = None if spec.bias_shape and spec.bias_shape[0] != 1 else spec.bias_shape
    if linear == "matmul" and rank == 3 and first and draw(st.integers(0, 3)) == 0:
        spec.batched = True
        spec.w_dynamic = False
    roles = ROLES.get(gelu, ())
    if roles and draw(st.integers(0, 4)) == 0:
        rel = draw(st.floats(np.log(4 * EPS[act_dtype]), np.log(5e-2)))
        sign = draw(st.sampled_from([-1.0, 1.0]))
        spec.near_miss = (draw(st.sampled_from(roles)), sign * float(np.exp(rel)))
    if gelu == "sigmoid" and draw(st.booleans()):
        spec.sigmoid_alpha = draw(st.sampled_from([1.0, 1.5, 1.702, 2.0]))
    if draw(st.integers(0, 4)) == 0:
        spec.leak = (draw(st.sampled_from(["consumer", "output"])), None)  # role picked once built
    return spec


@st.composite
def graph_specs(draw):
    dtype = draw(st.sampled_from(["float32", "float32", "float16", "bfloat16", "float64"]))
    cast_wrap = dtype in ("float16", "bfloat16") and draw(st.booleans())
    act_dtype = "float32" if cast_wrap else dtype
    rank = draw(st.integers(2, 4))
    k = draw(st.integers(1, 8))
    count = draw(st.integers(1, 3))
    blocks, kk = [], k
    for i in range(count):
        spec = draw(block_specs(rank=rank, k=kk, dtype=dtype, act_dtype=act_dtype, first=i == 0, single=count == 1))
        spec.k = kk
        out_rank = rank if spec.linear == "matmul" else 2
        if i < count - 1 and spec.bias_shape is not None and len(spec.bias_shape) > out_rank:
            spec.bias_shape = (1, spec.n)  # a rank-raising bias only on the last block (the next one reads it)
        blocks.append(spec)
        kk = spec.n
    return GraphSpec(dtype=dtype, cast_wrap=cast_wrap, rank=rank, k=k, blocks=blocks,
                     seed=draw(st.integers(0, 2**16)))


# --- building ----------------------------------------------------------------------------------------
def _batched_block(b: Builder, x: str, spec: BlockSpec) -> str:
    """MatMul(x[2,3,K], W[2,K,N]) (+ B) → GELU: W is batched, never fused."""
    w = b.tensor("W", (LEAD[0], spec.k, spec.n), 1 / np.sqrt(spec.k))
    pre = b.node("MatMul", [x, w], role="linear_out")
    if spec.bias and spec.gelu not in BIAS_GELU_FORMS:
        pre = b.comm("Add", pre, b.tensor("B", (spec.n,), 0.1), role="bias_out")
    bias_name = b.tensor("B", (spec.n,), 0.1) if spec.gelu in BIAS_GELU_FORMS else None
    if b.cast_wrap:
        pre = b.node("Cast", [pre], to=onnx.TensorProto.FLOAT, role="upcast")
    if spec.gelu in BIAS_GELU_FORMS:
        y = b.node(BIAS_GELU_FORMS[spec.gelu], [pre, bias_name], domain="com.microsoft")
    else:
        y = GELU_FORMS[spec.gelu](b, pre)
    if b.cast_wrap:
        y = b.node("Cast", [y], to=ONNX_DTYPES[b.dtype], role="downcast")
    return y


def build_graph(g: GraphSpec, leak_choice: int) -> tuple[onnx.ModelProto, list[np.ndarray]]:
    """The model, and its outputs on ``feeds(model, g.dtype, g.seed)``."""
    b = Builder(dtype=g.dtype, cast_wrap=g.cast_wrap, seed=g.seed, act_dtype="float32" if g.cast_wrap else g.dtype)
    first = g.blocks[0]
    if first.trans_a:
        x_shape = [g.k, 3]
    else:
        x_shape = LEAD[: g.rank - 1] + [g.k]
    x = "x"
    leaks = []
    for spec in g.blocks:
        b.swap, b.const_style = spec.swap, spec.const_style
        b.perturb = {}
        if spec.near_miss:
            role, rel = spec.near_miss
            b.perturb[role] = REFERENCE[role] * (1 + rel)
        if spec.sigmoid_alpha is not None:
            b.perturb["sigmoid_alpha"] = spec.sigmoid_alpha
        b.tensors = {}
        start = len(b.nodes)
        if spec.batched:
            y = _batched_block(b, x, spec)
        else:
            kw = {"w_as_node": spec.w_as_node, "w_dynamic": spec.w_dynamic}
            for name in ("bias_shape", "alpha", "beta"):
                if getattr(spec, name) is not None:
                    kw[name] = getattr(spec, name)
            if spec.trans_a:
                kw["trans_a"] = True
            y = block(b, x, spec.gelu, spec.linear, bias=spec.bias, k=spec.k, n=spec.n, **kw)
        spec.roles = {r: t for r, t in b.tensors.items() if t != y and r != "gelu_out"}
        if spec.leak:
            roles = sorted(spec.roles)
            role = roles[leak_choice % len(roles)]
            spec.leak = (spec.leak[0], role)
            t = spec.roles[role]
            if spec.leak[0] == "output":
                leaks.append(t)
            else:
                leaks.append(b.node("Relu", [t]))
        spec.nodes = [n.name for n in b.nodes[start:]]
        x = y
    elem = ONNX_DTYPES[g.dtype]
    graph = onnx.helper.make_graph(
        b.nodes, "property", [onnx.helper.make_tensor_value_info("x", elem, x_shape)],
        [onnx.helper.make_tensor_value_info(t, elem, None) for t in dict.fromkeys([x, *leaks])],
        b.initializers)
    opsets = [onnx.helper.make_opsetid("", 20), onnx.helper.make_opsetid("com.microsoft", 1)]
    model = onnx.helper.make_model(graph, opset_imports=opsets, producer_name="tests.properties")
    model.ir_version = 9
    # outputs are declared with the shapes the graph really computes (a misaxed bias may broadcast)
    values = run(model, feeds(model, g.dtype, g.seed))
    for o, v in zip(model.graph.output, values):
        o.type.tensor_type.elem_type = onnx.helper.np_dtype_to_tensor_dtype(v.dtype)
        for d in v.shape:
            o.type.tensor_type.shape.dim.add().dim_value = d
    return model, values


def feeds(model: onnx.ModelProto, dtype: str, seed: int) -> dict:
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return {"x": np.random.default_rng(seed).standard_normal(dims).astype(NP_DTYPES[dtype])}


def close(a: np.ndarray, b: np.ndarray, dtype: str) -> bool:
    a, b = a.astype(np.float64), b.astype(np.float64)
    if a.shape != b.shape:
        return False
    same_nonfinite = np.array_equal(~np.isfinite(a), ~np.isfinite(b))
    fin = np.isfinite(a) & np.isfinite(b)
    return same_nonfinite and bool(np.all(np.abs(a[fin] - b[fin]) <= TOL[dtype] * (1 + np.abs(a[fin]))))


# --- the properties ----------------------------------------------------------------------------------
def _constant_bytes(model: onnx.ModelProto) -> dict[str, bytes]:
    out = {t.name: t.SerializeToString() for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant":
            out[n.output[0]] = n.SerializeToString()
    return out


def check_example(g: GraphSpec, leak_choice: int) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    model, want = build_graph(g, leak_choice)
    onnx.checker.check_model(model, full_check=True)  # the generator makes valid graphs only
    result = fuse_model(model)
    out = result.model
    onnx.checker.check_model(out, full_check=True)

    # which blocks fused: the expectation is independent of the report
    before = {n.name: n.SerializeToString() for n in model.graph.node}
    after = {n.name: n.SerializeToString() for n in out.graph.node}
    consts_before, consts_after = _constant_bytes(model), _constant_bytes(out)
    expected_fused, unsure = 0, 0
    for spec in g.blocks:
        reason = g.must_refuse(spec)
        if g.unsure(spec):
            unsure += 1
            continue
        if reason is None:
            expected_fused += 1
            continue
        for name in spec.nodes:
            assert after.get(name) == before[name], f"{reason}: node {name} of a refused block changed or vanished"
            node = next(n for n in model.graph.node if n.name == name)
            for i in node.input:
                if i in consts_before:
                    assert consts_after.get(i) == consts_before[i], f"{reason}: constant {i} changed"
    fused = [n for n in out.graph.node if n.domain == DOMAIN and n.op_type == OP_TYPE]
    assert len(result.report.fused) == len(fused) and expected_fused <= len(fused) <= expected_fused + unsure, (
        [(s.gelu, s.linear, g.must_refuse(s)) for s in g.blocks], result.report.refused)
    for r in result.report.refused:
        for name in r.nodes:
            assert after.get(name) == before.get(name), f"refused block node {name} changed: {r.reason}"

    got = run(out, feeds(model, g.dtype, g.seed))
    assert len(got) == len(want)
    for a, b in zip(want, got):
        assert close(a, b, g.dtype), f"max |diff| {np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))}"
    return model, out


@settings(settings.get_profile(PROFILE))
@given(g=graph_specs(), leak_choice=st.integers(0, 7))
def test_fusion_is_exact_and_refusals_are_untouched(g, leak_choice):
    check_example(g, leak_choice)


# --- the real kernel on a sample -------------------------------------------------------------------------
def _ort_outputs(model: onnx.ModelProto, feeds: dict, fused: bool, library_path: str):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if fused:
        so.register_custom_ops_library(library_path)
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(g=graph_specs(), leak_choice=st.integers(0, 7))
def test_sample_through_the_cpu_kernel(g, leak_choice, library_path):
    """The same graphs in ONNX Runtime: the original as written (no library), the optimized one with the
    op library's CPU kernel; float32 and float16 (ORT's CPU has no bfloat16 kernels for most ops)."""
    assume(g.dtype in ("float32", "float16"))
    model, out = check_example(g, leak_choice)
    assume(any(n.domain == DOMAIN for n in out.graph.node))
    x = feeds(model, g.dtype, g.seed)
    try:
        want = _ort_outputs(model, x, False, library_path)
    except Exception as e:  # ORT lacks a CPU kernel for some op/dtype pairs of the original (fp16 Erf, ...)
        if "NOT_IMPLEMENTED" in str(e) or "Could not find an implementation" in str(e):
            assume(False)
        raise
    got = _ort_outputs(out, x, True, library_path)
    for a, b in zip(want, got):
        assert close(a, b, g.dtype), f"max |diff| {np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))}"


def test_generator_reaches_every_knob():
    """The strategy is not silently narrow: over a fixed draw it makes every form, dtype and never-fuse
    reason."""
    seen_forms, seen_reasons, seen_dtypes = set(), set(), set()

    @settings(max_examples=300, deadline=None, derandomize=True, database=None)
    @given(g=graph_specs())
    def collect(g):
        seen_dtypes.add((g.dtype, g.cast_wrap))
        for s in g.blocks:
            seen_forms.add((s.gelu, s.linear))
            seen_reasons.add(g.must_refuse(s))

    collect()
    assert {f for f, _ in seen_forms} == set(ALL_FORMS)
    assert {lin for _, lin in seen_forms} == set(LINEAR_FORMS)
    assert {"dtype outside T", "Gemm transA=1", "batched W", "near-miss constant", "leaked intermediate",
            "bias not broadcast over the last axis", "Gemm alpha on a run-time weight", None} <= seen_reasons
    assert {("float16", True), ("bfloat16", True), ("float16", False), ("float32", False)} <= seen_dtypes
