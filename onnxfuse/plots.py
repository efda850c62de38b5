"""The charts: ``onnxfuse compare --plot`` (error histograms) and ``onnxfuse bench --plot`` (latency and
speedup against batch size). Each is a PNG written atomically (``onnxfuse.atomic``): a reader never sees
half of one.

The error histograms: one histogram of absolute errors per output. Log-x bins (errors span decades), log-y counts (the tail matters most and has the fewest elements),
p99 / p99.9 / max marked, and the tolerance drawn as a band: an element's bound is ``atol + rtol·|ref|``,
so it runs from ``atol`` (where |ref| = 0) to ``atol + rtol·max|ref|``. Errors left of the band pass
whatever their reference; errors inside it pass or fail depending on |ref|; errors right of it fail.
Exact zeros cannot sit on a log axis, and errors more than ``DECADES`` decades below the largest error or
tolerance (denormal noise) would squash the rest: both are counted in the panel instead of drawn.

The bench chart: median latency of both models per batch size (log scale, whiskers to p90, values written
beside the points) and, with a baseline, the speedup per batch size.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .atomic import write_atomic
from .errors import BadInputError
from .runtime import PROVIDERS, short_name

if TYPE_CHECKING:
    from .measure.model_bench import ModelBenchReport
    from .compare import CompareReport
    from .error_statistics import OutputStats

MAX_PANELS = 12
DECADES = 8
_LABEL_BOX = {"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1}  # keeps values legible over lines


def check_plot_path(path: str | Path) -> None:
    """Refuse a plot path we cannot write, before any work is done."""
    from .model_save import check_output_path

    if Path(path).suffix.lower() != ".png":
        raise BadInputError(f"--plot '{path}': the plot is a PNG, give a file name ending in .png")
    check_output_path(None, path, what="report")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    return plt


def _write_png(fig, path: Path, dpi: int) -> None:
    """Render ``fig`` straight into the temporary file of an atomic write, then close it."""
    try:
        write_atomic(path, lambda f: fig.savefig(f, format="png", dpi=dpi))
    finally:
        _pyplot().close(fig)


def plot_error_histograms(report: CompareReport, path: str | Path) -> None:
    """Write the PNG to ``path`` atomically. With more than ``MAX_PANELS`` outputs, the worst ones (by
    distance to their tolerance) are drawn."""
    plt = _pyplot()
    path = Path(path)
    check_plot_path(path)
    outputs = sorted(report.outputs, key=lambda o: -o.worst_ratio)[:MAX_PANELS]
    if len(report.outputs) <= MAX_PANELS:
        outputs = report.outputs  # keep the model's order when everything fits
    cols = min(3, len(outputs))
    rows = math.ceil(len(outputs) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(7.5 * cols, 5.4 * rows), squeeze=False)
    for ax, stats in zip(axes.flat, outputs):
        _panel(ax, stats)
    for ax in list(axes.flat)[len(outputs):]:
        ax.set_visible(False)
    verdict = "PASS" if report.passed else "FAIL"
    shown = "" if len(outputs) == len(report.outputs) else f" · {len(outputs)} worst of {len(report.outputs)} outputs"
    fig.suptitle(
        f"{verdict}: |optimized − original| per output · {report.provider} · {report.samples} sample(s){shown}\n"
        f"{Path(report.original).name} vs {Path(report.optimized).name}",
        fontsize=12,
        color="tab:green" if report.passed else "tab:red",
    )
    fig.tight_layout()
    _write_png(fig, path, dpi=110)


def _panel(ax, stats: OutputStats) -> None:
    errors = stats.abs_errors
    nonzero = errors[errors > 0]
    zeros = int(errors.size - nonzero.size)
    tol_low = stats.tolerance.atol
    tol_high = stats.tolerance.atol + stats.tolerance.rtol * stats.max_abs_ref
    verdict = "pass" if stats.passed else f"FAIL ({stats.violations} over, {stats.nonfinite_mismatches} NaN/Inf diff)"
    ax.set_title(f"{stats.name} · {stats.dtype} {stats.shape} · {verdict}", fontsize=10,
                 color="black" if stats.passed else "tab:red")
    ax.set_xlabel("absolute error")
    ax.set_ylabel("elements")
    tiny = 0
    if nonzero.size:
        high = max(float(nonzero.max()), tol_high)
        # Errors far below what matters (denormal noise near zero outputs) would stretch the axis over
        # dozens of decades: show DECADES below the largest of error and tolerance, count the rest.
        low = max(float(nonzero.min()), high * 10.0**-DECADES)
        tiny = int(np.count_nonzero(nonzero < low))
        high = max(high, low * 10)
        bins = np.logspace(math.log10(low), math.log10(high), 60)
        ax.hist(nonzero[nonzero >= low], bins=bins, color="tab:blue", alpha=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        for value, label, color, style in (
            (stats.p99_abs, "p99", "tab:orange", "--"),
            (stats.p999_abs, "p99.9", "tab:red", "--"),
            (stats.max_abs, "max", "black", ":"),
        ):
            if value > 0:
                ax.axvline(value, color=color, linestyle=style, linewidth=1.4, label=f"{label} {value:.2g}")
    else:
        ax.text(0.5, 0.5, "every error is exactly 0", transform=ax.transAxes, ha="center", va="center")
        ax.set_xscale("log")
        ax.set_xlim(max(tol_low, 1e-12) / 100, max(tol_high, 1e-12) * 10)
    if tol_high > 0:
        ax.axvspan(max(tol_low, ax.get_xlim()[0]), tol_high, color="tab:green", alpha=0.15, zorder=0,
                   label=f"tolerance atol+rtol·|ref|: {tol_low:.2g}…{tol_high:.2g}")
        if tol_low > 0:
            ax.axvline(tol_low, color="tab:green", linewidth=1.4)
    ax.text(
        0.02, 0.97,
        f"{stats.elements:,} elements\n{zeros:,} exactly 0 (not drawn)\n"
        + (f"{tiny:,} below {low:.0e} (not drawn)\n" if tiny else "")
        + f"cosine {stats.cosine:.8f}",
        transform=ax.transAxes, ha="left", va="top", fontsize=8,
        bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.8, "edgecolor": "0.8"},
    )
    if ax.get_legend_handles_labels()[0]:
        # below the axes: inside, it would hide the tail of the histogram, which is what one looks at
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    ax.grid(True, which="major", alpha=0.3)


def plot_model_bench(report: ModelBenchReport, path: str | Path, title: str | None = None) -> Path:
    """Write the bench chart of ``report`` (see above) to ``path`` atomically; returns ``path``."""
    plt = _pyplot()
    path = Path(path)
    check_plot_path(path)
    batches = [r.batch for r in report.results]
    xs = np.arange(len(batches))  # evenly spaced: batch sizes are usually powers of two or 1, 8, 32
    has_baseline = bool(report.results) and report.results[0].baseline is not None
    fig, axes = plt.subplots(1, 2 if has_baseline else 1, figsize=(11 if has_baseline else 6, 4.4), squeeze=False)
    ax = axes[0][0]
    series = [(f"optimized: {Path(report.optimized).name}", "optimized", "#1f77b4", "o")]
    if has_baseline:
        series.append((f"baseline: {Path(report.baseline).name}", "baseline", "#ff7f0e", "s"))
    medians = {role: np.array([getattr(r, role).median_ms for r in report.results]) for _, role, _, _ in series}
    highest = np.max(np.stack(list(medians.values())), axis=0)
    for label, role, color, marker in series:
        med = medians[role]
        p90 = np.array([getattr(r, role).p90_ms for r in report.results])
        ax.errorbar(xs, med, yerr=[np.zeros_like(med), p90 - med], color=color, marker=marker, capsize=3,
                    linewidth=1.8, label=label)
        for x, v, top in zip(xs, med, highest):
            # the slower model's value above its point, the faster one's below: the labels never collide
            ax.annotate(f"{v:.3g}", (x, v), textcoords="offset points", xytext=(7, 3 if v >= top else -11),
                        fontsize=8, color=color, bbox=_LABEL_BOX)
    ax.set_yscale("log")  # batch 1 and batch 32 differ by orders of magnitude
    ax.set_xticks(xs, [str(b) for b in batches])
    ax.set_xlabel("batch size")
    ax.set_ylabel("latency, ms (median; whisker to p90)")
    ax.set_title("Latency (lower is better)")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(which="both", axis="y", alpha=0.3)
    ax.set_xlim(-0.5, len(xs) - 0.5)
    if has_baseline:
        ax = axes[0][1]
        speedups = np.array([r.speedup for r in report.results])
        colors = ["#2ca02c" if s >= 1 else "#d62728" for s in speedups]
        bars = ax.bar(xs, speedups, 0.6, color=colors)
        ax.bar_label(bars, labels=[f"{s:.2f}×" for s in speedups], fontsize=9, padding=3, bbox=_LABEL_BOX)
        ax.axhline(1.0, color="black", linewidth=1, linestyle="--", zorder=0)
        ax.set_xticks(xs, [str(b) for b in batches])
        ax.set_xlabel("batch size")
        ax.set_ylabel("speedup = baseline ÷ optimized latency")
        ax.set_title("Speedup (above 1: optimized is faster)")
        ax.set_ylim(0, max(1.2, float(speedups.max()) * 1.15))
        ax.grid(axis="y", alpha=0.3)
    provider = short_name(PROVIDERS[report.provider][0]) + (" + CUDA graph" if report.cuda_graph else "")
    fig.suptitle(title or f"{Path(report.optimized).name} on {provider}")
    fig.tight_layout()
    _write_png(fig, path, dpi=120)
    return path
