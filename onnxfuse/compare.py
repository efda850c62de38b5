"""The accuracy gate: run an original and an optimized ONNX model on the same inputs in ONNX Runtime and
judge, output by output, whether the optimized one still computes the same thing.

The original runs with ORT's graph optimizations off (``ORT_DISABLE_ALL``), so the reference is the model
as written; the optimized one runs as a user would deploy it, through ``onnxfuse.runtime.create_session``
(the FusedLinearGelu library registered, ORT's default optimizations on).

What is measured per output, and the default tolerances by type, are ``error_statistics``'. Verdict: the
comparison passes when every output does (exit code 0, else 3).
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto

from .domain import DOMAIN
from .dtypes import dtype_name
from .error_statistics import OutputStats, Tolerance, output_accumulators, passing_tolerance
from .errors import EXIT_ACCURACY, EXIT_OK, AccuracyGateError, BadInputError, one_line
from .inputs import (
    Sample,
    check_sample,
    default_samples,
    input_specs,
    load_inputs,
    random_inputs,
    resolve_shapes,
    size_candidates,
    tried_sizes,
)
from .runtime import create_session, provider_list


# --- the report -------------------------------------------------------------------------------------


@dataclass
class CompareReport:
    """What ``compare_models`` found: one ``OutputStats`` per output, the verdict and its exit code."""

    original: str
    optimized: str
    provider: str
    samples: int
    inputs: str  # "random (seed N)" or the path the samples came from
    input_shapes: dict[str, list[int]]
    outputs: list[OutputStats]
    seconds_original: float = 0.0
    seconds_optimized: float = 0.0

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.passed else EXIT_ACCURACY

    def failures(self) -> list[str]:
        """One line per problem, naming the output."""
        return [f"output '{o.name}': {p}" for o in self.outputs for p in o.problems]

    def summary(self) -> str:
        if self.passed:
            return f"all {len(self.outputs)} outputs within tolerance over {self.samples} sample(s)"
        bad = [o.name for o in self.outputs if not o.passed]
        return f"{len(bad)} of {len(self.outputs)} outputs outside tolerance: {'; '.join(self.failures())}"

    def passing_tolerance(self) -> Tolerance | None:
        """The --rtol/--atol under which every output would have passed on these samples (None where no
        tolerance would: ``error_statistics.passing_tolerance``)."""
        return passing_tolerance(self.outputs)

    def raise_if_failed(self) -> None:
        if not self.passed:
            raise AccuracyGateError(f"accuracy gate failed: {self.summary()}")

    def to_dict(self) -> dict:
        return {
            "original": self.original,
            "optimized": self.optimized,
            "provider": self.provider,
            "samples": self.samples,
            "inputs": self.inputs,
            "input_shapes": self.input_shapes,
            "seconds_original": self.seconds_original,
            "seconds_optimized": self.seconds_optimized,
            "passed": self.passed,
            "exit_code": self.exit_code,
            "outputs": [o.to_dict() for o in self.outputs],
        }


# --- running the models -----------------------------------------------------------------------------


@dataclass
class _Loaded:
    proto: onnx.ModelProto  # the graph (external weights not read: ORT reads them from ``source``)
    label: str
    source: str | bytes  # what ORT opens: the path (so external data resolves) or serialized bytes


def _load(model: str | Path | onnx.ModelProto, role: str) -> _Loaded:
    if isinstance(model, onnx.ModelProto):
        return _Loaded(model, f"<{role} model in memory>", model.SerializeToString())
    path = Path(model)
    from . import model_io
    from .runtime import load_probes

    try:  # every way a file can be bad (empty, truncated, a folder, an LFS pointer, external data), one line
        proto = model_io.load_model(path, **load_probes())
    except BadInputError as e:
        raise BadInputError(f"{role} model {e}") from None
    return _Loaded(proto, str(path), str(path))


def _uses_fused_op(model: onnx.ModelProto) -> bool:
    return any(op.domain == DOMAIN for op in model.opset_import) or any(n.domain == DOMAIN for n in model.graph.node)


def _session(model: _Loaded, role: str, provider: str, *, as_written: bool) -> ort.InferenceSession:
    """An ORT session on ``provider``. ``as_written``: the reference, with ORT's graph rewrites off.

    The op library is registered only for a model that uses the op: a plain model (nothing was fused, or
    two plain models are compared) runs as ORT runs it for a user, and opens where the library is not
    built. ORT's warnings are kept for the optimized model that uses the op, the one under test."""
    fused = _uses_fused_op(model.proto)
    return create_session(model.source, provider, with_library=fused, as_written=as_written,
                          quiet=as_written or not fused, label=f"the {role} model {model.label}")


