"""The opset domains ONNX Runtime reads a model in without the model importing them.

A model whose nodes use ``com.microsoft`` (ORT's contrib ops: ``Attention``, ``SkipLayerNormalization``,
``BiasGelu``…) or ``ai.onnx.ml`` without an ``opset_import`` entry for that domain is not valid ONNX, but
ORT runs it: its ``Model`` constructor (``onnxruntime/core/graph/model.cc``) adds, for every domain its
schema registry knows that the model does not import, an import of that domain at the registry's latest
version, before it builds the graph. ORT's own test models and the output of older converters rely on it.

onnxfuse takes such a model as ORT takes it: the domain is declared at the version ORT assumes, in the
model that is rewritten and so in the output (where ``onnx.checker`` can then judge it), and the load says
so in a warning. A domain ORT does not know (``ai.unknown``) is still an error, as it is for ORT.

The versions are asked of the installed ORT itself (``runtime.ort_implied_opsets``), once per process:
they change with every ORT release (the default domain's latest opset, ``ai.onnx.ml``'s), so a table here
would drift from the runtime that judges the model. This module is the pure part, which model loading
uses without importing ONNX Runtime; the caller passes the versions in.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx
from onnx import helper

_DEFAULT_DOMAINS = ("", "ai.onnx")


def canonical(domain: str) -> str:
    """The domain as one name: "ai.onnx" is the default domain "" (ONNX defines them as the same)."""
    return "" if domain in _DEFAULT_DOMAINS else domain


def undeclared_domains(model: onnx.ModelProto, nodes) -> set[str]:
    """Each domain (canonical: "" for the default one) that ``nodes`` use and the model neither imports nor
    defines functions in."""
    imported = {canonical(o.domain) for o in model.opset_import}
    local = {f.domain for f in model.functions}
    return {canonical(n.domain) for n in nodes if canonical(n.domain) not in imported and n.domain not in local}


def declare_implied(model: onnx.ModelProto, nodes, implied_versions: Callable[[], dict[str, int]]) -> dict[str, int]:
    """Import into ``model`` every domain ``nodes`` use undeclared that ORT imports by itself, at the version
    ``implied_versions()`` gives (in the domains' order); returns {domain: version} of what was declared."""
    undeclared = undeclared_domains(model, nodes)
    implied = implied_versions() if undeclared else {}
    declared = {d: implied[d] for d in sorted(undeclared) if d in implied}  # the rest: refused by the caller
    for d, version in declared.items():
        model.opset_import.append(helper.make_opsetid(d, version))
    return declared
