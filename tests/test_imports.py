"""The package's import rules, as the code is: which module may import which, in layers.

Every module of ``onnxfuse/`` is parsed (nothing is imported) and each of its imports of the package — at
module level, inside functions, under ``if TYPE_CHECKING:``, relative or absolute — is held to ``LAYERS``:
a room (a module, or a package counted as one: ``patterns``, ``measure``, ``cli``) may import the rooms its
row lists, and its own modules. A row may list only rooms of its own layer or lower, and the rows form no
cycle, so the table is a layering; a row may list nothing its room does not import, so the table stays the
code's. ``onnxruntime`` is held to the rooms ``RUNTIME_USERS`` names: reading and rewriting a model never
needs one.

A new module is placed in the table (or falls in its package's room); a new import is either allowed by its
room's row, or the row changes here, in the same commit, where a reviewer sees the layering change.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "onnxfuse"

# (layer, {room: the rooms it may import}), bottom layer first. A room is a module of onnxfuse, a package whose
# modules count as one room ("patterns", "measure", "cli"), or "onnxfuse" (the package's own __init__: the
# public API). Every module is in exactly one room.
LAYERS: list[tuple[str, dict[str, tuple[str, ...]]]] = [
    ("foundations: facts and types, nothing of ours", {
        "errors": (),        # the exit-code contract (exception types)
        "dtypes": (),        # ONNX element types by name
        "domain": (),        # the ai.onnxfuse domain, its version, each op's schema
        "version": (),       # the package's version
        "report": (),        # what a rewrite did
        "graph_order": (),   # what a node reads, and the one dependency order
        "deferred": (),      # weights made by the rewrite, computed while saving
        "implied_opsets": (),  # the domains ORT imports by itself (the versions are asked of ORT by runtime)
    }),
    ("model files: reading, writing, the paths a command writes", {
        "atomic": ("errors",),
        "model_io": ("domain", "errors", "graph_order", "implied_opsets"),
        "model_save": ("atomic", "deferred", "domain", "errors", "model_io"),
        "report_paths": ("errors", "model_io", "model_save"),
        "provenance": ("domain", "model_io", "version"),  # the onnxfuse.version / .rules stamp of a rewrite
    }),
    ("the rules: what may be fused, and what pays on each target", {
        "patterns": ("domain", "dtypes", "graph_order"),
        "cost_model": ("domain", "errors", "patterns"),
    }),
    ("the rewrite: ORT's fusions, then the rules applied as one edit", {
        "ort_gelu_forms": ("patterns",),
        "ort_fusions": ("domain", "errors", "model_io", "ort_gelu_forms"),
        "fuse": ("cost_model", "deferred", "domain", "errors", "graph_order", "model_io", "model_save", "patterns",
                 "report"),
    }),
    ("running models: sessions, inputs, the accuracy gate, the environment report", {
        "runtime": ("domain", "errors", "implied_opsets"),
        "inputs": ("errors",),
        "error_statistics": ("dtypes",),
        "compare": ("domain", "dtypes", "error_statistics", "errors", "inputs", "model_io", "runtime"),
        "accuracy": ("compare", "error_statistics", "errors", "inputs", "model_io", "runtime"),
        "doctor": ("errors", "runtime", "version"),
    }),
    ("measuring and tuning: benchmarks, tune's choice of path and GELU form, charts", {
        "tuning": ("domain", "dtypes", "errors", "model_io", "patterns"),
        "measure": ("domain", "errors", "inputs", "model_io", "patterns", "runtime", "tuning", "version"),
        "approximation": ("accuracy", "domain", "errors", "tuning"),
        "plots": ("atomic", "compare", "error_statistics", "errors", "measure", "model_save", "runtime"),
        "tune": ("accuracy", "approximation", "domain", "errors", "inputs", "measure", "model_io", "model_save",
                 "patterns", "runtime", "tuning"),
    }),
    ("the pipeline: ORT's fusions → rules → (tune) → (verify) → the written model", {
        "pipeline": ("compare", "cost_model", "domain", "errors", "fuse", "model_io", "model_save", "ort_fusions",
                     "patterns", "provenance", "report", "runtime", "tune", "tuning"),
    }),
    ("front ends: the command line, and the package's public API", {
        "cli": ("approximation", "atomic", "compare", "cost_model", "doctor", "domain", "errors", "inputs", "measure",
                "ort_fusions", "pipeline", "plots", "report_paths", "runtime", "tune", "version"),
        "onnxfuse": ("domain", "pipeline", "runtime", "version"),
    }),
]
PACKAGES = ("patterns", "measure", "cli")  # rooms whose every module (and those added later) they hold
# The rooms that may import onnxruntime (its transformers optimizer included).
RUNTIME_USERS = ("accuracy", "compare", "doctor", "measure", "ort_fusions", "runtime")

ALLOWED = {room: set(allowed) for _, rooms in LAYERS for room, allowed in rooms.items()}
LAYER_OF = {room: i for i, (_, rooms) in enumerate(LAYERS) for room in rooms}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _room(module: str) -> str | None:
    """The room of ``onnxfuse.…`` module ``module`` (None: the table has none for it)."""
    if module == "onnxfuse":
        return "onnxfuse"
    name = module.removeprefix("onnxfuse.")
    if name in ALLOWED and name not in PACKAGES:
        return name
    head = name.split(".")[0]
    return head if head in PACKAGES else None


def _imports(module: str) -> list[tuple[str, int, str]]:
    """(imported module, line, where) for every import in ``module``'s source: ``onnxfuse.…`` names resolved
    (``from . import x`` is module ``x`` where there is one, else the package it is read from), others as
    written."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    scopes = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                scopes.setdefault(id(inner), f"in {node.name}()")
    found = []
    for node in ast.walk(tree):
        where = scopes.get(id(node), "at module level")
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno, where) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                found.append((submodule if submodule in MODULES else source, node.lineno, where))
    return found


