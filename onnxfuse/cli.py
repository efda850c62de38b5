"""Command line: parse, call, render. No logic lives here.

Each command calls one function of the library, which returns a report object (or raises an
``OnnxfuseError``); this module prints it (rich for people, ``--json`` for machines) and exits with the
code the report or the error carries (see ``onnxfuse.errors``).
"""

from __future__ import annotations

import os
import sys

import click

from .version import __version__
from .errors import EXIT_INTERNAL, OnnxfuseError


def _usage_error(e: click.UsageError) -> None:
    """A usage error (an unknown option, a missing argument, a value click's own types refuse) as every other
    bad input: one line on stderr, exit 2; click's usage block would be four lines and a blank."""
    where = f" See '{e.ctx.command_path} --help'." if e.ctx is not None else ""
    click.echo(f"onnxfuse: error: {e.format_message()}{where}", err=True)
    sys.exit(e.exit_code)


class _Group(click.Group):
    """Turns every failure into one line on stderr and a distinct exit code, never a traceback
    (set ONNXFUSE_DEBUG=1 to see one)."""

    def make_context(self, info_name, args, parent=None, **extra):
        # the group's own options (`onnxfuse --bogus`); a command's are parsed in invoke
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.exceptions.NoArgsIsHelpError:
            raise  # bare `onnxfuse`: the help, as click shows it
        except click.UsageError as e:
            _usage_error(e)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except OnnxfuseError as e:
            click.echo(f"onnxfuse: error: {e}", err=True)
            sys.exit(e.exit_code)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as e:
            _usage_error(e)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException, SystemExit):
            raise
        except KeyboardInterrupt:
            click.echo("onnxfuse: interrupted", err=True)
            sys.exit(130)
        except Exception as e:  # an internal error: still one line unless debugging
            if os.environ.get("ONNXFUSE_DEBUG"):
                raise
            click.echo(f"onnxfuse: internal error: {type(e).__name__}: {e}", err=True)
            sys.exit(EXIT_INTERNAL)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="onnxfuse")
def main() -> None:
    """Fuse Linear(+bias)+GELU blocks of ONNX models into one FusedLinearGelu node and run them
    with onnxfuse's CPU and CUDA kernels in ONNX Runtime.

    \b
    Exit codes: 0 ok · 1 internal error · 2 bad input or usage · 3 accuracy gate failed ·
    4 a fused node ran on another execution provider than requested (bench).
    """


# --- optimize / inspect (rewriter) -----------------------------------------------------------------
def _target_option(f):
    """--target, shared by optimize and inspect. A plain string checked by the cost model, so a bad value
    is the one-line exit-2 error every bad input gets (not click's usage block)."""
    from .cost_model import DEFAULT_TARGET, TARGETS

    lines = "; ".join(f"{t.name}: {t.summary}" for t in TARGETS.values())
    return click.option(
        "--target", default=DEFAULT_TARGET, show_default=True, metavar="|".join(TARGETS),
        help=f"What will run the model; a block whose fusion does not pay there is left as it is, with its "
             f"reason in the refusals. {lines}. The default is a named target, not a guess from this machine: "
             f"the output must not depend on where it was optimized, and cuda (what the fused nodes are "
             f"made for) fuses every block, as cpu does today.")(f)


def _ort_fusions_option(f):
    """--ort-fusions/--no-ort-fusions, shared by optimize and inspect."""
    return click.option(
        "--ort-fusions/--no-ort-fusions", default=False, show_default=True,
        help="Run ONNX Runtime's transformer fusions (SkipLayerNormalization, EmbedLayerNormalization, bias "
             "and GELU forms; onnxruntime.transformers.optimizer) before onnxfuse's rules, where the model has "
             "not been through them and the target is not tensorrt. Measured on the H200: 1.24-1.27x faster "
             "than onnxfuse alone in fp16 (BERT-base, GPT-2, ViT-B/16, batch 32). Not the default: ORT's "
             "fusions do not always keep the math (ONNX's tanh Gelu in GPT-NeoX's dynamo export becomes erf "
             "BiasGelu); use it with --verify.")(f)


def _approximation_budget_options(f):
    """--budget and --approximate-forms, the options of --approximate auto (tune, and optimize's one-step form)."""
    f = click.option("--approximate-forms", "forms_text", default=None, metavar="tanh[,sigmoid]",
                     help="With --approximate auto: the forms a node may take (default tanh, within 4.8e-4 of erf "
                          "GELU; sigmoid, x*sigmoid(1.702x), is forty times coarser and only tried when named).")(f)
    return click.option(
        "--budget", type=float, default=None, metavar="REL",
        help="With --approximate auto (required there): the largest error allowed, > 0. The error is the largest "
             "over the model's outputs of rel-L2 = ||tuned - exact||_2 / ||exact||_2 over --samples random samples "
             "at the largest batch, both models run on this GPU (exact: the fused model with every node at its own "
             "GELU form); a changed integer output or NaN/Inf is over any budget. Over budget, the switch that "
             "saves the least time is undone, one at a time, until the error is within it.")(f)


@main.command("optimize", context_settings={"max_content_width": 110})
@click.argument("model")
@click.option("-o", "--output", metavar="OUT",
              help="Where to write the optimized model (default: beside MODEL, model.onnx → model.fused.onnx).")
