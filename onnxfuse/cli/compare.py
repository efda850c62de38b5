"""``onnxfuse compare``: the accuracy gate (``compare.compare_models``), its table, JSON report and chart."""

from __future__ import annotations

import click

from .options import verbosity_options
from .render import emit_json, quiet, render_compare, verbose


@click.command("compare", context_settings={"max_content_width": 110})
@click.argument("original")
@click.argument("optimized")
@click.option("--provider", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="Execution provider for both models; cuda fails (exit 2) if CUDA cannot start, never falls back.")
@click.option("--samples", type=click.IntRange(min=1), default=None,
              help="Random samples to run; not with --inputs. Default: 2 where the model has an attention mask "
                   "(whole in the first sample, padded on the right in the second), else 1; --samples 1 runs "
                   "the whole mask only.")
@click.option("--inputs", "inputs_path", metavar="FILE.npz|DIR",
              help="Your inputs: a .npz (keys = input names), a folder of .npz files, or ONNX test_data_set_* folder(s) of .pb tensors.")
@click.option("--shape", "shape_options", multiple=True, metavar="NAME:DIMS",
              help="Concrete shape of a dynamic input, e.g. input_ids:1,128, input_ids:1x128 or input_ids=1,128 "
                   "(repeatable). Default: batch 1, other dynamic dims 128.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random inputs (sample i uses seed+i).")
@click.option("--rtol", type=float, default=None, help="Relative tolerance for every floating output (default: per dtype).")
@click.option("--atol", type=float, default=None, help="Absolute tolerance for every floating output (default: per dtype).")
@click.option("--json", "json_path", metavar="FILE", help="Write the full report as JSON ('-' for stdout).")
@click.option("--plot", "plot_path", metavar="FILE.png", help="Write a PNG with the absolute-error histogram of each output.")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Progress bar on stderr for several samples.")
@verbosity_options
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
    from ..compare import compare_models
    from ..errors import BadInputError
    from ..inputs import parse_shape_option

    if inputs_path is not None and (samples is not None or shape_options):
        raise BadInputError("--inputs brings its own samples and shapes: drop --samples/--shape")
    shapes = dict(parse_shape_option(text) for text in shape_options)
    from ..plots import check_plot_path
    from ..report_paths import check_report_paths

    # before the models run: report paths that cannot be written, or that name what this run reads
    if plot_path:
        check_plot_path(plot_path)
    check_report_paths({"--json": json_path, "--plot": plot_path}, models_read=[original, optimized],
                       files_read=[inputs_path])
    report = compare_models(
        original, optimized, provider=provider, samples=samples, inputs=inputs_path, shapes=shapes,
        rtol=rtol, atol=atol, seed=seed, progress=progress and not quiet(),
    )
    if verbose():
        click.echo(f"onnxfuse: time: the original {report.seconds_original:.2f} s, the optimized model "
                   f"{report.seconds_optimized:.2f} s over {report.samples} sample(s)", err=True)
    emit_json(report, json_path)
    if json_path != "-":
        render_compare(report)
    if plot_path:
        from ..plots import plot_error_histograms

        plot_error_histograms(report, plot_path)
    report.raise_if_failed()
