"""The opset domains ONNX Runtime reads a model in without the model importing them.

A model whose nodes use ``com.microsoft`` (ORT's contrib ops: ``Attention``, ``SkipLayerNormalization``,
``BiasGelu``…) or ``ai.onnx.ml`` without an ``opset_import`` entry for that domain is not valid ONNX, but
ORT runs it: its ``Model`` constructor (``onnxruntime/core/graph/model.cc``) adds, for every domain its
schema registry knows that the model does not import, an import of that domain at the registry's latest
version, before it builds the graph. ORT's own test models and the output of older converters rely on it.

onnxfuse takes such a model as ORT takes it: the domain is declared at the version ORT assumes, in the
model that is rewritten and so in the output (where ``onnx.checker`` can then judge it), and the load says
so in a warning. A domain ORT does not know (``ai.unknown``) is still an error, as it is for ORT.

The versions are asked of the installed ORT itself, once per process: they change with every ORT release
(the default domain's latest opset, ``ai.onnx.ml``'s), so a table here would drift from the runtime that
judges the model. A model with no node is loaded with graph optimizations off and the opset imports ORT
writes back (``optimized_model_filepath``) are read.
"""

from __future__ import annotations

import functools
import os
import tempfile

import onnx
from onnx import helper

_DEFAULT_DOMAINS = ("", "ai.onnx")
_PROBE_DOMAIN = "ai.onnxfuse.probe"  # a domain ORT does not know: the probe model must import something
_PROBE_IR_VERSION = 8  # read by every ORT this package supports


def canonical(domain: str) -> str:
    """The domain as one name: "ai.onnx" is the default domain "" (ONNX defines them as the same)."""
    return "" if domain in _DEFAULT_DOMAINS else domain


@functools.lru_cache(maxsize=1)
def ort_implied_versions() -> dict[str, int]:
    """{domain: version} that the installed ONNX Runtime imports by itself into a model that does not name the
    domain ({} if ORT cannot tell: every undeclared domain is then refused)."""
    import onnxruntime as ort

    graph = helper.make_graph([], "probe", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(_PROBE_DOMAIN, 1)])
    model.ir_version = _PROBE_IR_VERSION
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4
    with tempfile.TemporaryDirectory(prefix="onnxfuse-opsets-") as tmp:
        so.optimized_model_filepath = os.path.join(tmp, "probe.onnx")
        try:
            ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
            written = onnx.load_model(so.optimized_model_filepath, load_external_data=False)
        except Exception:  # noqa: BLE001 - an ORT that cannot say: nothing is assumed
            return {}
    return {canonical(o.domain): int(o.version) for o in written.opset_import if o.domain != _PROBE_DOMAIN}


def undeclared_domains(model: onnx.ModelProto, nodes) -> set[str]:
    """Each domain (canonical: "" for the default one) that ``nodes`` use and the model neither imports nor
    defines functions in."""
    imported = {canonical(o.domain) for o in model.opset_import}
    local = {f.domain for f in model.functions}
    return {canonical(n.domain) for n in nodes if canonical(n.domain) not in imported and n.domain not in local}


def declare_implied(model: onnx.ModelProto, nodes) -> dict[str, int]:
    """Import into ``model`` every domain ``nodes`` use undeclared that ORT imports by itself, at ORT's version
    (in the domains' order); returns {domain: version} of what was declared."""
    undeclared = undeclared_domains(model, nodes)
    implied = ort_implied_versions() if undeclared else {}
    declared = {d: implied[d] for d in sorted(undeclared) if d in implied}  # the rest: refused by the caller
    for d, version in declared.items():
        model.opset_import.append(helper.make_opsetid(d, version))
    return declared