@click.option("--json", "json_path", metavar="REPORT", help="Write the report as JSON ('-' for stdout).")
@click.option("--approximate", type=click.Choice(["tanh", "sigmoid", "auto"]), default=None,
              help="tanh or sigmoid: make every fused node compute this GELU form, trading exactness on purpose "
                   "(the report lists the nodes whose math changed). Default: keep each block's own math. "
                   "auto: per node, on this machine's CUDA GPU, the approximate form only where it is faster "
                   "and the model's outputs stay within --budget: the rewrite, then `onnxfuse tune "
                   "--approximate auto` in the same run (OUT also carries tune's per-node path tables; "
                   "--batch, --shape, --samples and --approximate-forms as tune takes them).")
@_approximation_budget_options
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
@click.option("--shape", "shape_options", multiple=True, metavar="NAME=DIMS",
              help="With --verify or --approximate auto: concrete shape of a dynamic input, e.g. "
                   "input_ids=1,128 (repeatable; auto replaces its axis 0 by each batch size).")
@click.option("--rtol", type=float, default=None, help="With --verify: relative tolerance (default: per dtype).")
@click.option("--atol", type=float, default=None, help="With --verify: absolute tolerance (default: per dtype).")
@_target_option
@_ort_fusions_option
def optimize_command(model, output, json_path, approximate, budget, forms_text, batch_list, verify, keep_failed,
                     provider, samples, shape_options, rtol, atol, target, ort_fusions):
    """Rewrite every Linear(+bias)+GELU block of MODEL into one FusedLinearGelu node, and every self-attention
    it can prove into ONNX Runtime's fused attention ops, and write OUT (default: model.fused.onnx beside
    MODEL).

    Everything else stays as it was; external-data models stay external (OUT.data beside OUT). The
    input is never modified; OUT is written atomically. With --verify the accuracy gate of
    `onnxfuse compare` (same default tolerances) judges the result before it is published.

    With --approximate auto the rewrite is followed, in the same run and on this machine's CUDA GPU, by
    `onnxfuse tune --approximate auto`: OUT is the tuned model, and --verify judges that one.

    \b
    Exit codes: 0 ok · 1 internal error · 2 bad input (unreadable model, missing external data,
    unwritable output; --approximate auto without --budget, or without a CUDA provider and GPU)
    · 3 --verify: outputs outside tolerance (OUT not written unless --keep-failed).
    """
    from .approximation import parse_forms
    from .cost_model import get_target
    from .errors import EXIT_ACCURACY, EXIT_OK, AccuracyGateError, BadInputError
    from .inputs import parse_shape_option
    from .pipeline import AutoApproximation, Verify, write_optimized

    get_target(target)  # a bad --target is said before anything else is looked at
    output = _output_beside(model, output, "fused")
    auto = approximate == "auto"
    forms = parse_forms(forms_text) if forms_text is not None else None
    if auto:
        from .tune import check_approximation_options

        check_approximation_options("auto", budget, forms, samples)
        if target != "cuda":
            raise BadInputError(f"--approximate auto times the CUDA kernel's forms: it needs --target cuda, not {target}")
    else:
        auto_only = {"--budget": budget is not None, "--approximate-forms": forms is not None, "--batch": batch_list}
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
    batches = _parse_batches(batch_list) if batch_list is not None else None
    from .report_paths import check_report_paths

    # before writing the model: a report path that cannot be written, or that is a model file of this run
    check_report_paths({"--json": json_path}, models_read=[model], models_written=[output])

    verify_with = Verify(provider, samples or 2, shapes, rtol, atol, keep_failed) if verify else None
    auto_with = AutoApproximation(budget, forms, shapes, batches, samples) if auto else None
    written = write_optimized(model, output, target=target, ort_fusions=ort_fusions,
                              approximate=None if auto else approximate, auto=auto_with, verify=verify_with,
                              on_verdict=_render_compare if json_path != "-" else None,
                              tune_progress=lambda: _bench_progress(True, "tune:"))
    report, tuned, verdict = written.report, written.tuned, written.verdict
    _echo_warnings(report)
    if json_path != "-":
        _render_rewrite(report, title=f"{report.model} → {report.output}")
        if tuned is not None:
            _render_tune(tuned)
    failed = verdict is not None and not verdict.passed
    extra = {"verify": verdict.to_dict()} if verdict is not None else {}
    if tuned is not None:
        extra["tune"] = tuned.to_dict()
    # The report's exit_code is the one this process ends with: 3 when --keep-failed wrote a model outside
    # tolerance (without --keep-failed the gate stops the run before any report is written).
    _emit_json(report, json_path, extra={**extra, "exit_code": EXIT_ACCURACY if failed else EXIT_OK},
               after_writing=output)
    if failed:
        raise AccuracyGateError(f"{output} written (--keep-failed) but outside tolerance: {verdict.summary()}")


@main.command("inspect", context_settings={"max_content_width": 110})
@click.argument("model")
@click.option("--json", "json_out", is_flag=True, help="Print the report as JSON instead of tables.")
@_target_option
@_ort_fusions_option
def inspect_command(model, json_out, target, ort_fusions):
    """List every candidate block of MODEL (each fusion rule's): what would be fused into which op, and for
    every refusal the rule and its reason (the cost model's, for a block --target leaves alone). Writes nothing."""
    from .pipeline import inspect_file

    report = inspect_file(model, target=target, ort_fusions=ort_fusions)
    _echo_warnings(report)
    if json_out:
        _emit_json(report, "-", extra={"exit_code": 0})
    else:
        _render_rewrite(report, title=f"{report.model} (inspect: nothing written)", blocks=True)


