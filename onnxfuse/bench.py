"""Latency and throughput of an optimized model against its baseline, and of one FusedLinearGelu op
against the hardware's ceilings.

How a number is made (the same for every model, provider and mode):

* Inputs and outputs live on the device: every input is copied there once and every output is
  pre-allocated there, then bound with IO binding, so a timed run moves no data across PCIe (and the
  addresses stay fixed, which CUDA-graph replay needs).
* Each timed call is wall clock around ``run_with_iobinding``. ONNX Runtime synchronises the CUDA
  stream at the end of every ``Run`` unless the run option ``disable_synchronize_execution_providers``
  is set; we set it to ``"0"`` explicitly, so a call returns only when the GPU is done and the time is
  the latency a caller sees.
* Warm-up runs are excluded. The models being compared take turns in short blocks (~50 ms each, A, B,
  A, B, ...), so clock boost or a noisy neighbour shifts both alike, and repetitions continue until the
  median of the first half of the samples and that of the second half agree within ``rel_tol`` (or the
  time budget runs out; the report then says the median was not stable).
* Which provider really ran each node is read from one profiled run (ORT's profiler records the
  provider per node). A ``FusedLinearGelu`` node on another provider than the one asked for raises
  ``ProviderPlacementError``: a silent CPU fallback would make every number here a lie.
"""

from __future__ import annotations

import io
import json
import math
import platform
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from . import __version__
from .domain import DOMAIN, OP_TYPE, OP_VERSION
from .compare import write_atomic
from .errors import BadInputError, ProviderPlacementError
from .inputs import input_specs, random_inputs, resolve_shapes

if TYPE_CHECKING:
    from rich.progress import Progress

