"""ai.onnxfuse.FillMaskedRows, the attention rule's row guard, on ORT's CPU provider and (where there is one)
its CUDA provider: bit for bit what ONNX's Where(ReduceMax(row_kept, axes=[-1]), X, fill) computes (here in
numpy: ORT's CPU Where has no float16 kernel, and ORT runs it in float32 behind Casts it inserts) for every
element type, every flag layout ([B, S|1, K] and the attention mask's [B, 1, S|1, K], one flag a row and a
key's worth) and both fills the rule writes (0 and NaN); in place (X an intermediate ORT lets the op
overwrite) and not (X a graph input, which ORT never hands over); bad inputs fail with a message naming the
input."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from onnxfuse.domain import DOMAIN, DOMAIN_VERSION, FILL_MASKED_ROWS
from onnxfuse.errors import BadInputError
from onnxfuse.runtime import create_session, cuda_unusable_reason

_NO_CUDA = cuda_unusable_reason()
PROVIDERS = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    _NO_CUDA is not None, reason=f"CUDA tests: {_NO_CUDA}")])]
DTYPES = {"float32": T.FLOAT, "float16": T.FLOAT16, "bfloat16": T.BFLOAT16}


def _model(dtype: int, flag_rows: str, fill: float | None, in_place: bool, width: int,
           flags: tuple = (1,), mask_layout: bool = False) -> onnx.ModelProto:
    """got = Cast(FillMaskedRows(X', kept), float32), where X' = Cast(x, dtype) (an intermediate whose last
    reader is the op: ORT may let it write in place) or, with ``in_place`` false, x itself (a graph input,
    which ORT never hands over). The Cast to float32 is exact for every element type. ``kept`` is
    [B, flag_rows, *flags], or with ``mask_layout`` [B, 1, flag_rows, *flags]."""
    x_type = dtype if not in_place else T.FLOAT
    nodes = []
    source = "x"
    if in_place:
        nodes.append(helper.make_node("Cast", ["x"], ["xc"], to=dtype))
        source = "xc"
    kwargs = {} if fill is None else {"fill": fill}
    nodes.append(helper.make_node(FILL_MASKED_ROWS, [source, "kept"], ["g"], domain=DOMAIN, **kwargs))
    nodes.append(helper.make_node("Cast", ["g"], ["got"], to=T.FLOAT))
    graph = helper.make_graph(
        nodes, "fill_masked_rows",
        [helper.make_tensor_value_info("x", x_type, ["B", "S", width]),
         helper.make_tensor_value_info("kept", T.BOOL, ["B"] + [1] * mask_layout + [flag_rows, *flags])],
        [helper.make_tensor_value_info("got", T.FLOAT, ["B", "S", width])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, DOMAIN_VERSION)],
                             ir_version=9)


def _rounded(x: np.ndarray, dtype: str) -> np.ndarray:
    """x (float32) as the element type rounds it (nearest even), back in float32: what Cast(x, dtype) holds."""
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        return bits.astype(np.uint32).view(np.float32)
    return x.astype(np.float32)


def _expected(x: np.ndarray, kept: np.ndarray, dtype: str, fill: float | None) -> np.ndarray:
    """Where(ReduceMax(kept, axes=[-1]), x, fill) in float32 (x rounded to ``dtype`` first)."""
    rows = kept.any(axis=-1, keepdims=True)
    if rows.ndim == 4:
        rows = rows[:, 0]
    return np.where(rows, _rounded(x.astype(np.float32), dtype), np.float32(0.0 if fill is None else fill))


def _assert_bits(want: np.ndarray, got: np.ndarray) -> None:
    assert np.array_equal(np.isnan(want), np.isnan(got))
    finite = ~np.isnan(want)
    assert np.array_equal(want[finite].view(np.uint32), got[finite].view(np.uint32))


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("flag_rows", ["S", 1])
@pytest.mark.parametrize("fill", [None, 0.0, float("nan")])
@pytest.mark.parametrize("in_place", [True, False])
@pytest.mark.parametrize("width", [768, 5])  # 16-byte rows (the CUDA kernel's vectors) and odd ones
def test_matches_where_bit_for_bit(provider, dtype, flag_rows, fill, in_place, width, rng):
    if not in_place and dtype == "bfloat16":
        pytest.skip("numpy has no bfloat16 to feed: bfloat16 is covered through the in-place form's Cast")
    model = _model(DTYPES[dtype], flag_rows, fill, in_place, width)
    onnx.checker.check_model(model, full_check=True)
    session = create_session(model, providers=provider, as_written=True)
    batch, seq = 3, 7
    np_type = np.float32 if in_place or dtype == "float32" else np.float16
    x = (rng.standard_normal((batch, seq, width)) * 10).astype(np_type)
    kept = rng.random((batch, seq if flag_rows == "S" else 1, 1)) > 0.4
    kept[0] = True  # a batch entry with every row kept, and one with none
    kept[1] = False
    (got,) = session.run(None, {"x": x, "kept": kept})
    _assert_bits(_expected(x, kept, dtype, fill), got)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("flag_rows", ["S", 1])
@pytest.mark.parametrize("keys", [1, 3, 31, 32, 33, 128, 130])  # a warp's width and either side of it
@pytest.mark.parametrize("mask_layout", [False, True])
@pytest.mark.parametrize("in_place", [True, False])
def test_a_row_is_kept_when_any_of_its_flags_is(provider, dtype, flag_rows, keys, mask_layout, in_place, rng):
    """The attention mask itself as the flags: a row survives when any of its keys is kept, wherever that
    one key is (first, last, past the first warp's width), and is filled when none is."""
    model = _model(DTYPES[dtype], flag_rows, float("nan"), in_place, 64, flags=(keys,), mask_layout=mask_layout)
    onnx.checker.check_model(model, full_check=True)
    session = create_session(model, providers=provider, as_written=True)
    batch, seq = 4, 6
    rows = seq if flag_rows == "S" else 1
    x = (rng.standard_normal((batch, seq, 64)) * 10).astype(np.float32 if in_place or dtype == "float32" else np.float16)
    kept = np.zeros((batch, rows, keys), bool)
    for b in range(batch):
        for r in range(rows):
            choice = rng.integers(0, 4)  # none kept, only the first, only the last, a random few
            if choice == 1:
                kept[b, r, 0] = True
            elif choice == 2:
                kept[b, r, -1] = True
            elif choice == 3:
                kept[b, r] = rng.random(keys) > 0.7
    kept[0] = False
    kept[1, :, -1] = True
    feed = kept[:, None] if mask_layout else kept
    (got,) = session.run(None, {"x": x, "kept": feed})
    _assert_bits(_expected(x, feed, dtype, float("nan")), got)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_empty_rows(provider):
    session = create_session(_model(T.FLOAT, "S", None, False, 4), providers=provider, as_written=True)
    (got,) = session.run(None, {"x": np.zeros((2, 0, 4), np.float32), "kept": np.zeros((2, 0, 1), bool)})
    assert got.shape == (2, 0, 4)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("kept_shape", [(1, 3, 1), (2, 2, 1), (2, 3, 0), (2, 2, 3, 1), (2, 3), (2, 1, 3, 1, 1)])
def test_bad_flag_shapes_fail_with_the_reason(provider, kept_shape):
    """Another batch, another row count, no flags, a heads axis other than 1, too few or too many axes."""
    x = helper.make_tensor_value_info("x", T.FLOAT, [None, None, None])
    kept = helper.make_tensor_value_info("kept", T.BOOL, None)
    node = helper.make_node(FILL_MASKED_ROWS, ["x", "kept"], ["y"], domain=DOMAIN)
    graph = helper.make_graph([node], "g", [x, kept], [helper.make_tensor_value_info("y", T.FLOAT, [None, None, None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, DOMAIN_VERSION)],
                              ir_version=9)
    session = create_session(model, providers=provider, as_written=True)
    with pytest.raises(Exception, match="row_kept must be"):
        session.run(None, {"x": np.zeros((2, 3, 4), np.float32), "kept": np.ones(kept_shape, bool)})


def test_checker_and_shape_inference():
    model = _model(T.FLOAT16, "S", float("nan"), True, 8)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    (g,) = [v for v in inferred.graph.value_info if v.name == "g"]
    assert g.type.tensor_type.elem_type == T.FLOAT16
    assert [d.dim_param or d.dim_value for d in g.type.tensor_type.shape.dim] == ["B", "S", 8]


def test_a_library_without_the_op_version_is_refused():
    """The op exists since version 2 of the domain: a model importing version 1 has no such op."""
    model = _model(T.FLOAT, "S", None, False, 4)
    model.opset_import[1].version = 1
    with pytest.raises(BadInputError):
        create_session(model, providers="cpu", as_written=True)
