"""Reading models: every way an input can be bad becomes one clear ``BadInputError`` line.

Weights are never all in memory. ``load_model`` reads the graph only (external data stays on disk, its
files checked for presence and size: :func:`external_span`, which ``model_save`` reads them through). Writing
is ``model_save``'s.

Whether ONNX Runtime loads a model ``onnx.checker`` rejects is the runtime's question, not this module's: the
caller brings the answer (``runtime.onnxruntime_load_error``), so reading a model needs no runtime.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath, PureWindowsPath

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx.external_data_helper import ExternalDataInfo

from . import domain
from .errors import BadInputError
from .graph_order import node_reads, stable_order
from .implied_opsets import declare_implied

EXTERNAL = onnx.TensorProto.EXTERNAL
_FOUR_BIT = {onnx.TensorProto.INT4, onnx.TensorProto.UINT4,
             getattr(onnx.TensorProto, "FLOAT4E2M1", onnx.TensorProto.INT4)}
# Why ONNX Runtime cannot load a model (None: it can), asked of a model onnx.checker rejects, as
# runtime.onnxruntime_load_error(model, its file or None, base_dir=its external data's folder)
RuntimeLoadError = Callable[..., str | None]
# {domain: version} that ONNX Runtime imports by itself into a model that uses a domain without importing it,
# as runtime.ort_implied_opsets() asks the installed ORT (implied_opsets.py says why it is asked, not tabled)
ImpliedOpsets = Callable[[], dict[str, int]]


# --- walking tensors ---------------------------------------------------------------------------------
def _graph_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    yield from graph.initializer
    for node in graph.node:
        yield from _node_tensors(node)


def _node_tensors(node: onnx.NodeProto) -> Iterator[onnx.TensorProto]:
    for a in node.attribute:
        if a.HasField("t"):
            yield a.t
        yield from a.tensors
        if a.HasField("g"):
            yield from _graph_tensors(a.g)
        for g in a.graphs:
            yield from _graph_tensors(g)


def all_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of ``graph`` and of the If/Loop/Scan bodies inside it, outer before inner."""
    for node in graph.node:
        yield node
        for a in node.attribute:
            if a.HasField("g"):
                yield from all_nodes(a.g)
            for g in a.graphs:
                yield from all_nodes(g)


