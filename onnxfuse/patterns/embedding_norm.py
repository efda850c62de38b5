"""The embedding sum and the LayerNormalization that reads it, as one ``SkipLayerNormalization``:
``LayerNormalization(word[ids] + token_type[types] + position[positions])`` becomes
``SkipLayerNormalization(word[ids], position[positions], γ, β, bias=token_type[c])`` where every token
type is one value ``c``.

Why: BERT-class encoders (transformers' ``BertEmbeddings`` and its copies: RoBERTa, ELECTRA, MiniLM;
DistilBERT without token types) add two or three embedding lookups and normalize the sum; pre-norm models
(GPT-2, CLIP's text encoder) add two and normalize the sum for the first block, which also reads the sum as
its residual stream. ORT's optimizer
fuses them into ``EmbedLayerNormalization`` only in the form it knows, and today's exports are not in it:
called without ``token_type_ids``, the model reads its token types from a buffer of zeros (sliced by the
position ids, expanded to the batch). ORT's optimizer then leaves three lookups of [B, S, D], two Adds and
a LayerNormalization (its SkipLayerNormalization fusion wants two summands of one shape, and the
position rows are [1, S, D]). Those are kernels of their own: three Gathers, two Adds and ORT's
LayerNormalization kernel, where one SkipLayerNormalization of that size costs a fraction of them (each
kernel's time in BERT-base: bench/results/e2e_kernels_h200_sdpa_bias_moved.json, ``top_kernels_us``).
SkipLayerNormalization adds a skip and a bias in the pass that normalizes; a table row as the bias needs no
lookup per token.

The rewrite: of the lookups, the one of the sum's full shape is the input, a second one the skip (the
same shape, or one row per position shared by the batch: [1, S, D] or [S, D], which ORT broadcasts), and
one whose indices are all the same value ``c`` — proved from the graph (:func:`value_range`: the buffer of
zeros through Slice, GatherElements and Expand) — is row ``c`` of its table: the bias, a ``Gather`` of one
row that ORT folds into a constant when the session starts. With three lookups of unknown indices
(``token_type_ids`` given as an input), the inner Add of the first two stays and is the input. Where the sum
is read elsewhere too, the normalization's fourth output (input + skip + bias, rounded once to the tensor
type) takes its place: for two lookups the very value the Add computed.

Exact up to rounding: the graph rounds each partial sum to the tensor type and LayerNormalization
normalizes in float32 (``stash_type`` 1); SkipLayerNormalization adds the three in float32 and normalizes
in float32. In float16 the sum differs from the graph's by at most its two roundings.

Shapes: the position ids of these exports are a Slice ``[0:S]`` of a constant buffer of ``n`` rows, so the
rows looked up are ``min(n, S)``, which the proof takes as ``S`` (:class:`_ShapesOfRuns`). That is the
extent in every run the original model completes: with ``S > n`` that term has ``n > 1`` rows against the
word lookup's ``S``, and the original fails at the broadcast; so does SkipLayerNormalization, on a skip of
another length. Everything else is proved as the attention rule proves its shapes (``symbolic``).

Matched: LayerNormalization over the last axis (``stash_type`` 1, its mean and inverse-deviation outputs
unread) of a tree of Adds, each below the top one read by the next alone, whose two or three summands are all ``Gather``
along axis 0 of a constant 2-D table of γ's width, in float32 or float16; a lookup of uniform indices reads
its table within range. One summand may instead be a constant [1, S, D] or [S, D]: the position rows torch's
dynamo exporter folds when it exports with static shapes (its default); it is the skip. Not a candidate
otherwise (a sum of anything but lookups is the residual Add that ORT's own fusion takes). A candidate whose
shapes are not shown to fit is refused with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import onnx

from .graph import GraphView, attr, is_op
from .rule import Emitter, OpKey, Plan, Refusal
from .symbolic import Dim, Evaluator
from .value_range import value_range

T = onnx.TensorProto
RULE = "embeddings-into-skip-norm"
MS_DOMAIN = "com.microsoft"
_NORM_TYPES = (T.FLOAT, T.FLOAT16)  # SkipLayerNormalization's types on both of ORT's providers
_MAX_LOOKUPS = 3


class _ShapesOfRuns(Evaluator):
    """The symbolic shapes, where a Slice of a constant from 0 to a symbolic end ``e`` (step 1) over an
    axis of ``n > 1`` elements has ``e`` elements (truly ``min(n, e)``). Used only where that extent must
    then equal the word lookup's own ``e`` (or be 1) for the sum to broadcast: in a run where it does not
    (``e > n``), the original model fails, and so does SkipLayerNormalization. (``min(n, e) = 1`` only for
    ``e = 1``: a claimed ``e`` is never a real 1 against a larger extent.)"""

    def _slice_extent(self, node, n: Dim | None, s: Dim, e: Dim, st: Dim) -> Dim | None:
        known = super()._slice_extent(node, n, s, e, st)
        if known is not None:
            return known
        if (n is not None and n.is_int and n.coef > 1 and s == Dim(0) and st == Dim(1) and not e.is_int
                and self.view.constant_ref(node.input[0]) is not None):
            return e
        return None


@dataclass(frozen=True)
class _Lookup:
    """One summand: ``Gather(table, indices)`` (node ``node``, whose first input is the table); ``row`` where every
    index is that value. Or the position rows as a constant (``node`` None): the lookup an exporter folded."""

    output: str
    node: int | None
    row: int | None

    @property
    def folded(self) -> bool:
        return self.node is None


@dataclass(frozen=True)
class EmbeddingNormPlan(Plan):
    """The normalization's input and skip, the table row that is its bias (if any), and its γ, β, ε."""

    norm: int
    input: str
    skip: str
    row_table: str | None
    row: int | None
    summed: str | None = None  # the sum, where something else reads it: the normalization's output 3

    op: ClassVar[OpKey] = (MS_DOMAIN, "SkipLayerNormalization")

    def emit(self, out: Emitter, name: str) -> list[onnx.NodeProto]:
        norm = out.view.nodes[self.norm]
        gamma = norm.input[1]
        beta = norm.input[2] if len(norm.input) > 2 else ""
        nodes, bias = [], ""
        if self.row_table is not None:
            index = out.initializer(self.name_hint + "_bias_row_index", np.array(self.row, dtype=np.int64))
            bias = out.name(self.name_hint + "_bias_row")
            nodes.append(onnx.helper.make_node("Gather", [self.row_table, index], [bias], name=out.name(bias), axis=0))
        inputs = [self.input, self.skip, gamma, beta, bias]
        while not inputs[-1]:
            inputs.pop()
        outputs = [norm.output[0], "", "", self.summed] if self.summed else [norm.output[0]]
        nodes.append(onnx.helper.make_node("SkipLayerNormalization", inputs, outputs, name=name,
                                           domain=MS_DOMAIN, epsilon=float(attr(norm, "epsilon", 1e-5))))
        return nodes

    def details(self) -> dict[str, object]:
        return {"input": self.input, "skip": self.skip,
                "bias_row": None if self.row is None else f"{self.row_table}[{self.row}]", "sum_read": self.summed is not None}


