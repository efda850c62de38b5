"""The library pipeline: ONNX Runtime's transformer fusions (where asked) → the fusion rules → (tune's
``--approximate auto``) → (the ``--verify`` gate) → the written model. What ``onnxfuse optimize`` and
``inspect`` run, and what a Python caller calls::

    import onnxfuse

    result = onnxfuse.optimize("bert.onnx", target="cuda")        # or an onnx.ModelProto
    model, report = result                                         # the rewritten model and what was done
    onnxfuse.save(result, "bert.fused.onnx")                       # atomic; external data streamed

Each step is another module's (``ort_fusions``, ``fuse``, ``tune``, ``compare``, ``model_save``); this one
chains them, reads the input (``model_io``, with ONNX Runtime judging what ``onnx.checker`` rejects) and fills
in the report. The steps run in memory where they can: the rewrite is made once, and tuned from memory unless
it has deferred weights (``deferred``: computed only while the model is written), which tune then reads
from a staged copy. The output is written once, by the last step, and checked before it takes its place.
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import onnx

from . import cost_model, model_io, model_save, provenance
from .domain import DOMAIN, OP_TYPE
from .errors import AccuracyGateError, BadInputError
from .fuse import FuseResult, fuse_model
from .patterns.graph import base_dir_of
from .report import Report

if TYPE_CHECKING:
    from .compare import CompareReport
    from .tune import TuneReport

IN_MEMORY = "<in-memory model>"  # what messages and warnings call a ModelProto given to optimize()

# The steps a run goes through, as ``on_step(step, detail)`` hears them start (a front end shows the long ones
# while they run and times them); ``detail`` says more where there is more to say (which fusion set, where).
STEPS = ("read", "ort-fusions", "rules", "write", "verify", "tune")
OnStep = Callable[[str, str], None]


def _no_step(step: str, detail: str = "") -> None:
    """``on_step`` for a caller that does not listen."""


class Optimized(tuple):
    """What :func:`optimize` returns: the pair ``(model, report)`` (unpack it as one), and what writing the
    model needs. Where the input keeps its weights in external data, the model points at the input's data
    files, and the weights the rewrite made from them (transposed, packed) are :attr:`deferred`: they exist
    once :meth:`save` (or :func:`save`) writes the model, which is therefore the way to write it."""

    def __new__(cls, result: FuseResult, *, check: bool, input_checker_error: str | None,
                runtime_loads: bool = False):
        self = super().__new__(cls, (result.model, result.report))
        self._result, self._check, self._input_checker_error = result, check, input_checker_error
        self._runtime_loads = runtime_loads  # the written model must load in ONNX Runtime (checker: see _optimize)
        return self

    @property
    def model(self) -> onnx.ModelProto:
        return self[0]

    @property
    def report(self) -> Report:
        return self[1]

    @property
    def deferred(self) -> dict:
        """The new tensors computed only while saving, by name (``deferred.Deferred`` recipes)."""
        return self._result.derived

    @property
    def source_dir(self) -> str | None:
        """The folder the model's external data is read from (None: the model holds every weight)."""
        return self._result.source_dir

    def save(self, path, *, before_publish: Callable[[str], None] | None = None) -> None:
        """Write the model to ``path`` atomically, external data streamed into ``path``.data beside it, and set
        the report's ``output``. Before the written model takes ``path``'s place it must pass ``onnx.checker``
        wherever the input did, with no error the input did not have (where ORT's fusions wrote a model the
        checker rejects: load in ONNX Runtime), and ``before_publish(temp_path)`` runs on it when given (an
        exception it raises leaves ``path`` as it was)."""
        self._result.save(path, check=self._check, before_publish=self._before_publish(path, before_publish),
                          input_checker_error=self._input_checker_error)
        self.report.output = os.fspath(path)

    def _before_publish(self, path, before_publish: Callable[[str], None] | None) -> Callable[[str], None] | None:
        """``before_publish``, after the check that ONNX Runtime loads the written model where that is the
        output's guarantee (ORT's fusions wrote a model onnx.checker rejects)."""
        if not self._runtime_loads:
            return before_publish

        def loads_then(written: str) -> None:
            refused = _onnxruntime_load_error(onnx.load(written, load_external_data=False), written)
            if refused is not None:
                raise BadInputError(f"{os.fspath(path)}: not written: ONNX Runtime cannot load the output ({refused})")
            if before_publish is not None:
                before_publish(written)

        return loads_then