def _echo_warnings(report) -> None:
    """What was tolerated in the input, one line each on stderr (stdout stays the report's)."""
    for line in report.warnings:
        click.echo(f"onnxfuse: warning: {line}", err=True)


def _emit_json(report, json_path, extra: dict | None = None, after_writing=None) -> None:
    """The report as JSON: on stdout for '-', else written atomically to ``json_path`` (nothing for None).
    ``after_writing``: the model this command has already written, which a failure to write the report (a
    full disk: its folder was tried before the work) must not let the error line deny."""
    if not json_path:
        return
    from .atomic import json_text, write_json
    from .errors import BadInputError

    data = {**report.to_dict(), **(extra or {})}
    if json_path == "-":
        click.echo(json_text(data))
        return
    try:
        write_json(json_path, data)
    except BadInputError as e:
        if after_writing is None:
            raise
        raise BadInputError(f"{after_writing} written, but not the --json report: {e}") from None


def _render_rewrite(report, *, title: str, blocks: bool = False) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console() if sys.stdout.isatty() else Console(width=200)
    console.print(title + (f" · target {report.target}" if report.target else ""), highlight=False)
    if report.ort_fusions is not None:
        from .ort_fusions import OrtFusionsReport

        console.print(OrtFusionsReport(**report.ort_fusions).summary(), highlight=False)
    forms = Table()
    forms.add_column("fused: source form")
    forms.add_column("blocks", justify="right")
    for form, count in report.fused_by_form.items():
        forms.add_row(form, str(count))
    forms.add_row("[bold]total fused[/]", f"[bold]{len(report.fused)}[/]")
    forms.add_row("refused (left as they were)", str(len(report.refused)))
    console.print(forms)
    if blocks and report.fused:
        fused = Table(title="blocks to fuse", title_justify="left")
        for column in ("fused node", "op", "form", "replaces"):
            fused.add_column(column)
        for b in report.fused:
            fused.add_row(b.name, b.op, b.form, ", ".join(b.replaced))
        console.print(fused)
    if report.refused:
        refused = Table(title="refusals", title_justify="left")
        for column in ("rule", "reason", "nodes"):
            refused.add_column(column)
        for r in report.refused:
            refused.add_row(r.rule, r.reason, ", ".join(r.nodes))
        console.print(refused)
    for c in report.math_changed:
        console.print(f"[yellow]math changed[/] {c.name}: {c.was} → {c.now}", highlight=False)
    if blocks and report.tuning:
        _render_tuning(console, report.tuning)
    if report.seconds is not None:
        console.print(f"{len(report.fused)} fused, {len(report.refused)} refused in {report.seconds:.2f} s"
                      + (f" → {report.output}" if report.output else ""), highlight=False)

# --- tune -------------------------------------------------------------------------------------------


@main.command("tune", context_settings={"max_content_width": 110})
@click.argument("model")
@click.option("-o", "--output", metavar="OUT",
              help="Where to write the tuned model (default: beside MODEL, model.onnx → model.tuned.onnx).")
@click.option("--provider", type=click.Choice(["cuda"]), default="cuda", show_default=True,
              help="Execution provider to tune for (the CUDA kernel's paths are what is chosen).")
@click.option("--batch", "batch_list", metavar="B1,B2,...",
              help="Batch sizes the model will run at (axis 0 of every input whose axis 0 is dynamic); "
                   "default 1,8,32 where axis 0 is dynamic, else the model's fixed shape.")
@click.option("--shape", "shape_options", multiple=True, metavar="NAME=DIMS",
              help="Concrete shape of a dynamic input, e.g. input_ids=1,128 (repeatable; its axis 0 is replaced "
                   "by each batch size). Default: other dynamic dims 128.")
@click.option("--reps", type=click.IntRange(min=1), default=30, show_default=True,
              help="Timed runs per path and row count at least (more until the median is stable).")
@click.option("--approximate", default="none", show_default=True, metavar="none|auto",
              help="none: every node keeps its model's GELU form. auto: an exact (erf) GELU node switches to an "
                   "approximate form (--approximate-forms) where that form's fastest path is at least 2 % faster at "
                   "the node's largest row count (twice the timing loop's 1 % stability bound) and not 2 % slower "
                   "at any other, as far as the model's error stays within --budget; the nodes switched carry "
                   "approximate=FORM, and the report and metadata each node's times and the measured error.")
@_approximation_budget_options
@click.option("--samples", type=int, default=None,
              help="With --approximate auto: random input samples the error is measured on (default 4).")
