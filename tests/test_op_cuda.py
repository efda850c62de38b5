"""The CUDA FusedLinearGelu kernel inside ONNX Runtime's CUDA execution provider.

Every check runs the op through a real ORT session with the CUDA provider and compares it with a float64
reference computed from the same (dtype-rounded) inputs, and with the error of ORT's own unfused path
(MatMul → Add → Gelu, or the Sigmoid form) on those inputs: the fused node may be at most 1.05 × as far
from float64 as ORT itself is. Skips, with the reason, where there is no CUDA provider or no GPU.
"""

from __future__ import annotations

import math
import threading
import zlib

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxfuse.domain import DOMAIN, DOMAIN_VERSION, OP_TYPE
from onnxfuse.runtime import CUDA, cuda_unusable_reason


_NO_CUDA = cuda_unusable_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_NO_CUDA is not None, reason=f"CUDA tests: {_NO_CUDA}")]

DTYPES = ("float32", "float16", "bfloat16")
ACTIVATIONS = ("none", "tanh", "sigmoid")
SIGMOID_ALPHA = 1.702
_ONNX_TYPE = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}
_NP_TYPE = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
# Unit roundoff of the *output* type (TF32 keeps 10 mantissa bits, like fp16): the slack a tiny output
# (a few hundred numbers, too few for a stable error ratio) gets on top of the 1.05 × ORT bound.
_ROUNDOFF = {"float32": 2.0**-11, "float16": 2.0**-11, "bfloat16": 2.0**-8}
_SMALL_OUTPUT = 16384


@pytest.fixture(scope="module", autouse=True)
def _cuda_libraries():
    # onnxruntime-gpu 1.2x+ finds the CUDA/cuDNN libraries of the nvidia-* wheels (torch's) this way.
    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()


@pytest.fixture(scope="module")
def library(library_path) -> str:
    return library_path


# --- models -------------------------------------------------------------------------------------------


def _initializer(name: str, values: np.ndarray, dtype: str):
    if dtype == "bfloat16":  # numpy has no bf16: the TensorProto takes the raw bits
        raw = values.astype(ml_dtypes.bfloat16).view(np.uint16).tobytes()
        return helper.make_tensor(name, TensorProto.BFLOAT16, list(values.shape), raw, raw=True)
    return numpy_helper.from_array(values.astype(_NP_TYPE[dtype]), name)


def _graph_io(dtype: str, x_shape, y_shape, body_in: str, body_out: str):
    """bf16 has no numpy type to feed or fetch, so bf16 graphs take and give float32 and Cast at both
    ends; inputs are pre-rounded to bf16, so both Casts are exact and the body sees the same numbers."""
    io_type = TensorProto.FLOAT if dtype == "bfloat16" else _ONNX_TYPE[dtype]
    nodes_in, nodes_out = [], []
    if dtype == "bfloat16":
        nodes_in = [helper.make_node("Cast", ["X"], [body_in], to=TensorProto.BFLOAT16)]
        nodes_out = [helper.make_node("Cast", [body_out], ["Y"], to=TensorProto.FLOAT)]
    else:
        body_in, body_out = "X", "Y"
    inputs = [helper.make_tensor_value_info("X", io_type, list(x_shape))]
    outputs = [helper.make_tensor_value_info("Y", io_type, list(y_shape))]
    return nodes_in, nodes_out, inputs, outputs, body_in, body_out


def _model(nodes, inputs, outputs, inits, fused: bool):
    opsets = [helper.make_opsetid("", 20)] + ([helper.make_opsetid(DOMAIN, DOMAIN_VERSION)] if fused else [])
    graph = helper.make_graph(nodes, "linear_gelu", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=opsets, ir_version=10).SerializeToString()


def fused_model(dtype, x_shape, w, b, approximate, trans_b, y_shape=None, x_dims=None):
    """One FusedLinearGelu node. ``w`` is stored as given ([N, K] for transB=1, [K, N] for transB=0)."""
    n = w.shape[0] if trans_b else w.shape[1]
    y_shape = y_shape or list(x_shape[:-1]) + [n]
    nin, nout, inputs, outputs, xin, yout = _graph_io(dtype, x_dims or x_shape, y_shape, "Xc", "Yc")
    attrs = {"approximate": approximate, "transB": int(trans_b)}
    if approximate == "sigmoid":
        attrs["alpha"] = SIGMOID_ALPHA
    node = helper.make_node(OP_TYPE, [xin, "W", "B" if b is not None else ""], [yout], domain=DOMAIN, **attrs)
    inits = [_initializer("W", w, dtype)] + ([_initializer("B", b, dtype)] if b is not None else [])
    return _model(nin + [node] + nout, inputs, outputs, inits, fused=True)


def unfused_model(dtype, x_shape, w_kn, b, approximate):
    """The same computation as exporters write it, for ORT's own kernels: MatMul (+ Add) + activation."""
    y_shape = list(x_shape[:-1]) + [w_kn.shape[1]]
    nin, nout, inputs, outputs, xin, yout = _graph_io(dtype, x_shape, y_shape, "Xc", "Yc")
    nodes = [helper.make_node("MatMul", [xin, "W"], ["xw"])]
    pre = "xw"
    inits = [_initializer("W", w_kn, dtype)]
    if b is not None:
        nodes.append(helper.make_node("Add", ["xw", "B"], ["pre"]))
        inits.append(_initializer("B", b, dtype))
        pre = "pre"
    if approximate == "sigmoid":
        inits.append(_initializer("alpha", np.array(SIGMOID_ALPHA, np.float32), dtype))
        nodes += [helper.make_node("Mul", [pre, "alpha"], ["ax"]), helper.make_node("Sigmoid", ["ax"], ["sx"]),
                  helper.make_node("Mul", [pre, "sx"], [yout])]
    else:
        nodes.append(helper.make_node("Gelu", [pre], [yout], approximate=approximate))
    return _model(nin + nodes + nout, inputs, outputs, inits, fused=False)


def cuda_session(model: bytes, library: str, cuda_graph=False, config=None, fallback=False):
    so = ort.SessionOptions()
    so.register_custom_ops_library(library)
    if not fallback:
        # A fused node that silently ran on the CPU would prove nothing about the CUDA kernel.
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    for k, v in (config or {}).items():
        so.add_session_config_entry(k, v)
    opts = {"device_id": "0"}
    if cuda_graph:
        opts["enable_cuda_graph"] = "1"
    providers = [(CUDA, opts)] + ([("CPUExecutionProvider", {})] if fallback else [])
    return ort.InferenceSession(model, so, providers=providers)


# --- references and errors -----------------------------------------------------------------------------


def _erf(x: np.ndarray) -> np.ndarray:
    try:
        from scipy.special import erf
    except ImportError:
        return np.vectorize(math.erf, otypes=[np.float64])(x)
    return erf(x)


def activation64(pre: np.ndarray, approximate: str) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        if approximate == "none":
            return 0.5 * pre * (1.0 + _erf(pre / math.sqrt(2.0)))
        if approximate == "tanh":
            return 0.5 * pre * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (pre + 0.044715 * pre**3)))
        return pre / (1.0 + np.exp(-SIGMOID_ALPHA * pre))


def rounded(a: np.ndarray, dtype: str) -> np.ndarray:
    """``a`` rounded to ``dtype`` (round to nearest even) and returned as float32/float16 for feeding."""
    r = a.astype(_NP_TYPE[dtype])
    return r.astype(np.float32) if dtype == "bfloat16" else r


def make_inputs(rng, x_shape, n, dtype, trans_b, bias):
    """X ~ N(0,1), W ~ N(0,1)/√K, b ~ N(0, 0.1), all exactly representable in ``dtype``."""
    k = x_shape[-1]
    x = rounded(rng.standard_normal(x_shape), dtype)
    w_nk = rounded(rng.standard_normal((n, k)) / math.sqrt(max(k, 1)), dtype).astype(np.float32)
    b = rounded(rng.standard_normal(n) * 0.1, dtype).astype(np.float32) if bias else None
    return x, w_nk, b


