"""A Gemm's bias moved into the SkipLayerNormalization that reads the Gemm: ``Gemm(A, B, C)`` [→ Reshape] →
``SkipLayerNormalization(·, skip, γ, β)`` becomes ``Gemm(A, B)`` [→ Reshape] → ``SkipLayerNormalization(·,
skip, γ, β, C)``; the same for ``SkipSimplifiedLayerNormalization`` (RMS norm, bias input 3).

Why: GPT-2's Conv1D layers export as ``Gemm`` with the bias as C (``torch.addmm``), and ORT's transformer
optimizer turns the residual Add + LayerNorm behind them into a SkipLayerNormalization that has no bias to
take (it is inside the Gemm). ORT's CUDA Gemm runs a C input as a kernel of its own: it first broadcasts C
into Y (``BroadcastBiasKernel``, one pass writing all of Y), then the GEMM accumulates onto it (beta = 1).
SkipLayerNormalization adds its bias in the pass that already adds the skip. In GPT-2 small after ORT's
optimizer and onnxfuse, those broadcasts were a kernel of their own in every layer (``BroadcastBiasKernel``
in bench/results/e2e_kernels_h200_sdpa_packed_qkv.json's ``top_kernels_us``). ORT's CPU Gemm copies C into Y first as well.

Exact up to one rounding: both graphs normalize A·B + C + skip, summed in float32 inside the normalization
(its optional sum output, the residual stream, includes the bias either way). Where the Gemm added C before
rounding its output to the tensor type, A·B is now rounded alone and C added after: in float32 and float16
one rounding of a value of the same size, so the difference stays within a unit in the last place of the
Gemm's output.

The flattening around it goes too, where the exporter wrote one: GPT-2's Conv1D is ``x.view(-1, K)``,
``addmm``, then ``.view(*x.shape[:-1], N)``, i.e. ``Reshape(x, [-1, K])`` → Gemm → ``Reshape(·, [B, S, N])``
with both targets computed from ``Shape(x)`` (3 Shapes, 2 Gathers, a Slice, a Squeeze, 3 Unsqueezes and 2
Concats, most of them on the CPU). Where the first target is proved to be [-1 (or the leading dims'
product), K] and the second x's leading dims and N (patterns/symbolic/), the block becomes ``MatMul(x, B)``
→ the normalization: the same GEMM (ORT's MatMul of a [.., K] by a [K, N] runs it as one [M, K]·[K, N]
product on both providers), without the nodes that each cost the host a dispatch in every inference (GPT-2
small after ORT's optimizer, as ORT's session runs it: 12 a layer, 144 of the model's 250 nodes). Only for
transB = 0 (the weight already [K, N], as Conv1D's is) and transA = 0, alpha = 1.

Matched: C one-dimensional [N] (its own tensor becomes the bias; any [N] tensor, constant or not), beta 1
(C unscaled), the normalization's γ of the same N, no bias there already, and the Gemm's output (and the
Reshape's, when the exporter's Reshape lies between) read by that normalization alone. A Reshape between
them keeps columns in place: the normalization's input has N as its last axis (γ's length, which ORT
checks), and row-major [M, N] → [..., N] keeps every element's column. Anything else is not a candidate and
stays as written: this rewrite only moves work, it never refuses with a reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from .graph import GraphView, attr, is_op
from .rule import Emitter, OpKey, Plan
from .symbolic import Dim, Evaluator, NotSymbolic

RULE = "gemm-bias-into-skip-norm"
MS_DOMAIN = "com.microsoft"
# The normalizations with a bias input, and where it is.
BIAS_INPUT = {"SkipLayerNormalization": 4, "SkipSimplifiedLayerNormalization": 3}


@dataclass(frozen=True)
class SkipNormBiasPlan(Plan):
    """The Gemm (without C), the Reshape between as it was, and the normalization with C as its bias."""

    gemm: int
    reshape: int | None
    norm: int
    norm_op: str
    bias: str
    flattened: str | None = None  # x of Reshape(x, [-1, K]) → Gemm → Reshape(·, x's leading dims + [N]), or None

    @property
    def op(self) -> OpKey:
        return (MS_DOMAIN, self.norm_op)

    def emit(self, out: Emitter, name: str) -> list[onnx.NodeProto]:
        view = out.view
        gemm = _copy(view.nodes[self.gemm])  # its name and attributes as they were, C dropped
        del gemm.input[2:]
        nodes = [gemm]
        if self.flattened is not None:
            # the same product on x as it is: the MatMul writes what the unflattening Reshape wrote
            summand = view.nodes[self.reshape].output[0]
            nodes = [onnx.helper.make_node("MatMul", [self.flattened, gemm.input[1]], [summand], name=gemm.name)]
        elif self.reshape is not None:
            nodes.append(_copy(view.nodes[self.reshape]))
        norm = _copy(view.nodes[self.norm])
        at = BIAS_INPUT[norm.op_type]
        while len(norm.input) <= at:
            norm.input.append("")
        norm.input[at] = self.bias
        norm.name = name
        return nodes + [norm]

    def details(self) -> dict[str, object]:
        # moves_only: no op is fused into a new one (what --ort-fusions ranks its fusion sets by)
        return {"bias": self.bias, "moves_only": True, "flattening_dropped": self.flattened is not None}


class GemmBiasIntoSkipNorm:
    """The rule, anchored on the normalization (it knows which of its two summands is the Gemm's)."""

    name = RULE
    anchors: tuple[OpKey, ...] = tuple((MS_DOMAIN, op) for op in BIAS_INPUT)
    # It writes no op the model did not have (its Gemm and its normalization, each where it ran): listed here
    # they would count every Gemm and every SkipLayerNormalization ORT's optimizer wrote as a fused node in
    # the benchmark's placement check, and hold each to the requested provider.
    emits: tuple[OpKey, ...] = ()

    def match(self, view: GraphView, i: int) -> SkipNormBiasPlan | None:
        norm = view.nodes[i]
        at = BIAS_INPUT.get(norm.op_type)
        if norm.domain != MS_DOMAIN or at is None or len(norm.input) < 3:
            return None
        if len(norm.input) > at and norm.input[at]:
            return None  # it has a bias already
        gamma = view.shape(norm.input[2])
        if gamma is None or len(gamma) != 1 or not isinstance(gamma[0], int):
            return None
        for summand in norm.input[:2]:
            found = _biased_gemm(view, summand, i, gamma[0])
            if found is not None:
                gemm, reshape = found
                blocks = {gemm, i} | ({reshape} if reshape is not None else set())
                flattening = _flattening(view, gemm, reshape)
                flattened = None
                if flattening is not None:
                    flatten, flattened = flattening
                    blocks.add(flatten)
                form = f"Gemm(bias){'+Reshape' if reshape is not None else ''}+{norm.op_type}"
                return SkipNormBiasPlan(
                    rule=RULE, form=("Reshape+" if flattened else "") + form,
                    nodes=frozenset(blocks), outputs=tuple(o for o in norm.output if o),
                    name_hint=view.node_name(i), gemm=gemm, reshape=reshape, norm=i, norm_op=norm.op_type,
                    bias=view.nodes[gemm].input[2], flattened=flattened)
        return None


def _biased_gemm(view: GraphView, summand: str, norm: int, hidden: int) -> tuple[int, int | None] | None:
    """(Gemm, Reshape or None) producing ``summand`` for node ``norm`` alone, with a C of shape [hidden]."""
    if view.single_consumer(summand) != norm:
        return None
    i = view.producer.get(summand)
    reshape = None
    if i is not None and is_op(view.nodes[i], "Reshape"):
        reshape, summand = i, view.nodes[i].input[0]
        if view.single_consumer(summand) != reshape:
            return None
        i = view.producer.get(summand)
    if i is None or not is_op(view.nodes[i], "Gemm"):
        return None
    gemm = view.nodes[i]
    if len(gemm.input) != 3 or not gemm.input[2] or float(attr(gemm, "beta", 1.0)) != 1.0:
        return None
    if view.shape(gemm.input[2]) != (hidden,):
        return None
    return i, reshape


def _flattening(view: GraphView, gemm: int, unflatten: int | None) -> tuple[int, str] | None:
    """(the flattening Reshape, x) where the Gemm reads ``Reshape(x, [-1, K])`` for it alone and ``unflatten``
    puts x's leading dimensions back (then ``MatMul(x, B)`` is the same block), else None."""
    node = view.nodes[gemm]
    if unflatten is None or any(int(attr(node, a, d)) != d for a, d in (("transA", 0), ("transB", 0))) \
            or float(attr(node, "alpha", 1.0)) != 1.0:
        return None
    flatten = view.producer.get(node.input[0])
    if flatten is None or not is_op(view.nodes[flatten], "Reshape") or view.single_consumer(node.input[0]) != gemm:
        return None
    x = view.nodes[flatten].input[0]
    weight = view.shape(node.input[1])
    if weight is None or len(weight) != 2 or not isinstance(weight[1], int):
        return None
    ev = Evaluator(view)
    rank = ev.rank(x)
    if rank is None or rank < 3:
        return None
    lead = [ev.dim(x, a) for a in range(rank - 1)]
    product = Dim(1)
    for d in lead:
        product = product * d
    try:
        flat = ev.vec(view.nodes[flatten].input[1]).items
        back = ev.vec(view.nodes[unflatten].input[1]).items
    except NotSymbolic:
        return None
    # A 0 in a target copies the input's dimension unless allowzero; neither target is read with one here.
    if len(flat) != 2 or flat[0] not in (Dim(-1), product) or flat[1] != ev.dim(x, rank - 1):
        return None
    if list(back) != lead + [Dim(weight[1])]:
        return None
    return flatten, x


def _copy(node: onnx.NodeProto) -> onnx.NodeProto:
    made = onnx.NodeProto()
    made.CopyFrom(node)
    return made


__all__ = ["BIAS_INPUT", "GemmBiasIntoSkipNorm", "RULE", "SkipNormBiasPlan"]
