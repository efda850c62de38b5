"""The attention's row guard folded into the SkipLayerNormalization behind the output projection
(patterns/guard_into_skip_norm.py): on the committed sdpa exports after ORT's optimizer (float32 and its float16
converter) every guard whose layer has that normalization folds and the outputs match the original on ORT's CPU
provider, with rows that see no key (left padding under the causal mask, a batch entry all padding); on
hand-built graphs the forms it takes match the guarded graph (NaN in the rows not kept included), and every form
it must not take stays bit-identical."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from onnxfuse.domain import DOMAIN, DOMAIN_VERSION, FILL_MASKED_ROWS, MASKED_SKIP_NORM
from onnxfuse.fuse import fuse_model
from onnxfuse.patterns import Attention, GemmBiasIntoSkipNorm, GuardIntoSkipNorm, default_rules
from onnxfuse.patterns.rule import after_rewrites
from onnxfuse.runtime import create_session
from tests.test_patterns_attention import ENTRIES, TOLERANCE, _feeds, _load, _session, assert_outputs_match

RULE = "guard-into-skip-norm"
SKIP_NORM = ("com.microsoft", "SkipLayerNormalization")

# The committed exports ORT's optimizer has seen: (guards the attention rule writes, guards that fold). CLIP's
# first layer adds its projection's bias and the residual itself (ORT's fusion left them): that guard stays.
AFTER_ORT = {
    "bert_torchscript_op14_ortopt.onnx": (2, 2),
    "bert_torchscript_op14_ortopt_nobiasgelu.onnx": (2, 2),
    "bert_torchscript_op14_ortfp16.onnx": (2, 2),
    "gpt2_torchscript_op14_ortopt.onnx": (2, 2),
    "gpt2_torchscript_op14_ortfp16.onnx": (2, 2),
    "clip_text_torchscript_op16_ortopt.onnx": (2, 1),
    "clip_text_torchscript_op16_ortfp16.onnx": (2, 1),
}


def _count(model: onnx.ModelProto, op_type: str, domain: str = DOMAIN) -> int:
    return sum(n.op_type == op_type and n.domain == domain for n in model.graph.node)


def test_runs_in_the_second_pass_of_the_default_rules():
    rules = default_rules()
    assert [type(r) for r in rules if after_rewrites(r)] == [GuardIntoSkipNorm]


@pytest.mark.parametrize("file", sorted(AFTER_ORT))
def test_guards_fold_in_exports_after_orts_optimizer_and_outputs_match(file, rng):
    guards, folded = AFTER_ORT[file]
    original = _load(file)
    # GPT-2's projection reaches its normalization as the flattened Gemm the Gemm-bias rule turns into a MatMul
    first_pass = (Attention(), GemmBiasIntoSkipNorm())
    unfolded = fuse_model(original, rules=first_pass).model
    assert _count(unfolded, FILL_MASKED_ROWS) == guards
    result = fuse_model(original, rules=(*first_pass, GuardIntoSkipNorm()))
    fused = result.model
    assert _count(fused, MASKED_SKIP_NORM) == folded == len([b for b in result.report.fused if b.rule == RULE])
    assert _count(fused, FILL_MASKED_ROWS) == guards - folded
    assert _count(fused, SKIP_NORM[1], SKIP_NORM[0]) == _count(unfolded, SKIP_NORM[1], SKIP_NORM[0]) - folded
    # the only change: each folded guard and its normalization became the masked one
    assert len(fused.graph.node) == len(unfolded.graph.node) - folded
    ref, new = _session(original), _session(fused)
    # batch entries 2 and 3 (left padding, all padding) have query rows that see no key: the rows the guard
    # zeroes, that the masked normalization takes as 0
    assert_outputs_match(ref, new, _feeds(file, ref, 6, 7, rng), TOLERANCE[ENTRIES[file]["dtype"]])


def test_raw_exports_have_no_normalization_to_fold_into():
    # Without ORT's fusions the residual Add and LayerNormalization are separate: the guard stays as it was.
    for file in ("bert_torchscript_op14.onnx", "gpt2_torchscript_op14.onnx"):
        result = fuse_model(_load(file))
        assert _count(result.model, FILL_MASKED_ROWS) == 2 and _count(result.model, MASKED_SKIP_NORM) == 0


# --- hand-built: FillMaskedRows(a, keep) -> MatMul(W) -> SkipLayerNormalization(., skip, gamma, beta, bias) ----
B, S, D, KEYS = 3, 4, 32, 6


def _graph(dtype=T.FLOAT, width=D, fill=0.0, weight=None, beta=True, bias=True, sum_output=True,
           norm="SkipLayerNormalization", product_as_skip=False, read_guard_twice=False,
           read_product_twice=False, mean_output=False, weight_input=False) -> onnx.ModelProto:
    npdt = helper.tensor_dtype_to_np_dtype(dtype)
    rng = np.random.default_rng(7)
    w = rng.standard_normal((width, width)) / np.sqrt(width) if weight is None else weight
    inits = [numpy_helper.from_array((1 + 0.1 * rng.standard_normal(width)).astype(npdt), "gamma"),
             numpy_helper.from_array((0.1 * rng.standard_normal(width)).astype(npdt), "beta"),
             numpy_helper.from_array((0.2 * rng.standard_normal(width)).astype(npdt), "bias")]
    inputs = [helper.make_tensor_value_info("a", dtype, [B, S, width]),
              helper.make_tensor_value_info("keep", T.BOOL, [B, 1, S, KEYS]),
              helper.make_tensor_value_info("skip", dtype, [B, S, width])]
    if weight_input:
        inputs.append(helper.make_tensor_value_info("w", dtype, [width, width]))
    else:
        inits.append(numpy_helper.from_array(w.astype(npdt), "w"))
    nodes = [helper.make_node(FILL_MASKED_ROWS, ["a", "keep"], ["guarded"], name="guard", domain=DOMAIN, fill=fill),
             helper.make_node("MatMul", ["guarded", "w"], ["proj"], name="proj")]
    pair = ["skip", "proj"] if product_as_skip else ["proj", "skip"]
    norm_inputs = pair + ["gamma"]
    if norm == "SkipLayerNormalization":
        norm_inputs += ["beta" if beta else ""]
    if bias:
        norm_inputs += ["bias"]
    norm_outputs = ["y", "mean" if mean_output else "", "", "sum" if sum_output else ""]
    nodes.append(helper.make_node(norm, norm_inputs, norm_outputs, name="norm", domain="com.microsoft",
                                  epsilon=1e-5))
    shapes = {"y": [B, S, width], "sum": [B, S, width], "mean": [B, S, 1]}
    outputs = [helper.make_tensor_value_info(o, dtype if o != "mean" else T.FLOAT, shapes[o])
               for o in ("y", "sum", "mean") if o in norm_outputs]
    if read_guard_twice:
        nodes.append(helper.make_node("Identity", ["guarded"], ["guarded_seen"], name="elsewhere"))
        outputs.append(helper.make_tensor_value_info("guarded_seen", dtype, [B, S, width]))
    if read_product_twice:
        nodes.append(helper.make_node("Identity", ["proj"], ["proj_seen"], name="elsewhere"))
        outputs.append(helper.make_tensor_value_info("proj_seen", dtype, [B, S, width]))
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    return helper.make_model(graph, ir_version=9, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1), helper.make_opsetid(DOMAIN, DOMAIN_VERSION)])


def _graph_feeds(model: onnx.ModelProto, rng) -> dict:
    dtype = model.graph.input[0].type.tensor_type.elem_type
    npdt = helper.tensor_dtype_to_np_dtype(dtype)
    width = model.graph.input[0].type.tensor_type.shape.dim[2].dim_value
    keep = rng.random((B, 1, S, KEYS)) > 0.5
    keep[0] = True
    keep[1, 0, :2] = False  # rows that see no key, in a batch entry that has others
    keep[2] = False  # a batch entry none of whose rows sees a key
    a = rng.standard_normal((B, S, width)).astype(npdt)
    a[~keep.any(axis=-1)[:, 0]] = np.nan  # what the attention leaves in such rows: never read past the guard
    feeds = {"a": a, "keep": keep, "skip": rng.standard_normal((B, S, width)).astype(npdt)}
    if any(i.name == "w" for i in model.graph.input):
        feeds["w"] = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(npdt)
    return feeds


FOLDED = [
    {},
    {"dtype": T.FLOAT16},
    {"dtype": T.BFLOAT16},
    {"sum_output": False},
    {"beta": False, "bias": False},
    {"dtype": T.FLOAT16, "width": 1536},  # 3 KiB rows: the widest the fold takes (MAX_ROW_BYTES)
    {"width": 768},  # and float32's widest
]


@pytest.mark.parametrize("form", FOLDED, ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()) or "default")
def test_hand_built_forms_fold_and_match_the_guarded_graph(form, rng):
    model = _graph(**form)
    result = fuse_model(model, rules=(GuardIntoSkipNorm(),))
    (block,) = result.report.fused
    assert block.rule == RULE and block.op == f"{DOMAIN}.{MASKED_SKIP_NORM}"
    ops = [(n.domain, n.op_type) for n in result.model.graph.node]
    assert ops == [("", "MatMul"), (DOMAIN, MASKED_SKIP_NORM)]
    matmul, masked = result.model.graph.node
    assert list(matmul.input) == ["a", "w"]
    assert list(masked.input[:3]) == [matmul.output[0], "skip", "keep"]
    assert list(masked.output) == ["y", "sum"][:1 + form.get("sum_output", True)]
    onnx.checker.check_model(result.model, full_check=True)
    dtype = form.get("dtype", T.FLOAT)
    if dtype == T.BFLOAT16:
        return  # numpy has no bfloat16 to feed; the op's bfloat16 kernels: test_op_masked_skip_layer_norm.py
    feeds = _graph_feeds(model, rng)
    want = create_session(model, providers="cpu", as_written=True).run(None, feeds)
    got = create_session(result.model, providers="cpu", as_written=True).run(None, feeds)
    tol = 4e-3 if dtype == T.FLOAT16 else 2e-5
    for w, g in zip(want, got, strict=True):
        w, g = w.astype(np.float64), g.astype(np.float64)
        assert np.isfinite(w).all() and np.isfinite(g).all()
        assert np.max(np.abs(w - g)) <= tol * max(1.0, np.max(np.abs(w)))


def _weight_with(value: float) -> np.ndarray:
    w = np.random.default_rng(1).standard_normal((D, D)) / np.sqrt(D)
    w[3, 5] = value
    return w


# A zero row times W is 0 only for a finite W; the masked op has no place for the normalization's training
# outputs, no RMS form, and rows wider than 3 KiB ran slower than the guard and ORT's normalization.
NOT_FOLDED = [
    ({"weight": _weight_with(np.inf)}, "W holds an infinity: a zero row times W is NaN there"),
    ({"weight": _weight_with(np.nan)}, "W holds a NaN"),
    ({"weight_input": True}, "W is not a constant"),
    ({"fill": 1.0}, "the guard fills 1, not 0"),
    ({"read_guard_twice": True}, "the guarded output is read elsewhere"),
    ({"read_product_twice": True}, "the projection is read elsewhere"),
    ({"mean_output": True}, "the normalization's mean is read"),
    ({"product_as_skip": True}, "the projection is the normalization's skip"),
    ({"norm": "SkipSimplifiedLayerNormalization"}, "RMS normalization"),
    ({"width": 6}, "rows that are not 16-byte vectors"),
    ({"dtype": T.FLOAT16, "width": 1544}, "rows over 3 KiB: where the masked kernel was not measured to pay"),
    ({"dtype": T.FLOAT16, "width": 4096}, "4 096-wide float16 rows: measured slower than the guard and ORT's norm"),
    ({"width": 776}, "float32 rows over 3 KiB"),
]


@pytest.mark.parametrize("form,why", NOT_FOLDED, ids=[w for _, w in NOT_FOLDED])
def test_hand_built_negatives_stay_bit_identical(form, why):
    model = _graph(**form)
    result = fuse_model(model, rules=(GuardIntoSkipNorm(),))
    assert result.report.fused == [], why
    assert result.model.SerializeToString() == model.SerializeToString(), why


@pytest.mark.parametrize("bad", [None, np.inf, np.nan], ids=["finite", "inf", "nan"])
def test_a_weight_in_external_data_is_read_to_prove_it_finite(tmp_path, bad):
    """torch's dynamo exporter stores every weight as external data: W is read from its file (once, a few MB
    at most: the rows the fold takes are at most 3 KiB) and judged as an inline W is."""
    model = _graph() if bad is None else _graph(weight=_weight_with(bad))
    onnx.save(model, tmp_path / "m.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="m.data", size_threshold=0)
    loaded = onnx.load(tmp_path / "m.onnx", load_external_data=False)
    result = fuse_model(loaded, rules=(GuardIntoSkipNorm(),), base_dir=tmp_path)
    if bad is None:
        assert [b.rule for b in result.report.fused] == ["guard-into-skip-norm"]
        assert _count(result.model, FILL_MASKED_ROWS) == 0
    else:
        assert result.report.fused == []
        assert result.model.SerializeToString() == loaded.SerializeToString()


def test_the_rules_reach_is_the_kernels_params_in_registers():
    """MAX_ROW_BYTES is one fact with the CUDA kernel: rows of kParamsWithRowVectors 16-byte vectors a lane."""
    import re
    from pathlib import Path

    from onnxfuse.patterns.guard_into_skip_norm import MAX_ROW_BYTES, VECTOR_BYTES

    kernel = Path(__file__).resolve().parents[1] / "custom_ops/src/cuda/kernels/masked_skip_layer_norm.cu"
    source = kernel.read_text()
    (vectors,) = re.findall(r"constexpr int kParamsWithRowVectors = (\d+);", source)
    assert MAX_ROW_BYTES == int(vectors) * VECTOR_BYTES * 32
