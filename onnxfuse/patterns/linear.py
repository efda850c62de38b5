"""The Linear that feeds a canonical :class:`Activation`, planned for the fused op (the GELU rule's second stage).

The Linear is found by the shared matcher (:func:`~.linear_match.find_linear`: ``MatMul`` [+ ``Add``],
``Gemm``, either one followed by a ``Reshape``, the tensordot); what is particular to the fused node is
checked and planned here. GELU is elementwise, so a trailing Reshape (GPT-2's Conv1D: ``Reshape → Gemm →
Reshape``) moves after the fused node and stays in the graph; a tensordot is read as a Linear over X itself.
The activation's own bias (``BiasGelu``, ``FastGelu`` with bias) joins the Linear's bias terms: the op takes
one constant, ``[N]`` or broadcast as ``[N]`` over the last axis, of the Linear's type (or float32 where the
activation computes in float32 between Casts). A Conv in the Linear's place is named with why it is not one (a
channel-first 1x1 Conv is a Linear over another axis).

Weights: a constant W is stored ``[N, K]`` (``transB=1``), transposed once when the model is written, with
Gemm's ``alpha`` folded in (and ``beta`` into the bias). A non-constant W (computed at run time: tied or
quantised weights) is passed as it is, with ``transB`` as the Linear had it (``0`` for MatMul); the op accepts
both layouts. Only a Gemm ``alpha`` cannot be folded into a non-constant W, so that case is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..domain import SUPPORTED_DTYPES
from .graph import GraphView, attr, is_op
from .linear_match import LinearMatch, NotLinear, find_linear, what_computes
from .match import Refused
from .rule import Activation, NewTensor, Refusal, T, dtype_name

RULE = "linear"


@dataclass(frozen=True)
class PlannedLinear:
    """The Linear in front of an activation, checked and planned for the fused node: what it reads (X, W as
    ``[N, K]`` or as given, the ``[N]`` bias) and the nodes it spans."""

    form: str
    nodes: frozenset[int]  # the Linear's nodes (MatMul/Gemm, bias Add, trailing Reshape)
    x: str
    weight: str | NewTensor  # an existing tensor, or one to create ([N, K] from [K, N], alpha folded in)
    bias: str | NewTensor | None  # an existing [N] tensor, or one to create (reshaped to [N], beta folded in)
    trans_b: int
    dtype: int
    name_hint: str  # the Linear node's name: the fused node's name derives from it
    # Reshape→Gemm→Reshape: the trailing Reshape is kept and moved after the fused node (GELU is
    # elementwise, so it commutes with a Reshape); (node index, fused output name).
    reshape: tuple[int, str] | None = None


def _find_linear(view: GraphView, act: Activation) -> LinearMatch:
    """The Linear that produces ``act``'s input (raises Refused if none); a Conv in its place is named."""
    try:
        return find_linear(view, act.input, act.form)
    except NotLinear as e:
        conv = next((i for i in e.seen if is_op(view.nodes[i], "Conv")), None)
        if conv is None:
            raise
        raise Refused(_conv_reason(view, conv, act)) from None


def _conv_reason(view: GraphView, i: int, act: Activation) -> str:
    """Why a Conv before the activation is not absorbed. A 1x1, stride-1, unpadded, ungrouped Conv on a
    channel-first tensor (timm ConvNeXt's ``conv_mlp``) is a Linear, but over axis 1: said as such, since
    the op reduces over the last axis."""
    conv = view.nodes[i]
    w = view.shape(conv.input[1]) if len(conv.input) > 1 else None
    spatial = tuple(w[2:]) if w is not None else None
    pointwise = (spatial is not None and len(spatial) >= 1 and all(d == 1 for d in spatial)
                 and int(attr(conv, "group", 1)) == 1
                 and all(v == 1 for v in attr(conv, "strides", []) or [1])
                 and all(v == 1 for v in attr(conv, "dilations", []) or [1])
                 and all(v == 0 for v in attr(conv, "pads", []) or [0])
                 and attr(conv, "auto_pad", b"NOTSET") in (b"NOTSET", b"VALID", "NOTSET", "VALID"))
    name = view.node_name(i)
    if pointwise:
        kernel = "x".join("1" for _ in spatial)
        return (f"{act.form} follows the {kernel} Conv '{name}', a Linear over axis 1 (channels first), not the "
                "last axis: FusedLinearGelu reduces over the last axis, so it is not fused")
    kernel = "x".join(str(d) for d in spatial) if spatial else "unknown"
    return f"{act.form} follows Conv '{name}' (kernel {kernel}), not a Linear (MatMul/Gemm)"