class EmbeddingsIntoSkipNorm:
    """The rule, anchored on the LayerNormalization (the sum it reads is found from there)."""

    name = RULE
    anchors: tuple[OpKey, ...] = (("", "LayerNormalization"),)
    # SkipLayerNormalization is ORT's own op with kernels on both providers; listed here it would count every
    # SkipLayerNormalization ORT's optimizer wrote as a fused node in the benchmark's placement check.
    emits: tuple[OpKey, ...] = ()

    def match(self, view: GraphView, i: int) -> EmbeddingNormPlan | Refusal | None:
        norm = view.nodes[i]
        if not is_op(norm, "LayerNormalization") or len(norm.input) < 2 or not norm.output or not norm.output[0]:
            return None
        if int(attr(norm, "stash_type", 1)) != 1 or any(_read(view, o) for o in norm.output[1:] if o):
            return None
        gamma = view.shape(norm.input[1])
        if gamma is None or len(gamma) != 1 or not isinstance(gamma[0], int):
            return None
        hidden = gamma[0]
        adds, summands = _sum_tree(view, norm.input[0], i)
        if not adds or not 2 <= len(summands) <= _MAX_LOOKUPS:
            return None
        lookups = [_lookup(view, s, hidden) or _folded_rows(view, s, hidden) for s in summands]
        if any(lookup is None for lookup in lookups):
            return None  # a sum of anything but embedding lookups
        folded = [lookup for lookup in lookups if lookup.folded]
        if len(folded) > 1:
            return None  # two constants: no exporter folds one lookup into two
        dtype = view.dtype(norm.input[0]) or view.dtype(norm.input[1])
        if dtype not in _NORM_TYPES or view.dtype(norm.input[1]) not in (None, dtype):
            return None
        axis = int(attr(norm, "axis", -1))

        rows = [lookup for lookup in lookups if lookup.row is not None]
        others = [lookup for lookup in lookups if lookup.row is None]
        if len(rows) > 1:
            return Refusal(RULE, f"{len(rows)} lookups of one row each: one bias input takes one",
                           tuple(view.node_name(j) for j in sorted(adds | {i})))
        shapes = _ShapesOfRuns(view).shapes()
        if len(others) == 3:  # token types given as an input: the Add of the first two stays, as the input
            top = view.nodes[view.producer[norm.input[0]]]
            nested = [x for x in top.input if view.producer.get(x) in adds]
            if len(nested) != 1:
                return None
            inner = view.nodes[view.producer[nested[0]]]
            adds = adds - {view.producer[nested[0]]}
            pool, input_fixed = [nested[0]] + [o.output for o in others if o.output not in inner.input], True
        elif len(others) == 2:
            # folded position rows are the skip, never the input (with a batch of one they have its shape)
            others.sort(key=lambda o: o.folded)
            pool, input_fixed = [o.output for o in others], bool(folded)
        else:
            return None  # one lookup and a row: nothing for a skip to take
        blocks = tuple(view.node_name(j) for j in sorted(adds | {i}))
        chosen = _input_and_skip(shapes, pool, input_fixed)
        if chosen is None:
            return Refusal(RULE, "the lookups' shapes are not shown to fit one [B, S, D] input and a skip of the "
                                 f"same shape or [1, S, D]: {_shown({s: shapes.get(s) for s in summands})}",
                           blocks)
        input_, skip = chosen
        input_dims = shapes.get(input_)
        if axis not in (-1, 2) or input_dims[2] != Dim(hidden):
            return Refusal(RULE, f"LayerNormalization over axis {axis} of {_shown({input_: input_dims})}: "
                                 "SkipLayerNormalization normalizes the last axis of a 3-D input", blocks)
        full = shapes.get(norm.input[0])
        if full is not None and len(full) == 3 and None not in full and tuple(full) != tuple(input_dims):
            return Refusal(RULE, f"the sum is {_shown({norm.input[0]: full})}, not the input's "
                                 f"{_shown({input_: input_dims})}", blocks)
        nodes = set(adds) | {i}
        row = rows[0] if rows else None
        if row is not None:
            if not _fits(shapes.get(row.output), input_dims):
                return Refusal(RULE, f"the row lookup {_shown({row.output: shapes.get(row.output)})} does not "
                                     f"broadcast into the input {_shown({input_: input_dims})}", blocks)
            if view.single_consumer(row.output) is not None:
                nodes.add(row.node)
        form = "+".join("Constant" if lookup.folded else "Gather" for lookup in lookups) + "+LayerNormalization"
        # the sum read elsewhere too (pre-norm models: GPT-2's, CLIP's residual stream): the normalization's sum
        # output, input + skip + bias, gives it
        readers = [c for c in view.consumers_of(norm.input[0]) if c != i]
        summed = norm.input[0] if readers or norm.input[0] in view.graph_outputs else None
        return EmbeddingNormPlan(
            rule=RULE, form=form, nodes=frozenset(nodes), outputs=(norm.output[0],) + ((summed,) if summed else ()),
            name_hint=view.node_name(i), summed=summed,
            norm=i, input=input_, skip=skip, row_table=None if row is None else view.nodes[row.node].input[0],
            row=None if row is None else row.row)


