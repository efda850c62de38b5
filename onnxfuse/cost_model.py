"""Where a fusion pays: the target a model is optimized for, and the planned blocks it leaves alone.

The fusion rules prove that a rewrite computes what the block did; whether the rewrite is *worth it*
depends on what runs the model. A :class:`Target` reviews every plan the rules made (after the driver
has checked it is closed) and either lets it through or turns it into a ``Refusal`` whose reason says
why that block is better left to the runtime. The rules themselves know nothing of targets, and the
driver knows no target by name: ``TARGETS`` is the whole cost model.

    cuda      fuses every block (the default; see :class:`Cuda`)
    cpu       fuses every block: measured never slower (see :class:`Cpu` for the files that show it)
    tensorrt  leaves every block alone (see :class:`TensorRt`)

Why the default is a named target and not ``auto``: ``optimize`` runs where a model is built, which is
rarely where it is deployed, and its output must not depend on the machine that wrote it (optimizing is
byte-for-byte deterministic). ``cuda`` is what the fused nodes are made for, and today its review changes
nothing, nor does ``cpu``'s: the default output runs at its best on either of ORT's providers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from .errors import BadInputError

if TYPE_CHECKING:  # the targets' names and summaries are read by --help, which must not wait for ONNX and the rules
    from .patterns.graph import GraphView
    from .patterns.rule import Plan, Refusal

RULE = "cost-model"  # the rule name its refusals carry in reports
MHA = ("com.microsoft", "MultiHeadAttention")
PACKED_ATTENTION = ("com.microsoft", "Attention")


class Target(Protocol):
    """What runs the optimized model, and which of the planned rewrites pay there."""

    name: str
    summary: str  # one line, for --help

    def review(self, view: GraphView, plan: Plan) -> str | None:
        """None to fuse ``plan``, else the reason (for the user) the block is left as it is."""


@dataclass(frozen=True)
class Cuda:
    """ORT's CUDA execution provider (CPU provider behind it). Every block pays: FusedLinearGelu's CUDA
    kernel chooses its path inside the node for each call — the one-kernel GEMM+bias+GELU, cuBLASLt's GEMM
    then the library's activation kernel, or the few-rows gemv kernel, where the one kernel loses (few rows,
    odd alignment: the contract in docs/ops.md, "CUDA kernel: which path a call takes") — so leaving a block
    alone can only lose the launch and the pre-activation round trip. Attention and MultiHeadAttention reach
    ORT's flash / memory-efficient / cuDNN attention kernels, which the unfused Softmax subgraph never does
    (where the GPU time goes: bench/results/e2e_kernels_h200_sdpa.md; end to end, ViT-B/16 included:
    bench/results/e2e_h200_sdpa_fp16_mask_flags.md)."""

    name: str = "cuda"
    summary: str = "ONNX Runtime's CUDA provider: fuse every block (each fused node picks its fastest path per call)"

    def review(self, view: GraphView, plan: Plan) -> str | None:
        return None


@dataclass(frozen=True)
class Cpu:
    """ORT's CPU execution provider. Every block pays, on the measurements committed in bench/results/.

    FusedLinearGelu's CPU kernel against ORT's MLAS MatMul + Add + Gelu (float32, erf, 2 intra-op threads,
    interleaved calls in one process) is faster at every shape measured, on an AMD EPYC (``cpu_kernel.md``) and
    on a Xeon with AVX-512 (``cpu_kernel_h200_host.md``), at few rows and many, so no class of (K, N) is left
    alone; and at the shapes the CUDA kernel found hardest, 1-8 rows with K and N off multiples of 8
    (``cpu_kernel_small_m_odd.md``, Xeon). ``tests/test_cost_model.py`` holds those files to it: a committed
    measurement that shows the fused kernel slower fails there until this target says what to do about it. Not
    evidence: a run capped with ``ONNXFUSE_CPU_ISA=avx2`` on an AVX-512 host
    (``cpu_kernel_h200host_xeon_avx2cap.md``) pits the AVX2 kernel against MLAS's AVX-512 one, which is no AVX2
    machine, and it measured the kernel before its blocked-K and sliver-order rewrites. float16/bfloat16 and the
    OpenBLAS path (CPUs without AVX2) are not measured; nothing shows them slower, so they fuse as well.

    Attention and MultiHeadAttention have CPU kernels in ORT; nothing measured says they lose to the
    unfused subgraph (the committed CPU measurements are of FusedLinearGelu only), so attention stays
    fused."""

    name: str = "cpu"
    summary: str = "ONNX Runtime's CPU provider: fuse every block (the CPU kernel is measured never slower than ORT's)"

    # The committed measurements the docstring cites (tests/test_cost_model.py: the fused kernel faster in each).
    measurements: tuple[str, ...] = ("bench/results/cpu_kernel.json", "bench/results/cpu_kernel_h200_host.json")
    # Few rows and odd K, N.
    small_row_measurements: str = "bench/results/cpu_kernel_small_m_odd.json"

    def review(self, view: GraphView, plan: Plan) -> str | None:
        return None


def _tensorrt_why() -> dict[tuple[str, str], str]:
    """Why TensorRT loses each op onnxfuse writes: what it does with the unfused block instead."""
    from .domain import DOMAIN, OP_TYPE

    return {
        (DOMAIN, OP_TYPE): "TensorRT fuses MatMul+bias+GELU into one kernel itself and has no "
                           f"{DOMAIN}.{OP_TYPE} kernel without a plugin",
        MHA: "TensorRT fuses the attention subgraph itself and has no com.microsoft.MultiHeadAttention kernel "
             "without a plugin",
        PACKED_ATTENTION: "TensorRT fuses the attention subgraph itself and has no com.microsoft.Attention kernel "
                          "without a plugin",
    }


@dataclass(frozen=True)
class TensorRt:
    """ORT's TensorRT execution provider. Every block is left to TensorRT: it fuses GEMM + bias + GELU
    (and attention) into its own kernels, and its ONNX parser runs no op outside the standard domains
    without a plugin. A node it cannot run falls back to the CUDA or CPU provider, which splits the
    graph into several TensorRT engines with copies between them: slower than the unfused model."""

    name: str = "tensorrt"
    summary: str = "ONNX Runtime's TensorRT provider: fuse nothing (TensorRT fuses these blocks itself)"

    def review(self, view: GraphView, plan: Plan) -> str | None:
        domain, op_type = plan.op
        why = _tensorrt_why().get(plan.op, f"TensorRT has no {domain}.{op_type} kernel without a plugin")
        return (f"--target tensorrt: {why}; the node would run on another provider and split TensorRT's "
                f"engine, so {plan.form} is left for TensorRT")


TARGETS: dict[str, Target] = {t.name: t for t in (Cuda(), Cpu(), TensorRt())}
DEFAULT_TARGET = "cuda"


def get_target(name: str | Target) -> Target:
    """The target called ``name`` (a Target passes through); ``BadInputError`` for an unknown name."""
    if not isinstance(name, str):
        return name
    target = TARGETS.get(name)
    if target is None:
        raise BadInputError(f"--target {name!r}: choose one of {', '.join(TARGETS)}")
    return target


def review(target: Target, view: GraphView, plan: Plan) -> Plan | Refusal:
    """``plan``, or the Refusal that leaves its block as it is on ``target``."""
    from .patterns.rule import Refusal

    reason = target.review(view, plan)
    if reason is None:
        return plan
    return Refusal(RULE, reason, tuple(view.node_name(i) for i in sorted(plan.nodes)))


__all__ = ["DEFAULT_TARGET", "RULE", "TARGETS", "Cpu", "Cuda", "Target", "TensorRt", "get_target", "review"]