@click.option("--json", "json_path", metavar="FILE", help="Write the report as JSON ('-' for stdout instead of the table).")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Progress bar on stderr.")
def tune_command(model, output, provider, batch_list, shape_options, reps, approximate, budget, forms_text,
                 samples, json_path, progress):
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
    bad --batch/--shape; --budget/--approximate-forms/--samples without --approximate auto, or auto
    without --budget; no CUDA provider or GPU; an op library older than tuning).
    """
    from .approximation import parse_forms
    from .inputs import parse_shape_option
    from .report_paths import check_report_paths
    from .tune import check_approximation_options, tune_file

    output = _output_beside(model, output, "tuned")
    forms = parse_forms(forms_text) if forms_text is not None else None
    check_approximation_options(approximate, budget, forms, samples)
    shapes = dict(parse_shape_option(text) for text in shape_options)
    batches = _parse_batches(batch_list) if batch_list is not None else None
    check_report_paths({"--json": json_path}, models_read=[model], models_written=[output])
    with _bench_progress(progress, "tune:") as bar:
        report = tune_file(model, output, shapes=shapes, batches=batches, reps=reps, approximate=approximate,
                           budget=budget, forms=forms, samples=samples, progress=bar)
    _echo_warnings(report)
    _emit_json(report, json_path, extra={"exit_code": 0}, after_writing=output)
    if json_path != "-":
        _render_tune(report)


def _render_tune(report) -> None:
    from rich.table import Table

    console = _bench_console()
    d = report.device
    console.print(f"{report.model} → {report.output}", highlight=False)
    console.print(f"measured on {d.gpu} (sm {d.compute_capability}, driver CUDA {d.driver or '?'}), "
                  f"signature [bold]{d.signature}[/]", highlight=False)
    table = Table(title="choices (median µs per call)", title_justify="left")
    for column in ("nodes", "shape", "M", "fused", "fallback", "gemv", "ORT unfused", "choice", "why"):
        table.add_column(column, justify="right" if column in ("M", "fused", "fallback", "gemv", "ORT unfused") else "left")
    groups: dict = {}
    for t in report.tunings:
        groups.setdefault(t.node.shape, []).append(t)
    for shape, members in groups.items():
        names, described = ", ".join(t.node.name for t in members), shape.describe()
        for m, times in sorted({m: t for member in members for m, t in member.times.items()}.items()):
            table.add_row(names, described, str(m), f"{times.fused_us:.1f}", _us(times.fallback_us),
                          _us(times.gemv_us), _us(times.ort_unfused_us), times.choice, _why(times, m))
            names = described = ""  # one measurement serves every node of the group
    console.print(table)
    for t in report.tunings:
        bounds = ", ".join(f"M ≤ {r}: {p}" for r, p in zip(t.max_rows[:-1], t.paths[:-1]))
        console.print(f"{t.node.name}: " + (bounds + f", beyond: {t.paths[-1]}" if bounds else f"every M: {t.paths[-1]}"),
                      highlight=False)
    behind = sorted({(t.node.shape.describe(), m) for t in report.tunings for m, x in t.times.items()
                     if x.ort_unfused_us is not None and x.ort_unfused_us < x.best_us})
    for shape, m in behind:
        console.print(f"[yellow]note[/]: {shape} at M={m}: ORT's unfused ops were faster than every path",
                      highlight=False)
    if report.forced:
        console.print(f"[yellow]note[/]: {', '.join(report.forced)} force a path with cuda_path: their tables are "
                      "written but not used until cuda_path is auto", highlight=False)
    if report.restored:
        console.print(f"[yellow]note[/]: {', '.join(report.restored)}: back at exact GELU (an earlier "
                      "`tune --approximate auto` had switched them)", highlight=False)
    if report.choice is not None:
        _render_forms(console, report)
    console.print(f"{report.measurements} measurement(s), {len(report.tunings)} node(s) tuned in "
                  f"{report.seconds:.1f} s → {report.output}", highlight=False)


def _render_forms(console, report) -> None:
    """tune --approximate auto: each node's GELU form, the time it saves and why, and the model's error."""
    from rich.table import Table

    choice = report.choice
    table = Table(title=f"GELU form per node (--approximate auto, budget {choice.budget:g} rel-L2)", title_justify="left")
    for column in ("node", "model", "chosen", "M", "best µs per form", "saves", "why"):
        table.add_column(column, justify="right" if column in ("M", "saves") else "left")
    for n in report.forms:
        chosen = choice.forms.get(n.name, n.model_form)
        times = ", ".join(f"{form} {by_m[n.largest_m]:.1f}" for form, by_m in n.best.items())
        option = next((o for o in n.options if o.form == chosen), None)
        saves = f"{option.gain:.1%} ({option.gain_us:.1f} µs)" if option else "—"
        why = "; ".join(f"{form}: {text}" if form != "*" else text for form, text in n.rejected.items())
        if n.options and option is None:
            why = "; ".join(filter(None, ["backed off to stay within the budget", why]))
        table.add_row(n.name, n.model_form, chosen, str(n.largest_m), times, saves, why)
    console.print(table)
    for c in choice.checks:
        step = f" after {c.step[0]} → {c.step[1]}" if c.step else ""
        verdict = "[green]within[/]" if c.within_budget else "[red]over[/]"
        console.print(f"check{step}: {c.switched} node(s) switched, model error {c.error.error:.3g} {verdict} "
                      f"the budget" + (f" ({'; '.join(c.error.problems)})" if c.error.problems else ""),
                      highlight=False)
    if choice.error is None:
        console.print("no node switched: every node stays at its model's form", highlight=False)
    else:
        console.print(f"{len(choice.forms)} node(s) switched; model error {choice.error.error:.3g} "
                      f"≤ budget {choice.budget:g}", highlight=False)


def _us(value) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def _why(times, m: int) -> str:
    """The choice in words: by how much it beat the next fastest path, the paths that could not run (gemv
    only where M allowed it: above, its column says n/a), and how it stands against ORT's unfused ops."""
    from .domain import GEMV_MAX_ROWS

    us, chosen = times.path_us(), times.choice
    parts = []
    runner = min((p for p in us if p != chosen), key=us.__getitem__, default=None)  # ties: PATHS order
    if runner is not None:
        slow, fast = us[runner], us[chosen]
        tie = "tie: the one-kernel path" if chosen == "fused" else f"tie with {runner}: {chosen} goes first"
        parts.append(f"{slow / fast:.2f}× faster than {runner}" if slow != fast else tie)
    if times.fallback_us is None:
        parts.append(f"fallback unavailable ({times.fallback_note})")
    if times.gemv_us is None and m <= GEMV_MAX_ROWS:
        parts.append(f"gemv unavailable ({times.gemv_note})")
    text = "; ".join(parts)
    if times.ort_unfused_us is not None:
        text += f"; {times.ort_unfused_us / times.best_us:.2f}× over ORT unfused"
    return text


