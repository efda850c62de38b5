"""GELU written as one operator: ONNX ``Gelu`` (opset 20) and the ``com.microsoft`` ops ORT's transformers
optimizer leaves behind. One declarative row per operator."""

from __future__ import annotations

from dataclasses import dataclass

from ..domain import DEFAULT_SIGMOID_ALPHA
from .graph import GraphView, attr
from .rule import Activation, Refusal

MS = "com.microsoft"


@dataclass(frozen=True)
class GeluOp:
    """``op_type`` of ``domain`` computes GELU with ``approximate`` (or the value of its ``approximate``
    attribute when that is None); ``bias_input`` is the index of an optional bias the op adds before the
    activation; ``alpha_attr`` is the sigmoid scale attribute (QuickGelu)."""

    op_type: str
    domain: str
    form: str
    approximate: str | None
    bias_input: int | None = None
    alpha_attr: str | None = None

    @property
    def rule(self) -> str:
        return f"{self.domain + '.' if self.domain else ''}{self.op_type}"

    @property
    def anchors(self) -> tuple[tuple[str, str], ...]:
        return ((self.domain, self.op_type),)

    def match(self, view: GraphView, i: int) -> Activation | Refusal | None:
        node = view.nodes[i]
        if not node.input or not node.input[0] or len(node.output) != 1:
            return None  # malformed (onnx.checker cannot judge com.microsoft ops): not ours to touch
        approximate = self.approximate
        if approximate is None:  # ONNX Gelu: the attribute decides
            approximate = attr(node, "approximate", b"none")
            approximate = approximate.decode() if isinstance(approximate, bytes) else approximate
            if approximate not in ("none", "tanh"):
                return Refusal(self.rule, f"unknown approximate={approximate!r}", (view.node_name(i),))
        form = self.form.format(approximate="erf" if approximate == "none" else approximate)
        bias = None
        if self.bias_input is not None and len(node.input) > self.bias_input and node.input[self.bias_input]:
            bias = node.input[self.bias_input]
            if self.op_type == "FastGelu":  # its bias is optional: say which variant it was
                form += "+bias"
        alpha = float(attr(node, self.alpha_attr, DEFAULT_SIGMOID_ALPHA)) if self.alpha_attr else None
        return Activation(form=form, input=node.input[0], output=node.output[0], nodes=frozenset({i}),
                          approximate=approximate, alpha=alpha, bias=bias)


RULES = (
    GeluOp("Gelu", "", "Gelu({approximate})", approximate=None),
    GeluOp("Gelu", MS, "com.microsoft.Gelu", approximate="none"),
    GeluOp("BiasGelu", MS, "com.microsoft.BiasGelu", approximate="none", bias_input=1),
    GeluOp("FastGelu", MS, "com.microsoft.FastGelu", approximate="tanh", bias_input=1),
    GeluOp("QuickGelu", MS, "com.microsoft.QuickGelu", approximate="sigmoid", alpha_attr="alpha"),
)

