"""The Linear that feeds a canonical :class:`Activation`, planned for the fused op (the GELU rule's second stage).

Linear forms: ``MatMul(X, W)`` with an optional ``Add(·, B)`` in either order; ``Gemm(A, B, C)`` with
``transA=0``, ``transB`` 0 or 1 and ``alpha``/``beta`` folded into the constants; either one followed by a
``Reshape`` before the activation (GPT-2's Conv1D: ``Reshape → Gemm → Reshape``). GELU is elementwise, so
the trailing Reshape moves after the fused node and stays in the graph. The tensordot form
(``Reshape(X, [-1, K]) → MatMul → Reshape(X's leading dims + [N]) [→ Add(B)]``, Keras ``Dense`` on a 3-D
input through tf2onnx) is proven from the shape computation and read as a Linear over X itself; without
the Add it is the Reshape form above, absorbed as before.

Weights: a constant W is stored ``[N, K]`` (``transB=1``), transposed once when the model is written. A
non-constant W (computed at run time: tied or quantised weights) is passed as it is, with ``transB`` as
the Linear had it (``0`` for MatMul); the op accepts both layouts. Only a Gemm ``alpha`` cannot be folded
into a non-constant W, so that case is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..domain import SUPPORTED_DTYPES
from .graph import GraphView, attr, is_op, rank_of
from .rule import Activation, NewTensor, Refusal, T, dtype_name, operand_orders

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
        # (a tensordot without a bias after it is this form too: absorbed as it always was)
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
        if linear is None and reshape is None:
            for mm, b in operand_orders(view.nodes[producer]):
                back = view.producer.get(mm)
                if back is None or not is_op(view.nodes[back], "Reshape") or _is_linear(
                        view, view.nodes[back].input[0]) is None:
                    continue
                td = _tensordot(view, back)
                if isinstance(td, str):
                    raise _Refused(f"{act.form} follows Add(bias) after Reshape '{view.node_name(back)}' of a "
                                   f"MatMul output, which is not a tensordot: {td}")
                td.biases.insert(0, (b, 1.0))
                td.nodes.add(producer)
                td.form += "+Add"
                return _with_act_bias(td, act)
        if linear is None:
            for mm, _ in operand_orders(view.nodes[producer]):
                conv = view.producer.get(mm)
                if conv is not None and is_op(view.nodes[conv], "Conv"):
                    raise _Refused(_conv_reason(view, conv, act))
            seen = " and ".join(f"'{t}' ({_what_computes(view, t)})" for t in view.nodes[producer].input[:2])
            raise _Refused(f"{act.form} follows an Add of {seen}, neither a MatMul/Gemm output")
        nodes.add(producer)
    node = view.nodes[linear]
    if is_op(node, "Conv"):
        raise _Refused(_conv_reason(view, linear, act))
    if not any(is_op(node, op) for op in _LINEAR_OPS):
        raise _Refused(f"{act.form} follows a {node.op_type}, not a Linear (MatMul/Gemm)")
    if len(node.input) < 2 or not node.input[1]:
        raise _Refused(f"{node.op_type} '{view.node_name(linear)}' has no weight input")
    nodes.add(linear)
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
    return _with_act_bias(_Linear(linear, node.input[0], node.input[1], trans_b, alpha, biases, nodes, form,
                                  reshape), act)


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


def _with_act_bias(lin: _Linear, act: Activation) -> _Linear:
    if act.bias:
        lin.biases.append((act.bias, 1.0))
    return lin


# --- tensordot: Reshape[-1, K] → MatMul → Reshape(X's leading dims + [N]) ------------------------------
# tf.tensordot (Keras Dense on a 3-D input, through tf2onnx) flattens X to 2-D, multiplies, and restores
# X's leading dims with a shape computed at run time from Shape(X). Proven, it is a Linear over X's last
# axis: the fused node reads X itself (the op takes [..., K]) and both Reshapes leave the block.


def _tensordot(view: GraphView, back: int) -> _Linear | str:
    """The Linear ``back`` (a Reshape of a MatMul/Gemm output) ends, if the three nodes are a tensordot of
    X over its last axis; otherwise what was seen instead."""
    restore = view.nodes[back]
    linear = _is_linear(view, restore.input[0])
    if linear is None or len(restore.input) < 2:
        return f"Reshape '{view.node_name(back)}' does not reshape a MatMul/Gemm output"
    node = view.nodes[linear]
    if len(node.input) < 2 or not node.input[1]:
        return f"{node.op_type} '{view.node_name(linear)}' has no weight input"
    trans_b = int(attr(node, "transB", 0)) if is_op(node, "Gemm") else 0
    if is_op(node, "Gemm") and attr(node, "transA", 0):
        return "Gemm with transA=1 (its activation input is transposed)"
    w_shape = view.shape(node.input[1])
    if w_shape is None or len(w_shape) != 2:
        return f"the weight '{node.input[1]}' is not 2-D"
    n, k = w_shape if trans_b else w_shape[::-1]
    flat_i = view.producer.get(node.input[0])
    if flat_i is None or not is_op(view.nodes[flat_i], "Reshape") or len(view.nodes[flat_i].input) < 2:
        return f"the {node.op_type} input '{node.input[0]}' is not a Reshape of X to [-1, K]"
    flat = view.nodes[flat_i]
    x, target = flat.input[0], _int_list(view.small_value(flat.input[1]))
    if target != [-1, k]:
        return f"Reshape '{view.node_name(flat_i)}' flattens to {_shown(target)}, not [-1, K={k}]"
    rank = rank_of(view, x)
    if rank is None or rank < 2:
        return f"the rank of X '{x}' is {'unknown' if rank is None else rank}"
    # X's last dim need not be known: restoring X's leading dims from the [-1, K] rows only succeeds when
    # the rows are X's leading dims, i.e. when X's last dim is K. A known other one is a different reshape.
    x_shape = view.shape(x) or (None,) * rank
    if isinstance(x_shape[-1], int) and x_shape[-1] != k:
        return (f"X '{x}' has last dim {x_shape[-1]}, not K={k}: the Reshape to [-1, {k}] would mix its "
                "axes")
    restored = _dims(view, restore.input[1], x, rank)
    want = [("dim", i) for i in range(rank - 1)] + [("const", n)]
    got = None if restored is None else [
        ("dim", i) if kind == "const" and i < rank - 1 and x_shape[i] == v else (kind, v)
        for i, (kind, v) in enumerate(restored)]
    if got != want:
        seen = "not computed from Shape(X)" if restored is None else "[" + ", ".join(
            f"X.shape[{v}]" if kind == "dim" else str(v) for kind, v in restored) + "]"
        return (f"Reshape '{view.node_name(back)}' restores {seen}, not X's leading dims and N={n} "
                f"({'[' + ', '.join(f'X.shape[{i}]' for i in range(rank - 1)) + f', {n}]'})")
    alpha = float(attr(node, "alpha", 1.0)) if is_op(node, "Gemm") else 1.0
    biases: list[tuple[str, float]] = []
    if is_op(node, "Gemm") and len(node.input) > 2 and node.input[2] and float(attr(node, "beta", 1.0)) != 0.0:
        biases.append((node.input[2], float(attr(node, "beta", 1.0))))
    return _Linear(linear, x, node.input[1], trans_b, alpha, biases, {linear, back},
                   f"tensordot({node.op_type})", None)


def _int_list(value) -> list[int] | None:
    if value is None or value.ndim != 1 or value.dtype.kind not in "iu":
        return None
    return [int(v) for v in value]


def _shown(values) -> str:
    return "a shape computed at run time" if values is None else str(values)


def _dims(view: GraphView, name: str, x: str, rank: int, depth: int = 0) -> list[tuple[str, int]] | None:
    """A 1-D integer tensor as a list of ("dim", i) (X's i-th dim) and ("const", v) entries, when it is
    computed from ``Shape(X)`` and constants by Cast/Concat/Gather/Slice/Unsqueeze/Squeeze (how exporters
    compute a shape); None otherwise."""
    value = _int_list(view.small_value(name))
    if value is not None:
        return [("const", v) for v in value]
    i = view.producer.get(name)
    if i is None or depth > 16:
        return None
    node = view.nodes[i]
    inputs = list(node.input)
    if is_op(node, "Cast") or is_op(node, "Identity"):  # int32 ↔ int64 round trips (tf2onnx)
        return _dims(view, inputs[0], x, rank, depth + 1)
    if is_op(node, "Shape"):
        if inputs[0] != x:
            return None
        start, end = int(attr(node, "start", 0)), attr(node, "end", None)
        end = rank if end is None else int(end)
        start, end = (start + rank if start < 0 else start), (end + rank if end < 0 else end)
        return [("dim", d) for d in range(max(0, start), min(rank, end))]
    if is_op(node, "Concat"):
        if int(attr(node, "axis", 0)) not in (0, -1):
            return None
        out: list[tuple[str, int]] = []
        for t in inputs:
            part = _dims(view, t, x, rank, depth + 1)
            if part is None:
                return None
            out += part
        return out
    if is_op(node, "Unsqueeze") or is_op(node, "Squeeze"):  # a scalar made 1-D for Concat, or back
        return _dims(view, inputs[0], x, rank, depth + 1)
    src = _dims(view, inputs[0], x, rank, depth + 1) if inputs else None
    if src is None:
        return None
    if is_op(node, "Gather") and int(attr(node, "axis", 0)) == 0 and len(inputs) == 2:
        idx = view.small_value(inputs[1])
        if idx is None or idx.dtype.kind not in "iu" or idx.ndim > 1:
            return None
        picked = []
        for j in idx.reshape(-1):
            j = int(j) + (len(src) if j < 0 else 0)
            if not 0 <= j < len(src):
                return None
            picked.append(src[j])
        return picked
    if is_op(node, "Slice") and len(inputs) >= 3:
        starts, ends = _int_list(view.small_value(inputs[1])), _int_list(view.small_value(inputs[2]))
        axes = _int_list(view.small_value(inputs[3])) if len(inputs) > 3 and inputs[3] else [0]
        steps = _int_list(view.small_value(inputs[4])) if len(inputs) > 4 and inputs[4] else [1]
        if None in (starts, ends, axes, steps) or len(starts) != 1 or axes not in ([0], [-1]) or steps != [1]:
            return None
        return src[slice(max(starts[0], -len(src) - 1), min(ends[0], len(src)))]
    return None


def _plan_weight(view: GraphView, lin: _Linear, n, k) -> tuple[str | NewTensor, int]:
    """(W as the fused node reads it, transB): a constant W becomes ``[N, K]`` with alpha folded in,
    read from the initializer that stores it (not through the Identity/Cast nodes in front of it); a
    run-time W is read as it is."""
    ref = view.constant_ref(lin.w)
    if ref is None:
        if lin.alpha != 1.0:
            raise _Refused(f"Gemm alpha={lin.alpha:g} cannot be folded into the non-constant weight '{lin.w}'")
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
        raise _Refused(f"bias '{b}' is not a constant ({_what_computes(view, b)})")
    # The value the graph adds is the stored one converted to ref.data_type. In the float32 island of an
    # fp16 graph (its activation kept in float32 between Casts) a float32 bias is stored in the Linear's
    # type: the fused node adds it to its float32 accumulator, where the original added it to the
    # float16 MatMul output cast up: one rounding at float16 precision either way.
    if ref.data_type != dtype and not (act.upcast and ref.data_type == T.FLOAT):
        raise _Refused(f"bias '{b}' is {dtype_name(ref.data_type)}, the Linear is {dtype_name(dtype)}")
    dims = ref.dims
    if not isinstance(n, int) or not dims or dims[-1] != n or any(d != 1 for d in dims[:-1]) \
            or len(dims) > out_rank:
        raise _Refused(f"bias '{b}' of shape {list(dims)} does not broadcast over the last axis as [N={n}]")
    stored = ref.tensor.data_type
    # A stored bias of the Linear's type cast up (exactly) to float32 is the bias itself.
    convert = stored != dtype
    if dims == (n,) and beta == 1.0 and not convert:
        return ref.root
    suffix = (".flat" if dims != (n,) else "") + (".beta" if beta != 1.0 else "") + \
        (f".{dtype_name(dtype)}" if convert else "")
    return NewTensor(name=ref.root + suffix, source=ref.root, dims=(n,), data_type=dtype,
                     scale=beta if beta != 1.0 else None)


def _what_computes(view: GraphView, name: str) -> str:
    """What produces a non-constant tensor, for a refusal line."""
    node = view.producer_of(name)
    if node is not None:
        return f"computed by {node.op_type} '{node.name or node.output[0]}'"
    if name in view.graph_inputs:
        return "a graph input"
    return "defined nowhere in this graph"


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