def _onnxruntime_load_error(model: onnx.ModelProto, source: str | None, *, base_dir: str | None = None) -> str | None:
    """``runtime.onnxruntime_load_error``, imported when asked: only an input ``onnx.checker`` rejects needs
    ONNX Runtime's word, and a rewrite that needs no runtime does not import one."""
    from .runtime import onnxruntime_load_error

    return onnxruntime_load_error(model, source, base_dir=base_dir)


def _ort_implied_opsets() -> dict[str, int]:
    """``runtime.ort_implied_opsets``, imported when asked: only a model that uses a domain it does not import
    needs it."""
    from .runtime import ort_implied_opsets

    return ort_implied_opsets()


# what validation asks ONNX Runtime (runtime.load_probes(), without importing ORT until a model needs it)
_LOAD_PROBES = {"runtime_load_error": _onnxruntime_load_error, "implied_opsets": _ort_implied_opsets}


def load_input(path, *, notes: model_io.LoadNotes | None = None, load_external_data: bool = False) -> onnx.ModelProto:
    """The model at ``path`` as ``optimize`` reads it: ``model_io.load_model``, with ONNX Runtime judging a
    model ``onnx.checker`` rejects (tolerated, and said in ``notes``, where ORT loads it) and telling the opset
    versions it assumes for domains the model uses without importing them."""
    return model_io.load_model(path, notes=notes, load_external_data=load_external_data, **_LOAD_PROBES)


def _read(model, base_dir, notes: model_io.LoadNotes) -> tuple[onnx.ModelProto, str | None, str | None]:
    """(the model to rewrite, its path or None, the folder of its external data) from a path or a ModelProto.
    A ModelProto is checked as a file is, on a copy (its nodes may be sorted): the caller's is never changed."""
    if not isinstance(model, onnx.ModelProto):
        return load_input(model, notes=notes), os.fspath(model), base_dir_of(model)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    folder = None if base_dir is None else os.fspath(base_dir)
    model_io.validate_model(copy, IN_MEMORY, base_dir=folder, notes=notes, **_LOAD_PROBES)
    return copy, None, folder


def _rules_after_ort_fusions(model: onnx.ModelProto, target: cost_model.Target, ort_fusions: bool,
                             input_checker_error: str | None, on_step: OnStep = _no_step, **fuse_args):
    """fuse_model on the model after ORT's transformer fusions, where asked and applicable (ort_fusions.py
    says why and when). Of ORT's model types the one after which the rules fuse the most blocks is kept
    (then the smaller graph, then ``MODEL_TYPES``' order); ORT's output is held to ``onnx.checker`` as an
    input is (``ort_fusions.judge_checker``: ``input_checker_error`` is the input's own, tolerated already).
    Returns the result, the model the rules ran on and the step's report (None when not asked)."""
    if not ort_fusions:
        on_step("rules", "")
        return fuse_model(model, target=target, **fuse_args), model, None
    from .ort_fusions import (MODEL_TYPES, OrtFusionsReport, apply_ort_fusions, judge_checker,
                              restore_external_references, why_not, with_external_data_loaded)

    reason = why_not(model, target.name)
    if reason is not None:
        on_step("rules", "")
        return fuse_model(model, target=target, **fuse_args), model, OrtFusionsReport(False, why_not=reason).to_dict()
    source, references = model, {}
    if model_io.external_tensors(model):  # ORT's fusions read constants: on a copy with the data loaded
        source, references = with_external_data_loaded(model, fuse_args["base_dir"])
    best, failures = None, []
    for rank, model_type in enumerate(MODEL_TYPES):
        on_step("ort-fusions", f"the {model_type} fusion set")
        fused_input, step = apply_ort_fusions(source, model_type=model_type, use_gpu=target.name == "cuda")
        step = judge_checker(fused_input, step, input_checker_error=input_checker_error,
                             runtime_load_error=_onnxruntime_load_error)
        if not step.applied:
            failures.append(step)
            continue
        if references:  # what ORT kept as it was is read from the input's data file again, and streamed
            restore_external_references(fused_input, references, source)
        on_step("rules", f"after ORT's {model_type} fusions")
        result = fuse_model(fused_input, target=target, **fuse_args)
        # a bias moved into an existing node is no block fused: the fusion set that lets both rank alike
        fused = sum(not b.details.get("moves_only") for b in result.report.fused)
        score = (fused, -len(result.model.graph.node), -rank)
        if best is None or score > best[0]:
            best = (score, result, fused_input, step)
    if best is None:  # the rules on the model as it was; a model ORT's fusions broke is the reason to give
        failed = next((f for f in failures if f.checker_error), failures[0])
        on_step("rules", "")
        return fuse_model(model, target=target, **fuse_args), model, failed.to_dict()
    _, result, fused_input, step = best
    return result, fused_input, step.to_dict()


