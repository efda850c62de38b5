"""The Linear that produces a tensor, whatever form the exporter wrote: one matcher for every rule.

:func:`find_linear` reads upward from a tensor and returns a :class:`LinearMatch` (the MatMul/Gemm, what it
multiplies, its weight and scale, the bias terms and the nodes it spans), or raises
:class:`~.match.Refused` with a reason written for the user. It recognises:

* ``MatMul(X, W)``, with an optional ``Add(·, B)`` in either operand order;
* ``Gemm(A, B, C)`` with ``transB`` 0 or 1, ``alpha`` and ``beta`` recorded (``transA=1`` is refused: its
  activation input is transposed), also under an ``Add``;
* either one followed by one ``Reshape`` (GPT-2's Conv1D: ``Reshape → Gemm → Reshape``), kept apart in
  ``reshape``: what the reader may do with it is the caller's business (GELU is elementwise, so the GELU rule
  moves it after the fused node);
* the tensordot ``Reshape(X, [-1, K]) → MatMul → Reshape(X's leading dims + [N]) → Add(B)`` (Keras ``Dense``
  on a 3-D input through tf2onnx), proven from the shape computation and read as a Linear over X itself.
  Without the Add it is the Reshape form above.

The matcher reads structure only, so that every caller sees the same Linear in the same graph. Whether W and
the bias terms are constants, of which shape and type, is for the caller to check, reading them with
:meth:`~.graph.GraphView.constant_ref` (which sees a constant through ``Identity`` and ``Cast`` nodes): the
GELU rule folds ``alpha`` and ``beta`` into new tensors and takes a W computed at run time; the packed
attention projection takes only unscaled constants of the attention's type.

A rule with two Linears calls it twice, a gated MLP ``act(x·Wg) ⊙ (x·Wu)`` for instance::

    gate = find_linear(view, act.input, act.form)
    up = find_linear(view, other_factor, "the gate's other factor")
    if gate.x != up.x: raise Refused("the gate and up projections read different tensors")
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .graph import GraphView, attr, is_op, rank_of
from .match import Refused
from .rule import operand_orders

LINEAR_OPS = ("MatMul", "Gemm")


class NotLinear(Refused):
    """No Linear produces the tensor. ``seen`` are the nodes found in its place (its producer, or the
    producers of the Add's operands), for a caller that names some of them in its own words (the GELU rule
    says why a Conv is not taken)."""

    def __init__(self, reason: str, seen: Sequence[int] = ()):
        super().__init__(reason)
        self.seen = tuple(seen)


@dataclass(frozen=True)
class LinearMatch:
    """The Linear that produces a tensor, before any check of its operands.

    ``biases`` are the bias terms with the scale to fold into each: the Add's B (1.0) first, then Gemm's C
    (``beta``; a C with ``beta=0`` takes no part and is not listed)."""

    node: int  # the MatMul/Gemm
    output: str  # its output, as the Add, the Reshape or the reader reads it
    x: str  # what it multiplies: for the tensordot, X itself (the flattening Reshape is not in ``nodes``)
    w: str
    trans_b: int
    alpha: float
    biases: tuple[tuple[str, float], ...]
    nodes: frozenset[int]  # the MatMul/Gemm, the bias Add, the trailing or restoring Reshape
    form: str  # as reports name it: "MatMul+Add", "Gemm", "Reshape→Gemm→Reshape", "tensordot(MatMul)+Add"
    add: int | None = None  # the bias Add
    reshape: int | None = None  # the Reshape after the Linear, not part of a tensordot
    tensordot: bool = False


def find_linear(view: GraphView, tensor: str, reader: str, *, bias_after: Sequence[str] = LINEAR_OPS,
                sole_reader: bool = False) -> LinearMatch:
    """The Linear that produces ``tensor``, or :class:`~.match.Refused` (:class:`NotLinear` where there is
    none) with the reason.

    ``reader`` names what reads ``tensor`` in those reasons (the GELU rule: its activation's form).
    ``bias_after``: the ops whose output an Add directly after them may take as the Linear's (the packed
    attention projection takes a bias Add after a MatMul only). ``sole_reader``: an Add's operand is taken
    as the Linear's output only where the Add alone reads it."""
    pre, reshape = tensor, None
    producer = view.producer.get(pre)
    if producer is not None and is_op(view.nodes[producer], "Reshape"):
        # (a tensordot without a bias after it is this form too)
        reshape = producer
        pre = view.nodes[producer].input[0]
        producer = view.producer.get(pre)
    if producer is None:
        raise NotLinear(f"{reader} reads '{pre}', a graph input or constant, not the output of a Linear")

    linear, output, add, biases = producer, pre, None, []
    if is_op(view.nodes[producer], "Add"):
        add, linear = producer, None
        # the Add's operands it may take as the Linear's output
        operands = [(mm, b) for mm, b in operand_orders(view.nodes[add])
                    if not sole_reader or view.single_consumer(mm) == add]
        for mm, b in operands:
            linear = _linear_output(view, mm, bias_after)
            if linear is not None:
                output, biases = mm, [(b, 1.0)]
                break
        if linear is None and reshape is None:
            for mm, b in operands:
                back = view.producer.get(mm)
                if back is None or not is_op(view.nodes[back], "Reshape") or _linear_output(
                        view, view.nodes[back].input[0], LINEAR_OPS) is None:
                    continue
                td = _tensordot(view, back)
                if isinstance(td, str):
                    raise Refused(f"{reader} follows Add(bias) after Reshape '{view.node_name(back)}' of a "
                                  f"MatMul output, which is not a tensordot: {td}")
                return _tensordot_with_bias(td, add, b)
        if linear is None:
            seen = [view.producer[mm] for mm, _ in operand_orders(view.nodes[add]) if mm in view.producer]
            summed = " and ".join(f"'{t}' ({what_computes(view, t)})" for t in view.nodes[add].input[:2])
            raise NotLinear(f"{reader} follows an Add of {summed}, neither a MatMul/Gemm output", seen)
    node = view.nodes[linear]
    if not any(is_op(node, op) for op in LINEAR_OPS):
        raise NotLinear(f"{reader} follows a {node.op_type}, not a Linear (MatMul/Gemm)", [linear])
    if len(node.input) < 2 or not node.input[1]:
        raise Refused(f"{node.op_type} '{view.node_name(linear)}' has no weight input")
    trans_b, alpha, form = 0, 1.0, "MatMul+Add" if add is not None else "MatMul"
    if is_op(node, "Gemm"):
        if attr(node, "transA", 0):
            raise Refused("Gemm with transA=1 (its activation input is transposed)")
        trans_b, alpha, form = int(attr(node, "transB", 0)), float(attr(node, "alpha", 1.0)), "Gemm"
        biases += _gemm_c(node)
    if reshape is not None:
        leading = view.producer_of(node.input[0])
        form = (f"Reshape→{form}→Reshape" if leading is not None and is_op(leading, "Reshape")
                else f"{form}→Reshape")
    nodes = {linear} | {i for i in (add, reshape) if i is not None}
    return LinearMatch(node=linear, output=output, x=node.input[0], w=node.input[1], trans_b=trans_b,
                       alpha=alpha, biases=tuple(biases), nodes=frozenset(nodes), form=form, add=add,
                       reshape=reshape)