def _ours(name: str) -> bool:
    return name == "onnxfuse" or name.startswith("onnxfuse.")


def test_every_module_has_a_room():
    missing = [m for m in MODULES if _room(m) is None]
    assert not missing, (f"{', '.join(missing)}: no room in tests/test_imports.py's LAYERS; add the module to "
                         "the layer it belongs to, with the rooms it may import")


def test_the_table_is_layered():
    problems = []
    for room, allowed in ALLOWED.items():
        for other in sorted(allowed):
            if other not in ALLOWED:
                problems.append(f"{room} may import {other}, which is no room of the table")
            elif LAYER_OF[other] > LAYER_OF[room]:
                problems.append(f"{room} (layer '{LAYERS[LAYER_OF[room]][0]}') may import {other}, of the higher "
                                f"layer '{LAYERS[LAYER_OF[other]][0]}'")
    state: dict[str, str] = {}

    def visit(room: str, path: list[str]) -> None:  # depth first: a room met again on its own path is a cycle
        if state.get(room) == "done":
            return
        if state.get(room) == "open":
            problems.append(f"the table has a cycle: {' → '.join(path[path.index(room):] + [room])}")
            return
        state[room] = "open"
        for other in sorted(ALLOWED.get(room, ())):
            visit(other, path + [room])
        state[room] = "done"

    for room in ALLOWED:
        visit(room, [])
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_follow_the_table(module):
    room = _room(module)
    if room is None:
        pytest.skip("no room (test_every_module_has_a_room says so)")
    problems = []
    for name, line, where in _imports(module):
        if _ours(name):
            other = _room(name)
            if other is None or other == room:
                continue  # its own room's modules (a module with no room is said by the test above)
            if other not in ALLOWED[room]:
                layer, other_layer = LAYERS[LAYER_OF[room]][0], LAYERS[LAYER_OF[other]][0]
                problems.append(
                    f"{module} imports {name} (line {line}, {where}): the table lets {room} import only "
                    f"{', '.join(sorted(ALLOWED[room])) or 'nothing of ours'}. {room} is in layer '{layer}', "
                    f"{other} in '{other_layer}'" + ("; a lower layer never imports a higher one"
                                                      if LAYER_OF[other] > LAYER_OF[room] else ""))
        elif name.split(".")[0] == "onnxruntime" and room not in RUNTIME_USERS:
            problems.append(f"{module} imports {name} (line {line}, {where}): only {', '.join(RUNTIME_USERS)} "
                            "may import onnxruntime (RUNTIME_USERS); ask runtime for what a session does")
    assert not problems, "\n".join(problems)


def test_the_table_allows_nothing_the_code_does_not_import():
    """A row that allows more than its room imports is no longer the code's: drop what is unused."""
    used: dict[str, set[str]] = {room: set() for room in ALLOWED}
    runtime_users = set()
    for module in MODULES:
        room = _room(module)
        if room is None:
            continue
        for name, _, _ in _imports(module):
            if _ours(name) and _room(name) not in (None, room):
                used[room].add(_room(name))
            elif name.split(".")[0] == "onnxruntime":
                runtime_users.add(room)
    stale = [f"{room} may import {', '.join(sorted(ALLOWED[room] - used[room]))}, which it does not"
             for room in ALLOWED if ALLOWED[room] - used[room]]
    stale += [f"RUNTIME_USERS names {room}, which imports no onnxruntime"
              for room in RUNTIME_USERS if room not in runtime_users]
    assert not stale, "tests/test_imports.py's table is wider than the code:\n" + "\n".join(stale)


def test_relative_imports_are_resolved_as_python_does():
    """The resolver itself: ``from . import x``, ``from ..x import y`` and a package's ``from .x import y``."""
    found = {m: {name for name, _, _ in _imports(m)} for m in ("onnxfuse.cli", "onnxfuse.cli.bench", "onnxfuse.tune",
                                                               "onnxfuse")}
    assert {"onnxfuse.cli.optimize", "onnxfuse.errors", "onnxfuse.version"} <= found["onnxfuse.cli"]
    assert {"onnxfuse.measure.model_bench", "onnxfuse.cli.render"} <= found["onnxfuse.cli.bench"]
    assert "onnxfuse.measure.path_bench" in found["onnxfuse.tune"]  # from .measure import path_bench
    assert {"onnxfuse.domain", "onnxfuse.pipeline", "onnxfuse.runtime"} <= found["onnxfuse"]