def _measured(m: dict) -> str:
    """One recorded measurement for inspect: M and each path's µs (gemv only where the record has the key:
    schema /1 records predate it), n/a where the path did not run."""
    paths = ("fused_us", "fallback_us", "gemv_us") if "gemv_us" in m else ("fused_us", "fallback_us")
    return f"{m.get('M')}: " + " / ".join("n/a" if m.get(k) is None else str(m[k]) for k in paths)


def _render_tuning(console, tuning: dict) -> None:
    """inspect's view of a tuned model: each node's table, and the device it was measured on."""
    from rich.table import Table

    device = tuning.get("device") or {}
    where = device.get("signature") or "(no tuning record in metadata_props)"
    table = Table(title=f"CUDA path tuning, measured on {where}", title_justify="left")
    forms = any("approximation" in n for n in tuning["nodes"])
    for column in ("node", "cuda_path", "tuned_device", "rows → path", "measured (M: fused / fallback / gemv µs)"):
        table.add_column(column)
    if forms:
        table.add_column("GELU form (model → chosen, best µs per form at M)")
    for n in tuning["nodes"]:
        bounds = [f"≤ {r}: {p}" for r, p in zip(n["tuned_max_rows"], n["tuned_paths"])]
        if bounds:
            bounds[-1] += " (and beyond)"
        measured = "; ".join(_measured(m) for m in n.get("measurements", []))
        same = n["tuned_device"] == device.get("signature")
        cells = [n["node"], n["cuda_path"], n["tuned_device"] if not same else "= above", ", ".join(bounds), measured]
        if forms:
            cells.append(_recorded_form(n.get("approximation")))
        table.add_row(*cells)
    console.print(table)
    approximation = tuning.get("approximation")
    if approximation:
        error = (approximation.get("error") or {}).get("error")
        console.print(f"GELU forms chosen by tune --approximate auto: budget {approximation.get('budget')} "
                      f"({approximation.get('metric')}), measured error "
                      f"{'none (nothing switched)' if error is None else _number(error)}", highlight=False)
    if tuning.get("note"):
        console.print(f"[yellow]note[/]: {tuning['note']}", highlight=False)


def _number(value) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _recorded_form(entry) -> str:
    if not isinstance(entry, dict):
        return ""
    m = str(entry.get("M"))
    times = ", ".join(f"{form} {by_m.get(m)}" for form, by_m in (entry.get("best_us") or {}).items()
                      if isinstance(by_m, dict))
    return f"{entry.get('model')} → {entry.get('chosen')}" + (f" (M={m}: {times})" if times else "")


# --- compare (accuracy gate) -----------------------------------------------------------------------


@main.command("compare", context_settings={"max_content_width": 110})
@click.argument("original")
@click.argument("optimized")
@click.option("--provider", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="Execution provider for both models; cuda fails (exit 2) if CUDA cannot start, never falls back.")
@click.option("--samples", type=click.IntRange(min=1), default=None,
              help="Random samples to run (default 1); not with --inputs.")
@click.option("--inputs", "inputs_path", metavar="FILE.npz|DIR",
              help="Your inputs: a .npz (keys = input names), a folder of .npz files, or ONNX test_data_set_* folder(s) of .pb tensors.")
@click.option("--shape", "shape_options", multiple=True, metavar="NAME=DIMS",
              help="Concrete shape of a dynamic input, e.g. input_ids=1,128 (repeatable). Default: batch 1, other dynamic dims 128.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random inputs (sample i uses seed+i).")
