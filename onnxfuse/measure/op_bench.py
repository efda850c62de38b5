"""Op mode: one FusedLinearGelu [M,K]×[K,N] against the same computation in plain ONNX ops (what ORT runs
without onnxfuse), both placed on the roofline of the hardware's ceilings as this runtime reaches them (a big
plain GEMM and a big copy, measured or given)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..domain import DOMAIN, OP_TYPE, DOMAIN_VERSION
from ..errors import BadInputError, ProviderPlacementError
from ..runtime import create_session
from .device_run import DeviceRun
from .environment import SCHEMA, environment
from .placement import Placement, profile_placement
from .progress import Steps
from .timing import Timing, TimingPolicy, measure

if TYPE_CHECKING:
    from rich.progress import Progress

DTYPES = {"fp32": TensorProto.FLOAT, "fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}
_NUMPY_DTYPES = {"fp32": np.dtype(np.float32), "fp16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16)}
_BASELINE_OPSET = 20  # the first opset with a Gelu op


def parse_op(text: str) -> tuple[int, int, int]:
    """'1024,768,3072' (or 1024x768x3072) -> (M, K, N)."""
    try:
        dims = tuple(int(d) for d in text.replace("x", ",").replace("×", ",").split(","))
    except ValueError:
        dims = ()
    if len(dims) != 3 or min(dims) < 1:
        raise BadInputError(f"--op {text!r}: expected M,K,N as three positive integers, e.g. 1024,768,3072")
    return dims  # type: ignore[return-value]


def initializer(values: np.ndarray, dtype: str, name: str) -> onnx.TensorProto:
    """``values`` (float32) as an initializer of the bench dtype ``dtype`` (fp32, fp16, bf16)."""
    return numpy_helper.from_array(values.astype(_NUMPY_DTYPES[dtype]), name)


def op_models(m: int, k: int, n: int, dtype: str = "fp32", approximate: str = "none", seed: int = 0):
    """The one-block models: X[M,K] → FusedLinearGelu(W[N,K], B[N]) and the same computation in plain
    ONNX (MatMul(W[K,N]) → Add(B) → Gelu, opset 20) as ORT would run it without onnxfuse. Weights are
    random (W ~ N(0,1)/√K, B ~ N(0,0.1)): never time zeros."""
    if dtype not in DTYPES:
        raise BadInputError(f"--dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    if approximate not in ("none", "tanh"):
        raise BadInputError(f"--approximate {approximate!r}: choose none or tanh (the forms ONNX Gelu has)")
    rng = np.random.default_rng(seed)
    w_nk = rng.standard_normal((n, k), dtype=np.float32) / np.sqrt(k)
    bias = rng.standard_normal(n, dtype=np.float32) * 0.1
    elem = DTYPES[dtype]
    x = helper.make_tensor_value_info("X", elem, [m, k])
    y = helper.make_tensor_value_info("Y", elem, [m, n])

    fused_node = helper.make_node(OP_TYPE, ["X", "W", "B"], ["Y"], name="fused", domain=DOMAIN, approximate=approximate, transB=1)
    fused = helper.make_model(
        helper.make_graph([fused_node], "fused_linear_gelu", [x], [y], [initializer(w_nk, dtype, "W"), initializer(bias, dtype, "B")]),
        opset_imports=[helper.make_opsetid("", _BASELINE_OPSET), helper.make_opsetid(DOMAIN, DOMAIN_VERSION)],
    )
    unfused_nodes = [
        helper.make_node("MatMul", ["X", "W"], ["XW"], name="matmul"),
        helper.make_node("Add", ["XW", "B"], ["XWB"], name="add"),
        helper.make_node("Gelu", ["XWB"], ["Y"], name="gelu", approximate=approximate),
    ]
    unfused = helper.make_model(
        helper.make_graph(unfused_nodes, "linear_gelu", [x], [y], [initializer(w_nk.T.copy(), dtype, "W"), initializer(bias, dtype, "B")]),
        opset_imports=[helper.make_opsetid("", _BASELINE_OPSET)],
    )
    for model in (fused, unfused):
        model.ir_version = 9  # what ORT 1.20+ reads; newer onnx would write a newer one
    return fused, unfused


def random_input(shape: tuple[int, ...], dtype: str, seed: int) -> np.ndarray:
    """N(0, 1) values of the bench dtype ``dtype``: never time zeros."""
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32).astype(_NUMPY_DTYPES[dtype])


@dataclass
class Ceilings:
    """What the hardware does at best, as this runtime reaches it: a big plain GEMM and a big copy."""

    tflops: float
    tflops_source: str
    gbps: float
    gbps_source: str


# Large enough to saturate the device, small enough to measure in well under a second per run.
_CEILING_GEMM = {"cuda": 8192, "cpu": 1024}
_CEILING_COPY_BYTES = {"cuda": 1 << 30, "cpu": 256 << 20}


def measure_ceilings(
    provider: str,
    dtype: str,
    policy: TimingPolicy,
    tflops: float | None = None,
    gbps: float | None = None,
    *,
    gemm_size: int | None = None,
    copy_bytes: int | None = None,
) -> Ceilings:
    """Measure what is not given: GEMM TFLOP/s from one square MatMul (``gemm_size``³) through ORT in
    ``dtype``, and bandwidth from an Identity whose output is a separate bound buffer (ORT copies
    ``copy_bytes`` from input to output: bytes read + bytes written)."""
    if tflops is None:
        c = gemm_size or _CEILING_GEMM[provider]
        x = helper.make_tensor_value_info("X", DTYPES[dtype], [c, c])
        y = helper.make_tensor_value_info("Y", DTYPES[dtype], [c, c])
        w = initializer(np.random.default_rng(1).standard_normal((c, c), dtype=np.float32) / np.sqrt(c), dtype, "W")
        model = helper.make_model(
            helper.make_graph([helper.make_node("MatMul", ["X", "W"], ["Y"])], "gemm", [x], [y], [w]),
            opset_imports=[helper.make_opsetid("", _BASELINE_OPSET)],
        )
        model.ir_version = 9
        session = create_session(model.SerializeToString(), provider)
        run = DeviceRun(session, {"X": random_input((c, c), dtype, 2)}, {"Y": (c, c)})
        (t,) = measure([run], policy)
        tflops = 2 * c**3 / (t.median_ms / 1e3) / 1e12
        tflops_source = f"measured: MatMul {c}×{c}×{c} {dtype} through ORT"
    else:
        tflops_source = "given (--peak-tflops)"
    if gbps is None:
        elems = (copy_bytes or _CEILING_COPY_BYTES[provider]) // 4
        x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [elems])
        y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [elems])
        model = helper.make_model(
            helper.make_graph([helper.make_node("Identity", ["X"], ["Y"])], "copy", [x], [y]),
            opset_imports=[helper.make_opsetid("", _BASELINE_OPSET)],
        )
        model.ir_version = 9
        session = create_session(model.SerializeToString(), provider)
        run = DeviceRun(session, {"X": random_input((elems,), "fp32", 3)}, {"Y": (elems,)})
        (t,) = measure([run], policy)
        gbps = 2 * elems * 4 / (t.median_ms / 1e3) / 1e9
        gbps_source = f"measured: copy of {elems * 4 / 2**20:g} MiB through ORT (read + write)"
    else:
        gbps_source = "given (--peak-gbps)"
    return Ceilings(tflops, tflops_source, gbps, gbps_source)


def op_cost(m: int, k: int, n: int, dtype: str) -> tuple[int, int]:
    """(FLOPs, bytes) of one Linear+GELU: 2·M·N·K multiply-adds (GELU's few ops per output are noise),
    and X, W, B read once and Y written once, the least traffic any implementation needs."""
    return 2 * m * n * k, (m * k + n * k + n + m * n) * _NUMPY_DTYPES[dtype].itemsize


@dataclass
class OpTiming:
    timing: Timing
    tflops: float
    gbps: float
    roofline_fraction: float  # the roofline's best time ÷ the measured time (1.0 = at the ceiling)

    def to_dict(self) -> dict:
        return {**self.timing.to_dict(), "tflops": self.tflops, "gbps": self.gbps, "roofline_fraction": self.roofline_fraction}


@dataclass
class OpBenchReport:
    m: int
    k: int
    n: int
    dtype: str
    approximate: str
    provider: str
    cuda_graph: bool
    policy: TimingPolicy
    ceilings: Ceilings
    fused: OpTiming
    unfused: OpTiming
    placement: Placement
    exit_code: int = 0

    @property
    def flops(self) -> int:
        return op_cost(self.m, self.k, self.n, self.dtype)[0]

    @property
    def bytes(self) -> int:
        return op_cost(self.m, self.k, self.n, self.dtype)[1]

    @property
    def speedup(self) -> float:
        return self.unfused.timing.median_ms / self.fused.timing.median_ms

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA,
            "mode": "op",
            "provider": self.provider,
            "cuda_graph": self.cuda_graph,
            "op": {"M": self.m, "K": self.k, "N": self.n, "dtype": self.dtype, "approximate": self.approximate},
            "flops": self.flops,
            "bytes": self.bytes,
            "ceilings": asdict(self.ceilings),
            "fused": self.fused.to_dict(),
            "unfused": self.unfused.to_dict(),
            "speedup": self.speedup,
            "placement": self.placement.to_dict(),
            "policy": asdict(self.policy),
            "environment": environment(),
        }


def bench_op(
    m: int,
    k: int,
    n: int,
    *,
    dtype: str = "fp32",
    approximate: str = "none",
    provider: str = "cuda",
    cuda_graph: bool = False,
    policy: TimingPolicy = TimingPolicy(),
    peak_tflops: float | None = None,
    peak_gbps: float | None = None,
    progress: Progress | None = None,
) -> OpBenchReport:
    """Time one FusedLinearGelu [M,K]×[K,N] against ORT's unfused MatMul+Add+Gelu, and place both on
    the roofline of the measured (or given) ceilings."""
    fused, unfused = (mp.SerializeToString() for mp in op_models(m, k, n, dtype, approximate))
    x = {"X": random_input((m, k), dtype, seed=4)}
    step = Steps(progress, ["placement", "fused vs unfused", "ceilings"])
    placement = profile_placement(fused, provider, x, label=f"the fused {OP_TYPE} model")
    if placement.fused_nodes != 1:
        raise ProviderPlacementError(f"the profiler saw {placement.fused_nodes} {OP_TYPE} nodes run, expected 1")
    step()
    runs = [
        DeviceRun(create_session(model, provider, cuda_graph=cuda_graph, label=label), x, {"Y": (m, n)})
        for model, label in ((fused, f"the fused {OP_TYPE} model"), (unfused, "the unfused MatMul+Add+Gelu model"))
    ]
    t_fused, t_unfused = measure(runs, policy)
    step()
    ceilings = measure_ceilings(provider, dtype, policy, peak_tflops, peak_gbps)
    step()
    flops, nbytes = op_cost(m, k, n, dtype)
    fused_point, unfused_point = (_on_roofline(t, flops, nbytes, ceilings) for t in (t_fused, t_unfused))
    return OpBenchReport(m, k, n, dtype, approximate, provider, cuda_graph, policy, ceilings, fused_point, unfused_point, placement)


def _on_roofline(t: Timing, flops: int, nbytes: int, ceilings: Ceilings) -> OpTiming:
    seconds = t.median_ms / 1e3
    best = max(flops / (ceilings.tflops * 1e12), nbytes / (ceilings.gbps * 1e9))
    return OpTiming(t, flops / seconds / 1e12, nbytes / seconds / 1e9, best / seconds)
