"""Per-node CUDA path tuning of ``FusedLinearGelu``: the rows each node will see, the fastest path at each,
and the model that records the choice.

The CUDA kernel has three paths for one call, "fused" (one GEMM+bias+GELU kernel), "fallback" (cuBLASLt's GEMM
with its bias epilogue, then the library's activation kernel) and, for calls of at most ``GEMV_MAX_ROWS`` (16)
rows, "gemv" (one kernel that reads W once and accumulates every row in fp32 on the CUDA cores, or on TF32 Tensor
Cores for float32 with 5-16 rows of a large W where the session allows TF32, the epilogue in the same kernel);
with ``cuda_path="auto"`` a node whose ``tuned_device`` is the running device's signature takes ``tuned_paths[i]``
for the first ``M <= tuned_max_rows[i]`` and the last entry beyond (docs/ops.md, "Tuning attributes"). This module
works out what to write there:

1. :func:`tunable_nodes`: every FusedLinearGelu of the main graph, with what its time depends on
   (:class:`NodeShape`: K, N, dtype, transB, the activation), read from its weight and types;
2. :func:`row_counts`: the rows M each node sees at each batch size — X's leading dims multiplied, on the
   model's inputs made concrete by ``--shape``/``--batch`` (``inputs``'s rules, as ``bench`` uses them),
   carried through the graph by shape inference and ``patterns.symbolic`` (which also crosses ORT's
   contrib ops, where onnx's inference stops);
3. :func:`measure_all`: one measurement per distinct (shape, M) — identical nodes share it — through a
   measuring callable (``measure.path_bench`` on a GPU; tests inject numbers);
4. :func:`choose` and :func:`compress`: the fastest path per M (gemv only where it applies), equal
   neighbours merged into one bound, and a gemv entry never last (the last entry also rules beyond it);
5. :func:`apply_tuning`: the output model, with the three attributes on each node and
   ``metadata_props["onnxfuse.tuning"]`` (the device and versions, per node the times and the choice).

Everything here is pure: measuring needs a GPU and lives in ``measure/path_bench.py``; ``onnxfuse/tune.py``
runs the command (reads, measures, writes). :func:`read_tuning` is what ``inspect`` shows of a tuned model.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

import onnx
from onnx import helper

from . import model_io
from .domain import CUDA_PATHS, DEFAULT_SIGMOID_ALPHA, DOMAIN, GEMV_MAX_ROWS, MASKED_SKIP_NORM, OP_TYPE
from .dtypes import dtype_name
from .errors import BadInputError
from .patterns.graph import SMALL_CONSTANT_ELEMENTS, GraphView, attr, infer_types
from .patterns.rule import op_key
from .patterns.symbolic import Evaluator

# The paths a table may name, in the order a tie between their times is settled: the one-kernel path first
# (what a node does without a table, so a tie changes nothing), then the fallback, then gemv. A tie at M <= 16
# going to fused or fallback also lets that entry merge with the larger row counts, which never take gemv:
# the table stays shorter, and only a measured win puts the few-rows path in it.
PATHS = tuple(p for p in CUDA_PATHS if p != "auto")
# The paths that run any number of rows: what the last entry of a table may name (it also rules beyond its bound).
UNBOUNDED_PATHS = tuple(p for p in PATHS if p != "gemv")
METADATA_KEY = "onnxfuse.tuning"
# /2: measurements carry gemv_us (and gemv_note) and tuned_paths may name "gemv"; /1 records (two paths) are
# still read (read_tuning), their measurements as they were written.
SCHEMA = "onnxfuse.tuning/2"
SCHEMAS_READ = ("onnxfuse.tuning/1", SCHEMA)
ATTRIBUTES = ("tuned_device", "tuned_max_rows", "tuned_paths")


@dataclass(frozen=True, order=True)
class NodeShape:
    """What a node's time depends on besides its rows: nodes with equal NodeShapes share one measurement."""

    k: int
    n: int
    dtype: int  # onnx.TensorProto element type
    trans_b: int
    approximate: str
    alpha: float | None = None  # sigmoid form only

    def describe(self) -> str:
        act = self.approximate + (f"(alpha={self.alpha:g})" if self.alpha is not None else "")
        return f"K={self.k} N={self.n} {dtype_name(self.dtype)} transB={self.trans_b} {act}"

    def to_dict(self) -> dict:
        out = {"K": self.k, "N": self.n, "dtype": dtype_name(self.dtype), "transB": self.trans_b,
               "approximate": self.approximate}
        return out | ({"alpha": self.alpha} if self.alpha is not None else {})