def op_counts(model: onnx.ModelProto) -> dict[str, int]:
    """How many nodes of each op type ``model`` has, in its main graph and every If/Loop/Scan body, by name
    (``op_type`` in ONNX's domain, else ``domain.op_type``, as the report names the ops it writes)."""
    counts: dict[str, int] = {}
    for node in model_io.all_nodes(model.graph):
        name = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
        counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))


def _ort_fusions_warnings(step: dict | None) -> list[str]:
    """What the report warns of ORT's fusions: a model onnx.checker rejects kept (ONNX Runtime loads it), or
    not kept (neither accepts it: the rules ran on the model as it was)."""
    if step is None or not step.get("checker_error"):
        return []
    if not step["applied"]:
        return [step["why_not"]]
    return [f"ORT's transformer fusions ({step['model_type']}) wrote a model that onnx.checker rejects "
            f"({step['checker_error']}); ONNX Runtime loads it, so it is kept, and the output is held to load in "
            "ONNX Runtime in place of onnx.checker"]


def _optimize(model, *, target, ort_fusions: bool, approximate: str | None, base_dir,
              on_step: OnStep = _no_step) -> tuple[Optimized, onnx.ModelProto]:
    """:func:`optimize`, and the input as read (which ``inspect`` reads a tuned model's tables from)."""
    start = time.perf_counter()
    target = cost_model.get_target(target)  # an unknown name is refused before the model is read
    notes = model_io.LoadNotes()
    on_step("read", "" if isinstance(model, onnx.ModelProto) else os.fspath(model))
    source, path, folder = _read(model, base_dir, notes)
    result, rewritten, step = _rules_after_ort_fusions(source, target, ort_fusions, notes.checker_error, on_step,
                                                       approximate=approximate, base_dir=folder)
    report = result.report
    earlier = provenance.already_optimized(source, len(report.fused))
    report.already_optimized = None if earlier is None else earlier.to_dict()
    if report.fused:  # what fused nothing stays byte for byte the input (or only its nodes sorted): no stamp
        provenance.stamp(result.model, {b.rule for b in report.fused})
    report.warnings = notes.warnings + _ort_fusions_warnings(step)
    report.ort_fusions = step
    report.model = path
    report.op_counts = {"before": op_counts(source), "after": op_counts(result.model)}
    report.seconds = time.perf_counter() - start
    # onnx.checker (full check) guards every output it can judge: all but models with ORT-only ops in the
    # default domain (ORT's transformers optimizer output), which it rejects before we touch them. An
    # input it rejects (that ORT runs) may keep its own checker error, and gain none. ORT's output it rejects
    # (that ORT loads) it cannot judge: which error comes first changes as the rules rewrite the nodes, so
    # ONNX Runtime loading the written output is the guarantee there.
    if step is not None and step["applied"] and step.get("checker_error"):
        return Optimized(result, check=False, input_checker_error=None, runtime_loads=True), source
    return Optimized(result, check=model_io.checkable(rewritten), input_checker_error=notes.checker_error), source


