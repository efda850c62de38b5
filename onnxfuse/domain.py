"""The ops' contracts, as onnx sees them: ``FusedLinearGelu``, ``FillMaskedRows`` and
``MaskedSkipLayerNormalization``.

``Y = act(X · Wᵀ + B)`` (transB=1, the default) or ``act(X · W + B)`` (transB=0), accumulated in fp32.
``act`` is GELU in its exact erf form (``approximate="none"``), its tanh form (``"tanh"``) or
``x·σ(alpha·x)`` (``"sigmoid"``, QuickGELU).

``FillMaskedRows(X [B, S, D], row_kept [B, S|1, K] or [B, 1, S|1, K] bool) -> Y``: X, with every element of
a row none of whose K flags is set equal to the ``fill`` attribute (default 0):
``Where(ReduceMax(row_kept, axes=[-1]), X, fill)``, bit for bit (K = 1: ``Where(row_kept, X, fill)``). The
attention rule writes it as its row guard on the attention mask itself ([B, 1, S|1, T]: a query row is kept
when it sees a key); its kernels may write Y into X's buffer, so that a call costs only the flags and the
rows it fills (custom_ops/src/contract/fill_masked_rows_common.h).

``MaskedSkipLayerNormalization(input [B, S, D], skip, row_kept, gamma [D], beta?, bias?) -> (Y, sum?)``: ORT's
``SkipLayerNormalization`` (com.microsoft) in which a row none of whose flags is set takes its ``input`` as 0:
``sum = Where(ReduceMax(row_kept, axes=[-1]), input, 0) + skip + bias`` (in float32), ``Y = LayerNorm(sum) · gamma
+ beta`` over the last axis with ``epsilon``; the optional second output is ``sum`` in the tensor type. skip is
``[B, S, D]``, ``[1, S, D]`` or ``[S, D]``; row_kept as FillMaskedRows'. It is the attention rule's row guard
folded into the normalization that reads the output projection (patterns/guard_into_skip_norm.py): a zero row
stays zero through a MatMul, so the guard costs the normalization one read of the flags instead of a kernel.

The domain string and versions are one fact shared with the C++ library (``custom_ops/src/domain.h``); a
test checks that they agree. The domain has its own opset version (what a model imports); each op says
since which version of the domain it exists, as ONNX's own schemas do. Importing this module registers the schema with ``onnx.defs`` so that
``onnx.checker.check_model(m, full_check=True)`` and ``onnx.shape_inference`` understand the op.
"""

from __future__ import annotations

import onnx
from onnx import defs

DOMAIN = "ai.onnxfuse"
DOMAIN_VERSION = 3  # the ai.onnxfuse opset version this package writes (and the newest it reads)
OP_TYPE = "FusedLinearGelu"
OP_SINCE_VERSION = 1  # FusedLinearGelu exists since version 1 of the domain
FILL_MASKED_ROWS = "FillMaskedRows"
FILL_MASKED_ROWS_SINCE_VERSION = 2  # FillMaskedRows exists since version 2
MASKED_SKIP_NORM = "MaskedSkipLayerNormalization"
MASKED_SKIP_NORM_SINCE_VERSION = 3  # MaskedSkipLayerNormalization exists since version 3
DEFAULT_SKIP_NORM_EPSILON = 1e-12  # ORT's SkipLayerNormalization default, which the op keeps
OP_VERSION = DOMAIN_VERSION  # the opset a model imports to use the op (older name, kept for importers)

# The opset version written for each domain a rewrite emits nodes in: ours, and ORT's contrib ops
# (com.microsoft has one version, 1, in every ORT release).
EMITTED_DOMAIN_VERSIONS = {DOMAIN: DOMAIN_VERSION, "com.microsoft": 1}

APPROXIMATIONS = ("none", "tanh", "sigmoid")
# The values of the CUDA kernel's `cuda_path` attribute, and of each `tuned_paths` entry (all but "auto").
CUDA_PATHS = ("auto", "fused", "fallback", "gemv")
# The most rows the "gemv" path runs (kGemvMaxRows in custom_ops/src/cuda/kernels/gemv_gelu.h): it keeps every
# row's fp32 accumulators in registers while W streams past once, which pays only while the rows are few. A forced
# cuda_path="gemv" fails a call with more rows, and a tuning table may name it only for bounds up to here.
GEMV_MAX_ROWS = 16
DEFAULT_SIGMOID_ALPHA = 1.702
SUPPORTED_DTYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)

_DOC = __doc__.split("\n\n")[1]


def _infer(ctx) -> None:
    """Output type = X's type; output shape = X's shape with the last dim replaced by N."""
    x_type = ctx.get_input_type(0)
    w_type = ctx.get_input_type(1)
    if x_type is None or not x_type.HasField("tensor_type"):
        return
    out = onnx.TypeProto()
    out.tensor_type.elem_type = x_type.tensor_type.elem_type
    x_shape = x_type.tensor_type.shape if x_type.tensor_type.HasField("shape") else None
    if x_shape is not None:
        trans_b = 1
        attr = ctx.get_attribute("transB")
        if attr is not None:
            trans_b = attr.i
        n_dim = None
        if w_type is not None and w_type.tensor_type.HasField("shape") and len(w_type.tensor_type.shape.dim) == 2:
            n_dim = w_type.tensor_type.shape.dim[0 if trans_b else 1]
        dims = list(x_shape.dim)
        for d in dims[:-1]:
            out.tensor_type.shape.dim.add().CopyFrom(d)
        last = out.tensor_type.shape.dim.add()
        if n_dim is not None:
            last.CopyFrom(n_dim)
    ctx.set_output_type(0, out)


