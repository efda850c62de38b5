"""Command line: parse, call, render. No logic lives here.

Each command calls one function of the library, which returns a report object (or raises an
``OnnxfuseError``); this module prints it (rich for people, ``--json`` for machines) and exits with the
code the report or the error carries (see ``onnxfuse.errors``).
"""

from __future__ import annotations

import os
import sys

import click

from . import __version__
from .errors import EXIT_INTERNAL, OnnxfuseError


class _Group(click.Group):
    """Turns every failure into one line on stderr and a distinct exit code, never a traceback
    (set ONNXFUSE_DEBUG=1 to see one)."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except OnnxfuseError as e:
            click.echo(f"onnxfuse: error: {e}", err=True)
            sys.exit(e.exit_code)
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
    Exit codes: 0 ok · 1 internal error · 2 bad input or usage · 3 accuracy gate failed.
    """


# --- optimize / inspect (rewriter) -----------------------------------------------------------------

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

    \b
    Default tolerances (rtol = atol):
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
    report = compare_models(
        original, optimized, provider=provider, samples=samples or 1, inputs=inputs_path, shapes=shapes,
        rtol=rtol, atol=atol, seed=seed, progress=progress,
    )
    if json_path == "-":
        import json

        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        if json_path:
            report.write_json(json_path)
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
            o.name, o.dtype, f"{o.max_abs:.3g}", f"{o.max_rel:.3g}", f"{o.mean_abs:.3g}", f"{o.p50_abs:.3g}",
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

# --- doctor -----------------------------------------------------------------------------------------


if __name__ == "__main__":
    main()
