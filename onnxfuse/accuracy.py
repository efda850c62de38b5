"""A candidate model's error against a reference model on the same inputs, as one number a choice can be held
to: what ``tune --approximate auto`` checks each set of switched GELU forms with.

The error of a candidate is the largest, over the model's outputs, of the output's rel-L2 error
(``compare``'s ``rel_l2``: ‖candidate − reference‖₂ / ‖reference‖₂ over every sample's finite elements).
It is ∞, over any budget, where the candidate gives what no relative error measures: another shape, a
NaN/Inf the reference does not have (or misses one it has), or any change in an integer or bool output
(token ids, an argmax: a relative budget does not cover a different answer).

:func:`model_error` turns ``compare``'s statistics into that number (pure); :class:`ReferenceRun` runs the
models. Both run as deployed (``runtime.create_session``: the op library registered, ORT's graph
optimizations on, the same provider): unlike ``compare``, whose reference runs as written, the error
measured is then the candidate's own change and not ORT's rewrites, which the reference and the candidate
share. The reference runs once per sample; each candidate runs in a session of its own, closed after.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import onnx
import onnxruntime as ort

from . import model_io
from .compare import run_session
from .error_statistics import OutputStats, output_errors
from .errors import AccuracyGateError, one_line
from .inputs import Sample, random_inputs
from .runtime import create_session

METRIC = "max over outputs of rel-L2 (‖candidate − reference‖₂ / ‖reference‖₂ over every sample)"
_FLOAT_TYPES = {"float16", "bfloat16", "float32", "float64"}


@dataclass(frozen=True)
class ModelError:
    """A candidate's error: the largest output error, each output's, and why an output's is ∞."""

    error: float
    outputs: dict[str, float]
    problems: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict:
        return {"error": _number(self.error), "outputs": {k: _number(v) for k, v in self.outputs.items()},
                **({"problems": list(self.problems)} if self.problems else {})}


def _number(value: float) -> float | str:
    """JSON has no infinity: ∞ is written as the string "inf"."""
    return "inf" if math.isinf(value) else value


def model_error(stats: Sequence[OutputStats]) -> ModelError:
    """The error of a candidate from ``compare``'s statistics of each output (see the module docstring)."""
    outputs, problems = {}, []
    for o in stats:
        error = o.rel_l2
        if o.nonfinite_mismatches:
            error = math.inf
            problems.append(f"output '{o.name}': {o.nonfinite_mismatches} NaN/Inf positions differ")
        elif (o.compute_dtype or o.dtype) not in _FLOAT_TYPES and o.max_abs > 0:
            error = math.inf
            problems.append(f"output '{o.name}' ({o.dtype}) changed (max abs difference {o.max_abs:g})")
        outputs[o.name] = error
    return ModelError(max(outputs.values(), default=0.0), outputs, tuple(problems))


def _session_options(model: onnx.ModelProto, base_dir: str | None) -> ort.SessionOptions:
    """Options that let a model handed over as bytes find its external data in ``base_dir``."""
    so = ort.SessionOptions()
    if base_dir is not None and model_io.external_tensors(model):
        so.add_session_config_entry("session.model_external_initializers_file_folder_path", base_dir)
    return so


class ReferenceRun:
    """The reference model's outputs on ``samples`` random samples at ``shapes`` (seeds 0, 1, …: the
    inputs ``compare`` draws), and the error of each candidate against them (:meth:`error_of`)."""

    def __init__(self, reference: onnx.ModelProto, *, shapes: dict[str, tuple[int, ...]], samples: int,
                 provider: str = "cuda", base_dir: str | None = None):
        self.reference, self.provider, self.base_dir = reference, provider, base_dir
        self.output_names = [o.name for o in reference.graph.output]
        self.samples: list[Sample] = [random_inputs(reference, shapes, seed=i) for i in range(samples)]
        session = self._session(reference, "the model to tune")
        self.outputs = [run_session(session, sample, self.output_names) for sample in self.samples]

    def _session(self, model: onnx.ModelProto, label: str) -> ort.InferenceSession:
        return create_session(model, self.provider, _session_options(model, self.base_dir), quiet=True, label=label)

    def error_of(self, candidate: onnx.ModelProto) -> ModelError:
        """Run ``candidate`` on the reference's samples; its error. A candidate that fails where the
        reference ran is no candidate: ``AccuracyGateError``."""
        session = self._session(candidate, "the candidate model")
        outputs = []
        for i, sample in enumerate(self.samples):
            try:
                outputs.append(run_session(session, sample, self.output_names))
            except Exception as e:
                raise AccuracyGateError(f"the candidate model fails on sample {i}, which the model to tune runs: "
                                        f"{one_line(e)}") from e
        del session
        shapes = [f"output '{name}': shape {list(got[name].shape)}, the reference gives {list(ref[name].shape)}"
                  for ref, got in zip(self.outputs, outputs) for name in self.output_names
                  if np.shape(ref[name]) != np.shape(got[name])]
        if shapes:
            return ModelError(math.inf, {name: math.inf for name in self.output_names}, tuple(dict.fromkeys(shapes)))
        return model_error(output_errors(self.reference, self.outputs, outputs, self.provider))


ErrorChecker = Callable[[onnx.ModelProto], ModelError]


def reference_checker(reference: onnx.ModelProto, *, shapes: dict[str, tuple[int, ...]], samples: int,
                      base_dir: str | None = None, provider: str = "cuda") -> ErrorChecker:
    """The error-of-a-candidate callable ``tune`` uses by default: a :class:`ReferenceRun` on ``provider``."""
    return ReferenceRun(reference, shapes=shapes, samples=samples, provider=provider, base_dir=base_dir).error_of
