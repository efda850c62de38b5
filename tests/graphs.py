"""Hand-built test graphs: every GELU form × every Linear form × knobs, composable.

    model = build(gelu="erf:pytorch", linear="matmul", bias=True, dtype="float16", rank=3)

A GELU form is a function ``(Builder, x) -> y`` that appends nodes (``GELU_FORMS``); a Linear form is a
function ``(Builder, x, bias) -> pre-activation`` (``LINEAR_FORMS``). Knobs live on the Builder and apply
to every node it makes:

* ``swap``         — every binary commutative node (Mul, Add) gets its operands in the other order;
* ``const_style``  — constants as 0-d initializers ("initializer"), ``Constant`` nodes ("node"), or
                     one-element ``[1]`` tensors ("one_element");
* ``dtype``        — float32/float16/bfloat16 for the whole graph; ``cast_wrap`` computes the activation
                     in float32 between Casts (ORT's float16 converter);
* ``perturb``      — a dict {constant role: value} to write near-miss constants ("sqrt2", "half", "one",
                     "inv_sqrt2", "sqrt_2_over_pi", "cubic", "sigmoid_alpha").

``build_gated`` makes T5 v1.1's gelu(x·Wi0) * (x·Wi1). Extra consumers/outputs for negative tests are
added with ``Builder.output(name, shape)`` or ``Builder.node(...)`` on intermediates (``Builder.tensors``).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper, numpy_helper

NP_DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16,
             "float64": np.float64}
ONNX_DTYPES = {"float32": T.FLOAT, "float16": T.FLOAT16, "bfloat16": T.BFLOAT16, "float64": T.DOUBLE}
REFERENCE = {  # the constants as exporters write them
    "sqrt2": math.sqrt(2.0), "inv_sqrt2": 1 / math.sqrt(2.0), "half": 0.5, "one": 1.0,
    "sqrt_2_over_pi": math.sqrt(2 / math.pi), "cubic": 0.044715, "sigmoid_alpha": 1.702,
}


@dataclass
class Builder:
    dtype: str = "float32"
    swap: bool = False
    const_style: str = "initializer"
    cast_wrap: bool = False
    perturb: dict = field(default_factory=dict)
    seed: int = 0
    opset: int = 20
    nodes: list = field(default_factory=list)
    initializers: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    tensors: dict = field(default_factory=dict)  # role -> tensor name, for tests that poke at intermediates
    act_dtype: str | None = None  # the dtype GELU constants are written in (float32 inside Casts)
    _count: itertools.count = field(default_factory=itertools.count)

    def __post_init__(self):
        self.rng = np.random.default_rng(self.seed)
        self.act_dtype = self.act_dtype or self.dtype

    # --- naming and nodes -------------------------------------------------------------------------
    def fresh(self, stem: str) -> str:
        return f"{stem}_{next(self._count)}"

    def node(self, op: str, inputs, *, domain: str = "", outputs: int = 1, role: str | None = None, **attrs):
        name = self.fresh(op)
        outs = [f"{name}_out{k}" if outputs > 1 else f"{name}_out" for k in range(outputs)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, name=name, domain=domain, **attrs))
        if role:
            self.tensors[role] = outs[0]
        return outs[0] if outputs == 1 else outs

    def comm(self, op: str, a: str, b: str, **kw) -> str:
        """A binary commutative node; ``swap`` writes its operands in the other order."""
        return self.node(op, [b, a] if self.swap else [a, b], **kw)

    # --- constants ---------------------------------------------------------------------------------
    def const(self, role_or_value, dtype: str | None = None) -> str:
        """A scalar constant in the configured style; a role name takes REFERENCE (or ``perturb``)."""
        if isinstance(role_or_value, str):
            value = self.perturb.get(role_or_value, REFERENCE[role_or_value])
        else:
            value = role_or_value
        dtype = dtype or self.act_dtype
        arr = np.array(value, dtype=NP_DTYPES[dtype])
        if self.const_style == "one_element":
            arr = arr.reshape(1)
        name = self.fresh("c")
        tensor = numpy_helper.from_array(arr, name)
        if self.const_style == "node":
            self.nodes.append(helper.make_node("Constant", [], [name], name=self.fresh("Constant"), value=tensor))
        else:
            self.initializers.append(tensor)
        return name

    def tensor(self, stem: str, shape, scale: float = 1.0, as_node: bool = False) -> str:
        """A random constant tensor (weights, biases) of the graph dtype."""
        value = (self.rng.standard_normal(shape) * scale).astype(NP_DTYPES[self.dtype])
        name = self.fresh(stem)
        tensor = numpy_helper.from_array(value, name)
        if as_node:
            self.nodes.append(helper.make_node("Constant", [], [name], name=self.fresh("Constant"), value=tensor))
        else:
            self.initializers.append(tensor)
        return name

    # --- model -------------------------------------------------------------------------------------
    def output(self, name: str, shape) -> None:
        """Make an intermediate a graph output too (negative tests)."""
        self.outputs.append((name, shape))

    def model(self, inputs: list[tuple[str, list]], outputs: list[tuple[str, list]], *,
              extra_opsets=()) -> onnx.ModelProto:
        elem = ONNX_DTYPES[self.dtype]
        graph = helper.make_graph(
            self.nodes, "test",
            [helper.make_tensor_value_info(n, elem, s) for n, s in inputs],
            [helper.make_tensor_value_info(n, elem, s) for n, s in outputs + self.outputs],
            self.initializers,
        )
        opsets = [helper.make_opsetid("", self.opset), helper.make_opsetid("com.microsoft", 1), *extra_opsets]
        model = helper.make_model(graph, opset_imports=opsets, producer_name="tests.graphs")
        model.ir_version = 9
        return model


# --- GELU forms: (Builder, x) -> y -------------------------------------------------------------------
def _erf(grouping: str, scale_op: str):
    def build(b: Builder, x: str) -> str:
        if scale_op == "div":
            arg = b.node("Div", [x, b.const("sqrt2")])
        else:
            arg = b.comm("Mul", x, b.const("inv_sqrt2"))
        e = b.node("Erf", [arg], role="erf")
        p = b.comm("Add", e, b.const("one"), role="one_plus")
        half = b.const("half")
        if grouping == "pytorch":  # (x * p) * 0.5
            return b.comm("Mul", b.comm("Mul", x, p, role="xp"), half)
        if grouping == "assoc":  # x * (p * 0.5)
            return b.comm("Mul", x, b.comm("Mul", p, half))
        if grouping == "keras":  # (0.5 * x) * p
            return b.comm("Mul", b.comm("Mul", half, x, role="halfx"), p)
        raise ValueError(grouping)

    return build


def _tanh(cube: str):
    def build(b: Builder, x: str) -> str:
        if cube == "pow":
            x3 = b.node("Pow", [x, b.const(3.0)])
        elif cube == "mul":
            x3 = b.comm("Mul", b.comm("Mul", x, x), x)
        else:
            raise ValueError(cube)
        inner = b.comm("Add", x, b.comm("Mul", x3, b.const("cubic")))
        t = b.node("Tanh", [b.comm("Mul", inner, b.const("sqrt_2_over_pi"))], role="tanh")
        p = b.comm("Add", t, b.const("one"))
        return b.comm("Mul", b.comm("Mul", b.const("half"), x), p)

    return build


def _tanh_bloom(b: Builder, x: str) -> str:
    """BLOOM/Megatron: x * 0.5 * (1 + tanh(0.79788456 * x * (1 + 0.044715 * x * x)))."""
    q = b.comm("Add", b.const("one"), b.comm("Mul", b.comm("Mul", b.const("cubic"), x), x))
    t = b.node("Tanh", [b.comm("Mul", b.comm("Mul", b.const("sqrt_2_over_pi"), x), q)], role="tanh")
    return b.comm("Mul", b.comm("Mul", x, b.const("half")), b.comm("Add", b.const("one"), t))


def _sigmoid(b: Builder, x: str) -> str:
    s = b.node("Sigmoid", [b.comm("Mul", x, b.const("sigmoid_alpha"))], role="sigmoid")
    return b.comm("Mul", x, s)


def _op(op: str, domain: str = "", **attrs):
    def build(b: Builder, x: str) -> str:
        return b.node(op, [x], domain=domain, **attrs)

    return build


GELU_FORMS = {
    "onnx:none": _op("Gelu"),
    "onnx:tanh": _op("Gelu", approximate="tanh"),
    "ms:Gelu": _op("Gelu", "com.microsoft"),
    "ms:FastGelu": _op("FastGelu", "com.microsoft"),
    "ms:QuickGelu": _op("QuickGelu", "com.microsoft", alpha=1.702),
    **{f"erf:{g}:{s}": _erf(g, s) for g in ("pytorch", "assoc", "keras") for s in ("div", "mul")},
    "tanh:pow": _tanh("pow"),
    "tanh:mul": _tanh("mul"),
    "tanh:bloom": _tanh_bloom,
    "sigmoid": _sigmoid,
}
# Forms that take the Linear's bias as their own second input.
BIAS_GELU_FORMS = {"ms:BiasGelu": "BiasGelu", "ms:FastGelu+bias": "FastGelu"}
ALL_GELU_FORMS = [*GELU_FORMS, *BIAS_GELU_FORMS]
APPROXIMATE = {"onnx:none": "none", "onnx:tanh": "tanh", "ms:Gelu": "none", "ms:FastGelu": "tanh",
               "ms:QuickGelu": "sigmoid", "ms:BiasGelu": "none", "ms:FastGelu+bias": "tanh",
               "tanh:pow": "tanh", "tanh:mul": "tanh", "tanh:bloom": "tanh", "sigmoid": "sigmoid",
               **{f: "none" for f in GELU_FORMS if f.startswith("erf:")}}


# --- Linear forms: (Builder, x, K, N, bias) -> pre-activation ----------------------------------------
def _weight(b: Builder, shape, k: int, kw: dict) -> str:
    """A weight constant; ``w_dynamic=True`` makes it a run-time value (Neg of the constant: an Identity or
    Cast of a constant is that constant to the rewriter)."""
    w = b.tensor("W", shape, 1 / math.sqrt(k), as_node=kw.get("w_as_node", False))
    return b.node("Neg", [w]) if kw.get("w_dynamic") else w


def _matmul(b: Builder, x: str, k: int, n: int, bias: bool, **kw) -> str:
    y = b.node("MatMul", [x, _weight(b, (k, n), k, kw)],
               role="linear_out")
    if bias:
        y = b.comm("Add", y, b.tensor("B", kw.get("bias_shape", (n,)), 0.1), role="bias_out")
    return y


def _gemm(trans_b: int):
    def build(b: Builder, x: str, k: int, n: int, bias: bool, **kw) -> str:
        w = _weight(b, (n, k) if trans_b else (k, n), k, kw)
        inputs = [x, w] + ([b.tensor("C", kw.get("bias_shape", (n,)), 0.1)] if bias else [])
        attrs = {"transB": trans_b}
        if "alpha" in kw:
            attrs["alpha"] = kw["alpha"]
        if "beta" in kw:
            attrs["beta"] = kw["beta"]
        if kw.get("trans_a"):
            attrs["transA"] = 1
        return b.node("Gemm", inputs, role="linear_out", **attrs)

    return build


def _reshape_gemm(b: Builder, x: str, k: int, n: int, bias: bool, **kw) -> str:
    """GPT-2 Conv1D: Reshape(x, [-1, K]) → Gemm → Reshape back to [..., N] (dynamic target shape)."""
    flat = b.node("Reshape", [x, _i64(b, [-1, k])])
    y = _gemm(kw.get("trans_b", 0))(b, flat, k, n, bias, **kw)
    lead = b.node("Slice", [b.node("Shape", [x]), _i64(b, [0]), _i64(b, [-1])])
    shape = b.node("Concat", [lead, _i64(b, [n])], axis=0)
    return b.node("Reshape", [y, shape], role="reshape_out")


def _i64(b: Builder, values) -> str:
    name = b.fresh("shape")
    b.initializers.append(numpy_helper.from_array(np.array(values, dtype=np.int64), name))
    return name


LINEAR_FORMS = {
    "matmul": _matmul,
    "gemm:transB0": _gemm(0),
    "gemm:transB1": _gemm(1),
    "reshape_gemm": _reshape_gemm,
}


def _gelu(b: Builder, form: str, x: str, bias_name: str | None) -> str:
    if form in BIAS_GELU_FORMS:
        return b.node(BIAS_GELU_FORMS[form], [x, bias_name], domain="com.microsoft")
    return GELU_FORMS[form](b, x)


def input_shape(linear: str, rank: int, k: int) -> list:
    if linear.startswith("gemm"):
        return ["m", k]
    return (["batch", "seq", 4][: rank - 1] if rank <= 4 else ["d"] * (rank - 1)) + [k]


def build(gelu: str = "onnx:none", linear: str = "matmul", *, bias: bool = True, dtype: str = "float32",
          rank: int = 3, k: int = 16, n: int = 24, swap: bool = False, const_style: str = "initializer",
          cast_wrap: bool = False, perturb: dict | None = None, seed: int = 0, **linear_kw) -> onnx.ModelProto:
    """One Linear+GELU block: X → Linear → GELU → Y (rank-``rank`` X for MatMul forms, 2-D for Gemm)."""
    b = Builder(dtype=dtype, swap=swap, const_style=const_style, cast_wrap=cast_wrap, perturb=perturb or {},
                seed=seed, act_dtype="float32" if cast_wrap else dtype)
    y = block(b, "x", gelu, linear, bias=bias, k=k, n=n, **linear_kw)
    shape = input_shape(linear, rank, k)
    return b.model([("x", shape)], [(y, shape[:-1] + [n])])


def block(b: Builder, x: str, gelu: str, linear: str, *, bias: bool = True, k: int = 16, n: int = 24,
          **linear_kw) -> str:
    """Append one Linear+GELU block reading ``x``; returns its output (compose several into one model)."""
    bias_forms = gelu in BIAS_GELU_FORMS
    pre = LINEAR_FORMS[linear](b, x, k, n, bias and not bias_forms, **linear_kw)
    bias_name = b.tensor("B", (n,), 0.1) if bias_forms else None
    if b.cast_wrap:
        pre = b.node("Cast", [pre], to=T.FLOAT, role="upcast")
    y = _gelu(b, gelu, pre, bias_name)
    if b.cast_wrap:
        y = b.node("Cast", [y], to=ONNX_DTYPES[b.dtype], role="downcast")
    b.tensors["gelu_out"] = y
    return y


def build_gated(gelu: str = "tanh:pow", *, dtype: str = "float32", k: int = 16, n: int = 24) -> onnx.ModelProto:
    """T5 v1.1 gated GELU: gelu(x·Wi0) * (x·Wi1) → x·Wo."""
    b = Builder(dtype=dtype)
    g = block(b, "x", gelu, "matmul", bias=False, k=k, n=n)
    lin = _matmul(b, "x", k, n, False)
    h = b.node("Mul", [g, lin])
    y = _matmul(b, h, n, k, False)
    shape = input_shape("matmul", 3, k)
    return b.model([("x", shape)], [(y, shape)])


def build_mlp(layers: int = 2, gelu: str = "erf:pytorch:div", *, dtype: str = "float32", k: int = 16,
              n: int = 32) -> onnx.ModelProto:
    """A small transformer-style MLP stack: (Linear+GELU → Linear + residual) × ``layers``."""
    b = Builder(dtype=dtype)
    x = "x"
    for _ in range(layers):
        h = block(b, x, gelu, "matmul", k=k, n=n)
        down = _matmul(b, h, n, k, True)
        x = b.node("Add", [x, down])
    shape = input_shape("matmul", 3, k)
    return b.model([("x", shape)], [(x, shape)])