def optimize(model, *, target: str = cost_model.DEFAULT_TARGET, ort_fusions: bool = False,
             approximate: str | None = None, base_dir=None, on_step: OnStep | None = None) -> Optimized:
    """Rewrite ``model`` (a path, or an ``onnx.ModelProto``): ONNX Runtime's transformer fusions first where
    ``ort_fusions`` asks (ort_fusions.py says when they apply), then every fusion rule, for ``target`` (a name
    of ``cost_model.TARGETS``: a block whose fusion does not pay there is left as it is, with its reason).
    ``approximate`` ("tanh" or "sigmoid") makes every fused GELU compute that form, changing the math on
    purpose. Returns ``(model, report)`` (:class:`Optimized`: :func:`save` writes it).

    The input is read as ``onnxfuse optimize`` reads it, and bad input raises the same ``BadInputError``.
    From a path, weights in external data stay on disk: they are read while the model is saved, never here.
    A ModelProto is checked on a copy (the one passed is not changed); ``base_dir`` is the folder of its
    external data, if it has any. ``on_step(step, detail)`` is called as each step of ``STEPS`` starts."""
    return _optimize(model, target=target, ort_fusions=ort_fusions, approximate=approximate, base_dir=base_dir,
                     on_step=on_step or _no_step)[0]


def save(optimized: Optimized, path, *, before_publish: Callable[[str], None] | None = None) -> None:
    """Write what :func:`optimize` returned to ``path``: :meth:`Optimized.save`."""
    optimized.save(path, before_publish=before_publish)


def inspect_file(path, *, target: str = cost_model.DEFAULT_TARGET, ort_fusions: bool = False,
                 on_step: OnStep | None = None) -> Report:
    """What ``optimize`` would do to the model at ``path`` for ``target``: ORT's transformer fusions first
    (``ort_fusions``), then the blocks it would fuse and every refusal, and a tuned model's path tables. The
    rewrite runs in memory (on placeholders: external weights are not read, except where ORT's fusions are
    asked for, which read the constants they fuse); nothing is written. ``on_step``: as :func:`optimize`'s."""
    from .tuning import read_tuning

    optimized, source = _optimize(path, target=target, ort_fusions=ort_fusions, approximate=None, base_dir=None,
                                  on_step=on_step or _no_step)
    optimized.report.tuning = read_tuning(source)
    return optimized.report


def optimize_file(input_path, output_path, *, approximate: str | None = None, before_publish=None,
                  target: str = cost_model.DEFAULT_TARGET, ort_fusions: bool = False) -> Report:
    """:func:`optimize` the model at ``input_path`` and write ``output_path`` atomically (external data
    streamed); the output path is checked before the work. ``before_publish(temp_model_path)`` runs on the
    finished file before it takes ``output_path``'s place; an exception it raises leaves ``output_path`` as
    it was."""
    start = time.perf_counter()
    cost_model.get_target(target)
    model_save.check_output_path(input_path, output_path)
    optimized = optimize(input_path, target=target, ort_fusions=ort_fusions, approximate=approximate)
    optimized.save(output_path, before_publish=before_publish)
    optimized.report.seconds = time.perf_counter() - start
    return optimized.report


# --- optimize's later steps: --approximate auto, --verify ------------------------------------------------
@dataclass(frozen=True)
class AutoApproximation:
    """``optimize --approximate auto``: tune's ``--approximate auto`` on the rewrite, on this machine's CUDA GPU
    (``tune.tune_model``'s options of the same names)."""

    budget: float
    forms: Sequence[str] | None = None
    shapes: dict = field(default_factory=dict)
    batches: Sequence[int] | None = None
    samples: int | None = None


