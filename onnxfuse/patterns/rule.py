"""What rules return, and the small algebra they share.

A fusion rule (:class:`FusionRule`) looks at one anchor node and answers one of three things:

* ``None``        — nothing here resembles its form (not a candidate; ``inspect`` stays quiet);
* a :class:`Plan` — the rewrite: which nodes it replaces, which tensors leave the block, and how to
  emit the replacement node(s);
* a :class:`Refusal` — it *is* a candidate, but something forbids the rewrite; the reason says what.

Rules reason on a read-only :class:`~.graph.GraphView` and never edit the graph: the driver
(``onnxfuse.fuse``) applies every plan as one minimal edit, whatever the rule.

Inside a rule, stages may pass their own records (the GELU rule normalises every activation form to one
:class:`Activation` first). Operand order and Mul grouping are not enumerated by hand: :func:`product`
flattens a tree of ``Mul``/``Div``-by-constant/``Pow``-by-integer nodes into one multiset of factors (so
every grouping and operand order of ``0.5·x·(1+erf(x/√2))`` is the same product), and
:func:`operand_orders` generates both orders of a binary commutative node.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import math
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

import ml_dtypes
import numpy as np
import onnx

from ..dtypes import dtype_name
from .graph import ConstantRef, GraphView, is_add, is_op

T = onnx.TensorProto


@dataclass(frozen=True)
class Refusal:
    """A candidate block that is left exactly as it was, and why."""

    rule: str
    reason: str
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Activation:
    """Stage 1 output: one GELU, whatever form it had in the graph, in one canonical shape.

    ``input``/``output`` are the tensors entering and leaving the whole activation (Casts included);
    ``nodes`` are the node indices that make it up; ``bias`` is a bias input the activation op itself adds
    (``BiasGelu``, ``FastGelu`` with bias), to be folded into the Linear.
    """

    form: str
    input: str
    output: str
    nodes: frozenset[int]
    approximate: str  # none | tanh | sigmoid
    alpha: float | None = None  # sigmoid form only
    bias: str | None = None
    upcast: bool = False  # computes in float32 between Cast nodes (fp16/bf16 graphs)
    downcast_to: int | None = None  # the Cast back, when upcast


@dataclass(frozen=True)
class NewTensor:
    """A constant the rewrite creates from an existing one: ``source`` scaled, transposed, reshaped
    and/or converted to ``data_type``.

    Applied at once for inline tensors; for external ones it is deferred to save time, one tensor at a
    time, so weights are never all in memory."""

    name: str  # proposed; the driver keeps names unique
    source: str
    dims: tuple[int, ...]
    data_type: int
    transpose: bool = False
    scale: float | None = None


OpKey = tuple[str, str]  # (domain, op_type); "" is ONNX's default domain


class Emitter(Protocol):
    """What the driver hands to :meth:`Plan.emit`: names and constants for the replacement nodes."""

    view: GraphView

    def name(self, proposal: str) -> str:
        """A node or tensor name not used anywhere in the model (``proposal``, or it suffixed)."""

    def tensor(self, ref: str | NewTensor) -> str:
        """The name to read: ``ref`` itself if it exists, else the derived constant made (once) from it."""

    def initializer(self, proposal: str, value: np.ndarray) -> str:
        """A new small constant holding ``value`` (integer shapes, packed small vectors)."""

    def concatenation(self, proposal: str, parts: Sequence[ConstantRef | np.ndarray], axis: int | None) -> str:
        """A new constant: ``parts`` side by side along ``axis`` (None: each flattened, end to end), stored
        constants each read as stored, or inline values. Joined now where every part is inline; where one is external data, joined while the
        model is saved, so that the weights are never loaded by the rewrite."""

    def declare(self, tensor: str, elem_type: int, dims: list[int | str]) -> None:
        """Records a type and shape an emitted tensor is known to have as the graph's ``value_info``: what
        the runtime's memory planner reads where its own inference loses a dimension (a string is a symbol,
        which states only that the dimension exists)."""

    def shared(self, key: tuple, build: Callable[[], tuple[list[onnx.NodeProto], str]]) -> tuple[list[onnx.NodeProto], str]:
        """A tensor that several blocks of one graph can read (one attention mask for every layer):
        ``build()`` gives the nodes that make it and its name; the first block that asks for ``key`` emits
        them, later blocks placed after it get ``([], name)``."""


@dataclass(frozen=True)
class Plan:
    """One planned rewrite. Rules subclass it with what their replacement needs and implement :meth:`emit`.

    The driver checks the plan is closed (a tensor made by ``nodes`` and not listed in ``outputs`` is
    read by nothing outside the block), puts the emitted nodes where the last of ``nodes`` was (every
    tensor the block reads exists there), removes ``nodes`` and only what that made dead."""

    rule: str  # the rule's name, as reports show it
    form: str  # the source form, for reports ("Gelu(erf)+MatMul+Add")
    nodes: frozenset[int]  # indices (in the view) of every node the rewrite removes
    outputs: tuple[str, ...]  # the block's tensors read outside it: the emitted nodes write exactly these
    name_hint: str  # the emitted node's name derives from it

    # (domain, op_type) of the main node this plan writes (its name comes from name_hint), for reports.
    op: ClassVar[OpKey]

    def emit(self, out: Emitter, name: str) -> list[onnx.NodeProto]:
        """The replacement nodes, in order; ``name`` is the main node's name (unique, from ``name_hint``)."""
        raise NotImplementedError

    def details(self) -> dict[str, object]:
        """Rule-specific report fields (flat, JSON-ready): ``{"approximate": "none"}``."""
        return {}

    @property
    def math_change(self) -> tuple[str, str] | None:
        """(was, now) when the rewrite changes the math on purpose (an option asked for it), else None."""
        return None