def all_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every TensorProto of the model: initializers, Constant values, subgraphs, functions."""
    yield from _graph_tensors(model.graph)
    for f in model.functions:
        for node in f.node:
            yield from _node_tensors(node)


def external_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    return [t for t in all_tensors(model) if t.data_location == EXTERNAL]


def tensor_nbytes(t: onnx.TensorProto) -> int:
    n = int(np.prod(t.dims, dtype=np.int64))
    if t.data_type in _FOUR_BIT:
        return (n + 1) // 2
    return n * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize


def external_span(t: onnx.TensorProto, base_dir: str) -> tuple[str, int, int]:
    """(file, offset, length) of an external tensor, checked: a relative path inside ``base_dir`` to a
    regular file long enough to hold it."""
    try:
        info = ExternalDataInfo(t)
    except (ValueError, TypeError) as e:  # offset/length that are not integers, keys that are not text
        raise BadInputError(f"tensor '{t.name}': unreadable external data reference ({e})") from None
    loc = info.location
    if not loc:
        raise BadInputError(f"tensor '{t.name}' is marked external but names no data file")
    if (os.path.isabs(loc) or PureWindowsPath(loc).is_absolute() or ".." in PurePosixPath(loc).parts
            or ".." in PureWindowsPath(loc).parts):
        raise BadInputError(f"tensor '{t.name}': external data location '{loc}' must be a relative path "
                            "inside the model's folder")
    path = os.path.join(base_dir, loc)
    if not os.path.isfile(path):
        raise BadInputError(f"external data file '{loc}' of tensor '{t.name}' is missing next to the model "
                            f"(looked in {base_dir})")
    expected = tensor_nbytes(t)
    length = info.length if info.length else expected
    if length != expected:
        raise BadInputError(f"tensor '{t.name}': external data length {length} does not match its shape "
                            f"{list(t.dims)} ({expected} bytes)")
    offset = info.offset or 0
    size = os.path.getsize(path)
    if offset + length > size:
        raise BadInputError(f"external data file '{loc}' is truncated: tensor '{t.name}' needs bytes "
                            f"[{offset}, {offset + length}) but the file has {size}")
    return path, offset, length


# --- loading ---------------------------------------------------------------------------------------
def _check_opsets(model: onnx.ModelProto, path: str, notes: LoadNotes | None = None,
                  implied_opsets: ImpliedOpsets | None = None) -> None:
    """Every domain a node uses is imported, at a version this onnx (and onnxfuse) reads. A domain the model
    uses without importing it that ONNX Runtime imports by itself (``com.microsoft``, ``ai.onnx.ml``) is
    declared in ``model`` at the version ORT assumes (``implied_opsets()``; without it, nothing is assumed),
    and recorded in ``notes``."""
    declared = declare_implied(model, list(all_nodes(model.graph)), implied_opsets or dict)
    if notes is not None:
        notes.declared_opsets = tuple(declared.items())
    imported = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
    if "" in imported and not 1 <= imported[""] <= onnx.defs.onnx_opset_version():
        raise BadInputError(f"{path}: ONNX opset {imported['']} is not supported (this onnx knows up to "
                            f"{onnx.defs.onnx_opset_version()})")
    if domain.DOMAIN in imported and not 1 <= imported[domain.DOMAIN] <= domain.DOMAIN_VERSION and not any(
            n.domain == domain.DOMAIN for n in all_nodes(model.graph)):
        # An import no node uses, at a version no onnxfuse wrote: ONNX Runtime's own saves write it (a session
        # saves an import of every domain its registry knows, custom ones at 1000, once a process has registered
        # the op library). It says nothing about the model: dropped, so that a rewrite imports the version its
        # nodes have.
        if notes is not None:
            notes.dropped_imports += ((domain.DOMAIN, imported[domain.DOMAIN]),)
        kept = [o for o in model.opset_import if o.domain != domain.DOMAIN]
        del model.opset_import[:]
        model.opset_import.extend(kept)
        del imported[domain.DOMAIN]
    if domain.DOMAIN in imported and not 1 <= imported[domain.DOMAIN] <= domain.DOMAIN_VERSION:
        raise BadInputError(f"{path}: domain {domain.DOMAIN} version {imported[domain.DOMAIN]} is not supported "
                            f"(this onnxfuse reads versions 1 to {domain.DOMAIN_VERSION})")
    local = {f.domain for f in model.functions}

    for node in all_nodes(model.graph):
        d = "" if node.domain == "ai.onnx" else node.domain
        if d not in imported and d not in local:
            raise BadInputError(f"{path}: node '{node.name or node.op_type}' uses domain '{d or 'ai.onnx'}' "
                                "that the model does not import (unknown opset domain)")


def default_opset(model: onnx.ModelProto) -> int | None:
    """The version of the ONNX (default) domain the model imports, or None when it imports none."""
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)


def ops_onnx_does_not_know(model: onnx.ModelProto) -> set[str]:
    """Default-domain ops with no onnx schema at the model's opset. ORT's transformers optimizer writes
    such models (``LayerNormalization`` at opset 14, ``SimplifiedLayerNormalization``): ORT runs them,
    but ``onnx.checker`` cannot validate them."""
    version = default_opset(model)
    if version is None:
        return set()
    unknown: set[str] = set()
    for node in all_nodes(model.graph):
        if node.domain in ("", "ai.onnx") and node.op_type not in unknown:
            try:
                onnx.defs.get_schema(node.op_type, version, "")
            except onnx.defs.SchemaError:
                unknown.add(node.op_type)
    return unknown


_KNOWN_DTYPES = {v for v in onnx.TensorProto.DataType.values() if v not in (onnx.TensorProto.UNDEFINED,)}


def _not_utf8(msg, where: str = "") -> str | None:
    """The first string field under ``msg`` that is not valid UTF-8 (protobuf hands those back as bytes,
    which every later step trips over), as a dotted path; tensors' bytes are not walked."""
    if isinstance(msg, onnx.TensorProto):
        strings = [("name", msg.name), ("doc_string", msg.doc_string)]
        strings += [(f"external_data.{e.key!r}", s) for e in msg.external_data for s in (e.key, e.value)]
        return next((f"{where}{name}" for name, s in strings if not isinstance(s, str)), None)
    for fd, value in msg.ListFields():
        repeated = fd.is_repeated if hasattr(fd, "is_repeated") else fd.label == fd.LABEL_REPEATED
        items = value if repeated else [value]
        if fd.type == fd.TYPE_STRING:
            if any(not isinstance(v, str) for v in items):
                return f"{where}{fd.name}"
        elif fd.type == fd.TYPE_MESSAGE:
            for item in items:
                bad = _not_utf8(item, f"{where}{fd.name}.")
                if bad:
                    return bad
    return None