@click.option("--rtol", type=float, default=None, help="Relative tolerance for every floating output (default: per dtype).")
@click.option("--atol", type=float, default=None, help="Absolute tolerance for every floating output (default: per dtype).")
@click.option("--json", "json_path", metavar="FILE", help="Write the full report as JSON ('-' for stdout).")
@click.option("--plot", "plot_path", metavar="FILE.png", help="Write a PNG with the absolute-error histogram of each output.")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Progress bar on stderr for several samples.")
def compare_command(original, optimized, provider, samples, inputs_path, shape_options, seed, rtol, atol,
                    json_path, plot_path, progress):
    """Run ORIGINAL and OPTIMIZED in ONNX Runtime on the same inputs and judge every output.

    The original runs as written (ORT optimizations off), the optimized one as deployed (FusedLinearGelu
    library registered). Per output: max/mean/p50/p99/p99.9 absolute error, max relative error, cosine
    similarity, NaN/Inf mismatches. An output passes when every element is within atol + rtol·|ref| and
    no NaN/Inf differs.

    Random inputs (default): floats ~ N(0, 1), token ids below the size of the embedding table they index,
    masks of ones, position ids 0..S-1; sample i uses seed+i.

    \b
    Default tolerances (rtol = atol), by the type an output is computed in
    (a float32 output of a float16 body is judged as float16):
      float32 on CPU  1e-4    float32 on CUDA  5e-3 (TF32 Tensor Cores, as ORT's MatMul)
      float16         1e-2    bfloat16         5e-2
      float64         1e-7    integers, bool   exact

    \b
    Exit codes: 0 within tolerance · 2 bad input (unreadable models or inputs, models whose
    inputs/outputs do not correspond, CUDA unavailable) · 3 outside tolerance.
    """
    from .compare import compare_models
    from .errors import BadInputError
    from .inputs import parse_shape_option

    if inputs_path is not None and (samples is not None or shape_options):
        raise BadInputError("--inputs brings its own samples and shapes: drop --samples/--shape")
    shapes = dict(parse_shape_option(text) for text in shape_options)
    from .plots import check_plot_path
    from .report_paths import check_report_paths

    # before the models run: report paths that cannot be written, or that name what this run reads
    if plot_path:
        check_plot_path(plot_path)
    check_report_paths({"--json": json_path, "--plot": plot_path}, models_read=[original, optimized],
                       files_read=[inputs_path])
    report = compare_models(
        original, optimized, provider=provider, samples=samples or 1, inputs=inputs_path, shapes=shapes,
        rtol=rtol, atol=atol, seed=seed, progress=progress,
    )
    _emit_json(report, json_path)
    if json_path != "-":
        _render_compare(report)
    if plot_path:
        from .plots import plot_error_histograms

        plot_error_histograms(report, plot_path)
    report.raise_if_failed()


def _render_compare(report) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{report.original} vs {report.optimized} · {report.provider} · {report.samples} sample(s),"
                        f" inputs {report.inputs}", title_justify="left")
    for column in ("output", "dtype", "max abs", "max rel", "mean abs", "p50", "p99", "p99.9", "cosine",
                   "NaN/Inf", "rtol/atol", "verdict"):
        table.add_column(column, justify="left" if column in ("output", "dtype", "verdict") else "right")
    for o in report.outputs:
        table.add_row(
            o.name, o.dtype + (f" ({o.compute_dtype} math)" if o.compute_dtype else ""), f"{o.max_abs:.3g}", f"{o.max_rel:.3g}", f"{o.mean_abs:.3g}", f"{o.p50_abs:.3g}",
            f"{o.p99_abs:.3g}", f"{o.p999_abs:.3g}", f"{o.cosine:.8f}", str(o.nonfinite_mismatches),
            f"{o.tolerance.rtol:g} / {o.tolerance.atol:g}",
            "[green]pass[/]" if o.passed else f"[red]FAIL[/] ({o.violations} over)",
        )
    # piped into a log, rich would squeeze the table into 80 columns: give it room instead
    console = Console() if sys.stdout.isatty() else Console(width=200)
    console.print(table)
    console.print("[green]PASS[/]: " + report.summary() if report.passed else "[red]FAIL[/]: " + report.summary(),
                  highlight=False)


# --- bench ------------------------------------------------------------------------------------------


@main.command("bench", context_settings={"max_content_width": 110})
@click.argument("optimized", required=False)
@click.option("--baseline", metavar="ORIGINAL", help="The model before onnxfuse: timed interleaved with OPTIMIZED, same inputs.")
@click.option("--provider", type=click.Choice(["cuda", "cpu"]), default="cuda", show_default=True,
              help="Execution provider; cuda fails (exit 2) where CUDA cannot start, never falls back to the CPU.")
@click.option("--shape", "shape_options", multiple=True, metavar="NAME=DIMS",
              help="Concrete shape of a dynamic input, e.g. input_ids=1,128 (repeatable). Default: batch 1, other dynamic dims 128.")
@click.option("--batch", "batch_list", metavar="B1,B2,...",
              help="Batch sizes to time (axis 0 of every input whose axis 0 is dynamic), e.g. 1,8,32.")
@click.option("--cuda-graph", is_flag=True, help="Capture and replay a CUDA graph (provider option enable_cuda_graph=1).")
@click.option("--op", "op_shape", metavar="M,K,N",
              help="Op-level mode: build X[M,K] -> FusedLinearGelu(W[N,K], B[N]) and its unfused MatMul+Add+Gelu twin; "
                   "report time, TFLOP/s and GB/s against the measured ceilings.")
@click.option("--dtype", type=click.Choice(["fp32", "fp16", "bf16"]), default="fp32", show_default=True, help="Op-level mode: data type.")
@click.option("--approximate", type=click.Choice(["none", "tanh"]), default="none", show_default=True,
              help="Op-level mode: GELU form (none = erf).")
@click.option("--peak-tflops", type=click.FloatRange(min=0, min_open=True), help="Op-level mode: compute ceiling to use instead of measuring a big MatMul.")
@click.option("--peak-gbps", type=click.FloatRange(min=0, min_open=True), help="Op-level mode: bandwidth ceiling to use instead of measuring a big copy.")
@click.option("--budget", type=click.FloatRange(min=0, min_open=True), default=3.0, show_default=True,
              help="Seconds of timed runs per batch size at most (warm-up excluded); stops earlier once the median is stable.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random inputs.")