class FusionRule(Protocol):
    """One fusion: where a match starts, what it may write, and the matching itself.

    A rule whose anchor is what other rules write (the attention's row guard) sets ``after_rewrites``: the
    driver runs it in a second pass, over the first pass's output (see :func:`after_rewrites`)."""

    name: str
    anchors: tuple[OpKey, ...]  # (domain, op_type) of the nodes a match starts from
    emits: tuple[OpKey, ...]  # (domain, op_type) of every node its plans may write

    def match(self, view: GraphView, i: int) -> Plan | Refusal | None:
        """Look at node ``i`` (one of ``anchors``): a plan, a refusal with its reason, or None."""


def after_rewrites(rule: FusionRule) -> bool:
    """Whether ``rule`` matches the output of the other rules (an optional attribute, False if absent)."""
    return bool(getattr(rule, "after_rewrites", False))


def op_key(node: onnx.NodeProto) -> OpKey:
    """A node's (domain, op_type), with "ai.onnx" spelled as the default domain ""."""
    return ("" if node.domain in ("", "ai.onnx") else node.domain, node.op_type)


# --- constants -------------------------------------------------------------------------------------
_EPS = {
    T.FLOAT: float(np.finfo(np.float32).eps),
    T.FLOAT16: float(np.finfo(np.float16).eps),
    T.BFLOAT16: float(ml_dtypes.finfo(ml_dtypes.bfloat16).eps),
    T.DOUBLE: float(np.finfo(np.float64).eps),
}


def ulp(ref: float, dtype: int) -> float:
    """One unit in the last place of ``dtype`` at the magnitude of ``ref``."""
    eps = _EPS.get(dtype, _EPS[T.FLOAT])
    return eps * 2.0 ** math.floor(math.log2(abs(ref))) if ref else eps


def close_to(value: float, ref: float, dtype: int, ulps: float = 2.0) -> bool:
    """``value`` is ``ref`` as written in ``dtype``: within two units in the last place.

    A literal rounded to its own precision (and a product of two such literals) lands within that; a
    constant that merely resembles ``ref`` (1.414 for √2, 0.7978 for √(2/π) in float32) does not."""
    return abs(value - ref) <= ulps * ulp(ref, dtype)


_NP = {T.FLOAT: np.float32, T.FLOAT16: np.float16, T.BFLOAT16: ml_dtypes.bfloat16, T.DOUBLE: np.float64}


def describe_miss(what: str, value: float, ref: float, ref_text: str, dtype: int) -> str:
    """One refusal line; the value is printed as short as its own precision allows (1.414, not
    1.41400003)."""
    rel = abs(value - ref) / abs(ref) if ref else abs(value)
    shown = str(_NP.get(dtype, np.float64)(value))
    return (f"{what} {shown} is not {ref_text} ({ref:.9g}): off by {rel:.1e} relative, more than the "
            f"rounding of a {dtype_name(dtype)} constant")


# --- products --------------------------------------------------------------------------------------
@dataclass
class Product:
    """A product flattened into factors: non-constant ``leaves`` (tensor names, seen through upcast Casts),
    the product ``const`` of all constant factors, and the ``nodes`` the product spans."""

    leaves: list[str] = field(default_factory=list)
    const: float = 1.0
    const_dtype: int | None = None
    has_const: bool = False
    nodes: set[int] = field(default_factory=set)
    upcast: bool = False  # some leaf was reached through a Cast to float32


def upcast_root(view: GraphView, name: str, nodes: set[int]) -> tuple[str, bool]:
    """``name`` seen through ``Cast(to=float)`` nodes (fp16 graphs wrap GELU in float32 Casts): the tensor
    before the Cast, adding the Cast to ``nodes``. The dtypes are checked once the Linear is known."""
    node_i = view.producer.get(name)
    if node_i is not None and is_op(view.nodes[node_i], "Cast"):
        to = next((a.i for a in view.nodes[node_i].attribute if a.name == "to"), None)
        if to == T.FLOAT:
            nodes.add(node_i)
            return view.nodes[node_i].input[0], True
    return name, False


