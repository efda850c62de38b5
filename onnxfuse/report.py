"""What an optimize/inspect run did: the Report owns the counts, the refusals and the exit code; the CLI only
renders it."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field

from .errors import EXIT_OK


@dataclass(frozen=True)
class FusedBlock:
    """One ``FusedLinearGelu`` node written: its name, the source form it replaced and the nodes it replaced."""

    name: str
    form: str
    replaced: tuple[str, ...]
    approximate: str


@dataclass(frozen=True)
class RefusedBlock:
    """A candidate left exactly as it was: the rule that refused it and why."""

    rule: str
    reason: str
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class MathChange:
    """A fused node whose activation was changed on purpose (``--approximate``)."""

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
    seconds: float | None = None
    # What was tolerated in an input ONNX Runtime runs (nodes re-ordered, an onnx.checker error): one line each
    warnings: list[str] = field(default_factory=list)

    @property
    def fused_by_form(self) -> dict[str, int]:
        return dict(sorted(Counter(b.form for b in self.fused).items()))

    @property
    def exit_code(self) -> int:
        # Refusals are the rules doing their job, not failures: the run succeeded.
        return EXIT_OK

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "output": self.output,
            "fused": len(self.fused),
            "fused_by_form": self.fused_by_form,
            "refused": len(self.refused),
            "approximate": self.approximate,
            "math_changed": [asdict(c) for c in self.math_changed],
            "blocks": [asdict(b) for b in self.fused],
            "refusals": [asdict(r) for r in self.refused],
            "warnings": list(self.warnings),
            "seconds": None if self.seconds is None else round(self.seconds, 3),
            "exit_code": self.exit_code,
        }
