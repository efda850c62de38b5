"""``onnxfuse optimize``: the options checked against each other, then ``pipeline.write_optimized`` (the
rewrite, ``--approximate auto``'s tuning, ``--verify``'s gate), its tables and its JSON report."""

from __future__ import annotations

import click

from .options import (APPROXIMATE_MEANING, APPROXIMATE_VALUES, approximation_budget_options, error_budget,
                      ort_fusions_option, output_beside, parse_batches, target_option, verbosity_options)
from .render import (StepStatus, already_optimized_line, echo_warnings, emit_json, progress_bar, quiet, render_compare,
                     render_rewrite, render_tune, result_line)


@click.command("optimize", context_settings={"max_content_width": 110})
@click.argument("model")
@click.option("-o", "--output", metavar="OUT",
              help="Where to write the optimized model (default: beside MODEL, model.onnx → model.fused.onnx).")
@click.option("--json", "json_path", metavar="REPORT", help="Write the report as JSON ('-' for stdout).")
@click.option("--approximate", type=click.Choice(APPROXIMATE_VALUES), default="none", show_default=True,
              help=f"{APPROXIMATE_MEANING} Here: none keeps each block's own math; tanh or sigmoid make every "
                   "fused node compute that GELU form (the report lists the nodes whose math changed); auto is "
                   "the rewrite, then `onnxfuse tune --approximate auto` in the same run (OUT also carries "
                   "tune's per-node path tables; --batch, --shape, --samples and --approximate-forms as tune "
                   "takes them).")
@approximation_budget_options
@click.option("--batch", "batch_list", metavar="B1,B2,...",
              help="With --approximate auto: batch sizes the model will run at (default 1,8,32 where axis 0 is "
                   "dynamic).")
@click.option("--verify", is_flag=True,
              help="Before OUT takes its place, run MODEL and the result in ONNX Runtime on the same inputs "
                   "(as `onnxfuse compare`) and exit 3 without writing OUT if any output drifts.")
@click.option("--keep-failed", is_flag=True, help="With --verify: write OUT even when the gate fails (still exit 3).")
@click.option("--provider", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="With --verify: execution provider for both models.")
@click.option("--samples", type=click.IntRange(min=1), default=None,
              help="With --verify: random input samples (default 2: attention masks whole in the first, padded "
                   "in the others); with --approximate auto also those its error check runs (default 4).")
@click.option("--shape", "shape_options", multiple=True, metavar="NAME:DIMS",
              help="With --verify or --approximate auto: concrete shape of a dynamic input, e.g. "
                   "input_ids:1,128, input_ids:1x128 or input_ids=1,128 (repeatable; auto replaces its axis 0 by "
                   "each batch size).")
@click.option("--force", is_flag=True,
              help="Write OUT even where MODEL is already optimized by onnxfuse (its provenance stamp says so, or, "
                   "for a model written before the stamp, it has onnxfuse's ops and nothing is left to fuse): "
                   "without it such a model is said to be optimized already, exit 0, and nothing is written.")