@dataclass(frozen=True)
class TunableNode:
    name: str
    x: str  # the activation input, whose leading dims are the rows
    shape: NodeShape
    cuda_path: str  # the node's own cuda_path ("auto" unless forced: a forced node ignores its table)


@dataclass(frozen=True)
class PathTimes:
    """One (shape, M) measured: each path's median in microseconds, and ORT's own unfused MatMul+Add+Gelu
    for reference. ``fallback_us`` is None where the fallback cannot run (no cuBLASLt on this machine),
    ``gemv_us`` where gemv does not apply (M > ``GEMV_MAX_ROWS``) or cannot run (a library without it),
    ``ort_unfused_us`` where ORT has no such kernels for the dtype; the ``*_note`` fields say why."""

    fused_us: float
    fallback_us: float | None
    ort_unfused_us: float | None
    fallback_note: str | None = None
    ort_note: str | None = None
    gemv_us: float | None = None
    gemv_note: str | None = None

    def path_us(self) -> dict[str, float]:
        """The time of each path that ran at this M, in ``PATHS`` order (the tie order)."""
        us = {"fused": self.fused_us, "fallback": self.fallback_us, "gemv": self.gemv_us}
        return {p: us[p] for p in PATHS if us[p] is not None}

    @property
    def choice(self) -> str:
        return choose(self)

    @property
    def best_us(self) -> float:
        """The time of the chosen path: what the node takes at this M once tuned."""
        return self.path_us()[self.choice]

    def to_dict(self) -> dict:
        out = {"fused_us": _round(self.fused_us), "fallback_us": _round(self.fallback_us),
               "gemv_us": _round(self.gemv_us), "ort_unfused_us": _round(self.ort_unfused_us),
               "choice": self.choice}
        notes = (("fallback_note", self.fallback_note), ("gemv_note", self.gemv_note), ("ort_note", self.ort_note))
        return out | {k: v for k, v in notes if v}


def _round(us: float | None) -> float | None:
    return None if us is None else round(us, 3)


@dataclass(frozen=True)
class Device:
    """What the measurements were taken on. ``signature`` is the op library's own string for the device
    (``OnnxfuseCudaDeviceSignature``): the one a node's ``tuned_device`` must equal to be used."""

    signature: str
    gpu: str
    compute_capability: str
    cuda: str  # the CUDA runtime the library was built with (from the signature)
    driver: str | None  # the CUDA version the driver supports
    onnxruntime: str
    onnxfuse: str


Measure = Callable[[NodeShape, int], PathTimes]


def choose(times: PathTimes, among: Sequence[str] = PATHS) -> str:
    """The fastest path at this M of those in ``among`` that ran; on a tie the earlier in ``PATHS`` (see
    there). The one-kernel path always runs, so there is always a choice."""
    us = times.path_us()
    return min((p for p in us if p in among), key=us.__getitem__)


