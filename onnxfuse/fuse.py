"""The pass driver: run every fusion rule on its anchors, check each plan, apply all plans as one minimal edit.

The driver knows no fusion by name. A rule (``patterns.rule.FusionRule``) answers for one anchor node
with a ``Plan`` (which nodes it replaces, which tensors leave the block, how to emit the replacement), a
``Refusal`` (the reason a candidate stays as it is) or None; the driver checks that each plan is closed
(nothing outside the block sees its intermediates) and does not overlap an earlier one, then rewrites.

Why the edit is made on the proto and not by exporting an onnx-graphsurgeon graph: the output must keep
everything the rewrite does not touch exactly as it was, and optimizing twice must give the same bytes.
A graphsurgeon round trip does not: ``export_onnx`` rebuilds the model with ``make_model`` (dropping
``metadata_props``, ``doc_string``, ``model_version``, ``domain``), re-derives ``value_info`` from every
typed tensor, re-orders initializers by graph traversal; ``toposort`` re-levels untouched nodes; and
``cleanup`` also deletes dead nodes and initializers the model had before we came. So the rules plan on a
read-only view (``patterns.graph.GraphView``) and this module applies the plans: matched nodes leave the
node list, the emitted nodes take the place of the last of them (a position where all their inputs already
exist), and only what the rewrite itself made dead is removed — traced backwards from the inputs of the
replaced nodes, never by a hand-kept list. The main graph is rewritten first, then every If/Loop/Scan
body (whose blocks may read weights of the enclosing graph).

Two passes: a rule whose anchors are what other rules write (``after_rewrites``: the attention's row guard
folded into the normalization behind it) runs over the first pass's output, not beside the rules it
depends on; the second pass runs only where the first one wrote such an anchor.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from . import cost_model, deferred, domain, model_io, model_save  # noqa: F401  (importing domain registers the FusedLinearGelu schema)
from .deferred import Deferred
from .domain import EMITTED_DOMAIN_VERSIONS
from .errors import BadInputError
from .graph_order import node_reads, stable_order
from .patterns import APPROXIMATIONS, FusionRule, NewTensor, Plan, Refusal, default_rules
from .patterns.graph import SMALL_CONSTANT_ELEMENTS, ConstantRef, GraphView, infer_types
from .patterns.rule import after_rewrites, op_key
from .report import FusedBlock, MathChange, RefusedBlock, Report


@dataclass
class FuseResult:
    model: onnx.ModelProto
    report: Report
    # New external tensors: name → how to compute their bytes from their sources' (deferred.py).
    derived: dict[str, Deferred] = field(default_factory=dict)
    # The folder the model's external data lives in (None for inline models).
    source_dir: str | None = None

    def save(self, path, *, check: bool = True, before_publish=None, input_checker_error: str | None = None) -> None:
        """Write the fused model (atomically, external data streamed): the one correct way to save it,
        since transposed external weights only exist once written. ``before_publish`` and
        ``input_checker_error``: see ``model_save.save_model``."""
        model_save.save_model(self.model, path, source_dir=self.source_dir, derived=self.derived, check=check,
                              before_publish=before_publish, input_checker_error=input_checker_error)


# --- finding ---------------------------------------------------------------------------------------
def _rules_by_anchor(rules: tuple[FusionRule, ...]) -> dict[tuple[str, str], list[FusionRule]]:
    table: dict[tuple[str, str], list[FusionRule]] = {}
    for rule in rules:
        for anchor in rule.anchors:
            table.setdefault(anchor, []).append(rule)
    return table


def _closed(view: GraphView, plan: Plan) -> Plan | Refusal:
    """The block may only be replaced if nothing outside it sees its intermediates: every tensor its nodes
    make, except the block's own outputs (which the emitted nodes write), is read inside it alone."""
    escape = view.escaping_intermediate(plan.nodes, plan.outputs)
    if escape is None:
        return plan
    out, reader = escape
    maker = view.node_name(view.producer[out])
    if reader is None:
        return Refusal("single-use", f"intermediate '{out}' is a graph output", (maker,))
    return Refusal("single-use", f"intermediate '{out}' is also read by {view.node_name(reader)}",
                   (maker, view.node_name(reader)))


