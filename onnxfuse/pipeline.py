"""The library pipeline: ONNX Runtime's transformer fusions (where asked) → the fusion rules → the written model.

Each step is another module's (``ort_fusions``, ``fuse``, ``model_save``); this one chains them, reads the
input (``model_io``, with ONNX Runtime judging what ``onnx.checker`` rejects: ``runtime``) and fills in the
report. The command line calls these functions and renders what they return.
"""

from __future__ import annotations

import os
import time

import onnx

from . import cost_model, model_io, model_save
from .fuse import fuse_model
from .patterns.graph import base_dir_of
from .report import Report
from .tuning import read_tuning


def _onnxruntime_load_error(model: onnx.ModelProto, source: str | None, *, base_dir: str | None = None) -> str | None:
    """``runtime.onnxruntime_load_error``, imported when asked: only an input ``onnx.checker`` rejects needs
    ONNX Runtime's word, and a rewrite that needs no runtime does not import one."""
    from .runtime import onnxruntime_load_error

    return onnxruntime_load_error(model, source, base_dir=base_dir)


def load_input(path, *, notes: model_io.LoadNotes | None = None, load_external_data: bool = False) -> onnx.ModelProto:
    """The model at ``path`` as ``optimize`` reads it: ``model_io.load_model``, with ONNX Runtime judging a
    model ``onnx.checker`` rejects (tolerated, and said in ``notes``, where ORT loads it)."""
    return model_io.load_model(path, notes=notes, load_external_data=load_external_data,
                               runtime_load_error=_onnxruntime_load_error)


def _rules_after_ort_fusions(model: onnx.ModelProto, target: cost_model.Target, ort_fusions: bool, **fuse_args):
    """fuse_model on the model after ORT's transformer fusions, where asked and applicable (ort_fusions.py
    says why and when). Of ORT's model types the one after which the rules fuse the most blocks is kept
    (then the smaller graph, then ``MODEL_TYPES``' order). Returns the result, the model the rules ran on
    and the step's report (None when not asked)."""
    if not ort_fusions:
        return fuse_model(model, target=target, **fuse_args), model, None
    from .ort_fusions import (MODEL_TYPES, OrtFusionsReport, apply_ort_fusions, restore_external_references,
                              why_not, with_external_data_loaded)

    reason = why_not(model, target.name)
    if reason is not None:
        return fuse_model(model, target=target, **fuse_args), model, OrtFusionsReport(False, why_not=reason).to_dict()
    source, references = model, {}
    if model_io.external_tensors(model):  # ORT's fusions read constants: on a copy with the data loaded
        source, references = with_external_data_loaded(model, fuse_args["base_dir"])
    best, failures = None, []
    for rank, model_type in enumerate(MODEL_TYPES):
        fused_input, step = apply_ort_fusions(source, model_type=model_type, use_gpu=target.name == "cuda")
        if not step.applied:
            failures.append(step)
            continue
        if references:  # what ORT kept as it was is read from the input's data file again, and streamed
            restore_external_references(fused_input, references, source)
        result = fuse_model(fused_input, target=target, **fuse_args)
        # a bias moved into an existing node is no block fused: the fusion set that lets both rank alike
        fused = sum(not b.details.get("moves_only") for b in result.report.fused)
        score = (fused, -len(result.model.graph.node), -rank)
        if best is None or score > best[0]:
            best = (score, result, fused_input, step)
    if best is None:
        return fuse_model(model, target=target, **fuse_args), model, failures[0].to_dict()
    _, result, fused_input, step = best
    return result, fused_input, step.to_dict()


def inspect_file(path, *, target: str = cost_model.DEFAULT_TARGET, ort_fusions: bool = False) -> Report:
    """What ``optimize`` would do to the model at ``path`` for ``target``: ORT's transformer fusions first
    (``ort_fusions``), then the blocks it would fuse and every refusal, and a tuned model's path tables. The
    rewrite runs in memory (on placeholders: external weights are not read, except where ORT's fusions are
    asked for, which read the constants they fuse); nothing is written."""
    start = time.perf_counter()
    target = cost_model.get_target(target)  # an unknown name is refused before the model is read
    notes = model_io.LoadNotes()
    model = load_input(path, notes=notes)
    result, _, step = _rules_after_ort_fusions(model, target, ort_fusions, base_dir=base_dir_of(path))
    report = result.report
    report.ort_fusions = step
    report.tuning = read_tuning(model)
    report.warnings = notes.warnings
    report.model = os.fspath(path)
    report.seconds = time.perf_counter() - start
    return report


def optimize_file(input_path, output_path, *, approximate: str | None = None, before_publish=None,
                  target: str = cost_model.DEFAULT_TARGET, ort_fusions: bool = False) -> Report:
    """Load ``input_path``, run ORT's transformer fusions (``ort_fusions``; ort_fusions.py says when they
    apply), fuse for ``target``, check, and write ``output_path`` atomically (external data streamed).
    ``before_publish(temp_model_path)`` runs on the finished file before it takes ``output_path``'s place;
    an exception it raises leaves ``output_path`` as it was."""
    start = time.perf_counter()
    target = cost_model.get_target(target)
    model_save.check_output_path(input_path, output_path)
    notes = model_io.LoadNotes()
    model = load_input(input_path, notes=notes)
    result, model, step = _rules_after_ort_fusions(model, target, ort_fusions, approximate=approximate,
                                                   base_dir=base_dir_of(input_path))
    # onnx.checker (full check) guards every output it can judge: all but models with ORT-only ops in the
    # default domain (ORT's transformers optimizer output), which it rejects before we touch them. An
    # input it rejects (that ORT runs) may keep its own checker error, and gain none.
    result.save(output_path, check=model_io.checkable(model), before_publish=before_publish,
                input_checker_error=notes.checker_error)
    report = result.report
    report.warnings = notes.warnings
    report.ort_fusions = step
    report.model, report.output = os.fspath(input_path), os.fspath(output_path)
    report.seconds = time.perf_counter() - start
    return report