def compress(choices: Sequence[tuple[int, str]], beyond: str | None = None) -> tuple[list[int], list[str]]:
    """(M, path) pairs → the contract's table (``tuned_max_rows`` ascending, ``tuned_paths``): a call with M
    rows takes the path of the first bound ≥ M, the last beyond, so neighbours choosing the same path merge
    into the larger bound. ``[(128, fused), (1024, fused), (4096, fallback)]`` → ``([1024, 4096], [fused,
    fallback])``.

    "gemv" runs at most ``GEMV_MAX_ROWS`` rows, so it may be chosen only there, and the last entry, which
    also rules every M beyond its bound, may not name it: where the largest M chose gemv, one more entry
    follows for the rows above, ``beyond`` (a path of ``UNBOUNDED_PATHS``: the caller's choice among them at
    that largest M), bounded by that M + 1 (any larger bound says the same: the last entry rules beyond it).
    ``ValueError`` for what the contract cannot hold."""
    rows: list[int] = []
    paths: list[str] = []
    for m, path in sorted(choices):
        if path not in PATHS:
            raise ValueError(f"unknown path {path!r}")
        if path == "gemv" and m > GEMV_MAX_ROWS:
            raise ValueError(f"M={m} chose gemv, which runs at most {GEMV_MAX_ROWS} rows")
        if rows and m == rows[-1]:
            raise ValueError(f"M={m} chosen twice")
        if paths and paths[-1] == path:
            rows[-1] = m
        else:
            rows.append(m)
            paths.append(path)
    if paths and paths[-1] not in UNBOUNDED_PATHS:
        if beyond not in UNBOUNDED_PATHS:
            raise ValueError(f"the largest M ({rows[-1]}) chose {paths[-1]}, and the rows beyond it need one of "
                             f"{', '.join(UNBOUNDED_PATHS)} (got {beyond!r})")
        rows.append(rows[-1] + 1)
        paths.append(beyond)
    return rows, paths


def table_of(times: dict[int, PathTimes]) -> tuple[list[int], list[str]]:
    """A node's table from its measurements (M → times): each M's choice, compressed, the rows beyond the
    largest M at the faster path there of those that run any M."""
    if not times:
        return [], []
    return compress([(m, t.choice) for m, t in times.items()], beyond=choose(times[max(times)], UNBOUNDED_PATHS))


# --- what the model holds --------------------------------------------------------------------------
def string_attr(node: onnx.NodeProto, name: str, default: str) -> str:
    value = attr(node, name, default)
    return value.decode() if isinstance(value, bytes) else value


def is_fused(node: onnx.NodeProto) -> bool:
    return op_key(node) == (DOMAIN, OP_TYPE)


def node_key(node: onnx.NodeProto, index: int) -> str:
    """How the metadata names a node: its name, or its position where it has none."""
    return node.name or f"#{index}"


def tunable_nodes(model: onnx.ModelProto, base_dir: str | None = None) -> list[TunableNode]:
    """Every FusedLinearGelu node of the main graph and its NodeShape. ``BadInputError`` when there is none
    (the model was not optimized), or a node's K and N cannot be read (a weight without a static 2-D shape)."""
    view = GraphView(model.graph, inferred=list(infer_types(model).value_info), base_dir=base_dir)
    names = [node_key(n, i) for i, n in enumerate(model.graph.node)]
    fused_names = [names[i] for i, n in enumerate(model.graph.node) if is_fused(n)]
    if len(set(fused_names)) != len(fused_names):
        raise BadInputError(f"{OP_TYPE} node names repeat in the model; tuning records each node by its name")
    nodes = []
    for i, node in enumerate(model.graph.node):
        if not is_fused(node):
            continue
        if len(node.input) < 2:
            raise BadInputError(f"node {names[i]}: {OP_TYPE} needs X and W inputs")
        x, w = node.input[0], node.input[1]
        trans_b = int(attr(node, "transB", 1))
        dims = view.shape(w)
        if dims is None or len(dims) != 2 or not all(isinstance(d, int) and d > 0 for d in dims):
            raise BadInputError(f"node {names[i]}: its weight '{w}' has no static 2-D shape "
                                f"({'unknown' if dims is None else list(dims)}); tuning needs K and N")
        n, k = dims if trans_b else dims[::-1]
        dtype = view.dtype(x) or view.dtype(w)
        if dtype is None:
            raise BadInputError(f"node {names[i]}: the element type of '{x}' and '{w}' is unknown")
        approximate = string_attr(node, "approximate", "none")
        alpha = float(attr(node, "alpha", DEFAULT_SIGMOID_ALPHA)) if approximate == "sigmoid" else None
        nodes.append(TunableNode(names[i], x, NodeShape(int(k), int(n), dtype, trans_b, approximate, alpha),
                                 string_attr(node, "cuda_path", "auto")))
    if not nodes:
        if nested_count(model):
            raise BadInputError(f"the model's {OP_TYPE} nodes are all inside If/Loop/Scan bodies, which tune "
                                "does not reach (their rows depend on the loop)")
        raise BadInputError(f"the model has no {OP_TYPE} node to tune: run `onnxfuse optimize` on it first")
    return nodes


