"""The plan of a matched attention and what it writes: ``com.microsoft.MultiHeadAttention`` fed the query, key
and value as the graph has them, or ``com.microsoft.Attention`` fed the input of the packed projections.

The plan records what the rule proved (the heads' layout, the mask, the scale, the packed projections) and
:meth:`AttentionPlan.emit` writes the fused node, the few ops in front of it that give it its inputs (the
query's heads merged back, a key reshaped or transposed to [B, N, L, H], one key/value head expanded to the
query's count; the mask's tensors: ``mask_inputs``) and behind it (the row guard; a Reshape to the graph's
[B·S, D]).

Why Attention and not MHA's own packed input ([B, S, N, 3, H], key and value omitted): ORT 1.31's CPU
kernel does not implement it ("Packed QKV of shape (B, L, N, 3, H) not implemented for CPU", measured),
so the model would no longer run on the CPU provider; on CUDA it takes no ``bias`` (the Add would stay a
kernel of its own), the unfused path rejects it (NOT_IMPLEMENTED where no fused kernel applies: float32
below ORT's length threshold, or an ``attention_bias`` with S not a multiple of 4·sizeof(T)), and flash
and memory-efficient attention unpack it with a layout kernel first anyway (attention_prepare_qkv.cu,
``PrepareQkv_MHA_PackedQKV``). Attention reaches the same kernels as MHA from the same inputs — one GEMM,
then ``LaunchAddBiasTranspose`` into whichever layout the kernel reads (``PrepareQkv_Attention``).
One difference: Attention's flash path needs S ≥ 513 (its ``MinSeqLenForFlashAttentionPackedQkv``; MHA's
separate inputs take flash at any length), so a float16 causal-only attention of fewer tokens runs cuDNN SDPA
or memory-efficient attention instead.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import onnx

from ...domain import DOMAIN, FILL_MASKED_ROWS
from .. import qkv
from ..rule import Emitter, Plan
from . import mask_inputs


RULE = "attention"
MS_DOMAIN = "com.microsoft"


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
    padding_rank: int = 2  # the padding tensor is [B, T] (2) or [B, 1, 1, T] (4)
    mask_values: str | None = None  # the attention_mask values the mask is proved on, where not every value

    op = (MS_DOMAIN, "MultiHeadAttention")

    def details(self) -> dict:
        found = {"num_heads": self.num_heads, "mask": self.mask_kind or "none", "scale": self.scale,
                 **({"window": 1 - self.band[0]} if self.band and self.band[1] == 0 else
                    {"band": list(self.band)} if self.band else {}),
                 "bias": "packed" if self.biases else "none",
                 "mask_input": "attention_bias" if self.padding or self.additive_bias or self.score_keep else
                 "unidirectional" if self.causal else "none", "qkv": "separate"}
        if self.mask_values:
            found["mask_values"] = self.mask_values
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
            made, attention_bias = mask_inputs.padding_bias(self, out)
            nodes += made
        elif self.additive_bias is not None and self.bias_is_full:
            attention_bias = self.additive_bias
        elif self.additive_bias is not None:
            made, attention_bias = mask_inputs.expanded_bias(self, out)
            nodes += made
        if self.score_keep is not None:
            made, attention_bias = mask_inputs.score_keep_bias(self, out, attention_bias)
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
            # reads and writes all of y (both timed in BERT-base and GPT-2: bench/results/e2e_h200.md).
            rows = mask_inputs.keep_mask(self, out, nodes)
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
        """The key heads [B, N, L, H] that the graph only has merged with another reshape (heads._folded_key_heads):
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
