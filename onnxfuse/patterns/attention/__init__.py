"""Self-attention, as the exporters write it, into one ``com.microsoft.Attention`` (Q, K and V packed into
one projection) or, where they cannot be packed, one ``com.microsoft.MultiHeadAttention``.

Two anchors, one set of proofs:

- :class:`Attention`, anchored on ``Softmax``: Q·Kᵀ, its scale, a mask or bias, the Softmax, P·V, and the
  head split and merge around them, in the forms torch.onnx writes for Hugging Face models with the default
  (``sdpa``) attention, TorchScript (``dynamo=False``) and dynamo exporters, opsets 14-20, raw and after
  ORT's transformers optimizer (which fuses none of them) and its float16 converter (tests/models/manifest.json);
- :class:`OnnxAttention`, anchored on ONNX's own ``Attention`` op (opset 23, the dynamo exporter's sdpa).

Nothing is assumed from names: the heads' dimensions, the mask and the bias are proved from the graph
(``symbolic``, ``value_range``), and whatever the fused op cannot compute exactly is refused with a reason
a user can act on (``inspect`` shows it). Nodes that pass a value on unchanged — Identity, the device copies
ONNX Runtime writes into a model it saved for a GPU (``MemcpyFromHost``/``MemcpyToHost``), a Cast to the type
a tensor has — are seen through wherever a proof reads values or shapes (``graph.value_source``). Where to look:

- ``rules``: the Softmax rule, from its anchor to the plan, the row guard after the Softmax, and what it refuses;
- ``onnx_attention``: the rule for ONNX's ``Attention`` op;
- ``scores``: which product the scores are, their scale, the bias added, a Where on the product, and why a
  Softmax of a product in another form stays;
- ``heads``: the head split of each projection, Kᵀ's layouts, heads the graph computes per head (rotary
  embeddings), one key/value head broadcast over the query's (multi-query), and the head merge;
- ``masks``: what the bias is proved to be (padding, causal, windows) or why it is fed as it is; a new mask
  spelling plugs in there (``masks.FORMS``);
- ``mask_semantics``: a mask read off what it computes, whatever its spelling, where the bias cannot be fed as
  it is: ``mask_cone`` proves it a function of ``attention_mask[b, k]`` (and causal comparisons) alone,
  ``scalar_ops`` evaluates that function in the graph's types;
- ``score_keep``: GPT-Neo's literal keep on the product, ``Where(C, Q·Kᵀ, fill)``;
- ``assemble``: from the matched parts to the plan: Q, K and V packed (``qkv``) or fed as they are, the
  nodes the block takes;
- ``plan``: :class:`AttentionPlan` and :class:`PackedAttentionPlan`, and the nodes they write;
- ``mask_inputs``: the mask's tensors written in front of the op, and why the mask goes in as ``attention_bias``.

Not handled (no such form among the committed exports): ALiBi as bloom writes it (its scores are one
``baddbmm``, no Q·Kᵀ MatMul: not a candidate), a row guard derived from a bias's values (which would admit
non-finite biases).
"""

from __future__ import annotations

from .masks import FLOAT32_MIN
from .onnx_attention import OnnxAttention
from .plan import MS_DOMAIN, RULE, AttentionPlan, PackedAttentionPlan
from .rules import Attention

__all__ = ["FLOAT32_MIN", "MS_DOMAIN", "RULE", "Attention", "AttentionPlan", "OnnxAttention", "PackedAttentionPlan"]
