"""The accuracy gate's measures: per output, how far an optimized model's values are from the original's,
and the tolerance that judges them (``compare`` runs the models; ``accuracy`` runs tune's candidates).

Per output, over every sample, errors are measured in float64 on the positions where both models give a
finite value:

* ``max_abs``, ``mean_abs``, ``p50_abs``, ``p99_abs``, ``p999_abs``: absolute error |opt − ref|;
* ``max_rel``: |opt − ref| / |ref| where |ref| > atol (below atol a relative error says nothing, and the
  absolute tolerance is what judges those elements);
* ``cosine``: cosine similarity of the flattened outputs, the smallest over all samples;
* ``rel_l2``: ‖opt − ref‖₂ / ‖ref‖₂ over every sample's finite positions, the error of the output as a
  whole (scale-free: what ``tune --approximate auto`` holds to its budget);
* ``nonfinite_mismatches``: positions where one model gives NaN or ±Inf and the other does not give the
  same (NaN where the reference has NaN, the same infinity where it has one, is a match);
* ``violations``: elements with |opt − ref| > atol + rtol·|ref|, and ``worst_ratio``, the largest
  |opt − ref| / (atol + rtol·|ref|) (≤ 1 everywhere means within tolerance).

An output passes when it has the same shape as the reference in every sample, no violation and no NaN/Inf
mismatch.

Default tolerances, by the type an output is computed in (``compute_type``: its own type, or a narrower
float type it passes through, as in a float16 model with float32 inputs/outputs); ``--rtol`` / ``--atol``
override them for every floating output:

==================  ======  ======  ==================================================================
type                 rtol    atol   why
==================  ======  ======  ==================================================================
float32 (CPU)        1e-4    1e-4   another fp32 summation order, carried through the layers
float32 (CUDA)       5e-3    5e-3   ORT's CUDA MatMul and the fused kernel use TF32 Tensor Cores
                                    (10-bit mantissa: ~5e-4 relative per product)
float16              1e-2    1e-2   fp16 ε is 9.8e-4; the fused op rounds once less than ORT, a few
                                    ulps move through layers
bfloat16             5e-2    5e-2   bf16 ε is 7.8e-3
float64              1e-7    1e-7
integers, bool       0       0      exact: an optimizer must not change them
==================  ======  ======  ==================================================================
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto

from .dtypes import dtype_name


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float


DEFAULT_TOLERANCES: dict[str, Tolerance] = {
    "float32": Tolerance(rtol=1e-4, atol=1e-4),
    "float32/cuda": Tolerance(rtol=5e-3, atol=5e-3),
    "float16": Tolerance(rtol=1e-2, atol=1e-2),
    "bfloat16": Tolerance(rtol=5e-2, atol=5e-2),
    "float64": Tolerance(rtol=1e-7, atol=1e-7),
}
EXACT = Tolerance(rtol=0.0, atol=0.0)


def tolerance_for(elem_type: int, provider: str = "cpu", rtol: float | None = None, atol: float | None = None) -> Tolerance:
    """The tolerance an output of ``elem_type`` is judged by: the documented default for its type (and
    provider, for float32), with ``rtol`` / ``atol`` overriding it for floating types."""
    name = dtype_name(elem_type)
    if name not in DEFAULT_TOLERANCES:
        return EXACT  # integers and bools: an optimizer must not change them at all
    key = f"{name}/{provider}" if f"{name}/{provider}" in DEFAULT_TOLERANCES else name
    default = DEFAULT_TOLERANCES[key]
    return Tolerance(rtol=default.rtol if rtol is None else rtol, atol=default.atol if atol is None else atol)


# Float types from the loosest default tolerance to the tightest.
_FLOAT_TYPES_LOOSEST_FIRST = (TensorProto.BFLOAT16, TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE)


def compute_type(model: onnx.ModelProto, output: str) -> int:
    """The narrowest float type ``output`` is computed in: the output's own type, or a narrower one met on
    the way from the graph inputs (initializers, Cast targets, Constants, inputs). ORT's float16 converter
    keeps float32 inputs/outputs around a float16 body (``keep_io_types``): such an output is float32 but
    carries float16 error, and is judged by the float16 tolerance."""
    graph = model.graph
    declared = {o.name: o.type.tensor_type.elem_type for o in graph.output}
    own = declared.get(output, TensorProto.FLOAT)
    if own not in _FLOAT_TYPES_LOOSEST_FIRST:
        return own  # integers and bools stay exact whatever was computed on the way
    producer = {name: node for node in graph.node for name in node.output}
    known = {t.name: t.data_type for t in graph.initializer}
    known.update({i.name: i.type.tensor_type.elem_type for i in graph.input})
    seen_types, stack, visited = {own}, [output], set()
    while stack:
        name = stack.pop()
        if name in visited or not name:
            continue
        visited.add(name)
        if name in known:
            seen_types.add(known[name])
            continue
        node = producer.get(name)
        if node is None:
            continue
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to":
                seen_types.add(attr.i)
            elif node.op_type == "Constant" and attr.name == "value":
                seen_types.add(attr.t.data_type)
        stack.extend(node.input)
    return next(t for t in _FLOAT_TYPES_LOOSEST_FIRST if t in seen_types)


# --- per-output statistics ---------------------------------------------------------------------------


@dataclass
class OutputStats:
    """Error statistics of one output over all samples, and its verdict."""

    name: str
    dtype: str
    shape: list[int]
    tolerance: Tolerance
    compute_dtype: str = ""  # the type whose tolerance applies (see compute_type); "" = same as dtype
    elements: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    mean_abs: float = 0.0
    p50_abs: float = 0.0
    p99_abs: float = 0.0
    p999_abs: float = 0.0
    cosine: float = 1.0
    rel_l2: float = 0.0
    nonfinite_mismatches: int = 0
    violations: int = 0
    worst_ratio: float = 0.0
    max_abs_ref: float = 0.0
    problems: list[str] = field(default_factory=list)
    # every finite absolute error, kept for the histogram (not serialized)
    abs_errors: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)

    @property
    def passed(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "compute_dtype": self.compute_dtype or self.dtype,
            "shape": self.shape,
            "elements": self.elements,
            "max_abs": self.max_abs,
            "max_rel": self.max_rel,
            "mean_abs": self.mean_abs,
            "p50_abs": self.p50_abs,
            "p99_abs": self.p99_abs,
            "p999_abs": self.p999_abs,
            "cosine": self.cosine,
            "rel_l2": self.rel_l2,
            "nonfinite_mismatches": self.nonfinite_mismatches,
            "violations": self.violations,
            "worst_ratio": self.worst_ratio,
            "rtol": self.tolerance.rtol,
            "atol": self.tolerance.atol,
            "passed": self.passed,
            "problems": self.problems,
        }


class _ErrorAccumulator:
    """Collects one output's errors sample by sample; ``finish`` turns them into ``OutputStats``."""

    def __init__(self, name: str, dtype: str, tolerance: Tolerance, compute_dtype: str = ""):
        self.name, self.dtype, self.tol, self.compute_dtype = name, dtype, tolerance, compute_dtype
        self.shape: list[int] | None = None
        self.errors: list[np.ndarray] = []
        self.max_rel = 0.0
        self.cosine = 1.0
        self.squared_error = 0.0  # Σ (opt − ref)² and Σ ref² over the finite positions, for rel_l2
        self.squared_ref = 0.0
        self.nonfinite = 0
        self.violations = 0
        self.worst_ratio = 0.0
        self.max_abs_ref = 0.0
        self.elements = 0
        self.shape_problems: list[str] = []

    def add(self, sample_index: int, ref: np.ndarray, opt: np.ndarray) -> None:
        if self.shape is None:
            self.shape = list(ref.shape)
        if ref.shape != opt.shape:
            self.shape_problems.append(
                f"sample {sample_index}: shape {list(opt.shape)}, the original gives {list(ref.shape)}"
            )
            return
        ref64 = _as_float64(ref)
        opt64 = _as_float64(opt)
        self.elements += ref64.size
        finite = np.isfinite(ref64) & np.isfinite(opt64)
        # same NaN, or the same infinity, is agreement; anything else non-finite on either side is not
        agree = (np.isnan(ref64) & np.isnan(opt64)) | (ref64 == opt64)
        self.nonfinite += int(np.count_nonzero(~finite & ~agree))

        r, o = ref64[finite], opt64[finite]
        err = np.abs(o - r)
        self.errors.append(err)
        if r.size == 0:
            return
        self.squared_error += float(np.dot(err, err))
        self.squared_ref += float(np.dot(r, r))
        abs_ref = np.abs(r)
        self.max_abs_ref = max(self.max_abs_ref, float(abs_ref.max()))
        bound = self.tol.atol + self.tol.rtol * abs_ref
        over = err > bound
        self.violations += int(np.count_nonzero(over))
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(bound > 0, err / np.where(bound > 0, bound, 1.0), np.where(err > 0, np.inf, 0.0))
        self.worst_ratio = max(self.worst_ratio, float(ratio.max()))
        meaningful = abs_ref > max(self.tol.atol, np.finfo(np.float64).tiny)
        if np.any(meaningful):
            self.max_rel = max(self.max_rel, float((err[meaningful] / abs_ref[meaningful]).max()))
        self.cosine = min(self.cosine, _cosine(r, o))

    def finish(self) -> OutputStats:
        errors = np.concatenate(self.errors) if self.errors else np.zeros(0)
        stats = OutputStats(
            name=self.name,
            dtype=self.dtype,
            shape=self.shape or [],
            tolerance=self.tol,
            compute_dtype=self.compute_dtype if self.compute_dtype != self.dtype else "",
            elements=self.elements,
            max_rel=self.max_rel,
            cosine=self.cosine,
            rel_l2=_rel_l2(self.squared_error, self.squared_ref),
            nonfinite_mismatches=self.nonfinite,
            violations=self.violations,
            worst_ratio=self.worst_ratio,
            max_abs_ref=self.max_abs_ref,
            abs_errors=errors,
        )
        if errors.size:
            stats.max_abs = float(errors.max())
            stats.mean_abs = float(errors.mean())
            stats.p50_abs, stats.p99_abs, stats.p999_abs = (float(q) for q in np.quantile(errors, [0.5, 0.99, 0.999]))
        stats.problems.extend(self.shape_problems)
        if self.violations:
            worst = (f"worst {self.worst_ratio:.3g}× the tolerance" if np.isfinite(self.worst_ratio)
                     else "a zero tolerance: every element must match exactly")
            stats.problems.append(
                f"{self.violations} of {self.elements} elements outside atol + rtol·|ref| "
                f"(atol={self.tol.atol:g}, rtol={self.tol.rtol:g}; {worst}, max abs error {stats.max_abs:.3g})"
            )
        if self.nonfinite:
            stats.problems.append(f"{self.nonfinite} NaN/Inf positions differ from the original")
        return stats