def find_blocks(view: GraphView, rules: tuple[FusionRule, ...] | None = None,
                target: cost_model.Target | None = None) -> list[Plan | Refusal]:
    """Every candidate block in node order: a Plan, or the Refusal that keeps it as it is. On each node the
    first rule (in ``rules`` order) that answers decides; a closed plan is then reviewed by ``target``'s
    cost model (None: every plan pays), and one that does not pay there claims no node; a plan sharing a
    node with an earlier one is refused."""
    table = _rules_by_anchor(default_rules() if rules is None else rules)
    results: list[Plan | Refusal] = []
    claimed: set[int] = set()
    for i, node in enumerate(view.nodes):
        if not node.input or not node.input[0] or not node.output or not node.output[0]:
            continue  # every anchor reads a tensor and writes one; a malformed node is no candidate
        for rule in table.get(op_key(node), ()):
            result = rule.match(view, i)
            if result is None:
                continue
            if isinstance(result, Plan):
                result = _closed(view, result)
            if isinstance(result, Plan) and target is not None:
                result = cost_model.review(target, view, result)
            if isinstance(result, Plan):
                if result.nodes & claimed:
                    result = Refusal("overlap", "shares nodes with a block fused before it",
                                     tuple(view.node_name(j) for j in sorted(result.nodes)))
                else:
                    claimed |= result.nodes
            results.append(result)
            break
    return results


# --- applying --------------------------------------------------------------------------------------
class _Names:
    """Deterministic unique names: a proposal is kept unless taken, then suffixed _1, _2, ..."""

    def __init__(self, taken: set[str]):
        self.taken = set(taken)

    def claim(self, proposal: str) -> str:
        name, k = proposal, 0
        while name in self.taken:
            k += 1
            name = f"{proposal}_{k}"
        self.taken.add(name)
        return name


def _materialize(view: GraphView, nt: NewTensor, name: str) -> tuple[onnx.TensorProto, Deferred | None]:
    """The TensorProto of a new constant, and its recipe where its source is external (``deferred.derived``:
    inline sources are transformed now; external ones are never loaded here)."""
    return deferred.derived(view.constant(nt.source), name, nt.dims, nt.data_type, transpose=nt.transpose,
                            scale=nt.scale)


def _remove_made_dead(graph: onnx.GraphProto, kept: list[onnx.NodeProto], start: list[str],
                      graph_inputs: set[str]) -> tuple[list[onnx.NodeProto], set[str]]:
    """Drop the nodes and initializers that became unused because the replaced nodes were their only
    readers, walking back from ``start`` (the inputs of the replaced nodes). Dead code the model had
    before is not ours to remove."""
    uses: dict[str, int] = {}
    for name in [o.name for o in graph.output]:
        uses[name] = uses.get(name, 0) + 1
    reads = [node_reads(n) for n in kept]
    for r in reads:
        for name in r:
            uses[name] = uses.get(name, 0) + 1
    producer = {o: k for k, n in enumerate(kept) for o in n.output if o}
    initializers = {t.name for t in graph.initializer}
    dead_nodes: set[int] = set()
    dead_inits: set[str] = set()
    work = list(start)
    while work:
        name = work.pop()
        if uses.get(name, 0):
            continue
        k = producer.get(name)
        if k is not None:
            if k not in dead_nodes and all(not uses.get(o, 0) for o in kept[k].output if o):
                dead_nodes.add(k)
                for r in reads[k]:
                    uses[r] -= 1
                    work.append(r)
        elif name in initializers and name not in graph_inputs:
            dead_inits.add(name)
    return [n for k, n in enumerate(kept) if k not in dead_nodes], dead_inits


@dataclass
class _Rewrite:
    """What one fuse_model run shares across the main graph and its subgraphs."""

    rules: tuple[FusionRule, ...]
    target: cost_model.Target
    base_dir: str | None
    names: _Names
    report: Report = field(default_factory=Report)
    derived: dict[str, Deferred] = field(default_factory=dict)
    created: dict[NewTensor, str] = field(default_factory=dict)  # one derived copy per source+transform
    targets: dict[int, onnx.GraphProto] = field(default_factory=dict)  # id(view) -> its output graph
    outer_sources: list[tuple[onnx.GraphProto, str]] = field(default_factory=list)
    domains: set[str] = field(default_factory=set)  # every domain an emitted node uses
    opset: int | None = None  # the model's ONNX (default-domain) opset: which form of an op a rule may write


