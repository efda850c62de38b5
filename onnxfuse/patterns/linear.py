"""Stage 2: the one rule that absorbs the Linear feeding a canonical :class:`Activation`.

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

from ..domain import SUPPORTED_DTYPES
from .graph import GraphView, attr, is_op
from .rule import Activation, Fusion, NewTensor, Refusal, dtype_name, operand_orders

RULE = "linear"
_LINEAR_OPS = ("MatMul", "Gemm")


def _is_linear(view: GraphView, name: str) -> int | None:
    i = view.producer.get(name)
    if i is not None and any(is_op(view.nodes[i], op) for op in _LINEAR_OPS):
        return i
    return None


def absorb(view: GraphView, act: Activation) -> Fusion | Refusal:
    """Plan the ``FusedLinearGelu`` node that replaces the Linear feeding ``act`` and ``act`` itself."""
    involved = tuple(view.node_name(i) for i in sorted(act.nodes))

    def refuse(reason: str) -> Refusal:
        return Refusal(RULE, reason, involved)

    nodes = set(act.nodes)
    pre = act.input
    reshape = None
    producer = view.producer.get(pre)
    if producer is not None and is_op(view.nodes[producer], "Reshape"):
        reshape = producer
        nodes.add(reshape)
        pre = view.nodes[producer].input[0]
        producer = view.producer.get(pre)
    if producer is None:
        return refuse(f"{act.form} reads '{pre}', a graph input or constant, not the output of a Linear")

    # Bias: at most one of Add(·, B), Gemm's C and the activation's own bias input.
    biases: list[tuple[str, float]] = []  # (tensor, scale folded into it)
    linear = producer
    if is_op(view.nodes[producer], "Add"):
        linear = None
        for mm, b in operand_orders(view.nodes[producer]):
            linear = _is_linear(view, mm)
            if linear is not None:
                biases.append((b, 1.0))
                break
        if linear is None:
            return refuse(f"{act.form} follows an Add that adds nothing to a MatMul/Gemm output")
        nodes.add(producer)
    node = view.nodes[linear]
    if not any(is_op(node, op) for op in _LINEAR_OPS):
        return refuse(f"{act.form} follows a {node.op_type}, not a Linear (MatMul/Gemm)")
    if len(node.input) < 2 or not node.input[1]:
        return refuse(f"{node.op_type} '{view.node_name(linear)}' has no weight input")
    nodes.add(linear)
    if act.bias:
        biases.append((act.bias, 1.0))

    x, w = node.input[0], node.input[1]
    alpha = 1.0
    if is_op(node, "Gemm"):
        if attr(node, "transA", 0):
            return refuse("Gemm with transA=1 (its activation input is transposed)")
        trans_b = int(attr(node, "transB", 0))
        alpha = float(attr(node, "alpha", 1.0))
        if len(node.input) > 2 and node.input[2]:
            biases.append((node.input[2], float(attr(node, "beta", 1.0))))
        linear_form = "Gemm"
    else:
        trans_b = 0
        linear_form = "MatMul+Add" if is_op(view.nodes[producer], "Add") else "MatMul"
    if reshape is not None:
        leading = view.producer_of(x)
        linear_form = (f"Reshape→{linear_form}→Reshape" if leading is not None and is_op(leading, "Reshape")
                       else f"{linear_form}→Reshape")
    if len(biases) > 1:
        return refuse(f"{act.form} has {len(biases)} biases ({', '.join(b for b, _ in biases)}); the op takes one")

    dtype = view.dtype(w) or view.dtype(x)
    if dtype not in SUPPORTED_DTYPES:
        return refuse(f"dtype {dtype_name(dtype)} is not float, float16 or bfloat16")
    if act.upcast and act.downcast_to != dtype:
        return refuse(f"the activation is cast back to {dtype_name(act.downcast_to)} but the Linear computes "
                      f"in {dtype_name(dtype)}")

    w_shape = view.shape(w)
    if w_shape is None:
        return refuse(f"the rank of weight '{w}' is unknown, so it may be batched")
    if len(w_shape) != 2:
        kind = "batched weight" if len(w_shape) > 2 else "weight"
        return refuse(f"{kind} '{w}' has rank {len(w_shape)}; the op takes a 2-D W")
    x_shape = view.shape(x)
    if x_shape is not None and len(x_shape) < 2:
        return refuse(f"activation input '{x}' has rank {len(x_shape)}; the op takes rank >= 2")
    n, k = w_shape if trans_b else w_shape[::-1]

    w_const = view.constant(w)
    weight: str | NewTensor = w
    if w_const is not None:
        if not trans_b or alpha != 1.0:
            suffix = ".T" if not trans_b else ""
            suffix += ".alpha" if alpha != 1.0 else ""
            weight = NewTensor(name=w + suffix, source=w, dims=(n, k), data_type=w_const.data_type,
                               transpose=not trans_b, scale=alpha if alpha != 1.0 else None)
        trans_b = 1
    elif alpha != 1.0:
        return refuse(f"Gemm alpha={alpha:g} cannot be folded into the non-constant weight '{w}'")

    bias: str | NewTensor | None = None
    if biases:
        b, beta = biases[0]
        b_const = view.constant(b)
        if b_const is None:
            return refuse(f"bias '{b}' is not a constant")
        if b_const.data_type != dtype:
            return refuse(f"bias '{b}' is {dtype_name(b_const.data_type)}, the Linear is {dtype_name(dtype)}")
        dims = tuple(b_const.dims)
        out_rank = max(2, len(x_shape)) if x_shape is not None else 2
        if not isinstance(n, int) or not dims or dims[-1] != n or any(d != 1 for d in dims[:-1]) \
                or len(dims) > out_rank:
            return refuse(f"bias '{b}' of shape {list(dims)} does not broadcast over the last axis as [N={n}]")
        bias = b
        if dims != (n,) or beta != 1.0:
            suffix = (".flat" if dims != (n,) else "") + (".beta" if beta != 1.0 else "")
            bias = NewTensor(name=b + suffix, source=b, dims=(n,), data_type=b_const.data_type,
                             scale=beta if beta != 1.0 else None)

    return Fusion(
        form=f"{act.form}+{linear_form}",
        activation=act,
        nodes=frozenset(nodes),
        x=x,
        weight=weight,
        bias=bias,
        trans_b=trans_b,
        dtype=dtype,
        name_hint=node.name or node.output[0],
        reshape=(reshape, node.output[0]) if reshape is not None else None,
    )

