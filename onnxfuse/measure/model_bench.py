"""Model mode: an optimized model (and its baseline, interleaved with it) timed at each batch size, with
the same inputs for both and the placement of every node."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Sequence

import onnx

from ..errors import BadInputError
from ..inputs import input_specs, random_inputs, resolve_shapes
from ..runtime import create_session
from .device_run import DeviceRun, output_shapes
from .environment import SCHEMA, environment
from .placement import Placement, profile_placement
from .progress import Steps
from .timing import Timing, TimingPolicy, measure

if TYPE_CHECKING:
    from rich.progress import Progress


@dataclass
class BatchResult:
    batch: int
    shapes: dict[str, tuple[int, ...]]
    optimized: Timing
    baseline: Timing | None

    @property
    def speedup(self) -> float | None:
        """Baseline latency ÷ optimized latency (medians): > 1 means the optimized model is faster."""
        return None if self.baseline is None else self.baseline.median_ms / self.optimized.median_ms

    def to_dict(self) -> dict:
        return {
            "batch": self.batch,
            "shapes": {k: list(v) for k, v in self.shapes.items()},
            "optimized": self.optimized.to_dict(),
            "baseline": None if self.baseline is None else self.baseline.to_dict(),
            "speedup": self.speedup,
        }


@dataclass
class ModelBenchReport:
    optimized: str
    baseline: str | None
    provider: str
    cuda_graph: bool
    policy: TimingPolicy
    placement: dict[str, Placement]  # "optimized"/"baseline" -> placement
    results: list[BatchResult] = field(default_factory=list)
    exit_code: int = 0

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA,
            "mode": "model",
            "provider": self.provider,
            "cuda_graph": self.cuda_graph,
            "models": {"optimized": self.optimized, "baseline": self.baseline},
            "placement": {k: v.to_dict() for k, v in self.placement.items()},
            "policy": asdict(self.policy),
            "results": [r.to_dict() for r in self.results],
            "environment": environment(),
        }


def batch_shapes(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]], batches: Sequence[int] | None) -> list[tuple[int, dict]]:
    """For each batch size, the concrete input shapes: ``shapes`` (from ``--shape``) and the defaults of
    ``onnxfuse.inputs`` fix every dynamic dim; the batch size then replaces axis 0 of every input whose
    axis 0 is dynamic in the model. Without ``batches``: the one resolved batch."""
    specs = input_specs(model)
    resolved = resolve_shapes(specs, shapes)
    batched = [s for s in specs if s.shape and not isinstance(s.shape[0], int)]
    if not batches:
        first = next(iter(resolved.values()), ())
        return [(first[0] if first else 1, resolved)]
    if any(b < 1 for b in batches):
        raise BadInputError(f"--batch {','.join(map(str, batches))}: batch sizes must be ≥ 1")
    if not batched:
        raise BadInputError(
            "--batch: no input of the model has a dynamic axis 0 "
            f"({', '.join(s.describe() for s in specs)}); its batch size is fixed"
        )
    out = []
    for b in dict.fromkeys(batches):  # each size once, in the order given
        shaped = {
            name: ((b,) + dims[1:] if any(s.name == name for s in batched) else dims) for name, dims in resolved.items()
        }
        out.append((b, shaped))
    return out


def _load_for_specs(path: str) -> onnx.ModelProto:
    """The graph without external weights: enough for input specs and embedding-table sizes. Read and
    checked by ``model_io.load_model`` (empty, truncated, a folder, a git-LFS pointer, missing external data:
    each one line; a model onnx.checker rejects and ONNX Runtime loads is timed as ORT runs it)."""
    from .. import model_io
    from ..runtime import load_probes

    return model_io.load_model(path, **load_probes())


def bench_models(
    optimized: str,
    baseline: str | None = None,
    *,
    provider: str = "cuda",
    shapes: dict[str, tuple[int, ...]] | None = None,
    batches: Sequence[int] | None = None,
    cuda_graph: bool = False,
    policy: TimingPolicy = TimingPolicy(),
    seed: int = 0,
    progress: Progress | None = None,
) -> ModelBenchReport:
    """Latency of ``optimized`` (and ``baseline``, interleaved with it) at each batch size, on
    ``provider``. Both models get the same inputs, which must fit both."""
    paths = {"optimized": optimized} | ({"baseline": baseline} if baseline else {})
    protos = {role: _load_for_specs(p) for role, p in paths.items()}
    plan = batch_shapes(protos["optimized"], shapes or {}, batches)
    if baseline:
        _check_same_inputs(protos["optimized"], protos["baseline"])
    feeds = {b: random_inputs(protos["optimized"], s, seed=seed) for b, s in plan}

    step = Steps(progress, ["placement"] + [f"batch {b}" for b, _ in plan])
    placement = {role: profile_placement(p, provider, feeds[plan[0][0]]) for role, p in paths.items()}
    report = ModelBenchReport(optimized, baseline, provider, cuda_graph, policy, placement)
    step()
    # One plain session per model learns the output shapes of every batch size and, without CUDA
    # graphs, also serves the timed runs; a captured CUDA graph is tied to its shapes and addresses, so
    # with graphs each batch size gets a session of its own.
    plain = {role: create_session(p, provider) for role, p in paths.items()}
    for b, batch_input_shapes in plan:
        runs = []
        for role, path in paths.items():
            session = create_session(path, provider, cuda_graph=True) if cuda_graph else plain[role]
            runs.append(DeviceRun(session, feeds[b], output_shapes(plain[role], feeds[b])))
        timings = measure(runs, policy, items=b)
        report.results.append(BatchResult(b, batch_input_shapes, timings[0], timings[1] if baseline else None))
        step()
    return report


def _check_same_inputs(optimized: onnx.ModelProto, baseline: onnx.ModelProto) -> None:
    a = {s.name: s.elem_type for s in input_specs(optimized)}
    b = {s.name: s.elem_type for s in input_specs(baseline)}
    if a != b:
        raise BadInputError(
            "the baseline takes other inputs than the optimized model "
            f"({sorted(b.items())} vs {sorted(a.items())}): compare a model with its own optimized version"
        )