def _as_float64(a: np.ndarray) -> np.ndarray:
    if a.dtype == np.bool_:
        return a.astype(np.float64)
    return np.asarray(a, dtype=np.float64)


def _rel_l2(squared_error: float, squared_ref: float) -> float:
    """‖err‖₂ / ‖ref‖₂: 0 where nothing differs, ∞ where a zero reference meets a nonzero error."""
    if squared_error == 0.0:
        return 0.0
    return float(np.sqrt(squared_error / squared_ref)) if squared_ref > 0.0 else float("inf")


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 and nb == 0.0:
        return 1.0
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(np.dot(a, b) / (na * nb))


_FLOAT_NAMES = {key.split("/")[0] for key in DEFAULT_TOLERANCES}  # the types --rtol/--atol apply to


def passing_tolerance(outputs: Sequence[OutputStats]) -> Tolerance | None:
    """The one --rtol/--atol pair (the options set it for every floating output) under which each of
    ``outputs`` would have passed on the same samples, from the errors measured: each output's tolerance
    scaled by its worst ratio (then every element's error is within it), the largest over the outputs, with a
    1 % margin, rounded up to two significant digits; an output judged at a zero tolerance needs an atol of its
    largest error. None where no tolerance passes: an integer or bool output that differs, NaN/Inf that
    differ, a shape that does not match."""
    rtol = atol = 0.0
    for o in outputs:
        if o.nonfinite_mismatches or len(o.problems) > bool(o.violations):
            return None  # NaN/Inf, or a shape (a problem beside the violations'): no tolerance covers them
        if o.dtype not in _FLOAT_NAMES:
            if o.violations:
                return None  # integers and bools are judged exactly whatever --rtol/--atol say
            continue
        if math.isfinite(o.worst_ratio):
            rtol, atol = max(rtol, o.tolerance.rtol * o.worst_ratio), max(atol, o.tolerance.atol * o.worst_ratio)
        else:
            atol = max(atol, o.max_abs)
    return Tolerance(rtol=_round_up(rtol * 1.01), atol=_round_up(atol * 1.01))


