"""A read-only view of one ONNX graph for matching: who produces a tensor, who consumes it, which tensors are
constants, and what is known of their type and shape.

Rules reason on this view only. It never loads weights: a constant's *value* is read only when it is small
(scalars and short vectors), which is all a GELU or Linear rule ever needs to look at; weights are
described by their dims and dtype alone. A constant is a constant however the graph spells it: an
initializer, a ``Constant`` node, or either one read through ``Identity``, ``Cast``, ``CastLike`` and device-copy
nodes (:meth:`GraphView.constant_ref` says which stored tensor holds it); a one-element value the graph computes
from such constants (``Sqrt(2.0)``) is a scalar too (:meth:`GraphView.folded_scalar`).

Nodes whose output is their input element for element — ``Identity``, ONNX Runtime's device copies
(``MemcpyFromHost``/``MemcpyToHost``) and a ``Cast`` to the type the tensor already has — are seen through
wherever a rule reads values or shapes (:func:`passes_value`, :func:`value_source`): a model ORT saved after
placing it on a GPU provider has copies wherever a tensor crosses between the CPU and the device, and none of
them changes what a rule proves.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

# (what a node reads is defined once, beside the node order built on it; rules import it from here)
from ..graph_order import node_reads, subgraph_references  # noqa: F401

# A constant larger than this is never read by a rule (weights are reasoned about by dims and dtype only).
SMALL_CONSTANT_ELEMENTS = 64

_DEFAULT_DOMAINS = ("", "ai.onnx")

# Identity/Cast nodes followed from a tensor to the constant behind it (a guard against cyclic garbage;
# exporters write one or two).
_MAX_CHAIN = 16

# ONNX Runtime's copies between the host and a device. Its MemcpyTransformer (onnxruntime/core/optimizer/
# transformer_memcpy.cc) adds one, in the default domain and named "Memcpy", "Memcpy_1", ..., wherever a tensor is
# read on another device than the one it is made on: a graph input or a CPU node's output read by a CUDA node
# gets MemcpyFromHost (its output named "<tensor>_CUDAExecutionProvider"), a CUDA node's output read by a CPU node
# MemcpyToHost. The CUDA provider's kernels for both are registered in the default domain
# (cuda_execution_provider.cc); ORT's CPU provider runs them too, as copies. A session with
# ``optimized_model_filepath`` saves them: ORT's transformers optimizer with ``use_gpu=True`` at ``opt_level`` 1
# or more. ONNX has no schema for them, so shape inference types nothing behind one unless it reads them as what
# they are for values, an Identity (``_for_inference``).
DEVICE_COPIES = ("MemcpyFromHost", "MemcpyToHost")

_T = onnx.TensorProto
# Float types by precision: a Cast from one to another at least as wide is exact (changes no value).
_FLOAT_RANK = {_T.FLOAT16: (1, 11), _T.BFLOAT16: (1, 8), _T.FLOAT: (2, 24), _T.DOUBLE: (3, 53)}


def exact_cast(src: int, dst: int) -> bool:
    """A Cast from ``src`` to ``dst`` keeps every value as it is."""
    if src == dst:
        return True
    a, b = _FLOAT_RANK.get(src), _FLOAT_RANK.get(dst)
    return a is not None and b is not None and b[0] >= a[0] and b[1] >= a[1]


@dataclass(frozen=True)
class ConstantRef:
    """A constant tensor ``name`` as the graph reads it, and where its value is stored: ``root`` (an
    initializer or a Constant node's output; ``tensor`` is its TensorProto), converted once to
    ``data_type`` when a Cast is on the way. ``via`` are the Identity/Cast nodes of this graph between the
    two (the rewrite reads ``root`` itself, so they become dead once nothing else reads them)."""

    name: str
    root: str
    tensor: onnx.TensorProto
    data_type: int
    via: tuple[int, ...] = ()

    @property
    def dims(self) -> tuple[int, ...]:
        return tuple(self.tensor.dims)

    @property
    def converts(self) -> bool:
        """The value read differs in type from the stored one (a converted copy is needed to read it)."""
        return self.data_type != self.tensor.data_type


def is_op(node: onnx.NodeProto, op_type: str, domain: str = "") -> bool:
    """``node`` is ``op_type`` of ``domain`` ("" and "ai.onnx" are the same default domain)."""
    if node.op_type != op_type:
        return False
    if domain in _DEFAULT_DOMAINS:
        return node.domain in _DEFAULT_DOMAINS
    return node.domain == domain


def is_add(node: onnx.NodeProto) -> bool:
    """An ``Add``, or a ``Sum`` of two operands, which is the same sum (ONNX's own ``Gelu`` function body
    adds with Sum)."""
    return is_op(node, "Add") or (is_op(node, "Sum") and len(node.input) == 2)


def is_device_copy(node: onnx.NodeProto) -> bool:
    """``node`` is one of ONNX Runtime's host/device copies (:data:`DEVICE_COPIES`)."""
    return node.op_type in DEVICE_COPIES and node.domain in _DEFAULT_DOMAINS


def passes_value(node: onnx.NodeProto, dtype_of) -> bool:
    """``node``'s one output is its one input, element for element, of the same shape and type: an
    ``Identity``, a device copy, or a ``Cast`` to the type its input already has (``dtype_of(name)``: the
    caller's element types, None where unknown; an unknown type is never taken as the same).

    These are what a proof may look through: a value, a shape or a dtype read behind one is the one read in
    front of it."""
    if node.domain not in _DEFAULT_DOMAINS or len(node.input) != 1 or not node.input[0] or len(node.output) != 1:
        return False
    if node.op_type == "Identity" or node.op_type in DEVICE_COPIES:
        return True
    if node.op_type == "Cast":
        to = attr(node, "to")
        return to is not None and to == dtype_of(node.input[0])
    return False


def value_source(view: GraphView, name: str, dtype_of=None, expands=None) -> tuple[str, tuple[int, ...]]:
    """The tensor whose value ``name`` is, read upward through :func:`passes_value` nodes, and those nodes'
    indices (nearest first; empty when ``name``'s producer is no such node). ``dtype_of`` defaults to the
    view's types. With ``expands``, also through each Expand for which ``expands(node)`` is true: an Expand to a
    shape the reader of ``name`` broadcasts the value to anyway (``symbolic.Evaluator.expands_within``), so
    that the reader computes the same from the Expand's input.

    A caller that takes these nodes into a rewritten block reads the source in their place; one that feeds a
    fused op a tensor as it is keeps reading ``name``, where the graph has it (behind a device copy: on the
    device it was copied to)."""
    dtype_of = view.dtype if dtype_of is None else dtype_of
    via: list[int] = []
    while len(via) < _MAX_CHAIN:
        i = view.producer.get(name)
        node = view.nodes[i] if i is not None else None
        if node is None or not (passes_value(node, dtype_of) or (
                expands is not None and is_op(node, "Expand") and expands(node))):
            break
        via.append(i)
        name = node.input[0]
    return name, tuple(via)


def attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _constant_node_tensor(node: onnx.NodeProto) -> onnx.TensorProto | None:
    """The value of a ``Constant`` node as a TensorProto (None for sparse or string values)."""
    for a in node.attribute:
        if a.name == "value":
            return a.t
        if a.name == "value_float":
            return numpy_helper.from_array(np.array(a.f, dtype=np.float32))
        if a.name == "value_floats":
            return numpy_helper.from_array(np.array(list(a.floats), dtype=np.float32))
        if a.name == "value_int":
            return numpy_helper.from_array(np.array(a.i, dtype=np.int64))
        if a.name == "value_ints":
            return numpy_helper.from_array(np.array(list(a.ints), dtype=np.int64))
    return None


def _type_shape(tp: onnx.TypeProto):
    """(elem_type or None, dims or None); a dim is an int, a symbolic name, or None."""
    if not tp.HasField("tensor_type"):
        return None, None
    tt = tp.tensor_type
    elem = tt.elem_type or None
    if not tt.HasField("shape"):
        return elem, None
    dims = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(d.dim_value)
        elif d.HasField("dim_param"):
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return elem, tuple(dims)


class GraphView:
    """Producer/consumer maps and constant lookup over ``graph`` (the main graph of a model).

    ``types`` adds inferred ``ValueInfoProto`` entries (from :func:`infer_types`) to what the graph declares;
    ``base_dir`` is where external data of small constants is read from; ``opset`` is the model's ONNX
    opset (None when unknown), for rules whose emitted ops changed form across opsets.
    """

    def __init__(self, graph: onnx.GraphProto, *, inferred: list[onnx.ValueInfoProto] = (),
                 base_dir: str | None = None, outer: GraphView | None = None, opset: int | None = None):
        self.graph = graph
        self.opset = opset
        self.nodes = list(graph.node)
        self.base_dir = base_dir
        self.outer = outer  # the enclosing graph's view, for a subgraph (If/Loop/Scan body)
        self.producer: dict[str, int] = {}
        self.consumers: dict[str, list[int]] = {}
        for i, node in enumerate(self.nodes):
            for o in node.output:
                if o:
                    self.producer[o] = i
            used = [n for n in node.input if n]
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    used += sorted(subgraph_references(a.g))
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for g in a.graphs:
                        used += sorted(subgraph_references(g))
            for name in dict.fromkeys(used):
                self.consumers.setdefault(name, []).append(i)
        self.graph_inputs = {v.name for v in graph.input}
        self.graph_outputs = {v.name for v in graph.output}
        self.initializers = {t.name: t for t in graph.initializer}
        self._types: dict[str, tuple] = {}
        for v in list(inferred) + list(graph.value_info) + list(graph.input) + list(graph.output):
            elem, dims = _type_shape(v.type)
            known = self._types.get(v.name)
            if dims is None and known is not None and known[1] is not None and elem in (None, known[0]):
                # a declaration of the type alone (ORT's float16 converter writes one for every tensor)
                # says nothing against the shape inference derived from the same graph
                continue
            self._types[v.name] = (elem, dims)

    # --- structure ---------------------------------------------------------------------------------
    def producer_of(self, name: str) -> onnx.NodeProto | None:
        i = self.producer.get(name)
        return None if i is None else self.nodes[i]

    def consumers_of(self, name: str) -> list[int]:
        return self.consumers.get(name, [])

    def escaping_intermediate(self, nodes, outputs) -> tuple[str, int | None] | None:
        """The first tensor that the nodes ``nodes`` make, other than ``outputs``, that something outside them
        sees: (tensor, reading node index), the index None for a graph output; None when the block is closed.

        A ``CastLike`` that reads such a tensor for its type alone (its second input) and whose value only
        flows into the block (onnxscript casts each literal of a GELU to its input's type) does not see it:
        once the block is replaced, nothing reads that CastLike, and the rewrite's dead-code removal drops it."""
        outputs = set(outputs)
        for i in sorted(nodes):
            for out in self.nodes[i].output:
                if not out or out in outputs:
                    continue
                if out in self.graph_outputs:
                    return out, None
                for c in self.consumers_of(out):
                    if c not in nodes and not self._reads_type_only(c, out, nodes):
                        return out, c
        return None

    def _reads_type_only(self, reader: int, tensor: str, nodes) -> bool:
        node = self.nodes[reader]
        return (is_op(node, "CastLike") and len(node.input) == 2 and node.input[0] != tensor
                and node.input[1] == tensor and self._feeds_only(reader, nodes))

    def _feeds_only(self, i: int, nodes, depth: int = 0) -> bool:
        """Every output of node ``i`` is read only by ``nodes``, directly or through nodes that themselves feed
        only ``nodes`` (so ``i`` is dead once they are gone)."""
        if depth > _MAX_CHAIN:
            return False
        for out in self.nodes[i].output:
            if not out:
                continue
            if out in self.graph_outputs or not self.consumers_of(out):
                return False
            if any(c not in nodes and not self._feeds_only(c, nodes, depth + 1) for c in self.consumers_of(out)):
                return False
        return True

    def single_consumer(self, name: str) -> int | None:
        """The index of the only node reading ``name``, if exactly one does and it is not a graph output."""
        users = self.consumers_of(name)
        if len(users) == 1 and name not in self.graph_outputs:
            return users[0]
        return None

    def node_name(self, i: int) -> str:
        node = self.nodes[i]
        return node.name or f"<{node.op_type} #{i}>"

    # --- constants ---------------------------------------------------------------------------------
    def constant_ref(self, name: str) -> ConstantRef | None:
        """Where the value of a constant tensor is stored, however the graph spells the constant: an
        initializer that is not also a graph input (those can be overridden at run time), a ``Constant``
        node, or either one read through ``Identity`` nodes, device copies and ``Cast`` or ``CastLike`` nodes
        (the TorchScript exporter reads merged duplicate initializers through Identity; converters cast stored
        constants; onnxscript's functions cast every literal and weight to their input's type with CastLike,
        read here as a Cast to that type where it is known; ORT copies a constant a CPU node computed to the
        device that reads it).

        A chain is followed only while its value is one conversion of the stored one: every Cast but the
        last must be exact (a float type to one at least as wide), so the value at ``name`` is the root
        converted once to ``data_type`` (which is what a derived constant computes).

        A tensor several ``Constant`` nodes define (or one beside an initializer of its name, which ONNX
        Runtime takes: ``model_io._sort_nodes``) is the last node's value, as ORT reads it; beside a graph
        input of its name it is an initializer ORT lets the caller override, so no constant."""
        via: list[int] = []
        casts: list[int] = []
        current, view = name, self
        for _ in range(_MAX_CHAIN):
            i = view.producer.get(current)
            node = view.nodes[i] if i is not None else None
            if node is not None and is_op(node, "Constant"):
                tensor = _constant_node_tensor(node)
                if tensor is None or current in view.graph_inputs:
                    return None
                return view._ref(name, current, tensor, via, casts)
            if current in view.initializers and current not in view.graph_inputs:
                return view._ref(name, current, view.initializers[current], via, casts)
            to = view._conversion(node)
            if to is not None or (node is not None and (is_op(node, "Identity") or is_device_copy(node))
                                  and len(node.input) == 1 and node.input[0]):
                if view is self:
                    via.append(i)
                if to is not None:
                    casts.append(to)
                current = node.input[0]
                continue
            if view._from_outer_scope(current):
                view = view.outer
                continue
            return None
        return None

    def _conversion(self, node: onnx.NodeProto | None) -> int | None:
        """The type a ``Cast`` (``to``) or ``CastLike`` (its second input's type, where known) converts its
        first input to; None for any other node, or a CastLike of a target type unknown here."""
        if node is None or not node.input or not node.input[0]:
            return None
        if is_op(node, "Cast") and len(node.input) == 1 and attr(node, "to") is not None:
            return int(attr(node, "to"))
        if is_op(node, "CastLike") and len(node.input) == 2 and node.input[1]:
            return self.dtype(node.input[1])
        return None

    @staticmethod
    def _ref(name: str, root: str, tensor: onnx.TensorProto, via: list[int], casts: list[int]) -> ConstantRef | None:
        # casts were collected walking up: the last one applied is casts[0]
        applied = [tensor.data_type, *reversed(casts)]
        if any(not exact_cast(a, b) for a, b in zip(applied[:-2], applied[1:-1])):
            return None  # a rounding Cast before another Cast: not one conversion of the stored value
        return ConstantRef(name=name, root=root, tensor=tensor, data_type=applied[-1], via=tuple(via))

    def constant(self, name: str) -> onnx.TensorProto | None:
        """The stored TensorProto behind a constant tensor (see :meth:`constant_ref`). Its ``data_type``
        is the *stored* type; what the graph reads at ``name`` is :meth:`dtype` (a Cast may convert it)."""
        ref = self.constant_ref(name)
        return None if ref is None else ref.tensor

    def owner(self, name: str) -> GraphView | None:
        """The view of the graph that defines ``name``: this one, an enclosing one, or None."""
        if name in self.producer or name in self.graph_inputs or name in self.initializers:
            return self
        return self.outer.owner(name) if self.outer is not None else None

    def _from_outer_scope(self, name: str) -> bool:
        return (self.outer is not None and name not in self.producer and name not in self.graph_inputs
                and name not in self.initializers)

    def small_value(self, name: str, max_elements: int = SMALL_CONSTANT_ELEMENTS) -> np.ndarray | None:
        """A small constant's value as the graph reads it (converted by the Casts on the way; float64 for
        floating types), or None if not constant or too big."""
        ref = self.constant_ref(name)
        if ref is None or int(np.prod(ref.tensor.dims, dtype=np.int64)) > max_elements:
            return None
        t = ref.tensor
        if t.data_location == onnx.TensorProto.EXTERNAL:
            if self.base_dir is None:
                return None
            copy = onnx.TensorProto()
            copy.CopyFrom(t)
            onnx.external_data_helper.load_external_data_for_tensor(copy, self.base_dir)
            t = copy
        value = numpy_helper.to_array(t)
        if ref.converts:
            value = value.astype(onnx.helper.tensor_dtype_to_np_dtype(ref.data_type))
        if value.dtype.kind == "f" or ref.data_type == onnx.TensorProto.BFLOAT16:
            value = value.astype(np.float64)
        return value

    def scalar(self, name: str) -> tuple[float, int] | None:
        """(value, dtype) of a one-element floating constant of shape ``[]`` or ``[1]``.

        A one-element constant of higher rank (``[1, 1, 1]``) also broadcasts the *rank* of what it
        multiplies: replacing its product by the fused node would change the output's shape, so it is
        not a scalar here."""
        ref = self.constant_ref(name)
        if ref is None:
            folded = self.folded_scalar(name)
            return None if folded is None or folded[2] > 1 else (folded[0], folded[1])
        if len(ref.dims) > 1 or int(np.prod(ref.dims, dtype=np.int64)) != 1:
            return None
        value = self.small_value(name)
        if value is None or value.dtype.kind != "f":
            return None
        return float(value.reshape(-1)[0]), ref.data_type

    def folded_scalar(self, name: str, depth: int = 0) -> tuple[float, int, int] | None:
        """(value, dtype, rank) of a one-element floating tensor the graph computes from constants alone with
        the few ops of ``_FOLDED``: keras2onnx writes GELU's √2 as ``Sqrt(2.0)``, ONNX's own ``Gelu`` function
        body as ``Sqrt(CastLike(2.0, X))``. Each op is computed in float64 and rounded once to its output
        type, which is the correctly rounded result IEEE arithmetic gives for these ops; a rule compares the
        value at its type's precision (``rule.close_to``), never writes it. None where any operand is not
        such a constant, or the result is not finite."""
        ref = self.constant_ref(name)
        if ref is not None:
            if int(np.prod(ref.dims, dtype=np.int64)) != 1:
                return None
            value = self.small_value(name)
            if value is None or value.dtype.kind != "f":
                return None
            return float(value.reshape(-1)[0]), ref.data_type, len(ref.dims)
        node = self.producer_of(name)
        if node is None or depth >= _FOLD_DEPTH or node.domain not in _DEFAULT_DOMAINS or not all(node.input):
            return None
        to = self._conversion(node)
        if to is not None or node.op_type == "Identity":
            operand = self.folded_scalar(node.input[0], depth + 1) if len(node.input) in (1, 2) else None
            return None if operand is None else _rounded(operand[0], to or operand[1], operand[2])
        op = _FOLDED.get(node.op_type)
        if op is None or len(node.input) != op.__code__.co_argcount:
            return None
        operands = [self.folded_scalar(t, depth + 1) for t in node.input]
        if any(o is None for o in operands) or len({o[1] for o in operands}) != 1:
            return None
        with np.errstate(all="ignore"):
            value = float(op(*(np.float64(o[0]) for o in operands)))
        return _rounded(value, operands[0][1], max(o[2] for o in operands))

    # --- types -------------------------------------------------------------------------------------
    def dtype(self, name: str) -> int | None:
        ref = self.constant_ref(name)
        if ref is not None:
            return ref.data_type
        if name in self.initializers:
            return self.initializers[name].data_type
        if name not in self._types and self._from_outer_scope(name):
            return self.outer.dtype(name)
        return self._types.get(name, (None, None))[0]

    def shape(self, name: str) -> tuple | None:
        """Dims of ``name`` (ints, symbolic names or None per dim), or None when even the rank is unknown."""
        ref = self.constant_ref(name)
        if ref is not None:
            return ref.dims
        if name in self.initializers:
            return tuple(self.initializers[name].dims)
        if name not in self._types and self._from_outer_scope(name):
            return self.outer.shape(name)
        return self._types.get(name, (None, None))[1]


# The ops :meth:`GraphView.folded_scalar` computes on one-element constants (in float64, rounded once).
_FOLDED = {
    "Sqrt": lambda a: np.sqrt(a) if a >= 0 else np.nan,
    "Reciprocal": lambda a: 1.0 / a if a else np.nan,
    "Neg": lambda a: -a,
    "Add": lambda a, b: a + b,
    "Sub": lambda a, b: a - b,
    "Mul": lambda a, b: a * b,
    "Div": lambda a, b: a / b if b else np.nan,
}
_FOLD_DEPTH = 8


def _rounded(value: float, dtype: int, rank: int) -> tuple[float, int, int] | None:
    """``value`` rounded once to the float type ``dtype``: (value, dtype, rank), or None if it is not finite
    there or ``dtype`` is no float type."""
    if dtype not in _FLOAT_RANK or not np.isfinite(value):
        return None
    rounded = float(np.array(value, dtype=np.float64).astype(onnx.helper.tensor_dtype_to_np_dtype(dtype)))
    return (rounded, dtype, rank) if np.isfinite(rounded) else None


_RANK_KEEPING = {"Identity", *DEVICE_COPIES, "Cast", "Neg", "Abs", "Sqrt", "Reciprocal", "Exp", "Log", "Erf", "Tanh",
                 "Sigmoid", "Relu", "Gelu", "Softmax", "LayerNormalization", "GlobalAveragePool", "GlobalMaxPool"}
_BROADCASTING = {"Add", "Sub", "Mul", "Div", "Pow", "Where", "Max", "Min"}
_RANK_DEPTH = 64


def rank_of(view: GraphView, name: str, depth: int = 0) -> int | None:
    """The rank of ``name`` where shape inference left it unknown, from the few ops whose output rank
    follows from their inputs': elementwise ops (the largest rank of their operands, all known), and a
    Reshape (the length of its target shape). ONNX's inference stops at a Reshape whose target is
    computed at run time (tf2onnx's tensordot), though the rank it gives is plain."""
    shape = view.shape(name)
    if shape is not None:
        return len(shape)
    node = view.producer_of(name)
    if node is None or depth > _RANK_DEPTH or node.domain not in _DEFAULT_DOMAINS:
        return None
    if node.op_type == "Reshape" and len(node.input) == 2:
        target = view.shape(node.input[1])
        return target[0] if target is not None and len(target) == 1 and isinstance(target[0], int) else None
    if node.op_type in _RANK_KEEPING and node.input:
        return rank_of(view, node.input[0], depth + 1)
    if node.op_type in _BROADCASTING and node.input:
        ranks = [rank_of(view, t, depth + 1) for t in node.input if t]
        return None if None in ranks else max(ranks)
    return None


# ORT's ops whose output (and, for the skip normalisations, the input + skip sum, output 3) has the first
# input's type and shape. ONNX's inference has no schema for them (contrib ops; LayerNormalization below
# opset 17, as ORT's optimizer writes it in the default domain), and types nothing downstream of the first:
# for inference alone they are read as Identity of their first input, so an ORT-optimized model is typed
# to the end (``tune`` reads the rows of every fused node from these types). ORT's device copies
# (DEVICE_COPIES) are read so too.
_ORT_SAME_AS_FIRST = {("com.microsoft", op): outs for op, outs in (
    ("SkipLayerNormalization", (0, 3)), ("SkipSimplifiedLayerNormalization", (0, 3)), ("BiasGelu", (0,)),
    ("FastGelu", (0,)), ("Gelu", (0,)), ("QuickGelu", (0,)))}
_DEFAULT_WITHOUT_SCHEMA_SAME_AS_FIRST = {"LayerNormalization", "SimplifiedLayerNormalization"}


def _default_opset(model: onnx.ModelProto) -> int | None:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)


