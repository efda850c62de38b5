"""``tune --approximate auto``: which FusedLinearGelu nodes to switch from exact (erf) GELU to an approximate
form, from the times measured on the GPU and the model's error measured against the exact model.

The steps, each a pure function of measurements (``tune.py`` measures; tests inject numbers):

1. :func:`variants`: the nodes that may switch (those computing exact GELU: a node whose model already
   computes an approximation keeps the model's own math, there being no exact reference to hold it to), in
   each form asked for, to be timed like the exact nodes (``measure.path_bench`` times any form);
2. :func:`node_forms`: per node, the forms that pay. A form pays where its fastest CUDA path is at least
   ``MIN_GAIN`` (2 %) faster than the exact form's fastest path at the node's largest row count, and not more
   than ``MIN_GAIN`` slower at any other row count measured. 2 % is twice the timing loop's own stability
   bound (``TimingPolicy.rel_tol``: the two halves of the runs agree within 1 % before a median is taken):
   a difference below it is not told apart from noise. A form that is less accurate and not faster than a
   more accurate one that pays (sigmoid behind tanh) is dropped;
3. :func:`choose_forms`: every node at its fastest form that pays, then the model's error is checked (an
   error oracle: ``accuracy.ReferenceRun`` on the GPU); while it is over the budget, the one step back
   (a node to its next more accurate form that pays, or to exact) that gives up the least time is taken
   and the error checked again. The error of a set of switched nodes is not the sum of each one's (the
   layers' errors mix), and measuring each node alone would cost a model run per node before the first
   answer: the greedy walk checks each set it would keep, and keeps only a set it has checked;
4. :func:`with_forms` writes the choice into the nodes' ``approximate`` attribute and
   :func:`approximation_record` into the tuning record; :func:`restore_forms` undoes an earlier tune's
   choice, so that tuning a tuned model starts from the model's own math (tuning is idempotent, and plain
   ``tune`` gives back the exact forms: exact is the default).

Forms: ``tanh`` (GELU's tanh approximation, within 4.8e-4 of erf GELU everywhere — what GPT-2's and the
original BERT code compute) is the default; ``sigmoid`` (x·σ(1.702x), QuickGELU, up to 2.0e-2 away: forty
times coarser) only when asked for (``--approximate-forms tanh,sigmoid``), as it changes the model's activations
visibly and the budget alone should not be what lets it in unasked.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import onnx
from onnx import helper

from .accuracy import METRIC, ModelError
from .domain import DEFAULT_SIGMOID_ALPHA
from .errors import BadInputError
from .tuning import NodeShape, NodeTuning, PathTimes, TunableNode, is_fused, node_key, read_record, string_attr

EXACT = "none"  # the ``approximate`` value of exact erf GELU
FORMS = ("tanh", "sigmoid")  # the approximate forms, from the most accurate to the least
DEFAULT_FORMS = ("tanh",)
MIN_GAIN = 0.02


def parse_forms(text: str) -> tuple[str, ...]:
    """``--approximate-forms tanh,sigmoid`` → the forms, in accuracy order; ``BadInputError`` for others."""
    asked = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [f for f in asked if f not in FORMS]
    if not asked or unknown:
        raise BadInputError(f"--approximate-forms {text!r}: expected {' and/or '.join(FORMS)} separated by commas"
                            + (f" (not {', '.join(unknown)})" if unknown else ""))
    return tuple(f for f in FORMS if f in asked)


def form_shape(shape: NodeShape, form: str) -> NodeShape:
    """The NodeShape of the same node computing ``form``."""
    return dataclasses.replace(shape, approximate=form, alpha=DEFAULT_SIGMOID_ALPHA if form == "sigmoid" else None)


def variants(nodes: Sequence[TunableNode], forms: Sequence[str]) -> dict[str, list[TunableNode]]:
    """Per form, the nodes that may switch (exact GELU), in that form: what is timed besides the nodes."""
    return {form: [dataclasses.replace(n, shape=form_shape(n.shape, form)) for n in nodes if n.shape.approximate == EXACT]
            for form in forms}


def best_us(times: PathTimes) -> float:
    """The time of the path the node takes at this M (the fastest that ran there, gemv included)."""
    return times.best_us


# --- what pays, per node -------------------------------------------------------------------------------
@dataclass(frozen=True)
class FormOption:
    """A form that pays for a node: the time it saves per call at the node's largest row count."""

    form: str
    gain_us: float
    gain: float  # gain_us over the exact form's time

    def to_dict(self) -> dict:
        return {"form": self.form, "gain_us": round(self.gain_us, 3), "gain": round(self.gain, 4)}