def _round_up(value: float) -> float:
    """``value`` rounded up to two significant digits (0 stays 0)."""
    if value <= 0:
        return 0.0
    step = 10.0 ** (math.floor(math.log10(value)) - 1)
    return float(f"{math.ceil(value / step) * step:.2g}")


def output_accumulators(model: onnx.ModelProto, provider: str, rtol: float | None = None,
                  atol: float | None = None) -> dict[str, _ErrorAccumulator]:
    """One accumulator per output of ``model`` (the reference), judged by the tolerance of its compute type."""
    types = {o.name: o.type.tensor_type.elem_type for o in model.graph.output}
    return {name: _ErrorAccumulator(name, dtype_name(elem_type), tolerance_for(compute_type(model, name), provider, rtol, atol),
                                    dtype_name(compute_type(model, name)))
            for name, elem_type in types.items()}


def output_errors(reference_model: onnx.ModelProto, references: list[dict[str, np.ndarray]],
                  candidates: list[dict[str, np.ndarray]], provider: str = "cpu") -> list[OutputStats]:
    """compare's statistics and verdict of each output of ``reference_model`` over paired samples (the
    reference's outputs and a candidate's, by output name, sample by sample), at the default tolerances of
    ``provider``: what ``compare_models`` reports, for a caller that runs the sessions itself (tune's
    accuracy check runs the reference once and several candidates against it)."""
    if len(references) != len(candidates):
        raise ValueError(f"{len(references)} reference samples but {len(candidates)} candidate samples")
    accumulators = output_accumulators(reference_model, provider)
    for i, (ref, opt) in enumerate(zip(references, candidates)):
        for name, accumulator in accumulators.items():
            accumulator.add(i, ref[name], opt[name])
    return [a.finish() for a in accumulators.values()]
