"""ORT's GELU fusions held to the approximation the model computes.

Why: ORT's ``FusionBiasGelu`` (``onnxruntime/transformers/fusion_biasgelu.py``) fuses every node of op type
``Gelu`` fed by a MatMul and a bias Add into the exact-erf ``com.microsoft.BiasGelu``. It reads neither the
node's domain nor ONNX ``Gelu``'s ``approximate`` attribute, so ONNX's ``Gelu(approximate="tanh")`` (opset 20:
the dynamo exporter's ``gelu_pytorch_tanh``, in GPT-NeoX, SigLIP and BERT-likes configured with it) becomes
erf-GELU: on GPT-NeoX's export (tests/models/gpt_neox_tanh_dynamo_op20.onnx) the outputs move five times
``compare``'s float32 tolerance. The other GELU fusions ORT runs by default (``FusionGelu``, ``FusionFastGelu``,
``FusionQuickGelu``) match the form they write; nothing else ORT writes is trusted on that word.

What is checked: every GELU op ORT's fusions wrote (``com.microsoft`` ``Gelu``, ``BiasGelu``, ``FastGelu``,
``QuickGelu``, or an ONNX ``Gelu``; one the model had already, same inputs and attributes, is not ORT's)
computes a tensor the model computed before (ORT's fusions keep the name of the tensor a fused block
computes). The form the model computed there is read with onnxfuse's own GELU normalisers
(``patterns.ACTIVATION_RULES``: ``gelu_ops``, ``erf``, ``tanh``, ``sigmoid``), and the form ORT's op computes
with ``gelu_ops``. Where they differ, the op is rewritten, on the same inputs (its bias kept), into the one
that computes the model's form: ``FastGelu`` for tanh, ``BiasGelu`` (with a bias) or ``com.microsoft.Gelu``
for erf, ``QuickGelu`` with the model's alpha for the sigmoid form. Where no op does (a sigmoid form with a
bias), or the model's form cannot be read at that tensor, the op is *unresolved*: the caller reruns ORT's
fusions with its GELU fusions off (``ort_fusions``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import onnx
from onnx import helper

from .patterns import ACTIVATION_RULES, Activation
from .patterns.gelu_ops import MS
from .patterns.gelu_ops import RULES as GELU_OPS
from .patterns.graph import GraphView
from .patterns.linear_match import find_linear
from .patterns.match import Refused
from .patterns.rule import op_key

# (domain, op_type) of every GELU written as one op, default domain spelled ""
GELU_OP_KEYS = frozenset(key for rule in GELU_OPS for key in rule.anchors)
_FORM_NAMES = {"none": "erf", "tanh": "tanh", "sigmoid": "sigmoid"}


@dataclass
class HeldForms:
    """What :func:`hold_gelu_forms` found: each GELU op ORT wrote in another approximation than the model's,
    rewritten to it (``corrected``, one dict per node), and those it could not hold to the model's form
    (``unresolved``, why, one line per node)."""

    corrected: list[dict] = field(default_factory=list)
    unresolved: list[str] = field(default_factory=list)


def _form(act: Activation) -> str:
    """The approximation an activation computes, as the report says it (sigmoid with its alpha)."""
    name = _FORM_NAMES.get(act.approximate, act.approximate)
    return f"{name}(alpha={act.alpha:.6g})" if act.approximate == "sigmoid" and act.alpha is not None else name


def _same_form(a: Activation, b: Activation) -> bool:
    if a.approximate != b.approximate:
        return False
    return a.approximate != "sigmoid" or math.isclose(a.alpha, b.alpha, rel_tol=1e-6)


def _activation(view: GraphView, i: int) -> Activation | None:
    """The GELU anchored on node ``i`` as the first normaliser that answers reads it (as the Linear+GELU rule
    reads it), or None where none reads a GELU there (a refusal is no GELU form either)."""
    key = op_key(view.nodes[i])
    for normaliser in ACTIVATION_RULES:
        if key in normaliser.anchors:
            found = normaliser.match(view, i)
            if found is not None:
                return found if isinstance(found, Activation) else None
    return None


def _linear_weight(view: GraphView, tensor: str) -> str | None:
    """The weight of the Linear (``linear_match.find_linear``) that computes ``tensor``, or None."""
    try:
        return find_linear(view, tensor, "the GELU").w
    except Refused:
        return None


@dataclass
class _ModelForms:
    """Every GELU the model computes, by the tensor it computes and by the weight of the Linear in front of
    it, where that weight is read by that Linear alone (ORT's "gpt2" fusions rename the tensors around GPT-2's
    Conv1D, never its weights)."""

    view: GraphView
    by_output: dict[str, Activation]
    by_weight: dict[str, Activation]

    @classmethod
    def read(cls, view: GraphView) -> _ModelForms:
        anchors = {a for rule in ACTIVATION_RULES for a in rule.anchors}
        by_output, by_weight = {}, {}
        for i, node in enumerate(view.nodes):
            act = _activation(view, i) if op_key(node) in anchors else None
            if act is None or act.output in by_output:
                continue
            by_output[act.output] = act
            weight = _linear_weight(view, act.input)
            if weight is not None and len(view.consumers_of(weight)) == 1:
                by_weight[weight] = act
        return cls(view, by_output, by_weight)

    def at(self, after: GraphView, i: int) -> Activation | None:
        """The GELU the model computed where ORT's op ``i`` of ``after`` is: at its output tensor, or, where
        ORT renamed it (the model has no tensor of that name), after the same weight."""
        node = after.nodes[i]
        if node.output[0] in self.by_output or node.output[0] in self.view.producer:
            return self.by_output.get(node.output[0])
        weight = _linear_weight(after, node.input[0])
        return None if weight is None else self.by_weight.get(weight)


def _signature(node: onnx.NodeProto) -> tuple:
    return op_key(node), tuple(node.input), tuple(a.SerializeToString() for a in node.attribute)


def _replacement(node: onnx.NodeProto, wrote: Activation, model: Activation) -> onnx.NodeProto | None:
    """The com.microsoft op computing the model's form on the inputs of ``node`` (ORT's), or None where none
    does exactly (QuickGelu takes no bias)."""
    x, bias, outputs = node.input[0], wrote.bias, list(node.output)
    if model.approximate == "tanh":
        return helper.make_node("FastGelu", [x] + ([bias] if bias else []), outputs, domain=MS)
    if model.approximate == "none":
        if bias:
            return helper.make_node("BiasGelu", [x, bias], outputs, domain=MS)
        return helper.make_node("Gelu", [x], outputs, domain=MS)
    if model.approximate == "sigmoid" and not bias and model.alpha is not None:
        return helper.make_node("QuickGelu", [x], outputs, domain=MS, alpha=float(model.alpha))
    return None


def _subgraph_gelu_ops(graph: onnx.GraphProto) -> int:
    """GELU ops inside the If/Loop/Scan bodies of ``graph``, where the forms are not read."""
    count = 0
    for node in graph.node:
        for a in node.attribute:
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                count += sum(op_key(n) in GELU_OP_KEYS for n in g.node) + _subgraph_gelu_ops(g)
    return count


def hold_gelu_forms(before: onnx.ModelProto, after: onnx.ModelProto) -> HeldForms:
    """Hold every GELU op ORT's fusions wrote in ``after`` (ORT's output from ``before``) to the approximation
    ``before`` computes at its output tensor: each one that computes another is rewritten, in place in
    ``after``, into the op that computes the model's (``HeldForms.corrected``); each one that cannot be is
    listed in ``HeldForms.unresolved``, with why, and ``after`` keeps it."""
    held = HeldForms()
    written = [i for i, n in enumerate(after.graph.node) if op_key(n) in GELU_OP_KEYS]
    if _subgraph_gelu_ops(after.graph) > _subgraph_gelu_ops(before.graph):
        held.unresolved.append("a GELU op inside a subgraph (If, Loop, Scan), where its form is not read")
    if not written:
        return held
    before_view, after_view = GraphView(before.graph), GraphView(after.graph)
    forms = _ModelForms.read(before_view)
    names = {n.name for n in after.graph.node}
    for i in written:
        node = after.graph.node[i]
        output = node.output[0] if node.output else ""
        had = before_view.producer_of(output)
        if had is not None and _signature(had) == _signature(node):
            continue  # the model's own op, which ORT's fusions left as it was
        op = f"{node.domain or 'ai.onnx'}.{node.op_type}"
        wrote = _activation(after_view, i)
        model = None if wrote is None else forms.at(after_view, i)
        if wrote is None or model is None:
            what = "what the op computes" if wrote is None else f"the GELU form the model computes at '{output}'"
            held.unresolved.append(f"{op} '{node.name}': {what} is not a GELU form onnxfuse reads")
            continue
        if _same_form(wrote, model):
            continue
        fixed = _replacement(node, wrote, model)
        if fixed is None:
            held.unresolved.append(f"{op} '{node.name}' computes {_form(wrote)} where the model computes "
                                   f"{_form(model)}, which no ORT op with a bias computes")
            continue
        fixed.name = _unique(f"{fixed.op_type}_{node.name}" if node.name else fixed.op_type, names)
        names.add(fixed.name)
        held.corrected.append({"node": node.name, "output": output, "ort_wrote": op, "computes": _form(wrote),
                               "model_computes": _form(model), "now": f"{fixed.domain}.{fixed.op_type}"})
        node.CopyFrom(fixed)
    return held


def _unique(name: str, taken: set[str]) -> str:
    if name not in taken:
        return name
    k = 1
    while f"{name}_{k}" in taken:
        k += 1
    return f"{name}_{k}"