def _ort_value(array: np.ndarray) -> ort.OrtValue:
    if array.dtype == np.dtype(ml_dtypes.bfloat16):
        # ORT's numpy bridge has no bfloat16: hand it the bits with the type spelled out.
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(np.ascontiguousarray(array).view(np.uint16), TensorProto.BFLOAT16)
    return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array))


def _to_numpy(value: ort.OrtValue) -> np.ndarray:
    if value.data_type() != "tensor(bfloat16)":
        return value.numpy()
    # ORT's numpy bridge has no bfloat16: copy the bits out of its CPU buffer.
    shape = tuple(value.shape())
    count = int(np.prod(shape, dtype=np.int64))
    if count == 0:
        return np.zeros(shape, dtype=ml_dtypes.bfloat16)
    buffer = (ctypes.c_uint16 * count).from_address(value.data_ptr())
    return np.frombuffer(buffer, dtype=np.uint16, count=count).copy().view(ml_dtypes.bfloat16).reshape(shape)


def run_session(session: ort.InferenceSession, sample: Sample, output_names: list[str],
                run_options: ort.RunOptions | None = None) -> dict[str, np.ndarray]:
    """Run one sample; outputs by name, as numpy arrays (bfloat16 through ml_dtypes)."""
    feeds = {name: _ort_value(array) for name, array in sample.items()}
    values = session.run_with_ort_values(output_names, feeds, run_options)
    return {name: _to_numpy(v) for name, v in zip(output_names, values)}


def _check_correspondence(original: onnx.ModelProto, optimized: onnx.ModelProto) -> None:
    """Both models must take the same inputs and give the same outputs (names, types, ranks)."""

    def describe(values) -> dict[str, tuple[int, int]]:
        return {
            v.name: (v.type.tensor_type.elem_type, len(v.type.tensor_type.shape.dim)) for v in values
        }

    orig_in = {s.name: (s.elem_type, len(s.shape)) for s in input_specs(original)}
    opt_in = {s.name: (s.elem_type, len(s.shape)) for s in input_specs(optimized)}
    for kind, a, b in (
        ("inputs", orig_in, opt_in),
        ("outputs", describe(original.graph.output), describe(optimized.graph.output)),
    ):
        only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
        if only_a or only_b:
            parts = []
            if only_a:
                parts.append(f"only the original has {', '.join(only_a)}")
            if only_b:
                parts.append(f"only the optimized has {', '.join(only_b)}")
            raise BadInputError(f"the models' {kind} do not correspond: {'; '.join(parts)}")
        for name in a:
            if a[name][0] != b[name][0]:
                raise BadInputError(
                    f"{kind[:-1]} '{name}' is {dtype_name(a[name][0])} in the original"
                    f" but {dtype_name(b[name][0])} in the optimized model"
                )
            if a[name][1] and b[name][1] and a[name][1] != b[name][1]:
                raise BadInputError(
                    f"{kind[:-1]} '{name}' has rank {a[name][1]} in the original but {b[name][1]} in the optimized model"
                )