def _linear_output(view: GraphView, name: str, ops: Sequence[str]) -> int | None:
    """The node making ``name`` when it is one of ``ops``."""
    i = view.producer.get(name)
    if i is not None and any(is_op(view.nodes[i], op) for op in ops):
        return i
    return None


def _gemm_c(node) -> list[tuple[str, float]]:
    """Gemm's C as a bias term scaled by ``beta``; none where there is no C or ``beta=0`` (C takes no part)."""
    beta = float(attr(node, "beta", 1.0))
    return [(node.input[2], beta)] if len(node.input) > 2 and node.input[2] and beta != 0.0 else []


def what_computes(view: GraphView, name: str) -> str:
    """What produces a non-constant tensor, for a refusal line."""
    node = view.producer_of(name)
    if node is not None:
        return f"computed by {node.op_type} '{node.name or node.output[0]}'"
    if name in view.graph_inputs:
        return "a graph input"
    return "defined nowhere in this graph"


# --- tensordot: Reshape[-1, K] → MatMul → Reshape(X's leading dims + [N]) ------------------------------
# tf.tensordot (Keras Dense on a 3-D input, through tf2onnx) flattens X to 2-D, multiplies, and restores
# X's leading dims with a shape computed at run time from Shape(X). Proven, it is a Linear over X's last
# axis: a fused node reads X itself (FusedLinearGelu takes [..., K]) and both Reshapes leave the block.


def _tensordot_with_bias(td: LinearMatch, add: int, bias: str) -> LinearMatch:
    return LinearMatch(node=td.node, output=td.output, x=td.x, w=td.w, trans_b=td.trans_b, alpha=td.alpha,
                       biases=((bias, 1.0), *td.biases), nodes=td.nodes | {add}, form=td.form + "+Add", add=add,
                       tensordot=True)


def _tensordot(view: GraphView, back: int) -> LinearMatch | str:
    """The Linear ``back`` (a Reshape of a MatMul/Gemm output) ends, if the three nodes are a tensordot of
    X over its last axis; otherwise what was seen instead."""
    restore = view.nodes[back]
    linear = _linear_output(view, restore.input[0], LINEAR_OPS)
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
    biases = tuple(_gemm_c(node)) if is_op(node, "Gemm") else ()
    return LinearMatch(node=linear, output=restore.input[0], x=x, w=node.input[1], trans_b=trans_b, alpha=alpha,
                       biases=biases, nodes=frozenset({linear, back}), form=f"tensordot({node.op_type})",
                       tensordot=True)


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
