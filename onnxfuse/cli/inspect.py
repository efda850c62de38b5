"""``onnxfuse inspect``: ``pipeline.inspect_file`` (what optimize would fuse, and why not), rendered."""

from __future__ import annotations

import click

from .options import ort_fusions_option, target_option, verbosity_options
from .render import StepStatus, echo_warnings, emit_json, render_rewrite


@click.command("inspect", context_settings={"max_content_width": 110})
@click.argument("model")
@click.option("--json", "json_out", is_flag=True, help="Print the report as JSON instead of tables.")
@target_option
@ort_fusions_option
@verbosity_options
def inspect_command(model, json_out, target, ort_fusions):
    """List every candidate block of MODEL (each fusion rule's): what would be fused into which op, and for
    every refusal the rule and its reason (the cost model's, for a block --target leaves alone). Writes nothing."""
    from ..pipeline import inspect_file

    with StepStatus(show=True) as steps:
        report = inspect_file(model, target=target, ort_fusions=ort_fusions, on_step=steps)
    echo_warnings(report)
    steps.echo_times()
    if json_out:
        emit_json(report, "-", extra={"exit_code": 0})
    else:
        render_rewrite(report, title=f"{report.model} (inspect: nothing written)", blocks=True)