def _schema() -> defs.OpSchema:
    P = defs.OpSchema.FormalParameter
    Opt = defs.OpSchema.FormalParameterOption
    A = defs.OpSchema.Attribute
    schema = defs.OpSchema(
        OP_TYPE,
        DOMAIN,
        OP_SINCE_VERSION,
        _DOC,
        inputs=[
            P("X", "T", "Activations [..., K]"),
            P("W", "T", "Weights [N, K] (transB=1) or [K, N] (transB=0)"),
            P("B", "T", "Bias [N]", param_option=Opt.Optional),
        ],
        outputs=[P("Y", "T", "act(X·W(ᵀ) + B), shape [..., N]")],
        type_constraints=[("T", ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"], "Floating types")],
        attributes=[
            A("approximate", onnx.helper.make_attribute("approximate", "none"), "none (erf) | tanh | sigmoid"),
            A("alpha", onnx.helper.make_attribute("alpha", DEFAULT_SIGMOID_ALPHA), "sigmoid form: x·σ(alpha·x)"),
            A("transB", onnx.helper.make_attribute("transB", 1), "1: W is [N, K]; 0: W is [K, N]"),
            # The CUDA kernel's path choice (the CPU kernel ignores these): see CUDA_PATHS.
            A("cuda_path", onnx.helper.make_attribute("cuda_path", "auto"),
              "auto | fused (one GEMM+bias+activation kernel) | fallback (cuBLASLt GEMM+bias, then the activation) "
              f"| gemv (one kernel for at most {GEMV_MAX_ROWS} rows: W read once, fp32 accumulation)"),
            A("tuned_device", onnx.helper.make_attribute("tuned_device", ""),
              "device signature the tuning table was measured on; the table applies only there"),
            A("tuned_max_rows", defs.OpSchema.AttrType.INTS,
              "tuning table: ascending row bounds; M rows take the path of the first bound >= M", required=False),
            A("tuned_paths", defs.OpSchema.AttrType.STRINGS,
              f"tuning table: fused | fallback | gemv per bound (the last one also beyond the last bound; gemv only "
              f"for a bound <= {GEMV_MAX_ROWS} that is not the last)", required=False),
        ],
    )
    schema.set_type_and_shape_inference_function(_infer)
    return schema


def _infer_fill_masked_rows(ctx) -> None:
    """Y has X's type and shape."""
    x_type = ctx.get_input_type(0)
    if x_type is not None and x_type.HasField("tensor_type"):
        ctx.set_output_type(0, x_type)


def _fill_masked_rows_schema() -> defs.OpSchema:
    P = defs.OpSchema.FormalParameter
    schema = defs.OpSchema(
        FILL_MASKED_ROWS, DOMAIN, FILL_MASKED_ROWS_SINCE_VERSION, __doc__.split("\n\n")[2],
        inputs=[P("X", "T", "[B, S, D]"),
                P("row_kept", "B", "[B, S|1, K] or [B, 1, S|1, K]: a row none of whose K flags is set is filled")],
        outputs=[P("Y", "T", "X, with the rows not kept set to fill")],
        type_constraints=[("T", ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"], "Floating types"),
                          ("B", ["tensor(bool)"], "Row flags")],
        attributes=[defs.OpSchema.Attribute("fill", onnx.helper.make_attribute("fill", 0.0),
                                            "the value of every element of a row not kept (0 or NaN as written)")],
    )
    schema.set_type_and_shape_inference_function(_infer_fill_masked_rows)
    return schema


def _infer_masked_skip_norm(ctx) -> None:
    """Y (and the optional sum) have input's type and shape."""
    x_type = ctx.get_input_type(0)
    if x_type is not None and x_type.HasField("tensor_type"):
        for i in range(ctx.get_num_outputs()):
            ctx.set_output_type(i, x_type)


def _masked_skip_norm_schema() -> defs.OpSchema:
    P = defs.OpSchema.FormalParameter
    Opt = defs.OpSchema.FormalParameterOption
    schema = defs.OpSchema(
        MASKED_SKIP_NORM, DOMAIN, MASKED_SKIP_NORM_SINCE_VERSION, __doc__.split("\n\n")[3],
        inputs=[P("input", "T", "[B, S, D]: counts only in the rows row_kept keeps"),
                P("skip", "T", "[B, S, D], [1, S, D] or [S, D]"),
                P("row_kept", "B", "[B, S|1, K] or [B, 1, S|1, K]: a row with no flag set takes input as 0"),
                P("gamma", "T", "[D]"),
                P("beta", "T", "[D]", param_option=Opt.Optional),
                P("bias", "T", "[D]", param_option=Opt.Optional)],
        outputs=[P("Y", "T", "the normalized sum, [B, S, D]"),
                 P("input_skip_bias_sum", "T", "the sum, [B, S, D]", param_option=Opt.Optional)],
        type_constraints=[("T", ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"], "Floating types"),
                          ("B", ["tensor(bool)"], "Row flags")],
        attributes=[defs.OpSchema.Attribute("epsilon", onnx.helper.make_attribute("epsilon", DEFAULT_SKIP_NORM_EPSILON),
                                            "added to the variance, as SkipLayerNormalization's")],
    )
    schema.set_type_and_shape_inference_function(_infer_masked_skip_norm)
    return schema


def register_schema() -> None:
    """Register the schemas with onnx once per process (idempotent)."""
    if not defs.has(OP_TYPE, DOMAIN):
        defs.register_schema(_schema())
    if not defs.has(FILL_MASKED_ROWS, DOMAIN):
        defs.register_schema(_fill_masked_rows_schema())
    if not defs.has(MASKED_SKIP_NORM, DOMAIN):
        defs.register_schema(_masked_skip_norm_schema())


register_schema()
