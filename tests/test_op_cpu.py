"""The CPU FusedLinearGelu kernel in a real ONNX Runtime session, against a float64 NumPy reference.

The reference takes the same dtype-rounded inputs the kernel sees and computes in float64; tolerances are
a few units of the output type's rounding, scaled for the GEMM's accumulation error, so a wrong epilogue,
a dropped bias, a transposed weight or a tile-edge bug fails. Covers every dtype, GELU form, transB,
bias/no bias, ranks 2-4, odd sizes (1, 7, 33, 4097), multi-tile problems, zero-size dims, both the vector
and the portable code paths, and the errors ORT reports for bad shapes and attributes.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxfuse
from onnxfuse.domain import DOMAIN, OP_TYPE, DOMAIN_VERSION
from onnxfuse.runtime import create_session

_ONNX_TYPE = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}
_NP_TYPE = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
# Unit roundoff of the output type: the one rounding the fused kernel does at the end.
_ROUNDOFF = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
_erf = np.frompyfunc(math.erf, 1, 1)


def gelu64(y: np.ndarray, approximate: str, alpha: float = 1.702) -> np.ndarray:
    if approximate == "none":
        return 0.5 * y * (1.0 + _erf(y / math.sqrt(2.0)).astype(np.float64))
    if approximate == "tanh":
        return 0.5 * y * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (y + 0.044715 * y**3)))
    return y / (1.0 + np.exp(-alpha * y))


def reference(x, w, b, approximate, trans_b, alpha=1.702):
    w64 = w.astype(np.float64)
    y = x.astype(np.float64) @ (w64.T if trans_b else w64)
    if b is not None:
        y = y + b.astype(np.float64)
    return gelu64(y, approximate, alpha)


def op_model(dtype, x_shape, w_shape, bias, approximate="none", trans_b=1, alpha=None, w_init=None,
             dynamic=False):
    """One FusedLinearGelu node. W is a graph input, or an initializer when `w_init` is given.

    bfloat16: numpy (and so ORT's Python binding) has no bf16, so the graph's inputs and output are float32
    with exact Casts around the node (every fed value is already bf16-representable)."""
    t = _ONNX_TYPE[dtype]
    io_t = TensorProto.FLOAT if dtype == "bfloat16" else t
    attrs = {"approximate": approximate, "transB": trans_b}
    if alpha is not None:
        attrs["alpha"] = alpha
    names = ["X", "W", "B"] if bias else ["X", "W"]
    nodes, graph_inputs, initializers = [], [], []
    n_dim = w_shape[0] if trans_b else w_shape[1]
    dims = {
        "X": [f"d{i}" for i in range(len(x_shape))] if dynamic else list(x_shape),
        "W": ["wa", "wb"] if dynamic else list(w_shape),
        "B": ["n"] if dynamic else [n_dim],
    }
    op_inputs = []
    for name in names:
        if name == "W" and w_init is not None:
            initializers.append(numpy_helper.from_array(w_init, "W"))
            op_inputs.append("W")
            continue
        graph_inputs.append(helper.make_tensor_value_info(name, io_t, dims[name]))
        if dtype == "bfloat16":
            nodes.append(helper.make_node("Cast", [name], [name + "_bf16"], to=t))
            op_inputs.append(name + "_bf16")
        else:
            op_inputs.append(name)
    y_name = "Y_bf16" if dtype == "bfloat16" else "Y"
    nodes.append(helper.make_node(OP_TYPE, op_inputs, [y_name], domain=DOMAIN, **attrs))
    if dtype == "bfloat16":
        nodes.append(helper.make_node("Cast", ["Y_bf16"], ["Y"], to=TensorProto.FLOAT))
    graph = helper.make_graph(nodes, "op", graph_inputs, [helper.make_tensor_value_info("Y", io_t, None)], initializers)
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid(DOMAIN, DOMAIN_VERSION)], ir_version=10
    )


def make_inputs(rng, dtype, x_shape, k, n, trans_b, bias):
    np_t = _NP_TYPE[dtype]
    x = rng.standard_normal(x_shape).astype(np.float32).astype(np_t)
    w = (rng.standard_normal((n, k) if trans_b else (k, n)) / math.sqrt(max(k, 1))).astype(np.float32).astype(np_t)
    b = (0.5 * rng.standard_normal(n)).astype(np.float32).astype(np_t) if bias else None
    return x, w, b


def assert_close(y, ref, dtype, k):
    """|y - ref| <= 4·u·|ref| + (accumulation error of a length-k fp32 dot product) + 2·u."""
    u = _ROUNDOFF[dtype]
    y64 = np.asarray(y).astype(np.float64)
    assert y64.shape == ref.shape
    tol = 4 * u * np.abs(ref) + 2.0**-24 * 4 * math.sqrt(max(k, 1)) + 2 * u
    err = np.abs(y64 - ref)
    worst = np.unravel_index(np.argmax(err - tol), err.shape) if err.size else None
    assert np.all(err <= tol), f"max excess at {worst}: got {y64[worst]}, want {ref[worst]} (tol {tol[worst]:.3g})"


def _feed(a):
    return a.astype(np.float32) if a.dtype == ml_dtypes.bfloat16 else a


def run(session, x, w, b, w_is_input=True):
    feeds = {"X": _feed(x)}
    if w_is_input:
        feeds["W"] = _feed(w)
    if b is not None:
        feeds["B"] = _feed(b)
    (y,) = session.run(None, feeds)
    if x.dtype == ml_dtypes.bfloat16:  # the output Cast is exact only if the op produced bf16 values
        assert np.array_equal(y.astype(ml_dtypes.bfloat16).astype(np.float32), y, equal_nan=True)
        return y.astype(ml_dtypes.bfloat16)
    return y


# Every (dtype, form, transB, bias) combination runs on one of these X shapes (rank 2-4, the odd sizes
# 1, 7, 33, 4097 as M, K and N, and problems spanning several 128x512 tiles with ragged edges).
SHAPES = [  # (x_shape, N)
    ((1, 7), 33),
    ((7, 33), 4097),
    ((2, 7, 33), 7),
    ((4097, 7), 1),
    ((2, 3, 5, 33), 7),
    ((300, 64), 1100),
    ((1, 4097), 33),
    ((3, 1, 129, 16), 513),
]
DTYPES = ("float32", "float16", "bfloat16")
FORMS = ("none", "tanh", "sigmoid")
CASES = [
    (dtype, form, trans_b, bias)
    for dtype in DTYPES
    for form in FORMS
    for trans_b in (1, 0)
    for bias in (True, False)
]


@pytest.mark.parametrize("dtype,form,trans_b,bias", CASES)
def test_matches_float64_reference(dtype, form, trans_b, bias, rng):
    index = CASES.index((dtype, form, trans_b, bias))
    for x_shape, n in (SHAPES[index % len(SHAPES)], SHAPES[(index + 3) % len(SHAPES)]):
        k = x_shape[-1]
        x, w, b = make_inputs(rng, dtype, x_shape, k, n, trans_b, bias)
        model = op_model(dtype, x_shape, w.shape, bias, form, trans_b)
        y = run(create_session(model, providers="cpu"), x, w, b)
        assert y.dtype == _NP_TYPE[dtype]
        assert_close(y, reference(x, w, b, form, trans_b), dtype, k)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("trans_b", (1, 0))
def test_constant_weight(dtype, trans_b, rng):
    """W as an initializer: float16/bfloat16 kernels widen it once at creation; results must not change
    between runs or with new X."""
    x_shape, n = (130, 96), 600
    x, w, b = make_inputs(rng, dtype, x_shape, 96, n, trans_b, True)
    sess = create_session(op_model(dtype, x_shape, w.shape, True, "none", trans_b, w_init=w), providers="cpu")
    for _ in range(2):
        y = run(sess, x, w, b, w_is_input=False)
        assert_close(y, reference(x, w, b, "none", trans_b), dtype, 96)
        x = rng.standard_normal(x_shape).astype(np.float32).astype(_NP_TYPE[dtype])


def test_sigmoid_alpha_is_used(rng):
    x, w, b = make_inputs(rng, "float32", (9, 16), 16, 24, 1, True)
    for alpha in (1.0, 1.702, 3.5):
        sess = create_session(op_model("float32", (9, 16), w.shape, True, "sigmoid", 1, alpha=alpha), providers="cpu")
        assert_close(run(sess, x, w, b), reference(x, w, b, "sigmoid", 1, alpha), "float32", 16)


def test_dynamic_shapes_one_session(rng):
    """One session, several X shapes and ranks-worth of leading dims through symbolic dims."""
    sess = create_session(op_model("float32", (1, 1, 8), (5, 8), True, dynamic=True), providers="cpu")
    for x_shape in ((1, 1, 8), (3, 17, 8), (2, 200, 8)):
        x, w, b = make_inputs(rng, "float32", x_shape, 8, 5, 1, True)
        y = run(sess, x, w, b)
        assert y.shape == x_shape[:-1] + (5,)
        assert_close(y, reference(x, w, b, "none", 1), "float32", 8)


@pytest.mark.parametrize("form", FORMS)
def test_activation_accuracy_over_the_real_line(form):
    """K=1, W=1, B=0: Y = act(X) exactly, so this isolates the vectorized erf/exp against float64 over
    [-12, 12] (both tails, the piece boundaries) and checks it is within fp32 rounding: a few ulp of the
    result, plus 3e-8·|x| where GELU's negative tail is smaller than fp32 can resolve against x."""
    x = np.concatenate([np.linspace(-12, 12, 240001), [-0.0, 0.0, 1e-30, -1e-30, 0.921875 * math.sqrt(2)]])
    x = x.astype(np.float32).reshape(-1, 1)
    w = np.ones((1, 1), np.float32)
    b = np.zeros(1, np.float32)
    sess = create_session(op_model("float32", x.shape, (1, 1), True, form, 1), providers="cpu")
    y = run(sess, x, w, b).astype(np.float64)
    ref = gelu64(x.astype(np.float64), form)
    err = np.abs(y - ref)
    tol = 8 * 2.0**-24 * np.abs(ref) + 3e-8 * np.abs(x.astype(np.float64)) + 1e-38
    assert np.all(err <= tol), f"worst at x={x[np.argmax(err - tol)]}: {y[np.argmax(err - tol)]} vs {ref[np.argmax(err - tol)]}"
    assert np.all(np.isfinite(y))


def test_portable_path_matches_reference(tmp_path):
    """ONNXFUSE_CPU_ISA=scalar forces the portable path, OpenBLAS + scalar epilogue (chosen once per
    process, hence a subprocess): one tile, several tiles with transB=0 and no bias, and K=0."""
    script = tmp_path / "scalar.py"
    script.write_text(
        "import json, sys\n"
        "sys.path[:0] = %r\n"
        "import numpy as np\n"
        "import test_op_cpu as t\n"
        "rng = np.random.default_rng(1)\n"
        "worst = 0.0\n"
        "cases = [((37, 29), 45, 1, True), ((2, 150, 20), 530, 0, False), ((5, 0), 7, 1, True)]\n"
        "for dtype in t.DTYPES:\n"
        "    for form in t.FORMS:\n"
        "        for x_shape, n, trans_b, bias in cases:\n"
        "            k = x_shape[-1]\n"
        "            x, w, b = t.make_inputs(rng, dtype, x_shape, k, n, trans_b, bias)\n"
        "            s = t.create_session(t.op_model(dtype, x.shape, w.shape, bias, form, trans_b), providers='cpu')\n"
        "            t.assert_close(t.run(s, x, w, b), t.reference(x, w, b, form, trans_b), dtype, k)\n"
        "print(json.dumps('ok'))\n" % [os.path.dirname(__file__), os.path.dirname(os.path.dirname(onnxfuse.__file__))]
    )
    env = dict(os.environ, ONNXFUSE_CPU_ISA="scalar")
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == "ok"


@pytest.mark.parametrize("dtype", DTYPES)
def test_zero_size_dims(dtype, rng):
    np_t = _NP_TYPE[dtype]
    # M = 0 and N = 0: empty outputs of the right shape.
    for x_shape, n in (((0, 8), 5), ((2, 0, 8), 5), ((3, 8), 0)):
        x = np.zeros(x_shape, np_t)
        w = np.zeros((n, 8), np_t)
        b = np.zeros(n, np_t)
        sess = create_session(op_model(dtype, x_shape, w.shape, True, dynamic=True), providers="cpu")
        assert run(sess, x, w, b).shape == x_shape[:-1] + (n,)
    # K = 0: the product is empty, Y = act(B).
    x = np.zeros((4, 0), np_t)
    w = np.zeros((6, 0), np_t)
    b = rng.standard_normal(6).astype(np.float32).astype(np_t)
    sess = create_session(op_model(dtype, (4, 0), (6, 0), True, dynamic=True), providers="cpu")
    y = run(sess, x, w, b)
    assert_close(y, np.broadcast_to(gelu64(b.astype(np.float64), "none"), (4, 6)), dtype, 0)


# --- errors: ORT statuses with a clear message, never an abort ---------------------------------------


def _run_error(model, feeds) -> str:
    sess = create_session(model, providers="cpu")
    with pytest.raises(Exception) as info:
        sess.run(None, feeds)
    return str(info.value)


@pytest.mark.parametrize(
    "x_shape,w_shape,b_shape,expect",
    [
        ((4, 8), (5, 7), (5,), "K mismatch"),
        ((4, 8), (5, 8), (6,), "input B must have shape [N] = [5]"),
        ((4, 8), (5, 8), (1, 5), "input B must have shape [N] = [5]"),
        ((8,), (5, 8), (5,), "input X must have rank >= 2"),
        ((4, 8), (2, 5, 8), (5,), "input W must have rank 2"),
    ],
)
def test_bad_shapes_are_errors(x_shape, w_shape, b_shape, expect):
    model = op_model("float32", x_shape, w_shape, True, dynamic=True)
    # Symbolic dims let the bad shapes reach the kernel; its status is the error the user sees.
    model.graph.input[0].type.tensor_type.shape.ClearField("dim")
    model.graph.input[1].type.tensor_type.shape.ClearField("dim")
    model.graph.input[2].type.tensor_type.shape.ClearField("dim")
    feeds = {"X": np.ones(x_shape, np.float32), "W": np.ones(w_shape, np.float32), "B": np.ones(b_shape, np.float32)}
    message = _run_error(model, feeds)
    assert "FusedLinearGelu" in message and expect in message, message


@pytest.mark.parametrize(
    "attrs,expect",
    [
        ({"approximate": "erf"}, "approximate='erf' is not one of"),
        ({"transB": 2}, "transB=2 must be 0 or 1"),
    ],
)
def test_bad_attributes_are_errors(attrs, expect):
    model = op_model("float32", (2, 3), (4, 3), True)
    node = model.graph.node[0]
    del node.attribute[:]
    node.attribute.extend(helper.make_attribute(k, v) for k, v in attrs.items())
    with pytest.raises(Exception) as info:
        create_session(model, providers="cpu").run(
            None, {"X": np.ones((2, 3), np.float32), "W": np.ones((4, 3), np.float32), "B": np.ones(4, np.float32)}
        )
    assert expect in str(info.value), str(info.value)


def test_mismatched_types_are_rejected():
    model = op_model("float32", (2, 3), (4, 3), True)
    model.graph.input[1].type.tensor_type.elem_type = TensorProto.FLOAT16
    with pytest.raises(Exception):
        create_session(model, providers="cpu").run(
            None, {"X": np.ones((2, 3), np.float32), "W": np.ones((4, 3), np.float16), "B": np.ones(4, np.float32)}
        )


def test_concurrent_runs_share_one_kernel(rng):
    """ORT may call Compute from several threads at once on one session: results stay exact."""
    from concurrent.futures import ThreadPoolExecutor

    x_shape, n = (200, 48), 700
    x, w, b = make_inputs(rng, "float16", x_shape, 48, n, 1, True)
    sess = create_session(op_model("float16", x_shape, w.shape, True, w_init=w), providers="cpu")
    ref = reference(x, w, b, "none", 1)
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda _: run(sess, x, w, b, w_is_input=False), range(8)))
    for y in outs:
        assert_close(y, ref, "float16", 48)
