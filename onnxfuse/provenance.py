"""Provenance: the mark onnxfuse leaves in ``metadata_props`` of a model it rewrote, so that the model says
later which onnxfuse made it and with which rules, and whether a model is already optimized (``optimize`` then
writes no second copy unless forced).

Two keys, written only where something was fused (a model nothing fused in stays as it was, byte for byte):

* ``onnxfuse.version``: the version that rewrote it last (``version.__version__``);
* ``onnxfuse.rules``: the rules that fused something, sorted and comma-separated; optimizing again with a later
  version adds the rules that rewrote more, since the model holds the work of both.

No time, host or path: optimizing stays deterministic and idempotent (the stamp of an optimized model is already
what optimizing it again would write).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import onnx

from .domain import DOMAIN
from .model_io import all_nodes
from .version import __version__

VERSION_KEY = "onnxfuse.version"
RULES_KEY = "onnxfuse.rules"


@dataclass(frozen=True)
class Provenance:
    """What a model's stamp says: the onnxfuse version that rewrote it and the rules that fused something
    (``version`` None: a model onnxfuse optimized before it left stamps, known by its ops)."""

    version: str | None
    rules: tuple[str, ...]

    def to_dict(self) -> dict:
        return {"version": self.version, "rules": list(self.rules)}


def read(model: onnx.ModelProto) -> Provenance | None:
    """The stamp of ``model``, or None where onnxfuse left none (never optimized, or before stamps existed)."""
    props = {p.key: p.value for p in model.metadata_props}
    if VERSION_KEY not in props:
        return None
    rules = tuple(r for r in props.get(RULES_KEY, "").split(",") if r)
    return Provenance(props[VERSION_KEY], rules)


def already_optimized(model: onnx.ModelProto, fusable_blocks: int) -> Provenance | None:
    """Whether onnxfuse already optimized ``model``: its stamp; or, for a model written before stamps, a
    Provenance without version where ``model`` has nodes of onnxfuse's domain and ``fusable_blocks`` (what the
    rules would fuse in it now) is 0. None for a model onnxfuse has not optimized."""
    stamped = read(model)
    if stamped is not None:
        return stamped
    if fusable_blocks == 0 and any(n.domain == DOMAIN for n in all_nodes(model.graph)):
        return Provenance(None, ())
    return None


def stamp(model: onnx.ModelProto, rules: Iterable[str]) -> None:
    """Mark ``model`` (in place) as rewritten by this onnxfuse with ``rules``, and with the rules its earlier
    stamp names. A key the model has keeps its place and takes the new value; a new key is appended."""
    earlier = read(model)
    values = {VERSION_KEY: __version__,
              RULES_KEY: ",".join(sorted(set(rules) | set(earlier.rules if earlier else ())))}
    for prop in model.metadata_props:
        if prop.key in values:
            prop.value = values.pop(prop.key)
    for key, value in values.items():
        model.metadata_props.add(key=key, value=value)
