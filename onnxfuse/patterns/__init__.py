"""Rewrite rules, in two stages.

1. Activation normalisers (``ACTIVATION_RULES``): each recognises one way a GELU is written — an operator
   (``gelu_ops``) or a decomposition (``erf``, ``tanh``, ``sigmoid``) — anchored on one node, and returns
   the canonical :class:`~.rule.Activation`; ``casts.widen`` then takes in the float32 Casts of fp16
   graphs.
2. One Linear-absorption rule (``linear.absorb``) turns an Activation and the Linear that feeds it into a
   :class:`~.rule.Fusion` plan.

Every rule answers None (not a candidate), a record, or a :class:`~.rule.Refusal` with its reason.
"""

from . import casts, linear
from .erf import ErfGelu
from .gelu_ops import RULES as GELU_OP_RULES
from .rule import Activation, Fusion, NewTensor, Refusal
from .sigmoid import SigmoidGelu
from .tanh import TanhGelu

ACTIVATION_RULES = (*GELU_OP_RULES, ErfGelu(), TanhGelu(), SigmoidGelu())

__all__ = ["ACTIVATION_RULES", "Activation", "Fusion", "NewTensor", "Refusal", "casts", "linear"]
