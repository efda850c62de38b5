"""Embedding lookups, their sum and its LayerNormalization as one SkipLayerNormalization
(patterns/embedding_norm.py): the committed exports against the original on ORT's CPU provider (float32 and
float16, random tokens and padding), the forms the rule takes, the shapes it must show, and the forms it
must leave bit-identical."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from onnxfuse.fuse import fuse_model
from onnxfuse.patterns import EmbeddingsIntoSkipNorm, default_rules

MODELS = Path(__file__).parent / "models"
RULE = "embeddings-into-skip-norm"
VOCAB, TYPES, POSITIONS, HIDDEN = 50, 2, 16, 8


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _fused(model: onnx.ModelProto, base_dir=None):
    result = fuse_model(model, rules=(EmbeddingsIntoSkipNorm(),), base_dir=base_dir)  # no op library needed
    return result, [b for b in result.report.fused if b.rule == RULE]


def _close(want, got, dtype) -> None:
    tol = 4e-3 if dtype == np.float16 else 2e-6
    for w, g in zip(want, got):
        w, g = w.astype(np.float64), g.astype(np.float64)
        assert w.shape == g.shape
        assert np.max(np.abs(w - g)) <= tol * max(1.0, np.max(np.abs(w)))


# --- the committed exports -----------------------------------------------------------------------------

# Every committed export where the rule applies: (lookups in the sum, whether the token types are one row, whether
# the sum is read elsewhere too: the residual stream of pre-norm GPT-2 and CLIP).
BERT, GPT2 = (3, True, False), (2, False, True)
BERT_STATIC = (("Gather", "Gather", "Constant"), True, False)  # the position lookup folded into a constant
EXPECTED = {
    "bert_torchscript_op14_ortopt.onnx": BERT, "bert_torchscript_op14_ortopt_nobiasgelu.onnx": BERT,
    "bert_torchscript_op14_ortfp16.onnx": BERT, "bert_torchscript_op17.onnx": BERT,
    "bert_torchscript_op20.onnx": BERT, "bert_freshinit_torchscript_op17.onnx": BERT,
    "bert_freshinit_torchscript_op17_gsunshaped.onnx": BERT,
    "bert_dynamo_op18.onnx": BERT, "bert_dynamo_op18_static.onnx": BERT_STATIC, "bert_dynamo_op18_ortopt.onnx": BERT,
    "bert_dynamo_op18_ortfp16.onnx": BERT, "bert_dynamo_op23.onnx": BERT,
    "distilbert_freshinit_torchscript_op17.onnx": (2, False, False),
    "mixed_precision/bert_torchscript_op14_ortfp16_keepbiasgelu.onnx": BERT,
    "gpt2_dynamo_op18.onnx": GPT2, "gpt2_torchscript_op14_ortopt.onnx": GPT2,
    "gpt2_torchscript_op14_ortfp16.onnx": GPT2, "mixed_precision/gpt2_torchscript_op14_ortfp16_keepfastgelu.onnx": GPT2,
    "clip_text_dynamo_op18.onnx": GPT2, "clip_text_freshinit_torchscript_op17.onnx": GPT2,
    "clip_text_torchscript_op16_ortopt.onnx": GPT2, "clip_text_torchscript_op16_ortfp16.onnx": GPT2,
    # GPT-Neo: the sum is also read by a Shape for the mask, placed before the LayerNorm in the node list
    "gpt_neo_torchscript_op17.onnx": GPT2, "gpt_neo_dynamo_op18.onnx": GPT2,
}
# (The raw opset-14/16 TorchScript exports write LayerNorm as ReduceMean/Sub/Pow/Sqrt/Div: no LayerNormalization.)
TOKEN_TABLES = ("word_embeddings", "wte", "token_embedding")


@pytest.mark.parametrize("file", sorted(str(p.relative_to(MODELS)) for p in MODELS.rglob("*.onnx")
                                         if p.relative_to(MODELS).parts[0] != "legacy"))  # (its own tests)
def test_committed_exports(file):
    model = onnx.load(MODELS / file, load_external_data=False)
    result, blocks = _fused(model, base_dir=MODELS)
    want = EXPECTED.get(file)
    assert len(blocks) == (want is not None)
    assert [r for r in result.report.refused if r.rule == RULE] == []
    if want is not None:
        lookups, row, sum_read = want
        summands = ("Gather",) * lookups if isinstance(lookups, int) else lookups
        assert blocks[0].form == "+".join(summands) + "+LayerNormalization"
        assert (blocks[0].details["bias_row"] is not None) == row
        assert blocks[0].details["sum_read"] == sum_read


@pytest.mark.parametrize("file", sorted(f for f in EXPECTED if "gsunshaped" not in f))
def test_committed_exports_match_the_original(file, rng):
    model = onnx.load(MODELS / file)
    result, blocks = _fused(model, base_dir=MODELS)
    assert len(blocks) == 1
    ops = Counter(n.op_type for n in result.model.graph.node)
    assert ops["LayerNormalization"] == Counter(n.op_type for n in model.graph.node)["LayerNormalization"] - 1
    ref, new = _session(model), _session(result.model)
    vocab = min(t.dims[0] for t in model.graph.initializer if any(k in t.name for k in TOKEN_TABLES))
    fixed = ref.get_inputs()[0].shape  # a static export takes its one shape only
    for batch, seq in [tuple(fixed)] if all(isinstance(d, int) for d in fixed) else ((3, 11), (1, 1), (2, 16)):
        mask = np.ones((batch, seq), np.int64)
        for b in range(batch):  # a different padded length per row, one row all padding
            mask[b, int(rng.integers(0, seq + 1)) if b else seq:] = 0
        feeds = {"input_ids": rng.integers(0, vocab, (batch, seq)).astype(np.int64), "attention_mask": mask}
        feeds = {i.name: feeds[i.name] for i in ref.get_inputs()}
        # (the float16 ones convert their float32 output back: judged by the type they compute in)
        _close(ref.run(None, feeds), new.run(None, feeds), np.float16 if "fp16" in file else np.float32)


def test_bert_after_orts_optimizer_leaves_no_embedding_add_and_no_token_type_lookup():
    model = onnx.load(MODELS / "bert_torchscript_op14_ortfp16.onnx")
    result, blocks = _fused(model, base_dir=MODELS)
    before, after = (Counter(n.op_type for n in m.graph.node) for m in (model, result.model))
    assert after["SkipLayerNormalization"] == before["SkipLayerNormalization"] + 1
    assert after["LayerNormalization"] == before["LayerNormalization"] - 1 == 0
    assert after["GatherElements"] == before["GatherElements"] - 1 == 0  # the token types' index chain is gone
    norm = next(n for n in result.model.graph.node if n.op_type == "SkipLayerNormalization"
                and n.input[0] == blocks[0].details["input"])
    assert "word_embeddings" in norm.input[0] and "position_embeddings" in norm.input[1]
    gather = next(n for n in result.model.graph.node if norm.input[4] in n.output)  # the bias: one table row
    assert gather.op_type == "Gather" and "token_type_embeddings" in gather.input[0]
    assert numpy_helper.to_array(next(t for t in result.model.graph.initializer if t.name == gather.input[1])) == 0


def test_runs_before_the_bias_move_and_after_attention():
    names = [type(r).__name__ for r in default_rules()]
    assert names.index("Attention") < names.index("EmbeddingsIntoSkipNorm") == names.index("GemmBiasIntoSkipNorm") - 1


# --- forms ---------------------------------------------------------------------------------------------


def _model(dtype=T.FLOAT, token_types="buffer", type_value=0, order="word_type_pos", axis=-1, stash_type=1,
           mean_read=False, sum_read=False, partial_read=False, extra_term=False, positions="buffer",
           rng=None) -> onnx.ModelProto:
    """A BERT-style embedding block: word[ids] + type[types] + position[0:S], then LayerNormalization.

    ``token_types``: "buffer" (a constant of ``type_value``s sliced to S and expanded to the batch, as today's
    exports write it), "input" (a graph input), "mixed" (a constant buffer of both values), "none".
    ``positions``: "buffer" (Slice [0:S] of a constant arange, from Shape(ids)), "input" (its own input)."""
    rng = rng or np.random.default_rng(0)
    npdt = helper.tensor_dtype_to_np_dtype(dtype)
    inits = [numpy_helper.from_array(rng.standard_normal((VOCAB, HIDDEN)).astype(npdt), "word"),
             numpy_helper.from_array(rng.standard_normal((TYPES, HIDDEN)).astype(npdt), "type"),
             numpy_helper.from_array(rng.standard_normal((POSITIONS, HIDDEN)).astype(npdt), "pos"),
             numpy_helper.from_array((1 + 0.1 * rng.standard_normal(HIDDEN)).astype(npdt), "gamma"),
             numpy_helper.from_array((0.1 * rng.standard_normal(HIDDEN)).astype(npdt), "beta"),
             numpy_helper.from_array(np.arange(POSITIONS, dtype=np.int64)[None], "position_buffer"),
             numpy_helper.from_array(np.full((1, POSITIONS), type_value, np.int64), "type_buffer"),
             numpy_helper.from_array(np.array([0, 1] * (POSITIONS // 2), np.int64)[None], "mixed_buffer"),
             numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([1], np.int64), "one"),
             numpy_helper.from_array(np.array(1, np.int64), "one_scalar"),
             numpy_helper.from_array(rng.standard_normal((1, 1, HIDDEN)).astype(npdt), "offset")]
    inputs = [helper.make_tensor_value_info("input_ids", T.INT64, ["batch", "sequence"])]
    nodes = [helper.make_node("Shape", ["input_ids"], ["ids_shape"]),
             helper.make_node("Gather", ["ids_shape", "one_scalar"], ["seq_len"], axis=0),
             helper.make_node("Unsqueeze", ["seq_len", "zero"], ["seq_end"])]
    if positions == "buffer":
        nodes.append(helper.make_node("Slice", ["position_buffer", "zero", "seq_end", "one"], ["position_ids"]))
    else:
        inputs.append(helper.make_tensor_value_info("position_ids", T.INT64, ["pb", "ps"]))
    nodes += [helper.make_node("Gather", ["word", "input_ids"], ["w"], name="word_lookup"),
              helper.make_node("Gather", ["pos", "position_ids"], ["p"], name="position_lookup")]
    terms = {"word": "w", "pos": "p"}
    if token_types in ("buffer", "mixed"):
        buffer = "type_buffer" if token_types == "buffer" else "mixed_buffer"
        nodes += [helper.make_node("GatherElements", [buffer, "position_ids"], ["types_1s"], axis=1),
                  helper.make_node("Expand", ["types_1s", "ids_shape"], ["token_type_ids"])]
    elif token_types == "input":
        inputs.append(helper.make_tensor_value_info("token_type_ids", T.INT64, ["batch", "sequence"]))
    if token_types != "none":
        nodes.append(helper.make_node("Gather", ["type", "token_type_ids"], ["t"], name="type_lookup"))
        terms["type"] = "t"
    if extra_term:
        terms["offset"] = "offset"
    names = [terms[k] for k in order.split("_") if k in terms] + (["offset"] if extra_term else [])
    total = names[0]
    for k, name in enumerate(names[1:]):
        nodes.append(helper.make_node("Add", [total, name] if k % 2 == 0 else [name, total], [f"sum{k}"], name=f"add{k}"))
        total = f"sum{k}"
    outputs = ["y", "mean"] if mean_read else ["y"]
    nodes.append(helper.make_node("LayerNormalization", [total, "gamma", "beta"], outputs, name="norm", axis=axis,
                                  epsilon=1e-12, stash_type=stash_type))
    graph_outputs = [helper.make_tensor_value_info("y", dtype, None)]
    if mean_read:
        graph_outputs.append(helper.make_tensor_value_info("mean", T.FLOAT, None))
    if sum_read:  # the residual stream of a pre-norm model
        graph_outputs.append(helper.make_tensor_value_info(total, dtype, None))
    if partial_read:
        graph_outputs.append(helper.make_tensor_value_info("sum0", dtype, None))
    graph = helper.make_graph(nodes, "embeddings", inputs, graph_outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _feeds(model, rng, batch=3, seq=5) -> dict:
    feeds = {"input_ids": rng.integers(0, VOCAB, (batch, seq)).astype(np.int64),
             "token_type_ids": rng.integers(0, TYPES, (batch, seq)).astype(np.int64),
             "position_ids": np.arange(seq, dtype=np.int64)[None]}
    return {i.name: feeds[i.name] for i in model.graph.input}


FORMS = [
    ({}, 3, 0),
    ({"type_value": 1}, 3, 1),
    ({"order": "pos_type_word"}, 3, 0),
    ({"order": "type_word_pos"}, 3, 0),
    ({"token_types": "none"}, 2, None),
    ({"token_types": "input"}, 3, None),  # the Add of word and type stays: the input
    ({"token_types": "mixed"}, 3, None),
    ({"dtype": T.FLOAT16}, 3, 0),
    ({"dtype": T.FLOAT16, "token_types": "input"}, 3, None),
    ({"axis": 2}, 3, 0),
    ({"sum_read": True}, 3, 0),  # the normalization's sum output gives it
    ({"sum_read": True, "token_types": "none", "dtype": T.FLOAT16}, 2, None),
]


@pytest.mark.parametrize("form,lookups,row", FORMS, ids=lambda f: str(f) if not isinstance(f, dict) else
                         (",".join(f"{k}={v}" for k, v in f.items()) or "default"))
def test_forms_fuse_and_match_the_original(form, lookups, row, rng):
    model = _model(rng=rng, **form)
    result, blocks = _fused(model)
    assert len(blocks) == 1
    assert blocks[0].form == "+".join(["Gather"] * lookups) + "+LayerNormalization"
    assert blocks[0].details["bias_row"] == (None if row is None else f"type[{row}]")
    assert blocks[0].details["sum_read"] == form.get("sum_read", False)
    ops = Counter(n.op_type for n in result.model.graph.node)
    assert ops["LayerNormalization"] == 0 and ops["SkipLayerNormalization"] == 1
    assert ops["Add"] == (1 if form.get("token_types") in ("input", "mixed") else 0)
    assert ops["GatherElements"] == (1 if form.get("token_types") == "mixed" else 0)
    ref, new = _session(model), _session(result.model)
    for batch, seq in ((3, 5), (1, 1), (2, POSITIONS)):
        feeds = _feeds(model, rng, batch, seq)
        want = ref.run(None, feeds)
        _close(want, new.run(None, feeds), want[0].dtype)


def test_sequence_longer_than_the_position_buffer_fails_in_both(rng):
    # The proof takes the position rows Slice [0:S] as S: true in every run the original completes.
    model = _model(rng=rng)
    result, blocks = _fused(model)
    assert len(blocks) == 1
    feeds = _feeds(model, rng, 2, POSITIONS + 3)
    for m in (model, result.model):
        with pytest.raises(Exception):
            _session(m).run(None, feeds)


NEGATIVES = [
    ({"axis": 1}, "normalizes another axis"),
    ({"stash_type": 0}, "normalizes in the tensor's type"),
    ({"mean_read": True}, "its mean is read"),
    ({"partial_read": True}, "a partial sum is read elsewhere"),
    ({"extra_term": True}, "a summand that is no lookup"),
]


@pytest.mark.parametrize("form,why", NEGATIVES, ids=[w for _, w in NEGATIVES])
def test_other_forms_stay_bit_identical(form, why, rng):
    model = _model(rng=rng, **form)
    result, blocks = _fused(model)
    assert blocks == [], why
    assert result.model.graph.node == model.graph.node
    if form.get("stash_type") != 0:
        feeds = _feeds(model, rng)
        for w, g in zip(_session(model).run(None, feeds), _session(result.model).run(None, feeds)):
            assert np.array_equal(w, g)


def test_positions_of_another_shape_are_refused_with_the_reason(rng):
    # position ids of their own input: [pb, ps] rows, not shown to be the tokens' [batch, sequence]
    model = _model(rng=rng, positions="input")
    result, blocks = _fused(model)
    assert blocks == []
    refusals = [r for r in result.report.refused if r.rule == RULE]
    assert len(refusals) == 1 and "not shown to fit" in refusals[0].reason and "pb" in refusals[0].reason
    assert result.model.graph.node == model.graph.node


def test_only_this_rule_takes_a_sliced_buffer_as_the_tokens_length(rng):
    # min(n, S) is S only where the sum must broadcast against the tokens' S: the shared evaluator (the
    # attention rule's proofs) keeps it unknown.
    from onnxfuse.patterns.embedding_norm import _ShapesOfRuns
    from onnxfuse.patterns.graph import GraphView
    from onnxfuse.patterns.symbolic import Dim, Evaluator

    view = GraphView(_model(rng=rng).graph)
    assert Evaluator(view).shapes()["p"][1] != Dim(1, ("sequence",))
    assert _ShapesOfRuns(view).shapes()["p"] == (Dim(1), Dim(1, ("sequence",)), Dim(HIDDEN))
    assert _ShapesOfRuns(view).shapes()["t"] == (Dim(1, ("batch",)), Dim(1, ("sequence",)), Dim(HIDDEN))


# --- position rows folded into a constant (torch's dynamo exporter with static shapes) -------------------------


def _static_model(batch=2, seq=6, dtype=T.FLOAT, token_types=True, rows_shape="3d", second_constant=False,
                  rng=None) -> onnx.ModelProto:
    """word[ids] (+ type[0] for every token) + the position rows as a constant, then LayerNormalization; the
    tokens of a fixed [batch, seq], as torch's dynamo exporter writes a model exported without dynamic shapes.
    ``rows_shape``: "3d" [1, seq, D], "2d" [seq, D], "long" [1, seq + 1, D] (another length), "batched" [2, seq, D]."""
    rng = rng or np.random.default_rng(0)
    npdt = helper.tensor_dtype_to_np_dtype(dtype)
    pos = rng.standard_normal((POSITIONS, HIDDEN)).astype(npdt)
    rows = {"3d": pos[None, :seq], "2d": pos[:seq], "long": pos[None, :seq + 1],
            "batched": np.stack([pos[:seq]] * 2)}[rows_shape]
    inits = [numpy_helper.from_array(rng.standard_normal((VOCAB, HIDDEN)).astype(npdt), "word"),
             numpy_helper.from_array(rng.standard_normal((TYPES, HIDDEN)).astype(npdt), "type"),
             numpy_helper.from_array(np.ascontiguousarray(rows), "position_rows"),
             numpy_helper.from_array(np.zeros((batch, seq), np.int64), "token_type_ids"),
             numpy_helper.from_array((1 + 0.1 * rng.standard_normal(HIDDEN)).astype(npdt), "gamma"),
             numpy_helper.from_array((0.1 * rng.standard_normal(HIDDEN)).astype(npdt), "beta"),
             numpy_helper.from_array(rng.standard_normal((1, seq, HIDDEN)).astype(npdt), "more_rows")]
    nodes = [helper.make_node("Gather", ["word", "input_ids"], ["w"], name="word_lookup")]
    total = "w"
    if token_types:
        nodes += [helper.make_node("Gather", ["type", "token_type_ids"], ["t"], name="type_lookup"),
                  helper.make_node("Add", ["w", "t"], ["wt"], name="add_type")]
        total = "wt"
    nodes.append(helper.make_node("Add", [total, "position_rows"], ["sum"], name="add_positions"))
    total = "sum"
    if second_constant:
        nodes.append(helper.make_node("Add", [total, "more_rows"], ["sum2"], name="add_more"))
        total = "sum2"
    nodes.append(helper.make_node("LayerNormalization", [total, "gamma", "beta"], ["y"], name="norm", axis=-1,
                                  epsilon=1e-12))
    graph = helper.make_graph(nodes, "embeddings", [helper.make_tensor_value_info("input_ids", T.INT64, [batch, seq])],
                              [helper.make_tensor_value_info("y", dtype, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("rows_shape", ["3d", "2d"])
@pytest.mark.parametrize("token_types", [True, False], ids=["types", "notypes"])
@pytest.mark.parametrize("dtype", [T.FLOAT, T.FLOAT16], ids=["fp32", "fp16"])
def test_folded_position_rows_are_the_skip(dtype, token_types, rows_shape, batch, rng):
    model = _static_model(batch=batch, dtype=dtype, token_types=token_types, rows_shape=rows_shape, rng=rng)
    result, blocks = _fused(model)
    assert len(blocks) == 1
    assert blocks[0].form == ("Gather+Gather+Constant" if token_types else "Gather+Constant") + "+LayerNormalization"
    # the word lookup is the input even where the rows have its shape (a batch of one); the type row the bias
    assert (blocks[0].details["input"], blocks[0].details["skip"]) == ("w", "position_rows")
    assert blocks[0].details["bias_row"] == ("type[0]" if token_types else None)
    ops = Counter(n.op_type for n in result.model.graph.node)
    assert ops["LayerNormalization"] == ops["Add"] == 0 and ops["SkipLayerNormalization"] == 1
    feeds = {"input_ids": rng.integers(0, VOCAB, (batch, 6)).astype(np.int64)}
    want = _session(model).run(None, feeds)
    _close(want, _session(result.model).run(None, feeds), want[0].dtype)


def test_folded_rows_of_another_length_are_refused_with_the_reason(rng):
    model = _static_model(rows_shape="long", rng=rng)  # [1, 7, D] against 6 tokens: the original cannot run
    result, blocks = _fused(model)
    assert blocks == []
    refusals = [r for r in result.report.refused if r.rule == RULE]
    assert len(refusals) == 1
    assert "not shown to fit" in refusals[0].reason and "position_rows [1, 7, 8]" in refusals[0].reason
    assert result.model.graph.node == model.graph.node


@pytest.mark.parametrize("form,why", [({"rows_shape": "batched"}, "a constant with a batch of its own"),
                                      ({"second_constant": True, "token_types": False}, "two constant summands")],
                         ids=lambda x: str(x))
def test_other_constant_summands_stay_bit_identical(form, why, rng):
    model = _static_model(rng=rng, **form)
    result, blocks = _fused(model)
    assert blocks == [] and not [r for r in result.report.refused if r.rule == RULE], why
    assert result.model.graph.node == model.graph.node
    feeds = {"input_ids": rng.integers(0, VOCAB, (2, 6)).astype(np.int64)}
    for w, g in zip(_session(model).run(None, feeds), _session(result.model).run(None, feeds)):
        assert np.array_equal(w, g)
