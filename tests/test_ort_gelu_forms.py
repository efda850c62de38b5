"""``ort_gelu_forms``: every GELU op ORT's fusions write is held to the approximation the model computes there.

ORT's own output (``ort_fusions._run_fusions``) is the starting point: where ORT writes the right form nothing
changes; its ``BiasGelu`` for ONNX's ``Gelu(approximate="tanh")`` becomes ``FastGelu`` on the same inputs; the
other mismatches (ORT's op edited to another form, as a fusion that wrote it would) are rewritten back, or
listed as unresolved where no op computes the model's form. GPT-2's Conv1D, whose tensors ORT's "gpt2" fusions
rename, is read by its weight.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from onnxfuse.compare import compare_models
from onnxfuse.ort_fusions import _run_fusions
from onnxfuse.ort_gelu_forms import hold_gelu_forms
from tests.graphs import build

SAMPLES = Path(__file__).resolve().parents[1] / "sample_models"
MS = "com.microsoft"


def _orts(model: onnx.ModelProto, model_type: str = "bert") -> onnx.ModelProto:
    fused, why_not = _run_fusions(model, model_type, use_gpu=False, gelu_fusions=True)
    assert fused is not None, why_not
    return fused


def _gelu_ops(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type in ("Gelu", "BiasGelu", "FastGelu", "QuickGelu")]


@pytest.mark.parametrize("form,op", [("erf:pytorch:div", "BiasGelu"), ("onnx:none", "BiasGelu"),
                                     ("tanh:pow", "FastGelu"), ("tanh:bloom", "FastGelu")])
def test_where_orts_op_computes_the_models_form_nothing_changes(form, op):
    model = build(form)
    fused = _orts(model)
    before = fused.SerializeToString()
    held = hold_gelu_forms(model, fused)
    assert held.corrected == [] and held.unresolved == []
    assert fused.SerializeToString() == before
    assert [(n.domain, n.op_type) for n in _gelu_ops(fused)] == [(MS, op)]


def test_orts_bias_gelu_for_a_tanh_gelu_becomes_fast_gelu_on_the_same_inputs():
    model = build("onnx:tanh")  # MatMul, bias Add, ONNX Gelu(approximate="tanh") at opset 20
    fused = _orts(model)
    (wrote,) = _gelu_ops(fused)
    assert (wrote.domain, wrote.op_type) == (MS, "BiasGelu")  # what ORT's FusionBiasGelu writes: erf
    inputs, outputs, name = list(wrote.input), list(wrote.output), wrote.name
    assert not compare_models(model, fused, samples=2, progress=False).passed

    held = hold_gelu_forms(model, fused)
    assert held.unresolved == []
    assert held.corrected == [{"node": name, "output": outputs[0], "ort_wrote": f"{MS}.BiasGelu", "computes": "erf",
                               "model_computes": "tanh", "now": f"{MS}.FastGelu"}]
    (now,) = _gelu_ops(fused)
    assert (now.domain, now.op_type, list(now.input), list(now.output)) == (MS, "FastGelu", inputs, outputs)
    assert now.name == f"FastGelu_{name}"
    assert compare_models(model, fused, samples=2, progress=False).passed


def _as(fused: onnx.ModelProto, op_type: str, **attrs) -> onnx.NodeProto:
    """ORT's one GELU op of ``fused`` made ``op_type`` on the same inputs, as a fusion writing it would."""
    (node,) = _gelu_ops(fused)
    node.op_type = op_type
    del node.attribute[:]
    node.attribute.extend(onnx.helper.make_attribute(k, v) for k, v in attrs.items())
    return node


@pytest.mark.parametrize("form,wrote,model_computes,now", [
    ("erf:pytorch:div", "FastGelu", "erf", "BiasGelu"),   # the reverse of ORT's mistake
    ("tanh:pow", "BiasGelu", "tanh", "FastGelu"),
])
def test_a_bias_gelu_op_of_the_other_form_is_rewritten_to_the_models(form, wrote, model_computes, now):
    model = build(form)
    fused = _orts(model)
    inputs = list(_as(fused, wrote).input)
    held = hold_gelu_forms(model, fused)
    assert [(c["ort_wrote"], c["model_computes"], c["now"]) for c in held.corrected] == [
        (f"{MS}.{wrote}", model_computes, f"{MS}.{now}")]
    (node,) = _gelu_ops(fused)
    assert (node.op_type, list(node.input)) == (now, inputs)
    assert compare_models(model, fused, samples=2, progress=False).passed