@click.option("--json", "json_path", metavar="FILE", help="Write the full report as JSON ('-' for stdout instead of the table).")
@click.option("--plot", "plot_path", metavar="FILE.png", help="Write a PNG of latency and speedup vs batch size.")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Progress bar on stderr.")
def bench_command(optimized, baseline, provider, shape_options, batch_list, cuda_graph, op_shape, dtype, approximate,
                  peak_tflops, peak_gbps, budget, seed, json_path, plot_path, progress):
    """Latency (median, p90) and throughput of OPTIMIZED, and of its --baseline timed alongside it.

    Inputs and outputs are bound on the device (IO binding), warm-up is excluded, and runs repeat
    until the median is stable or --budget runs out. One profiled run shows which provider ran each
    node; a FusedLinearGelu node on another provider than --provider fails the command.

    \b
    Examples:
      onnxfuse bench bert.fused.onnx --baseline bert.onnx --batch 1,8,32 --shape input_ids=1,128 --plot bench.png
      onnxfuse bench --op 4096,768,3072 --dtype fp16 --cuda-graph

    \b
    Exit codes: 0 ok · 2 bad input (unreadable model, bad option, provider not usable here) ·
    4 a FusedLinearGelu node ran on another provider than --provider.
    """
    from .bench.model_bench import bench_models
    from .bench.op_bench import bench_op, parse_op
    from .bench.timing import TimingPolicy
    from .errors import BadInputError
    from .inputs import parse_shape_option

    from .report_paths import check_report_paths

    policy = TimingPolicy(budget_s=budget)
    # say so now, not after minutes of timing
    check_report_paths({"--json": json_path, "--plot": plot_path}, models_read=[optimized, baseline])
    if cuda_graph and provider != "cuda":
        raise BadInputError("--cuda-graph needs --provider cuda")
    if op_shape is not None:
        if optimized or baseline or shape_options or batch_list or plot_path:
            raise BadInputError("--op builds its own model: drop OPTIMIZED, --baseline, --shape, --batch and --plot")
        m, k, n = parse_op(op_shape)
        with _bench_progress(progress, f"op {m}×{k}×{n} {dtype}:") as bar:
            report = bench_op(m, k, n, dtype=dtype, approximate=approximate, provider=provider, cuda_graph=cuda_graph,
                              policy=policy, peak_tflops=peak_tflops, peak_gbps=peak_gbps, progress=bar)
        render = _render_op_bench
    else:
        if optimized is None:
            raise BadInputError("give the OPTIMIZED model to time, or --op M,K,N for the op-level benchmark")
        if peak_tflops or peak_gbps:
            raise BadInputError("--peak-tflops/--peak-gbps belong to the op-level mode (--op)")
        if plot_path:
            from .plots import check_plot_path

            check_plot_path(plot_path)
        shapes = dict(parse_shape_option(text) for text in shape_options)
        batches = _parse_batches(batch_list) if batch_list else None
        with _bench_progress(progress, "bench:") as bar:
            report = bench_models(optimized, baseline, provider=provider, shapes=shapes, batches=batches,
                                  cuda_graph=cuda_graph, policy=policy, seed=seed, progress=bar)
        render = _render_model_bench
        if plot_path:
            from .plots import plot_model_bench

            plot_model_bench(report, plot_path)
    _emit_json(report, json_path)
    if json_path != "-":
        render(report)
    sys.exit(report.exit_code)


def _output_beside(model: str, output: str | None, kind: str) -> str:
    """OUT as given, or else MODEL's own name with ``.KIND`` before its ``.onnx`` (model.onnx →
    model.fused.onnx), in MODEL's folder: the terminal user's `onnxfuse optimize model.onnx` writes where the
    model is, never over it (an output that is the input is refused, as with -o)."""
    if output is not None:
        return output
    stem = model[:-len(".onnx")] if model.lower().endswith(".onnx") else model
    return f"{stem}.{kind}.onnx"


def _parse_batches(text: str) -> list[int]:
    from .errors import BadInputError

    try:
        batches = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        batches = []
    if not batches or min(batches) < 1:
        raise BadInputError(f"--batch {text!r}: expected positive integers separated by commas, e.g. 1,8,32")
    return batches


