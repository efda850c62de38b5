"""The attention's mask interface (``onnxfuse/patterns/attention/masks.py``): ``classify`` tries the mask forms of
``FORMS`` in order, takes the first that proves the bias, and otherwise feeds the bias as it is, its reason saying
why no form proved it. A new mask spelling is one entry there: these tests plug one in."""

from __future__ import annotations

import numpy as np
from onnx import numpy_helper

from onnxfuse.patterns.attention import masks
from onnxfuse.patterns.match import Refused
from tests.test_patterns_attention import D, _attention, _fuse, _fused_node, _run


def _zero_table(view, ev, bias, q, k, dtype):
    """A form for the test: a constant bias of zeros keeps every key (no mask); any other bias is not its spelling."""
    value = view.small_value(bias)
    return None if value is None or value.any() else masks.NO_MASK


def _with_zero_table(model):
    """``model`` (``_attention(bias="table")``) with its position table all zeros."""
    (table,) = [t for t in model.graph.initializer if t.name == "position_table"]
    table.CopyFrom(numpy_helper.from_array(np.zeros_like(numpy_helper.to_array(table)), "position_table"))
    return model


def test_a_mask_form_added_to_the_forms_is_tried_and_its_mask_taken(monkeypatch, rng):
    model = _with_zero_table(_attention(mask="none", bias="table", seq_len=5))
    (before,) = _fuse(model).report.fused
    assert before.details["mask"] == "additive bias"  # no form proves it: the bias goes in as it is

    monkeypatch.setattr(masks, "FORMS", masks.FORMS + (masks.MaskForm("a constant of zeros", _zero_table),))
    result = _fuse(model)
    (block,) = result.report.fused
    assert block.details["mask"] == "none" and block.details["mask_input"] == "none"
    assert len(_fused_node(result.model).input) <= 5  # no attention_bias
    x = rng.standard_normal((3, 5, D)).astype(np.float32)
    np.testing.assert_allclose(_run(result.model, x), _run(model, x), rtol=1e-5, atol=1e-6)


def test_forms_come_in_order_and_the_reason_names_each_spelling(monkeypatch):
    """A bias no form recognises, and that cannot be fed as it is (it broadcasts the scores up), is refused with
    every form's spelling; where a form recognises it but refuses, its reason comes first."""
    model = _attention(mask="none", bias="table_batch2", seq_len=5)
    default, tried = masks.FORMS, []

    def nothing(view, ev, bias, q, k, dtype):
        tried.append(bias)
        return None

    monkeypatch.setattr(masks, "FORMS", default + (masks.MaskForm("Zeros(shape)", nothing),))
    (refused,) = _fuse(model).report.refused
    assert tried == ["position_table"]
    assert refused.reason.startswith("the scores get an additive bias from a constant, not a mask "
                                     "Where(keep, 0, fill) or Zeros(shape) (ALiBi, relative position bias or an "
                                     "unrecognised mask); as attention_bias, the bias's dimension 0 (2)")

    def unproved(view, ev, bias, q, k, dtype):
        raise Refused("the table is not proved to be zeros")

    monkeypatch.setattr(masks, "FORMS", default + (masks.MaskForm("Zeros(shape)", unproved),
                                                   masks.MaskForm("Ones(shape)", nothing)))
    tried.clear()
    (refused,) = _fuse(model).report.refused
    assert tried == ["position_table"]  # still tried: it might have proved the bias
    assert refused.reason.startswith("the table is not proved to be zeros; as attention_bias, the bias's dimension 0")