SCHEMA = "onnxfuse.bench/1"
PROVIDERS = {"cuda": "CUDAExecutionProvider", "cpu": "CPUExecutionProvider"}
DTYPES = {"fp32": TensorProto.FLOAT, "fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}
_NUMPY_DTYPES = {"fp32": np.dtype(np.float32), "fp16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16)}
_BASELINE_OPSET = 20  # the first opset with a Gelu op


# --- timing ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TimingPolicy:
    """How long and how often to run. The defaults give medians that repeat within ~1-2 % on an idle
    machine; tests shrink the budget."""

    warmup_runs: int = 2  # at least this many untimed runs of each model ...
    warmup_s: float = 0.25  # ... and at least this long, so GPU clocks have ramped up before we time
    min_reps: int = 30
    max_reps: int = 100_000
    budget_s: float = 3.0  # per group of interleaved models, warm-up excluded
    rel_tol: float = 0.01  # the two halves' medians must agree this closely
    block_s: float = 0.05  # each model runs this long before the next one takes its turn


@dataclass(frozen=True)
class Timing:
    """Statistics of one model at one batch size, in milliseconds."""

    median_ms: float
    p90_ms: float
    mean_ms: float
    min_ms: float
    reps: int
    stable: bool  # False: the time budget ran out before the median settled
    items: int  # items (batch rows) per run, for throughput

    @property
    def throughput(self) -> float:
        """Items per second at the median latency."""
        return self.items / (self.median_ms / 1e3)

    def to_dict(self) -> dict:
        return {**asdict(self), "throughput_per_s": self.throughput}


def measure(runs: Sequence[Callable[[], object]], policy: TimingPolicy, items: int = 1) -> list[Timing]:
    """Time each callable after a warm-up; one ``Timing`` per callable.

    The callables take turns in short blocks (about ``policy.block_s`` each) rather than single runs:
    after a run, ORT's CPU thread pool keeps spinning for a moment, and strict alternation would make
    each session pay for the other's spinning. The first run of a block is not timed when the block
    has room for it."""
    clock = time.perf_counter
    warm_end = clock() + policy.warmup_s
    warm: list[list[float]] = [[] for _ in runs]
    while len(warm[0]) < policy.warmup_runs or clock() < warm_end:
        for run, out in zip(runs, warm):
            start = clock()
            run()
            out.append(clock() - start)
    # the median warm-up run (the last ones, once warm) sizes each block; one slow outlier must not
    block = [max(1, min(1000, int(policy.block_s / max(statistics.median(w[len(w) // 2 :]), 1e-7)))) for w in warm]

    samples: list[list[float]] = [[] for _ in runs]
    deadline = clock() + policy.budget_s
    while True:
        for run, out, reps in zip(runs, samples, block):
            if reps >= 4:
                run()  # re-warm after the other callable's block
            for _ in range(reps):
                start = clock()
                run()
                out.append(clock() - start)
        n = min(len(s) for s in samples)
        out_of_time = clock() > deadline or n >= policy.max_reps
        if n >= policy.min_reps or out_of_time:
            stable = [_halves_agree(s, policy.rel_tol) for s in samples]
            if all(stable) or out_of_time:
                break
    return [_summarise(s, ok, items) for s, ok in zip(samples, stable)]


def _halves_agree(samples: list[float], rel_tol: float) -> bool:
    half = len(samples) // 2
    if half < 2:
        return False
    first, second = statistics.median(samples[:half]), statistics.median(samples[half:])
    return abs(first - second) <= rel_tol * statistics.median(samples)


def _summarise(samples: list[float], stable: bool, items: int) -> Timing:
    ms = np.asarray(samples) * 1e3
    return Timing(
        median_ms=float(np.median(ms)),
        p90_ms=float(np.percentile(ms, 90)),
        mean_ms=float(ms.mean()),
        min_ms=float(ms.min()),
        reps=len(samples),
        stable=stable,
        items=items,
    )


# --- sessions, device-bound runs and node placement --------------------------------------------------


def _provider_name(provider: str) -> str:
    try:
        return PROVIDERS[provider]
    except KeyError:
        raise BadInputError(f"--provider {provider!r}: choose one of {', '.join(PROVIDERS)}") from None


def open_session(model: str | bytes, provider: str, *, cuda_graph: bool = False, profile_dir: str | None = None,
                 label: str | None = None, library_path: str | None = None):
    """An InferenceSession with onnxfuse's custom ops, on ``provider`` ('cuda' or 'cpu'). Raises
    ``BadInputError`` when ORT cannot use that provider here (rather than quietly running on CPU);
    ``label`` names a model given as bytes in that message; ``library_path`` picks another build of the op
    library than the installed one (two builds can serve two sessions of one process)."""
    from .runtime import create_session, cuda_usable

    wanted = _provider_name(provider)
    if cuda_graph and provider != "cuda":
        raise BadInputError("--cuda-graph needs --provider cuda")
    options = ort.SessionOptions()
    if profile_dir is not None:
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(profile_dir) / "onnxfuse_profile")
    if provider == "cuda":
        if not cuda_usable():
            raise BadInputError(
                "--provider cuda: ONNX Runtime cannot use the CUDA execution provider here (no GPU or no CUDA "
                "driver found); run with --provider cpu"
            )
        cuda_options = {"device_id": "0"}
        if cuda_graph:
            cuda_options["enable_cuda_graph"] = "1"
        providers = [(wanted, cuda_options), "CPUExecutionProvider"]  # CPU only for what CUDA cannot run
    else:
        providers = [wanted]
    try:
        session = create_session(model, providers=providers, sess_options=options, library_path=library_path)
    except BadInputError as e:
        if label is None:
            raise
        raise BadInputError(f"{label}: {e}") from e
    if wanted not in session.get_providers():
        raise BadInputError(
            f"--provider {provider}: ONNX Runtime cannot use {wanted} here (no GPU, or its CUDA/cuDNN "
            f"libraries are missing); available: {', '.join(session.get_providers())}"
        )
    return session


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def _elem_type(type_string: str) -> int:
    """'tensor(float16)' (ORT's spelling) -> TensorProto.FLOAT16."""
    return TensorProto.DataType.Value(type_string[len("tensor(") : -1].upper())


def _to_device(array: np.ndarray, device: str) -> ort.OrtValue:
    elem = helper.np_dtype_to_tensor_dtype(array.dtype)
    value = ort.OrtValue.ortvalue_from_shape_and_type(list(array.shape), elem, device, 0)
    # numpy has no bfloat16: hand ORT the raw 16-bit patterns
    value.update_inplace(np.ascontiguousarray(array.view(np.uint16) if elem == TensorProto.BFLOAT16 else array))
    return value


def _bind_inputs(binding, feeds: dict[str, np.ndarray], device: str) -> list[ort.OrtValue]:
    """Copy each input to ``device`` once and bind it; returns the OrtValues, which the caller keeps."""
    values = []
    for name, array in feeds.items():
        values.append(_to_device(array, device))
        binding.bind_ortvalue_input(name, values[-1])
    return values


class DeviceRun:
    """One session with its inputs and outputs bound on its device; calling it runs the model once."""

    def __init__(self, session, feeds: dict[str, np.ndarray], output_shapes: dict[str, tuple[int, ...]]):
        device = "cuda" if session.get_providers()[0] == PROVIDERS["cuda"] else "cpu"
        self.session = session
        self.binding = session.io_binding()
        self._keep = _bind_inputs(self.binding, feeds, device)  # OrtValues must outlive the binding
        for out in session.get_outputs():
            value = ort.OrtValue.ortvalue_from_shape_and_type(list(output_shapes[out.name]), _elem_type(out.type), device, 0)
            self._keep.append(value)
            self.binding.bind_ortvalue_output(out.name, value)
        self.run_options = ort.RunOptions()
        self.run_options.add_run_config_entry("disable_synchronize_execution_providers", "0")

    def __call__(self) -> None:
        self.session.run_with_iobinding(self.binding, self.run_options)


def output_shapes(session, feeds: dict[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    """Run once with outputs allocated by ORT, to learn their shapes for these inputs."""
    device = "cuda" if session.get_providers()[0] == PROVIDERS["cuda"] else "cpu"
    binding = session.io_binding()
    keep = _bind_inputs(binding, feeds, device)  # noqa: F841  (alive until the run is over)
    names = [o.name for o in session.get_outputs()]
    for name in names:
        binding.bind_output(name, device)
    try:
        session.run_with_iobinding(binding)
    except Exception as e:
        raise BadInputError(f"the model does not run on these inputs: {_first_line(e)}") from e
    return {name: tuple(v.shape()) for name, v in zip(names, binding.get_outputs())}


@dataclass
class Placement:
    """Which execution provider ran which node, read from ORT's profiler."""

    requested: str  # e.g. CUDAExecutionProvider
    by_provider: dict[str, int]
    by_op: dict[str, dict[str, int]]
    elsewhere: list[dict[str, str]]  # nodes that ran on another provider than requested

    @property
    def fused_nodes(self) -> int:
        return sum(self.by_op.get(OP_TYPE, {}).values())

    def fused_elsewhere(self) -> list[dict[str, str]]:
        return [n for n in self.elsewhere if n["op"] == OP_TYPE]

    def check_fused(self) -> None:
        """Raise ``ProviderPlacementError`` if any FusedLinearGelu node ran elsewhere than requested."""
        misplaced = self.fused_elsewhere()
        if misplaced:
            where = Counter(_short(n["provider"]) for n in misplaced)
            raise ProviderPlacementError(
                f"{len(misplaced)} of {self.fused_nodes} {OP_TYPE} nodes ran on {', '.join(where)} instead of "
                f"{_short(self.requested)} (e.g. '{misplaced[0]['node']}'): the op library has no "
                f"{_short(self.requested)} kernel for them"
            )

    def summary(self) -> str:
        """'212 nodes: 200 CUDA, 12 CPU (Shape×6, Gather×4, ...)'"""
        total = sum(self.by_provider.values())
        parts = [f"{n} {_short(p)}" for p, n in sorted(self.by_provider.items(), key=lambda kv: -kv[1])]
        text = f"{total} node{'' if total == 1 else 's'}: {', '.join(parts)}"
        if self.elsewhere:
            ops = Counter(n["op"] for n in self.elsewhere)
            listed = ", ".join(f"{op}×{k}" for op, k in ops.most_common(6))
            text += f" (not on {_short(self.requested)}: {listed}{', ...' if len(ops) > 6 else ''})"
        return text

    def to_dict(self) -> dict:
        return {**asdict(self), "fused_nodes": self.fused_nodes}


def _short(provider: str) -> str:
    return provider.replace("ExecutionProvider", "")


def read_placement(profile_file: str, requested: str) -> Placement:
    """Parse one ORT profile (Chrome trace JSON): every ``Node`` event carries ``op_name`` and
    ``provider``. A node run several times is counted once."""
    with open(profile_file) as f:
        events = json.load(f)
    seen: dict[str, tuple[str, str]] = {}
    for event in events:
        args, name = event.get("args") or {}, event.get("name", "")
        # one "<node>_kernel_time" event per node run; fence events, if any, would count a node twice
        if event.get("cat") != "Node" or not name.endswith("_kernel_time") or "provider" not in args:
            continue
        seen[name.removesuffix("_kernel_time")] = (args.get("op_name", "?"), args["provider"])
    by_provider = Counter(p for _, p in seen.values())
    by_op: dict[str, dict[str, int]] = {}
    for op, provider in seen.values():
        by_op.setdefault(op, {}).setdefault(provider, 0)
        by_op[op][provider] += 1
    elsewhere = [{"node": n, "op": op, "provider": p} for n, (op, p) in sorted(seen.items()) if p != requested]
    return Placement(requested, dict(by_provider), by_op, elsewhere)


def profile_placement(model: str | bytes, provider: str, feeds: dict[str, np.ndarray], label: str | None = None) -> Placement:
    """Run the model once under ORT's profiler and report where each node ran. Fails with
    ``ProviderPlacementError`` if a FusedLinearGelu node ran on another provider than requested."""
    with tempfile.TemporaryDirectory(prefix="onnxfuse-profile-") as tmp:
        session = open_session(model, provider, profile_dir=tmp, label=label)
        output_shapes(session, feeds)
        profile_file = session.end_profiling()
        placement = read_placement(profile_file, _provider_name(provider))
    placement.check_fused()
    return placement


# --- model mode: optimized vs baseline over batch sizes ------------------------------------------------


@dataclass
class BatchResult:
    batch: int
    shapes: dict[str, tuple[int, ...]]
    optimized: Timing
    baseline: Timing | None

    @property
    def speedup(self) -> float | None:
        """Baseline latency ÷ optimized latency (medians): > 1 means the optimized model is faster."""
        return None if self.baseline is None else self.baseline.median_ms / self.optimized.median_ms

    def to_dict(self) -> dict:
        return {
            "batch": self.batch,
            "shapes": {k: list(v) for k, v in self.shapes.items()},
            "optimized": self.optimized.to_dict(),
            "baseline": None if self.baseline is None else self.baseline.to_dict(),
            "speedup": self.speedup,
        }


@dataclass
class ModelBenchReport:
    optimized: str
    baseline: str | None
    provider: str
    cuda_graph: bool
    policy: TimingPolicy
    placement: dict[str, Placement]  # "optimized"/"baseline" -> placement
    results: list[BatchResult] = field(default_factory=list)
    exit_code: int = 0

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA,
            "mode": "model",
            "provider": self.provider,
            "cuda_graph": self.cuda_graph,
            "models": {"optimized": self.optimized, "baseline": self.baseline},
            "placement": {k: v.to_dict() for k, v in self.placement.items()},
            "policy": asdict(self.policy),
            "results": [r.to_dict() for r in self.results],
            "environment": environment(),
        }


def environment() -> dict:
    return {
        "onnxfuse": __version__,
        "onnxruntime": ort.__version__,
        "onnx": onnx.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
    }


def batch_shapes(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]], batches: Sequence[int] | None) -> list[tuple[int, dict]]:
    """For each batch size, the concrete input shapes: ``shapes`` (from ``--shape``) and the defaults of
    ``onnxfuse.inputs`` fix every dynamic dim; the batch size then replaces axis 0 of every input whose
    axis 0 is dynamic in the model. Without ``batches``: the one resolved batch."""
    specs = input_specs(model)
    resolved = resolve_shapes(specs, shapes)
    batched = [s for s in specs if s.shape and not isinstance(s.shape[0], int)]
    if not batches:
        first = next(iter(resolved.values()), ())
        return [(first[0] if first else 1, resolved)]
    if any(b < 1 for b in batches):
        raise BadInputError(f"--batch {','.join(map(str, batches))}: batch sizes must be ≥ 1")
    if not batched:
        raise BadInputError(
            "--batch: no input of the model has a dynamic axis 0 "
            f"({', '.join(s.describe() for s in specs)}); its batch size is fixed"
        )
    out = []
    for b in dict.fromkeys(batches):  # each size once, in the order given
        shaped = {
            name: ((b,) + dims[1:] if any(s.name == name for s in batched) else dims) for name, dims in resolved.items()
        }
        out.append((b, shaped))
    return out


def _load_for_specs(path: str) -> onnx.ModelProto:
    """The graph without external weights: enough for input specs and embedding-table sizes. Read and
    checked by ``model_io.load_model`` (empty, truncated, a folder, a git-LFS pointer, missing external data:
    each one line)."""
    from . import model_io

    return model_io.load_model(path)


def bench_models(
    optimized: str,
    baseline: str | None = None,
    *,
    provider: str = "cuda",
    shapes: dict[str, tuple[int, ...]] | None = None,
    batches: Sequence[int] | None = None,
    cuda_graph: bool = False,
    policy: TimingPolicy = TimingPolicy(),
    seed: int = 0,
    progress: Progress | None = None,
) -> ModelBenchReport:
    """Latency of ``optimized`` (and ``baseline``, interleaved with it) at each batch size, on
    ``provider``. Both models get the same inputs, which must fit both."""
    paths = {"optimized": optimized} | ({"baseline": baseline} if baseline else {})
    protos = {role: _load_for_specs(p) for role, p in paths.items()}
    plan = batch_shapes(protos["optimized"], shapes or {}, batches)
    if baseline:
        _check_same_inputs(protos["optimized"], protos["baseline"])
    feeds = {b: random_inputs(protos["optimized"], s, seed=seed) for b, s in plan}

    step = _Steps(progress, ["placement"] + [f"batch {b}" for b, _ in plan])
    placement = {role: profile_placement(p, provider, feeds[plan[0][0]]) for role, p in paths.items()}
    report = ModelBenchReport(optimized, baseline, provider, cuda_graph, policy, placement)
    step()
    # One plain session per model learns the output shapes of every batch size and, without CUDA
    # graphs, also serves the timed runs; a captured CUDA graph is tied to its shapes and addresses, so
    # with graphs each batch size gets a session of its own.
    plain = {role: open_session(p, provider) for role, p in paths.items()}
    for b, batch_input_shapes in plan:
        runs = []
        for role, path in paths.items():
            session = open_session(path, provider, cuda_graph=True) if cuda_graph else plain[role]
            runs.append(DeviceRun(session, feeds[b], output_shapes(plain[role], feeds[b])))
        timings = measure(runs, policy, items=b)
        report.results.append(BatchResult(b, batch_input_shapes, timings[0], timings[1] if baseline else None))
        step()
    return report


def _check_same_inputs(optimized: onnx.ModelProto, baseline: onnx.ModelProto) -> None:
    a = {s.name: s.elem_type for s in input_specs(optimized)}
    b = {s.name: s.elem_type for s in input_specs(baseline)}
    if a != b:
        raise BadInputError(
            "the baseline takes other inputs than the optimized model "
            f"({sorted(b.items())} vs {sorted(a.items())}): compare a model with its own optimized version"
        )


# --- op mode: one FusedLinearGelu against the unfused ONNX ops and the hardware's ceilings -----------------


def parse_op(text: str) -> tuple[int, int, int]:
    """'1024,768,3072' (or 1024x768x3072) -> (M, K, N)."""
    try:
        dims = tuple(int(d) for d in text.replace("x", ",").replace("×", ",").split(","))
    except ValueError:
        dims = ()
    if len(dims) != 3 or min(dims) < 1:
        raise BadInputError(f"--op {text!r}: expected M,K,N as three positive integers, e.g. 1024,768,3072")
    return dims  # type: ignore[return-value]


def _array(values: np.ndarray, dtype: str, name: str) -> onnx.TensorProto:
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
        helper.make_graph([fused_node], "fused_linear_gelu", [x], [y], [_array(w_nk, dtype, "W"), _array(bias, dtype, "B")]),
        opset_imports=[helper.make_opsetid("", _BASELINE_OPSET), helper.make_opsetid(DOMAIN, OP_VERSION)],
    )
    unfused_nodes = [
        helper.make_node("MatMul", ["X", "W"], ["XW"], name="matmul"),
        helper.make_node("Add", ["XW", "B"], ["XWB"], name="add"),
        helper.make_node("Gelu", ["XWB"], ["Y"], name="gelu", approximate=approximate),
    ]
    unfused = helper.make_model(
        helper.make_graph(unfused_nodes, "linear_gelu", [x], [y], [_array(w_nk.T.copy(), dtype, "W"), _array(bias, dtype, "B")]),
        opset_imports=[helper.make_opsetid("", _BASELINE_OPSET)],
    )
    for model in (fused, unfused):
        model.ir_version = 9  # what ORT 1.20+ reads; newer onnx would write a newer one
    return fused, unfused


def _random_input(shape: tuple[int, ...], dtype: str, seed: int) -> np.ndarray:
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
        w = _array(np.random.default_rng(1).standard_normal((c, c), dtype=np.float32) / np.sqrt(c), dtype, "W")
        model = helper.make_model(
            helper.make_graph([helper.make_node("MatMul", ["X", "W"], ["Y"])], "gemm", [x], [y], [w]),
            opset_imports=[helper.make_opsetid("", _BASELINE_OPSET)],
        )
        model.ir_version = 9
        session = open_session(model.SerializeToString(), provider)
        run = DeviceRun(session, {"X": _random_input((c, c), dtype, 2)}, {"Y": (c, c)})
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
        session = open_session(model.SerializeToString(), provider)
        run = DeviceRun(session, {"X": _random_input((elems,), "fp32", 3)}, {"Y": (elems,)})
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
    x = {"X": _random_input((m, k), dtype, seed=4)}
    step = _Steps(progress, ["placement", "fused vs unfused", "ceilings"])
    placement = profile_placement(fused, provider, x, label=f"the fused {OP_TYPE} model")
    if placement.fused_nodes != 1:
        raise ProviderPlacementError(f"the profiler saw {placement.fused_nodes} {OP_TYPE} nodes run, expected 1")
    step()
    runs = [
        DeviceRun(open_session(model, provider, cuda_graph=cuda_graph, label=label), x, {"Y": (m, n)})
        for model, label in ((fused, f"the fused {OP_TYPE} model"), (unfused, "the unfused MatMul+Add+Gelu model"))
    ]
    t_fused, t_unfused = measure(runs, policy)
    step()
    ceilings = measure_ceilings(provider, dtype, policy, peak_tflops, peak_gbps)
    step()
    flops, nbytes = op_cost(m, k, n, dtype)
    fused_point, unfused_point = (_on_roofline(t, flops, nbytes, ceilings) for t in (t_fused, t_unfused))
    return OpBenchReport(m, k, n, dtype, approximate, provider, cuda_graph, policy, ceilings, fused_point, unfused_point, placement)


class _Steps:
    """Advance a rich progress bar through named steps (or do nothing without one)."""

    def __init__(self, progress, names: list[str]):
        self.progress, self.names, self.done = progress, names, 0
        self.task = progress.add_task(names[0], total=len(names)) if progress else None

    def __call__(self) -> None:
        self.done += 1
        if self.progress:
            following = self.names[self.done] if self.done < len(self.names) else "done"
            self.progress.update(self.task, advance=1, description=following)


def _on_roofline(t: Timing, flops: int, nbytes: int, ceilings: Ceilings) -> OpTiming:
    seconds = t.median_ms / 1e3
    best = max(flops / (ceilings.tflops * 1e12), nbytes / (ceilings.gbps * 1e9))
    return OpTiming(t, flops / seconds / 1e12, nbytes / seconds / 1e9, best / seconds)


# --- plot --------------------------------------------------------------------------------------------------


_LABEL_BOX = {"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1}  # keeps values legible over lines


def write_plot(report: ModelBenchReport, path: str | Path, title: str | None = None) -> Path:
    """PNG: median latency of both models vs batch size (log scale, whiskers to p90, values written
    beside the points) and, with a baseline, the speedup per batch size."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    path = Path(path)
    if path.suffix.lower() != ".png":
        raise BadInputError(f"--plot {path}: the chart is a PNG; name the file *.png")
    batches = [r.batch for r in report.results]
    xs = np.arange(len(batches))  # evenly spaced: batch sizes are usually powers of two or 1, 8, 32
    has_baseline = bool(report.results) and report.results[0].baseline is not None
    fig, axes = plt.subplots(1, 2 if has_baseline else 1, figsize=(11 if has_baseline else 6, 4.4), squeeze=False)
    ax = axes[0][0]
    series = [(f"optimized: {Path(report.optimized).name}", "optimized", "#1f77b4", "o")]
    if has_baseline:
        series.append((f"baseline: {Path(report.baseline).name}", "baseline", "#ff7f0e", "s"))
    medians = {role: np.array([getattr(r, role).median_ms for r in report.results]) for _, role, _, _ in series}
    highest = np.max(np.stack(list(medians.values())), axis=0)
    for label, role, color, marker in series:
        med = medians[role]
        p90 = np.array([getattr(r, role).p90_ms for r in report.results])
        ax.errorbar(xs, med, yerr=[np.zeros_like(med), p90 - med], color=color, marker=marker, capsize=3,
                    linewidth=1.8, label=label)
        for x, v, top in zip(xs, med, highest):
            # the slower model's value above its point, the faster one's below: the labels never collide
            ax.annotate(f"{v:.3g}", (x, v), textcoords="offset points", xytext=(7, 3 if v >= top else -11),
                        fontsize=8, color=color, bbox=_LABEL_BOX)
    ax.set_yscale("log")  # batch 1 and batch 32 differ by orders of magnitude
    ax.set_xticks(xs, [str(b) for b in batches])
    ax.set_xlabel("batch size")
    ax.set_ylabel("latency, ms (median; whisker to p90)")
    ax.set_title("Latency (lower is better)")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(which="both", axis="y", alpha=0.3)
    ax.set_xlim(-0.5, len(xs) - 0.5)
    if has_baseline:
        ax = axes[0][1]
        speedups = np.array([r.speedup for r in report.results])
        colors = ["#2ca02c" if s >= 1 else "#d62728" for s in speedups]
        bars = ax.bar(xs, speedups, 0.6, color=colors)
        ax.bar_label(bars, labels=[f"{s:.2f}×" for s in speedups], fontsize=9, padding=3, bbox=_LABEL_BOX)
        ax.axhline(1.0, color="black", linewidth=1, linestyle="--", zorder=0)
        ax.set_xticks(xs, [str(b) for b in batches])
        ax.set_xlabel("batch size")
        ax.set_ylabel("speedup = baseline ÷ optimized latency")
        ax.set_title("Speedup (above 1: optimized is faster)")
        ax.set_ylim(0, max(1.2, float(speedups.max()) * 1.15))
        ax.grid(axis="y", alpha=0.3)
    provider = _short(PROVIDERS[report.provider]) + (" + CUDA graph" if report.cuda_graph else "")
    fig.suptitle(title or f"{Path(report.optimized).name} on {provider}")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=120, format="png")
    plt.close(fig)
    write_atomic(path, buffer.getvalue())  # a reader never sees half a PNG
    return path


def write_json(data: dict, path: str | Path) -> Path:
    """Atomically write ``data`` as indented JSON."""
    path = Path(path)
    write_atomic(path, (json.dumps(data, indent=2, default=_jsonable) + "\n").encode())
    return path


def _jsonable(value):
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