@click.option("--rtol", type=float, default=None, help="With --verify: relative tolerance (default: per dtype).")
@click.option("--atol", type=float, default=None, help="With --verify: absolute tolerance (default: per dtype).")
@target_option
@ort_fusions_option
@verbosity_options
def optimize_command(model, output, json_path, approximate, budget, deprecated_budget, forms_text, batch_list, verify,
                     keep_failed, provider, samples, shape_options, force, rtol, atol, target, ort_fusions):
    """Rewrite every Linear(+bias)+GELU block of MODEL into one FusedLinearGelu node, and every self-attention
    it can prove into ONNX Runtime's fused attention ops, and write OUT (default: model.fused.onnx beside
    MODEL).

    Everything else stays as it was; external-data models stay external (OUT.data beside OUT). The
    input is never modified; OUT is written atomically. With --verify the accuracy gate of
    `onnxfuse compare` (same default tolerances) judges the result before it is published.

    With --approximate auto the rewrite is followed, in the same run and on this machine's CUDA GPU, by
    `onnxfuse tune --approximate auto`: OUT is the tuned model, and --verify judges that one.

    A model something was fused in says so in its metadata_props (onnxfuse.version, onnxfuse.rules); a
    model onnxfuse optimized already is said to be so, and not written again unless --force.

    \b
    Exit codes: 0 ok · 1 internal error · 2 bad input (unreadable model, missing external data,
    unwritable output; --approximate auto without --error-budget, or without a CUDA provider and GPU)
    · 3 --verify: outputs outside tolerance (OUT not written unless --keep-failed).
    """
    from ..approximation import parse_forms
    from ..cost_model import get_target
    from ..errors import EXIT_ACCURACY, EXIT_OK, AccuracyGateError, BadInputError
    from ..inputs import parse_shape_option
    from ..pipeline import AutoApproximation, Verify, approximation_hint, write_optimized

    get_target(target)  # a bad --target is said before anything else is looked at
    output = output_beside(model, output, "fused")
    budget = error_budget(budget, deprecated_budget)
    auto = approximate == "auto"
    every_node = approximate if approximate in ("tanh", "sigmoid") else None  # the form every fused node takes
    forms = parse_forms(forms_text) if forms_text is not None else None
    if auto:
        from ..tune import check_approximation_options

        check_approximation_options("auto", budget, forms, samples)
        if target != "cuda":
            raise BadInputError(f"--approximate auto times the CUDA kernel's forms: it needs --target cuda, not {target}")
    else:
        auto_only = {"--error-budget": budget is not None, "--approximate-forms": forms is not None,
                     "--batch": batch_list}
        given = [name for name, value in auto_only.items() if value]
        if given:
            raise BadInputError(f"{', '.join(given)}: meaningful only with --approximate auto")
    verify_only = {"--keep-failed": keep_failed, "--rtol": rtol, "--atol": atol, "--provider": provider != "cpu",
                   "--shape": shape_options and not auto, "--samples": samples is not None and not auto}
    misplaced = [name for name, given in verify_only.items() if given and not verify]
    if misplaced:
        raise BadInputError(f"{', '.join(misplaced)}: meaningful only with --verify" +
                            ("" if auto else " (or --approximate auto, for --shape and --samples)"))
    shapes = dict(parse_shape_option(text) for text in shape_options)
    batches = parse_batches(batch_list) if batch_list is not None else None
    from ..report_paths import check_report_paths

    # before writing the model: a report path that cannot be written, or that is a model file of this run
    check_report_paths({"--json": json_path}, models_read=[model], models_written=[output])

    verify_with = Verify(provider, samples or 2, shapes, rtol, atol, keep_failed) if verify else None
    auto_with = AutoApproximation(budget, forms, shapes, batches, samples) if auto else None
    with StepStatus() as steps:
        def show_verdict(verdict) -> None:
            steps.pause()  # the table on stdout, not under the status line on the same terminal
            render_compare(verdict)

        def tune_bar():
            steps.pause()  # tune's progress bar takes the terminal
            return progress_bar(True, "tune:")

        written = write_optimized(model, output, target=target, ort_fusions=ort_fusions,
                                  approximate=every_node, auto=auto_with, verify=verify_with,
                                  on_verdict=show_verdict if json_path != "-" and not quiet() else None,
                                  tune_progress=tune_bar, on_step=steps, force=force)
    report, tuned, verdict = written.report, written.tuned, written.verdict
    echo_warnings(report)
    steps.echo_times()
    if written.skipped_already_optimized:
        emit_json(report, json_path, extra={"exit_code": EXIT_OK})
        if json_path != "-":
            result_line(already_optimized_line(report, output))
        return
    if json_path != "-":
        render_rewrite(report, title=f"{report.model} → {report.output}")
        if tuned is not None and not quiet():  # quiet: the rewrite's line is the one result
            render_tune(tuned)
    failed = verdict is not None and not verdict.passed
    extra = {"verify": verdict.to_dict()} if verdict is not None else {}
    if tuned is not None:
        extra["tune"] = tuned.to_dict()
    # The report's exit_code is the one this process ends with: 3 when --keep-failed wrote a model outside
    # tolerance (without --keep-failed the gate stops the run before any report is written).
    emit_json(report, json_path, extra={**extra, "exit_code": EXIT_ACCURACY if failed else EXIT_OK},
              after_writing=output)
    if failed:
        hint = approximation_hint(verdict, approximate=every_node, auto=auto_with)
        raise AccuracyGateError(f"{output} written (--keep-failed) but outside tolerance: {verdict.summary()}{hint}")
