"""``onnxfuse tune``: read an optimized model, work out the rows each FusedLinearGelu sees, measure each
path on the GPU, write the model with the choices — the order in which failures are said: the options, the
model and its shapes first (no GPU needed to be told to run optimize first), then the GPU and the library.

With ``approximate="auto"`` each exact-GELU node is also timed in the approximate forms asked for, and the
forms that pay are kept as far as the model's error against the exact model stays within ``budget``
(``approximation``: the choosing; ``accuracy``: the error, measured on the GPU).

The choosing and writing are ``tuning``'s and ``approximation``'s pure functions; the measuring is
``measure.path_bench``'s and ``accuracy``'s.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

import onnx

from . import model_io, model_save
from .accuracy import ErrorChecker, reference_checker
from .approximation import (DEFAULT_FORMS, FORMS, FormChoice, NodeForms, approximation_record, choose_forms,
                            node_forms, restore_forms, variants, with_forms)
from .measure import path_bench
from .measure.model_bench import batch_shapes
from .measure.progress import Steps
from .domain import GEMV_MAX_ROWS
from .errors import BadInputError
from .inputs import input_specs
from .patterns.graph import base_dir_of
from .runtime import load_probes
from .tuning import (Device, Measure, Measured, NodeTuning, apply_tuning, measure_each, nested_count,
                     node_tunings, row_counts, tunable_nodes, tuning_record, wanted)

DEFAULT_BATCHES = (1, 8, 32)
APPROXIMATE = ("none", "auto")  # tune's --approximate: exact (each node's own form) or chosen per node
DEFAULT_SAMPLES = 4  # random samples the error of each candidate set is measured on
# (the error checker for a reference model: shapes of one sample, samples, the folder of its external data)
ErrorCheckers = Callable[[onnx.ModelProto, dict, int, str | None], ErrorChecker]


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
    forms: list[NodeForms] = field(default_factory=list)  # --approximate auto: each node's forms
    choice: FormChoice | None = None  # --approximate auto: what was chosen, and the error checks
    restored: list[str] = field(default_factory=list)  # nodes an earlier tune had switched, back at exact
    approximation: dict | None = None  # --approximate auto: the tuning record's "approximation"

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
            "approximation": self.approximation,
            "restored": list(self.restored),
            "warnings": list(self.warnings),
            "seconds": None if self.seconds is None else round(self.seconds, 3),
        }


def tune_plan(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]], batches: Sequence[int] | None):
    """(batch, concrete input shapes) to tune for: ``batches`` (default ``DEFAULT_BATCHES`` where some
    input's axis 0 is dynamic, else the model's one fixed shape) with ``shapes`` fixing the other dims."""
    if batches is None and any(s.shape and not isinstance(s.shape[0], int) for s in input_specs(model)):
        batches = DEFAULT_BATCHES
    return batch_shapes(model, shapes, batches)


def check_approximation_options(approximate: str, budget: float | None, forms: Sequence[str] | None,
                                samples: int | None) -> None:
    """``BadInputError`` for options that do not go together: ``budget``, ``forms`` and ``samples`` belong to
    ``approximate="auto"``, which needs a ``budget`` > 0."""
    if approximate not in APPROXIMATE:
        hint = " (to make every node compute it, `onnxfuse optimize --approximate`)" if approximate in FORMS else ""
        raise BadInputError(f"--approximate {approximate!r}: expected {' or '.join(APPROXIMATE)}{hint}")
    if approximate != "auto":
        given = [name for name, value in (("--error-budget", budget), ("--approximate-forms", forms),
                                          ("--samples", samples)) if value is not None]
        if given:
            raise BadInputError(f"{', '.join(given)}: meaningful only with --approximate auto")
        return
    if budget is None:
        raise BadInputError("--approximate auto needs --error-budget REL, the largest error the model's outputs may "
                            "take (rel-L2 against the exact model, e.g. 1e-3)")
    if not (budget > 0 and math.isfinite(budget)):
        raise BadInputError(f"--error-budget must be a finite number > 0, got {budget}")
    if forms is not None and (not forms or set(forms) - set(FORMS)):
        raise BadInputError(f"--approximate-forms: expected {' and/or '.join(FORMS)}, got {', '.join(forms) or 'none'}")
    if samples is not None and samples < 1:
        raise BadInputError(f"--samples must be at least 1, got {samples}")


def _gpu_error_checker(model: onnx.ModelProto, shapes: dict, samples: int, base_dir: str | None) -> ErrorChecker:
    return reference_checker(model, shapes=shapes, samples=samples, base_dir=base_dir, provider="cuda")


def _choose_forms(model: onnx.ModelProto, tunings: list[NodeTuning], variant_nodes: dict[str, list],
                  rows: dict[str, dict[int, int]], measured: Measured, budget: float,
                  error_of: ErrorChecker) -> tuple[list[NodeTuning], list[NodeForms], FormChoice]:
    """--approximate auto on measurements taken: each node's forms that pay, the choice within ``budget``
    (each candidate set written into ``model`` and handed to ``error_of``), and the tunings to write — a
    switched node's table is its form's."""
    by_form = {form: {t.node.name: t for t in node_tunings(group, rows, measured)}
               for form, group in variant_nodes.items()}
    per_node = [node_forms(t, {form: found[t.node.name] for form, found in by_form.items() if t.node.name in found})
                for t in tunings]
    choice = choose_forms(per_node, lambda chosen: error_of(with_forms(model, chosen)), budget)
    chosen = [by_form[choice.forms[t.node.name]][t.node.name] if t.node.name in choice.forms else t for t in tunings]
    return chosen, per_node, choice


@dataclass(frozen=True)
class TuneInput:
    """A model to tune as it was read: the graph (its external weights in ``base_dir``), the name the report
    gives it, and what its tuned copy is held to when saved (``model_save.save_model``'s ``check`` and
    ``input_checker_error``), with the warnings reading it gave."""

    model: onnx.ModelProto
    name: str
    base_dir: str | None = None
    check: bool = True
    input_checker_error: str | None = None
    warnings: tuple[str, ...] = ()


def tune_file(input_path, output_path, *, shapes: dict[str, tuple[int, ...]] | None = None,
              batches: Sequence[int] | None = None, reps: int = 30, approximate: str = "none",
              budget: float | None = None, forms: Sequence[str] | None = None, samples: int | None = None,
              measurer: Callable[[int], tuple[Device, Measure]] | None = None,
              error_checkers: ErrorCheckers | None = None, progress=None,
              before_publish: Callable[[str], None] | None = None) -> TuneReport:
    """Tune every FusedLinearGelu node of ``input_path`` and write ``output_path`` atomically (external data
    streamed; the input untouched): :func:`tune_model` on the model as read. The options are checked before
    the model is read, the output path before the work."""
    check_approximation_options(approximate, budget, forms, samples)
    start = time.perf_counter()
    model_save.check_output_path(input_path, output_path)
    notes = model_io.LoadNotes()
    model = model_io.load_model(input_path, notes=notes, **load_probes())
    source = TuneInput(model, os.fspath(input_path), base_dir_of(input_path), model_io.checkable(model),
                       notes.checker_error, tuple(notes.warnings))
    report = tune_model(source, output_path, shapes=shapes, batches=batches, reps=reps, approximate=approximate,
                        budget=budget, forms=forms, samples=samples, measurer=measurer,
                        error_checkers=error_checkers, progress=progress, before_publish=before_publish)
    report.seconds = time.perf_counter() - start
    return report


def tune_model(source: TuneInput, output_path, *, shapes: dict[str, tuple[int, ...]] | None = None,
               batches: Sequence[int] | None = None, reps: int = 30, approximate: str = "none",
               budget: float | None = None, forms: Sequence[str] | None = None, samples: int | None = None,
               measurer: Callable[[int], tuple[Device, Measure]] | None = None,
               error_checkers: ErrorCheckers | None = None, progress=None,
               before_publish: Callable[[str], None] | None = None) -> TuneReport:
    """Tune every FusedLinearGelu node of ``source.model`` and write ``output_path`` atomically (external data
    streamed from ``source.base_dir``; the model in memory is not changed). ``measurer(reps)`` gives the
    device and the measuring callable; the default is ``measure.path_bench.gpu_measurer`` (CUDA provider and a
    GPU, or ``BadInputError``). The model and its shapes are checked before any GPU is looked for.

    The nodes an earlier ``tune --approximate auto`` switched (its record says so) are first put back at
    exact GELU: the output's math follows from the model's own and these options alone. With
    ``approximate="auto"`` the nodes also get the approximate ``forms`` (default tanh) that pay
    (``approximation``) within ``budget``, the model's error measured on ``samples`` random samples at the
    largest batch by ``error_checkers(exact model, shapes, samples, base_dir)`` (default: on the GPU).
    ``before_publish`` is called with the written model before it takes ``output_path``'s place (an exception
    leaves nothing behind; ``optimize --approximate auto --verify`` runs its accuracy gate there)."""
    check_approximation_options(approximate, budget, forms, samples)
    auto = approximate == "auto"
    start = time.perf_counter()
    model, restored, restore_warnings = restore_forms(source.model)
    base_dir = source.base_dir
    nodes = tunable_nodes(model, base_dir)
    plan = tune_plan(model, dict(shapes or {}), batches)
    rows = row_counts(model, nodes, plan, base_dir)
    if measurer is None:
        measurer = path_bench.gpu_measurer  # looked up now: tests put an injected one in its place
    device, measure = measurer(reps)
    forms = tuple(f for f in FORMS if f in (forms or DEFAULT_FORMS))
    variant_nodes = variants(nodes, forms) if auto else {}
    todo = wanted([*nodes, *(n for group in variant_nodes.values() for n in group)], rows)
    count = len(todo)
    step = Steps(progress, [f"{shape.describe()}, M={m}" for shape, m in todo]
                 + (["checking the model's error"] if auto else []) + ["writing"])
    measured = measure_each(todo, measure, on_measured=step)
    tunings = node_tunings(nodes, rows, measured)
    # the row bound gemv was timed under: a record read later says which rows could have chosen it
    settings = {"reps": reps, "provider": "cuda", "gemv_max_rows": GEMV_MAX_ROWS}
    per_node, choice, section = [], None, None
    if auto:
        largest = dict(max(plan, key=lambda p: p[0])[1])
        checkers = _gpu_error_checker if error_checkers is None else error_checkers
        samples = DEFAULT_SAMPLES if samples is None else samples
        tunings, per_node, choice = _choose_forms(model, tunings, variant_nodes, rows, measured, budget,
                                                  checkers(model, largest, samples, base_dir))
        step()
        section = approximation_record(per_node, choice, {"forms": list(forms), "samples": samples,
                                                           "input_shapes": {k: list(v) for k, v in largest.items()}})
    record = tuning_record(tunings, device, plan, settings, approximation=section)
    tuned = apply_tuning(with_forms(model, choice.forms) if choice else model, tunings, record)
    model_save.save_model(tuned, output_path, source_dir=base_dir, check=source.check,
                          input_checker_error=source.input_checker_error, before_publish=before_publish)
    step()
    warnings = list(source.warnings) + restore_warnings
    if nested_count(model):
        warnings.append(f"{nested_count(model)} FusedLinearGelu node(s) inside If/Loop/Scan bodies are not tuned "
                        "(they keep the kernel's built-in choice)")
    return TuneReport(source.name, os.fspath(output_path), device, list(plan), tunings, count, settings,
                      time.perf_counter() - start, warnings, per_node, choice, restored, section)