def test_without_a_bias_the_op_of_the_models_form_has_none():
    """A GELU op on the Linear's output without a bias (no Add for ORT's bias fusion): com.microsoft.Gelu where
    the model computes tanh becomes FastGelu with one input; QuickGelu's alpha is the model's."""
    model = build("onnx:tanh", bias=False)
    fused = _orts(model)
    assert [(n.domain, n.op_type) for n in _gelu_ops(fused)] == [("", "Gelu")]  # the model's own: left alone
    assert hold_gelu_forms(model, fused).corrected == []
    _as(fused, "Gelu").domain = MS
    held = hold_gelu_forms(model, fused)
    assert [c["now"] for c in held.corrected] == [f"{MS}.FastGelu"]
    assert [len(n.input) for n in _gelu_ops(fused)] == [1]

    model = build("sigmoid", bias=False)
    fused = _orts(model)
    assert [n.op_type for n in _gelu_ops(fused)] == ["QuickGelu"]
    assert hold_gelu_forms(model, fused).corrected == []
    _as(fused, "FastGelu")
    held = hold_gelu_forms(model, fused)
    (node,) = _gelu_ops(fused)
    assert [c["model_computes"] for c in held.corrected] == ["sigmoid(alpha=1.702)"]
    assert node.op_type == "QuickGelu" and onnx.helper.get_node_attr_value(node, "alpha") == pytest.approx(1.702)


def test_a_form_no_op_computes_with_a_bias_is_unresolved():
    """QuickGelu takes no bias: ORT's bias op where the model computes x·sigmoid(1.702x) stays, unresolved (the
    caller reruns ORT's fusions with their GELU fusions off)."""
    model = build("sigmoid")
    fused = _orts(model)
    (quick,) = _gelu_ops(fused)  # ORT's QuickGelu reads the bias Add's output: it has no bias to fuse
    add = next(n for n in fused.graph.node if quick.input[0] in n.output)
    quick.op_type = "BiasGelu"
    del quick.attribute[:]
    quick.input[:] = list(add.input)
    held = hold_gelu_forms(model, fused)
    assert held.corrected == []
    assert len(held.unresolved) == 1 and "which no ORT op with a bias computes" in held.unresolved[0]
    assert held.unresolved[0].startswith(f"{MS}.BiasGelu '{quick.name}' computes erf where the model computes sigmoid")


def test_a_near_miss_form_ort_fuses_is_unresolved():
    """ORT's FusionGelu takes an Erf divisor within 0.001 of 1.4142 as √2; onnxfuse reads no GELU form there (its
    rule refuses the block), so the exact op ORT wrote cannot be held to anything."""
    model = build("erf:pytorch:div", perturb={"sqrt2": 1.4135})
    fused = _orts(model)
    assert [n.op_type for n in _gelu_ops(fused)] == ["BiasGelu"]
    held = hold_gelu_forms(model, fused)
    assert held.corrected == [] and len(held.unresolved) == 1
    assert "the GELU form the model computes at" in held.unresolved[0]


def test_gpt2s_conv1d_renamed_by_orts_fusions_is_read_by_its_weight():
    """ORT's "gpt2" fusions turn Reshape→Gemm→Reshape into a MatMul and rename the tensors around it: the
    FastGelu it writes computes no tensor of the model, and is held to the GELU after the same weight."""
    model = onnx.load(str(SAMPLES / "tiny_gpt2.onnx"))
    fused = _orts(model, "gpt2")
    ops = _gelu_ops(fused)
    names = {o for n in model.graph.node for o in n.output}
    assert len(ops) == 2 and all(n.op_type == "FastGelu" and n.output[0] not in names for n in ops)
    held = hold_gelu_forms(model, fused)
    assert held.corrected == [] and held.unresolved == []
