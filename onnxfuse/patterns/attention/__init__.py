"""Self-attention, as the exporters write it, into one ``com.microsoft.Attention`` (Q, K and V packed into
one projection) or, where they cannot be packed, one ``com.microsoft.MultiHeadAttention``.

Anchored on ``Softmax``. The forms below are the ones torch.onnx writes for Hugging Face models with the
default (``sdpa``) attention, TorchScript (``dynamo=False``) and dynamo exporters, opsets 14-20, raw and
after ORT's transformers optimizer (which fuses none of them) and its float16 converter; see
tests/models/manifest.json.

Guard: sdpa's math path writes ``Where(IsNaN(P), 0, P)`` after the Softmax: it turns rows with no visible
key (−inf everywhere: NaN) into zeros.

Refused, with the reason shown by ``inspect``: probabilities read anywhere else (``output_attentions``),
Softmax over another axis, a bias that is neither a proved padding/causal mask nor a finite tensor of
the scores' type and shape (``-inf`` fills of masks it cannot prove, such as an anti-causal compare;
``(1 - m) · finfo.min`` of an int64 mask; a bias of another type or
one that broadcasts the scores up), scores scaled after the bias is added, a query/key that reaches the
product through other ops without proved [B, N, S, H] dimensions (above), key and value heads of
different sizes, inconsistent head counts.

Projections: where Q, K and V are constant-weight projections of one tensor X (three MatMuls, or GPT-2's
one MatMul and a Split; qkv.py), the block takes them in and becomes ``Attention(X, [Wq | Wk | Wv],
[bq | bk | bv])``: ORT runs one GEMM and one kernel that adds the bias and splits the heads, where MHA
was fed three GEMMs' outputs (BERT) or a Split's (GPT-2: a Split kernel and a bias broadcast of their
own). Weights in external data are packed too, joined while the model is saved. Otherwise (a
cross-attention, a run-time weight, a projection also read elsewhere: ``inspect`` gives the reason as
``qkv_separate_because``) the projections are fed to MHA as they are; when each is ``MatMul +
Add(const [D])``, the three Adds are folded into MHA's ``bias`` input (one new [3D] constant), else the Adds
stay in front of the op.

Why Attention and not MHA's own packed input ([B, S, N, 3, H], key and value omitted): ORT 1.31's CPU
kernel does not implement it ("Packed QKV of shape (B, L, N, 3, H) not implemented for CPU", measured),
so the model would no longer run on the CPU provider; on CUDA it takes no ``bias`` (the Add would stay a
kernel of its own), the unfused path rejects it (NOT_IMPLEMENTED where no fused kernel applies: float32
below ORT's length threshold, or an ``attention_bias`` with S not a multiple of 4·sizeof(T)), and flash
and memory-efficient attention unpack it with a layout kernel first anyway (attention_prepare_qkv.cu,
``PrepareQkv_MHA_PackedQKV``). Attention reaches the same kernels as MHA from the same inputs — one GEMM,
then ``LaunchAddBiasTranspose`` into whichever layout the kernel reads (``PrepareQkv_Attention``).

Kernel choice (ORT's contrib_ops/cuda/bert/multihead_attention.cc and attention.cc): no mask and
causal-only reach cuDNN SDPA (sm90), flash attention (float16) or memory-efficient attention, and the
TensorRT fused kernel without a mask; a ``key_padding_mask``/``mask_index`` of shape [B, T] rules out
every fused kernel (only the unfused softmax path takes it: BERT-base fp16 at batch 32 spent 524 µs in
its ``SoftmaxWithRawMaskSmallKernel``), while an ``attention_bias`` reaches memory-efficient attention
when S is a multiple of 4·sizeof(T). So padding goes in as ``attention_bias``; which kernel ran is read
by ``bench/e2e_kernels.py``. One difference: Attention's flash path needs S ≥ 513 (its
``MinSeqLenForFlashAttentionPackedQkv``; MHA's separate inputs take flash at any length), so a float16
causal-only attention of fewer tokens runs cuDNN SDPA or memory-efficient attention instead.

ONNX's own ``Attention`` op (opset 23, the dynamo exporter's sdpa) is the second anchor (:class:`OnnxAttention`),
rewritten on the same proofs. Not handled (no such form among the committed exports): ALiBi as bloom
writes it (its scores are one ``baddbmm``, no Q·Kᵀ MatMul: not a candidate), a row guard derived from a bias's values (which would admit non-finite biases).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import onnx

from .. import qkv
from ...domain import DOMAIN, FILL_MASKED_ROWS
from ..graph import GraphView, attr, is_op
from ..match import Refused
from ..rule import Emitter, Plan, Refusal, T, dtype_name
from ..symbolic import Evaluator
from . import masks
from .heads import (Heads, heads_read_as_they_are, key_transposed, merge_heads, projection_heads, read_heads,
                    value_hidden)
from .masks import FLOAT32_MIN
from .score_keep import prove_score_keep
from .scores import ScoreKeep, Scores, find_scores, scores_in_another_form, scores_masked_by_where, strip_scale

RULE = "attention"
MS_DOMAIN = "com.microsoft"
_SUPPORTED = (T.FLOAT, T.FLOAT16)
# Nodes that only compute shapes of a block's tensors may be absorbed into the block (their only reader).
# Ops of a shape-only subgraph that dies with the block (_shape_closure), the run-time scale's arithmetic
# (1/√Shape(q)[-1], scores.strip_scale) included: a closure is taken only where every path ends inside the block.
_SHAPE_OPS = ("Shape", "Slice", "Concat", "Gather", "Squeeze", "Unsqueeze", "Cast", "Reshape", "CastLike", "Sqrt",
              "Reciprocal", "Div", "Mul", "Sub")  # Sub: GPT-Neo's key_length - query_length


# --- the plan ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AttentionPlan(Plan):
    query: str
    key: str
    value: str
    biases: tuple | None  # three inline [D] constants (q, k, v) to pack into MHA's bias, or None
    mask_kind: str  # "" | "causal" | "key-padding" | "causal+key-padding" | "causal+sliding-window+key-padding"
    # | "local-window+key-padding" | "additive bias"
    padding: str | None  # the tensor the graph reads as attention_mask[b, k] (nonzero keeps key k), or None
    padding_is_bool: bool
    fill: float | None  # the graph's fill for dropped keys
    hidden_rows: float | None  # what the graph makes of a row that sees no key (0 or NaN), when it must be kept
    causal: bool  # causal without padding: MHA's unidirectional (no bias: its fastest kernels)
    num_heads: int
    scale: float
    dtype: int
    opset: int
    self_attention: bool  # query length = key length, proved: the mask's S is the padding's T
    flat_shape: tuple | None = None  # the graph merges heads into [B·S, D]: MHA's [B, S, D] reshaped
    additive_bias: str | None = None  # the graph's own finite bias tensor, fed as attention_bias
    bias_is_full: bool = False  # ... already 4-D with the query and key lengths (else expanded to them)
    separate_because: str | None = None  # why Q, K and V are not packed into one projection
    query_heads: str | None = None  # the query as heads [B, N, S, H] the graph computed: merged in front of MHA
    kv_heads: bool = False  # key and value are heads [B, N, L, H] the graph has (MHA's 4-D key and value)
    key_shape: tuple = ()  # ints [B, N, L, H]: MHA's key is Reshape(key, key_shape), made in front of it
    key_from_bsnh: bool = False  # the key is [B, L, N, H] (rotated before its heads are transposed: GPT-J):
    # MHA's key is Transpose(key, 0213), made in front of it
    broadcast_heads: tuple = ()  # "key"/"value": one head the graph's product broadcasts (multi-query)
    score_keep: str | None = None  # the literal whose slice is the keep of Where(keep, Q·Kᵀ, fill) on the product
    score_fill: float | None = None
    score_keep_rank: int = 4
    score_keep_rows: int = 0  # the literal's query-axis extent
    band: tuple | None = None  # (lo, hi): only keys lo <= k - q <= hi (with padding): a sliding window (hi = 0)
    # or a local one around the query's position

    op = (MS_DOMAIN, "MultiHeadAttention")

    def details(self) -> dict:
        found = {"num_heads": self.num_heads, "mask": self.mask_kind or "none", "scale": self.scale,
                 **({"window": 1 - self.band[0]} if self.band and self.band[1] == 0 else
                    {"band": list(self.band)} if self.band else {}),
                 "bias": "packed" if self.biases else "none",
                 "mask_input": "attention_bias" if self.padding or self.additive_bias or self.score_keep else
                 "unidirectional" if self.causal else "none", "qkv": "separate"}
        if self.score_keep:
            found["score_keep"] = "Where(keep, Q·Kᵀ, fill) into attention_bias" + (
                " with unidirectional" if self.causal else "")
        if self.separate_because:
            found["qkv_separate_because"] = self.separate_because
        if self.kv_heads:
            found.update(query="heads merged" if self.query_heads else "projection", key_value="heads")
        if self.key_shape:
            found["key_heads"] = f"reshaped to {list(self.key_shape)} in front of the op"
        if self.key_from_bsnh:
            found["key_heads"] = "[batch, length, heads, head_size] transposed in front of the op"
        if self.broadcast_heads:
            found["broadcast_heads"] = f"one {'/'.join(self.broadcast_heads)} head expanded to {self.num_heads}"
        return found

    def emit(self, out: Emitter, name: str) -> list[onnx.NodeProto]:
        if self.query_heads is not None:
            merge, query = self._merged_query(out)
            return merge + replace(self, query=query, query_heads=None).emit(out, name)
        if self.key_shape:
            reshape, key = self._reshaped_key(out)
            return reshape + replace(self, key=key, key_shape=()).emit(out, name)
        if self.key_from_bsnh:
            heads = out.name(self.name_hint + "_key_bnlh")
            transpose = onnx.helper.make_node("Transpose", [self.key], [heads], name=out.name(heads), perm=[0, 2, 1, 3])
            return [transpose] + replace(self, key=heads, key_from_bsnh=False).emit(out, name)
        nodes, projections = self._projection_inputs(out)
        attention_bias = ""
        if self.padding is not None:
            made, attention_bias = out.shared(self._mask_key("attention_bias"), lambda: self._attention_bias(out))
            nodes += made
        elif self.additive_bias is not None and self.bias_is_full:
            attention_bias = self.additive_bias
        elif self.additive_bias is not None:
            made, attention_bias = out.shared(("expanded_bias", self.additive_bias, self.query, self.key),
                                              lambda: self._expanded_bias(out))
            nodes += made
        if self.score_keep is not None:
            # one bias for every layer that slices the same literal to the padding's own length (both exporters
            # store each of GPT-Neo's buffers once, its causal and its banded one, for all the layers that read it)
            lengths = (self.padding,) if self._lengths_from_padding else (self.query, self.key)
            made, attention_bias = out.shared(
                ("score_keep_bias", self.score_keep, self.score_fill, self.dtype, attention_bias) + lengths,
                lambda: self._score_keep_bias(out, attention_bias))
            nodes += made
        y = self.outputs[0]
        merged = out.name(self.name_hint + "_merged") if self.flat_shape else y
        mha_out = out.name(self.name_hint + "_mha") if self.hidden_rows is not None else merged
        # inputs 0-4 are the projections (and, unused here, MHA's key_padding_mask / Attention's mask_index
        # and past), input 5 attention_bias in both ops
        inputs = _trimmed(projections + [""] * (5 - len(projections)) + [attention_bias])
        nodes.append(onnx.helper.make_node(self.op[1], inputs, [mha_out], name=name, domain=MS_DOMAIN,
                                           **self._attrs()))
        if self.hidden_rows is not None:
            # The guard is ai.onnxfuse's FillMaskedRows on the mask itself (keep [B, 1, S|1, T]: a query row is
            # kept when any of its keys is), writing into MHA's output where ORT lets it: it touches the mask
            # and the rows it fills, where ONNX's Where(ReduceMax(keep), y, value) takes four more nodes and
            # reads and writes all of y (H200, float16, batch 32: BERT-base's and GPT-2's twelve guards took
            # 90 µs as Where, 31 and 27 µs as this op in place, bench/results/e2e_h200.md).
            rows = self._keep(out, nodes)
            # ORT's planner lets the guard write into MHA's output only where it can prove the two the same
            # size, from shapes; its inference of MHA's output loses the sequence length in today's exports
            # (GPT-2 and BERT after ORT's optimizer: [batch, ?, D]). Named dimensions state only that they
            # exist, which is true, and are what the planner needs (the op says in ORT's verbose log whether
            # it ran in place: every guard of both models on the CPU and CUDA providers,
            # bench/guard_in_place.py).
            out.declare(mha_out, self.dtype, [f"{mha_out}_{axis}" for axis in ("batch", "sequence", "hidden")])
            nodes.append(onnx.helper.make_node(FILL_MASKED_ROWS, [mha_out, rows], [merged], domain=DOMAIN,
                                               name=out.name(merged + "_hidden_rows"), fill=float(self.hidden_rows)))
        if self.flat_shape:
            shape = out.initializer(self.name_hint + "_flat_shape", np.array(self.flat_shape, dtype=np.int64))
            nodes.append(onnx.helper.make_node("Reshape", [merged, shape], [y], name=out.name(y + "_reshape")))
        return nodes

    def _merged_query(self, out: Emitter) -> tuple[list[onnx.NodeProto], str]:
        """MHA reads the query only as [B, S, N·H]: the graph's heads [B, N, S, H] merged back, which is
        what MHA splits them into again (the Reshape's zeros copy B and S)."""
        bsnh, merged = out.name(self.name_hint + "_query_bsnh"), out.name(self.name_hint + "_query_merged")
        shape = out.initializer(self.name_hint + "_query_shape", np.array([0, 0, -1], dtype=np.int64))
        return [onnx.helper.make_node("Transpose", [self.query_heads], [bsnh], name=out.name(bsnh), perm=[0, 2, 1, 3]),
                onnx.helper.make_node("Reshape", [bsnh, shape], [merged], name=out.name(merged))], merged

    def _reshaped_key(self, out: Emitter) -> tuple[list[onnx.NodeProto], str]:
        """The key heads [B, N, L, H] that the graph only has merged with another reshape (_folded_key_heads):
        its input reshaped to them, which every later step (the key's length included) reads as the key."""
        heads = out.name(self.name_hint + "_key_bnlh")
        shape = out.initializer(self.name_hint + "_key_bnlh_shape", np.array(self.key_shape, dtype=np.int64))
        return [onnx.helper.make_node("Reshape", [self.key, shape], [heads], name=out.name(heads))], heads

    def _attrs(self) -> dict:
        attrs = {"num_heads": self.num_heads, "scale": self.scale}
        if self.causal:
            attrs["unidirectional"] = 1
        return attrs

    def _projection_inputs(self, out: Emitter) -> tuple[list[onnx.NodeProto], list[str]]:
        """MultiHeadAttention's query, key, value [B, S, D] (or 4-D heads) and its packed bias (or ""), and
        the nodes that make them: a broadcast key/value head [B, 1, L, H] is expanded to [B, N, L, H] (MHA
        broadcasts no head)."""
        bias = "" if self.biases is None else out.concatenation(
            self.name_hint + "_qkv_bias", [out.view.constant_ref(b) for b in self.biases], axis=None)
        nodes, inputs = [], {"key": self.key, "value": self.value}
        for what in self.broadcast_heads:
            heads = out.initializer(self.name_hint + "_heads_shape", np.array([1, self.num_heads, 1, 1], np.int64))
            expanded = out.name(f"{self.name_hint}_{what}_heads")
            nodes.append(onnx.helper.make_node("Expand", [inputs[what], heads], [expanded], name=out.name(expanded)))
            inputs[what] = expanded
        return nodes, [self.query, inputs["key"], inputs["value"], bias]

    # The mask is rebuilt from what the rule proved it to be, keep[b, 0, q, k] = padding[b, k] != 0
    # (∧ k <= q, or ∧ lo <= k - q <= hi), from the padding tensor and the query's length alone: every op of
    # it runs on the model's provider, where the exporters' index arithmetic (Range, GatherND, Expand chains
    # over shapes) ran partly on the CPU, which cost a device-host copy per inference and kept ORT from
    # capturing the model in a CUDA graph. One rebuilt mask serves every layer with the same padding tensor
    # and query length.
    def _mask_key(self, what: str) -> tuple:
        # Self-attention's mask depends on the padding tensor alone; otherwise also on this block's query.
        return (what, self.padding, self.mask_kind, self.band, self.fill, self.dtype,
                None if self.self_attention else self.query)

    @property
    def _length_source(self) -> str:
        """The tensor whose axis 1 is the query length S: the padding mask itself in self-attention
        (S = T; shared by every layer), else the query."""
        return self.padding if self.self_attention else self.query

    def _keep(self, out: Emitter, nodes: list) -> str:
        """keep [B, 1, 1, T] (padding) or [B, 1, S, T] (padding ∧ causal or a window), bool: appends the nodes
        that make it to ``nodes`` unless an earlier block made it."""
        made, keep = out.shared(self._mask_key("keep"), lambda: self._keep_nodes(out))
        nodes += made
        return keep

    def _keep_nodes(self, out: Emitter) -> tuple[list[onnx.NodeProto], str]:
        hint = self.name_hint + "_mask"
        nodes: list[onnx.NodeProto] = []
        source = self.padding
        if not self.padding_is_bool:
            source = out.name(hint + "_padding_bool")
            nodes.append(onnx.helper.make_node("Cast", [self.padding], [source], name=out.name(source), to=T.BOOL))
        keep = out.name(hint + "_keep_padding")
        nodes.append(_with_axes(out, self.opset, "Unsqueeze", 13, source, keep, [1, 2], hint + "_padding_axes"))
        if not self._positional:
            return nodes, keep
        names = [out.name(hint + s) for s in ("_query_shape", "_query_len", "_padding_shape", "_key_len",
                                             "_key_positions", "_query_positions", "_query_column", "_keep")]
        q_shape, q_len, p_shape, k_len, k_pos, q_pos, q_col, both = names
        zero, one = (out.initializer(hint + n, np.array(v, np.int64)) for n, v in (("_pos0", 0), ("_pos_step", 1)))
        seq_axis = out.initializer(hint + "_seq_axis", np.array(1, np.int64))
        nodes += [
            onnx.helper.make_node("Shape", [self.padding], [p_shape], name=out.name(p_shape)),
            onnx.helper.make_node("Gather", [p_shape, seq_axis], [k_len], name=out.name(k_len), axis=0),
            onnx.helper.make_node("Range", [zero, k_len, one], [k_pos], name=out.name(k_pos)),
        ]
        if self.self_attention:
            q_pos = k_pos
        else:
            nodes += [
                onnx.helper.make_node("Shape", [self.query], [q_shape], name=out.name(q_shape)),
                onnx.helper.make_node("Gather", [q_shape, seq_axis], [q_len], name=out.name(q_len), axis=0),
                onnx.helper.make_node("Range", [zero, q_len, one], [q_pos], name=out.name(q_pos)),
            ]
        nodes.append(_with_axes(out, self.opset, "Unsqueeze", 13, q_pos, q_col, [1], hint + "_column_axes"))
        if self.band is None:  # causal: k <= q
            future, kept = out.name(hint + "_future"), out.name(hint + "_past_or_present")
            nodes += [onnx.helper.make_node("Greater", [k_pos, q_col], [future], name=out.name(future)),
                      onnx.helper.make_node("Not", [future], [kept], name=out.name(kept))]  # [S, T]
        else:  # lo <= k - q <= hi, integers compared exactly as the graph's own bounds
            offset, below, above, outside, kept = (out.name(hint + s) for s in (
                "_key_offset", "_before_window", "_after_window", "_outside_window", "_in_window"))
            lo, hi = (out.initializer(hint + n, np.array(v, np.int64)) for n, v in zip(("_lowest", "_highest"),
                                                                                      self.band))
            nodes += [onnx.helper.make_node("Sub", [k_pos, q_col], [offset], name=out.name(offset)),  # [S, T]
                      onnx.helper.make_node("Less", [offset, lo], [below], name=out.name(below)),
                      onnx.helper.make_node("Greater", [offset, hi], [above], name=out.name(above)),
                      onnx.helper.make_node("Or", [below, above], [outside], name=out.name(outside)),
                      onnx.helper.make_node("Not", [outside], [kept], name=out.name(kept))]
        nodes.append(onnx.helper.make_node("And", [keep, kept], [both], name=out.name(both)))
        return nodes, both

    @property
    def _positional(self) -> bool:
        """The keep depends on the query and key positions (causal, or a window): [B, 1, S, T]."""
        return "causal" in self.mask_kind or self.band is not None

    def _attention_bias(self, out: Emitter) -> tuple[list[onnx.NodeProto], str]:
        """MHA's 4-D ``attention_bias`` [B, 1, S, T]: 0 where the graph keeps a key, its fill elsewhere."""
        hint = self.name_hint + "_mask"
        nodes: list[onnx.NodeProto] = []
        keep = self._keep(out, nodes)
        np_dtype = onnx.helper.tensor_dtype_to_np_dtype(self.dtype)
        bias = out.name(hint + "_additive")
        nodes.append(onnx.helper.make_node(
            "Where", [keep, out.initializer(hint + "_kept", np.array(0, np_dtype)),
                      out.initializer(hint + "_fill", np.array(self.fill, np_dtype))], [bias], name=out.name(bias)))
        if self._positional:
            return nodes, bias  # already [B, 1, S, T]
        # [B, 1, 1, T] → [B, 1, S, T]: MHA takes the query axis whole
        q_shape, q_len, target, expanded = (out.name(hint + s) for s in
                                            ("_query_shape", "_query_len", "_bias_shape", "_attention_bias"))
        nodes += [
            onnx.helper.make_node("Shape", [self._length_source], [q_shape], name=out.name(q_shape)),
            onnx.helper.make_node("Gather", [q_shape, out.initializer(hint + "_seq_axes", np.array([1], np.int64))],
                                  [q_len], name=out.name(q_len), axis=0),
            onnx.helper.make_node("Concat", [out.initializer(hint + "_bias_lead", np.array([1, 1], np.int64)), q_len,
                                             out.initializer(hint + "_bias_tail", np.array([1], np.int64))],
                                  [target], name=out.name(target), axis=0),
            onnx.helper.make_node("Expand", [bias, target], [expanded], name=out.name(expanded)),
        ]
        return nodes, expanded

    def _score_keep_bias(self, out: Emitter, attention_bias: str) -> tuple[list[onnx.NodeProto], str]:
        """``Where(C[.., :S, :L], 0, fill) + bias`` (the mask's bias, or nothing) as MHA's attention_bias: the
        graph's ``Where(keep, s, fill) + bias`` with the product taken out, which MHA adds back (exact: the
        rule's docstring). The keep is sliced from the literal again, from 0 to the query's and key's own
        lengths, which is what the graph's slices were proved to be (their starts 0, their ends these
        lengths): so it reads none of the block's tensors. Padded to 4 axes; a literal of one row is
        expanded over the query positions (MHA takes [B|1, N|1, S, T])."""
        hint = self.name_hint + "_score_keep"
        np_dtype = onnx.helper.tensor_dtype_to_np_dtype(self.dtype)
        nodes, q_len, k_len = self._lengths(out, hint)
        rank = self.score_keep_rank
        ends, sliced, keep, dropped = (out.name(hint + x) for x in ("_ends", "_sliced", "_4d", "_bias"))
        nodes += [
            onnx.helper.make_node("Concat", [q_len, k_len], [ends], name=out.name(ends), axis=0),
            onnx.helper.make_node("Slice", [self.score_keep, out.initializer(hint + "_starts", np.zeros(2, np.int64)),
                                            ends, out.initializer(hint + "_axes", np.array([rank - 2, rank - 1],
                                                                                           np.int64))],
                                  [sliced], name=out.name(sliced)),
        ]
        if rank < 4:
            nodes.append(_with_axes(out, self.opset, "Unsqueeze", 13, sliced, keep, list(range(4 - rank)),
                                    hint + "_lead_axes"))
        else:
            keep = sliced
        nodes.append(onnx.helper.make_node(
            "Where", [keep, out.initializer(hint + "_kept", np.array(0, np_dtype)),
                      out.initializer(hint + "_fill", np.array(self.score_fill, np_dtype))], [dropped],
            name=out.name(dropped)))
        if self.score_keep_rows == 1:
            made, dropped = self._expand_to(out, dropped, q_len, k_len, hint)
            nodes += made
        if not attention_bias:
            return nodes, dropped
        total = out.name(hint + "_attention_bias")
        nodes.append(onnx.helper.make_node("Add", [dropped, attention_bias], [total], name=out.name(total)))
        return nodes, total

    @property
    def _lengths_from_padding(self) -> bool:
        return self.padding is not None and self.self_attention

    def _expanded_bias(self, out: Emitter) -> tuple[list[onnx.NodeProto], str]:
        """The graph's bias broadcast to [B|1, N|1, S, T], the shape MHA's attention_bias must have at run
        time: Expand to [1, 1, S, T] keeps the bias's own batch and head axes (1 or the scores')."""
        hint = self.name_hint + "_bias"
        nodes, q_len, k_len = self._lengths(out, hint)
        made, expanded = self._expand_to(out, self.additive_bias, q_len, k_len, hint)
        return nodes + made, expanded

    def _lengths(self, out: Emitter, hint: str) -> tuple[list[onnx.NodeProto], str, str]:
        """The query's and key's lengths as [1] tensors: in self-attention with a padding mask both are the
        mask's length (proved), which every layer shares; else the query's axis 1 and the key's (axis 1 of a
        [B, L, D] key, axis 2 of [B, N, L, H] heads)."""
        if self._lengths_from_padding:
            shape, length = out.name(hint + "_padding_shape"), out.name(hint + "_length")
            axis = out.initializer(hint + "_seq_axes", np.array([1], np.int64))
            return [onnx.helper.make_node("Shape", [self.padding], [shape], name=out.name(shape)),
                    onnx.helper.make_node("Gather", [shape, axis], [length], name=out.name(length), axis=0)
                    ], length, length
        q_shape, k_shape, q_len, k_len = (out.name(hint + s) for s in ("_query_shape", "_key_shape", "_query_len",
                                                                       "_key_len"))
        seq_axis = out.initializer(hint + "_seq_axes", np.array([1], np.int64))
        key_axis = out.initializer(hint + "_key_axes", np.array([2], np.int64)) if self.kv_heads else seq_axis
        return [
            onnx.helper.make_node("Shape", [self.query], [q_shape], name=out.name(q_shape)),
            onnx.helper.make_node("Gather", [q_shape, seq_axis], [q_len], name=out.name(q_len), axis=0),
            onnx.helper.make_node("Shape", [self.key], [k_shape], name=out.name(k_shape)),
            onnx.helper.make_node("Gather", [k_shape, key_axis], [k_len], name=out.name(k_len), axis=0),
        ], q_len, k_len

    def _expand_to(self, out: Emitter, bias: str, q_len: str, k_len: str,
                   hint: str) -> tuple[list[onnx.NodeProto], str]:
        target, expanded = out.name(hint + "_shape"), out.name(hint + "_attention_bias_expanded")
        return [
            onnx.helper.make_node("Concat", [out.initializer(hint + "_lead", np.array([1, 1], np.int64)), q_len, k_len],
                                  [target], name=out.name(target), axis=0),
            onnx.helper.make_node("Expand", [bias, target], [expanded], name=out.name(expanded)),
        ], expanded


@dataclass(frozen=True)
class PackedAttentionPlan(AttentionPlan):
    """The attention with Q, K and V packed into one projection: ``com.microsoft.Attention(X, W [D_in, 3D],
    b [3D], -, -, [attention_bias])``, which runs the one GEMM itself. ``query``/``key``/``value`` are X
    (the mask's and bias's shapes are read from its sequence axis, which is the projections')."""

    packed: qkv.PackedQkv | None = None

    op = (MS_DOMAIN, "Attention")

    def details(self) -> dict:
        found = super().details()
        found.update(bias="packed", qkv="packed", qkv_form=self.packed.form)
        return found

    def _projection_inputs(self, out: Emitter) -> tuple[list[onnx.NodeProto], list[str]]:
        """Attention's input X [B, S, D_in], weight [D_in, 3D] and bias [3D] (no nodes to make them)."""
        p = self.packed
        weight, bias = p.weight, p.bias
        if p.weights is not None:  # three constants side by side: [Wq | Wk | Wv], one copy for tied layers
            _, weight = out.shared(("packed_qkv_weight",) + tuple(w.root for w in p.weights), lambda: (
                [], out.concatenation(self.name_hint + "_qkv_weight", p.weights, axis=1)))
        if bias is None:
            # ORT's CUDA Attention splits the GEMM's output into heads in the kernel that adds the bias; fed no
            # bias, it only transposes, to the unfused kernel's layout (attention_prepare_qkv.cu,
            # PrepareQkv_Attention): zeros keep every kernel open and add nothing.
            biases = p.biases if p.biases is not None else (None, None, None)
            np_dtype = onnx.helper.tensor_dtype_to_np_dtype(self.dtype)
            bias = out.concatenation(self.name_hint + "_qkv_bias", [
                np.zeros(p.hidden, np_dtype) if b is None else b for b in biases], axis=None)
        return [], [p.input, weight, bias]


def _trimmed(inputs: list[str]) -> list[str]:
    """The inputs without trailing empty (omitted optional) ones."""
    inputs = list(inputs)
    while inputs and not inputs[-1]:
        inputs.pop()
    return inputs


def _with_axes(out: Emitter, opset: int, op: str, axes_input_since: int, x: str, y: str, axes: list,
               axes_hint: str, **attrs) -> onnx.NodeProto:
    """``op(x, axes)`` in the model's opset: axes as an input from ``axes_input_since`` on (Unsqueeze and
    ReduceSum: 13), as an attribute before."""
    if opset >= axes_input_since:
        return onnx.helper.make_node(op, [x, out.initializer(axes_hint, np.array(axes, np.int64))], [y],
                                     name=out.name(y), **attrs)
    return onnx.helper.make_node(op, [x], [y], name=out.name(y), axes=axes, **attrs)


# --- the rule ----------------------------------------------------------------------------------------
class Attention:
    """Softmax-anchored self-attention → ``com.microsoft.MultiHeadAttention``."""

    name = RULE
    anchors = (("", "Softmax"),)
    # The fused op. The ONNX ops written around it (the mask's Casts, the output's IsNaN/Where guard or
    # hidden-row factor, a Reshape) run on every provider; listed here they would hold every such node of
    # a model to the requested provider in the benchmark's placement check.
    emits = ((MS_DOMAIN, "MultiHeadAttention"), (MS_DOMAIN, "Attention"))

    def match(self, view: GraphView, i: int):
        node = view.nodes[i]
        if not is_op(node, "Softmax"):
            return None
        scores = find_scores(view, node.input[0])
        if scores is None:
            why = scores_masked_by_where(view, node.input[0]) or scores_in_another_form(view, node.input[0])
            # not fed by a product: some other Softmax, unless it is one whose scores come in a form not taken
            return Refusal(RULE, why, (view.node_name(i),)) if why else None
        try:
            plan = _plan(view, i, scores)
        except Refused as why:
            return why.as_refusal(RULE, (view.node_name(i),))
        return _unless_escaping(view, i, plan)


def _unless_escaping(view: GraphView, anchor: int, plan: AttentionPlan) -> AttentionPlan | Refusal:
    """``plan``, unless a tensor it removes is read elsewhere: an attention whose heads or scores are read
    outside it (T5's first layers return the key heads as the cache; its decoder's position bias reads the
    query heads' shape) stays, with this rule's reason."""
    escape = view.escaping_intermediate(plan.nodes, plan.outputs)
    if escape is None:
        return plan
    out, reader = escape
    where = "is a graph output" if reader is None else f"is also read by {view.node_name(reader)}"
    return Refusal(RULE, f"the attention's intermediate '{out}' {where} (a cache output or a shape read outside "
                         "the attention)", (view.node_name(anchor),))


class OnnxAttention:
    """ONNX's own ``Attention`` op (opset 23: the dynamo exporter's scaled_dot_product_attention) →
    ``com.microsoft.Attention`` or ``MultiHeadAttention``, on the same proofs as :class:`Attention`.

    ORT runs ONNX's op, but slower than its contrib ops (H200, BERT-base fp16 at batch 32: 387 µs of attention
    kernels per inference against 192 µs, and three Q/K/V GEMMs where the contrib op packs one;
    bench/results/e2e_kernels_h200_dynamo_op23.md). Taken: Q, K and V as head splits [B, N, S, H] of
    projections (or 3-D [B, S, N·H] with ``q_num_heads``), the output merged back by the graph (4-D) or 3-D;
    ``attn_mask`` absent, boolean and proved padding and/or causal (a dropped key gets -inf, as the op
    defines), or a finite additive tensor; ``is_causal`` with the query and key lengths proved equal; the
    op's own scale or its default 1/√head_size. A row that sees no key is 0, as ORT's kernel makes it
    (measured on its CPU provider), kept by the row guard. Refused with the reason: a KV cache
    (``past_key``/``past_value``, ``nonpad_kv_seqlen``), present key/value or ``qk_matmul_output`` read,
    ``softcap``, grouped K/V heads (``kv_num_heads`` ≠ ``q_num_heads``), ``is_causal`` with a mask, and
    whatever the Softmax form refuses for its Q, K, V and mask."""

    name = RULE
    anchors = (("", "Attention"),)
    emits = Attention.emits

    def match(self, view: GraphView, i: int):
        try:
            plan = _plan_onnx(view, i)
        except Refused as why:
            return why.as_refusal(RULE, (view.node_name(i),))
        return _unless_escaping(view, i, plan)


def _plan_onnx(view: GraphView, i: int) -> AttentionPlan:
    node = view.nodes[i]
    ev = Evaluator(view)
    ins = list(node.input) + [""] * (7 - len(node.input))
    if any(ins[4:7]):
        raise Refused("ONNX Attention with a KV cache (past_key/past_value or nonpad_kv_seqlen): not a "
                       "self-attention over the inputs alone")
    read = [o for o in node.output[1:] if o and (view.consumers_of(o) or o in view.graph_outputs)]
    if read:
        raise Refused(f"ONNX Attention's present key/value or qk_matmul_output ('{read[0]}') is read")
    if attr(node, "softcap", 0.0) != 0.0:
        raise Refused(f"ONNX Attention with softcap {attr(node, 'softcap', 0.0):g}: the contrib ops have none")
    nodes = {i}
    rank = ev.rank(ins[0])
    if rank == 4:
        q, k, v = (read_heads(view, ev, t, nodes, what) for t, what in zip(ins[:3], ("query", "key", "value")))
        if q.computed or k.computed or v.computed:
            raise Refused("ONNX Attention whose heads the graph computes per head (a rotary embedding): "
                           "not taken from this op")
    elif rank == 3:
        q_heads, kv_heads = attr(node, "q_num_heads", 0), attr(node, "kv_num_heads", 0)
        if q_heads <= 0 or kv_heads != q_heads:
            raise Refused(f"ONNX Attention with 3-D inputs and {q_heads} query / {kv_heads} key-value heads "
                           "(grouped key/value heads, or none given)")
        q, k, v = (projection_heads(view, ev, t, q_heads, what) for t, what in zip(ins[:3], ("query", "key", "value")))
    else:
        raise Refused(f"ONNX Attention's query is not known to be 3-D or 4-D (rank {rank})")
    if not (q.heads == k.heads == v.heads):
        raise Refused(f"ONNX Attention with {q.heads} query and {k.heads}/{v.heads} key/value heads (grouped "
                       "key/value heads)")
    dtype = ev.dtype(q.typed)
    if dtype is None:
        raise Refused("the attention's dtype is not known (no projection's type can be derived)")
    if dtype not in _SUPPORTED or ev.dtype(k.typed) != dtype:
        raise Refused(f"attention in {dtype_name(dtype)}: MultiHeadAttention is fused here for float32/float16")
    mask = masks.NO_MASK
    if ins[3]:
        if ev.dtype(ins[3]) == T.BOOL:
            mask = masks.proved_keep(view, ev, ins[3], -math.inf, q, k, dtype)
        else:
            mask = masks.additive_bias(view, ev, ins[3], q, k, dtype, "the float attn_mask is added to the scores")
    if attr(node, "is_causal", 0):
        if ins[3]:
            raise Refused("ONNX Attention with is_causal and an attn_mask: not taken")
        if q.seq != k.seq:
            raise Refused("ONNX Attention with is_causal where the query and key lengths are not shown equal "
                           "(its causal mask is aligned to the top left, MultiHeadAttention's to the bottom right)")
        mask = masks.Mask("causal", causal=True)
    head_size = q.head_size
    scale = attr(node, "scale", None)
    if scale is None:
        scale = 1.0 / math.sqrt(head_size)
    if rank == 4:
        merged, flat_shape = merge_heads(view, ev, node.output[0], q, q.heads * q.head_size, nodes)
    else:
        merged, flat_shape = node.output[0], None
    return _finish(view, ev, nodes, q, k, v, dtype, mask, merged, flat_shape, scale, ("ONNX Attention", ""), 0.0,
                   node.name or f"attention_{i}")


def _plan(view: GraphView, softmax: int, sc: Scores) -> AttentionPlan:
    node = view.nodes[softmax]
    ev = Evaluator(view)
    rank = ev.rank(node.input[0]) or 4
    axis = attr(node, "axis", -1)
    if axis not in (-1, rank - 1):
        raise Refused(f"Softmax over axis {axis}: attention normalises over the key axis (the last)")
    if sc.post_scale != 1.0:
        raise Refused(f"the scores are scaled by {sc.post_scale:g} after the bias is added: MultiHeadAttention "
                       "adds attention_bias to the scaled product, unscaled")
    nodes = set(sc.nodes) | {softmax}
    qk = view.nodes[sc.matmul]

    q_scaled, k_scaled = qk.input[0], qk.input[1]
    qh, q_scale = strip_scale(view, q_scaled, nodes, ev)
    kt, k_scale = strip_scale(view, k_scaled, nodes, ev)
    q = read_heads(view, ev, qh, nodes, "query")
    k = key_transposed(view, ev, kt, nodes)
    scale = sc.scale * q_scale * k_scale

    dtype = ev.dtype(q.typed)
    if dtype is None:
        raise Refused("the attention's dtype is not known (no projection's type can be derived)")
    if dtype not in _SUPPORTED or ev.dtype(k.typed) != dtype:
        raise Refused(f"attention in {dtype_name(dtype)}: MultiHeadAttention is fused here for float32/float16")
    mask = masks.classify(view, ev, sc.bias, q, k, dtype) if sc.bias is not None else masks.NO_MASK
    score_keep = None if sc.keep is None else prove_score_keep(view, ev, sc.keep, q, k, dtype, mask)
    if score_keep is not None and all(r in nodes | score_keep.slices for i in score_keep.slices
                                      for o in view.nodes[i].output for r in view.consumers_of(o)):
        # the block's own slices go with it (the keep is sliced again: AttentionPlan._score_keep_bias), so the
        # shape arithmetic over the heads they may read dies with it; slices another layer also reads (the
        # dynamo exporter shares one between layers of the same buffer) stay, and die once no layer reads them
        nodes |= score_keep.slices
    # The mask adds without broadcasting the scores up (checked by masks.classify), so the probabilities
    # have the product's dimensions: recorded, so the head merge's reshapes can be checked against them.
    probs, guarded = node.output[0], False
    ev.seed(probs, tuple(ev.dim(qk.output[0], j) for j in range(4)))
    readers = view.consumers_of(probs)
    if probs in view.graph_outputs:
        raise Refused("the attention probabilities are a graph output (output_attentions)")
    if len(readers) == 2:
        guard = _nan_guard(view, probs, readers)
        if guard is None:
            raise Refused("the attention probabilities are read outside the attention (output_attentions?)")
        nodes |= set(guard[0])
        probs, guarded = guard[1], True
    ev.seed(probs, tuple(ev.dim(qk.output[0], j) for j in range(4)))
    cast = view.single_consumer(probs)
    if cast is not None and is_op(view.nodes[cast], "Cast") and attr(view.nodes[cast], "to") == dtype:
        # GPT-Neo's attn_weights.to(value.dtype): a Cast to the type the probabilities already have
        nodes.add(cast)
        probs = view.nodes[cast].output[0]
        ev.seed(probs, tuple(ev.dim(qk.output[0], j) for j in range(4)))
    pv = view.single_consumer(probs)
    if pv is None or not is_op(view.nodes[pv], "MatMul") or view.nodes[pv].input[0] != probs:
        raise Refused("the attention probabilities are read outside the attention (output_attentions?)")
    nodes.add(pv)
    v = read_heads(view, ev, view.nodes[pv].input[1], nodes, "value")
    per_head = q.computed or k.computed or v.computed
    hidden = value_hidden(ev, q, v) if per_head else q.heads * q.head_size
    merged, flat_shape = merge_heads(view, ev, view.nodes[pv].output[0], q, hidden, nodes)
    scaling = ("√scale on Q and Kᵀ" if q_scale != 1.0 and k_scale != 1.0 else
               "scaled Q" if q_scale != 1.0 else "scaled Kᵀ" if k_scale != 1.0 else
               "scaled scores" if sc.scale != 1.0 else "unscaled")
    # A row that sees no key (an all-padding batch row; left padding under causality) is NaN in the graph
    # with the -inf fill, and 0 after its guard: reproduced whatever the kernel makes of such a row. With a
    # finite fill such a row is the graph's plain softmax of equal scores, which MHA computes the same way.
    no_key_row = 0.0 if guarded else math.nan
    return _finish(view, ev, nodes, q, k, v, dtype, mask, merged, flat_shape, scale,
                   (scaling, "IsNaN guard" if guarded else ""), no_key_row,
                   view.nodes[softmax].name or f"attention_{softmax}", score_keep)


def _finish(view: GraphView, ev: Evaluator, nodes: set, q: Heads, k: Heads, v: Heads, dtype: int, mask: masks.Mask,
            merged: str, flat_shape: tuple | None, scale: float, form_notes: tuple, no_key_row: float,
            name_hint: str, score_keep: ScoreKeep | None = None) -> AttentionPlan:
    """The plan of a matched attention (either anchor): packing, biases, the mask's input and the rows that
    see no key. ``no_key_row`` is the graph's value for such a row where the fill is -inf (0 or NaN)."""
    per_head = q.computed or k.computed or v.computed
    if ev.dtype(v.typed) != dtype:
        raise Refused(f"the value is {dtype_name(ev.dtype(v.typed))}, the query {dtype_name(dtype)}")
    broadcast_heads: tuple = ()
    if per_head:
        kept, broadcast_heads = heads_read_as_they_are(ev, q, k, v)
        nodes -= kept
    elif not (q.heads == k.heads == v.heads and q.head_size == k.head_size):
        raise Refused(f"query/key/value split into {q.heads}/{k.heads}/{v.heads} heads of "
                       f"{q.head_size}/{k.head_size}/{v.head_size}")

    if per_head:  # the projections' bias Adds stay before the rotary; MHA gets no bias (module docstring)
        packed, separate_because = None, ("the heads are computed per head (a rotary embedding, or heads not "
                                          "split from a [batch, sequence, hidden] projection): "
                                          "MultiHeadAttention reads them as the graph computes them")
    else:
        packed, separate_because = _packed_projection(view, ev, (q, k, v), dtype, nodes, merged)
    biases = None if packed or per_head else _packable_biases(view, (q, k, v), dtype)
    if per_head:
        query, key, value = (q.projected or q.tensor), k.tensor, v.tensor
    elif packed is not None:
        nodes |= packed.nodes
        query = key = value = packed.input
    elif biases is not None:
        nodes |= {x.bias_add for x in (q, k, v)}
        query, key, value = (x.unbiased for x in (q, k, v))
    else:
        query, key, value = q.projected, k.projected, v.projected
    nodes = _absorb_shape_readers(view, nodes)
    padded = mask.tensor is not None
    hidden_rows = no_key_row if padded and mask.fill == -math.inf else None
    if padded and view.opset is None:
        raise Refused("the model imports no ONNX opset: the mask's ops cannot be written")
    if scale == 0.0:  # MHA reads scale 0 as "the default 1/√head_size"
        raise Refused("the scores are scaled by 0")
    scaling, guard_note = form_notes
    form = ", ".join(p for p in ("heads computed per head" if per_head else "", scaling,
                                 "Where(keep, Q·Kᵀ, fill)" if score_keep else "", mask.kind or "no mask",
                                 guard_note) if p)
    extra = {"packed": packed} if packed else {"separate_because": separate_because}
    return (PackedAttentionPlan if packed else AttentionPlan)(
        rule=RULE, form=f"attention ({form})", nodes=frozenset(nodes), outputs=(merged,),
        name_hint=name_hint,
        query=query, key=key, value=value, biases=biases,
        mask_kind=mask.kind, padding=mask.tensor,
        padding_is_bool=padded and view.dtype(mask.tensor) == T.BOOL, fill=mask.fill,
        hidden_rows=hidden_rows, causal=mask.causal and not padded, band=mask.band, num_heads=q.heads,
        scale=float(np.float32(scale)), dtype=dtype, opset=view.opset or 0,
        self_attention=q.seq == k.seq, flat_shape=flat_shape,
        query_heads=q.tensor if q.computed else None, kv_heads=per_head, broadcast_heads=broadcast_heads,
        key_shape=k.shape, key_from_bsnh=k.from_bsnh,
        additive_bias=mask.bias, bias_is_full=mask.bias is not None and mask.rank == 4 and mask.full,
        score_keep=score_keep.literal if score_keep else None, score_fill=score_keep.fill if score_keep else None,
        score_keep_rank=score_keep.rank if score_keep else 4, score_keep_rows=score_keep.rows if score_keep else 0,
        **extra)


def _packed_projection(view: GraphView, ev: Evaluator, heads, dtype: int, nodes: set,
                       merged: str) -> tuple[qkv.PackedQkv | None, str | None]:
    """Q, K and V as one projection for ``com.microsoft.Attention`` (qkv.py), or None and why not.

    Packing takes the projections into the block: one that something else also reads would leave the
    block open, so such an attention keeps its separate projections (and stays fused)."""
    try:
        packed = qkv.find(view, ev, tuple(h.projected for h in heads), tuple(h.heads * h.head_size for h in heads),
                          dtype)
    except qkv.NotPacked as why:
        return None, str(why)
    leak = view.escaping_intermediate(_absorb_shape_readers(view, nodes | packed.nodes), (merged,))
    if leak is not None and view.escaping_intermediate(_absorb_shape_readers(view, nodes), (merged,)) is None:
        out, reader = leak
        where = "is a graph output" if reader is None else f"is also read by {view.node_name(reader)}"
        return None, f"the projection '{out}' {where}"
    return packed, None


def _nan_guard(view: GraphView, probs: str, readers: list) -> tuple[tuple, str] | None:
    """``Where(IsNaN(P), 0, P)``: (its two nodes, its output), when those are P's only readers."""
    isnan = next((r for r in readers if is_op(view.nodes[r], "IsNaN")), None)
    where = next((r for r in readers if is_op(view.nodes[r], "Where")), None)
    if isnan is None or where is None:
        return None
    w = view.nodes[where]
    zero = view.scalar(w.input[1]) if len(w.input) == 3 else None
    if w.input[0] != view.nodes[isnan].output[0] or w.input[2] != probs or zero is None or zero[0] != 0.0:
        return None
    if view.single_consumer(view.nodes[isnan].output[0]) != where:
        return None
    return (isnan, where), w.output[0]


def _packable_biases(view: GraphView, heads, dtype: int) -> tuple | None:
    """The three bias constants, when all are stored constants of the attention's dtype read as stored
    (inline or external: packed side by side, ``Emitter.concatenation``); otherwise those Adds stay in front
    of the op."""
    names = []
    for h in heads:
        if h.bias_add is None or view.single_consumer(h.projected) is None:
            return None
        ref = view.constant_ref(h.bias)
        if ref is None or ref.converts or ref.data_type != dtype:
            return None
        names.append(h.bias)
    return tuple(names)


def _absorb_shape_readers(view: GraphView, nodes: set) -> set:
    """Add the shape-only nodes (``Shape(Kh)`` and the Slices/Concats of it: dynamo's Kᵀ reshapes) whose
    every reader is in the block: they read block tensors, and die with it."""
    nodes = set(nodes)
    changed = True
    while changed:
        changed = False
        produced = {o for i in nodes for o in view.nodes[i].output}
        for name in produced:
            for r in view.consumers_of(name):
                if r in nodes or view.nodes[r].op_type != "Shape":
                    continue
                closure = _shape_closure(view, r, nodes)
                if closure is not None:
                    nodes |= closure
                    changed = True
    return nodes


def _shape_closure(view: GraphView, start: int, block: set) -> set | None:
    """``start`` and its shape-op descendants, if all their outputs end up read only inside ``block``."""
    out, todo = set(), [start]
    while todo:
        i = todo.pop()
        if i in out:
            continue
        out.add(i)
        for o in view.nodes[i].output:
            if o in view.graph_outputs:
                return None
            for r in view.consumers_of(o):
                if r in block:
                    continue
                if view.nodes[r].op_type not in _SHAPE_OPS:
                    return None
                todo.append(r)
    return out