class _GraphEmitter:
    """The ``patterns.rule.Emitter`` of one graph: unique names, and constants made once per source and
    transform (tied weights, or one weight read by several If/Loop bodies, get one copy)."""

    def __init__(self, view: GraphView, ctx: _Rewrite):
        self.view = view
        self.ctx = ctx
        self.new_tensors: list[onnx.TensorProto] = []
        self.declared: list[onnx.ValueInfoProto] = []  # value_info of emitted tensors (Emitter.declare)
        self.position = 0  # where the block being emitted goes (its last node's index in the view)
        self._shared: dict[tuple, tuple[int, str]] = {}  # key -> (position of its nodes, tensor name)

    def shared(self, key, build):
        # Reused only where the emitted tensor already exists: by a block placed after the one that made it.
        known = self._shared.get(key)
        if known is not None and known[0] <= self.position:
            return [], known[1]
        nodes, name = build()
        if known is None or self.position < known[0]:
            self._shared[key] = (self.position, name)
        return nodes, name

    def name(self, proposal: str) -> str:
        return self.ctx.names.claim(proposal)

    def tensor(self, ref: str | NewTensor) -> str:
        if not isinstance(ref, NewTensor):
            return ref
        ctx, view = self.ctx, self.view
        key = NewTensor(name="", source=ref.source, dims=ref.dims, data_type=ref.data_type,
                        transpose=ref.transpose, scale=ref.scale)
        if key not in ctx.created:
            name = ctx.names.claim(ref.name)
            tensor, how = _materialize(view, ref, name)
            owner = view.owner(ref.source)
            if owner is view:
                self.new_tensors.append(tensor)
            else:  # an outer-scope constant: its derived copy lives beside it, shared by every body
                ctx.targets[id(owner)].initializer.append(tensor)
                ctx.outer_sources.append((ctx.targets[id(owner)], ref.source))
            if how is not None:
                ctx.derived[name] = how
            ctx.created[key] = name
        return ctx.created[key]

    def declare(self, tensor: str, elem_type: int, dims: list[int | str]) -> None:
        self.declared.append(helper.make_tensor_value_info(tensor, elem_type, dims))

    def initializer(self, proposal: str, value: np.ndarray) -> str:
        name = self.ctx.names.claim(proposal)
        self.new_tensors.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def concatenation(self, proposal: str, parts, axis: int | None) -> str:
        name = self.ctx.names.claim(proposal)
        # an external part is not read now: a placeholder, its bytes read and joined while the model is saved
        tensor, how = deferred.concatenated(name, [p.tensor if isinstance(p, ConstantRef) else p for p in parts], axis)
        self.new_tensors.append(tensor)
        if how is not None:
            self.ctx.derived[name] = how
        return name


def _apply(graph: onnx.GraphProto, view: GraphView, plans: list[Plan], ctx: _Rewrite) -> None:
    """Rewrite ``graph`` (the output's copy of ``view.graph``) in place, recording into ``ctx``."""
    emitter = _GraphEmitter(view, ctx)
    emit: dict[int, list[onnx.NodeProto]] = {}
    removed: set[int] = set()
    for plan in plans:
        domain_name, op_type = plan.op
        name = ctx.names.claim(f"{plan.name_hint}/{op_type}")
        emitter.position = max(plan.nodes)
        new_nodes = plan.emit(emitter, name)
        ctx.domains |= {n.domain for n in new_nodes if n.domain not in ("", "ai.onnx")}
        emit[max(plan.nodes)] = new_nodes
        removed |= plan.nodes
        op = f"{domain_name}.{op_type}" if domain_name else op_type
        ctx.report.fused.append(FusedBlock(name, plan.rule, op, plan.form,
                                           tuple(view.node_name(i) for i in sorted(plan.nodes)), plan.details()))
        if plan.math_change is not None:
            ctx.report.math_changed.append(MathChange(name, *plan.math_change))

    kept: list[onnx.NodeProto] = []
    for i, node in enumerate(view.nodes):
        if i in emit:
            kept.extend(emit[i])
        elif i not in removed:
            kept.append(node)

    start = [name for i in sorted(removed) for name in view.nodes[i].input if name]
    kept, dead_inits = _remove_made_dead(graph, _in_dependency_order(kept), start, view.graph_inputs)

    del graph.node[:]
    graph.node.extend(kept)
    for j in reversed(range(len(graph.initializer))):
        if graph.initializer[j].name in dead_inits:
            del graph.initializer[j]
    graph.initializer.extend(emitter.new_tensors)

    # Drop the value_info of the tensors the rewrite removed (and of nothing else).
    before = {o for n in view.nodes for o in n.output}
    alive = {o for n in kept for o in n.output}
    gone = (before - alive) | dead_inits
    for j in reversed(range(len(graph.value_info))):
        if graph.value_info[j].name in gone:
            del graph.value_info[j]
    graph.value_info.extend(emitter.declared)


