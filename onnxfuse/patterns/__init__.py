"""The fusion rules, and the rule set ``optimize`` runs.

Each rule (:class:`~.rule.FusionRule`) is anchored on some node types and answers, for one anchor node,
None (not a candidate), a :class:`~.rule.Plan` (the rewrite), or a :class:`~.rule.Refusal` (a candidate
left as it is, with its reason). The driver (``onnxfuse.fuse``) knows no rule by name: adding a fusion is
adding a rule to :func:`default_rules`.

- ``linear_gelu``: Linear(+bias)+GELU → ``ai.onnxfuse.FusedLinearGelu``. Its stages live beside it: the
  activation normalisers (``gelu_ops``, ``erf``, ``tanh``, ``sigmoid``), ``casts`` and ``linear``.
- ``graph``: the read-only view every rule matches on; ``rule``: what rules return and the algebra they share.
"""

from __future__ import annotations

from .linear_gelu import ACTIVATION_RULES, APPROXIMATIONS, LinearGelu
from .rule import Activation, FusionRule, NewTensor, Plan, Refusal


def default_rules(approximate: str | None = None) -> tuple[FusionRule, ...]:
    """The rules ``optimize`` and ``inspect`` run, in priority order (a node claimed by an earlier plan is not
    fused again). ``approximate``: see :class:`LinearGelu`."""
    return (LinearGelu(approximate),)


__all__ = ["ACTIVATION_RULES", "APPROXIMATIONS", "Activation", "FusionRule", "LinearGelu", "NewTensor", "Plan",
           "Refusal", "default_rules"]
