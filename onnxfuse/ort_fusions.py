"""ONNX Runtime's own transformer fusions, run by ``optimize --ort-fusions`` before onnxfuse's rules.

Why: onnxfuse's rules fuse what ORT's optimizer leaves unfused (the sdpa attention, Linear+GELU into one
kernel); ORT's transformers optimizer (``onnxruntime.transformers.optimizer``) fuses what onnxfuse's rules
do not: the residual Add into ``SkipLayerNormalization``, the embeddings into ``EmbedLayerNormalization``,
GELU forms into ``BiasGelu``/``FastGelu`` (which onnxfuse's GELU rule then takes in), the eager attention
into ``Attention``. Measured on the H200 (``bench/results/e2e_h200.md``, BERT-base, GPT-2 and ViT-B/16
exported with transformers' defaults, batch 32): onnxfuse after ORT's fusions was 1.24-1.27x faster than
onnxfuse on the export itself in fp16 and 1.08-1.15x in fp32.

Why it is asked for, not the default: onnxfuse's rules never change the math, ORT's fusions are not proven
to keep it. The one known to change it is held in check: ORT's ``FusionBiasGelu`` writes the exact-erf
``BiasGelu`` for ONNX's ``Gelu(approximate="tanh")`` (on GPT-NeoX's dynamo export,
tests/models/gpt_neox_tanh_dynamo_op20.onnx, the outputs move by 6e-4 at magnitude 3, five times ``compare``'s
float32 tolerance), so every GELU op ORT's fusions write is held to the form the model computes
(``ort_gelu_forms``: rewritten into the op that computes it, or ORT's GELU fusions rerun off). Its output may
hold ops onnx.checker cannot judge (``LayerNormalization`` below opset 17, which only ORT runs), or that it
rejects (:func:`judge_checker`), and contrib ops whose shapes ``tune`` cannot follow. So the step runs where
the user asks (``optimize --ort-fusions``, best with ``--verify``), or the user runs ORT's optimizer first, as
its documentation says; onnxfuse then fuses what it left.

What runs: ``optimize_model(model_type=..., opt_level=0)``, ORT's Python fusions only (the session applies
its own graph optimizations when it loads the model anyway), for each of ``MODEL_TYPES``: "bert", ORT's
generic set (also what it uses for ViT), and "gpt2", which also turns GPT-2's Conv1D (Reshape, Gemm,
Reshape) into MatMuls. ``fuse.py`` keeps the one after which onnxfuse's rules fuse the most blocks (then
the smaller graph, then this order): on GPT-2's export the "bert" set leaves the Gemm form, whose query
shape the attention rule cannot prove, so only "gpt2" lets the attention fuse. ORT's rotary-embedding fusion is off:
on GPT-NeoX's export it writes a ``RotaryEmbedding`` that takes the position ids traced at batch 1 and
then fails at every larger batch (measured with ORT 1.31).

External data (torch's dynamo exporter writes every model so by default): ORT's fusions read constants
from the proto they are given, so the step runs on a copy with the external tensors loaded, up to
``MAX_LOADED_BYTES`` (the copy must stay under protobuf's 2 GiB). Afterwards every tensor ORT kept as it was
(same name, same bytes: nearly all weights) is its external reference again, so the rules and the streamed
save treat it as before and the output keeps its weights in OUT.data; what ORT made (a packed weight of its
own Attention fusion, on eager exports) stays inline in the output model.

onnx.checker: ORT's output is judged as an input is (:func:`judge_checker`). Where the full check rejects it
and ONNX Runtime loads it, it is kept with a warning, and the written output is held to load in ONNX Runtime
in place of the checker, whose first error moves as the rules rewrite the nodes. The case met: exports the
dynamo exporter writes with ``optimize=False`` and static shapes declare every tensor's shape, each weight's
too, and feed each weight to its MatMul through a Transpose; ORT's ``FusionConstantFold`` transposes the
weight in place, under its name, and leaves the declaration stale, which the checker's strict shape inference
rejects and ONNX Runtime reads past.

When it does not run (the report says which, and why): the target is TensorRT (it fuses for itself and runs
no com.microsoft ops); the model already has ORT's fused ops (ORT's optimizer ran before); its external data
is larger than ``MAX_LOADED_BYTES``; ORT's optimizer raises; its output is a model neither onnx.checker nor
ONNX Runtime accepts (a warning too). The rules then run on the model as it was. ``optimize --verify``
compares the final model with the input, so the gate covers both steps.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import onnx

if TYPE_CHECKING:
    from .model_io import RuntimeLoadError

ORT_DOMAIN = "com.microsoft"
# ORT's fused ops: a model with any of them has been through ORT's optimizer (or was written with them).
_ORT_FUSED_OPS = frozenset({
    "SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "EmbedLayerNormalization", "BiasGelu",
    "FastGelu", "Gelu", "QuickGelu", "Attention", "MultiHeadAttention", "GroupQueryAttention", "BiasAdd",
    "BiasSplitGelu", "RotaryEmbedding", "SimplifiedLayerNormalization",
})
MODEL_TYPES = ("bert", "gpt2")  # tried in this order (fuse.py picks)
# The external data loaded for ORT's fusions at most: the loaded copy (and ORT's own copy of it) must stay
# under protobuf's 2 GiB message limit.
MAX_LOADED_BYTES = 1536 << 20


@dataclass
class OrtFusionsReport:
    """What the library step did: ``applied`` with the ops it added, or why it did not run. Where it kept
    ORT's fusions from changing the math (``ort_gelu_forms``): ``gelu_corrected``, the GELU ops rewritten to
    the model's approximation, and ``gelu_fusions_off``, why ORT's GELU fusions were turned off. Where
    ``onnx.checker`` rejects ORT's output: ``checker_error`` (kept where ONNX Runtime loads it, else not
    applied)."""

    applied: bool
    why_not: str | None = None
    model_type: str | None = None
    added: dict[str, int] = field(default_factory=dict)  # "domain.op" -> count, ops the step added
    nodes_before: int = 0
    nodes_after: int = 0
    gelu_corrected: list[dict] = field(default_factory=list)
    gelu_fusions_off: str | None = None
    checker_error: str | None = None

    def to_dict(self) -> dict:
        """The report's fields; those that say something happened only where it did, so that a run where
        nothing was corrected reports what it always reported."""
        data = asdict(self)
        for key in ("gelu_corrected", "gelu_fusions_off", "checker_error"):
            if not data[key]:
                del data[key]
        return data

    def summary(self) -> str:
        if not self.applied:
            return f"ORT's transformer fusions not run: {self.why_not}"
        added = ", ".join(f"{n} {op.rsplit('.', 1)[1]}" for op, n in self.added.items()) or "nothing"
        text = (f"ORT's transformer fusions ({self.model_type}): {added}; "
                f"{self.nodes_before} → {self.nodes_after} nodes")
        if self.gelu_corrected:
            changes = Counter((c["ort_wrote"].rsplit(".", 1)[1], c["computes"], c["model_computes"],
                               c["now"].rsplit(".", 1)[1]) for c in self.gelu_corrected)
            text += "; " + ", ".join(f"{n} {wrote} computing {computes} where the model computes {model} made "
                                     f"{now}" for (wrote, computes, model, now), n in changes.items())
        if self.gelu_fusions_off:
            text += f"; its GELU fusions off ({self.gelu_fusions_off})"
        if self.checker_error:
            text += "; onnx.checker rejects its output, ONNX Runtime loads it"
        return text


def _op_counts(model: onnx.ModelProto) -> Counter:
    return Counter(f"{n.domain or 'ai.onnx'}.{n.op_type}" for n in model.graph.node)


def _external_bytes(model: onnx.ModelProto) -> int:
    from .model_io import external_tensors, tensor_nbytes

    return sum(tensor_nbytes(t) for t in external_tensors(model))


def with_external_data_loaded(model: onnx.ModelProto, base_dir: str) -> tuple[onnx.ModelProto, dict]:
    """A copy of ``model`` with its external tensors' data loaded from ``base_dir`` (ORT's fusions read
    constants from the proto), and the external references by name, for :func:`restore_external_references`."""
    from .model_io import all_tensors, external_tensors

    references = {}
    for t in external_tensors(model):
        ref = onnx.TensorProto()
        ref.CopyFrom(t)
        references[t.name] = ref
    loaded = onnx.ModelProto()
    loaded.CopyFrom(model)
    onnx.external_data_helper.load_external_data_for_model(loaded, base_dir)
    assert not any(t.data_location == onnx.TensorProto.EXTERNAL for t in all_tensors(loaded))
    return loaded, references


def restore_external_references(model: onnx.ModelProto, references: dict, loaded: onnx.ModelProto) -> int:
    """In ``model`` (ORT's output from ``loaded``), every initializer ORT kept as it was — the name of an
    external tensor, the same type, dims and bytes — becomes that tensor's external reference again, in
    place. Returns how many."""
    from .model_io import all_tensors

    values = {t.name: t for t in all_tensors(loaded) if t.name in references}
    restored = 0
    for t in all_tensors(model):
        ref, was = references.get(t.name), values.get(t.name)
        if ref is None or was is None or t.data_location == onnx.TensorProto.EXTERNAL:
            continue
        if (t.data_type, list(t.dims)) == (was.data_type, list(was.dims)) and t.raw_data == was.raw_data:
            t.CopyFrom(ref)
            restored += 1
    return restored


def why_not(model: onnx.ModelProto, target: str) -> str | None:
    """Why the step does not apply to ``model`` for ``target``, or None where it does."""
    if target == "tensorrt":
        return "the target is TensorRT, which fuses the graph itself and runs no com.microsoft ops"
    from .domain import DOMAIN

    if any(n.domain == DOMAIN for n in model.graph.node):
        return "the model was optimized by onnxfuse already"
    fused = sorted({n.op_type for n in model.graph.node if n.domain == ORT_DOMAIN and n.op_type in _ORT_FUSED_OPS})
    if fused:
        return f"the model already has ORT's fused ops ({', '.join(fused)}): ORT's optimizer ran before"
    external = _external_bytes(model)
    if external > MAX_LOADED_BYTES:
        return (f"the model's external data ({external / 2**30:.1f} GiB) is more than ORT's in-memory fusions can "
                f"take ({MAX_LOADED_BYTES / 2**30:.1f} GiB, under protobuf's 2 GiB); run "
                "onnxruntime.transformers.optimizer with its external-data options first")
    return None


def _run_fusions(model: onnx.ModelProto, model_type: str, use_gpu: bool,
                 gelu_fusions: bool) -> tuple[onnx.ModelProto | None, str | None]:
    """ORT's ``model_type`` fusions on a copy of ``model``: (ORT's output, None), or (None, why not) where ORT's
    optimizer raised. ``gelu_fusions`` False turns off its GELU fusions (``enable_gelu``: erf, tanh and
    sigmoid forms into one op; ``enable_bias_gelu``: the bias Add into it)."""
    from onnxruntime.transformers import optimizer
    from onnxruntime.transformers.fusion_options import FusionOptions

    options = FusionOptions(model_type)
    options.enable_rotary_embeddings = False  # see the module's docstring
    if not gelu_fusions:
        options.enable_gelu = options.enable_bias_gelu = False
    work = onnx.ModelProto()
    work.CopyFrom(model)  # ORT's fusions edit the proto they are given
    quiet = logging.getLogger("onnxruntime.transformers")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            fused = optimizer.optimize_model(work, model_type=model_type, num_heads=0, hidden_size=0, opt_level=0,
                                             use_gpu=use_gpu, optimization_options=options).model
    except Exception as e:  # ORT's optimizer is another project's code: its failure must not fail optimize
        from .errors import one_line

        return None, f"ORT's optimizer failed ({type(e).__name__}: {one_line(e)}); the model is left as it was"
    finally:
        quiet.setLevel(level)
    # ORT's optimizer adds the import of its domain only when it saves a file (OnnxModel.save_model_to_file)
    if (any(n.domain == ORT_DOMAIN for n in fused.graph.node)
            and all(o.domain != ORT_DOMAIN for o in fused.opset_import)):
        fused.opset_import.append(onnx.helper.make_opsetid(ORT_DOMAIN, 1))
    return fused, None


def apply_ort_fusions(model: onnx.ModelProto, *, model_type: str,
                      use_gpu: bool) -> tuple[onnx.ModelProto, OrtFusionsReport]:
    """``model`` with ORT's ``model_type`` transformer fusions applied (a new ModelProto; ``model`` is not
    changed), or ``model`` itself with the reason the step did not run. Call :func:`why_not` first.

    A GELU op ORT's fusions wrote in another approximation than the model computes there (``ort_gelu_forms``)
    is rewritten into the op computing the model's (``gelu_corrected``); where one cannot be, ORT's fusions
    run again with their GELU fusions off (``gelu_fusions_off``, why)."""
    from .ort_gelu_forms import hold_gelu_forms

    fused, failed = _run_fusions(model, model_type, use_gpu, gelu_fusions=True)
    if fused is None:
        return model, OrtFusionsReport(applied=False, why_not=failed)
    held = hold_gelu_forms(model, fused)
    gelu_off = None
    if held.unresolved:
        more = len(held.unresolved) - 1
        gelu_off = held.unresolved[0] + (f" (and {more} more)" if more else "")
        fused, failed = _run_fusions(model, model_type, use_gpu, gelu_fusions=False)
        if fused is None:
            return model, OrtFusionsReport(applied=False, why_not=failed)
        held = hold_gelu_forms(model, fused)
        if held.unresolved:  # ORT wrote GELU ops with its GELU fusions off: nothing of ORT's is trusted
            return model, OrtFusionsReport(applied=False, why_not=(
                f"ORT's fusions write GELU ops that compute another form than the model's with their GELU "
                f"fusions off ({'; '.join(held.unresolved)}); the model is left as it was"))
    before, after = _op_counts(model), _op_counts(fused)
    added = {op: n - before.get(op, 0) for op, n in sorted(after.items()) if n > before.get(op, 0)}
    report = OrtFusionsReport(applied=True, model_type=model_type, added=added, nodes_before=len(model.graph.node),
                              nodes_after=len(fused.graph.node), gelu_corrected=held.corrected,
                              gelu_fusions_off=gelu_off)
    return fused, report


def judge_checker(fused: onnx.ModelProto, step: OrtFusionsReport, *, input_checker_error: str | None,
                  runtime_load_error: RuntimeLoadError) -> OrtFusionsReport:
    """ORT's output ``fused`` (its weights in the proto) held to ``onnx.checker`` (full check) as an input is:
    where the checker rejects it and ONNX Runtime loads it (``runtime_load_error``:
    ``runtime.onnxruntime_load_error``, the judge of inputs too) it is kept, ``step.checker_error`` saying why
    the checker cannot be the judge of the output; where neither accepts it, a report that the step did not
    run (with the checker's error). Nothing to judge where it passes, where the checker cannot judge its ops
    (``model_io.checkable``), or where its error is the input's own, which loading the input tolerated
    already. Returns the step."""
    from .model_io import checkable, checker_error

    if not step.applied or not checkable(fused):
        return step
    error = checker_error(fused)
    if error is None or error == input_checker_error:
        return step
    refused = runtime_load_error(fused, None, base_dir=None)
    if refused is not None:
        return OrtFusionsReport(applied=False, model_type=step.model_type, checker_error=error, why_not=(
            f"ORT's fusions ({step.model_type}) wrote a model that onnx.checker rejects ({error}) and ONNX Runtime "
            f"cannot load ({refused}); the rules run on the model as it was"))
    step.checker_error = error
    return step
