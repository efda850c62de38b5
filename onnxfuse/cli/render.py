"""What the commands print: tables for people (rich, on stdout), the JSON report, warnings and progress bars on
stderr. Shared by the commands whose output overlaps (optimize shows compare's and tune's tables); a table only
one command prints lives in that command's module.

How much is said follows -q/-v (``options.verbosity``): quiet, only errors and the final one-line result (no
table, warning, status line or progress bar); verbose, also every refusal and each step's time."""

from __future__ import annotations

import sys
import time

import click

from .options import QUIET, VERBOSE, verbosity


def quiet() -> bool:
    return verbosity() == QUIET


def verbose() -> bool:
    return verbosity() == VERBOSE


def warn(line: str) -> None:
    """A warning: one line on stderr (stdout stays the report's); none with -q."""
    if not quiet():
        click.echo(f"onnxfuse: warning: {line}", err=True)


def warn_deprecated(old: str, new: str, why: str) -> None:
    """A deprecated spelling that still works: what to say instead, and why (each is listed in the CHANGELOG)."""
    warn(f"{old} is deprecated ({why}): use {new}; the old spelling goes in the next release")


def result_line(text: str) -> None:
    """The final one-line result, on stdout: what -q leaves."""
    click.echo(text)


def progress_bar(enabled: bool, label: str):
    """A rich progress bar on stderr (so --json - stays clean), or nothing. Only on a terminal: into a
    pipe or a log it would add a blank line to the one-line errors; and not with -q."""
    import contextlib

    if not enabled or quiet() or not sys.stderr.isatty():
        return contextlib.nullcontext(None)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    return Progress(SpinnerColumn(), TextColumn(label + " {task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=Console(stderr=True), transient=True)


# What each of the pipeline's steps (pipeline.STEPS) is called while it runs, and in -v's timings.
STEP_NAMES = {"read": "reading", "ort-fusions": "ORT's transformer fusions", "rules": "onnxfuse's rules",
              "write": "writing", "verify": "verifying", "tune": "tuning"}


class StepStatus:
    """The pipeline's steps as they start (``pipeline.OnStep``): while one runs, a status line on stderr naming
    it, on a terminal only (into a pipe, a CI log or beside ``--json -`` it would be noise), and their times.
    ``pause()`` hands the terminal to a progress bar (rich shows one live display at a time); the next step
    takes it back."""

    def __init__(self):
        self.show = not quiet() and sys.stderr.isatty()
        self.seconds: dict[str, float] = {}  # per step, in the order they first ran
        self._step: str | None = None
        self._started = 0.0
        self._status = None

    def __call__(self, step: str, detail: str = "") -> None:
        now = time.perf_counter()
        self._stop_timing(now)
        self._step, self._started = step, now
        if not self.show:
            return
        from rich.spinner import Spinner

        line = Spinner("dots", STEP_NAMES.get(step, step) + (f": {detail}" if detail else "") + " …", style="green")
        if self._status is None:
            from rich.console import Console
            from rich.live import Live

            self._status = Live(line, console=Console(stderr=True), transient=True, refresh_per_second=12.5)
            self._status.start(refresh=True)  # drawn now: a step shorter than a refresh is still seen
        else:
            self._status.update(line, refresh=True)

    def pause(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def echo_times(self) -> None:
        """With -v: each step's time, one line on stderr."""
        if verbose() and self.seconds:
            steps = " · ".join(f"{STEP_NAMES.get(step, step)} {seconds:.2f} s"
                               for step, seconds in self.seconds.items())
            click.echo(f"onnxfuse: time: {steps} (total {sum(self.seconds.values()):.2f} s)", err=True)

    def _stop_timing(self, now: float) -> None:
        if self._step is not None:
            self.seconds[self._step] = self.seconds.get(self._step, 0.0) + now - self._started
            self._step = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._stop_timing(time.perf_counter())
        self.pause()
        return False


def stdout_console():
    """A rich console on stdout, as wide as the terminal, or as ``COLUMNS`` says. Piped into a log without
    ``COLUMNS``, rich would squeeze the tables into 80 columns: give them room instead."""
    import os

    from rich.console import Console

    if sys.stdout.isatty() or os.environ.get("COLUMNS", "").isdigit():
        return Console()  # rich reads COLUMNS itself, before the terminal's size
    return Console(width=200)


def echo_warnings(report) -> None:
    """What was tolerated in the input, one line each on stderr (stdout stays the report's); none with -q."""
    for line in report.warnings:
        warn(line)


def emit_json(report, json_path, extra: dict | None = None, after_writing=None) -> None:
    """The report as JSON: on stdout for '-', else written atomically to ``json_path`` (nothing for None).
    ``after_writing``: the model this command has already written, which a failure to write the report (a
    full disk: its folder was tried before the work) must not let the error line deny."""
    if not json_path:
        return
    from ..atomic import json_text, write_json
    from ..errors import BadInputError

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


def rewrite_result(report) -> str | None:
    """optimize's (and inspect's) final line: the blocks fused and refused, the time, where the model went."""
    if report.seconds is None:
        return None
    return (f"{len(report.fused)} fused, {len(report.refused)} refused in {report.seconds:.2f} s"
            + (f" → {report.output}" if report.output else ""))


def already_optimized_line(report, output) -> str:
    """optimize's one line for a model onnxfuse optimized already: by which version, and that OUT was not
    written (with what --force would add, where a later onnxfuse fuses more)."""
    more = (f" ({len(report.fused)} more block(s) would fuse: --force writes them)" if report.fused
            else " (--force writes it)")
    return f"{report.model}: already optimized by {_optimized_by(report.already_optimized)}; {output} not written{more}"


def _optimized_by(provenance: dict) -> str:
    """Who optimized a model, from ``report.already_optimized``: 'onnxfuse 0.2.0'."""
    return f"onnxfuse {provenance['version'] or '(a version before provenance stamps)'}"


def render_rewrite(report, *, title: str, blocks: bool = False) -> None:
    """optimize's and inspect's tables: the blocks fused by source form, the refusals, the math changed; with
    ``blocks`` (inspect) every block and a tuned model's path tables. optimize lists one refusal per rule and
    reason (with how many blocks it left) unless -v asks for each; with -q only the final line is said."""
    from rich.table import Table

    final = rewrite_result(report)
    if quiet():
        if final:
            result_line(final)
        return
    console = stdout_console()
    console.print(title + (f" · target {report.target}" if report.target else ""), highlight=False)
    if report.already_optimized is not None:
        by = report.already_optimized
        rules = f" (rules: {', '.join(by['rules'])})" if by["rules"] else ""
        console.print(f"already optimized by {_optimized_by(by)}{rules}", highlight=False)
    if report.ort_fusions is not None:
        from ..ort_fusions import OrtFusionsReport

        console.print(OrtFusionsReport(**report.ort_fusions).summary(), highlight=False)
    forms = Table()
    forms.add_column("fused: source form")
    forms.add_column("blocks", justify="right")
    for form, count in report.fused_by_form.items():
        forms.add_row(form, str(count))
    forms.add_row("[bold]total fused[/]", f"[bold]{len(report.fused)}[/]")
    forms.add_row("refused (left as they were)", str(len(report.refused)))
    console.print(forms)
    ops = _op_counts(report)
    if ops is not None:
        console.print(ops)
    if blocks and report.fused:
        fused = Table(title="blocks to fuse", title_justify="left")
        for column in ("fused node", "op", "form", "replaces"):
            fused.add_column(column)
        for b in report.fused:
            fused.add_row(b.name, b.op, b.form, ", ".join(b.replaced))
        console.print(fused)
    if report.refused:
        console.print(_refusals(report.refused, each=blocks or verbose()))
    for c in report.math_changed:
        console.print(f"[yellow]math changed[/] {c.name}: {c.was} → {c.now}", highlight=False)
    if blocks and report.tuning:
        _render_tuning(console, report.tuning)
    if final:
        console.print(final, highlight=False)


def _op_counts(report):
    """The nodes per op type before and after: the ops onnxfuse writes first, then every other op whose count
    changed (what the fused blocks replaced); None when nothing changed."""
    from rich.table import Table

    if not report.op_counts:
        return None
    from ..domain import DOMAIN

    before, after = report.op_counts["before"], report.op_counts["after"]
    # the fused blocks' ops, and every op of onnxfuse's domain (the attention's row guard beside its op)
    written = sorted(set(report.fused_by_op) | {op for op in after if op.startswith(f"{DOMAIN}.")})
    changed = [op for op in sorted(set(before) | set(after), key=str.lower)
               if before.get(op, 0) != after.get(op, 0) and op not in written]
    if not written and not changed:
        return None
    table = Table(title="ops written, then ops changed", title_justify="left")
    table.add_column("op")
    table.add_column("before → after", justify="right")
    for op in written + changed:
        table.add_row(f"[bold]{op}[/]" if op in written else op, f"{before.get(op, 0)} → {after.get(op, 0)}")
    return table


def _refusals(refused, *, each: bool):
    """The refusals table: every refused block with its nodes (``each``), or one row per rule and reason, with
    the first block's nodes and how many more that reason left (a model repeats its layers)."""
    from rich.table import Table

    groups: dict[tuple[str, str], list] = {}
    for r in refused:
        groups.setdefault((r.rule, r.reason), []).append(r)
    grouped = not each and any(len(members) > 1 for members in groups.values())
    table = Table(title="refusals" + (" (one row per reason; -v lists each block)" if grouped else ""),
                  title_justify="left")
    for column in ("rule", "reason", "nodes"):
        table.add_column(column)
    if not grouped:
        for r in refused:
            table.add_row(r.rule, r.reason, ", ".join(r.nodes))
        return table
    for (rule, reason), members in groups.items():
        more = f" (and {len(members) - 1} more block(s) for this reason)" if len(members) > 1 else ""
        table.add_row(rule, reason, ", ".join(members[0].nodes) + more)
    return table


def render_compare(report) -> None:
    """compare's table (also optimize --verify's): each output's errors against its tolerance, and the verdict.
    The widest layout of ``_COMPARE_LAYOUTS`` that fits the console (a terminal of 80 columns gets the compact
    one; no cell is cut); numbers in 3 significant digits. With -q the verdict line only where it passed (a
    failure is the error line)."""
    if quiet():
        if report.passed:
            result_line("PASS: " + report.summary())
        return
    from rich.measure import Measurement

    console = stdout_console()
    console.print(f"{report.original} vs {report.optimized} · {report.provider} · {report.samples} sample(s), "
                  f"inputs {report.inputs}", highlight=False)
    unbounded = console.options.update_width(10_000)  # the table's own width, not the width it is given
    for layout in _COMPARE_LAYOUTS:
        table = _compare_table(report, layout)
        if Measurement.get(console, unbounded, table).maximum <= console.width:
            break
    console.print(table)  # the narrowest layout where none fits: its cells fold, never end in "…"
    console.print("[green]PASS[/]: " + report.summary() if report.passed else "[red]FAIL[/]: " + report.summary(),
                  highlight=False)


# compare's columns, widest layout first: a narrower terminal drops the columns said least often (the other
# quantiles, NaN/Inf: the verdict names those that differ; the mean), moves the type under the output's name and
# leaves the counts of a FAIL to the line below the table, then drops p99.
_COMPARE_COLUMNS = ("output", "dtype", "max abs", "max rel", "mean abs", "p50", "p99", "p99.9", "cosine", "NaN/Inf",
                    "rtol/atol", "verdict")
_COMPARE_LAYOUTS = (
    _COMPARE_COLUMNS,
    ("output", "dtype", "max abs", "max rel", "mean abs", "p99", "cosine", "rtol/atol", "verdict"),
    ("output", "max abs", "max rel", "p99", "cosine", "rtol/atol", "verdict"),
    ("output", "max abs", "max rel", "cosine", "rtol/atol", "verdict"),
)


def _compare_table(report, columns: tuple[str, ...]):
    from rich.table import Table

    table = Table()
    for column in columns:
        table.add_column(column, justify="left" if column in ("output", "dtype", "verdict") else "right",
                         overflow="fold")
    for o in report.outputs:
        dtype = o.dtype + (f" ({o.compute_dtype} math)" if o.compute_dtype else "")
        # the narrow layouts leave the counts to the FAIL line below the table
        verdict = ("[green]pass[/]" if o.passed else "[red]FAIL[/]" if "dtype" not in columns
                   else f"[red]FAIL[/] ({o.violations} over)")
        if o.nonfinite_mismatches and "NaN/Inf" not in columns and "dtype" in columns:
            verdict += f", {o.nonfinite_mismatches} NaN/Inf"
        cells = {"output": o.name if "dtype" in columns else f"{o.name}\n{dtype}", "dtype": dtype,
                 "max abs": _g3(o.max_abs), "max rel": _g3(o.max_rel), "mean abs": _g3(o.mean_abs),
                 "p50": _g3(o.p50_abs), "p99": _g3(o.p99_abs), "p99.9": _g3(o.p999_abs), "cosine": _cosine(o.cosine),
                 "NaN/Inf": str(o.nonfinite_mismatches),
                 "rtol/atol": f"{_g3(o.tolerance.rtol)}/{_g3(o.tolerance.atol)}", "verdict": verdict}
        table.add_row(*(cells[c] for c in columns))
    return table


def _g3(value: float) -> str:
    """3 significant digits in the fewest characters: 1.01e-5, 3.28e-4, 0.0123, 412, 1e-4, 0."""
    import math

    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    if 1e-3 <= abs(value) < 1e4:
        return f"{value:.3g}"
    mantissa, _, exponent = f"{value:.2e}".partition("e")
    return mantissa.rstrip("0").rstrip(".") + f"e{int(exponent)}"


def _cosine(value: float) -> str:
    """A cosine similarity: near 1 its distance from 1 in 3 significant digits (1−2.3e-9), which is what
    tells two close outputs apart; else the value."""
    if value == 1:
        return "1"
    return f"1−{_g3(1 - value)}" if 0 < 1 - value < 1e-3 else _g3(value)


def render_tune(report) -> None:
    """tune's tables (also optimize --approximate auto's): each shape's times per path and row count, the
    choice and why, each node's table, and the GELU forms chosen."""
    from rich.table import Table

    final = (f"{report.measurements} measurement(s), {len(report.tunings)} node(s) tuned in {report.seconds:.1f} s "
             f"→ {report.output}")
    if quiet():
        result_line(final)
        return
    console = stdout_console()
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
    console.print(final, highlight=False)


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
    from ..domain import GEMV_MAX_ROWS

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
