"""Which execution provider ran which node, read from one run under ORT's profiler. A fused node (an op
some fusion rule writes: ``patterns.emitted_op_types()``) on another provider than the one asked for fails
the benchmark (``ProviderPlacementError``): a silent CPU fallback would make every number measured on it a
lie."""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, field

import numpy as np

from ..errors import ProviderPlacementError
from ..patterns import emitted_op_types
from ..runtime import create_session, provider_list, short_name
from .device_run import output_shapes


@dataclass
class Placement:
    """Which execution provider ran which node, read from ORT's profiler."""

    requested: str  # e.g. CUDAExecutionProvider
    by_provider: dict[str, int]
    by_op: dict[str, dict[str, int]]
    elsewhere: list[dict[str, str]]  # nodes that ran on another provider than requested
    # The op types the fusion rules write (ORT's profile names a node's op type, not its domain).
    fused_ops: tuple[str, ...] = field(default_factory=emitted_op_types)

    @property
    def fused_by_op(self) -> dict[str, int]:
        """How many nodes of each fused op ran (anywhere)."""
        return {op: sum(self.by_op[op].values()) for op in self.fused_ops if op in self.by_op}

    @property
    def fused_nodes(self) -> int:
        return sum(self.fused_by_op.values())

    def fused_elsewhere(self) -> list[dict[str, str]]:
        return [n for n in self.elsewhere if n["op"] in self.fused_ops]

    def check_fused(self) -> None:
        """Raise ``ProviderPlacementError`` if any fused node ran elsewhere than requested."""
        misplaced = self.fused_elsewhere()
        if misplaced:
            where = Counter(short_name(n["provider"]) for n in misplaced)
            ops = "/".join(dict.fromkeys(n["op"] for n in misplaced))
            raise ProviderPlacementError(
                f"{len(misplaced)} of {self.fused_nodes} {ops} nodes ran on {', '.join(where)} instead of "
                f"{short_name(self.requested)} (e.g. '{misplaced[0]['node']}'): no {short_name(self.requested)} "
                "kernel was found for them"
            )

    def summary(self) -> str:
        """'212 nodes: 200 CUDA, 12 CPU (Shape×6, Gather×4, ...)'"""
        total = sum(self.by_provider.values())
        parts = [f"{n} {short_name(p)}" for p, n in sorted(self.by_provider.items(), key=lambda kv: -kv[1])]
        text = f"{total} node{'' if total == 1 else 's'}: {', '.join(parts)}"
        if self.elsewhere:
            ops = Counter(n["op"] for n in self.elsewhere)
            listed = ", ".join(f"{op}×{k}" for op, k in ops.most_common(6))
            text += f" (not on {short_name(self.requested)}: {listed}{', ...' if len(ops) > 6 else ''})"
        return text

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("fused_ops")
        return {**d, "fused_nodes": self.fused_nodes, "fused_by_op": self.fused_by_op}


def read_placement(profile_file: str, requested: str, fused_ops: tuple[str, ...] | None = None) -> Placement:
    """Parse one ORT profile (Chrome trace JSON): every ``Node`` event carries ``op_name`` and
    ``provider``. A node run several times is counted once. ``fused_ops``: the op types to hold to the
    requested provider (default: every op the default fusion rules write)."""
    with open(profile_file) as f:
        events = json.load(f)
    seen: dict[str, tuple[str, str]] = {}
    for event in events:
        args, name = event.get("args") or {}, event.get("name", "")
        # one "<node>_kernel_time" event per node run; fence events, if any, would count a node twice
        if event.get("cat") != "Node" or not name.endswith("_kernel_time") or "provider" not in args:
            continue
        seen[name.removesuffix("_kernel_time")] = (args.get("op_name", "?"), args["provider"])
    by_provider = Counter(p for _, p in seen.values())
    by_op: dict[str, dict[str, int]] = {}
    for op, provider in seen.values():
        by_op.setdefault(op, {}).setdefault(provider, 0)
        by_op[op][provider] += 1
    elsewhere = [{"node": n, "op": op, "provider": p} for n, (op, p) in sorted(seen.items()) if p != requested]
    return Placement(requested, dict(by_provider), by_op, elsewhere,
                     *(() if fused_ops is None else (tuple(fused_ops),)))


def profile_placement(model: str | bytes, provider: str, feeds: dict[str, np.ndarray], label: str | None = None,
                      fused_ops: tuple[str, ...] | None = None) -> Placement:
    """Run the model once under ORT's profiler and report where each node ran. Fails with
    ``ProviderPlacementError`` if a fused node (``fused_ops``, default: every op the default rules write)
    ran on another provider than requested."""
    with tempfile.TemporaryDirectory(prefix="onnxfuse-profile-") as tmp:
        session = create_session(model, provider, profile_dir=tmp, label=label)
        output_shapes(session, feeds)
        profile_file = session.end_profiling()
        placement = read_placement(profile_file, provider_list(provider)[0], fused_ops)
    placement.check_fused()
    return placement
