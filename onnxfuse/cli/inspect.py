"""``onnxfuse inspect``: ``pipeline.inspect_file`` (what optimize would fuse, and why not), rendered."""

from __future__ import annotations

import click

from .options import json_option_or_switch, model_and_json_path, ort_fusions_option, target_option, verbosity_options
from .render import StepStatus, echo_warnings, emit_json, render_rewrite


@click.command("inspect", context_settings={"max_content_width": 110})
@click.argument("model", required=False, metavar="MODEL")
@json_option_or_switch
@target_option
@ort_fusions_option
@verbosity_options
def inspect_command(model, json_value, target, ort_fusions):
    """List every candidate block of MODEL (each fusion rule's): what would be fused into which op, and for
    every refusal the rule and its reason (the cost model's, for a block --target leaves alone). Writes nothing
    but the --json report."""
    from ..pipeline import inspect_file
    from ..report_paths import check_report_paths

    model, report_path = model_and_json_path(model, json_value)
    if model is None:
        ctx = click.get_current_context()
        raise click.MissingParameter(ctx=ctx, param=next(p for p in ctx.command.params if p.name == "model"))
    check_report_paths({"--json": report_path}, models_read=[model])
    with StepStatus() as steps:
        report = inspect_file(model, target=target, ort_fusions=ort_fusions, on_step=steps)
    echo_warnings(report)
    steps.echo_times()
    emit_json(report, report_path, extra={"exit_code": 0})
    if report_path != "-":
        render_rewrite(report, title=f"{report.model} (inspect: nothing written)", blocks=True)