def reference(x, w_nk, b, approximate):
    pre = x.astype(np.float64) @ w_nk.astype(np.float64).T
    if b is not None:
        pre = pre + b.astype(np.float64)
    return activation64(pre, approximate)


def rel_l2(y: np.ndarray, ref: np.ndarray) -> float:
    den = np.linalg.norm(ref)
    return float(np.linalg.norm(y.astype(np.float64) - ref) / (den if den > 0 else 1.0))


def fused_and_unfused(library, dtype, x, w_nk, b, approximate, trans_b=1):
    """(fused Y, ORT-unfused Y) for one case; the fused node takes W as [N, K] (trans_b=1) or [K, N]."""
    w = w_nk if trans_b else np.ascontiguousarray(w_nk.T)
    fused = cuda_session(fused_model(dtype, x.shape, w, b, approximate, trans_b), library)
    (y_fused,) = fused.run(None, {"X": x})
    del fused
    # ORT's own path may put a node it has no CUDA kernel for on the CPU: that is ORT's unfused path too.
    unfused = cuda_session(unfused_model(dtype, x.shape, np.ascontiguousarray(w_nk.T), b, approximate), library,
                           fallback=True)
    (y_unfused,) = unfused.run(None, {"X": x})
    return y_fused, y_unfused


def run_pair(library, dtype, x, w_nk, b, approximate, trans_b):
    """(fused Y, ORT-unfused Y, float64 reference) for one case."""
    return (*fused_and_unfused(library, dtype, x, w_nk, b, approximate, trans_b), reference(x, w_nk, b, approximate))


def check_against_ort(dtype, y_fused, y_unfused, ref, where, small_slack=True):
    assert y_fused.shape == ref.shape, f"{where}: shape {y_fused.shape} != {ref.shape}"
    finite = np.isfinite(ref)
    assert np.isfinite(y_fused[finite]).all(), f"{where}: non-finite output where float64 is finite"
    e_fused, e_unfused = rel_l2(y_fused, ref), rel_l2(y_unfused, ref)
    slack = _ROUNDOFF[dtype] if small_slack and ref.size < _SMALL_OUTPUT else 0.0
    assert e_fused <= 1.05 * e_unfused + slack, (
        f"{where}: fused rel-L2 error {e_fused:.3e} > 1.05 x ORT unfused {e_unfused:.3e}"
        + (f" + {slack:.1e}" if slack else ""))
    return e_fused, e_unfused


# --- every dtype × activation × transB × bias, odd shapes and ranks 2-4 ----------------------------------

