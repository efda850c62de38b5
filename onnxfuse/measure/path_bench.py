"""What ``onnxfuse tune`` measures on the GPU: one FusedLinearGelu node at M rows with each forced CUDA path
(``cuda_path="fused"`` and ``"fallback"``, and ``"gemv"`` where M <= ``GEMV_MAX_ROWS``: it runs no more rows;
docs/ops.md, "CUDA kernel: which path a call takes"), and ORT's own MatMul + Add + GELU for reference, interleaved
in one process through the CUDA provider with IO binding (``timing.measure``, ``DeviceRun``).

The one-node models are the node as the model has it (K, N, dtype, transB, activation) with a bias and
random weights; only the rows and those differ between calls of the real node, and the kernel's choice
depends on nothing else.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from ..version import __version__
from ..domain import DOMAIN, DOMAIN_VERSION, GEMV_MAX_ROWS, OP_TYPE
from ..errors import BadInputError, one_line
from ..runtime import (CUDA, create_session, cuda_device_signature, cuda_devices, cuda_driver_version, cuda_usable,
                       probe_library)
from ..tuning import Device, Measure, NodeShape, PathTimes
from .device_run import DeviceRun
from .op_bench import initializer, random_input
from .timing import TimingPolicy, measure

_OPSET = 20  # the first with a Gelu op
_IR_VERSION = 9
_BENCH_DTYPES = {TensorProto.FLOAT: "fp32", TensorProto.FLOAT16: "fp16", TensorProto.BFLOAT16: "bf16"}
NEEDS = "tune needs CUDAExecutionProvider and a GPU"


def forced_paths(m: int) -> tuple[str, ...]:
    """The CUDA paths a node can be forced to at M rows: gemv only up to ``GEMV_MAX_ROWS``."""
    return ("fused", "fallback", "gemv") if m <= GEMV_MAX_ROWS else ("fused", "fallback")


def gemv_not_applicable(m: int) -> str:
    """Why gemv has no time at M rows (M > ``GEMV_MAX_ROWS``)."""
    return f"not applicable: gemv runs at most {GEMV_MAX_ROWS} rows (M={m})"


def path_models(shape: NodeShape, m: int) -> dict[str, bytes]:
    """The one-block models at M rows: one per path of :func:`forced_paths` (the node with that
    ``cuda_path``) and "ort_unfused" (MatMul + Add + Gelu, or x·Sigmoid(alpha·x) for the sigmoid form, as
    ORT runs it)."""
    dtype = _BENCH_DTYPES.get(shape.dtype)
    if dtype is None:
        raise BadInputError(f"{shape.describe()}: {OP_TYPE} runs float32, float16 and bfloat16 only")
    rng = np.random.default_rng(0)  # never time zeros: W ~ N(0, 1/K), B ~ N(0, 0.01)
    w_nk = rng.standard_normal((shape.n, shape.k), dtype=np.float32) / np.sqrt(shape.k)
    bias = initializer(rng.standard_normal(shape.n, dtype=np.float32) * 0.1, dtype, "B")
    x = helper.make_tensor_value_info("X", shape.dtype, [m, shape.k])
    y = helper.make_tensor_value_info("Y", shape.dtype, [m, shape.n])
    w_node = initializer(w_nk if shape.trans_b else w_nk.T.copy(), dtype, "W")
    attrs = {"approximate": shape.approximate, "transB": shape.trans_b}
    if shape.alpha is not None:
        attrs["alpha"] = shape.alpha
    out = {}
    for path in forced_paths(m):
        node = helper.make_node(OP_TYPE, ["X", "W", "B"], ["Y"], name=path, domain=DOMAIN, cuda_path=path, **attrs)
        graph = helper.make_graph([node], f"tune_{path}", [x], [y], [w_node, bias])
        out[path] = helper.make_model(graph, ir_version=_IR_VERSION, opset_imports=[
            helper.make_opsetid("", _OPSET), helper.make_opsetid(DOMAIN, DOMAIN_VERSION)]).SerializeToString()
    nodes = [helper.make_node("MatMul", ["X", "W"], ["XW"]), helper.make_node("Add", ["XW", "B"], ["P"])]
    if shape.approximate == "sigmoid":
        alpha = initializer(np.float32(shape.alpha), dtype, "alpha")
        nodes += [helper.make_node("Mul", ["P", "alpha"], ["AP"]), helper.make_node("Sigmoid", ["AP"], ["S"]),
                  helper.make_node("Mul", ["P", "S"], ["Y"])]
        extra = [alpha]
    else:
        nodes.append(helper.make_node("Gelu", ["P"], ["Y"], approximate=shape.approximate))
        extra = []
    graph = helper.make_graph(nodes, "tune_ort_unfused", [x], [y],
                              [initializer(w_nk.T.copy(), dtype, "W"), bias, *extra])
    out["ort_unfused"] = helper.make_model(graph, ir_version=_IR_VERSION,
                                           opset_imports=[helper.make_opsetid("", _OPSET)]).SerializeToString()
    return out


def gpu_device() -> Device:
    """The GPU the CUDA provider runs on (device 0) and the versions around it; ``BadInputError`` (one line
    saying tune needs the CUDA provider and a GPU, or that the library is too old) where it cannot tune."""
    if CUDA not in ort.get_available_providers():
        raise BadInputError(f"{NEEDS}: this onnxruntime has no CUDA provider (install onnxruntime-gpu)")
    if not cuda_usable():
        raise BadInputError(f"{NEEDS}: no CUDA device found (no GPU or no driver)")
    signature = cuda_device_signature(device=0)
    probe = probe_library(providers="cuda")  # ORT's CUDA provider starts and runs the op on the GPU
    if not probe["ok"]:
        raise BadInputError(f"{NEEDS}: {probe['error']}")
    gpu = cuda_devices()[0]
    parts = dict(p.split(" ", 1) for p in signature.split("|")[2:] if " " in p)
    return Device(signature=signature, gpu=gpu["name"], compute_capability=gpu["compute_capability"],
                  cuda=parts.get("cuda", "?"), driver=cuda_driver_version(), onnxruntime=ort.__version__,
                  onnxfuse=__version__)


def _session_run(model: bytes, m: int, shape: NodeShape, label: str, *, strict: bool, provider: str) -> DeviceRun:
    # the node must run on the GPU (no quiet CPU placement); the reference may keep ORT's own placement
    session = create_session(model, provider, cpu_fallback=not strict, quiet=True, label=label)
    dtype = _BENCH_DTYPES[shape.dtype]
    run = DeviceRun(session, {"X": random_input((m, shape.k), dtype, seed=m)}, {"Y": (m, shape.n)})
    run()  # a path the library cannot take here fails now, not inside the timing loop
    return run


def path_times(shape: NodeShape, m: int, policy: TimingPolicy, provider: str = "cuda") -> PathTimes:
    """Time the fused and fallback paths, gemv where M allows it, and ORT's unfused ops at M rows,
    interleaved. A path that cannot run here (no cuBLASLt; a library without gemv) is recorded with its
    error instead of a time. (``provider="cpu"`` runs the same sessions and timing where there is no GPU;
    the CPU kernel has one path, so it only checks the measuring.)"""
    models = path_models(shape, m)
    runs, labels = [], []
    fused = _session_run(models["fused"], m, shape, f"the {OP_TYPE} node (cuda_path=fused)", strict=True,
                         provider=provider)
    runs.append(fused)
    labels.append("fused")
    notes = {} if "gemv" in models else {"gemv": gemv_not_applicable(m)}
    for key in ("fallback", "gemv", "ort_unfused"):
        if key not in models:
            continue
        try:
            runs.append(_session_run(models[key], m, shape, f"the {key} model", strict=key != "ort_unfused",
                                     provider=provider))
            labels.append(key)
        except Exception as e:  # unavailable here (no cuBLASLt or gemv; no ORT kernel for the dtype): not fatal
            notes[key] = one_line(e)
    timings = dict(zip(labels, measure(runs, policy, items=m)))
    us = {k: t.median_ms * 1e3 for k, t in timings.items()}
    return PathTimes(us["fused"], us.get("fallback"), us.get("ort_unfused"), notes.get("fallback"),
                     notes.get("ort_unfused"), us.get("gemv"), notes.get("gemv"))


def gpu_measurer(reps: int) -> tuple[Device, Measure]:
    """The device and the measuring callable ``tuning.tune_file`` uses by default."""
    device = gpu_device()
    policy = TimingPolicy(min_reps=reps)
    return device, lambda shape, m: path_times(shape, m, policy)
