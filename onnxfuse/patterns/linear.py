"""The Linear that feeds a canonical :class:`Activation`, planned for the fused op (the GELU rule's second stage).

Linear forms: ``MatMul(X, W)`` with an optional ``Add(·, B)`` in either order; ``Gemm(A, B, C)`` with
``transA=0``, ``transB`` 0 or 1 and ``alpha``/``beta`` folded into the constants; either one followed by a
``Reshape`` before the activation (GPT-2's Conv1D: ``Reshape → Gemm → Reshape``). GELU is elementwise, so
the trailing Reshape moves after the fused node and stays in the graph.

Weights: a constant W is stored ``[N, K]`` (``transB=1``), transposed once when the model is written. A
non-constant W (computed at run time: tied or quantised weights) is passed as it is, with ``transB`` as
the Linear had it (``0`` for MatMul); the op accepts both layouts. Only a Gemm ``alpha`` cannot be folded
into a non-constant W, so that case is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..domain import SUPPORTED_DTYPES
from .graph import GraphView, attr, is_op
from .rule import Activation, NewTensor, Refusal, T, dtype_name, operand_orders, upcast_root

RULE = "linear"
_LINEAR_OPS = ("MatMul", "Gemm")


def _is_linear(view: GraphView, name: str) -> int | None:
    i = view.producer.get(name)
    if i is not None and any(is_op(view.nodes[i], op) for op in _LINEAR_OPS):
        return i
    return None


class _Refused(Exception):
    """Why the Linear cannot be absorbed (raised by the helpers below, turned into a Refusal by absorb)."""


@dataclass
class _Linear:
    """The Linear found in front of an activation, before any check of its operands."""

    node: int
    x: str
    w: str
    trans_b: int
    alpha: float
    biases: list[tuple[str, float]]  # (tensor, scale to fold into it): Add's B, Gemm's C, the act's own
    nodes: set[int]  # the Linear's nodes (MatMul/Gemm, Add, trailing Reshape)
    form: str
    reshape: int | None


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


def _find_linear(view: GraphView, act: Activation) -> _Linear:
    """The MatMul/Gemm (+Add, +Reshape) that produces ``act``'s input (raises _Refused if none)."""
    nodes: set[int] = set()
    pre, reshape = act.input, None
    producer = view.producer.get(pre)
    if producer is not None and is_op(view.nodes[producer], "Reshape"):
        reshape = producer
        nodes.add(reshape)
        pre = view.nodes[producer].input[0]
        producer = view.producer.get(pre)
    if producer is None:
        raise _Refused(f"{act.form} reads '{pre}', a graph input or constant, not the output of a Linear")
    biases: list[tuple[str, float]] = []
    linear, added = producer, is_op(view.nodes[producer], "Add")
    if added:
        linear = None
        for mm, b in operand_orders(view.nodes[producer]):
            linear = _is_linear(view, mm)
            if linear is not None:
                biases.append((b, 1.0))
                break
        if linear is None:
            raise _Refused(f"{act.form} follows an Add that adds nothing to a MatMul/Gemm output")
        nodes.add(producer)
    node = view.nodes[linear]
    if not any(is_op(node, op) for op in _LINEAR_OPS):
        raise _Refused(f"{act.form} follows a {node.op_type}, not a Linear (MatMul/Gemm)")
    if len(node.input) < 2 or not node.input[1]:
        raise _Refused(f"{node.op_type} '{view.node_name(linear)}' has no weight input")
    nodes.add(linear)
    if act.bias:
        biases.append((act.bias, 1.0))
    trans_b, alpha, form = 0, 1.0, "MatMul+Add" if added else "MatMul"
    if is_op(node, "Gemm"):
        if attr(node, "transA", 0):
            raise _Refused("Gemm with transA=1 (its activation input is transposed)")
        trans_b, alpha, form = int(attr(node, "transB", 0)), float(attr(node, "alpha", 1.0)), "Gemm"
        beta = float(attr(node, "beta", 1.0))
        if len(node.input) > 2 and node.input[2] and beta != 0.0:  # beta=0: C takes no part
            biases.append((node.input[2], beta))
    if reshape is not None:
        leading = view.producer_of(node.input[0])
        form = (f"Reshape→{form}→Reshape" if leading is not None and is_op(leading, "Reshape")
                else f"{form}→Reshape")
    return _Linear(linear, node.input[0], node.input[1], trans_b, alpha, biases, nodes, form, reshape)


