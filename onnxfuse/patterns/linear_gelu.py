"""The Linear(+bias)+GELU fusion: one rule that turns a GELU, whatever form it has, and the Linear feeding
it into one ``FusedLinearGelu`` node.

It runs in three stages, each a module of its own:

1. an activation normaliser (``gelu_ops`` for operators, ``erf``/``tanh``/``sigmoid`` for decompositions)
   recognises the GELU anchored on one node and returns the canonical :class:`~.rule.Activation`;
2. ``casts.widen`` takes in the float32 Casts that fp16 graphs wrap around it;
3. ``linear.absorb`` plans the MatMul/Gemm (+bias, +Reshape) in front of it, found by the Linear matcher every
   rule shares (``linear_match.find_linear``).

Each stage may refuse with its own reason; the plan writes the fused node (and, for GPT-2's
``Reshape→Gemm→Reshape``, moves the trailing Reshape after it: GELU is elementwise, so they commute).
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx
from onnx import helper

from ..domain import DEFAULT_SIGMOID_ALPHA, DOMAIN, OP_TYPE
from . import casts, linear
from .erf import ErfGelu
from .gelu_ops import RULES as GELU_OP_RULES
from .graph import GraphView
from .linear import PlannedLinear
from .rule import Activation, Emitter, OpKey, Plan, Refusal, op_key
from .sigmoid import SigmoidGelu
from .tanh import TanhGelu

RULE = "linear-gelu"
APPROXIMATIONS = ("tanh", "sigmoid")  # what --approximate may ask every fused node to compute

# Every way a GELU is written, each anchored on one node: operators first, then decompositions.
ACTIVATION_RULES = (*GELU_OP_RULES, ErfGelu(), TanhGelu(), SigmoidGelu())


@dataclass(frozen=True)
class LinearGeluPlan(Plan):
    """Everything needed to write one ``FusedLinearGelu`` node."""

    activation: Activation
    linear: PlannedLinear
    approximate: str  # what the fused node computes: the activation's own form unless asked otherwise
    alpha: float | None = None  # sigmoid form only

    op = (DOMAIN, OP_TYPE)

    def emit(self, out: Emitter, name: str) -> list[onnx.NodeProto]:
        lin = self.linear
        attrs = {"approximate": self.approximate, "transB": lin.trans_b}
        if self.approximate == "sigmoid":
            attrs["alpha"] = float(self.alpha if self.alpha is not None else DEFAULT_SIGMOID_ALPHA)
        inputs = [lin.x, out.tensor(lin.weight)] + ([out.tensor(lin.bias)] if lin.bias is not None else [])
        final = self.activation.output
        fused_output = lin.reshape[1] if lin.reshape else final
        nodes = [helper.make_node(OP_TYPE, inputs, [fused_output], name=name, domain=DOMAIN, **attrs)]
        if lin.reshape:
            moved = onnx.NodeProto()
            moved.CopyFrom(out.view.nodes[lin.reshape[0]])
            moved.input[0] = fused_output
            moved.output[0] = final
            nodes.append(moved)
        return nodes

    def details(self) -> dict[str, object]:
        return {"approximate": self.approximate}

    @property
    def math_change(self) -> tuple[str, str] | None:
        act = self.activation
        if self.approximate == act.approximate:
            return None
        was = act.approximate + (f"(alpha={act.alpha:.6g})" if act.approximate == "sigmoid" else "")
        return was, self.approximate


@dataclass(frozen=True)
class LinearGelu:
    """The fusion rule. ``approximate`` ("tanh" or "sigmoid") makes every fused node compute that form,
    changing the math on purpose (the report lists each such node); None keeps each block's own."""

    approximate: str | None = None

    name = RULE
    emits = ((DOMAIN, OP_TYPE),)

    def __post_init__(self):
        if self.approximate is not None and self.approximate not in APPROXIMATIONS:
            raise ValueError(f"approximate must be one of {', '.join(APPROXIMATIONS)}, not {self.approximate!r}")

    @property
    def anchors(self) -> tuple[OpKey, ...]:
        return tuple(dict.fromkeys(a for r in ACTIVATION_RULES for a in r.anchors))

    def match(self, view: GraphView, i: int) -> LinearGeluPlan | Refusal | None:
        key = op_key(view.nodes[i])
        for normaliser in ACTIVATION_RULES:
            if key not in normaliser.anchors:
                continue
            act = normaliser.match(view, i)
            if act is None:
                continue
            if isinstance(act, Activation):
                act = casts.widen(view, act)
            if isinstance(act, Refusal):
                return act
            lin = linear.absorb(view, act)
            if isinstance(lin, Refusal):
                return lin
            return self._plan(act, lin)
        return None

    def _plan(self, act: Activation, lin: PlannedLinear) -> LinearGeluPlan:
        approximate, alpha = act.approximate, act.alpha
        if self.approximate is not None and self.approximate != act.approximate:
            approximate = self.approximate
            alpha = DEFAULT_SIGMOID_ALPHA if approximate == "sigmoid" else None
        return LinearGeluPlan(
            rule=RULE,
            form=f"{act.form}+{lin.form}",
            nodes=frozenset(act.nodes | lin.nodes),
            outputs=(act.output,),
            name_hint=lin.name_hint,
            activation=act,
            linear=lin,
            approximate=approximate,
            alpha=alpha,
        )


__all__ = ["ACTIVATION_RULES", "APPROXIMATIONS", "LinearGelu", "LinearGeluPlan", "RULE"]
