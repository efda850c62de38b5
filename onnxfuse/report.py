"""What an optimize/inspect run did: the Report owns the counts and the refusals; the CLI only renders it.

Blocks are reported the same way whatever rule made them: the node written, the rule, the op it is, the
source form it replaced, the nodes it replaced, and the rule's own details (for the GELU rule, the
``approximate`` form the node computes)."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class FusedBlock:
    """One fused node written: its name, the rule that planned it, its op (``domain.op_type``), the source
    form it replaced, the nodes it replaced, and rule-specific details."""

    name: str
    rule: str
    op: str
    form: str
    replaced: tuple[str, ...]
    details: dict[str, object] = field(default_factory=dict, hash=False, compare=False)

    def to_dict(self) -> dict:
        return {"name": self.name, "rule": self.rule, "op": self.op, "form": self.form,
                "replaced": list(self.replaced), **self.details}


@dataclass(frozen=True)
class RefusedBlock:
    """A candidate left exactly as it was: the rule that refused it and why."""

    rule: str
    reason: str
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class MathChange:
    """A fused node whose math was changed on purpose (``--approximate``)."""

    name: str
    was: str
    now: str


@dataclass
class Report:
    model: str | None = None
    output: str | None = None
    fused: list[FusedBlock] = field(default_factory=list)
    refused: list[RefusedBlock] = field(default_factory=list)
    math_changed: list[MathChange] = field(default_factory=list)
    approximate: str | None = None
    target: str | None = None  # what the model was optimized for (cost_model.TARGETS)
    seconds: float | None = None
    # A tuned model's CUDA path tables (tuning.read_tuning), for inspect; None when it has none
    tuning: dict | None = None
    # What was tolerated in an input ONNX Runtime runs (nodes re-ordered, an onnx.checker error): one line each
    warnings: list[str] = field(default_factory=list)
    # The library step before the rules (ort_fusions.OrtFusionsReport.to_dict()); None when it was not asked
    ort_fusions: dict | None = None
    # Nodes per op type ("domain.op_type" outside ONNX's domain, subgraphs counted) in the input and in the
    # model written: {"before": {...}, "after": {...}}; None before a rewrite ran
    op_counts: dict[str, dict[str, int]] | None = None
    # The input was optimized by onnxfuse already (provenance.Provenance.to_dict(): its stamp's version and
    # rules; version None for a model from before stamps); None otherwise
    already_optimized: dict | None = None

    @property
    def fused_by_form(self) -> dict[str, int]:
        return dict(sorted(Counter(b.form for b in self.fused).items()))

    @property
    def fused_by_op(self) -> dict[str, int]:
        return dict(sorted(Counter(b.op for b in self.fused).items()))

    def to_dict(self) -> dict:
        # Refusals are the rules doing their job, not failures: a report is written only for a run that
        # succeeded, so the process's exit code (which the CLI adds) is 0 unless a later gate failed.
        return {
            "model": self.model,
            "output": self.output,
            "fused": len(self.fused),
            "fused_by_form": self.fused_by_form,
            "fused_by_op": self.fused_by_op,
            "refused": len(self.refused),
            "approximate": self.approximate,
            "target": self.target,
            "math_changed": [asdict(c) for c in self.math_changed],
            "blocks": [b.to_dict() for b in self.fused],
            "refusals": [asdict(r) for r in self.refused],
            "tuning": self.tuning,
            "warnings": list(self.warnings),
            "ort_fusions": self.ort_fusions,
            "op_counts": self.op_counts,
            "already_optimized": self.already_optimized,
            "seconds": None if self.seconds is None else round(self.seconds, 3),
        }