# (X shape, N): M = 1, 7 and 4097; K and N off multiples of 8; ranks 3 and 4 (M is their leading product).
ODD_SHAPES = [
    ((1, 96), 200),
    ((7, 131), 77),
    ((2, 3, 64), 128),
    ((2, 2, 3, 40), 48),
    ((4097, 264), 136),
    ((4097, 100), 70),
]


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("trans_b", [1, 0], ids=["transB1", "transB0"])
@pytest.mark.parametrize("approximate", ACTIVATIONS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_float64_within_ort_error(library, dtype, approximate, trans_b, bias):
    rng = np.random.default_rng(zlib.crc32(f"{dtype}/{approximate}/{trans_b}/{bias}".encode()))
    for x_shape, n in ODD_SHAPES:
        x, w_nk, b = make_inputs(rng, x_shape, n, dtype, trans_b, bias)
        y_fused, y_unfused, ref = run_pair(library, dtype, x, w_nk, b, approximate, trans_b)
        check_against_ort(dtype, y_fused, y_unfused, ref, f"{dtype} {approximate} transB={trans_b} X{x_shape} N={n}")


# Mid-size shapes where the error ratio is a stable statistic: no slack at all, per dtype over the grid.
GRID = [((128, 768), 3072), ((1024, 768), 3072), ((4097, 1000), 1000), ((256, 4096), 4096)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_error_ratio_per_dtype_over_grid(library, dtype):
    rng = np.random.default_rng(7)
    fused_sq = unfused_sq = ref_sq = 0.0
    for approximate in ACTIVATIONS:
        for x_shape, n in GRID:
            x, w_nk, b = make_inputs(rng, x_shape, n, dtype, 1, True)
            y_fused, y_unfused, ref = run_pair(library, dtype, x, w_nk, b, approximate, 1)
            check_against_ort(dtype, y_fused, y_unfused, ref, f"{dtype} {approximate} X{x_shape} N={n}",
                              small_slack=False)
            fused_sq += float(np.sum((y_fused.astype(np.float64) - ref) ** 2))
            unfused_sq += float(np.sum((y_unfused.astype(np.float64) - ref) ** 2))
            ref_sq += float(np.sum(ref**2))
    ratio = math.sqrt(fused_sq / unfused_sq)
    print(f"{dtype}: fused rel-L2 {math.sqrt(fused_sq / ref_sq):.3e}, ORT unfused {math.sqrt(unfused_sq / ref_sq):.3e}, "
          f"ratio {ratio:.3f}")
    assert ratio <= 1.05


# Both operands larger than half of L2 (X 32-64 MiB, W 64-128 MiB): the sm90 kernels walk their tiles in
# swizzled groups (sm90_swizzle in tactics.cuh). Every 128-row block of the output is checked (8 rows each,
# against float64), so a tile the walk skipped or wrote twice would show.
@pytest.mark.parametrize("dtype", DTYPES)
def test_large_operands_every_tile_block(library, dtype):
    m, k, n = 4096, 4096, 8192
    rng = np.random.default_rng(11)
    x, w_nk, b = make_inputs(rng, (m, k), n, dtype, 1, True)
    y_fused, y_unfused = fused_and_unfused(library, dtype, x, w_nk, b, "none")
    rows = (np.arange(0, m, 128)[:, None] + rng.integers(0, 128, size=(m // 128, 8))).ravel()
    ref = reference(x[rows], w_nk, b, "none")
    check_against_ort(dtype, y_fused[rows], y_unfused[rows], ref, f"{dtype} X({m}, {k}) N={n}", small_slack=False)


# --- every fp16 value -------------------------------------------------------------------------------------


def _fp16_ulp(v: np.ndarray) -> np.ndarray:
    """Spacing of fp16 numbers at |v| (subnormal spacing 2^-24 near zero)."""
    a = np.abs(v.astype(np.float64))
    e = np.floor(np.log2(np.maximum(a, 2.0**-14)))
    return 2.0 ** (e - 10)


@pytest.mark.parametrize("approximate", ACTIVATIONS)
def test_every_fp16_value_gives_finite_gelu(library, approximate):
    """All 65,536 fp16 bit patterns through the GEMM (X·I, K=N=8: the Tensor-Core path) and the activation.
    Finite patterns fill whole rows, inf/NaN the rest, so a non-finite input (inf·0 = NaN in any GEMM)
    touches no finite row. Where float64 is finite the fused value must be finite; over all finite values
    its rel-L2 error may be at most 1.05 x that of ORT's own Gelu on the same values; and for |x| <= 3,
    where activations live, each value must be within one fp16 ulp of max(ORT's error, 1 ulp)."""
    bits = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    values = bits.view(np.float16)
    finite_first = np.concatenate([values[np.isfinite(values)], values[~np.isfinite(values)]])
    x = finite_first.reshape(-1, 8)
    eye = np.eye(8, dtype=np.float32)
    fused = cuda_session(fused_model("float16", x.shape, eye, None, approximate, 1), library)
    (y,) = fused.run(None, {"X": x})
    unfused = cuda_session(unfused_model("float16", x.shape, eye, None, approximate), library, fallback=True)
    (y_ort,) = unfused.run(None, {"X": x})
    with np.errstate(invalid="ignore", over="ignore"):
        ref = activation64(x.astype(np.float64), approximate)
    ok = np.isfinite(ref)
    assert ok.sum() >= 63488, "the float64 reference should be finite for every finite fp16 input"
    bad = ok & ~np.isfinite(y)
    assert not bad.any(), f"non-finite output for inputs {x[bad][:8]} (float64: {ref[bad][:8]})"

    e_fused, e_ort = rel_l2(y[ok], ref[ok]), rel_l2(y_ort[ok], ref[ok])
    err = np.abs(y[ok].astype(np.float64) - ref[ok])
    err_ort = np.abs(y_ort[ok].astype(np.float64) - ref[ok])
    ulp = _fp16_ulp(ref[ok])
    print(f"{approximate}: rel-L2 fused {e_fused:.3e} ORT {e_ort:.3e}; worst error fused "
          f"{np.max(err / ulp):.1f} ulp, ORT {np.max(err_ort / ulp):.1f} ulp")
    assert e_fused <= 1.05 * e_ort, f"rel-L2 {e_fused:.3e} > 1.05 x ORT's {e_ort:.3e}"

    core = np.abs(x[ok].astype(np.float64)) <= 3.0
    allowed = np.maximum(err_ort, ulp) + ulp
    over = core & (err > allowed)
    if over.any():
        i = int(np.argmax(np.where(core, err / allowed, 0.0)))
        pytest.fail(f"{int(over.sum())} values with |x| <= 3 off by more than ORT's error + 1 ulp; worst x="
                    f"{x[ok][i]}: fused {y[ok][i]} vs float64 {ref[ok][i]:.6g} (ORT {y_ort[ok][i]}), "
                    f"{err[i] / ulp[i]:.1f} ulp > {allowed[i] / ulp[i]:.1f} ulp")


# --- zero sizes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_zero_size_inputs(library, dtype):
    rng = np.random.default_rng(3)
    # M = 0 (rank 2 and 3): an empty output of the right shape.
    for x_shape in [(0, 64), (2, 0, 64)]:
        _, w_nk, b = make_inputs(rng, (1, 64), 32, dtype, 1, True)
        x = np.zeros(x_shape, np.float32 if dtype != "float16" else np.float16)
        sess = cuda_session(fused_model(dtype, x_shape, w_nk, b, "none", 1), library)
        (y,) = sess.run(None, {"X": x})
        assert y.shape == tuple(x_shape[:-1]) + (32,)
    # K = 0: X·W is all zeros, so Y = act(B) on every row (and act(0) = 0 without a bias).
    for bias in (True, False):
        x = np.zeros((5, 0), np.float32 if dtype != "float16" else np.float16)
        w_nk = np.zeros((24, 0), np.float32)
        b = rounded(rng.standard_normal(24), dtype).astype(np.float32) if bias else None
        sess = cuda_session(fused_model(dtype, x.shape, w_nk, b, "none", 1), library)
        (y,) = sess.run(None, {"X": x})
        expect = np.broadcast_to(activation64(b.astype(np.float64), "none") if bias else np.zeros(24), (5, 24))
        np.testing.assert_allclose(y.astype(np.float64), expect, rtol=_ROUNDOFF[dtype] * 2, atol=1e-6)


# --- running inside ORT: placement, IO binding, CUDA graphs, threads, config, errors ----------------------


def test_node_runs_on_cuda_with_cpu_fallback_disabled(library, tmp_path):
    rng = np.random.default_rng(1)
    x, w_nk, b = make_inputs(rng, (64, 256), 512, "float16", 1, True)
    so = ort.SessionOptions()
    so.register_custom_ops_library(library)
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "placement")
    sess = ort.InferenceSession(fused_model("float16", x.shape, w_nk, b, "none", 1), so, providers=[CUDA])
    (y,) = sess.run(None, {"X": x})
    import json

    events = json.load(open(sess.end_profiling()))
    placed = {e["args"].get("op_name"): e["args"].get("provider") for e in events
              if e.get("cat") == "Node" and "provider" in e.get("args", {})}
    assert placed.get(OP_TYPE) == CUDA, f"FusedLinearGelu ran on {placed.get(OP_TYPE)}"
    ref = reference(x, w_nk, b, "none")
    assert rel_l2(y, ref) < 2e-3


def _gpu_value(a: np.ndarray):
    return ort.OrtValue.ortvalue_from_numpy(a, "cuda", 0)


def test_io_binding_and_cuda_graph_replay(library):
    """Inputs and outputs stay on the GPU; a captured CUDA graph replays the kernel on new input data."""
    rng = np.random.default_rng(2)
    x, w_nk, b = make_inputs(rng, (256, 768), 3072, "float16", 1, True)
    sess = cuda_session(fused_model("float16", x.shape, w_nk, b, "none", 1), library, cuda_graph=True)
    x_dev = _gpu_value(x)
    y_dev = _gpu_value(np.zeros((256, 3072), np.float16))
    binding = sess.io_binding()
    binding.bind_ortvalue_input("X", x_dev)
    binding.bind_ortvalue_output("Y", y_dev)
    for _ in range(3):  # the first runs warm up and capture
        sess.run_with_iobinding(binding)
    assert rel_l2(y_dev.numpy(), reference(x, w_nk, b, "none")) < 1e-3
    x2 = rounded(rng.standard_normal(x.shape), "float16")
    x_dev.update_inplace(x2)  # same address, new data: only a real replay of the kernel can see it
    sess.run_with_iobinding(binding)
    y2 = y_dev.numpy()
    assert rel_l2(y2, reference(x2, w_nk, b, "none")) < 1e-3
    (y_plain,) = cuda_session(fused_model("float16", x.shape, w_nk, b, "none", 1), library).run(None, {"X": x2})
    np.testing.assert_array_equal(y2, y_plain)  # the graph replays exactly what a plain run computes


def test_concurrent_runs_on_one_session_match_one_thread(library):
    rng = np.random.default_rng(4)
    _, w_nk, b = make_inputs(rng, (1, 512), 1024, "float16", 1, True)
    sess = cuda_session(fused_model("float16", ["M", 512], w_nk, b, "tanh", 1, y_shape=["M", 1024]), library)
    inputs = [rounded(rng.standard_normal((int(m), 512)), "float16") for m in rng.integers(1, 700, size=16)]
    expected = [sess.run(None, {"X": x})[0] for x in inputs]
    failures = []

    def worker(t):
        try:
            for r in range(8):
                i = (t * 5 + r) % len(inputs)
                (y,) = sess.run(None, {"X": inputs[i]})
                if not np.array_equal(y, expected[i]):
                    failures.append(f"thread {t} run {r}: input {i} differs from the one-thread result")
        except Exception as e:  # surfaced below: an exception in a thread would otherwise be lost
            failures.append(f"thread {t}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[:5]


def test_strict_fp32_session_config(library):
    rng = np.random.default_rng(5)
    x, w_nk, b = make_inputs(rng, (512, 768), 1024, "float32", 1, True)
    model = fused_model("float32", x.shape, w_nk, b, "none", 1)
    ref = reference(x, w_nk, b, "none")
    (y_tf32,) = cuda_session(model, library).run(None, {"X": x})
    (y_strict,) = cuda_session(model, library, config={"onnxfuse.strict_fp32": "1"}).run(None, {"X": x})
    e_tf32, e_strict = rel_l2(y_tf32, ref), rel_l2(y_strict, ref)
    # TF32 keeps 10 mantissa bits (error ~1e-4); strict fp32 is fp32-accurate (~1e-7 for K = 768).
    assert e_strict < 1e-5, f"strict fp32 error {e_strict:.2e}"
    assert e_tf32 > 10 * e_strict, f"TF32 ({e_tf32:.2e}) should be far less accurate than strict ({e_strict:.2e})"
    assert e_tf32 < 2e-3
    with pytest.raises(Exception, match="onnxfuse.strict_fp32"):
        cuda_session(model, library, config={"onnxfuse.strict_fp32": "yes"})


def test_bad_shapes_are_errors_not_crashes(library):
    """W as a graph input, so the mismatch reaches the kernel at run time: an ORT error, never an abort."""
    so_model = helper.make_model(
        helper.make_graph(
            [helper.make_node(OP_TYPE, ["X", "W"], ["Y"], domain=DOMAIN)],
            "bad",
            [helper.make_tensor_value_info("X", TensorProto.FLOAT16, ["M", "K"]),
             helper.make_tensor_value_info("W", TensorProto.FLOAT16, ["N", "K2"])],
            [helper.make_tensor_value_info("Y", TensorProto.FLOAT16, None)],
        ),
        opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid(DOMAIN, DOMAIN_VERSION)],
        ir_version=10,
    ).SerializeToString()
    sess = cuda_session(so_model, library)
    x = np.ones((4, 16), np.float16)
    with pytest.raises(Exception, match="K mismatch"):
        sess.run(None, {"X": x, "W": np.ones((8, 12), np.float16)})
    (y,) = sess.run(None, {"X": x, "W": np.ones((8, 16), np.float16)})  # the session is still usable
    assert y.shape == (4, 8)


# --- the path choice: fused, fallback (cuBLASLt GEMM + bias, then the activation in place), gemv (few rows),
# auto -------------------------------------------------------------------------------------------------------

PATHS = ("fused", "fallback", "gemv", "auto")
GEMV_MAX_ROWS = 16
# (K, N) off multiples of 8 (and of 4 for 770 x 3074, so fp32 runs strict there), with few to some rows.
PATH_SHAPES = [(770, 3074), (1000, 3000), (4095, 1023)]
PATH_ROWS = (1, 2, 4, 8, 16, 64)
# the fallback's second kernel (activation_inplace.cu): float32 in place, 16-bit from cuBLASLt's fp32 product,
# float32 staged through padded rows from its padded product
_FALLBACK_KERNELS = ("activation_inplace_kernel", "bias_activation_from_fp32_kernel", "bias_activation_from_rows_kernel")
_GEMV_KERNELS = ("gemv_nn_kernel", "gemv_tn_kernel", "gemv_tf32_kernel")
# the fused path's few-rows kernels with the operands swapped (sm90_swap_ab.cuh): the only ones whose bias is
# CUTLASS's column broadcast (the regular kernels read it as a row, sm90_bias_row.cuh)
_SWAPPED_KERNEL = "Sm90ColBroadcast"


def with_attributes(model: bytes, **attrs) -> bytes:
    """``model`` with extra attributes on its FusedLinearGelu node."""
    import onnx

    m = onnx.load_from_string(model)
    (node,) = [n for n in m.graph.node if n.op_type == OP_TYPE]
    node.attribute.extend(helper.make_attribute(k, v) for k, v in attrs.items())
    return m.SerializeToString()


def path_model(dtype, k, w, b, approximate, trans_b, **attrs) -> bytes:
    """A FusedLinearGelu node with a symbolic row count, so one session serves every M."""
    n = w.shape[0] if trans_b else w.shape[1]
    return with_attributes(fused_model(dtype, ["M", k], w, b, approximate, trans_b, y_shape=["M", n]), **attrs)


def unfused_session(library, dtype, k, w_nk, b, approximate):
    return cuda_session(unfused_model(dtype, ["M", k], np.ascontiguousarray(w_nk.T), b, approximate), library,
                        fallback=True)


@pytest.mark.parametrize("trans_b", [1, 0], ids=["transB1", "transB0"])
@pytest.mark.parametrize("approximate", ACTIVATIONS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_path_matches_float64_within_ort_error(library, dtype, approximate, trans_b):
    """Forced fused, fallback, gemv (up to its 16 rows) and auto on odd K/N with 1-64 rows: each within ORT's
    own error."""
    rng = np.random.default_rng(zlib.crc32(f"paths/{dtype}/{approximate}/{trans_b}".encode()))
    for k, n in PATH_SHAPES:
        x_all, w_nk, b = make_inputs(rng, (max(PATH_ROWS), k), n, dtype, trans_b, True)
        w = w_nk if trans_b else np.ascontiguousarray(w_nk.T)
        sessions = {p: cuda_session(path_model(dtype, k, w, b, approximate, trans_b, cuda_path=p), library) for p in PATHS}
        unfused = unfused_session(library, dtype, k, w_nk, b, approximate)
        for m in PATH_ROWS:
            x = x_all[:m]
            ref = reference(x, w_nk, b, approximate)
            (y_unfused,) = unfused.run(None, {"X": x})
            for p, sess in sessions.items():
                if p == "gemv" and m > GEMV_MAX_ROWS:
                    continue
                (y,) = sess.run(None, {"X": x})
                check_against_ort(dtype, y, y_unfused, ref, f"{p}: {dtype} {approximate} transB={trans_b} M={m} K={k} N={n}")


def _kernels_of(run) -> set[str]:
    """The CUDA kernels one call of ``run`` launches (CUPTI through torch.profiler, bench/cupti.py)."""
    torch = pytest.importorskip("torch", reason="kernel names are read with torch.profiler (CUPTI)")
    from tests.bench_scripts import load_bench_script

    cupti = load_bench_script("cupti")
    assert torch.cuda.is_available()
    return set(cupti.require_kernels(cupti.kernel_times_us(run, reps=1, warmup=2)))


def _path_ran(sess, x) -> str:
    names = _kernels_of(lambda: sess.run(None, {"X": x}))
    if any(k in n for n in names for k in _GEMV_KERNELS):
        ours = [n for n in names if "onnxfuse::" in n]  # not the graph's input/output Casts and copies
        assert len(ours) == 1, f"the gemv path is one kernel, ran {sorted(ours)}"
        return "gemv"
    return "fallback" if any(k in n for n in names for k in _FALLBACK_KERNELS) else "fused"


def _ran_swapped(sess, x) -> bool:
    """Whether one call ran the fused path's swapped few-rows kernel (and nothing of the other paths)."""
    names = _kernels_of(lambda: sess.run(None, {"X": x}))
    swapped = any(_SWAPPED_KERNEL in n for n in names)
    assert not swapped or _path_ran(sess, x) == "fused", sorted(names)
    return swapped


def device_signature(library: str) -> str:
    import ctypes

    query = ctypes.CDLL(library).OnnxfuseCudaDeviceSignature
    query.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
    query.restype = ctypes.c_int
    buf = ctypes.create_string_buffer(512)
    assert query(0, buf, len(buf)) == 0, "OnnxfuseCudaDeviceSignature found no device 0"
    return buf.value.decode()


def test_device_signature_format(library):
    import re

    sig = device_signature(library)
    assert re.fullmatch(r"[^|]+\|sm_\d+\|cuda \d+\.\d+\|onnxfuse \S+", sig), sig


def test_forced_and_built_in_paths_by_kernel_names(library):
    _skip_unless_sm90("the built-in path choices checked here")
    rng = np.random.default_rng(21)
    # fp16 K, N off multiples of 8 and 768 x 3072: the built-in rule takes the fused kernel (the odd shape
    # through aligned copies).
    for (k, n), auto_path in (((770, 3074), "fused"), ((768, 3072), "fused")):
        x, w_nk, b = make_inputs(rng, (512, k), n, "float16", 1, True)
        for forced in ("fused", "fallback", "auto"):
            sess = cuda_session(path_model("float16", k, w_nk, b, "none", 1, cuda_path=forced), library)
            expect = auto_path if forced == "auto" else forced
            assert _path_ran(sess, x) == expect, f"cuda_path={forced} K={k} N={n}"
    # A few rows: the gemv kernel, forced in every dtype and layout; built in for transB = 1 (where it was
    # measured) up to 4 rows, then (768 x 3072 is a W of 2^21+ weights) the fused path's swapped kernel up to 32
    # rows; transB = 0 takes the fallback.
    for dtype in DTYPES:
        for trans_b in (1, 0):
            x, w_nk, b = make_inputs(rng, (16, 768), 3072, dtype, trans_b, True)
            w = w_nk if trans_b else np.ascontiguousarray(w_nk.T)
            forced = cuda_session(path_model(dtype, 768, w, b, "none", trans_b, cuda_path="gemv"), library)
            assert _path_ran(forced, x) == "gemv", f"cuda_path=gemv {dtype} transB={trans_b}"
            auto = cuda_session(path_model(dtype, 768, w, b, "none", trans_b), library)
            assert _path_ran(auto, x[:4]) == ("gemv" if trans_b else "fallback"), f"auto {dtype} transB={trans_b} M=4"
            expect = ("fused", True) if trans_b else ("fallback", False)
            assert (_path_ran(auto, x), _ran_swapped(auto, x)) == expect, f"auto {dtype} transB={trans_b} M=16"
    # 16-bit rows that are no 16-byte vectors (770 x 3074): gemv at one or two rows, the fallback from 3 to 63,
    # the fused kernel through aligned copies from 64 on; a tiny problem keeps the fallback at any row count.
    for dtype in ("float16", "bfloat16"):
        x, w_nk, b = make_inputs(rng, (64, 770), 3074, dtype, 1, True)
        odd = cuda_session(path_model(dtype, 770, w_nk, b, "none", 1), library)
        assert [_path_ran(odd, x[:m]) for m in (1, 2, 3, 4, 16, 63, 64)] == [
            "gemv", "gemv", "fallback", "fallback", "fallback", "fallback", "fused"], dtype
    x, w_nk, b = make_inputs(rng, (4096, 37), 5, "float16", 1, True)
    assert _path_ran(cuda_session(path_model("float16", 37, w_nk, b, "none", 1), library), x) == "fallback"
    # 16-bit with 2-16 rows of a large W (reading W bounds it): the swapped kernel; one row: gemv.
    x, w_nk, b = make_inputs(rng, (16, 4096), 16384, "float16", 1, True)
    large = cuda_session(path_model("float16", 4096, w_nk, b, "none", 1), library)
    assert [_path_ran(large, x[:m]) for m in (1, 2, 16)] == ["gemv", "fused", "fused"]
    assert [_ran_swapped(large, x[:m]) for m in (2, 16)] == [True, True]
    # 16-bit with 5-32 rows of a W of 2^21 weights or more: the swapped kernel, then the regular one; from 2^18
    # weights the gemv kernel up to 8 rows, the swapped kernel up to 32; below 2^18 the regular kernel after gemv.
    x, w_nk, b = make_inputs(rng, (33, 1024), 4096, "float16", 1, True)
    mid = cuda_session(path_model("float16", 1024, w_nk, b, "none", 1), library)
    assert [_path_ran(mid, x[:m]) for m in (4, 5, 32, 33)] == ["gemv", "fused", "fused", "fused"]
    assert [_ran_swapped(mid, x[:m]) for m in (5, 32, 33)] == [True, True, False]
    x, w_nk, b = make_inputs(rng, (33, 384), 1536, "float16", 1, True)
    small = cuda_session(path_model("float16", 384, w_nk, b, "none", 1), library)
    assert [_path_ran(small, x[:m]) for m in (4, 5, 8, 9, 32, 33)] == ["gemv"] * 3 + ["fused"] * 3
    assert [_ran_swapped(small, x[:m]) for m in (9, 32, 33)] == [True, True, False]
    x, w_nk, b = make_inputs(rng, (9, 256), 512, "float16", 1, True)
    tiny = cuda_session(path_model("float16", 256, w_nk, b, "none", 1), library)
    assert [_path_ran(tiny, x[:m]) for m in (8, 9)] == ["gemv", "fused"]
    assert not _ran_swapped(tiny, x)
    # float32 on a narrow, deep W (N < K): gemv at one and two rows where its rows are 16-byte vectors (exact,
    # within ORT's time), then the fallback; rows that are not (K = 4095) take the fallback at every row count.
    x, w_nk, b = make_inputs(rng, (16, 4096), 1024, "float32", 1, True)
    narrow = cuda_session(path_model("float32", 4096, w_nk, b, "none", 1), library)
    assert [_path_ran(narrow, x[:m]) for m in (1, 2, 3, 16)] == ["gemv", "gemv", "fallback", "fallback"]
    x, w_nk, b = make_inputs(rng, (16, 4095), 1023, "float32", 1, True)
    narrow_odd = cuda_session(path_model("float32", 4095, w_nk, b, "none", 1), library)
    assert [_path_ran(narrow_odd, x[:m]) for m in (1, 2, 3, 16)] == ["fallback"] * 4
    # float32 with TF32 on a W of 2^25 weights or more: the exact gemv kernel up to 4 rows, the swapped kernel
    # from 5 to 64 rows (reading W bounds it), then the regular fused kernel.
    x, w_nk, b = make_inputs(rng, (65, 2048), 16384, "float32", 1, True)
    wide = cuda_session(path_model("float32", 2048, w_nk, b, "none", 1), library)
    assert [_path_ran(wide, x[:m]) for m in (4, 5, 8, 9, 16, 17, 64, 65)] == ["gemv"] + ["fused"] * 7
    assert [_ran_swapped(wide, x[:m]) for m in (5, 8, 16, 64, 65)] == [True] * 4 + [False]
    # float32 beyond 16 rows: TF32 in the fused kernel, or the fallback in strict fp32.
    x, w_nk, b = make_inputs(rng, (512, 768), 3072, "float32", 1, True)
    assert _path_ran(cuda_session(path_model("float32", 768, w_nk, b, "none", 1), library), x) == "fused"
    strict = cuda_session(path_model("float32", 768, w_nk, b, "none", 1), library, config={"onnxfuse.strict_fp32": "1"})
    assert _path_ran(strict, x) == "fallback"
    assert _path_ran(strict, x[:16]) == "gemv"
    assert _path_ran(strict, x[:17]) == "fallback"


# Short K beyond two waves of 128x128 tiles (4097 x 1544: 429 tiles): the overlapped ping-pong kernel on the 128x128
# tile, whose two warpgroups' epilogues may run side by side where each outlasts a main loop (lab/kernels/NOTES.md
# v8); at K = 768 CUTLASS's ping-pong kernel. M and N both end in a partial tile. The shape table is Hopper's
# (sm_90): elsewhere the overlapped kernel does not run, and the values are still checked.
_OVERLAPPED_KERNEL = "Sm90WarpEpilogueKernel"


def _is_sm90() -> bool:
    torch = pytest.importorskip("torch", reason="the device's compute capability is read with torch")
    return torch.cuda.get_device_capability() == (9, 0)


def _skip_unless_sm90(what: str) -> None:
    """Skips a test whose expectations are the built-in path rules and kernels of Hopper (sm_90), where they were
    measured: the swapped few-rows kernels exist only there, so other devices take other paths for the same calls
    (the tests of values on every path still run there)."""
    if not _is_sm90():
        import torch

        major, minor = torch.cuda.get_device_capability()
        pytest.skip(f"{what} are Hopper's (sm_90); this device is sm_{major}{minor}")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_short_k_many_waves_run_the_overlapped_128x128_kernel(library, dtype):
    rng = np.random.default_rng(zlib.crc32(f"overlapped/{dtype}".encode()))
    sm90 = _is_sm90()
    for k, overlapped in ((384, sm90), (768, False)):
        for trans_b in (1, 0):
            x, w_nk, b = make_inputs(rng, (4097, k), 1544, dtype, trans_b, True)
            w = w_nk if trans_b else np.ascontiguousarray(w_nk.T)
            for approximate in ACTIVATIONS:
                sess = cuda_session(path_model(dtype, k, w, b, approximate, trans_b), library)
                where = f"{dtype} {approximate} transB={trans_b} K={k}"
                names = _kernels_of(lambda: sess.run(None, {"X": x}))
                assert any(_OVERLAPPED_KERNEL in n for n in names) == overlapped, f"{where}: {sorted(names)}"
                (y,) = sess.run(None, {"X": x})
                (y_unfused,) = unfused_session(library, dtype, k, w_nk, b, approximate).run(None, {"X": x})
                check_against_ort(dtype, y, y_unfused, reference(x, w_nk, b, approximate), where, small_slack=False)


def test_tuned_table_selects_the_path_on_its_device_only(library):
    rng = np.random.default_rng(22)
    x_all, w_nk, b = make_inputs(rng, (300, 768), 3072, "float16", 1, True)
    table = {"tuned_max_rows": [16, 128], "tuned_paths": ["fallback", "fused"]}
    here = cuda_session(path_model("float16", 768, w_nk, b, "none", 1, tuned_device=device_signature(library), **table),
                        library)
    # Rows 1-16 -> fallback, 17-128 -> fused, beyond the last bound -> the last entry (fused).
    assert [_path_ran(here, x_all[:m]) for m in (1, 16, 17, 128, 300)] == ["fallback"] * 2 + ["fused"] * 3
    inverted = cuda_session(path_model("float16", 768, w_nk, b, "none", 1, tuned_device=device_signature(library),
                                       tuned_max_rows=[16], tuned_paths=["fused"]), library)
    assert _path_ran(inverted, x_all[:300]) == "fused"
    beyond = cuda_session(path_model("float16", 768, w_nk, b, "none", 1, tuned_device=device_signature(library),
                                     tuned_max_rows=[16], tuned_paths=["fallback"]), library)
    assert _path_ran(beyond, x_all[:300]) == "fallback"
    # gemv for the first rows only (the contract keeps it within 16), then the fallback and the fused kernel.
    three = cuda_session(path_model("float16", 768, w_nk, b, "none", 1, tuned_device=device_signature(library),
                                    tuned_max_rows=[4, 16], tuned_paths=["gemv", "fallback"]), library)
    assert [_path_ran(three, x_all[:m]) for m in (1, 4, 5, 16, 17)] == ["gemv"] * 2 + ["fallback"] * 3
    # Measured elsewhere (another GPU, CUDA or library version): the built-in rule (fused for 300 x 768 x 3072
    # fp16).
    elsewhere = cuda_session(path_model("float16", 768, w_nk, b, "none", 1, tuned_device="Other GPU|sm_80|cuda 12.0|onnxfuse 0.0.1",
                                        **table), library)
    assert _path_ran(elsewhere, x_all) == "fused"


@pytest.mark.parametrize("attrs,message", [
    ({"cuda_path": "fastest"}, "cuda_path='fastest'"),
    ({"tuned_device": "X", "tuned_max_rows": [16, 64], "tuned_paths": ["fused"]}, "same length"),
    ({"tuned_device": "X", "tuned_max_rows": [64, 16], "tuned_paths": ["fused", "fallback"]}, "strictly ascending"),
    ({"tuned_device": "X", "tuned_max_rows": [0], "tuned_paths": ["fused"]}, "must be > 0"),
    ({"tuned_device": "X", "tuned_max_rows": [16], "tuned_paths": ["auto"]}, "tuned_paths\\[0\\]='auto'"),
    ({"tuned_device": "X"}, "needs at least one entry"),
    ({"tuned_device": "X", "tuned_max_rows": [32, 64], "tuned_paths": ["gemv", "fused"]}, "runs at most 16"),
    ({"tuned_device": "X", "tuned_max_rows": [8], "tuned_paths": ["gemv"]}, "the last entry"),
])
def test_malformed_path_attributes_fail_session_creation(library, attrs, message):
    rng = np.random.default_rng(23)
    _, w_nk, b = make_inputs(rng, (1, 64), 32, "float16", 1, True)
    with pytest.raises(Exception, match=message):
        cuda_session(path_model("float16", 64, w_nk, b, "none", 1, **attrs), library)


@pytest.mark.parametrize("path,rows", [("fallback", 256), ("gemv", 12), ("fused", 256)])
def test_path_under_cuda_graph_replay(library, path, rows):
    """The fallback's two kernels, the gemv kernel and the fused kernel with its staging copies (770 x 3074) are
    captured and replayed like the aligned fused kernel (no sync, no host allocation)."""
    rng = np.random.default_rng(24)
    x, w_nk, b = make_inputs(rng, (rows, 770), 3074, "float16", 1, True)
    model = path_model("float16", 770, w_nk, b, "tanh", 1, cuda_path=path)
    sess = cuda_session(model, library, cuda_graph=True)
    x_dev = _gpu_value(x)
    y_dev = _gpu_value(np.zeros((rows, 3074), np.float16))
    binding = sess.io_binding()
    binding.bind_ortvalue_input("X", x_dev)
    binding.bind_ortvalue_output("Y", y_dev)
    for _ in range(3):
        sess.run_with_iobinding(binding)
    assert rel_l2(y_dev.numpy(), reference(x, w_nk, b, "tanh")) < 1e-3
    x2 = rounded(rng.standard_normal(x.shape), "float16")
    x_dev.update_inplace(x2)
    sess.run_with_iobinding(binding)
    (y_plain,) = cuda_session(model, library).run(None, {"X": x2})
    np.testing.assert_array_equal(y_dev.numpy(), y_plain)


@pytest.mark.parametrize("dtype,rows", [("float32", 8), ("float16", 16)])
def test_fallback_timed_algorithm_is_settled_once_and_repeatable(library, dtype, rows):
    """A small problem's first fallback call times cuBLASLt's candidates and keeps one: that call's result is
    every later call's, bit for bit, a second session in the process runs the same algorithm (the choice is
    the process's), and the result is within ORT's error (4096 x 16384, the weight-bound cells the timing is
    for)."""
    rng = np.random.default_rng(zlib.crc32(f"timed/{dtype}/{rows}".encode()))
    k, n = 4096, 16384
    x, w_nk, b = make_inputs(rng, (rows, k), n, dtype, 1, True)
    model = path_model(dtype, k, w_nk, b, "none", 1, cuda_path="fallback")
    first = cuda_session(model, library)
    runs = [first.run(None, {"X": x})[0] for _ in range(3)]
    for y in runs[1:]:
        np.testing.assert_array_equal(y, runs[0])
    np.testing.assert_array_equal(cuda_session(model, library).run(None, {"X": x})[0], runs[0])
    (y_unfused,) = unfused_session(library, dtype, k, w_nk, b, "none").run(None, {"X": x})
    check_against_ort(dtype, runs[0], y_unfused, reference(x, w_nk, b, "none"), f"fallback {dtype} M={rows} K={k} N={n}")


def test_forced_fallback_with_k_zero_takes_the_fused_path(library):
    """K = 0 has no GEMM for cuBLASLt to run: Y = act(B) by the fused path even when the fallback is forced."""
    b = rounded(np.linspace(-2, 2, 24), "float16").astype(np.float32)
    sess = cuda_session(path_model("float16", 0, np.zeros((24, 0), np.float32), b, "none", 1, cuda_path="fallback"),
                        library)
    (y,) = sess.run(None, {"X": np.zeros((5, 0), np.float16)})
    np.testing.assert_allclose(y.astype(np.float64), np.broadcast_to(activation64(b.astype(np.float64), "none"), (5, 24)),
                               rtol=_ROUNDOFF["float16"] * 2, atol=1e-6)


# --- 16-bit rows that are not 16-byte vectors: the fused kernel through aligned copies (copy_rows.h) ----------

_STAGING_KERNEL = "copy_rows_kernel"
_ANY_ALIGNMENT_KERNEL = "fallback_gemm_gelu_kernel"  # the fused path's WMMA kernel, 4x slower than ORT here


def _weights_as_inputs(model: bytes) -> bytes:
    """``model`` with W and B as graph inputs instead of initializers (16-bit: staged on every call)."""
    import onnx

    m = onnx.load_from_string(model)
    for init in list(m.graph.initializer):
        m.graph.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
        m.graph.initializer.remove(init)
    return m.SerializeToString()


def _zero_padded(a: np.ndarray, shape) -> np.ndarray:
    out = np.zeros(shape, a.dtype)
    out[tuple(slice(0, d) for d in a.shape)] = a
    return out


# (K, N): both off multiples of 8, K alone, N alone, both tiny.
STAGED_SHAPES = [(770, 3074), (4095, 1023), (1000, 3001), (37, 5)]


@pytest.mark.parametrize("trans_b", [1, 0], ids=["transB1", "transB0"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_unaligned_rows_run_the_tensor_core_kernel_through_copies(library, dtype, trans_b):
    """The fused path with odd K or N runs the aligned kernel on copies padded to 8 columns: its output is
    bit for bit the aligned kernel's on the zero-padded problem, within ORT's error, and the same whether W and
    B are initializers (staged once) or graph inputs (staged per call). The any-alignment kernel never runs."""
    rng = np.random.default_rng(zlib.crc32(f"staged/{dtype}/{trans_b}".encode()))
    rows = 300
    for k, n in STAGED_SHAPES:
        x, w_nk, b = make_inputs(rng, (rows, k), n, dtype, trans_b, True)
        w = w_nk if trans_b else np.ascontiguousarray(w_nk.T)
        where = f"{dtype} transB={trans_b} M={rows} K={k} N={n}"
        sess = cuda_session(path_model(dtype, k, w, b, "none", trans_b, cuda_path="fused"), library)
        names = _kernels_of(lambda: sess.run(None, {"X": x}))
        assert any(_STAGING_KERNEL in name for name in names), f"{where}: no staging copy in {sorted(names)}"
        assert not any(_ANY_ALIGNMENT_KERNEL in name or any(f in name for f in _FALLBACK_KERNELS) for name in names), (
            f"{where}: {sorted(names)}")
        (y,) = sess.run(None, {"X": x})
        (y_unfused,) = unfused_session(library, dtype, k, w_nk, b, "none").run(None, {"X": x})
        check_against_ort(dtype, y, y_unfused, reference(x, w_nk, b, "none"), where)

        k8, n8 = -(-k // 8) * 8, -(-n // 8) * 8
        w8 = _zero_padded(w, (n8, k8) if trans_b else (k8, n8))
        aligned = cuda_session(path_model(dtype, k8, w8, _zero_padded(b, (n8,)), "none", trans_b), library)
        (y8,) = aligned.run(None, {"X": _zero_padded(x, (rows, k8))})
        np.testing.assert_array_equal(y, y8[:, :n], err_msg=f"{where}: staged != aligned on the padded problem")

        if dtype == "float16":
            as_inputs = cuda_session(_weights_as_inputs(path_model(dtype, k, w, b, "none", trans_b, cuda_path="fused")),
                                     library)
            feeds = {"X": x, "W": w.astype(np.float16), "B": b.astype(np.float16)}
            np.testing.assert_array_equal(as_inputs.run(None, feeds)[0], y, err_msg=f"{where}: W, B as inputs")


# --- float32 on a large, narrow, deep W whose rows are not 16-byte vectors: the fallback on padded copies ------

_STAGED_FALLBACK_KERNEL = "bias_activation_from_rows_kernel"
# (K, N), each a W of 2^21+ weights with N < K: both off multiples of 4, N alone, K alone.
STAGED_F32_SHAPES = [(4095, 1023), (4096, 1023), (4095, 1024)]
STAGED_F32_ROWS = (1, 2, 8, 64, 300)


@pytest.mark.parametrize("trans_b", [1, 0], ids=["transB1", "transB0"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_float32_unaligned_narrow_deep_fallback_runs_on_padded_copies(library, bias, trans_b):
    """From two rows the built-in path's fallback runs on the problem padded to multiples of 4: X copied into
    padded rows where K is off (the copy kernel), W's padded copy staged once, and B with the activation applied
    by the kernel that writes Y's own rows from the padded product. In every form, with and without a bias, each
    call is within ORT's error; one row keeps the plain fallback (cuBLAS's exact GEMV, as ORT's), or the gemv
    kernel where it reaches."""
    rng = np.random.default_rng(zlib.crc32(f"staged_fp32/{bias}/{trans_b}".encode()))
    for k, n in STAGED_F32_SHAPES:
        x_all, w_nk, b = make_inputs(rng, (max(STAGED_F32_ROWS), k), n, "float32", trans_b, bias)
        w = w_nk if trans_b else np.ascontiguousarray(w_nk.T)
        for approximate in ACTIVATIONS:
            sess = cuda_session(path_model("float32", k, w, b, approximate, trans_b), library)
            unfused = unfused_session(library, "float32", k, w_nk, b, approximate)
            for m in STAGED_F32_ROWS:
                x = x_all[:m]
                where = f"float32 {approximate} bias={bias} transB={trans_b} M={m} K={k} N={n}"
                if approximate == "none":  # the kernels a call runs do not depend on the form
                    names = _kernels_of(lambda: sess.run(None, {"X": x}))
                    # the gemv kernel keeps one or two rows where it reads rows of 16-byte vectors (K = 4096)
                    gemv = trans_b == 1 and k % 4 == 0 and m <= 2
                    ran = "gemv" if any(g in name for name in names for g in _GEMV_KERNELS) else (
                        "fallback" if any(f in name for name in names for f in _FALLBACK_KERNELS) else "fused")
                    staged = any(_STAGED_FALLBACK_KERNEL in name for name in names)
                    assert ran == ("gemv" if gemv else "fallback"), f"{where}: {sorted(names)}"
                    assert staged == (m >= 2 and not gemv), f"{where}: {sorted(names)}"
                    copied_x = any(_STAGING_KERNEL in name for name in names)
                    assert copied_x == (staged and k % 4 != 0), f"{where}: {sorted(names)}"
                (y,) = sess.run(None, {"X": x})
                (y_unfused,) = unfused.run(None, {"X": x})
                check_against_ort("float32", y, y_unfused, reference(x, w_nk, b, approximate), where)


def test_float32_weight_given_at_run_time_keeps_the_plain_fallback(library):
    """A W that is a graph input would be copied on every call, as costly as the GEMM it speeds up: such a node
    runs the plain fallback (the in-place activation, no copy), within ORT's error."""
    rng = np.random.default_rng(27)
    k, n = 4095, 1023
    x, w_nk, b = make_inputs(rng, (8, k), n, "float32", 1, True)
    model = path_model("float32", k, w_nk, b, "none", 1)
    as_inputs = cuda_session(_weights_as_inputs(model), library)
    feeds = {"X": x, "W": w_nk, "B": b}
    names = _kernels_of(lambda: as_inputs.run(None, feeds))
    assert any("activation_inplace_kernel" in name for name in names), sorted(names)
    assert not any(_STAGED_FALLBACK_KERNEL in name or _STAGING_KERNEL in name for name in names), sorted(names)
    (y,) = as_inputs.run(None, feeds)
    (y_unfused,) = unfused_session(library, "float32", k, w_nk, b, "none").run(None, {"X": x})
    check_against_ort("float32", y, y_unfused, reference(x, w_nk, b, "none"), "float32 W, B as graph inputs")


# --- the process around the library: it must exit cleanly -------------------------------------------------

_EXIT_CHILD = r"""
import sys
import numpy as np
import onnxruntime as ort

library, models = sys.argv[1], sys.argv[2:]
sessions = []
for path in models:
    so = ort.SessionOptions()
    so.register_custom_ops_library(library)
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    sess = ort.InferenceSession(path, so, providers=[("CUDAExecutionProvider", {"device_id": "0"})])
    k = sess.get_inputs()[0].shape[-1]
    for rows in (1, 12, 300):  # gemv, the fallback or gemv, the fused kernel (staged where K, N are odd)
        (y,) = sess.run(None, {"X": np.ones((rows, k), np.float16)})
        assert np.isfinite(y).all(), path
    sessions.append(sess)  # alive until interpreter exit, as in a program that never closes its sessions
print("ran", len(sessions), "sessions")
"""


def test_process_exits_cleanly_with_sessions_alive_at_exit(library, tmp_path):
    """A program that runs the node on every CUDA path (aligned, staged odd K/N, fallback, gemv) and exits with
    its sessions still open exits 0: the library's teardown (staged weights, cuBLASLt handles, the domain)
    survives interpreter shutdown. A child process without torch, whose profiler the kernel-name tests load."""
    import subprocess
    import sys

    rng = np.random.default_rng(25)
    paths = []
    for k, n in ((768, 3072), (770, 3074), (4095, 1023)):
        _, w_nk, b = make_inputs(rng, (1, k), n, "float16", 1, True)
        path = tmp_path / f"fused_{k}x{n}.onnx"
        path.write_bytes(path_model("float16", k, w_nk, b, "none", 1))
        paths.append(str(path))
    child = subprocess.run([sys.executable, "-c", _EXIT_CHILD, library, *paths], capture_output=True, text=True,
                           timeout=300)
    assert child.returncode == 0, f"exit {child.returncode}: {child.stderr[-2000:]}"
    assert "ran 3 sessions" in child.stdout


# --- the gemv path on its own: every row count up to 16, edges of its strips, exact fp32 ---------------------

# (K, N): aligned (16-byte vectors), odd (element loads), N narrower than one strip or warp, K = 1, long K.
GEMV_SHAPES = [(768, 3072), (1000, 3000), (770, 3074), (37, 5), (1, 40), (4096, 1024)]


@pytest.mark.parametrize("trans_b", [1, 0], ids=["transB1", "transB0"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gemv_every_row_count_matches_float64(library, dtype, trans_b):
    """Every M from 1 to 16 (the rows beyond M in the kernel's power-of-two row tile are computed from row M-1
    and never stored), with and without bias, each within ORT's own error and within the fp32 accumulation
    bound of float64."""
    rng = np.random.default_rng(zlib.crc32(f"gemv/{dtype}/{trans_b}".encode()))
    for k, n in GEMV_SHAPES:
        for bias in (True, False):
            x_all, w_nk, b = make_inputs(rng, (GEMV_MAX_ROWS, k), n, dtype, trans_b, bias)
            w = w_nk if trans_b else np.ascontiguousarray(w_nk.T)
            sess = cuda_session(path_model(dtype, k, w, b, "none", trans_b, cuda_path="gemv"), library)
            unfused = unfused_session(library, dtype, k, w_nk, b, "none")
            for m in range(1, GEMV_MAX_ROWS + 1):
                x = x_all[:m]
                ref = reference(x, w_nk, b, "none")
                (y,) = sess.run(None, {"X": x})
                (y_unfused,) = unfused.run(None, {"X": x})
                check_against_ort(dtype, y, y_unfused, ref, f"gemv {dtype} transB={trans_b} M={m} K={k} N={n} bias={bias}")


def test_gemv_float32_is_exact_fp32(library):
    """fp32 products and sums, no TF32: at K = 4096 the error is float32 round-off (TF32's 10-bit mantissas give
    ~3e-4)."""
    rng = np.random.default_rng(31)
    for trans_b in (1, 0):
        x, w_nk, b = make_inputs(rng, (7, 4096), 2048, "float32", trans_b, True)
        w = w_nk if trans_b else np.ascontiguousarray(w_nk.T)
        (y,) = cuda_session(path_model("float32", 4096, w, b, "none", trans_b, cuda_path="gemv"), library).run(None, {"X": x})
        assert rel_l2(y, reference(x, w_nk, b, "none")) < 1e-5, f"transB={trans_b}"


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_swapped_kernel_every_form_with_and_without_bias(library, dtype, bias):
    """The few-rows kernel with the operands swapped (Yᵀ = W·Xᵀ), built in from 5 rows: every form, with a bias
    and without one (its column broadcast reads a null bias as zeros), within ORT's error. 1000 x 3000 leaves a
    partial strip of W's rows (3000 = 46 x 64 + 56) and a partial last k block (1000 = 15 x 64 + 40 in 16-bit,
    31 x 32 + 8 in TF32); 32 rows are two tiles of X's rows, 21 a full and a partial one."""
    _skip_unless_sm90("the swapped few-rows kernels")
    rng = np.random.default_rng(zlib.crc32(f"swapped/{dtype}/{bias}".encode()))
    k, n = 1000, 3000
    rows = (5, 16, 21, 32)
    x_all, w_nk, b = make_inputs(rng, (max(rows), k), n, dtype, 1, bias)
    for approximate in ACTIVATIONS:
        sess = cuda_session(path_model(dtype, k, w_nk, b, approximate, 1), library)
        unfused = unfused_session(library, dtype, k, w_nk, b, approximate)
        for m in rows:
            x = x_all[:m]
            where = f"swapped {dtype} {approximate} bias={bias} M={m} K={k} N={n}"
            assert _ran_swapped(sess, x), where
            (y,) = sess.run(None, {"X": x})
            (y_unfused,) = unfused.run(None, {"X": x})
            check_against_ort(dtype, y, y_unfused, reference(x, w_nk, b, approximate), where)


def test_float32_few_rows_of_a_large_weight_run_tf32_as_ort_does(library):
    """float32 rows of a W of 2^25+ weights: the exact gemv kernel up to 4 rows; from 5 rows the fused path's
    swapped kernel on TF32 Tensor Cores (as ORT's MatMul there), within ORT's error; a strict-fp32 session never
    TF32. Forced to the gemv path, 5-16 rows run its TF32 kernel (tiles of 8 rows), also within ORT's error. K
    off a multiple of 32 and N off a multiple of 16 (and of 64) reach the kernels' zero-filled last k block and
    partial tiles."""
    _skip_unless_sm90("the swapped few-rows kernels")
    rng = np.random.default_rng(33)
    k, n = 2052, 16360  # 33.6M weights
    x_all, w_nk, b = make_inputs(rng, (GEMV_MAX_ROWS, k), n, "float32", 1, True)
    sess = cuda_session(path_model("float32", k, w_nk, b, "none", 1), library)
    strict = cuda_session(path_model("float32", k, w_nk, b, "none", 1), library, config={"onnxfuse.strict_fp32": "1"})
    forced = cuda_session(path_model("float32", k, w_nk, b, "none", 1, cuda_path="gemv"), library)
    unfused = unfused_session(library, "float32", k, w_nk, b, "none")
    for m in (1, 4, 5, 8, 9, 16):
        x = x_all[:m]
        ref = reference(x, w_nk, b, "none")
        (y_unfused,) = unfused.run(None, {"X": x})
        assert (_path_ran(sess, x), _ran_swapped(sess, x)) == (("gemv", False) if m <= 4 else ("fused", True)), f"M={m}"
        (y,) = sess.run(None, {"X": x})
        e_fused, _ = check_against_ort("float32", y, y_unfused, ref, f"auto fp32 M={m} K={k} N={n}")
        if m <= 4:
            assert e_fused < 1e-5, f"M={m}: exact fp32 expected, rel-L2 {e_fused:.2e}"
        (y_strict,) = strict.run(None, {"X": x})
        assert rel_l2(y_strict, ref) < 1e-5, f"strict M={m}"
        names = _kernels_of(lambda: strict.run(None, {"X": x}))
        assert not any("gemv_tf32_kernel" in nm or _SWAPPED_KERNEL in nm for nm in names), f"strict M={m}"
        tf32_gemv = any("gemv_tf32_kernel" in nm for nm in _kernels_of(lambda: forced.run(None, {"X": x})))
        assert tf32_gemv == (m > 4), f"forced gemv M={m}: TF32 kernel {'ran' if tf32_gemv else 'did not run'}"
        (y,) = forced.run(None, {"X": x})
        check_against_ort("float32", y, y_unfused, ref, f"forced gemv fp32 M={m} K={k} N={n}")


def test_forced_gemv_beyond_its_rows_is_an_error(library):
    rng = np.random.default_rng(32)
    x, w_nk, b = make_inputs(rng, (17, 64), 32, "float16", 1, True)
    sess = cuda_session(path_model("float16", 64, w_nk, b, "none", 1, cuda_path="gemv"), library)
    sess.run(None, {"X": x[:16]})
    with pytest.raises(Exception, match="cuda_path='gemv' runs at most 16 rows; this call has M=17"):
        sess.run(None, {"X": x})