def _plan_weight(view: GraphView, lin: _Linear, n, k) -> tuple[str | NewTensor, int]:
    """(W as the fused node reads it, transB): a constant W becomes ``[N, K]`` with alpha folded in; a
    run-time W is read as it is."""
    w_const = view.constant(lin.w)
    if w_const is None:
        if lin.alpha != 1.0:
            raise _Refused(f"Gemm alpha={lin.alpha:g} cannot be folded into the non-constant weight '{lin.w}'")
        return lin.w, lin.trans_b
    if lin.trans_b and lin.alpha == 1.0:
        return lin.w, 1
    suffix = (".T" if not lin.trans_b else "") + (".alpha" if lin.alpha != 1.0 else "")
    return NewTensor(name=lin.w + suffix, source=lin.w, dims=(n, k), data_type=w_const.data_type,
                     transpose=not lin.trans_b, scale=lin.alpha if lin.alpha != 1.0 else None), 1


def _plan_bias(view: GraphView, b: str, beta: float, n, dtype: int, out_rank: int,
               act: Activation) -> str | NewTensor:
    """The bias as an ``[N]`` tensor of the Linear's type (reshaped, beta folded in, when needed)."""
    b_const = view.constant(b)
    if b_const is None and act.upcast:
        # fp16 graphs whose activation op was kept in float32 feed it Cast(bias → float32): the
        # float16 constant before the Cast is the bias itself.
        root, _ = upcast_root(view, b, set())
        if view.constant(root) is not None:
            b, b_const = root, view.constant(root)
    if b_const is None:
        raise _Refused(f"bias '{b}' is not a constant")
    convert = b_const.data_type != dtype
    if convert and not (act.upcast and b_const.data_type == T.FLOAT):
        raise _Refused(f"bias '{b}' is {dtype_name(b_const.data_type)}, the Linear is {dtype_name(dtype)}")
    dims = tuple(b_const.dims)
    if not isinstance(n, int) or not dims or dims[-1] != n or any(d != 1 for d in dims[:-1]) \
            or len(dims) > out_rank:
        raise _Refused(f"bias '{b}' of shape {list(dims)} does not broadcast over the last axis as [N={n}]")
    if dims == (n,) and beta == 1.0 and not convert:
        return b
    # A float32 bias inside the float32 island of an fp16 graph is stored in the Linear's type: the
    # fused node adds it to its float32 accumulator, where the original added it to the float16
    # MatMul output cast up: one rounding at float16 precision either way.
    suffix = (".flat" if dims != (n,) else "") + (".beta" if beta != 1.0 else "") + \
        (f".{dtype_name(dtype)}" if convert else "")
    return NewTensor(name=b + suffix, source=b, dims=(n,), data_type=dtype, scale=beta if beta != 1.0 else None)


def absorb(view: GraphView, act: Activation) -> PlannedLinear | Refusal:
    """Plan the Linear feeding ``act`` for the fused node, or refuse it with the reason."""
    try:
        return _absorb(view, act)
    except _Refused as e:
        return Refusal(RULE, str(e), tuple(view.node_name(i) for i in sorted(act.nodes)))


def _absorb(view: GraphView, act: Activation) -> PlannedLinear:
    lin = _find_linear(view, act)
    if len(lin.biases) > 1:
        raise _Refused(f"{act.form} has {len(lin.biases)} biases ({', '.join(b for b, _ in lin.biases)}); "
                       "the op takes one")

    dtype = view.dtype(lin.w) or view.dtype(lin.x)
    if dtype not in SUPPORTED_DTYPES:
        raise _Refused(f"dtype {dtype_name(dtype)} is not float, float16 or bfloat16")
    if act.upcast and act.downcast_to != dtype:
        raise _Refused(f"the activation is cast back to {dtype_name(act.downcast_to)} but the Linear computes "
                       f"in {dtype_name(dtype)}")

    w_shape, x_shape = view.shape(lin.w), view.shape(lin.x)
    if w_shape is None:
        raise _Refused(f"the rank of weight '{lin.w}' is unknown, so it may be batched")
    if len(w_shape) != 2:
        kind = "batched weight" if len(w_shape) > 2 else "weight"
        raise _Refused(f"{kind} '{lin.w}' has rank {len(w_shape)}; the op takes a 2-D W")
    if x_shape is not None and len(x_shape) < 2:
        raise _Refused(f"activation input '{lin.x}' has rank {len(x_shape)}; the op takes rank >= 2")
    n, k = w_shape if lin.trans_b else w_shape[::-1]

    weight, trans_b = _plan_weight(view, lin, n, k)
    bias = None
    if lin.biases:
        out_rank = max(2, len(x_shape)) if x_shape is not None else 2
        bias = _plan_bias(view, *lin.biases[0], n, dtype, out_rank, act)

    node = view.nodes[lin.node]
    return PlannedLinear(
        form=lin.form,
        nodes=frozenset(lin.nodes),
        x=lin.x,
        weight=weight,
        bias=bias,
        trans_b=trans_b,
        dtype=dtype,
        name_hint=node.name or node.output[0],
        reshape=(lin.reshape, node.output[0]) if lin.reshape is not None else None,
    )
