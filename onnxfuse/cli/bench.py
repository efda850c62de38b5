"""``onnxfuse bench``: the model and op-level benchmarks (``measure``), their tables, JSON and chart."""

from __future__ import annotations

import sys

import click

from .options import APPROXIMATE_MEANING, APPROXIMATE_VALUES, parse_batches, verbosity_options
from .render import emit_json, progress_bar, quiet, result_line, stdout_console


@click.command("bench", context_settings={"max_content_width": 110})
@click.argument("optimized", required=False)
@click.option("--baseline", metavar="ORIGINAL", help="The model before onnxfuse: timed interleaved with OPTIMIZED, same inputs.")
@click.option("--provider", type=click.Choice(["cuda", "cpu"]), default="cuda", show_default=True,
              help="Execution provider; cuda fails (exit 2) where CUDA cannot start, never falls back to the CPU.")
@click.option("--shape", "shape_options", multiple=True, metavar="NAME:DIMS",
              help="Concrete shape of a dynamic input, e.g. input_ids:1,128, input_ids:1x128 or input_ids=1,128 "
                   "(repeatable). Default: batch 1, other dynamic dims 128.")
@click.option("--batch", "batch_list", metavar="B1,B2,...",
              help="Batch sizes to time (axis 0 of every input whose axis 0 is dynamic), e.g. 1,8,32.")
@click.option("--cuda-graph", is_flag=True, help="Capture and replay a CUDA graph (provider option enable_cuda_graph=1).")
@click.option("--op", "op_shape", metavar="M,K,N",
              help="Op-level mode: build X[M,K] -> FusedLinearGelu(W[N,K], B[N]) and its unfused MatMul+Add+Gelu twin; "
                   "report time, TFLOP/s and GB/s against the measured ceilings.")
@click.option("--dtype", type=click.Choice(["fp32", "fp16", "bf16"]), default="fp32", show_default=True, help="Op-level mode: data type.")
@click.option("--approximate", default="none", show_default=True, metavar="none|tanh",
              help=f"Op-level mode: the GELU form of the node built. {APPROXIMATE_MEANING} Here none (exact erf) "
                   "or tanh: the forms ONNX's Gelu has, which the unfused twin runs.")
@click.option("--peak-tflops", type=click.FloatRange(min=0, min_open=True), help="Op-level mode: compute ceiling to use instead of measuring a big MatMul.")
@click.option("--peak-gbps", type=click.FloatRange(min=0, min_open=True), help="Op-level mode: bandwidth ceiling to use instead of measuring a big copy.")
@click.option("--budget", type=click.FloatRange(min=0, min_open=True), default=3.0, show_default=True,
              help="Seconds of timed runs per batch size at most (warm-up excluded); stops earlier once the median is stable.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random inputs.")
@click.option("--json", "json_path", metavar="FILE", help="Write the full report as JSON ('-' for stdout instead of the table).")
@click.option("--plot", "plot_path", metavar="FILE.png", help="Write a PNG of latency and speedup vs batch size.")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Progress bar on stderr.")
@verbosity_options
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
    from ..measure.model_bench import bench_models
    from ..measure.op_bench import bench_op, parse_op
    from ..measure.timing import TimingPolicy
    from ..errors import BadInputError
    from ..inputs import parse_shape_option

    from ..report_paths import check_report_paths

    policy = TimingPolicy(budget_s=budget)
    # say so now, not after minutes of timing
    check_report_paths({"--json": json_path, "--plot": plot_path}, models_read=[optimized, baseline])
    if cuda_graph and provider != "cuda":
        raise BadInputError("--cuda-graph needs --provider cuda")
    _check_op_approximate(approximate)
    if op_shape is not None:
        if optimized or baseline or shape_options or batch_list or plot_path:
            raise BadInputError("--op builds its own model: drop OPTIMIZED, --baseline, --shape, --batch and --plot")
        m, k, n = parse_op(op_shape)
        with progress_bar(progress, f"op {m}×{k}×{n} {dtype}:") as bar:
            report = bench_op(m, k, n, dtype=dtype, approximate=approximate, provider=provider, cuda_graph=cuda_graph,
                              policy=policy, peak_tflops=peak_tflops, peak_gbps=peak_gbps, progress=bar)
        render = _render_op_bench if not quiet() else _op_bench_result
    else:
        if optimized is None:
            raise BadInputError("give the OPTIMIZED model to time, or --op M,K,N for the op-level benchmark")
        if peak_tflops or peak_gbps:
            raise BadInputError("--peak-tflops/--peak-gbps belong to the op-level mode (--op)")
        if plot_path:
            from ..plots import check_plot_path

            check_plot_path(plot_path)
        shapes = dict(parse_shape_option(text) for text in shape_options)
        batches = parse_batches(batch_list) if batch_list else None
        with progress_bar(progress, "bench:") as bar:
            report = bench_models(optimized, baseline, provider=provider, shapes=shapes, batches=batches,
                                  cuda_graph=cuda_graph, policy=policy, seed=seed, progress=bar)
        render = _render_model_bench if not quiet() else _model_bench_result
        if plot_path:
            from ..plots import plot_model_bench

            plot_model_bench(report, plot_path)
    emit_json(report, json_path)
    if json_path != "-":
        render(report)
    sys.exit(report.exit_code)


def _check_op_approximate(approximate: str) -> None:
    """--approximate of the op-level benchmark: a word of the vocabulary every command shares, and one this
    benchmark can build (the others' reason said)."""
    from ..errors import BadInputError

    why = {"sigmoid": "ONNX's Gelu, which the unfused twin runs, has no sigmoid form",
           "auto": "auto chooses per node of a model: `onnxfuse optimize` or `onnxfuse tune --approximate auto`"}
    if approximate in ("none", "tanh"):
        return
    if approximate in why:
        raise BadInputError(f"--approximate {approximate}: the op-level benchmark takes none or tanh "
                            f"({why[approximate]})")
    raise BadInputError(f"--approximate {approximate!r}: expected one of {', '.join(APPROXIMATE_VALUES)} (here none or "
                        "tanh)")


def _model_bench_result(report) -> None:
    """-q: the medians (and speedups) per batch size in one line."""
    per_batch = ", ".join(f"batch {r.batch} {r.optimized.median_ms:.3f} ms"
                          + (f" ({r.speedup:.3f}× over the baseline)" if report.baseline else "")
                          for r in report.results)
    result_line(f"{report.optimized} on {report.provider}: {per_batch}")


def _op_bench_result(report) -> None:
    """-q: the fused op's median and its speedup over ORT's unfused ops in one line."""
    result_line(f"FusedLinearGelu {report.m}×{report.k}×{report.n} {report.dtype} on {report.provider}: "
                f"{report.fused.timing.median_ms:.4f} ms, {report.speedup:.3f}× over ORT's unfused ops")


def _timing_cells(t) -> list[str]:
    return [f"{t.median_ms:.3f}", f"{t.p90_ms:.3f}", f"{t.throughput:,.1f}", f"{t.reps}" + ("" if t.stable else "*")]


def _render_model_bench(report) -> None:
    from rich.table import Table

    console = stdout_console()
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

    console = stdout_console()
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
