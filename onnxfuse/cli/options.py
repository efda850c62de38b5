"""What several commands parse alike: the options they share (declared once, so their help texts cannot drift)
and the parsing of their values. Checked values give the one-line exit-2 error every bad input gets."""

from __future__ import annotations

import click


QUIET, NORMAL, VERBOSE = -1, 0, 1
_VERBOSITY = "onnxfuse.verbosity"  # in the context's meta, which the group and its command share


def _set_verbosity(ctx: click.Context, param: click.Parameter, given: bool) -> None:
    if not given:
        return
    level = VERBOSE if param.name == "verbose" else QUIET
    if ctx.meta.setdefault(_VERBOSITY, level) != level:
        raise click.UsageError("-v/--verbose and -q/--quiet contradict each other", ctx)


def verbosity_options(f):
    """-v/--verbose and -q/--quiet, taken by the group (``onnxfuse -q optimize ...``) and by each command
    (``onnxfuse optimize ... -q``) alike; both at once is a usage error. Read with :func:`verbosity`."""
    f = click.option("-q", "--quiet", is_flag=True, expose_value=False, callback=_set_verbosity,
                     help="Print only errors and the final one-line result: no tables, warnings or progress.")(f)
    return click.option("-v", "--verbose", is_flag=True, expose_value=False, callback=_set_verbosity,
                        help="Print more: every refusal (optimize lists each, not one row per reason) and the "
                             "time each step took (on stderr).")(f)


def verbosity() -> int:
    """QUIET, NORMAL or VERBOSE: what -q/-v asked for in this command line (NORMAL outside one)."""
    ctx = click.get_current_context(silent=True)
    return NORMAL if ctx is None else ctx.meta.get(_VERBOSITY, NORMAL)


class _TargetOption(click.Option):
    """--target, whose values, default and help are the cost model's (``cost_model.TARGETS``): read when the
    help is shown or the option parsed, never when the command line starts (the cost model imports the rules
    and ONNX, and ``onnxfuse --help`` must not wait for them)."""

    def get_help_record(self, ctx):
        from ..cost_model import DEFAULT_TARGET, TARGETS

        lines = "; ".join(f"{t.name}: {t.summary}" for t in TARGETS.values())
        self.metavar = "|".join(TARGETS)
        self.default, self.show_default = DEFAULT_TARGET, True  # the value, not the function giving it
        self.help = (f"What will run the model; a block whose fusion does not pay there is left as it is, with its "
                     f"reason in the refusals. {lines}. The default is a named target, not a guess from this "
                     f"machine: the output must not depend on where it was optimized, and cuda (what the fused "
                     f"nodes are made for) fuses every block, as cpu does today.")
        return super().get_help_record(ctx)


def _default_target() -> str:
    from ..cost_model import DEFAULT_TARGET

    return DEFAULT_TARGET


def target_option(f):
    """--target, shared by optimize and inspect. A plain string checked by the cost model, so a bad value
    is the one-line exit-2 error every bad input gets (not click's usage block)."""
    return click.option("--target", cls=_TargetOption, default=_default_target, metavar="TARGET")(f)


def ort_fusions_option(f):
    """--ort-fusions/--no-ort-fusions, shared by optimize and inspect."""
    return click.option(
        "--ort-fusions/--no-ort-fusions", default=False, show_default=True,
        help="Run ONNX Runtime's transformer fusions (SkipLayerNormalization, EmbedLayerNormalization, bias "
             "and GELU forms; onnxruntime.transformers.optimizer) before onnxfuse's rules, where the model has "
             "not been through them and the target is not tensorrt. Measured on the H200: 1.24-1.27x faster "
             "than onnxfuse alone in fp16 (BERT-base, GPT-2, ViT-B/16, batch 32). Not the default: ORT's "
             "fusions do not always keep the math (ONNX's tanh Gelu in GPT-NeoX's dynamo export becomes erf "
             "BiasGelu); use it with --verify.")(f)


# --approximate: one vocabulary, one meaning in every command; each takes the values it can act on.
APPROXIMATE_VALUES = ("none", "tanh", "sigmoid", "auto")
APPROXIMATE_MEANING = ("One vocabulary in every command: none, each fused node keeps its model's GELU form (a node "
                       "bench builds is exact erf GELU); tanh or sigmoid, every fused node computes that form, "
                       "changing the math on purpose; auto, per node on this machine's CUDA GPU, the approximate "
                       "form only where it is faster and the outputs stay within --error-budget.")


