"""ai.onnxfuse.MaskedSkipLayerNormalization on ORT's CPU provider and (where there is one) its CUDA provider:
against a float64 reference of its contract for every element type, the widths each CUDA kernel takes (16-byte
rows in registers up to 8 KiB, anything else element by element), every flag layout, every skip layout and
with beta, bias and the sum output present or absent; against ORT's own SkipLayerNormalization fed the
guarded input (the graph the op replaces); NaN in a row that is not kept never reaches the output; bad inputs
fail with a message naming the input."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from onnxfuse.domain import DOMAIN, DOMAIN_VERSION, FILL_MASKED_ROWS, MASKED_SKIP_NORM
from onnxfuse.errors import BadInputError
from onnxfuse.runtime import create_session, cuda_unusable_reason

_NO_CUDA = cuda_unusable_reason()
PROVIDERS = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    _NO_CUDA is not None, reason=f"CUDA tests: {_NO_CUDA}")])]
DTYPES = {"float32": T.FLOAT, "float16": T.FLOAT16, "bfloat16": T.BFLOAT16}
# |got - want| <= atol + rtol·|want| on outputs of size ~1-10: float32 arithmetic, or one rounding to the type
TOLERANCE = {"float32": (2e-5, 2e-5), "float16": (2e-3, 2e-3), "bfloat16": (1.6e-2, 1.6e-2)}
EPSILON = 1e-5
OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, DOMAIN_VERSION),
          helper.make_opsetid("com.microsoft", 1)]


def _model(dtype: int, width: int, *, skip_layout: str = "BSD", flags: tuple = ("S", 1), beta: bool = True,
           bias: bool = True, sum_output: bool = False, guard_then_ort: bool = False) -> onnx.ModelProto:
    """Float32 graph inputs cast to ``dtype``, the op, its outputs cast back to float32 (both Casts exact for
    the values rounded to the type). ``guard_then_ort`` builds what the op replaces instead: FillMaskedRows on
    the input, then ORT's SkipLayerNormalization."""
    skip_dims = {"BSD": ["B", "S", width], "1SD": [1, "S", width], "SD": ["S", width]}[skip_layout]
    inputs = [("x", ["B", "S", width]), ("skip", skip_dims), ("gamma", [width])]
    inputs += [("beta", [width])] * beta + [("bias", [width])] * bias
    nodes = [helper.make_node("Cast", [name], [name + "_t"], to=dtype) for name, _ in inputs]
    norm_inputs = ["x_t", "skip_t", "kept", "gamma_t", "beta_t" if beta else "", "bias_t" if bias else ""]
    outputs = ["y_t"] + ["sum_t"] * sum_output
    if guard_then_ort:
        nodes.append(helper.make_node(FILL_MASKED_ROWS, ["x_t", "kept"], ["guarded"], domain=DOMAIN))
        ort_inputs = ["guarded", "skip_t", "gamma_t", "beta_t" if beta else "", "bias_t" if bias else ""]
        nodes.append(helper.make_node("SkipLayerNormalization", ort_inputs,
                                      outputs[:1] + (["", "", "sum_t"] if sum_output else []),
                                      domain="com.microsoft", epsilon=EPSILON))
    else:
        nodes.append(helper.make_node(MASKED_SKIP_NORM, norm_inputs, outputs, domain=DOMAIN, epsilon=EPSILON))
    nodes += [helper.make_node("Cast", [o], [o[:-2]], to=T.FLOAT) for o in outputs]
    graph = helper.make_graph(
        nodes, "masked_skip_norm",
        [helper.make_tensor_value_info(name, T.FLOAT, dims) for name, dims in inputs]
        + [helper.make_tensor_value_info("kept", T.BOOL, ["B", *flags])],
        [helper.make_tensor_value_info(o[:-2], T.FLOAT, ["B", "S", width]) for o in outputs])
    return helper.make_model(graph, opset_imports=OPSETS, ir_version=9)


def _rounded(x: np.ndarray, dtype: str) -> np.ndarray:
    """x as the element type rounds it (nearest even), in float64."""
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float64)
    if dtype == "bfloat16":
        bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        return bits.astype(np.uint32).view(np.float32).astype(np.float64)
    return x.astype(np.float32).astype(np.float64)


