"""The attention's row guard folded into the normalization behind the output projection:
``FillMaskedRows(A, keep)`` → ``MatMul(·, W)`` → ``SkipLayerNormalization(·, skip, γ, β, bias)`` becomes
``MatMul(A, W)`` → ``ai.onnxfuse.MaskedSkipLayerNormalization(·, skip, keep, γ, β, bias)``.

Why: the attention rule writes the guard (``FillMaskedRows``, fill 0) after the fused attention of an sdpa
export, whose query rows that see no key are 0 there (the eager export's graph has no such rows to guard).
It runs in place and reads only the flags, yet it is a kernel a layer, which is what kept GPT-2's sdpa export
behind the eager export's best path (bench/results/e2e_h200.md, "The row guard on the mask itself"; the
guards' GPU time: bench/results/e2e_kernels_h200_sdpa_masked_norm.md). A zero row stays zero through the
projection, so the normalization can take the guard over: it reads its input row anyway, and the flags
beside it cost no kernel.

Exact: for a kept row both compute the same ``MatMul`` row and the same normalization of
``input + skip + bias`` (summed in float32, as ORT's SkipLayerNormalization sums); for a row not kept the
original multiplies a zero row by W (0, for a finite W) and the fold takes its input as 0 without reading
it (the unguarded product there may be NaN: a select, never a multiply). So W must be a constant proved
finite. The optional sum output (the residual stream of a pre-norm layer, GPT-2's) is the same sum.

This rule matches what the attention rule (and, for GPT-2's projection, ``skip_norm_bias``) wrote, so it
runs in the driver's second pass, over their output (``after_rewrites``).

Matched: the guard with fill 0 whose output only the MatMul reads; a constant 2-D W, all finite (read to
prove it, from external data too, once the cheaper conditions hold); the MatMul's output read only by
ORT's ``SkipLayerNormalization`` as its first input, whose mean and inverse-deviation outputs are unused;
a hidden size whose rows are 16-byte vectors of at most 3 KiB (float16 up to 1 536 wide, float32 up to 768), the
rows the CUDA kernel holds in registers together with gamma, beta and bias. Only there was the fold measured to
pay against FillMaskedRows + ORT's SkipLayerNormalization (bench/results/masked_skip_norm_h200.md); at the wider
width measured (4 096 float16) the fold ran slower than the guarded pair, so wider rows keep their guard.
The RMS form (``SkipSimplifiedLayerNormalization``) has no masked op and keeps its guard. Anything else is
not a candidate and stays as written.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from ..domain import DEFAULT_SKIP_NORM_EPSILON, DOMAIN, FILL_MASKED_ROWS, MASKED_SKIP_NORM
from .graph import GraphView, attr, is_op
from .rule import Emitter, OpKey, Plan

RULE = "guard-into-skip-norm"
MS_DOMAIN = "com.microsoft"
# The rows the CUDA kernel holds in registers with gamma, beta and bias (kParamsWithRowVectors vectors of 16 bytes
# a lane, custom_ops/src/cuda/kernels/masked_skip_layer_norm.cu): where the fold was measured to pay
MAX_ROW_BYTES = 3072
VECTOR_BYTES = 16
_ELEMENT_BYTES = {onnx.TensorProto.FLOAT: 4, onnx.TensorProto.FLOAT16: 2, onnx.TensorProto.BFLOAT16: 2}
# SkipLayerNormalization's outputs: 0 the normalized sum, 1 mean, 2 inverse standard deviation, 3 the sum
_SUM_OUTPUT = 3


@dataclass(frozen=True)
class GuardIntoSkipNormPlan(Plan):
    """The MatMul reading the unguarded attention output, and the masked normalization."""

    guard: int
    matmul: int
    norm: int

    @property
    def op(self) -> OpKey:
        return (DOMAIN, MASKED_SKIP_NORM)

    def emit(self, out: Emitter, name: str) -> list[onnx.NodeProto]:
        view = out.view
        guard, matmul, norm = (view.nodes[i] for i in (self.guard, self.matmul, self.norm))
        product = onnx.NodeProto()
        product.CopyFrom(matmul)
        product.input[0] = guard.input[0]
        gamma_beta_bias = [norm.input[k] if k < len(norm.input) else "" for k in (2, 3, 4)]
        while gamma_beta_bias and not gamma_beta_bias[-1]:
            gamma_beta_bias.pop()
        outputs = [norm.output[0]]
        if len(norm.output) > _SUM_OUTPUT and norm.output[_SUM_OUTPUT]:
            outputs.append(norm.output[_SUM_OUTPUT])
        masked = onnx.helper.make_node(
            MASKED_SKIP_NORM, [matmul.output[0], norm.input[1], guard.input[1], *gamma_beta_bias], outputs,
            name=name, domain=DOMAIN, epsilon=float(attr(norm, "epsilon", DEFAULT_SKIP_NORM_EPSILON)))
        return [product, masked]

    def details(self) -> dict[str, object]:
        return {"normalization": "SkipLayerNormalization"}


class GuardIntoSkipNorm:
    """The rule, anchored on the guard."""

    name = RULE
    anchors: tuple[OpKey, ...] = ((DOMAIN, FILL_MASKED_ROWS),)
    emits: tuple[OpKey, ...] = ((DOMAIN, MASKED_SKIP_NORM),)
    after_rewrites = True  # it matches the attention rule's guard: the driver's second pass

    def match(self, view: GraphView, i: int) -> GuardIntoSkipNormPlan | None:
        guard = view.nodes[i]
        if len(guard.input) != 2 or float(attr(guard, "fill", 0.0)) != 0.0:
            return None
        matmul = view.single_consumer(guard.output[0])
        if matmul is None or not is_op(view.nodes[matmul], "MatMul") or view.nodes[matmul].input[0] != guard.output[0]:
            return None
        norm = view.single_consumer(view.nodes[matmul].output[0])
        if norm is None:
            return None
        node = view.nodes[norm]
        if node.domain != MS_DOMAIN or node.op_type != "SkipLayerNormalization" or len(node.input) < 3:
            return None
        if node.input[0] != view.nodes[matmul].output[0] or node.input[1] == node.input[0]:
            return None
        if any(k < len(node.output) and node.output[k] for k in (1, 2)):
            return None  # the mean and inverse deviation (training outputs) have no place in the masked op
        if not _rows_in_registers(view, node.input[2]):
            return None
        if not _finite_matrix(view, view.nodes[matmul].input[1]):  # last: it may read W from external data
            return None
        return GuardIntoSkipNormPlan(
            rule=RULE, form="FillMaskedRows+MatMul+SkipLayerNormalization", nodes=frozenset({i, matmul, norm}),
            outputs=tuple(o for o in node.output if o), name_hint=view.node_name(norm), guard=i, matmul=matmul,
            norm=norm)


# The largest W read to prove it finite: the attention's output projection at the widest rows the fold takes
# (float16, 1 536 wide), read once, from external data too (torch's dynamo exporter stores every weight there).
_MAX_PROVED_ELEMENTS = (MAX_ROW_BYTES // 2) ** 2


def _finite_matrix(view: GraphView, name: str) -> bool:
    """``name`` is a constant 2-D tensor, inline or external, every element finite."""
    tensor = view.constant(name)
    if tensor is None or len(tensor.dims) != 2:
        return False
    try:
        value = view.small_value(name, max_elements=_MAX_PROVED_ELEMENTS)
    except Exception:  # a tensor numpy cannot read (or data that cannot be read) is none this rule can prove
        return False
    return value is not None and bool(np.isfinite(value).all())


def _rows_in_registers(view: GraphView, gamma: str) -> bool:
    """γ is [D] of a float type whose D-wide rows are 16-byte vectors of at most MAX_ROW_BYTES."""
    shape, dtype = view.shape(gamma), view.dtype(gamma)
    if shape is None or len(shape) != 1 or not isinstance(shape[0], int) or dtype not in _ELEMENT_BYTES:
        return False
    row_bytes = shape[0] * _ELEMENT_BYTES[dtype]
    return row_bytes % VECTOR_BYTES == 0 and 0 < row_bytes <= MAX_ROW_BYTES


__all__ = ["GuardIntoSkipNorm", "GuardIntoSkipNormPlan", "MAX_ROW_BYTES", "RULE"]