def compare_models(
    original: str | Path | onnx.ModelProto,
    optimized: str | Path | onnx.ModelProto,
    *,
    provider: str = "cpu",
    samples: int | None = None,
    inputs: str | Path | list[Sample] | None = None,
    shapes: dict[str, tuple[int, ...]] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    seed: int = 0,
    progress: bool = True,
) -> CompareReport:
    """Run both models on the same inputs and measure how far the optimized one's outputs are from the
    original's.

    ``inputs``: a path (see ``onnxfuse.inputs.load_inputs``) or a list of samples; then every given sample
    is used and ``samples`` / ``shapes`` do not apply. Otherwise ``samples`` random samples are drawn (seeds
    ``seed``, ``seed+1``…) with dynamic dims from ``shapes`` or the defaults of ``onnxfuse.inputs``, attention
    masks whole in the first and padded on the right in the others; ``samples`` None is
    ``inputs.default_samples``: 2 where the model has a mask to pad, else 1. Raises ``BadInputError`` for
    unusable models or inputs; an accuracy failure is *not* raised but reported (``report.exit_code == 3``;
    ``report.raise_if_failed()`` turns it into ``AccuracyGateError``).
    """
    provider_list(provider)  # an unknown provider, or CUDA where it is not usable: one line before any work
    if samples is not None and samples < 1:
        raise BadInputError(f"samples must be at least 1, got {samples}")
    for name, value in (("rtol", rtol), ("atol", atol)):
        if value is not None and not (value >= 0 and np.isfinite(value)):
            raise BadInputError(f"--{name} must be a finite number ≥ 0, got {value}")

    original_loaded, optimized_loaded = _load(original, "original"), _load(optimized, "optimized")
    original_model, optimized_model = original_loaded.proto, optimized_loaded.proto
    _check_correspondence(original_model, optimized_model)

    specs = input_specs(original_model)
    if inputs is None:
        resolve_shapes(specs, shapes)  # reject bad --shape before any session starts
        feeds = None
        source = f"random (seed {seed})"
        count = default_samples(original_model) if samples is None else samples
    else:
        if isinstance(inputs, (str, Path)):
            feeds = load_inputs(inputs, original_model)
            source = str(inputs)
        else:
            feeds = [check_sample(s, specs, source=f"sample {i}") for i, s in enumerate(inputs)]
            source = "given samples"
        if not feeds:
            raise BadInputError("no input samples given")
        count = len(feeds)

    ref_session = _session(original_loaded, "original", provider, as_written=True)
    opt_session = _session(optimized_loaded, "optimized", provider, as_written=False)

    output_names = [o.name for o in original_model.graph.output]
    accumulators = output_accumulators(original_model, provider, rtol, atol)

    seconds_ref = seconds_opt = 0.0
    first_ref = None  # the original's outputs on sample 0, from finding the sizes it runs at
    user_shapes = bool(shapes)
    if feeds is None:
        shapes, first_ref, seconds_ref, chosen = _runnable_sizes(ref_session, original_model, specs, shapes,
                                                                 output_names, seed)
        if chosen:
            source += f"; dynamic sizes {chosen}"

    input_shapes: dict[str, list[int]] = {}
    with _progress(progress and count > 1, count) as advance:
        for i in range(count):
            # samples after the first pad their attention masks (inputs.py): the rewritten attentions must
            # honour them as the original does
            sample = feeds[i] if feeds is not None else random_inputs(original_model, shapes, seed=seed + i,
                                                                      padded=i > 0)
            if i == 0:
                input_shapes = {k: list(v.shape) for k, v in sample.items()}
            t0 = time.perf_counter()
            try:
                ref = first_ref if i == 0 and first_ref is not None else run_session(ref_session, sample, output_names)
            except Exception as e:
                shapes_text = ", ".join(f"{k}{list(v.shape)}" for k, v in sample.items())
                # the user's own --shape values are the first suspect; without any, the defaults (128 tokens)
                hint = "" if feeds is not None else (
                    "; check the --shape values" if user_shapes else "; give dynamic dims with --shape")
                raise BadInputError(
                    f"the original model cannot run on sample {i} ({shapes_text}{hint}): {one_line(e)}"
                ) from e
            t1 = time.perf_counter()
            try:
                opt = run_session(opt_session, sample, output_names)
            except Exception as e:
                # The original accepted these inputs: an optimized model that does not is not equivalent.
                raise AccuracyGateError(f"the optimized model fails on sample {i}, which the original runs: {one_line(e)}") from e
            t2 = time.perf_counter()
            seconds_ref += t1 - t0
            seconds_opt += t2 - t1
            for name in output_names:
                accumulators[name].add(i, ref[name], opt[name])
            advance()

    return CompareReport(
        original=original_loaded.label,
        optimized=optimized_loaded.label,
        provider=provider,
        samples=count,
        inputs=source,
        input_shapes=input_shapes,
        outputs=[accumulators[n].finish() for n in output_names],
        seconds_original=seconds_ref,
        seconds_optimized=seconds_opt,
    )


