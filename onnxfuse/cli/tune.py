"""``onnxfuse tune``: ``tune.tune_file`` (each FusedLinearGelu node's CUDA path measured on this GPU), rendered."""

from __future__ import annotations

import click

from .options import (APPROXIMATE_MEANING, approximation_budget_options, error_budget, output_beside, parse_batches,
                      verbosity_options)
from .render import echo_warnings, emit_json, progress_bar, render_tune


@click.command("tune", context_settings={"max_content_width": 110})
@click.argument("model")
@click.option("-o", "--output", metavar="OUT",
              help="Where to write the tuned model (default: beside MODEL, model.onnx → model.tuned.onnx).")
@click.option("--provider", type=click.Choice(["cuda"]), default="cuda", show_default=True,
              help="Execution provider to tune for (the CUDA kernel's paths are what is chosen).")
@click.option("--batch", "batch_list", metavar="B1,B2,...",
              help="Batch sizes the model will run at (axis 0 of every input whose axis 0 is dynamic); "
                   "default 1,8,32 where axis 0 is dynamic, else the model's fixed shape.")
@click.option("--shape", "shape_options", multiple=True, metavar="NAME:DIMS",
              help="Concrete shape of a dynamic input, e.g. input_ids:1,128, input_ids:1x128 or "
                   "input_ids=1,128 (repeatable; its axis 0 is replaced "
                   "by each batch size). Default: other dynamic dims 128.")
@click.option("--reps", type=click.IntRange(min=1), default=30, show_default=True,
              help="Timed runs per path and row count at least (more until the median is stable).")
@click.option("--approximate", default="none", show_default=True, metavar="none|auto",
              help=f"{APPROXIMATE_MEANING} Here (tune measures, it does not impose a form; tanh and sigmoid for "
                   "every node are `onnxfuse optimize --approximate`'s): none, every node keeps its model's GELU "
                   "form. auto: an exact (erf) GELU node switches to an approximate form (--approximate-forms) "
                   "where that form's fastest path is at least 2 % faster at the node's largest row count (twice "
                   "the timing loop's 1 % stability bound) and not 2 % slower at any other, as far as the model's "
                   "error stays within --error-budget; the nodes switched carry approximate=FORM, and the report "
                   "and metadata each node's times and the measured error.")
@approximation_budget_options
@click.option("--samples", type=int, default=None,
              help="With --approximate auto: random input samples the error is measured on (default 4).")
@click.option("--json", "json_path", metavar="FILE", help="Write the report as JSON ('-' for stdout instead of the table).")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Progress bar on stderr.")
@verbosity_options
def tune_command(model, output, provider, batch_list, shape_options, reps, approximate, budget, deprecated_budget,
                 forms_text, samples, json_path, progress):
    """Measure, on this GPU, which CUDA path each FusedLinearGelu node of MODEL should take at the row
    counts it will see, and write OUT with the choice in the nodes.

    For each node (nodes of equal K, N, dtype, transB and activation share one measurement) and each row
    count M its input has at the given batch sizes: the one-kernel path (cuda_path=fused), the
    cuBLASLt + activation path (cuda_path=fallback), at M <= 16 the few-rows path (cuda_path=gemv), and
    ORT's own MatMul+Add+Gelu, interleaved with IO binding. The fastest path per M goes into the node's
    tuned_max_rows / tuned_paths (gemv never as the last entry, which also rules the rows beyond it), with
    tuned_device = this GPU's and library's signature (on another device the node ignores the table), and
    every number into metadata_props["onnxfuse.tuning"]. The input is never modified; OUT is written
    atomically.

    A node that an earlier `tune --approximate auto` switched is put back at exact GELU first: tuning a
    tuned model gives what tuning the model did, and without --approximate auto exact comes back.

    \b
    Exit codes: 0 ok · 1 internal error · 2 bad input (no FusedLinearGelu node: run optimize first;
    bad --batch/--shape; --error-budget/--approximate-forms/--samples without --approximate auto, or auto
    without --error-budget; no CUDA provider or GPU; an op library older than tuning).
    """
    from ..approximation import parse_forms
    from ..inputs import parse_shape_option
    from ..report_paths import check_report_paths
    from ..tune import check_approximation_options, tune_file

    output = output_beside(model, output, "tuned")
    budget = error_budget(budget, deprecated_budget)
    forms = parse_forms(forms_text) if forms_text is not None else None
    check_approximation_options(approximate, budget, forms, samples)
    shapes = dict(parse_shape_option(text) for text in shape_options)
    batches = parse_batches(batch_list) if batch_list is not None else None
    check_report_paths({"--json": json_path}, models_read=[model], models_written=[output])
    with progress_bar(progress, "tune:") as bar:
        report = tune_file(model, output, shapes=shapes, batches=batches, reps=reps, approximate=approximate,
                           budget=budget, forms=forms, samples=samples, progress=bar)
    echo_warnings(report)
    emit_json(report, json_path, extra={"exit_code": 0}, after_writing=output)
    if json_path != "-":
        render_tune(report)