def _read(view: GraphView, name: str) -> bool:
    return bool(view.consumers_of(name)) or name in view.graph_outputs


def _sum_tree(view: GraphView, name: str, reader: int) -> tuple[set[int], list[str]]:
    """The Adds of the tree that makes ``name`` (each below the top one read by its parent alone; the sum itself
    may be read elsewhere too) and its summands."""
    adds: set[int] = set()
    summands: list[str] = []

    def visit(t: str, parent: int) -> None:
        j = view.producer.get(t)
        if (j is not None and is_op(view.nodes[j], "Add") and len(view.nodes[j].input) == 2
                and (t == name or view.single_consumer(t) == parent) and len(summands) + len(adds) <= 2 * _MAX_LOOKUPS):
            adds.add(j)
            for x in view.nodes[j].input:
                visit(x, j)
        else:
            summands.append(t)

    visit(name, reader)
    return adds, summands


def _lookup(view: GraphView, name: str, hidden: int) -> _Lookup | None:
    """``name`` as a lookup in a constant [V, hidden] table, with its row where every index is one value."""
    j = view.producer.get(name)
    if j is None or not is_op(view.nodes[j], "Gather") or len(view.nodes[j].input) != 2:
        return None
    node = view.nodes[j]
    table = view.constant_ref(node.input[0])
    if table is None or len(table.dims) != 2 or table.dims[1] != hidden or int(attr(node, "axis", 0)) != 0:
        return None
    bounds = value_range(view, node.input[1])
    row = None
    if bounds is not None and bounds[0] == bounds[1] and float(bounds[0]).is_integer():
        c = int(bounds[0])
        if -table.dims[0] <= c < table.dims[0]:
            row = c % table.dims[0]
    return _Lookup(output=name, node=j, row=row)