@dataclass(frozen=True)
class Verify:
    """``optimize --verify``: compare's gate on the written model against its input, before it is published
    (``compare.compare_models``' options of the same names)."""

    provider: str = "cpu"
    samples: int = 2
    shapes: dict = field(default_factory=dict)
    rtol: float | None = None
    atol: float | None = None
    keep_failed: bool = False  # publish a model outside tolerance anyway (the verdict says it failed)


@dataclass
class Written:
    """What :func:`write_optimized` did: the rewrite's report (``output`` where the model is), tune's report
    (with ``--approximate auto`` on a model with FusedLinearGelu nodes) and the gate's verdict (with
    ``--verify``; a failed one only with ``keep_failed``: the model was written anyway)."""

    report: Report
    tuned: TuneReport | None = None
    verdict: CompareReport | None = None
    # nothing written: onnxfuse had optimized the input already (report.already_optimized says by which)
    skipped_already_optimized: bool = False


def approximation_hint(verdict: CompareReport, *, approximate: str | None, auto: AutoApproximation | None) -> str:
    """For a gate that failed on a model whose GELU math was changed on purpose (``--approximate``): what would
    have let it pass, from the errors it measured: the --rtol/--atol under which every output passes on these
    samples, and with ``auto`` a smaller --error-budget (the largest rel-L2 the gate measured: a budget below
    it makes tune switch fewer nodes). "" where the math was not changed on purpose, which no tolerance hint
    should paper over."""
    if verdict.passed or (approximate is None and auto is None):
        return ""
    ways = []
    tolerance = verdict.passing_tolerance()
    if tolerance is not None:
        ways.append(f"--rtol {tolerance.rtol:g} --atol {tolerance.atol:g} would have passed")
    if auto is not None:
        measured = max(o.rel_l2 for o in verdict.outputs)
        ways.append(f"an --error-budget below {measured:.2g} (the largest rel-L2 measured here; it was "
                    f"{auto.budget:g}) makes tune switch fewer nodes")
    if not ways:
        return ""
    what = "--approximate auto" if auto is not None else f"--approximate {approximate}"
    return f" ({what} changes the math on purpose: {'; or '.join(ways)})"


def _gate(model, output, verify: Verify, on_verdict, verdicts: list, on_step: OnStep,
          hint: Callable[[CompareReport], str]) -> Callable[[str], None]:
    """The ``before_publish`` hook of ``--verify``: compare the written temporary model with ``model``, hand
    the verdict to ``on_verdict`` (the command renders it), and stop the publication when it failed (with
    ``hint(verdict)``: what would have passed, where the math was changed on purpose)."""
    def run_gate(written_model: str) -> None:
        from .compare import verify_optimized

        on_step("verify", f"{verify.samples} sample(s) on {verify.provider}")
        verdict = verify_optimized(model, written_model, published_as=output, provider=verify.provider,
                                   samples=verify.samples, shapes=verify.shapes, rtol=verify.rtol,
                                   atol=verify.atol, progress=False)
        verdicts.append(verdict)
        if on_verdict is not None:
            on_verdict(verdict)
        if not verdict.passed and not verify.keep_failed:
            raise AccuracyGateError(f"{output} not written: {verdict.summary()}{hint(verdict)}")

    return run_gate