def _check_well_formed(model: onnx.ModelProto, path: str) -> None:
    """What ``onnx.checker`` does not look at (or cannot, for ops it has no schema of), and every later
    step relies on: UTF-8 strings, known tensor types, inline data as long as the dims say (the node
    order is :func:`_sort_nodes`'s)."""
    bad = _not_utf8(model)
    if bad:
        raise BadInputError(f"{path}: not a valid ONNX model: {bad} is not valid UTF-8")
    for t in all_tensors(model):
        if t.data_type not in _KNOWN_DTYPES:
            raise BadInputError(f"{path}: tensor '{t.name}' has an unknown data type ({t.data_type})")
        if any(d < 0 for d in t.dims):
            raise BadInputError(f"{path}: tensor '{t.name}' has a negative dimension {list(t.dims)}")
        if t.data_location == EXTERNAL or t.data_type == onnx.TensorProto.STRING:
            continue
        if t.HasField("raw_data"):
            if len(t.raw_data) != tensor_nbytes(t):
                raise BadInputError(f"{path}: tensor '{t.name}' holds {len(t.raw_data)} bytes, its shape "
                                    f"{list(t.dims)} needs {tensor_nbytes(t)}")
        elif int(np.prod(t.dims, dtype=np.int64)) <= 4096:
            try:
                onnx.numpy_helper.to_array(t)
            except Exception:  # noqa: BLE001 - any way the typed fields disagree with the dims
                raise BadInputError(f"{path}: tensor '{t.name}' does not hold the {list(t.dims)} values its "
                                    "shape says") from None


def _is_constant(node: onnx.NodeProto) -> bool:
    return node.op_type == "Constant" and node.domain in ("", "ai.onnx")


def _sort_nodes(graph: onnx.GraphProto, path: str, outer: frozenset[str] = frozenset(),
                duplicates: dict[str, int] | None = None) -> bool:
    """Put ``graph``'s nodes (and its subgraphs') in topological order if they are not; True if any moved.

    ONNX Runtime sorts a graph itself, so exporters and converters write models whose node list is out of
    order (ORT's ``float16.convert_float_to_float16`` appends the input Casts at the end) and ORT runs
    them. The sort is ``graph_order.stable_order``: nodes already in order keep their places relative to
    each other. A tensor read that no node computes (undefined, or a cycle) is garbage and refused, and so
    is one computed twice, except as ORT takes it: ORT turns every ``Constant`` node into an initializer,
    appended after the model's own, and of initializers of one name uses the last
    (``onnxruntime/core/graph/graph.cc``). So a tensor that ``Constant`` nodes define more than once, or that
    one defines beside an initializer or graph input of its name, is the last such node's value; each is
    counted in ``duplicates`` (tensor: definitions). A node of another op writing a defined name ORT refuses
    too. (Constant nodes read nothing: the stable sort keeps their order, so the last one stays last, which
    is where ``patterns.graph.GraphView`` reads it.)"""
    moved = False
    scope = None  # what a subgraph may read from here: everything this graph and its enclosing ones define
    for node in graph.node:
        for a in node.attribute:
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                if scope is None:
                    scope = outer | {v.name for v in graph.input} | {t.name for t in graph.initializer} | {
                        o for n in graph.node for o in n.output if o}
                moved |= _sort_nodes(g, path, scope, duplicates)
    defined = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    defined |= {t.values.name for t in graph.sparse_initializer if t.values.name}
    producers: dict[str, list[int]] = {}
    for k, node in enumerate(graph.node):
        for name in node.output:
            if not name:
                continue
            earlier = producers.setdefault(name, [])
            if earlier or name in defined:
                if not (_is_constant(node) and all(_is_constant(graph.node[j]) for j in earlier)):
                    raise BadInputError(f"{path}: not a valid ONNX model: tensor '{name}' is computed twice "
                                        f"(node '{node.name or node.op_type}')")
                if duplicates is not None:
                    duplicates[name] = len(earlier) + (name in defined) + 1
            earlier.append(k)
    waits_on: list[set[int]] = []  # per node: the producers it waits for
    for k, node in enumerate(graph.node):
        deps = set()
        for name in sorted(node_reads(node)):
            if name in producers:
                deps.update(producers[name])
            elif name not in defined and name not in outer and name in node.input:
                raise BadInputError(f"{path}: not a valid ONNX model: node '{node.name or node.op_type}' reads "
                                    f"'{name}' before any node computes it (undefined)")
        waits_on.append(deps)
    order = stable_order(waits_on)
    if len(order) < len(graph.node):
        placed = set(order)
        stuck = min(k for k in range(len(graph.node)) if k not in placed)
        node = graph.node[stuck]
        name = next(n for n in sorted(node_reads(node)) if any(j not in placed for j in producers.get(n, ())))
        raise BadInputError(f"{path}: not a valid ONNX model: node '{node.name or node.op_type}' reads '{name}' "
                            "before any node computes it (a cycle)")
    if order == sorted(order):
        return moved
    nodes = [graph.node[k] for k in order]
    copies = [onnx.NodeProto() for _ in nodes]
    for c, n in zip(copies, nodes):
        c.CopyFrom(n)
    del graph.node[:]
    graph.node.extend(copies)
    return True