def _folded_rows(view: GraphView, name: str, hidden: int) -> _Lookup | None:
    """``name`` as position rows an exporter folded into a constant: [1, S, hidden] or [S, hidden]. torch's dynamo
    exporter does so for static shapes (its default without ``dynamic_shapes``): the position ids are a constant
    arange there, and its optimizer folds their lookup. Whether S is the tokens' own length the shapes decide."""
    table = view.constant_ref(name)
    if table is None or len(table.dims) not in (2, 3) or table.dims[-1] != hidden:
        return None
    if len(table.dims) == 3 and table.dims[0] != 1:
        return None
    return _Lookup(output=name, node=None, row=None)


def _input_and_skip(shapes, pool: list[str], input_fixed: bool) -> tuple[str, str] | None:
    """(input, skip) of ``pool``'s two tensors: the input of a known 3-D shape (``pool[0]`` if
    ``input_fixed``), the skip of the same shape, [1, S, D] or [S, D]."""
    for input_, skip in ((pool[0], pool[1]),) if input_fixed else ((pool[0], pool[1]), (pool[1], pool[0])):
        dims, s = shapes.get(input_), shapes.get(skip)
        if dims is None or len(dims) != 3 or None in dims or s is None or None in s:
            continue
        if tuple(s) in (tuple(dims), (Dim(1), *dims[1:]), tuple(dims[1:])):
            return input_, skip
    return None


def _fits(dims, into) -> bool:
    """``dims`` broadcasts into ``into`` without enlarging it."""
    if dims is None or None in dims or len(dims) > len(into):
        return False
    return all(d == Dim(1) or d == e for d, e in zip(reversed(dims), reversed(into)))


def _shown(dims: dict) -> str:
    return ", ".join(f"{name} {list(d) if d is not None else '?'}" for name, d in dims.items())


__all__ = ["EmbeddingNormPlan", "EmbeddingsIntoSkipNorm", "RULE"]