def _bench_progress(enabled: bool, label: str):
    """A rich progress bar on stderr (so --json - stays clean), or nothing. Only on a terminal: into a
    pipe or a log it would add a blank line to the one-line errors."""
    import contextlib

    if not enabled or not sys.stderr.isatty():
        return contextlib.nullcontext(None)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    return Progress(SpinnerColumn(), TextColumn(label + " {task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=Console(stderr=True), transient=True)


def _bench_console():
    from rich.console import Console

    # piped into a log, rich would squeeze the table into 80 columns: give it room instead
    return Console() if sys.stdout.isatty() else Console(width=200)


def _timing_cells(t) -> list[str]:
    return [f"{t.median_ms:.3f}", f"{t.p90_ms:.3f}", f"{t.throughput:,.1f}", f"{t.reps}" + ("" if t.stable else "*")]


def _render_model_bench(report) -> None:
    from rich.table import Table

    console = _bench_console()
    provider = report.provider + (" + CUDA graph" if report.cuda_graph else "")
    table = Table(title=f"{report.optimized}" + (f" vs {report.baseline}" if report.baseline else "") + f" · {provider}",
                  title_justify="left")
    table.add_column("batch", justify="right")
    roles = ["optimized"] + (["baseline"] if report.baseline else [])
    for role in roles:
        for column in ("median ms", "p90 ms", "items/s", "reps"):
            table.add_column(f"{role} {column}", justify="right")
    if report.baseline:
        table.add_column("speedup", justify="right")
    for r in report.results:
        cells = [str(r.batch)] + _timing_cells(r.optimized)
        if report.baseline:
            colour = "green" if r.speedup >= 1 else "red"
            cells += _timing_cells(r.baseline) + [f"[{colour}]{r.speedup:.3f}×[/]"]
        table.add_row(*cells)
    console.print(table)
    for role, placement in report.placement.items():
        fused = "".join(f"; {n} {op}" for op, n in placement.fused_by_op.items())
        console.print(f"{role}: {placement.summary()}{fused}", highlight=False)
    if report.placement["optimized"].fused_nodes == 0:
        console.print("[yellow]note[/]: the optimized model has no fused node (was it optimized by onnxfuse?)")
    if any(not t.stable for r in report.results for t in (r.optimized, r.baseline) if t is not None):
        console.print("[yellow]*[/] median not stable within --budget (the two halves of the runs differ by > 1 %); "
                      "give a larger --budget or a quieter machine", highlight=False)


def _render_op_bench(report) -> None:
    from rich.table import Table

    console = _bench_console()
    c = report.ceilings
    provider = report.provider + (" + CUDA graph" if report.cuda_graph else "")
    table = Table(title=f"FusedLinearGelu {report.m}×{report.k}×{report.n} (M×K×N) {report.dtype}, "
                        f"approximate={report.approximate} · {provider}", title_justify="left")
    for column in ("model", "median ms", "p90 ms", "reps", "TFLOP/s", "GB/s", "of roofline"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for label, point in (("fused (onnxfuse)", report.fused), ("unfused MatMul+Add+Gelu (ORT)", report.unfused)):
        t = point.timing
        table.add_row(label, f"{t.median_ms:.4f}", f"{t.p90_ms:.4f}", f"{t.reps}" + ("" if t.stable else "*"),
                      f"{point.tflops:.3g}", f"{point.gbps:.3g}", f"{point.roofline_fraction:.0%}")
    console.print(table)
    console.print(f"ceilings: {c.tflops:.3g} TFLOP/s ({c.tflops_source}); {c.gbps:.3g} GB/s ({c.gbps_source})",
                  highlight=False)
    colour = "green" if report.speedup >= 1 else "red"
    console.print(f"speedup of the fused op over ORT's unfused ops: [{colour}]{report.speedup:.3f}×[/]; "
                  f"{report.placement.summary()}", highlight=False)


# --- doctor -----------------------------------------------------------------------------------------


@main.command("doctor")
@click.option("--json", "json_out", is_flag=True, help="Print the report as JSON.")
def doctor_command(json_out):
    """Check this machine: versions, ONNX Runtime providers, the op library (found? loads? computes
    right on each usable provider?) and CUDA devices.

    \b
    Exit codes: 0 ready · 2 the op library is missing, does not load, or gives wrong results.
    """
    from .doctor import run_doctor
    from .errors import BadInputError

    report = run_doctor()
    if json_out:
        _emit_json(report, "-")
    else:
        _render_doctor(report)
    if report.exit_code:
        raise BadInputError(report.library_error or "the op library does not work")


def _render_doctor(report) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console() if sys.stdout.isatty() else Console(width=200)
    table = Table(show_header=False, title="onnxfuse doctor", title_justify="left")
    table.add_column("item", style="bold")
    table.add_column("value", overflow="fold")
    table.add_row("onnxfuse", report.onnxfuse_version)
    table.add_row("onnxruntime", report.onnxruntime_version)
    table.add_row("onnx", report.onnx_version)
    table.add_row("python", report.python_version)
    table.add_row("providers", ", ".join(report.available_providers))
    table.add_row("op library", report.library_path or "[red]not found[/]")
    for p in report.probes:
        verdict = (f"[green]ok[/] (max abs error {p['max_abs_error']:.1e})" if p["ok"]
                   else f"[red]failed[/]: {p['error']}")
        table.add_row(f"FusedLinearGelu on {p['provider']}", verdict)
    if report.library_path:
        from .runtime import describe_cpu_gemm

        table.add_row("CPU GEMM", f"{report.cpu_gemm or '?'}: {describe_cpu_gemm(report.cpu_gemm)}")
    if report.cuda_devices:
        for d in report.cuda_devices:
            table.add_row(f"cuda:{d['index']}", f"{d['name']} (sm {d['compute_capability']}, {d['memory_gib']} GiB)")
    else:
        table.add_row("cuda devices", "none")
    if report.gpu_details:
        table.add_row("cuda driver", f"{report.gpu_details['driver_version']} (CUDA {report.gpu_details['cuda_version']})")
        for d in report.gpu_details["devices"]:  # pycuda's view: what the kernels care about
            table.add_row(f"cuda:{d['index']} (pycuda)",
                          f"{d['multiprocessors']} SMs at {d['clock_mhz']} MHz, {d['l2_cache_mib']} MiB L2, "
                          f"{d['peak_memory_bandwidth_gbs']:.0f} GB/s peak; kernels: {d['library_code']}")
    console.print(table)


if __name__ == "__main__":
    main(prog_name="onnxfuse")  # the name its messages give, as the installed command's