def _for_inference(node: onnx.NodeProto, opset: int | None) -> list[onnx.NodeProto]:
    """``node`` as shape inference should read it: itself, or for the ops above an Identity of its first
    input per output kept (new node protos; ops with subgraphs are never among them, so the copy's subgraph
    order is the model's)."""
    outs = (0,) if is_device_copy(node) else _ORT_SAME_AS_FIRST.get((node.domain, node.op_type))
    if outs is None and node.domain in ("", "ai.onnx") and node.op_type in _DEFAULT_WITHOUT_SCHEMA_SAME_AS_FIRST \
            and opset is not None:
        try:
            onnx.defs.get_schema(node.op_type, opset, "")
        except onnx.defs.SchemaError:
            outs = (0,)
    if outs is None or not node.input:
        return [node]
    kept = [node.output[k] for k in outs if k < len(node.output) and node.output[k]]
    return [onnx.helper.make_node("Identity", [node.input[0]], [o], name=f"{node.name}/{o}") for o in kept]


def infer_types(model: onnx.ModelProto) -> onnx.GraphProto:
    """Shape inference on a weightless copy of ``model`` (its graph, with the inferred ``value_info`` in it
    and its subgraphs; node for node the model's but for ORT's shape-keeping ops, read as Identities of
    their first input: ``_for_inference``): large initializers become typed graph inputs, so
    this costs as little for a 6 GB model as for a tiny one and never touches external data. Inference
    failures (custom ops without schema, odd models) just leave types unknown; rules then refuse or
    reason without them."""
    light = onnx.ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    g = light.graph
    src = model.graph
    g.name = src.name
    opset = _default_opset(model)
    for n in src.node:
        g.node.extend(_for_inference(n, opset))
    g.input.extend(src.input)
    g.output.extend(src.output)
    g.value_info.extend(src.value_info)
    declared_inputs = {v.name for v in src.input}
    for t in src.initializer:
        small = int(np.prod(t.dims, dtype=np.int64)) <= SMALL_CONSTANT_ELEMENTS
        if small and t.data_location != onnx.TensorProto.EXTERNAL:
            g.initializer.append(t)
        elif t.name not in declared_inputs:
            g.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    try:
        inferred = onnx.shape_inference.infer_shapes(light, data_prop=True)
    except Exception:  # inference is a help, never a requirement
        return light.graph
    return inferred.graph


def base_dir_of(path: str | os.PathLike | None) -> str | None:
    return None if path is None else os.path.dirname(os.path.abspath(path))