@dataclass(frozen=True)
class NodeForms:
    """One node's forms: its model's form, the best time per form and M, the forms that pay (most accurate
    first: a back-off steps towards the front) and why each other form does not."""

    name: str
    model_form: str
    largest_m: int
    best: dict[str, dict[int, float]]  # form -> M -> µs of its fastest path
    options: tuple[FormOption, ...] = ()
    rejected: dict[str, str] = field(default_factory=dict)


def node_forms(exact: NodeTuning, forms: dict[str, NodeTuning], min_gain: float = MIN_GAIN) -> NodeForms:
    """The forms that pay for ``exact``'s node, from its exact tuning and one tuning per approximate form
    (the same rows; see the module docstring for the rule)."""
    name, model_form = exact.node.name, exact.node.shape.approximate
    largest = max(exact.times)
    best = {model_form: {m: best_us(t) for m, t in sorted(exact.times.items())}}
    if model_form != EXACT:
        return NodeForms(name, model_form, largest, best,
                         rejected={"*": f"computes {model_form} in the model: only exact GELU nodes are switched"})
    options, rejected = [], {}
    for form in (f for f in FORMS if f in forms):
        best[form] = {m: best_us(t) for m, t in sorted(forms[form].times.items())}
        base, now = best[EXACT][largest], best[form][largest]
        gain = 1.0 - now / base
        slower = [(m, best[form][m] / best[EXACT][m] - 1.0) for m in best[EXACT]
                  if best[form][m] > best[EXACT][m] * (1.0 + min_gain)]
        if gain < min_gain:
            rejected[form] = f"{gain:+.1%} at M={largest}, under the {min_gain:.0%} a change must clear"
        elif slower:
            m, by = slower[0]
            rejected[form] = f"{by:.1%} slower at M={m}"
        elif options and base - now <= options[-1].gain_us:
            rejected[form] = f"less accurate than {options[-1].form} and not faster"
        else:
            options.append(FormOption(form, base - now, gain))
    return NodeForms(name, model_form, largest, best, tuple(options), rejected)


# --- choosing within the budget ------------------------------------------------------------------------
@dataclass(frozen=True)
class Check:
    """One error check: the set it checked (after the step back that made it, if any) and its error."""

    switched: int  # nodes at an approximate form
    step: tuple[str, str] | None  # (node, the form it stepped back to) before this check
    error: ModelError
    within_budget: bool

    def to_dict(self) -> dict:
        step = None if self.step is None else {"node": self.step[0], "to": self.step[1]}
        return {"switched": self.switched, "step_back": step, **self.error.to_dict(),
                "within_budget": self.within_budget}


@dataclass
class FormChoice:
    """The forms chosen (switched nodes only), the measured error of that set (None: nothing switched,
    nothing to measure) and every check on the way."""

    forms: dict[str, str]
    error: ModelError | None
    checks: list[Check]
    budget: float


def choose_forms(nodes: Sequence[NodeForms], error_of: Callable[[dict[str, str]], ModelError],
                 budget: float) -> FormChoice:
    """The fastest forms whose model error ``error_of(forms)`` (node → form, the switched nodes) stays within
    ``budget``, backing off greedily (module docstring). Equal times given up are common (nodes of one shape
    share their measurements); the tie goes first to the step away from the coarser form (sigmoid → tanh
    before tanh → exact: the coarser form brings the most error), then to the earlier node (its error
    passes through every layer after it), so the walk is deterministic."""
    if not budget > 0 or math.isinf(budget):
        raise ValueError(f"budget must be a finite number > 0, not {budget!r}")
    level = {n.name: len(n.options) - 1 for n in nodes if n.options}  # index into options; -1: exact
    by_name = {n.name: n for n in nodes}
    order = {n.name: i for i, n in enumerate(nodes)}
    checks: list[Check] = []
    step = None
    while True:
        forms = {name: by_name[name].options[i].form for name, i in level.items() if i >= 0}
        if not forms:
            return FormChoice({}, None, checks, budget)
        error = error_of(dict(forms))
        ok = error.error <= budget
        checks.append(Check(len(forms), step, error, ok))
        if ok:
            return FormChoice(forms, error, checks, budget)

        def given_up(name: str) -> tuple[float, int, int]:
            options, i = by_name[name].options, level[name]
            time = options[i].gain_us - (options[i - 1].gain_us if i > 0 else 0.0)
            return time, -FORMS.index(options[i].form), order[name]

        name = min(forms, key=given_up)
        level[name] -= 1
        step = (name, by_name[name].options[level[name]].form if level[name] >= 0 else EXACT)