def product(view: GraphView, name: str) -> Product:
    """Flatten the product that produces ``name``.

    Descends through ``Mul``, ``Div`` by a constant and ``Pow`` by 2 or 3; below the top node only into
    tensors with a single consumer (a shared tensor is a factor, not part of this product)."""
    out = Product()

    def add_const(value: float, dtype: int) -> None:
        out.const *= value
        out.has_const = True
        out.const_dtype = dtype if out.const_dtype is None else out.const_dtype

    def visit(t: str, top: bool) -> None:
        s = view.scalar(t)
        if s is not None:
            add_const(*s)
            return
        i = view.producer.get(t)
        node = view.nodes[i] if i is not None else None
        # (a malformed node of another arity is a factor like any tensor, never an IndexError)
        expandable = node is not None and len(node.input) == 2 and (top or view.single_consumer(t) is not None)
        if expandable and is_op(node, "Mul"):
            out.nodes.add(i)
            for operand in node.input:
                visit(operand, False)
            return
        if expandable and is_op(node, "Div") and view.scalar(node.input[1]) is not None:
            value, dtype = view.scalar(node.input[1])
            if value != 0.0:
                out.nodes.add(i)
                add_const(1.0 / value, dtype)
                visit(node.input[0], False)
                return
        if expandable and is_op(node, "Pow") and view.scalar(node.input[1]) is not None:
            exponent = view.scalar(node.input[1])[0]
            if exponent in (2.0, 3.0):
                out.nodes.add(i)
                for _ in range(int(exponent)):
                    visit(node.input[0], False)
                return
        root, cast = upcast_root(view, t, out.nodes)
        out.upcast |= cast
        out.leaves.append(root)

    visit(name, True)
    return out


def operand_orders(node: onnx.NodeProto):
    """Both operand orders of a binary commutative node: rules are written once, for one order."""
    if len(node.input) != 2:
        return
    a, b = node.input[0], node.input[1]
    yield a, b
    if a != b:
        yield b, a


def climb_products(view: GraphView, start: str, max_levels: int = 4):
    """Yield (output tensor, Product) for each Mul/Div node climbing from ``start`` through single
    consumers: the candidates for "the product that ends this activation", smallest first."""
    current = start
    for _ in range(max_levels):
        i = view.single_consumer(current)
        if i is None:
            return
        node = view.nodes[i]
        if not (is_op(node, "Mul") or (is_op(node, "Div") and node.input[0] == current)):
            return
        current = node.output[0]
        yield current, product(view, current)


# --- pieces every decomposed GELU shares -------------------------------------------------------------
@dataclass(frozen=True)
class OnePlus:
    """``p = 1 + t`` (either operand order): the Add node, its output and its constant."""

    node: int
    output: str
    value: float
    dtype: int


def one_plus(view: GraphView, t: str) -> OnePlus | None:
    """The ``Add(t, c)``/``Add(c, t)`` with a scalar constant ``c`` that reads ``t``, if that is ``t``'s only
    use. (Whether ``c`` is 1 is checked by the caller, so a near-miss is refused with a reason.)"""
    i = view.single_consumer(t)
    if i is None or not is_add(view.nodes[i]):
        return None
    for operand, other in operand_orders(view.nodes[i]):
        if operand == t and view.scalar(other) is not None:
            return OnePlus(i, view.nodes[i].output[0], *view.scalar(other))
    return None


@dataclass(frozen=True)
class Closing:
    """The product that ends an activation: its output tensor and the nodes it spans."""

    output: str
    nodes: frozenset[int]
    upcast: bool


def closing_product(view: GraphView, rule: str, start: str, x: str, ref: float, ref_text: str,
                    involved: tuple[str, ...]) -> Closing | Refusal | None:
    """Climb from ``start`` to the first product equal to ``ref · x · start``.

    None if no product of exactly ``{x, start}`` follows (the shape is not this activation); a Refusal if
    one does but its constant factor only nearly matches ``ref``."""
    miss = None
    for out, prod in climb_products(view, start):
        if sorted(prod.leaves) != sorted([x, start]):
            continue
        const = prod.const if prod.has_const else 1.0
        dtype = prod.const_dtype if prod.const_dtype is not None else T.FLOAT
        if close_to(const, ref, dtype):
            return Closing(out, frozenset(prod.nodes), prod.upcast)
        miss = describe_miss("the constant factor", const, ref, ref_text, dtype)
    if miss is not None:
        return Refusal(rule, miss, involved)
    return None