def _in_dependency_order(nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """``nodes`` with every node after the producers of what it reads, the rest left where it was.

    A block's replacement takes the place of its last node; a reader of one of the block's outputs that
    stood between its first and last node would then come before its producer (GPT-Neo: the Shape of the
    embeddings' sum, read for the mask before the LayerNorm that the sum's SkipLayerNormalization
    replaces). ``graph_order.stable_order``: a list already in order comes out as it went in, and a node
    that must move waits only until what it reads exists."""
    produced_by = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    waits_on = [{produced_by[r] for r in node_reads(n) if r in produced_by} - {i} for i, n in enumerate(nodes)]
    if all(j < i for i, deps in enumerate(waits_on) for j in deps):
        return nodes
    order = stable_order(waits_on)
    if len(order) != len(nodes):
        raise AssertionError("the rewritten graph has a cycle")
    return [nodes[i] for i in order]


def _all_names(graph: onnx.GraphProto) -> set[str]:
    """Every node and tensor name of ``graph`` and its subgraphs: names we create must be new in all."""
    names = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    for node in graph.node:
        names.add(node.name)
        names.update(node.input)
        names.update(node.output)
        for a in node.attribute:
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                names |= _all_names(g)
    names.discard("")
    return names


def _subgraphs(graph: onnx.GraphProto) -> list[tuple[str, list[onnx.GraphProto]]]:
    """(op type, subgraphs) of each node that has some (If, Loop, Scan), in node order."""
    found = []
    for node in graph.node:
        subs = [g for a in node.attribute for g in ([a.g] if a.HasField("g") else []) + list(a.graphs)]
        if subs:
            found.append((node.op_type, subs))
    return found


def _fuse_graph(src: onnx.GraphProto, dst: onnx.GraphProto, inferred: onnx.GraphProto, outer: GraphView | None,
                ctx: _Rewrite) -> None:
    """Fuse the blocks of ``src`` into ``dst`` (its copy in the output), then those of its subgraphs.
    ``inferred`` is ``src`` with inferred value_info; ``outer`` the enclosing graph's view (subgraphs read
    its constants)."""
    view = GraphView(src, inferred=list(inferred.value_info), base_dir=ctx.base_dir, outer=outer,
                     opset=ctx.opset)
    ctx.targets[id(view)] = dst
    found = find_blocks(view, ctx.rules, ctx.target)
    _apply(dst, view, [r for r in found if isinstance(r, Plan)], ctx)
    ctx.report.refused += [RefusedBlock(r.rule, r.reason, r.nodes) for r in found if isinstance(r, Refusal)]
    # Nodes with subgraphs are never part of a block nor made dead by one (blocks only read constants,
    # X and W, which stay read), so src, dst and inferred list them in the same order.
    pairs = zip(_subgraphs(src), _subgraphs(dst), _subgraphs(inferred), strict=True)
    for (op, subs), (dst_op, dst_subs), (_, inf_subs) in pairs:
        assert op == dst_op and len(subs) == len(dst_subs) == len(inf_subs)
        for sub, dst_sub, inf_sub in zip(subs, dst_subs, inf_subs):
            _fuse_graph(sub, dst_sub, inf_sub, view, ctx)


def _has_node(graph: onnx.GraphProto, keys: set[tuple[str, str]]) -> bool:
    """Whether ``graph`` or one of its subgraphs has a node of one of ``keys`` ((domain, op_type))."""
    return any(op_key(n) in keys for n in graph.node) or any(
        _has_node(sub, keys) for _, subs in _subgraphs(graph) for sub in subs)


def _drop_unused_outer_sources(ctx: _Rewrite) -> None:
    """An outer weight whose every reader (in If/Loop bodies) now reads its derived copy is dead."""
    for graph, name in ctx.outer_sources:
        used = {o.name for o in graph.output} | {i.name for i in graph.input}
        for node in graph.node:
            used |= node_reads(node)
        if name not in used:
            for j in reversed(range(len(graph.initializer))):
                if graph.initializer[j].name == name:
                    del graph.initializer[j]


def fuse_model(model: onnx.ModelProto, *, approximate: str | None = None,
               base_dir: str | os.PathLike | None = None, rules: tuple[FusionRule, ...] | None = None,
               target: str | cost_model.Target = cost_model.DEFAULT_TARGET) -> FuseResult:
    """Apply every fusion rule to ``model`` (main graph and If/Loop/Scan bodies). Pure: ``model`` is not
    changed.

    ``rules``: the rule set, in priority order (default: ``patterns.default_rules(approximate)``).
    ``approximate`` ("tanh" or "sigmoid") makes every fused GELU compute that form, changing the math on
    purpose (the report lists each node it changed); it configures the default rules, so it cannot be
    combined with ``rules``. ``target`` (a name of ``cost_model.TARGETS`` or a Target) says what will run
    the model: a block whose fusion does not pay there is left as it is, with its reason. ``base_dir`` is where the model's external data lives (only small constants
    are read from it; weights are never loaded)."""
    if approximate is not None and approximate not in APPROXIMATIONS:
        raise BadInputError(f"--approximate must be one of {', '.join(APPROXIMATIONS)}, not {approximate!r}")
    target = cost_model.get_target(target)
    if rules is not None and approximate is not None:
        raise ValueError("fuse_model: approximate= configures the default rules; configure the rules you pass instead")
    if base_dir is None and any(t.data_location == onnx.TensorProto.EXTERNAL
                                and int(np.prod(t.dims, dtype=np.int64)) <= SMALL_CONSTANT_ELEMENTS
                                for t in model_io.all_tensors(model)):
        # Rules read small constants (√2, 0.5, biases' shapes never); without their folder they would
        # silently not match.
        raise ValueError("fuse_model: this model keeps small constants in external data; pass base_dir=")
    rules = default_rules(approximate) if rules is None else tuple(rules)
    ctx = _Rewrite(rules, target, None if base_dir is None else os.fspath(base_dir),
                   _Names(_all_names(model.graph)), Report(approximate=approximate, target=target.name),
                   opset=model_io.default_opset(model))
    # Two passes: the rules that match what other rules write (after_rewrites) see the first pass's output.
    # Names, derived constants and the report carry over; the second pass reads no weight the first made.
    out = model
    passes = (tuple(r for r in rules if not after_rewrites(r)), tuple(r for r in rules if after_rewrites(r)))
    for rules_of_pass in passes:
        anchors = {a for rule in rules_of_pass for a in rule.anchors}
        if not rules_of_pass or (rules_of_pass is passes[1] and not _has_node(out.graph, anchors)):
            continue  # (a second pass with nothing to match would only copy the model)
        src, out = out, onnx.ModelProto()
        out.CopyFrom(src)
        ctx.rules, ctx.targets = rules_of_pass, {}
        _fuse_graph(src.graph, out.graph, infer_types(src), None, ctx)
        _drop_unused_outer_sources(ctx)
        imported = {o.domain for o in out.opset_import}
        for d in sorted(ctx.domains - imported):
            out.opset_import.append(helper.make_opsetid(d, EMITTED_DOMAIN_VERSIONS[d]))
    if out is model:  # no rules at all: still a copy, never the caller's model
        out = onnx.ModelProto()
        out.CopyFrom(model)
    return FuseResult(out, ctx.report, ctx.derived, ctx.base_dir)