# --- the model -----------------------------------------------------------------------------------------
def _set_string(node: onnx.NodeProto, name: str, value: str) -> None:
    for a in node.attribute:
        if a.name == name:
            a.s = value.encode()
            return
    node.attribute.append(helper.make_attribute(name, value))


def _set_form(node: onnx.NodeProto, form: str) -> None:
    """``form`` into the node's ``approximate`` (in place where it has one); ``alpha`` only for sigmoid."""
    _set_string(node, "approximate", form)
    alpha = [j for j, a in enumerate(node.attribute) if a.name == "alpha"]
    for j in reversed(alpha):
        del node.attribute[j]
    if form == "sigmoid":
        node.attribute.append(helper.make_attribute("alpha", DEFAULT_SIGMOID_ALPHA))


def with_forms(model: onnx.ModelProto, forms: dict[str, str]) -> onnx.ModelProto:
    """A copy of ``model`` whose main-graph FusedLinearGelu nodes named in ``forms`` compute that form."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for i, node in enumerate(out.graph.node):
        form = forms.get(node_key(node, i)) if is_fused(node) else None
        if form is not None:
            _set_form(node, form)
    return out


def restore_forms(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str], list[str]]:
    """``model`` with each node an earlier ``tune --approximate auto`` switched (its tuning record says so)
    back at its model's form: (that model, the nodes restored, a warning per node that no longer computes
    what the record says tune chose, left as it is). An exact node carries no ``alpha``, so the sigmoid's
    is dropped."""
    record, _ = read_record(model)
    approximation = record.get("approximation") if isinstance(record, dict) else None
    recorded = approximation.get("nodes") if isinstance(approximation, dict) else None
    if not isinstance(recorded, dict):
        return model, [], []
    out = onnx.ModelProto()
    out.CopyFrom(model)
    restored, warnings = [], []
    for i, node in enumerate(out.graph.node):
        name = node_key(node, i)
        entry = recorded.get(name) if is_fused(node) else None
        if not isinstance(entry, dict) or entry.get("chosen") in (None, entry.get("model")):
            continue
        now = string_attr(node, "approximate", EXACT)
        if now != entry["chosen"] or entry.get("model") != EXACT:
            warnings.append(f"node {name}: the tuning record says tune switched it to {entry['chosen']}, but it "
                            f"computes {now}: left as it is")
            continue
        _set_form(node, EXACT)
        restored.append(name)
    return out, restored, warnings


def approximation_record(nodes: Sequence[NodeForms], choice: FormChoice, settings: dict) -> dict:
    """The tuning record's "approximation": how it was asked (budget, forms, samples, the metric and the
    margin), the model's measured error, each check, and per node its forms' times and the choice."""
    return {
        **settings,
        "budget": choice.budget,
        "metric": METRIC,
        "min_gain": MIN_GAIN,
        "error": None if choice.error is None else choice.error.to_dict(),
        "checks": [c.to_dict() for c in choice.checks],
        "nodes": {n.name: {
            "model": n.model_form,
            "chosen": choice.forms.get(n.name, n.model_form),
            "M": n.largest_m,
            "best_us": {form: {str(m): round(us, 3) for m, us in by_m.items()} for form, by_m in n.best.items()},
            "options": [o.to_dict() for o in n.options],
            "rejected": dict(n.rejected),
        } for n in nodes},
    }