def _tune_and_save(model, optimized: Optimized, output, auto: AutoApproximation, before_publish,
                   tune_progress, on_step: OnStep) -> TuneReport | None:
    """The rewrite's FusedLinearGelu nodes tuned (``--approximate auto``) into ``output``. In memory, unless
    the rewrite has deferred weights: those exist only once written, so the exact rewrite is then staged in
    a temporary folder beside ``output`` (gone whatever happens) and tuned from there. A rewrite with no
    FusedLinearGelu node has no form to choose: ``output`` is then the rewrite itself, with a warning."""
    from .tune import TuneInput, tune_file, tune_model

    report = optimized.report
    if not report.fused_by_op.get(f"{DOMAIN}.{OP_TYPE}"):
        on_step("write", os.fspath(output))
        optimized.save(output, before_publish=before_publish)
        report.warnings.append(f"--approximate auto: no {OP_TYPE} node in the rewrite, so no GELU form to "
                               "choose: OUT is the exact rewrite")
        return None
    options = dict(shapes=auto.shapes, batches=auto.batches, approximate="auto", budget=auto.budget,
                   forms=auto.forms, samples=auto.samples,
                   before_publish=optimized._before_publish(output, before_publish))
    with contextlib.ExitStack() as stack:
        if optimized.deferred:
            folder = os.path.dirname(os.path.abspath(os.fspath(output)))
            staging = stack.enter_context(tempfile.TemporaryDirectory(prefix=".onnxfuse-optimize-", dir=folder))
            exact = os.path.join(staging, os.path.basename(os.fspath(output)))
            on_step("write", "the rewrite, staged for tuning")
            optimized.save(exact)
        on_step("tune", os.fspath(output))
        bar = stack.enter_context(tune_progress()) if tune_progress is not None else None
        try:
            if optimized.deferred:
                tuned = tune_file(exact, output, progress=bar, **options)
            else:
                source = TuneInput(optimized.model, report.model, optimized.source_dir, optimized._check,
                                   optimized._input_checker_error)
                tuned = tune_model(source, output, progress=bar, **options)
        except BadInputError as e:
            raise BadInputError(f"--approximate auto: {e}") from e
    tuned.model = os.fspath(model)  # the exact rewrite it tuned was this run's, in memory or gone
    return tuned


def write_optimized(model, output, *, target: str = cost_model.DEFAULT_TARGET, ort_fusions: bool = False,
                    approximate: str | None = None, auto: AutoApproximation | None = None,
                    verify: Verify | None = None, on_verdict: Callable[[CompareReport], None] | None = None,
                    tune_progress: Callable[[], contextlib.AbstractContextManager] | None = None,
                    on_step: OnStep | None = None, force: bool = False) -> Written:
    """``onnxfuse optimize``: the model at path ``model`` rewritten (:func:`optimize`), with ``auto`` tuned
    on this machine's GPU (``--approximate auto``; not with ``approximate``), written to ``output`` once,
    atomically. With ``verify`` the written model is judged against ``model`` before it takes ``output``'s
    place: outside tolerance it is not published (``AccuracyGateError``) unless ``verify.keep_failed``. The
    verdict goes to ``on_verdict`` as soon as it is known; ``tune_progress()`` is opened around the tuning
    (a progress bar, or None); ``on_step(step, detail)`` is called as each step of ``STEPS`` starts. The output
    path is checked before the work. A model onnxfuse optimized already (``provenance.already_optimized``) is
    not written again, unless ``force``: the report says so, and nothing runs after the rewrite."""
    start = time.perf_counter()
    on_step = on_step or _no_step
    cost_model.get_target(target)
    if auto is not None and approximate is not None:
        raise ValueError("write_optimized: approximate= makes every node one form; auto= chooses per node")
    model_save.check_output_path(model, output)
    verdicts: list = []
    hint = functools.partial(approximation_hint, approximate=approximate, auto=auto)
    gate = None if verify is None else _gate(model, output, verify, on_verdict, verdicts, on_step, hint)
    optimized = optimize(model, target=target, ort_fusions=ort_fusions, approximate=approximate, on_step=on_step)
    if optimized.report.already_optimized is not None and not force:
        optimized.report.seconds = time.perf_counter() - start
        return Written(optimized.report, skipped_already_optimized=True)
    tuned = None
    if auto is None:
        on_step("write", os.fspath(output))
        optimized.save(output, before_publish=gate)
    else:
        tuned = _tune_and_save(model, optimized, output, auto, gate, tune_progress, on_step)
    report = optimized.report
    report.output = os.fspath(output)
    report.seconds = time.perf_counter() - start
    return Written(report, tuned, verdicts[0] if verdicts else None)