def check_file(target) -> None:
    """``onnx.checker`` with shape inference on a model file or proto; where shape inference needs the value
    of an external tensor (a Reshape's target shape saved as external data) it cannot read it, and the
    structure is checked without it."""
    if not isinstance(target, onnx.ModelProto):
        target = os.fspath(target)
    try:
        onnx.checker.check_model(target, full_check=True)
    except onnx.shape_inference.InferenceError as e:
        if "external tensors" not in str(e):
            raise
        onnx.checker.check_model(target)


def checkable(model: onnx.ModelProto) -> bool:
    """Whether ``onnx.checker`` can judge this model (see :func:`ops_onnx_does_not_know`). Models it
    cannot judge are still read and rewritten; their output is as checkable as their input was."""
    return not ops_onnx_does_not_know(model)


# (ValueError: the checker's word for an element type that is no type, e.g. "Invalid tensor data type 91")
_CHECKER_ERRORS = (onnx.checker.ValidationError, onnx.shape_inference.InferenceError, ValueError)


def checker_error(target) -> str | None:
    """``onnx.checker``'s verdict (full check, as :func:`check_file`) on a model file or proto: None if it
    passes, else the first line of its error."""
    try:
        check_file(target)
    except _CHECKER_ERRORS as e:
        return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    except UnicodeDecodeError:  # the checker's message quotes a name that is not UTF-8
        return "a name or string in it is not valid UTF-8"
    return None


def sorted_checker_error(model: onnx.ModelProto) -> str | None:
    """The checker's verdict on the model as loaded (sorted, opsets declared), which exists in memory only, read
    as ONNX defines it (:func:`_spell_default_domain_empty`). The checker looks for external data relative
    to a model *file*, so external initializers are judged by their type and dims: as graph inputs of a copy
    (their data files were checked by ``external_span`` already)."""
    restore = _spell_default_domain_empty(model)
    try:
        if not any(t.data_location == EXTERNAL for t in model.graph.initializer):
            return checker_error(model)
        light = onnx.ModelProto()
        light.CopyFrom(model)
    finally:
        restore()
    declared = {v.name for v in light.graph.input}
    kept = [t for t in light.graph.initializer if t.data_location != EXTERNAL]
    for t in light.graph.initializer:
        if t.data_location == EXTERNAL and t.name not in declared:
            light.graph.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    del light.graph.initializer[:]
    light.graph.initializer.extend(kept)
    return checker_error(light)


def spells_default_domain_ai_onnx(model: onnx.ModelProto) -> bool:
    """Whether the model names the default domain "ai.onnx" on a node or an opset import."""
    return any(o.domain == "ai.onnx" for o in model.opset_import) or any(
        n.domain == "ai.onnx" for n in all_nodes(model.graph))