def approximation_budget_options(f):
    """--error-budget and --approximate-forms, the options of --approximate auto (tune, and optimize's one-step
    form); --budget, the deprecated spelling of --error-budget (bench's --budget is seconds), still read for one
    release (``error_budget`` below)."""
    f = click.option("--approximate-forms", "forms_text", default=None, metavar="tanh[,sigmoid]",
                     help="With --approximate auto: the forms a node may take (default tanh, within 4.8e-4 of erf "
                          "GELU; sigmoid, x*sigmoid(1.702x), is forty times coarser and only tried when named).")(f)
    f = click.option("--budget", "deprecated_budget", type=float, default=None, hidden=True)(f)
    return click.option(
        "--error-budget", "budget", type=float, default=None, metavar="REL",
        help="With --approximate auto (required there): the largest error allowed, > 0. The error is the largest "
             "over the model's outputs of rel-L2 = ||tuned - exact||_2 / ||exact||_2 over --samples random samples "
             "at the largest batch, both models run on this GPU (exact: the fused model with every node at its own "
             "GELU form); a changed integer output or NaN/Inf is over any budget. Over budget, the switch that "
             "saves the least time is undone, one at a time, until the error is within it. (--budget, its "
             "former spelling, is deprecated: bench's --budget is seconds.)")(f)


def error_budget(budget: float | None, deprecated_budget: float | None) -> float | None:
    """--error-budget's value, or --budget's with a deprecation warning; both given is bad input."""
    from ..errors import BadInputError
    from .render import warn_deprecated

    if deprecated_budget is None:
        return budget
    if budget is not None:
        raise BadInputError("--budget is the deprecated spelling of --error-budget: give --error-budget only")
    warn_deprecated("--budget", "--error-budget REL", "bench's --budget is seconds, this one a relative error")
    return deprecated_budget


_BARE_JSON = "\0bare --json"  # what a --json without a value parses to (no path can be this)


def json_option_or_switch(f):
    """--json FILE|-, as every command takes it, for the commands (inspect, doctor) whose --json was a switch
    that printed the report on stdout: a bare --json still does, with a deprecation warning, for one release
    (``json_path`` below)."""
    return click.option("--json", "json_value", metavar="FILE|-", is_flag=False, flag_value=_BARE_JSON,
                        help="Write the report as JSON to FILE ('-' for stdout instead of the tables). A bare "
                             "--json is the deprecated spelling of --json -.")(f)


def json_path(value: str | None) -> str | None:
    """The --json path of ``json_option_or_switch``: '-' for the deprecated bare switch, with a warning."""
    if value != _BARE_JSON:
        return value
    _warn_bare_json()
    return "-"


def model_and_json_path(model: str | None, value: str | None) -> tuple[str | None, str | None]:
    """(MODEL, the --json path) of a command whose MODEL may follow the old bare switch: in `inspect --json
    MODEL` click reads MODEL as --json's FILE and finds no MODEL; that is the old spelling, said deprecated."""
    if model is None and value not in (None, "-", _BARE_JSON):
        _warn_bare_json()
        return value, "-"
    return model, json_path(value)


def _warn_bare_json() -> None:
    from .render import warn_deprecated

    warn_deprecated("a bare --json", "--json -", "--json takes a FILE in every command, '-' for stdout")


def output_beside(model: str, output: str | None, kind: str) -> str:
    """OUT as given, or else MODEL's own name with ``.KIND`` before its ``.onnx`` (model.onnx →
    model.fused.onnx), in MODEL's folder: the terminal user's `onnxfuse optimize model.onnx` writes where the
    model is, never over it (an output that is the input is refused, as with -o)."""
    if output is not None:
        return output
    stem = model[:-len(".onnx")] if model.lower().endswith(".onnx") else model
    return f"{stem}.{kind}.onnx"


def parse_batches(text: str) -> list[int]:
    """--batch B1,B2,... (optimize, tune, bench): positive integers, or the one-line exit-2 error."""
    from ..errors import BadInputError

    try:
        batches = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        batches = []
    if not batches or min(batches) < 1:
        raise BadInputError(f"--batch {text!r}: expected positive integers separated by commas, e.g. 1,8,32")
    return batches