def nested_count(model: onnx.ModelProto) -> int:
    """FusedLinearGelu nodes inside If/Loop/Scan bodies: not tuned (they keep the built-in rule)."""
    return sum(1 for n in model_io.all_nodes(model.graph) if is_fused(n)) - sum(map(is_fused, model.graph.node))


def _concrete(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> onnx.ModelProto:
    """A weightless copy of ``model`` whose inputs have the concrete ``shapes``: the graph node for node,
    small inline constants kept (reshape targets are read from them), every other initializer a typed input."""
    light = onnx.ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    g, src = light.graph, model.graph
    g.name = src.name
    g.node.extend(src.node)
    g.output.extend(src.output)
    initializers = {t.name for t in src.initializer}
    for vi in src.input:
        if vi.name in initializers:
            continue
        concrete = g.input.add()
        concrete.CopyFrom(vi)
        if vi.name in shapes:
            del concrete.type.tensor_type.shape.dim[:]
            for d in shapes[vi.name]:
                concrete.type.tensor_type.shape.dim.add().dim_value = d
    for t in src.initializer:
        small = math.prod(t.dims) <= SMALL_CONSTANT_ELEMENTS
        if small and t.data_location != onnx.TensorProto.EXTERNAL:
            g.initializer.append(t)
        else:
            g.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return light


# Ops whose output has the dims of their first input, in any domain: onnx's shape inference stops at ORT's
# contrib ops and at the ops onnxfuse writes; the rows go on through them.
_SHAPE_OF_FIRST = {"Cast", "Identity", "Dropout", "Relu", "Tanh", "Erf", "Sigmoid", "Neg", "Sqrt", "Softmax",
                   "Gelu", "FastGelu", "BiasGelu", "QuickGelu", "LayerNormalization", "SkipLayerNormalization",
                   "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "RMSNormalization"}
# The skip normalizations: where their input+skip sum comes out (it has the input's dims, as the first output has)
_SKIP_SUMS = {"SkipLayerNormalization": 3, "SkipSimplifiedLayerNormalization": 3, MASKED_SKIP_NORM: 1}
_BROADCASTING = {"Add", "Sub", "Mul", "Div", "Where", "Max", "Min", "Pow"}
_MAX_DEPTH = 400  # ops walked back from one node's input; a transformer layer has a few dozen

Rows = tuple[int, int | None]  # (rows: every dim but the last multiplied, the last dim where known)


def _int_dim(ev: Evaluator, name: str, axis: int) -> int | None:
    d = ev.dim(name, axis)
    return d.coef if d.is_int else None


def _rows(ev: Evaluator, view: GraphView, name: str, memo: dict, depth: int = 0) -> Rows | None:
    """(rows, last dim) of ``name`` where they are known: from the shapes the evaluator carries, else walked
    back through the ops whose output rows follow from their inputs' — elementwise ops and normalisations,
    a MatMul with a 2-D weight, Gemm, FusedLinearGelu, MultiHeadAttention and Attention (the query's rows),
    broadcasting (the operand of most rows) and a Reshape to a known last dim (the element count over it)."""
    if name in memo:
        return memo[name]
    memo[name] = None  # (the graph is sorted, so this only bounds the walk)
    rank = ev.rank(name)
    if rank is not None and rank >= 2:
        lead = [_int_dim(ev, name, a) for a in range(rank - 1)]
        if None not in lead:
            memo[name] = (math.prod(lead), _int_dim(ev, name, rank - 1))
            return memo[name]
    node = view.producer_of(name)
    if node is None or depth > _MAX_DEPTH or not node.input:
        return None
    # the first output, or the input+skip sum of the skip normalisations, has X's dims
    if name != node.output[0] and list(node.output).index(name) != _SKIP_SUMS.get(node.op_type):
        return None

    def of(x: str) -> Rows | None:
        return _rows(ev, view, x, memo, depth + 1) if x else None

    def weight_dim(w: str, axis: int) -> int | None:
        return _int_dim(ev, w, axis) if ev.rank(w) == 2 else None

    op, found = node.op_type, None
    if op in _SKIP_SUMS:  # input and skip have the output's dims: whichever is known
        found = next((r for r in map(of, node.input[:2]) if r is not None), None)
    elif op in _SHAPE_OF_FIRST:
        found = of(node.input[0])
    elif op == "MatMul" and len(node.input) == 2 and ev.rank(node.input[1]) == 2:
        x = of(node.input[0])
        found = x and (x[0], weight_dim(node.input[1], 1))
    elif op == OP_TYPE and len(node.input) >= 2:
        x = of(node.input[0])
        found = x and (x[0], weight_dim(node.input[1], 0 if attr(node, "transB", 1) else 1))
    elif op == "Gemm" and len(node.input) >= 2 and not attr(node, "transA", 0) and ev.rank(node.input[0]) == 2:
        x = of(node.input[0])
        found = x and (x[0], weight_dim(node.input[1], 0 if attr(node, "transB", 0) else 1))
    elif op == "MultiHeadAttention":  # [B, S, D] query → [B, S, v_hidden]
        q = of(node.input[0])
        value = node.input[2] if len(node.input) > 2 else ""
        if value and ev.rank(value) == 4:  # heads [B, N, L, H]: v_hidden = N·H
            heads, size = _int_dim(ev, value, 1), _int_dim(ev, value, 3)
            width = heads * size if heads and size else None
        else:
            v = of(value) if value else None
            width = v[1] if v else None
        found = q and (q[0], width)
    elif op == "Attention":  # com.microsoft, packed weights: [B, S, D_in] · [D_in, 3·D] → [B, S, D]
        x = of(node.input[0])
        packed = weight_dim(node.input[1], 1)
        found = x and (x[0], packed // 3 if packed and not attr(node, "qkv_hidden_sizes", None) else None)
    elif op in _BROADCASTING and node.domain in ("", "ai.onnx"):
        operands = [r for r in map(of, node.input) if r is not None]
        if operands:
            lasts = {r[1] for r in operands} - {None, 1}
            found = (max(r[0] for r in operands), lasts.pop() if len(lasts) == 1 else None)
    elif op == "Reshape" and len(node.input) == 2:
        found = _reshaped(ev, node, of(node.input[0]))
    memo[name] = found
    return found


def _reshaped(ev: Evaluator, node: onnx.NodeProto, source: Rows | None, last: int | None = None) -> Rows | None:
    """A Reshape's (rows, last): the element count over its last dim — the target's where it is a number,
    else ``last`` when the caller knows it (a FusedLinearGelu's X ends in K)."""
    from .patterns.symbolic import NotSymbolic

    if source is None or source[1] is None:
        return None
    try:
        target = ev.vec(node.input[1]).items
    except NotSymbolic:
        target = ()
    if target and target[-1].is_int and target[-1].coef > 0:
        last = target[-1].coef
    if last is None:
        return None
    elements = source[0] * source[1]
    return (elements // last, last) if elements % last == 0 else None


def row_counts(model: onnx.ModelProto, nodes: Sequence[TunableNode], plan: Sequence[tuple[int, dict]],
               base_dir: str | None = None) -> dict[str, dict[int, int]]:
    """For each node, the rows M (X's leading dims multiplied) at each batch of ``plan`` — (batch size,
    concrete input shapes) pairs, as ``measure.model_bench.batch_shapes`` makes them. ``BadInputError`` when
    a node's rows cannot be worked out from the inputs' shapes."""
    rows: dict[str, dict[int, int]] = {node.name: {} for node in nodes}
    for batch, shapes in plan:
        light = _concrete(model, shapes)
        view = GraphView(light.graph, inferred=list(infer_types(light).value_info), base_dir=base_dir)
        ev, memo = Evaluator(view), {}
        for node in nodes:
            found = _rows(ev, view, node.x, memo)
            producer = view.producer_of(node.x)
            if found is None and producer is not None and producer.op_type == "Reshape":
                # GPT-2's Conv1D reshapes to [-1, Shape(x)[-1]]: the last dim is K, whatever the target says
                found = _reshaped(ev, producer, _rows(ev, view, producer.input[0], memo), node.shape.k)
            m = None if found is None else found[0]
            if m is None:
                given = ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in shapes.items())
                raise BadInputError(f"cannot tell how many rows node {node.name} sees at batch {batch} (inputs "
                                    f"{given}): the shape of its input '{node.x}' does not follow from them")
            if m < 1:
                raise BadInputError(f"node {node.name} sees no rows at batch {batch} (its input '{node.x}'); "
                                    "give nonzero sizes with --shape")
            rows[node.name][batch] = m
    return rows


# --- measuring and choosing ------------------------------------------------------------------------
@dataclass
class NodeTuning:
    """One node's result: the rows it sees per batch, the measurements at those rows, and its table."""

    node: TunableNode
    rows: dict[int, int]  # batch -> M
    times: dict[int, PathTimes]  # M -> measured
    max_rows: list[int] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)

    def __post_init__(self):
        if not self.max_rows:
            self.max_rows, self.paths = table_of(self.times)

    def to_dict(self) -> dict:
        return {
            **self.node.shape.to_dict(),
            "cuda_path": self.node.cuda_path,
            "rows": {str(b): m for b, m in sorted(self.rows.items())},
            "measurements": [{"M": m, **t.to_dict()} for m, t in sorted(self.times.items())],
            "tuned_max_rows": list(self.max_rows),
            "tuned_paths": list(self.paths),
        }


Measured = dict[tuple[NodeShape, int], PathTimes]


def measure_all(nodes: Sequence[TunableNode], rows: dict[str, dict[int, int]], measure: Measure,
                on_measured: Callable[[], None] | None = None) -> list[NodeTuning]:
    """Measure each distinct (NodeShape, M) once, in :func:`wanted`'s order, and give every node its table."""
    return node_tunings(nodes, rows, measure_each(wanted(nodes, rows), measure, on_measured))


def measure_each(keys: Sequence[tuple[NodeShape, int]], measure: Measure,
                 on_measured: Callable[[], None] | None = None) -> Measured:
    """One measurement per (NodeShape, M) of ``keys``, in their order."""
    measured: Measured = {}
    for shape, m in keys:
        measured[(shape, m)] = measure(shape, m)
        if on_measured is not None:
            on_measured()
    return measured


def node_tunings(nodes: Sequence[TunableNode], rows: dict[str, dict[int, int]], measured: Measured) -> list[NodeTuning]:
    """Every node's table from the measurements of its NodeShape at its rows."""
    return [NodeTuning(node, dict(rows[node.name]), {m: measured[(node.shape, m)] for m in rows[node.name].values()})
            for node in nodes]


def wanted(nodes: Sequence[TunableNode], rows: dict[str, dict[int, int]]) -> list[tuple[NodeShape, int]]:
    """The distinct (NodeShape, M) to measure, sorted: identical nodes share one measurement."""
    return sorted({(node.shape, m) for node in nodes for m in rows[node.name].values()})


# --- writing ---------------------------------------------------------------------------------------
def tuning_record(tunings: Sequence[NodeTuning], device: Device, plan: Sequence[tuple[int, dict]],
                  settings: dict, approximation: dict | None = None) -> dict:
    """What ``metadata_props["onnxfuse.tuning"]`` holds: the device and versions the numbers were measured
    under, how (batches, input shapes, timing settings), and per node its measurements and choices; with
    ``tune --approximate auto``, under "approximation", the GELU form chosen per node, its times and the
    model's measured error (``approximation.approximation_record``: also what undoes the choice when the
    model is tuned again)."""
    record = {
        "schema": SCHEMA,
        "device": asdict(device),
        "batches": [b for b, _ in plan],
        "input_shapes": {str(b): {k: list(v) for k, v in shapes.items()} for b, shapes in plan},
        "settings": settings,
        "nodes": {t.node.name: t.to_dict() for t in tunings},
    }
    return record | ({"approximation": approximation} if approximation is not None else {})


def apply_tuning(model: onnx.ModelProto, tunings: Sequence[NodeTuning], record: dict) -> onnx.ModelProto:
    """A copy of ``model`` with each tuned node's ``tuned_device``/``tuned_max_rows``/``tuned_paths`` (an
    earlier tuning's replaced) and ``metadata_props["onnxfuse.tuning"]`` set to ``record``. Pure: ``model``
    is not changed; nothing else differs."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    by_name = {t.node.name: t for t in tunings}
    signature = record["device"]["signature"]
    for i, node in enumerate(out.graph.node):
        tuning = by_name.get(node_key(node, i)) if is_fused(node) else None
        if tuning is None:
            continue
        for j in reversed(range(len(node.attribute))):
            if node.attribute[j].name in ATTRIBUTES:
                del node.attribute[j]
        node.attribute.extend([helper.make_attribute("tuned_device", signature),
                               helper.make_attribute("tuned_max_rows", list(tuning.max_rows)),
                               helper.make_attribute("tuned_paths", list(tuning.paths))])
    for j in reversed(range(len(out.metadata_props))):
        if out.metadata_props[j].key == METADATA_KEY:
            del out.metadata_props[j]
    out.metadata_props.add(key=METADATA_KEY, value=json.dumps(record, sort_keys=True, separators=(",", ":")))
    return out


# --- reading ---------------------------------------------------------------------------------------
def read_record(model: onnx.ModelProto) -> tuple[dict | None, str | None]:
    """``metadata_props["onnxfuse.tuning"]`` as written by :func:`apply_tuning`, or None and why not
    (None, None: the model has none)."""
    record, note = None, None
    for prop in model.metadata_props:
        if prop.key == METADATA_KEY:
            try:
                record = json.loads(prop.value)
                if not isinstance(record, dict):
                    raise ValueError("not an object")
            except ValueError as e:
                record, note = None, f"metadata_props[{METADATA_KEY!r}] is not a tuning record ({e})"
    return record, note


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}


def read_tuning(model: onnx.ModelProto) -> dict | None:
    """What ``inspect`` shows of a tuned model: per node with a table its ``tuned_device``, bounds and paths
    (and its measurements where the metadata has them, and the GELU form ``tune --approximate auto`` chose),
    the device the metadata records and the approximation's budget and measured error. None when no node
    has a table. Records of every schema in ``SCHEMAS_READ`` are read; their measurements are shown as
    written (a /1 record's have no ``gemv_us``: gemv was not measured then)."""
    record, note = read_record(model)
    schema = _dict(record).get("schema")
    if record is not None and note is None and schema not in SCHEMAS_READ:
        note = (f"metadata_props[{METADATA_KEY!r}] has schema {schema!r}, which this onnxfuse does not know "
                f"(it reads {', '.join(SCHEMAS_READ)}): shown as recorded")
    recorded = _dict(_dict(record).get("nodes"))
    approximation = _dict(_dict(record).get("approximation"))
    forms = _dict(approximation.get("nodes"))
    nodes = []
    for i, node in enumerate(model.graph.node):
        if not is_fused(node) or not any(a.name in ATTRIBUTES for a in node.attribute):
            continue
        name = node_key(node, i)
        entry = {"node": name, "cuda_path": string_attr(node, "cuda_path", "auto"),
                 "tuned_device": string_attr(node, "tuned_device", ""),
                 "tuned_max_rows": [int(v) for v in attr(node, "tuned_max_rows", [])],
                 "tuned_paths": [p.decode() if isinstance(p, bytes) else p for p in attr(node, "tuned_paths", [])]}
        if isinstance(recorded.get(name), dict):
            entry["measurements"] = recorded[name].get("measurements", [])
        if isinstance(forms.get(name), dict):
            entry["approximation"] = forms[name]
        nodes.append(entry)
    if not nodes:
        return None
    device = record.get("device") if isinstance(record, dict) else None
    summary = {k: v for k, v in approximation.items() if k != "nodes"}
    return ({"device": device, "nodes": nodes} | ({"approximation": summary} if summary else {})
            | ({"note": note} if note else {}))
