"""``onnxfuse tune``: read an optimized model, work out the rows each FusedLinearGelu sees, measure each
path on the GPU, write the model with the choices — the order in which failures are said: the model and its
shapes first (no GPU needed to be told to run optimize first), then the GPU and the library.

The choosing and writing are ``tuning``'s pure functions; the measuring is ``bench.path_bench``'s.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

import onnx

from . import model_io
from .bench import path_bench
from .bench.model_bench import batch_shapes
from .bench.progress import Steps
from .inputs import input_specs
from .patterns.graph import base_dir_of
from .tuning import (Device, Measure, NodeTuning, apply_tuning, measure_all, nested_count,
                     row_counts, tunable_nodes, tuning_record, wanted)

DEFAULT_BATCHES = (1, 8, 32)


@dataclass
class TuneReport:
    model: str
    output: str
    device: Device
    plan: list[tuple[int, dict]]
    tunings: list[NodeTuning]
    measurements: int
    settings: dict
    seconds: float | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def forced(self) -> list[str]:
        """Nodes whose own cuda_path forces a path: their table is written but not used."""
        return [t.node.name for t in self.tunings if t.node.cuda_path != "auto"]

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "output": self.output,
            "device": asdict(self.device),
            "batches": [b for b, _ in self.plan],
            "input_shapes": {str(b): {k: list(v) for k, v in s.items()} for b, s in self.plan},
            "settings": self.settings,
            "measurements": self.measurements,
            "nodes": {t.node.name: t.to_dict() for t in self.tunings},
            "forced": self.forced,
            "warnings": list(self.warnings),
            "seconds": None if self.seconds is None else round(self.seconds, 3),
        }


def tune_plan(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]], batches: Sequence[int] | None):
    """(batch, concrete input shapes) to tune for: ``batches`` (default ``DEFAULT_BATCHES`` where some
    input's axis 0 is dynamic, else the model's one fixed shape) with ``shapes`` fixing the other dims."""
    if batches is None and any(s.shape and not isinstance(s.shape[0], int) for s in input_specs(model)):
        batches = DEFAULT_BATCHES
    return batch_shapes(model, shapes, batches)


def tune_file(input_path, output_path, *, shapes: dict[str, tuple[int, ...]] | None = None,
              batches: Sequence[int] | None = None, reps: int = 30,
              measurer: Callable[[int], tuple[Device, Measure]] | None = None,
              progress=None) -> TuneReport:
    """Tune every FusedLinearGelu node of ``input_path`` and write ``output_path`` atomically (external data
    streamed; the input untouched). ``measurer(reps)`` gives the device and the measuring callable; the
    default is ``bench.path_bench.gpu_measurer`` (CUDA provider and a GPU, or ``BadInputError``). The model
    and its shapes are checked before any GPU is looked for."""
    start = time.perf_counter()
    model_io.check_output_path(input_path, output_path)
    notes = model_io.LoadNotes()
    model = model_io.load_model(input_path, notes=notes)
    base_dir = base_dir_of(input_path)
    nodes = tunable_nodes(model, base_dir)
    plan = tune_plan(model, dict(shapes or {}), batches)
    rows = row_counts(model, nodes, plan, base_dir)
    if measurer is None:
        measurer = path_bench.gpu_measurer  # looked up now: tests put an injected one in its place
    device, measure = measurer(reps)
    todo = wanted(nodes, rows)
    count = len(todo)
    step = Steps(progress, [f"{shape.describe()}, M={m}" for shape, m in todo] + ["writing"])
    tunings = measure_all(nodes, rows, measure, on_measured=step)
    settings = {"reps": reps, "provider": "cuda"}
    record = tuning_record(tunings, device, plan, settings)
    tuned = apply_tuning(model, tunings, record)
    model_io.save_model(tuned, output_path, source_dir=base_dir, check=model_io.checkable(model),
                        input_checker_error=notes.checker_error)
    step()
    warnings = list(notes.warnings)
    if nested_count(model):
        warnings.append(f"{nested_count(model)} FusedLinearGelu node(s) inside If/Loop/Scan bodies are not tuned "
                        "(they keep the kernel's built-in choice)")
    return TuneReport(os.fspath(input_path), os.fspath(output_path), device, list(plan), tunings, count, settings,
                      time.perf_counter() - start, warnings)
