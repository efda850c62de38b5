"""The attention rule on heads the graph computes itself between the head split and the scores: rotary
position embeddings (GPT-NeoX's partial rotary of a fused query_key_value, LLaMA's full rotary of
separate projections, grouped key/value heads repeated to the query's count).

Nothing about the rotary arithmetic is proved or rewritten: it stays in the graph, and
MultiHeadAttention reads its results — the query merged back into [B, S, N·H] in front of the op, the
key and value heads [B, N, L, H] as they are. What is proved is their dimensions (``symbolic``), and the
masks as for every attention. Outputs are compared with the unfused graph's on ORT's CPU kernels, fp32
and fp16, with a different padding in every batch row; the negatives (heads whose layout cannot be
shown, key and value heads of different sizes, a key split straight into Kᵀ, probabilities read
elsewhere) must stay bit-identical and say why.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from onnxfuse.patterns.attention import FLOAT32_MIN
from tests.test_patterns_attention import MHA, _fuse, _fused_node, _session, assert_same_outputs

D, N, H = 16, 2, 8
INT64_MAX = 2**63 - 1
PADDING = np.array([[1] * 6, [1, 1, 1, 1, 0, 0], [0, 0, 0, 1, 1, 1], [0] * 6, [0, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]])


def _rotary_attention(rotary: str = "partial", projections: str = "separate", key_form: str = "transpose",
                      mask: str = "causal+padding", fill: float = -math.inf, guard: bool = True, dtype=T.FLOAT,
                      kv_heads: int = N, present: bool = False, escape: bool = False, value_head_size: int = H,
                      position_batch: str = "batch", reshaped_query: bool = False, repeat: bool = True) -> onnx.ModelProto:
    """A decoder self-attention over x [batch, seq, D] whose query and key heads get a rotary embedding
    (cos/sin tables [B, 1, S, R] from ``position_ids``), as transformers writes it.

    ``rotary``: "partial" rotates the first R = H/2 features of each head and concatenates the rest back
    (NeoX's rotary_pct), "full" all of them (LLaMA). ``projections``: "separate" MatMuls (LLaMA: the value
    heads are a plain split) or "fused": one [D, 3D] projection split into [B, S, N, 3H] heads and sliced
    into q, k, v on the last axis (NeoX; every head is then computed). ``key_form``: Kᵀ as
    Transpose(K, 0132) (TorchScript), "dynamo"'s Reshape-Transpose-Reshape, or "split" (K split straight
    into Kᵀ, unrotated), or "folded": dynamo's reshapes as its optimizer leaves them in a static export —
    constant targets, repeat_kv's Reshape to [B, N, L, H] folded into the [B·N, L, H] one, which then reads
    the 5-D Expand ("folded_swapped": that one's target in the wrong order, [B·N, H, L]: not Kᵀ; both make
    the graph's shapes ints). ``kv_heads`` < N repeats the key/value heads (repeat_kv: Unsqueeze, Expand,
    Reshape; ``repeat=False`` leaves them for the product to broadcast). ``present`` returns the rotated key heads as a graph output (a cache); ``escape`` the
    probabilities. ``position_batch`` names position_ids' batch; ``reshaped_query`` reshapes the rotated
    query to a shape given at run time."""
    rng = np.random.default_rng(7)
    folded = key_form.startswith("folded")
    b_dim, s_dim = PADDING.shape if folded else ("batch", "seq")
    npdt = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    inits, nodes = [], []

    def const(name, value, dt=None):
        inits.append(numpy_helper.from_array(np.asarray(value, dtype=dt or npdt), name))
        return name

    def ints(name, value):
        return const(name, value, np.int64)

    def node(op, ins, out, **kw):
        nodes.append(helper.make_node(op, ins, [out], name=out, **kw))
        return out

    def linear(name, width):
        mm = node("MatMul", ["x", const(f"w{name}", rng.standard_normal((D, width)) / math.sqrt(D))], f"{name}_mm")
        return node("Add", [mm, const(f"b{name}", rng.standard_normal(width) * 0.2)], f"{name}_proj")

    def split(name, proj, heads, size):
        reshaped = node("Reshape", [proj, ints(f"{name}_shape", [0, 0, heads, size])], f"{name}_split")
        return node("Transpose", [reshaped], f"{name}_heads", perm=[0, 2, 1, 3])

    def last_axis(name, t, start, end):
        return node("Slice", [t, ints(f"{name}_start", [start]), ints(f"{name}_end", [end]), ints(f"{name}_axis", [3])],
                    name)

    if projections == "fused":  # NeoX: [B, S, N, 3H] heads, q/k/v sliced on the last axis
        fused = split("qkv", linear("qkv", 3 * D), N, 3 * H)
        qh, kh, vh = (last_axis(f"{p}_heads", fused, j * H, (j + 1) * H) for j, p in enumerate("qkv"))
    else:
        qh = split("q", linear("q", N * H), N, H)
        kh = split("k", linear("k", kv_heads * H), kv_heads, H)
        vh = split("v", linear("v", kv_heads * value_head_size), kv_heads, value_head_size)

    r = H // 2 if rotary == "partial" else H
    positions = node("Cast", ["position_ids"], "positions", to=dtype)
    freqs = node("Mul", [node("Unsqueeze", [positions, ints("pos_axes", [2])], "positions_3d"),
                         const("inv_freq", 1.0 / 10000 ** (np.arange(0, r, 2) / r))], "freqs")
    angles = node("Concat", [freqs, freqs], "angles", axis=-1)
    cos = node("Unsqueeze", [node("Cos", [angles], "cos_bsr"), ints("cos_axes", [1])], "cos")
    sin = node("Unsqueeze", [node("Sin", [angles], "sin_bsr"), ints("sin_axes", [1])], "sin")

    def rotate(p, t):
        rot = last_axis(f"{p}_rot", t, 0, r) if rotary == "partial" else t
        half = node("Concat", [node("Neg", [last_axis(f"{p}_x2", rot, r // 2, r)], f"{p}_neg_x2"),
                               last_axis(f"{p}_x1", rot, 0, r // 2)], f"{p}_rotated_half", axis=-1)
        out = node("Add", [node("Mul", [rot, cos], f"{p}_cos"), node("Mul", [half, sin], f"{p}_sin")], f"{p}_rope")
        if rotary == "partial":
            out = node("Concat", [out, last_axis(f"{p}_pass", t, r, INT64_MAX)], f"{p}_embedded", axis=-1)
        return out

    # [B, KV, L, h] → [B, KV, n_rep, L, h] → [B, N, L, h], shapes read from t (fold: the 5-D Expand, for Kᵀ)
    def repeat_kv(p, t, size, fold=False):
        if kv_heads == N or not repeat:
            return t
        if folded:  # constant shapes; the key's last Reshape is folded into Kᵀ's first
            expanded = node("Expand", [node("Unsqueeze", [t, ints(f"{p}_rep_axis", [2])], f"{p}_5d"),
                                       ints(f"{p}_expand_shape", [b_dim, kv_heads, N // kv_heads, s_dim, size])],
                            f"{p}_expanded")
            if fold:
                return expanded
            return node("Reshape", [expanded, ints(f"{p}_flat_shape", [b_dim, N, s_dim, size])], f"{p}_repeated")
        shape = node("Shape", [t], f"{p}_shape_of")
        b = node("Slice", [shape, ints(f"{p}_b0", [0]), ints(f"{p}_b1", [1])], f"{p}_batch")
        length = node("Slice", [shape, ints(f"{p}_l0", [2]), ints(f"{p}_l1", [3])], f"{p}_len")
        wide = node("Concat", [b, ints(f"{p}_kv", [kv_heads]), ints(f"{p}_rep", [N // kv_heads]), length,
                               ints(f"{p}_size", [size])], f"{p}_expand_shape", axis=0)
        flat = node("Concat", [b, ints(f"{p}_heads_n", [N]), length, ints(f"{p}_size2", [size])], f"{p}_flat_shape",
                    axis=0)
        expanded = node("Expand", [node("Unsqueeze", [t, ints(f"{p}_rep_axis", [2])], f"{p}_5d"), wide], f"{p}_expanded")
        return node("Reshape", [expanded, flat], f"{p}_repeated")

    q = rotate("q", qh)
    if reshaped_query:
        q = node("Reshape", [q, "query_shape"], "q_reshaped")
    half = const("sqrt_scale", H ** -0.25)
    if key_form == "split":
        kt = node("Transpose", [node("Reshape", [linear("kt", N * H), ints("kt_shape", [0, 0, N, H])], "kt_split")],
                  "k_t", perm=[0, 2, 3, 1])
        k = None
    else:
        k = repeat_kv("k", rotate("k", kh), H, fold=folded)
        if folded:  # Reshape(Transpose(Reshape(K, [B·N, L, H]), 021), [B, N, H, L]), constant targets
            merge = [b_dim * N, H, s_dim] if key_form == "folded_swapped" else [b_dim * N, s_dim, H]
            merged = node("Reshape", [k, ints("k_3d_shape", merge)], "k_3d")
            kt = node("Reshape", [node("Transpose", [merged], "k_3d_t", perm=[0, 2, 1]),
                                  ints("k_t_shape", [b_dim, N, H, s_dim])], "k_t")
        elif key_form == "dynamo":  # Reshape(Transpose(Reshape(K, [-1, L, H]), 021), [B, N, H, L]), from Shape(K)
            shape = node("Shape", [k], "kt_shape_of")
            dim = {a: node("Slice", [shape, ints(f"kd{a}_0", [a]), ints(f"kd{a}_1", [a + 1])], f"k_dim{a}") for a in range(4)}
            merged = node("Reshape", [k, node("Concat", [ints("minus_one", [-1]), dim[2], dim[3]], "k_3d_shape", axis=0)],
                          "k_3d")
            kt = node("Reshape", [node("Transpose", [merged], "k_3d_t", perm=[0, 2, 1]),
                                  node("Concat", [dim[0], dim[1], dim[3], dim[2]], "k_t_shape", axis=0)], "k_t")
        else:
            kt = node("Transpose", [k], "k_t", perm=[0, 1, 3, 2])
    scores = node("MatMul", [node("Mul", [q, half], "q_scaled"), node("Mul", [kt, half], "k_scaled")], "scores")
    keep = None
    if "padding" in mask:
        keep = node("Unsqueeze", [node("Cast", ["attention_mask"], "mask_bool", to=T.BOOL), ints("pad_axes", [1, 2])],
                    "keep_padding")
    if "causal" in mask:
        seq = node("Squeeze", [node("Shape", ["x"], "x_seq", start=1, end=2)], "seq")
        pos = node("Range", [ints("zero_i", 0), seq, ints("one_i", 1)], "key_positions")
        causal = node("LessOrEqual", [node("Unsqueeze", [pos, ints("k_axes", [0])], "k_idx"),
                                      node("Unsqueeze", [pos, ints("q_axes", [1])], "q_idx")], "keep_causal")
        keep = causal if keep is None else node("And", [keep, causal], "keep")
    if keep is not None:
        scores = node("Add", [scores, node("Where", [keep, const("zero", 0.0), const("fill", fill)], "mask_bias")],
                      "masked_scores")
    probs = node("Softmax", [scores], "probs", axis=-1)
    if guard:
        probs = node("Where", [node("IsNaN", [probs], "probs_nan"), const("guard_zero", 0.0), probs], "probs_guarded")
    context = node("MatMul", [probs, repeat_kv("v", vh, value_head_size)], "context")
    merged = node("Transpose", [context], "context_t", perm=[0, 2, 1, 3])
    node("Reshape", [merged, ints("merge_shape", [0, 0, -1])], "y")
    inputs = [helper.make_tensor_value_info("x", dtype, [b_dim, s_dim, D]),
              helper.make_tensor_value_info("position_ids", T.INT64, [b_dim if folded else position_batch, s_dim])]
    if "padding" in mask:
        inputs.append(helper.make_tensor_value_info("attention_mask", T.INT64, [b_dim, s_dim]))
    if reshaped_query:
        inputs.append(helper.make_tensor_value_info("query_shape", T.INT64, [4]))
    outputs = [helper.make_tensor_value_info("y", dtype, [b_dim, s_dim, N * value_head_size])]
    if present:
        outputs.append(helper.make_tensor_value_info(k, dtype, None))
    if escape:
        outputs.append(helper.make_tensor_value_info("probs", dtype, None))
    graph = helper.make_graph(nodes, "rotary_attention", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _feeds(model: onnx.ModelProto, dtype, rng, magnitude: float = 3.0) -> dict:
    npdt = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    batch, seq = PADDING.shape
    feeds = {"x": (rng.standard_normal((batch, seq, D)) * magnitude).astype(npdt),
             # positions as a left-padded batch has them (and any others: the tables' values are not read)
             "position_ids": np.maximum(np.cumsum(PADDING, axis=1) - 1, 0) + rng.integers(0, 50, (batch, 1)),
             "attention_mask": PADDING, "query_shape": np.array([batch, N, seq, H])}
    names = {i.name for i in model.graph.input}
    return {k: v for k, v in feeds.items() if k in names}


def _assert_matches(model, fused, dtype, rng, magnitude: float = 3.0):
    assert_same_outputs(model, fused, _feeds(model, dtype, rng, magnitude), dtype)


ACCEPTED = [
    {},  # LLaMA-like with NeoX's partial rotary: TorchScript's -inf causal+padding mask and its guard
    {"rotary": "full"},
    {"projections": "fused"},  # NeoX: every head sliced from one [B, N, S, 3H] split
    {"projections": "fused", "key_form": "dynamo", "fill": FLOAT32_MIN},  # NeoX, dynamo
    {"mask": "padding", "guard": False},
    {"mask": "causal"},  # no padding: MHA's own causal mode
    # a finite causal fill: an additive bias, expanded to the key heads' length (their axis 2)
    {"mask": "causal", "fill": -10000.0, "rotary": "full"},
    {"mask": "none", "guard": False},
    {"dtype": T.FLOAT16},
    {"dtype": T.FLOAT16, "fill": -65504.0, "projections": "fused"},  # after ORT's float16 converter
    {"kv_heads": 1},  # grouped key/value heads repeated to the query's count (repeat_kv)
    {"kv_heads": 1, "rotary": "full", "key_form": "dynamo"},
    # a static dynamo export: Kᵀ's first Reshape reads the repeated heads' 5-D Expand (repeat_kv's own
    # Reshape folded into it); MHA reads the heads as repeat_kv would have made them, reshaped in front of it
    {"kv_heads": 1, "rotary": "full", "key_form": "folded", "fill": FLOAT32_MIN},
    {"kv_heads": 1, "key_form": "folded", "mask": "causal"},
    {"key_form": "folded"},  # no repeat: the Reshape reads the heads themselves, which MHA reads as they are
    # one key/value head the graph's MatMuls broadcast onto the query's two (Falcon-7B's multi-query):
    # expanded to the query's count in front of MHA, which broadcasts no head
    {"kv_heads": 1, "repeat": False},
    {"kv_heads": 1, "repeat": False, "mask": "padding", "guard": False},
    {"present": True},  # the rotated key heads also returned (a cache): computed in front of the op
]


@pytest.mark.parametrize("magnitude", [3.0, 300.0])
@pytest.mark.parametrize("form", ACCEPTED, ids=lambda f: "-".join(f"{k}={v}" for k, v in f.items()) or "default")
def test_rotary_heads_fuse_and_match(form, magnitude, rng):
    model = _rotary_attention(**form)
    result = _fuse(model)
    assert [b.rule for b in result.report.fused] == ["attention"], [r.reason for r in result.report.refused]
    (block,) = result.report.fused
    assert block.op == "com.microsoft.MultiHeadAttention" and block.details["qkv"] == "separate"
    assert block.details["query"] == "heads merged" and block.details["key_value"] == "heads"
    assert block.details["bias"] == "none" and block.details["num_heads"] == N
    mha = _fused_node(result.model)
    assert (mha.domain, mha.op_type) == MHA and (len(mha.input) < 4 or mha.input[3] == "")  # no bias: 4-D key
    # the rotary arithmetic stays; MHA reads its results: the query merged, the key and value heads as they are
    producers = {o: n for n in result.model.graph.node for o in n.output}
    merge = producers[mha.input[0]]
    assert merge.op_type == "Reshape" and producers[merge.input[0]].op_type == "Transpose"
    assert producers[merge.input[0]].input[0] in {"q_embedded", "q_rope"}
    if form.get("key_form") == "folded" and form.get("kv_heads", N) < N:  # the folded repeat_kv, made again
        b, s = PADDING.shape
        assert block.details["key_heads"] == f"reshaped to {[b, N, s, H]} in front of the op"
        assert producers[mha.input[1]].op_type == "Reshape" and producers[mha.input[1]].input[0] == "k_expanded"
        assert mha.input[2] == "v_repeated"
        assert not {"k_3d", "k_3d_t", "k_t"} & set(producers)
    elif form.get("repeat", True):
        assert mha.input[1] in {"k_embedded", "k_rope", "k_repeated"}
        assert mha.input[2] in {"v_heads", "v_repeated"}
    else:  # the one broadcast head, expanded to the query's
        assert block.details["broadcast_heads"] == f"one key/value head expanded to {N}"
        assert {producers[mha.input[j]].op_type for j in (1, 2)} == {"Expand"}
        assert producers[mha.input[1]].input[0] in {"k_embedded", "k_rope"}
        assert producers[mha.input[2]].input[0] == "v_heads"
    assert sum(n.op_type == "Cos" for n in result.model.graph.node) == 1
    assert not any(n.op_type == "Softmax" for n in result.model.graph.node)
    attrs = {a.name: helper.get_attribute_value(a) for a in mha.attribute}
    assert attrs.get("unidirectional", 0) == int(form.get("mask") == "causal" and form.get("fill", -math.inf) == -math.inf)
    assert attrs["scale"] == np.float32(float(np.array(H ** -0.25, onnx.helper.tensor_dtype_to_np_dtype(
        form.get("dtype", T.FLOAT)))) ** 2)
    if form.get("dtype") == T.FLOAT16:
        magnitude = 3.0  # (as in test_patterns_attention: fp16 scores of thousands flip near-ties)
    _assert_matches(model, result.model, form.get("dtype", T.FLOAT), rng, magnitude)


REFUSED = [
    # position_ids of another batch: the tables broadcast the heads' batch to one not shown to be x's
    ({"position_batch": "positions"}, "not shown"),
    ({"reshaped_query": True}, "not a known count"),
    # ORT's kernel takes [B, N, L, H] key and value of one shape only
    ({"value_head_size": 2 * H}, "not shown to be equal"),
    ({"key_form": "split"}, "split into heads straight as Kᵀ"),
    # the folded reshapes with the merge's target in the wrong order: [12, 8, 6] → transposed → [6, 2, 8, 6]
    # runs (same element count, H on the product's axis) but reads each head's [L, H] block as [H, L]
    ({"key_form": "folded_swapped", "kv_heads": 1}, "not shown to be Kᵀ"),
    ({"key_form": "folded_swapped"}, "not shown to be Kᵀ"),
    ({"escape": True}, "graph output"),
]


@pytest.mark.parametrize("form,reason", REFUSED, ids=[r for _, r in REFUSED])
def test_rotary_negatives_stay_bit_identical(form, reason):
    model = _rotary_attention(**form)
    result = _fuse(model)
    assert result.report.fused == []
    assert [r.rule for r in result.report.refused] == ["attention"]
    assert reason in result.report.refused[0].reason, result.report.refused[0].reason
    assert result.model.SerializeToString() == model.SerializeToString()


def test_an_unrotated_attention_keeps_its_packed_form():
    """Only heads the graph computes are read as heads: a plain split keeps the packed projection."""
    from tests.test_patterns_attention import _attention

    result = _fuse(_attention(mask="causal+padding"))
    (block,) = result.report.fused
    assert block.details["qkv"] == "packed" and "query" not in block.details


# --- what the rule relies on in ORT's kernel --------------------------------------------------------------
def _mha(q, k, v, bias=None, attention_bias=None):
    """ORT's CPU MultiHeadAttention (num_heads N, scale 0.3) on the given arrays."""
    feeds = {"q": q, "k": k, "v": v, "b": bias, "ab": attention_bias}
    names = [n if feeds[n] is not None else "" for n in ("q", "k", "v", "b")] + ["", "ab" if attention_bias is not None else ""]
    while not names[-1]:
        names.pop()
    feeds = {n: a for n, a in feeds.items() if a is not None}
    graph = helper.make_graph(
        [helper.make_node("MultiHeadAttention", names, ["y"], domain="com.microsoft", num_heads=N, scale=0.3)], "mha",
        [helper.make_tensor_value_info(n, T.FLOAT, list(a.shape)) for n, a in feeds.items()],
        [helper.make_tensor_value_info("y", T.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=9)
    return _session(model).run(None, feeds)[0]


def _reference(q4, k4, v4, attention_bias=0.0):
    s = 0.3 * q4 @ k4.transpose(0, 1, 3, 2) + attention_bias
    p = np.exp(s - s.max(-1, keepdims=True))
    o = (p / p.sum(-1, keepdims=True)) @ v4
    return o.transpose(0, 2, 1, 3).reshape(o.shape[0], o.shape[2], -1)


def test_ort_reads_4d_key_and_value_as_the_rule_relies_on(rng):
    """ORT 1.31's CPU MultiHeadAttention: a [B, S, N·H] query with [B, N, L, H] key and value is attention
    over those heads; key and value of different head sizes, or of another batch, are rejected (so the
    rule proves them equal); a bias with a 4-D key is added to the query alone (so none is given)."""
    b, s, length = 3, 5, 4
    q4, k4, v4 = (rng.standard_normal((b, N, n, H)).astype(np.float32) for n in (s, length, length))
    q = q4.transpose(0, 2, 1, 3).reshape(b, s, N * H)
    mask = rng.standard_normal((b, 1, s, length)).astype(np.float32)
    np.testing.assert_allclose(_mha(q, k4, v4, attention_bias=mask), _reference(q4, k4, v4, mask), rtol=1e-5, atol=1e-5)
    for k, v in ((k4, rng.standard_normal((b, N, length, 2 * H)).astype(np.float32)), (k4[:1], v4[:1])):
        with pytest.raises(Exception, match="shall have same"):
            _mha(q, k, v)
    bias = rng.standard_normal(3 * N * H).astype(np.float32)
    q4_biased = (q + bias[:N * H]).reshape(b, s, N, H).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(_mha(q, k4, v4, bias=bias), _reference(q4_biased, k4, v4), rtol=1e-5, atol=1e-5)