def _spell_default_domain_empty(model: onnx.ModelProto) -> Callable[[], None]:
    """Spell the default domain "" on ``model``'s nodes and opset imports; returns what puts the spelling back.

    ONNX defines "ai.onnx" as "", and ORT reads it so, but ``onnx.checker`` looks a node's schema up under the
    domain as spelled: "ai.onnx" nodes fail it with an error naming their op, so a rewrite that removes the
    first such node would seem to add an error. Judged as ONNX reads it, the model gets the verdict its math
    deserves; the model written keeps its spelling. (Of two imports of the default domain the last one
    counts, as in ORT's ``Model`` and :func:`_check_opsets`.)"""
    if not spells_default_domain_ai_onnx(model):
        return lambda: None
    respelled = [n for n in all_nodes(model.graph) if n.domain == "ai.onnx"]
    imports = [(o.domain, o.version) for o in model.opset_import]
    versions: dict[str, int] = {}
    for d, v in imports:
        versions["" if d == "ai.onnx" else d] = v
    for n in respelled:
        n.domain = ""
    del model.opset_import[:]
    model.opset_import.extend(onnx.helper.make_opsetid(d, v) for d, v in versions.items())

    def restore() -> None:
        for n in respelled:
            n.domain = "ai.onnx"
        del model.opset_import[:]
        model.opset_import.extend(onnx.helper.make_opsetid(d, v) for d, v in imports)

    return restore


@dataclass
class LoadNotes:
    """What :func:`load_model` tolerated in an input ONNX Runtime runs: said to the user as warnings, and
    what the output is checked against (it may not add a checker error the input did not have)."""

    reordered: bool = False  # the nodes were not in topological order; the model returned is sorted
    checker_error: str | None = None  # onnx.checker's first error on the (sorted) input; None: it passes
    path: str = ""
    # (domain, version) of each domain the nodes use unimported that ORT imports by itself: declared in the model
    declared_opsets: tuple[tuple[str, int], ...] = ()
    # (domain, version) of each import no node uses, at a version onnxfuse does not read: dropped from the model
    dropped_imports: tuple[tuple[str, int], ...] = ()
    # (tensor, definitions) of each tensor several Constant nodes (and maybe an initializer) define
    duplicate_constants: tuple[tuple[str, int], ...] = ()

    @property
    def normalized(self) -> bool:
        """The model returned differs from the file: sorted, opsets declared, or a vacuous import dropped."""
        return self.reordered or bool(self.declared_opsets) or bool(self.dropped_imports)

    @property
    def warnings(self) -> list[str]:
        out = []
        if self.reordered:
            out.append(f"{self.path}: the nodes are not in topological order (ONNX Runtime sorts them when it "
                       "loads the model); they were re-ordered, and the output lists them sorted")
        for d, version in self.dropped_imports:
            out.append(f"{self.path}: the model imports domain '{d}' at version {version}, which no node uses and no "
                       "onnxfuse wrote (ONNX Runtime's saves import every domain its registry knows); the output "
                       "leaves that import out")
        for d, version in self.declared_opsets:
            out.append(f"{self.path}: nodes use domain '{d or 'ai.onnx'}', which the model does not import; ONNX "
                       f"Runtime reads it at version {version} (its latest), and so does onnxfuse: the output "
                       "declares it")
        for name, count in self.duplicate_constants:
            out.append(f"{self.path}: tensor '{name}' is defined {count} times, by Constant nodes (and maybe an "
                       "initializer); ONNX Runtime reads the last Constant node's value, and so does onnxfuse "
                       "(the output keeps every definition)")
        if self.checker_error is not None:
            out.append(f"{self.path}: onnx.checker rejects the input ({self.checker_error}); ONNX Runtime loads "
                       "it, so it is optimized, and its output is held to add no checker error")
        return out


