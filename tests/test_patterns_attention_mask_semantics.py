"""Masks read off what they compute (``onnxfuse/patterns/attention/mask_semantics.py``, ``mask_cone.py``,
``scalar_ops.py``): one hand-built attention per spelling transformers and the exporters write for a padding mask
(and a decoder's causal-and-padding mask), each fused and matching the unfused model on ORT's CPU provider with
right, left and all-padding rows, float32 and float16; the ones that read the mask only for being zero on any
integer mask values, the arithmetic ones with their precondition in the report; and the negatives — a mask
of the query index, a positive fill, a kept value that is not 0, an inverted mask, two data inputs, ops that mix
keys — refused and left bit-identical."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from onnxfuse.patterns.attention import scalar_ops
from tests.test_patterns_attention import D, _attention, _fuse, _fused_node, _session

F16_MIN = float(np.finfo(np.float16).min)
F32_MIN = float(np.finfo(np.float32).min)
# right padding, left padding, none, all (rows that see no key), and mixed
PADDED = np.array([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [1] * 5, [0] * 5, [0, 1, 1, 1, 1], [1, 1, 1, 1, 0]])


class _Bias:
    """The nodes of a mask bias built from ``attention_mask`` (the graph input) into the tensor ``padding_bias``."""

    def __init__(self, dtype: int):
        self.dtype, self.nodes, self.inits = dtype, [], []

    def const(self, name: str, value, dtype: int | None = None) -> str:
        np_type = helper.tensor_dtype_to_np_dtype(dtype or self.dtype)
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=np_type), name))
        return name

    def node(self, op: str, ins: list, out: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op, ins, [out], name=out, **attrs))
        return out

    def keys_4d(self, src: str = "attention_mask") -> str:
        """attention_mask[:, None, None, :]"""
        return self.node("Unsqueeze", [src, self.const("keys_axes", [1, 2], T.INT64)], "mask_4d")

    def expanded(self, src: str) -> str:
        """``src`` [B, 1, 1, T] expanded to [B, 1, S, T] from the shapes (``_expand_mask``'s tgt_len)."""
        shape = self.node("Shape", ["attention_mask"], "mask_shape")
        b = self.node("Slice", [shape, self.const("b_from", [0], T.INT64), self.const("b_to", [1], T.INT64)], "mask_b")
        t = self.node("Slice", [shape, self.const("t_from", [1], T.INT64), self.const("t_to", [2], T.INT64)], "mask_t")
        s = self.node("Slice", [self.node("Shape", ["x"], "x_shape"), self.const("s_from", [1], T.INT64),
                                self.const("s_to", [2], T.INT64)], "x_s")
        target = self.node("Concat", [b, self.const("one_head", [1], T.INT64), s, t], "expand_shape", axis=0)
        return self.node("Expand", [src, target], "mask_expanded")

    def causal_keep(self) -> str:
        """k <= q over the query's positions, [S, S] (transformers' Range compare)."""
        seq = self.node("Squeeze", [self.node("Shape", ["x"], "x_seq", start=1, end=2)], "seq")
        r = self.node("Range", [self.const("zero_i", 0, T.INT64), seq, self.const("one_i", 1, T.INT64)], "positions")
        q = self.node("Unsqueeze", [r, self.const("q_axes", [1], T.INT64)], "q_idx")
        k = self.node("Unsqueeze", [r, self.const("k_axes", [0], T.INT64)], "k_idx")
        return self.node("LessOrEqual", [k, q], "keep_causal")


def _finfo_min_bert(b: _Bias, fill=None) -> str:
    """transformers 4.x BERT: ``(1.0 - mask[:, None, None, :].to(dtype)) * finfo(dtype).min``."""
    inverted = b.node("Sub", [b.const("one", 1.0), b.node("Cast", [b.keys_4d()], "mask_float", to=b.dtype)], "inverted")
    lowest = float(np.finfo(helper.tensor_dtype_to_np_dtype(b.dtype)).min) if fill is None else fill
    return b.node("Mul", [inverted, b.const("fill", lowest)], "padding_bias")


def _minus_10000(b: _Bias) -> str:
    return _finfo_min_bert(b, fill=-10000.0)


def _expand_mask(b: _Bias) -> str:
    """transformers 4.3x ``_expand_mask``: ``inverted.masked_fill(inverted.to(torch.bool), finfo(dtype).min)`` of
    the mask expanded to [B, 1, S, T], the fill a CastLike of a constant (the dynamo exporter). (Not float32's
    lowest into a float16 graph: ORT's CPU provider runs float16 CastLike in float32, where it stays finite.)"""
    inverted = b.node("Sub", [b.const("one", 1.0), b.node("Cast", [b.expanded(b.keys_4d())], "mask_float",
                                                            to=b.dtype)], "inverted")
    lowest = b.node("CastLike", [b.const("lowest", np.finfo(helper.tensor_dtype_to_np_dtype(b.dtype)).min), inverted],
                    "lowest_like")
    return b.node("Where", [b.node("Cast", [inverted], "inverted_bool", to=T.BOOL), lowest, inverted], "padding_bias")


def _equal_zero(b: _Bias) -> str:
    """``Where(mask == 0, -inf, 0)``, through an Identity and a Cast to float (which keeps zero zero)."""
    m = b.node("Cast", [b.node("Identity", ["attention_mask"], "mask_copy")], "mask_as_float", to=T.FLOAT)
    dropped = b.node("Equal", [b.keys_4d(m), b.const("zero_f", 0.0, T.FLOAT)], "dropped")
    return b.node("Where", [dropped, b.const("fill", -math.inf), b.const("kept", 0.0)], "padding_bias")


def _bool_not(b: _Bias) -> str:
    """A boolean mask: ``Where(Not(keep), -inf, -0.0)`` (a negative zero kept)."""
    dropped = b.node("Not", [b.keys_4d()], "dropped")
    return b.node("Where", [dropped, b.const("fill", -math.inf), b.const("kept", -0.0)], "padding_bias")


def _given_4d(b: _Bias) -> str:
    """A mask given already as [B, 1, 1, T] floats: ``(1 - m) · finfo.min``, read through an Identity."""
    m = b.node("Identity", ["attention_mask"], "mask_copy")
    inverted = b.node("Sub", [b.const("one", 1.0), b.node("Cast", [m], "mask_float", to=b.dtype)], "inverted")
    lowest = float(np.finfo(helper.tensor_dtype_to_np_dtype(b.dtype)).min)
    return b.node("Mul", [inverted, b.const("fill", lowest)], "padding_bias")


def _given_4d_bool(b: _Bias) -> str:
    """A boolean keep given as [B, 1, 1, T]: ``Where(keep, 0, -inf)`` (exact for both values)."""
    return b.node("Where", ["attention_mask", b.const("kept", 0.0), b.const("fill", -math.inf)], "padding_bias")


def _causal_and_padding(b: _Bias) -> str:
    """A decoder's ``causal_mask.masked_fill(padding == 0, fill)`` (``AttentionMaskConverter``): the causal part a
    float [S, S] of 0 and -inf, the padding dropping whatever the causal part says."""
    causal = b.node("Where", [b.causal_keep(), b.const("kept", 0.0), b.const("fill", -math.inf)], "causal_bias")
    causal = b.node("Unsqueeze", [causal, b.const("causal_axes", [0, 1], T.INT64)], "causal_4d")
    padded = b.node("Equal", [b.keys_4d(), b.const("zero_i", 0, T.INT64)], "padded")
    return b.node("Where", [padded, b.const("padded_fill", -math.inf), causal], "padding_bias")


def _sliding_window(b: _Bias) -> str:
    """transformers 4.36's Mistral (``_prepare_4d_causal_attention_mask`` with a sliding window of 2 keys): the
    causal part a fill above the diagonal, the keys left of the window dropped by ``1 - triu(ones, -window)``,
    then the padding's ``masked_fill`` of the inverted mask. (With -inf fills: with ``finfo.min`` the bias is
    finite and fed as it is.)"""
    lowest = -math.inf
    causal = b.node("Where", [b.causal_keep(), b.const("kept", 0.0), b.const("fill", lowest)], "causal_bias")
    seq = b.node("Unsqueeze", ["seq", b.const("seq_axis", [0], T.INT64)], "seq_1")
    ones = b.node("ConstantOfShape", [b.node("Concat", [seq, seq], "square", axis=0)], "ones",
                  value=numpy_helper.from_array(np.ones(1, helper.tensor_dtype_to_np_dtype(b.dtype))))
    band = b.node("Trilu", [ones, b.const("window", -1, T.INT64)], "band", upper=1)
    outside = b.node("Cast", [b.node("Sub", [b.const("one_f", 1.0), band], "outside_f")], "outside", to=T.BOOL)
    causal = b.node("Where", [outside, b.const("window_fill", lowest), causal], "windowed_bias")
    causal = b.node("Unsqueeze", [causal, b.const("causal_axes", [0, 1], T.INT64)], "causal_4d")
    inverted = b.node("Sub", [b.const("one", 1.0), b.node("Cast", [b.keys_4d()], "mask_float", to=b.dtype)], "inverted")
    return b.node("Where", [b.node("Cast", [inverted], "inverted_bool", to=T.BOOL), b.const("padded_fill", lowest),
                            causal], "padding_bias")


def _flattened_keep(b: _Bias) -> str:
    """The padding flattened and reshaped back (as optimum's exports index the mask), with the causal keep,
    dropped where ``Not(keep)``: the padding that is no cone's (its Reshape flattens) is one leaf as the symbolic
    evaluator reads it, and the flattened tensor inside it none (its formula reads the axes it was flattened from)."""
    padding = b.keys_4d(b.node("Cast", ["attention_mask"], "mask_bool", to=T.BOOL))
    flat = b.node("Reshape", [padding, b.const("flat_shape", [-1], T.INT64)], "padding_flat")
    back = b.node("Reshape", [flat, b.node("Shape", [padding], "padding_shape")], "padding_again")
    keep = b.node("And", [back, b.causal_keep()], "keep")
    fill = b.node("CastLike", [b.const("fill", -math.inf, T.FLOAT), "x"], "fill_like")
    return b.node("Where", [b.node("Not", [keep], "dropped"), fill, b.const("kept", 0.0)], "padding_bias")


def _model(spelling, dtype: int = T.FLOAT, mask_type: int = T.INT64, mask_shape=("batch", "seq"),
           guard: bool = True) -> onnx.ModelProto:
    """An sdpa-style self-attention (``_attention``) whose scores get ``spelling``'s bias built from
    ``attention_mask``."""
    model = _attention(mask="none", bias="one_minus", bias_fill=-1.0, dtype=dtype, guard=guard)  # (its bias replaced)
    graph = model.graph
    theirs = {"mask_4d", "mask_float", "inverted_mask", "padding_bias"}
    at = next(i for i, n in enumerate(graph.node) if n.output[0] in theirs)
    kept = [n for n in graph.node if n.output[0] not in theirs]
    b = _Bias(dtype)
    assert spelling(b) == "padding_bias"
    del graph.node[:]
    graph.node.extend(kept[:at] + b.nodes + kept[at:])
    inits = [t for t in graph.initializer if t.name not in ("bias_axes", "one", "bias_fill")]
    del graph.initializer[:]
    graph.initializer.extend(inits + b.inits)
    (mask,) = [i for i in graph.input if i.name == "attention_mask"]
    mask.CopyFrom(helper.make_tensor_value_info("attention_mask", mask_type, list(mask_shape)))
    return model


def _feeds(model: onnx.ModelProto, masks: np.ndarray, dtype: int, rng) -> dict:
    np_type = helper.tensor_dtype_to_np_dtype(dtype)
    (mask,) = [i for i in model.graph.input if i.name == "attention_mask"]
    rank = len(mask.type.tensor_type.shape.dim)
    values = masks.reshape(masks.shape[0], *([1] * (rank - 2)), masks.shape[1])
    return {"x": (rng.standard_normal((masks.shape[0], masks.shape[1], D)) * 3.0).astype(np_type),
            "attention_mask": values.astype(helper.tensor_dtype_to_np_dtype(mask.type.tensor_type.elem_type))}


def _assert_matches(model, fused, feeds, dtype):
    want, got = (s.run(None, feeds)[0].astype(np.float64) for s in (_session(model), _session(fused)))
    assert np.array_equal(np.isnan(want), np.isnan(got))
    ok = ~np.isnan(want)
    tol = 4e-3 if dtype == T.FLOAT16 else 1e-5
    assert np.max(np.abs(want[ok] - got[ok])) <= tol * max(1.0, np.max(np.abs(want[ok])))


FUSED = [
    # (spelling, dtype, mask type, mask shape, kind, fill, mask values it is proved on)
    (_finfo_min_bert, T.FLOAT, T.INT64, ("batch", "seq"), "key-padding", F32_MIN, "0 or 1"),
    (_finfo_min_bert, T.FLOAT16, T.INT64, ("batch", "seq"), "key-padding", F16_MIN, "0 or 1"),
    (_minus_10000, T.FLOAT16, T.INT64, ("batch", "seq"), "key-padding", -10000.0, "0 or 1"),
    # the mask's length a symbol of its own (the scores' is the input's): the bias as it is is not shown to be of
    # the scores' shape, the rebuilt one is checked by the fused op at run time
    (_expand_mask, T.FLOAT, T.INT64, ("batch", "keys"), "key-padding", F32_MIN, "0 or 1"),
    (_expand_mask, T.FLOAT16, T.INT64, ("batch", "seq"), "key-padding", F16_MIN, "0 or 1"),
    (_equal_zero, T.FLOAT, T.INT64, ("batch", "seq"), "key-padding", -math.inf, None),
    (_equal_zero, T.FLOAT16, T.INT64, ("batch", "seq"), "key-padding", -math.inf, None),
    (_bool_not, T.FLOAT, T.BOOL, ("batch", "seq"), "key-padding", -math.inf, None),
    (_bool_not, T.FLOAT16, T.BOOL, ("batch", "seq"), "key-padding", -math.inf, None),
    (_given_4d, T.FLOAT, T.FLOAT, ("batch", 1, 1, "seq"), "key-padding", F32_MIN, "0 or 1"),
    (_given_4d, T.FLOAT16, T.FLOAT16, ("batch", 1, 1, "seq"), "key-padding", F16_MIN, "0 or 1"),
    (_given_4d_bool, T.FLOAT, T.BOOL, ("batch", 1, 1, "seq"), "key-padding", -math.inf, None),
    (_causal_and_padding, T.FLOAT, T.INT64, ("batch", "seq"), "causal+key-padding", -math.inf, None),
    (_causal_and_padding, T.FLOAT16, T.INT64, ("batch", "seq"), "causal+key-padding", -math.inf, None),
    (_flattened_keep, T.FLOAT, T.INT64, ("batch", "seq"), "causal+key-padding", -math.inf, None),
    (_sliding_window, T.FLOAT, T.INT64, ("batch", "seq"), "causal+sliding-window+key-padding", -math.inf, "0 or 1"),
    (_sliding_window, T.FLOAT16, T.INT64, ("batch", "seq"), "causal+sliding-window+key-padding", -math.inf, "0 or 1"),
]


@pytest.mark.parametrize("guard", [True, False], ids=["isnan-guard", "no-guard"])
@pytest.mark.parametrize("spelling,dtype,mask_type,mask_shape,kind,fill,values", FUSED,
                         ids=lambda v: getattr(v, "__name__", None) or str(v))
def test_each_spelling_is_fused_and_matches_the_unfused_model(spelling, dtype, mask_type, mask_shape, kind, fill,
                                                              values, guard, rng):
    model = _model(spelling, dtype, mask_type, mask_shape, guard)
    result = _fuse(model)
    assert [b.rule for b in result.report.fused] == ["attention"], [r.reason for r in result.report.refused]
    (block,) = result.report.fused
    assert block.details["mask"] == kind and block.details["mask_input"] == "attention_bias"
    assert block.details.get("mask_values") == values  # the precondition, where there is one, in the report
    assert (f"attention_mask {values}" in block.form) == (values is not None)
    assert block.details.get("window") == (2 if "sliding-window" in kind else None)  # triu(ones, -1): k - q >= -1
    assert not any(n.op_type == "Softmax" for n in result.model.graph.node)
    # the fill the graph computes, in its type, is the rebuilt bias's
    (fill_init,) = [t for t in result.model.graph.initializer if t.name.endswith("_mask_fill")]
    np_type = helper.tensor_dtype_to_np_dtype(dtype)
    assert numpy_helper.to_array(fill_init).tobytes() == np.array(fill, np_type).tobytes()
    row_guard = any(n.name.endswith("_hidden_rows") for n in result.model.graph.node)
    assert row_guard == (fill == -math.inf)
    for masks in (PADDED, PADDED[::-1].copy()):
        _assert_matches(model, result.model, _feeds(model, masks, dtype, rng), dtype)


@pytest.mark.parametrize("spelling", [_equal_zero, _causal_and_padding])
def test_a_mask_read_only_for_being_zero_is_exact_for_every_integer_value(spelling, rng):
    """``Where(m == 0, ...)`` looks at nothing but whether an entry is zero, as the rebuilt ``Cast(m, bool)``
    does: the fused model matches for any int64 values, not only 0 and 1, and the report states no precondition."""
    model = _model(spelling)
    result = _fuse(model)
    (block,) = result.report.fused
    assert "mask_values" not in block.details
    masks = rng.integers(-3, 4, size=(6, 5))
    masks[3] = 0
    _assert_matches(model, result.model, _feeds(model, masks, T.FLOAT, rng), T.FLOAT)


def test_the_bias_as_it_is_comes_first_where_it_is_finite():
    """``(1 - m) · -10000`` of an int64 mask in float32 is finite for every value: fed as it is, exact with no
    precondition (the form that reads it off its values comes after)."""
    (block,) = _fuse(_model(_minus_10000, T.FLOAT)).report.fused
    assert block.details["mask"] == "additive bias" and "mask_values" not in block.details


def _query_mask(b: _Bias) -> str:
    """mask[:, None, :, None]: the rows' padding, not the keys'."""
    m = b.node("Unsqueeze", ["attention_mask", b.const("row_axes", [1, 3], T.INT64)], "mask_rows")
    return b.node("Where", [b.node("Equal", [m, b.const("zero_i", 0, T.INT64)], "dropped"), b.const("fill", -math.inf),
                            b.const("kept", 0.0)], "padding_bias")


def _positive_fill(b: _Bias) -> str:
    dropped = b.node("Equal", [b.keys_4d(), b.const("zero_i", 0, T.INT64)], "dropped")
    return b.node("Where", [dropped, b.const("fill", math.inf), b.const("kept", 0.0)], "padding_bias")


def _kept_not_zero(b: _Bias) -> str:
    dropped = b.node("Equal", [b.keys_4d(), b.const("zero_i", 0, T.INT64)], "dropped")
    return b.node("Where", [dropped, b.const("fill", -math.inf), b.const("kept", 1.0)], "padding_bias")


def _inverted(b: _Bias) -> str:
    """Keeps the keys where the mask is 0."""
    dropped = b.node("Equal", [b.keys_4d(), b.const("zero_i", 0, T.INT64)], "dropped")
    return b.node("Where", [dropped, b.const("kept", 0.0), b.const("fill", -math.inf)], "padding_bias")


def _two_inputs(b: _Bias) -> str:
    """The kept value read from a second graph input."""
    dropped = b.node("Equal", [b.keys_4d(), b.const("zero_i", 0, T.INT64)], "dropped")
    return b.node("Where", [dropped, b.const("fill", -math.inf), "other_bias"], "padding_bias")


def _mixes_keys(b: _Bias) -> str:
    """Keys kept by the number of kept keys (a ReduceSum over the key axis)."""
    counted = b.node("ReduceSum", [b.keys_4d(), b.const("key_axis", [3], T.INT64)], "kept_keys")
    dropped = b.node("Equal", [counted, b.const("zero_i", 0, T.INT64)], "dropped")
    return b.node("Where", [dropped, b.const("fill", -math.inf), b.const("kept", 0.0)], "padding_bias")


def _multiplied(b: _Bias) -> str:
    """The mask's keys summed by a MatMul with a constant [T, T] (each key's bias from every key's mask)."""
    m = b.node("Cast", [b.keys_4d()], "mask_float", to=b.dtype)
    mixed = b.node("MatMul", [m, b.const("key_weights", np.ones((5, 5)))], "mask_mixed")
    dropped = b.node("Equal", [mixed, b.const("zero_f", 0.0)], "dropped")
    return b.node("Where", [dropped, b.const("fill", -math.inf), b.const("kept", 0.0)], "padding_bias")


def _gathered(b: _Bias) -> str:
    """The mask's keys permuted by indices computed at run time (a Gather with data indices)."""
    order = b.node("Cast", [b.node("Abs", ["x_order"], "order_abs")], "order", to=T.INT64)
    m = b.node("Gather", ["attention_mask", order], "mask_permuted", axis=1)
    dropped = b.node("Equal", [b.keys_4d(m), b.const("zero_i", 0, T.INT64)], "dropped")
    return b.node("Where", [dropped, b.const("fill", -math.inf), b.const("kept", 0.0)], "padding_bias")


def _two_fills(b: _Bias) -> str:
    """Causal ``-inf`` plus padding ``finfo.min``: dropped keys get ``-inf`` or ``finfo.min``."""
    causal = b.node("Where", [b.causal_keep(), b.const("kept", 0.0), b.const("fill", -math.inf)], "causal_bias")
    padded = b.node("Equal", [b.keys_4d(), b.const("zero_i", 0, T.INT64)], "padded")
    padding = b.node("Where", [padded, b.const("padded_fill", F32_MIN), b.const("zero", 0.0)], "padding_part")
    return b.node("Add", [causal, padding], "padding_bias")


# Not a function of the mask alone (a second input, ops that mix keys): not read off its values, so the reason is
# the Where form's and the bias's own (infinite, or of other dimensions), with nothing of this form's after it.
NOT_READ = "the mask is a Where whose kept value is not 0 or whose fill is not a negative constant; as attention_bias"
REFUSED = [
    (_query_mask, "reads 'attention_mask' axis 1 along the scores' query axis: not a padding mask"),
    (_positive_fill, "is 0 where the mask keeps a key and inf where it masks one: not 0 on a kept key"),
    (_kept_not_zero, "is 1 where the mask keeps a key and -inf where it masks one"),
    (_inverted, "keeps keys where the mask is 0 (an inverted mask)"),
    (_two_inputs, NOT_READ),
    (_mixes_keys, NOT_READ),
    (_multiplied, NOT_READ),
    (_gathered, NOT_READ),
    (_two_fills, "dropped keys get different fills"),
]


@pytest.mark.parametrize("spelling,reason", REFUSED, ids=[s.__name__ for s, _ in REFUSED])
def test_masks_not_proved_padding_stay_bit_identical(spelling, reason):
    model = _model(spelling)
    extra = {"_two_inputs": ("other_bias", [1, 1, 1, "seq"]), "_gathered": ("x_order", ["seq"])}.get(spelling.__name__)
    if extra:
        model.graph.input.append(helper.make_tensor_value_info(extra[0], T.FLOAT, extra[1]))
    result = _fuse(model)
    assert result.report.fused == []
    (refused,) = result.report.refused
    assert refused.rule == "attention" and reason in refused.reason, refused.reason
    if reason == NOT_READ:
        assert "the bias computed from" not in refused.reason
    assert result.model.SerializeToString() == model.SerializeToString()


# --- the scalar semantics ---------------------------------------------------------------------------------
def _v(value, dtype):
    return scalar_ops.typed(value, dtype)


def test_fills_are_computed_in_the_graphs_type():
    one_minus_zero = scalar_ops.apply("Sub", [_v(1.0, T.FLOAT16), _v(0.0, T.FLOAT16)])
    assert scalar_ops.apply("Mul", [one_minus_zero, _v(F16_MIN, T.FLOAT16)]) == np.float16(F16_MIN)
    # finfo(float32).min cast to float16 overflows to -inf; (1 - 1) · min is -0.0
    assert scalar_ops.cast(_v(F32_MIN, T.FLOAT), T.FLOAT16) == -np.inf
    one_minus_one = scalar_ops.apply("Sub", [_v(1.0, T.FLOAT), _v(1.0, T.FLOAT)])
    kept = scalar_ops.apply("Mul", [one_minus_one, _v(F32_MIN, T.FLOAT)])
    assert kept == 0 and np.signbit(kept)
    # float16 arithmetic rounds in float16: 2049 is not a float16 (2048 + 1 rounds to even)
    assert scalar_ops.apply("Add", [_v(2048.0, T.FLOAT16), _v(1.0, T.FLOAT16)]) == np.float16(2048.0)


def test_casts_follow_onnx():
    assert scalar_ops.cast(_v(np.nan, T.FLOAT), T.BOOL) and not scalar_ops.cast(_v(-0.0, T.FLOAT), T.BOOL)
    assert scalar_ops.cast(_v(-2.7, T.FLOAT), T.INT64) == -2  # truncated toward zero
    for undefined in (np.nan, np.inf, 1e30):
        with pytest.raises(scalar_ops.Undefined):
            scalar_ops.cast(_v(undefined, T.FLOAT), T.INT32)
    assert scalar_ops.apply("Div", [_v(-7, T.INT64), _v(2, T.INT64)]) == -3
    with pytest.raises(scalar_ops.Undefined):
        scalar_ops.apply("Div", [_v(1, T.INT64), _v(0, T.INT64)])


def test_an_element_known_only_as_zero_or_not_goes_through_zero_tests_only():
    for nonzero in (False, True):
        m = scalar_ops.ZeroTest(nonzero, T.INT64)
        assert bool(scalar_ops.cast(m, T.BOOL)) == nonzero
        assert bool(scalar_ops.apply("Equal", [m, _v(0, T.INT64)])) == (not nonzero)
        assert scalar_ops.cast(m, T.FLOAT16) == scalar_ops.ZeroTest(nonzero, T.FLOAT16)  # integers stay nonzero
        with pytest.raises(scalar_ops.NeedsValue):
            scalar_ops.cast(m, T.INT8)  # 256 wraps to 0
        with pytest.raises(scalar_ops.NeedsValue):
            scalar_ops.apply("Sub", [_v(1, T.INT64), m])
        with pytest.raises(scalar_ops.NeedsValue):
            scalar_ops.apply("Equal", [m, _v(1, T.INT64)])
    with pytest.raises(scalar_ops.NeedsValue):
        scalar_ops.cast(scalar_ops.ZeroTest(True, T.FLOAT), T.FLOAT16)  # 1e-10 underflows to 0