def _reference(feeds: dict, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(Y, sum) of the contract in float64 from the inputs as the type holds them."""
    x = _rounded(feeds["x"], dtype)
    kept = feeds["kept"].any(axis=-1)  # [B, S|1] or [B, 1, S|1]
    if kept.ndim == 3:
        kept = kept[:, 0]
    total = np.where(kept[..., None], x, 0.0) + _rounded(feeds["skip"], dtype)
    if "bias" in feeds:
        total = total + _rounded(feeds["bias"], dtype)
    mean = total.mean(axis=-1, keepdims=True)
    var = ((total - mean) ** 2).mean(axis=-1, keepdims=True)
    y = (total - mean) / np.sqrt(var + EPSILON) * _rounded(feeds["gamma"], dtype)
    if "beta" in feeds:
        y = y + _rounded(feeds["beta"], dtype)
    return y, total


def _feeds(rng, batch: int, seq: int, width: int, *, skip_layout="BSD", flags=("S", 1), beta=True, bias=True):
    skip_shape = {"BSD": (batch, seq, width), "1SD": (1, seq, width), "SD": (seq, width)}[skip_layout]
    feeds = {"x": rng.standard_normal((batch, seq, width)).astype(np.float32) * 2,
             "skip": rng.standard_normal(skip_shape).astype(np.float32) * 3 + 0.5,
             "gamma": (rng.random(width) + 0.5).astype(np.float32)}
    if beta:
        feeds["beta"] = rng.standard_normal(width).astype(np.float32) * 0.1
    if bias:
        feeds["bias"] = rng.standard_normal(width).astype(np.float32) * 0.2
    flag_shape = tuple(seq if f == "S" else f for f in flags)
    kept = rng.random((batch, *flag_shape)) > 0.5
    kept[0] = True  # a batch entry with every row kept, and one with none
    kept[-1] = False
    feeds["kept"] = kept
    return feeds


def _assert_close(got: np.ndarray, want: np.ndarray, dtype: str) -> None:
    atol, rtol = TOLERANCE[dtype]
    np.testing.assert_allclose(got, want, atol=atol, rtol=rtol)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("dtype", DTYPES)
# 16-byte rows in registers (one vector a lane; 768: three; a lane short of a full warp's vectors), a row of
# 8 KiB (the most in registers: 4096 16-bit, 2048 float32), one past it, and rows that are not 16-byte vectors
@pytest.mark.parametrize("width", [64, 768, 776, 2048, 4096, 4104, 100, 5])
def test_matches_the_contract(provider, dtype, width, rng):
    model = _model(DTYPES[dtype], width, sum_output=True)
    onnx.checker.check_model(model, full_check=True)
    session = create_session(model, providers=provider, as_written=True)
    feeds = _feeds(rng, 3, 5, width)
    feeds["x"][-1] = np.nan  # the rows that are not kept: nothing of them may reach Y or the sum
    y, total = session.run(None, feeds)
    want_y, want_total = _reference(feeds, dtype)
    _assert_close(y, want_y, dtype)
    _assert_close(total, _rounded(want_total, dtype), dtype)
    assert np.isfinite(y).all() and np.isfinite(total).all()


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("skip_layout", ["BSD", "1SD", "SD"])
@pytest.mark.parametrize("flags", [("S", 1), (1, 1), ("S", 33), (1, "S", 128), (1, 1, 130)])
@pytest.mark.parametrize("optional", ["all", "no beta", "no bias", "neither"])
def test_layouts_and_optional_inputs(provider, dtype, skip_layout, flags, optional, rng):
    """Every skip layout, the flags one a row, one set a batch entry, and the attention mask's own
    [B, 1, S|1, T] (a row is kept when any key is); beta and bias each present or not."""
    beta, bias = optional in ("all", "no bias"), optional in ("all", "no beta")
    width, seq = 256, 6
    flags = tuple(seq if f == "S" else f for f in flags)
    model = _model(DTYPES[dtype], width, skip_layout=skip_layout, flags=flags, beta=beta, bias=bias)
    session = create_session(model, providers=provider, as_written=True)
    feeds = _feeds(rng, 4, seq, width, skip_layout=skip_layout, flags=flags, beta=beta, bias=bias)
    if flags[-1] > 1:  # sparse keys: a row kept by its last key alone, one by its first alone
        feeds["kept"] = rng.random(feeds["kept"].shape) > 0.9
        feeds["kept"][0, ..., -1] = True
        feeds["kept"][1, ..., 0] = True
        feeds["kept"][2] = False
    (y,) = session.run(None, feeds)
    _assert_close(y, _reference(feeds, dtype)[0], dtype)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("sum_output", [False, True])
def test_matches_the_guard_then_ort_skip_layer_normalization(provider, dtype, sum_output, rng):
    """The graph the fold replaces, FillMaskedRows then ORT's SkipLayerNormalization, on the same provider."""
    width = 768
    ours = create_session(_model(DTYPES[dtype], width, sum_output=sum_output), providers=provider, as_written=True)
    theirs = create_session(_model(DTYPES[dtype], width, sum_output=sum_output, guard_then_ort=True),
                            providers=provider, as_written=True)
    feeds = _feeds(rng, 4, 16, width)
    for got, want in zip(ours.run(None, feeds), theirs.run(None, feeds), strict=True):
        _assert_close(got, want, dtype)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_empty_rows(provider):
    session = create_session(_model(T.FLOAT, 8, sum_output=True), providers=provider, as_written=True)
    feeds = _feeds(np.random.default_rng(0), 2, 1, 8)
    feeds["x"], feeds["skip"], feeds["kept"] = (np.zeros((2, 0, 8), np.float32), np.zeros((2, 0, 8), np.float32),
                                                np.zeros((2, 0, 1), bool))
    y, total = session.run(None, feeds)
    assert y.shape == total.shape == (2, 0, 8)


def _raw_model(**attrs) -> onnx.ModelProto:
    """The op on float32 graph inputs of any shape, for the bad-input cases."""
    names = ["x", "skip", "kept", "gamma", "beta", "bias"]
    node = helper.make_node(MASKED_SKIP_NORM, names, ["y"], domain=DOMAIN, **attrs)
    inputs = [helper.make_tensor_value_info(n, T.BOOL if n == "kept" else T.FLOAT, None) for n in names]
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", T.FLOAT, None)])
    return helper.make_model(graph, opset_imports=OPSETS, ir_version=9)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("bad,message", [
    ({"x": (2, 3)}, "input must be"),
    ({"skip": (2, 2, 4)}, "skip must be"),
    ({"skip": (4, 4)}, "skip must be"),
    ({"kept": (2, 2, 1)}, "row_kept must be"),
    ({"gamma": (5,)}, "gamma must be"),
    ({"beta": (4, 1)}, "beta must be"),
    ({"bias": (3,)}, "bias must be"),
])
def test_bad_shapes_fail_naming_the_input(provider, bad, message):
    shapes = {"x": (2, 3, 4), "skip": (2, 3, 4), "kept": (2, 3, 1), "gamma": (4,), "beta": (4,), "bias": (4,)}
    shapes.update(bad)
    feeds = {n: np.ones(s, bool if n == "kept" else np.float32) for n, s in shapes.items()}
    session = create_session(_raw_model(), providers=provider, as_written=True)
    with pytest.raises(Exception, match=message):
        session.run(None, feeds)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_negative_epsilon_is_refused(provider):
    with pytest.raises(Exception, match="epsilon must be finite and >= 0"):
        create_session(_raw_model(epsilon=-1.0), providers=provider, as_written=True)


def test_checker_and_shape_inference():
    model = _model(T.FLOAT16, 8, sum_output=True)
    onnx.checker.check_model(model, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    for name in ("y_t", "sum_t"):
        (v,) = [v for v in inferred.graph.value_info if v.name == name]
        assert v.type.tensor_type.elem_type == T.FLOAT16
        assert [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] == ["B", "S", 8]


def test_a_model_of_an_older_domain_version_has_no_such_op():
    """The op exists since version 3 of the domain: a model importing version 2 has no such op."""
    model = _model(T.FLOAT, 8)
    model.opset_import[1].version = 2
    with pytest.raises(BadInputError):
        create_session(model, providers="cpu", as_written=True)