def load_model(path, *, load_external_data: bool = False, notes: LoadNotes | None = None,
               runtime_load_error: RuntimeLoadError | None = None,
               implied_opsets: ImpliedOpsets | None = None) -> onnx.ModelProto:
    """Read an ONNX model, or raise ``BadInputError`` with one line saying what is wrong with it.

    External data is checked (present, inside the model's folder, long enough) but not loaded unless
    ``load_external_data``. A model whose nodes are out of topological order is returned sorted. A model
    ``onnx.checker`` rejects is refused unless ``runtime_load_error`` (``runtime.onnxruntime_load_error``)
    says ONNX Runtime loads it (graph outputs without a shape, as onnx-graphsurgeon writes them); without
    one it is refused. A domain used but not imported is declared at the version ``implied_opsets()`` says
    ORT assumes (``runtime.ort_implied_opsets``); without it, refused. ``runtime.load_probes()`` gives both.
    What was tolerated is recorded in ``notes``."""
    path = os.fspath(path)
    notes = notes if notes is not None else LoadNotes()
    notes.path = path
    if not os.path.exists(path):
        raise BadInputError(f"{path}: no such file")
    if os.path.isdir(path):
        raise BadInputError(f"{path}: is a directory, not an ONNX model file")
    if not os.path.isfile(path):
        raise BadInputError(f"{path}: not a regular file")
    size = os.path.getsize(path)
    if size == 0:
        raise BadInputError(f"{path}: empty file")
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError as e:
        raise BadInputError(f"{path}: cannot read: {e.strerror}") from None
    if head.startswith(b"version https://git-lfs"):
        raise BadInputError(f"{path}: a git-LFS pointer, not the model (run `git lfs pull`)")
    try:
        model = onnx.load_model(path, load_external_data=False)
    except (DecodeError, RuntimeError, ValueError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BadInputError(f"{path}: not an ONNX model or truncated ({first})") from None
    base_dir = os.path.dirname(os.path.abspath(path))
    validate_model(model, path, base_dir=base_dir, notes=notes, runtime_load_error=runtime_load_error,
                   implied_opsets=implied_opsets, source=path)
    if load_external_data:
        onnx.external_data_helper.load_external_data_for_model(model, base_dir)
    return model


def validate_model(model: onnx.ModelProto, name: str, *, base_dir: str | None, notes: LoadNotes,
                   runtime_load_error: RuntimeLoadError | None = None,
                   implied_opsets: ImpliedOpsets | None = None, source: str | None = None) -> None:
    """What :func:`load_model` checks once the file is parsed, on a model in memory (``name`` says which in
    the messages): ``BadInputError`` for a model no step after this can trust, the nodes sorted in place
    where they are out of order, what was tolerated in ``notes``. ``base_dir``: where its external data is
    (its files are checked); ``source``: the model's file, which ``onnx.checker`` and ORT read where the
    nodes were in order (None: they judge the model in memory)."""
    notes.path = name
    if not model.ir_version or not model.HasField("graph") or not model.opset_import:
        raise BadInputError(f"{name}: not an ONNX model (no IR version, graph or opset import)")
    if model.ir_version > onnx.IR_VERSION:
        raise BadInputError(f"{name}: IR version {model.ir_version} is newer than this onnx supports "
                            f"({onnx.IR_VERSION})")
    _check_well_formed(model, name)
    duplicates: dict[str, int] = {}
    notes.reordered = _sort_nodes(model.graph, name, duplicates=duplicates)
    notes.duplicate_constants = tuple(sorted(duplicates.items()))
    _check_opsets(model, name, notes, implied_opsets)
    external = external_tensors(model)
    if external and base_dir is None:
        raise ValueError(f"{name}: the model has external data; say where it is (base_dir)")
    for t in external:
        external_span(t, base_dir)
    if checkable(model):
        # full (shape inference) as the output will be; the sorted model, opsets declared, is what gets
        # rewritten, judged as ONNX reads the default domain's spelling
        in_file = source is not None and not notes.normalized and not spells_default_domain_ai_onnx(model)
        error = checker_error(source) if in_file else sorted_checker_error(model)
        if error is not None:
            if runtime_load_error is None or runtime_load_error(model, source, base_dir=base_dir) is not None:
                raise BadInputError(f"{name}: not a valid ONNX model: {error}")
            notes.checker_error = error


def external_data_files(path) -> list[str]:
    """The files an input model's external tensors are read from (those that exist). [] for a model that
    cannot be read: loading it says why."""
    try:
        model = onnx.load_model(os.fspath(path), load_external_data=False)
    except Exception:  # noqa: BLE001 - any unreadable model: load_model reports it properly
        return []
    base_dir = os.path.dirname(os.path.abspath(os.fspath(path)))
    files = []
    for t in external_tensors(model):
        try:
            location = ExternalDataInfo(t).location
        except (ValueError, TypeError):
            continue
        candidate = os.path.join(base_dir, location) if location else ""
        if candidate and os.path.isfile(candidate) and candidate not in files:
            files.append(candidate)
    return files