def _plan_weight(view: GraphView, lin: LinearMatch, n, k) -> tuple[str | NewTensor, int]:
    """(W as the fused node reads it, transB): a constant W becomes ``[N, K]`` with alpha folded in,
    read from the initializer that stores it (not through the Identity/Cast nodes in front of it); a
    run-time W is read as it is."""
    ref = view.constant_ref(lin.w)
    if ref is None:
        if lin.alpha != 1.0:
            raise Refused(f"Gemm alpha={lin.alpha:g} cannot be folded into the non-constant weight '{lin.w}'")
        return lin.w, lin.trans_b
    if lin.trans_b and lin.alpha == 1.0 and not ref.converts:
        return ref.root, 1
    suffix = (".T" if not lin.trans_b else "") + (".alpha" if lin.alpha != 1.0 else "") + \
        (f".{dtype_name(ref.data_type)}" if ref.converts else "")
    return NewTensor(name=ref.root + suffix, source=ref.root, dims=(n, k), data_type=ref.data_type,
                     transpose=not lin.trans_b, scale=lin.alpha if lin.alpha != 1.0 else None), 1


def _plan_bias(view: GraphView, b: str, beta: float, n, dtype: int, out_rank: int,
               act: Activation) -> str | NewTensor:
    """The bias as an ``[N]`` tensor of the Linear's type (reshaped, converted, beta folded in, when
    needed), read from the initializer that stores it."""
    ref = view.constant_ref(b)
    if ref is None:
        raise Refused(f"bias '{b}' is not a constant ({what_computes(view, b)})")
    # The value the graph adds is the stored one converted to ref.data_type. In the float32 island of an
    # fp16 graph (its activation kept in float32 between Casts) a float32 bias is stored in the Linear's
    # type: the fused node adds it to its float32 accumulator, where the original added it to the
    # float16 MatMul output cast up: one rounding at float16 precision either way.
    if ref.data_type != dtype and not (act.upcast and ref.data_type == T.FLOAT):
        raise Refused(f"bias '{b}' is {dtype_name(ref.data_type)}, the Linear is {dtype_name(dtype)}")
    dims = ref.dims
    if not isinstance(n, int) or not dims or dims[-1] != n or any(d != 1 for d in dims[:-1]) \
            or len(dims) > out_rank:
        raise Refused(f"bias '{b}' of shape {list(dims)} does not broadcast over the last axis as [N={n}]")
    stored = ref.tensor.data_type
    # A stored bias of the Linear's type cast up (exactly) to float32 is the bias itself.
    convert = stored != dtype
    if dims == (n,) and beta == 1.0 and not convert:
        return ref.root
    suffix = (".flat" if dims != (n,) else "") + (".beta" if beta != 1.0 else "") + \
        (f".{dtype_name(dtype)}" if convert else "")
    return NewTensor(name=ref.root + suffix, source=ref.root, dims=(n,), data_type=dtype,
                     scale=beta if beta != 1.0 else None)


def absorb(view: GraphView, act: Activation) -> PlannedLinear | Refusal:
    """Plan the Linear feeding ``act`` for the fused node, or refuse it with the reason."""
    try:
        return _absorb(view, act)
    except Refused as e:
        return e.as_refusal(RULE, [view.node_name(i) for i in sorted(act.nodes)])


def _absorb(view: GraphView, act: Activation) -> PlannedLinear:
    lin = _find_linear(view, act)
    biases = [*lin.biases, *([(act.bias, 1.0)] if act.bias else [])]  # BiasGelu/FastGelu add their own
    if len(biases) > 1:
        raise Refused(f"{act.form} has {len(biases)} biases ({', '.join(b for b, _ in biases)}); "
                      "the op takes one")

    dtype = view.dtype(lin.w) or view.dtype(lin.x)
    if dtype not in SUPPORTED_DTYPES:
        raise Refused(f"dtype {dtype_name(dtype)} is not float, float16 or bfloat16")
    if act.upcast and act.downcast_to != dtype:
        raise Refused(f"the activation is cast back to {dtype_name(act.downcast_to)} but the Linear computes "
                      f"in {dtype_name(dtype)}")

    w_shape, x_shape = view.shape(lin.w), view.shape(lin.x)
    if w_shape is None:
        raise Refused(f"the rank of weight '{lin.w}' is unknown, so it may be batched")
    if len(w_shape) != 2:
        kind = "batched weight" if len(w_shape) > 2 else "weight"
        raise Refused(f"{kind} '{lin.w}' has rank {len(w_shape)}; the op takes a 2-D W")
    if x_shape is not None and len(x_shape) < 2:
        raise Refused(f"activation input '{lin.x}' has rank {len(x_shape)}; the op takes rank >= 2")
    n, k = w_shape if lin.trans_b else w_shape[::-1]

    weight, trans_b = _plan_weight(view, lin, n, k)
    bias = None
    if biases:
        out_rank = max(2, len(x_shape)) if x_shape is not None else 2
        bias = _plan_bias(view, *biases[0], n, dtype, out_rank, act)

    node = view.nodes[lin.node]
    return PlannedLinear(
        form=lin.form,
        nodes=lin.nodes,
        x=lin.x,
        weight=weight,
        bias=bias,
        trans_b=trans_b,
        dtype=dtype,
        name_hint=node.name or node.output[0],
        reshape=(lin.reshape, node.output[0]) if lin.reshape is not None else None,
    )
