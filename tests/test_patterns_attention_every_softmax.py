"""Every attention is accounted for: each Softmax over scores (a product of two computed tensors, Q·Kᵀ) in every
committed model is either fused or listed as refused by ``inspect``, with its reason; none is left silently.

"Over scores" is decided here from the graph alone, independently of the rule's forms: walking up from the
Softmax's input through any nodes (not past a product, a ``Shape`` or a constant), within a few steps, to a
``MatMul`` or ``Einsum`` none of whose operands is a constant. A Softmax over a Linear's output (a classifier, a
router: a constant weight) is no attention and is not asked about.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from onnxfuse.pipeline import inspect_file

MODELS = Path(__file__).resolve().parent / "models"
FILES = sorted(m["file"] for m in json.loads((MODELS / "manifest.json").read_text())["models"])
_PRODUCTS = ("MatMul", "Einsum")
_DEPTH = 10


def softmaxes_over_scores(model: onnx.ModelProto) -> list[str]:
    """The names of the Softmax nodes of ``model``'s main graph that normalise a product of two computed
    tensors (module docstring)."""
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    constants = {t.name for t in graph.initializer} | {n.output[0] for n in graph.node if n.op_type == "Constant"}

    def computed(name: str) -> bool:
        return bool(name) and name not in constants

    def reaches_product(name: str, left: int, seen: set) -> bool:
        node = producer.get(name)
        if node is None or left < 0 or name in seen or not computed(name):
            return False
        seen.add(name)
        if node.op_type in _PRODUCTS:
            return len(node.input) == 2 and all(computed(x) for x in node.input)
        if node.op_type in ("Shape", "Size"):
            return False
        return any(reaches_product(x, left - 1, seen) for x in node.input)

    return [n.name for n in graph.node if n.op_type == "Softmax" and reaches_product(n.input[0], _DEPTH, set())]


@pytest.mark.parametrize("file", FILES)
def test_every_softmax_over_scores_is_fused_or_listed(file):
    model = onnx.load(MODELS / file, load_external_data=False)
    attentions = softmaxes_over_scores(model)
    assert all(attentions), "every Softmax is named in the committed models"
    report = inspect_file(MODELS / file)
    fused = {n for block in report.fused for n in block.replaced}
    refused = {n: r.reason for r in report.refused for n in r.nodes}
    silent = [name for name in attentions if name not in fused and name not in refused]
    assert not silent, f"left unfused with no reason: {silent}"
    assert all(refused[name].strip() for name in attentions if name in refused)
