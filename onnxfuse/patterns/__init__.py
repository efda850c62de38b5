"""The fusion rules, and the rule set ``optimize`` runs.

Each rule (:class:`~.rule.FusionRule`) is anchored on some node types and answers, for one anchor node,
None (not a candidate), a :class:`~.rule.Plan` (the rewrite), or a :class:`~.rule.Refusal` (a candidate
left as it is, with its reason). The driver (``onnxfuse.fuse``) knows no rule by name: adding a fusion is
adding a rule to :func:`default_rules`.

- ``linear_gelu``: Linear(+bias)+GELU → ``ai.onnxfuse.FusedLinearGelu``. Its stages live beside it: the
  activation normalisers (``gelu_ops``, ``erf``, ``tanh``, ``sigmoid``), ``casts`` and ``linear``.
- ``attention`` (a package): self-attention (Q·Kᵀ, mask, Softmax, P·V, head split/merge) →
  ``com.microsoft.Attention`` with Q, K and V packed into one projection (``qkv``), else
  ``com.microsoft.MultiHeadAttention``. One module per stage: the two anchors (``rules``: Softmax;
  ``onnx_attention``: ONNX's ``Attention`` op), ``scores``, ``heads``, ``masks`` (where a new mask form plugs
  in), ``score_keep``, ``assemble``, and the plan with what it writes (``plan``, ``mask_inputs``). ``symbolic``
  (a package: ``dims``, ``values``, ``shapes``, ``evaluator``) evaluates the shape and mask arithmetic the forms
  are proved with; ``value_range`` proves a bias finite.
- ``embedding_norm``: BERT-class embedding lookups, their sum and its LayerNormalization →
  ``SkipLayerNormalization`` (a table row of uniform indices, the token types of today's exports, as its bias).
- ``skip_norm_bias``: a Gemm's bias (C) moved into the ``SkipLayerNormalization`` that reads the Gemm,
  where ORT's CUDA Gemm would broadcast it into its output in a kernel of its own.
- ``guard_into_skip_norm``: the attention's row guard, behind the output projection, folded into the
  ``SkipLayerNormalization`` there (``ai.onnxfuse.MaskedSkipLayerNormalization``); it matches what the
  attention rule writes, so the driver runs it in a second pass (``after_rewrites``).
- ``graph``: the read-only view every rule matches on; ``rule``: what rules return and the algebra they share;
  ``match``: the matching toolkit (one refusal exception, ``Refused``, and ``parent_path``).
"""

from __future__ import annotations

from .attention import Attention, OnnxAttention
from .embedding_norm import EmbeddingsIntoSkipNorm
from .guard_into_skip_norm import GuardIntoSkipNorm
from .linear_gelu import ACTIVATION_RULES, APPROXIMATIONS, LinearGelu
from .rule import Activation, FusionRule, NewTensor, OpKey, Plan, Refusal
from .skip_norm_bias import GemmBiasIntoSkipNorm


def default_rules(approximate: str | None = None) -> tuple[FusionRule, ...]:
    """The rules ``optimize`` and ``inspect`` run, in priority order (a node claimed by an earlier plan is not
    fused again; the ``after_rewrites`` ones in a second pass). ``approximate``: see :class:`LinearGelu`."""
    return (LinearGelu(approximate), Attention(), OnnxAttention(), EmbeddingsIntoSkipNorm(), GemmBiasIntoSkipNorm(),
            GuardIntoSkipNorm())


def emitted_ops(rules: tuple[FusionRule, ...] | None = None) -> tuple[OpKey, ...]:
    """(domain, op_type) of every node ``rules`` (default: :func:`default_rules`) may write."""
    rules = default_rules() if rules is None else rules
    return tuple(dict.fromkeys(op for rule in rules for op in rule.emits))


def emitted_op_types(rules: tuple[FusionRule, ...] | None = None) -> tuple[str, ...]:
    """The op types of :func:`emitted_ops` (what ORT's profiler names a node by)."""
    return tuple(dict.fromkeys(op_type for _, op_type in emitted_ops(rules)))


__all__ = [
    "ACTIVATION_RULES", "APPROXIMATIONS", "Activation", "Attention", "EmbeddingsIntoSkipNorm", "FusionRule",
    "GemmBiasIntoSkipNorm", "GuardIntoSkipNorm", "LinearGelu", "NewTensor", "OnnxAttention", "Plan", "Refusal",
    "default_rules", "emitted_op_types", "emitted_ops"
]