def _runnable_sizes(session, model: onnx.ModelProto, specs, shapes, output_names: list[str], seed: int):
    """The dynamic sizes to draw random samples at: the defaults, or the largest halving of the defaulted
    non-batch dims the original model runs at (``inputs.size_candidates``). Returns (every input's shape,
    the original's outputs on sample 0 at those shapes and the seconds that run took, the sizes said to
    the user when they are not the defaults or None). Raises ``BadInputError`` naming the ``--shape`` to
    give when the model runs at none."""
    candidates = size_candidates(specs, shapes, model)
    quiet = ort.RunOptions()
    quiet.log_severity_level = 4  # a size the model does not run is an answer here, not an error to log
    first_error = None
    for k, (candidate, label) in enumerate(candidates):
        sample = random_inputs(model, candidate, seed=seed)
        t0 = time.perf_counter()
        try:
            ref = run_session(session, sample, output_names, quiet)
        except Exception as e:  # noqa: BLE001 - any failure at these sizes: try the next ones
            first_error = first_error or one_line(e)
            continue
        seconds = time.perf_counter() - t0
        chosen = None if k == 0 else f"{label} (chosen: the model does not run at {candidates[0][1]})"
        return candidate, ref, seconds, chosen
    default = random_inputs(model, candidates[0][0], seed=seed)
    shapes_text = ", ".join(f"{k}{list(v.shape)}" for k, v in default.items())
    if len(candidates) == 1:
        # the user's own --shape values are the first suspect; without any, the defaults
        hint = "check the --shape values" if shapes else "give dynamic dims with --shape"
        raise BadInputError(f"the original model cannot run on sample 0 ({shapes_text}; {hint}): {first_error}")
    dynamic = "; ".join(s.describe() for s in specs if any(not isinstance(d, int) for d in s.shape))
    raise BadInputError(
        f"the original model cannot run on sample 0 ({shapes_text}, nor with {tried_sizes(candidates)}; give dynamic "
        f"dims with --shape NAME=DIMS, inputs {dynamic}): {first_error}")


def verify_optimized(original_path: str | Path, optimized_path: str | Path, published_as: str | Path | None = None,
                     **kw) -> CompareReport:
    """The gate behind ``onnxfuse optimize --verify``: compare the file just written against its source.
    The gate runs on a temporary file that takes OUT's place only if it passes; ``published_as`` (OUT) is the
    name the report gives it, the file the user gets. Keyword arguments are those of ``compare_models``; the
    caller acts on ``report.exit_code``."""
    report = compare_models(Path(original_path), Path(optimized_path), **kw)
    if published_as is not None:
        report.optimized = str(published_as)
    return report


class _progress:
    """A rich progress bar on stderr while samples run (when asked, with more than one sample, and stderr
    is a terminal)."""

    def __init__(self, enabled: bool, total: int):
        self.enabled, self.total = enabled, total
        self._bar = None

    def __enter__(self):
        if not self.enabled:
            return lambda: None
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        console = Console(stderr=True)
        if not console.is_terminal:  # into a pipe or a CI log a bar is noise (and rich leaves a blank line)
            return lambda: None
        self._bar = Progress(
            TextColumn("comparing"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
            console=console, transient=True,
        )
        self._bar.__enter__()
        task = self._bar.add_task("samples", total=self.total)
        return lambda: self._bar.advance(task)

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.__exit__(*exc)
        return False
