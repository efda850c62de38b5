"""Opening ONNX Runtime sessions with onnxfuse's op library registered.

    get_library_path()      where ``libonnxfuse_ops.so`` is (``ONNXFUSE_LIBRARY`` overrides)
    session_options()       an ``onnxruntime.SessionOptions`` with the library registered
    create_session(model)   the one way onnxfuse opens a session (bench, compare, doctor and users): on CUDA
                            when it is usable, else on the CPU; options for CUDA graphs, profiling, the
                            model as written (ORT's rewrites off) and no CPU fallback
    PROVIDERS               "cpu" / "cuda" -> ONNX Runtime's providers list
    resolve_providers(spec) "auto" | "cpu" | "cuda" | explicit ORT provider names -> the providers list
    cuda_device_count()     how many CUDA devices the driver sees (0 without a driver or a GPU)
    probe_library(path)     open a tiny session that runs the op: does the library really work here?

Every failure the user can fix (no library, a library that does not load, a missing model, a provider that
is not usable) is a ``BadInputError`` with one line that says what to do, worded here once.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.metadata
import os
import tempfile
from pathlib import Path
from typing import Any, Sequence, Union

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from .domain import DOMAIN, OP_TYPE, DOMAIN_VERSION
from .errors import BadInputError, one_line
from .implied_opsets import canonical

LIBRARY_ENV = "ONNXFUSE_LIBRARY"
LIBRARY_NAME = "libonnxfuse_ops.so"
CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"

# ORT reads models up to this IR version; onnx's helper writes a newer one by default.
_IR_VERSION = 10
_OPSET = 20

ModelLike = Union[str, os.PathLike, bytes, onnx.ModelProto]
ProviderSpec = Union[None, str, Sequence[Union[str, tuple]]]

# The provider names people type, and the providers list ONNX Runtime gets for each: the first is the one
# asked for. CPU stays listed after CUDA for what CUDA has no kernel for (ORT places shape computations on
# the CPU even in a CUDA session).
PROVIDERS: dict[str, list[str]] = {"cpu": [CPU], "cuda": [CUDA, CPU]}

_FIX = "build it with `pip install -e .` in the onnxfuse checkout, or point ONNXFUSE_LIBRARY at a built libonnxfuse_ops.so"


# --- the library --------------------------------------------------------------------------------------


def _installed_library() -> Path | None:
    """The library inside the installed package: next to this file in a regular install, or in
    site-packages when the package is an editable install whose Python sources stay in the checkout."""
    beside = Path(__file__).resolve().parent / "lib" / LIBRARY_NAME
    if beside.is_file():
        return beside
    try:
        dist = importlib.metadata.distribution("onnxfuse")
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in dist.files or ():
        if f.name == LIBRARY_NAME:
            located = Path(dist.locate_file(f)).resolve()
            if located.is_file():
                return located
    return None


@functools.lru_cache(maxsize=None)
def _preload_blas() -> None:
    """Load the OpenBLAS the CPU kernel links against, globally, before ORT dlopens the library.

    The library's RUNPATH finds it in an installed layout; this makes a library from any other place
    (a build tree, ``ONNXFUSE_LIBRARY``) load too. Harmless when the BLAS package is absent: the
    library's own RUNPATH then has the last word and a failure names the missing file."""
    try:
        import scipy_openblas32
    except ImportError:
        return
    blas = Path(scipy_openblas32.get_lib_dir()) / f"lib{scipy_openblas32.get_library()}.so"
    if blas.is_file():
        ctypes.CDLL(str(blas), mode=ctypes.RTLD_GLOBAL)


def get_library_path() -> str:
    """Absolute path of ``libonnxfuse_ops.so``, ready for ``SessionOptions.register_custom_ops_library``.

    ``ONNXFUSE_LIBRARY`` overrides the installed copy. Raises ``BadInputError`` when there is none."""
    override = os.environ.get(LIBRARY_ENV)
    if override:
        path = Path(override).expanduser()
        if not path.is_file():
            raise BadInputError(f"{LIBRARY_ENV}={override} is not a file; unset it or point it at a built {LIBRARY_NAME}")
        path = path.resolve()
    else:
        found = _installed_library()
        if found is None:
            raise BadInputError(f"the onnxfuse op library ({LIBRARY_NAME}) is not installed; {_FIX}")
        path = found
    _preload_blas()
    return str(path)


def session_options(
    library_path: str | None = None,
    intra_op_num_threads: int | None = None,
    graph_optimization_level: ort.GraphOptimizationLevel | None = None,
) -> ort.SessionOptions:
    """``SessionOptions`` with the op library registered (``BadInputError`` when it will not load)."""
    so = ort.SessionOptions()
    if intra_op_num_threads is not None:
        so.intra_op_num_threads = int(intra_op_num_threads)
    if graph_optimization_level is not None:
        so.graph_optimization_level = graph_optimization_level
    register_library(so, library_path)
    return so


def register_library(so: ort.SessionOptions, library_path: str | None = None) -> None:
    """Register the op library with existing ``SessionOptions``."""
    path = library_path or get_library_path()
    if library_path:
        _preload_blas()
    try:
        so.register_custom_ops_library(path)
    except Exception as e:  # ORT raises its own Fail/RuntimeError types with the dlopen message
        raise BadInputError(f"cannot load the op library {path}: {one_line(e)}") from e


def onnxruntime_load_error(model: onnx.ModelProto, source: str | None = None, *,
                           base_dir: str | None = None) -> str | None:
    """Why ONNX Runtime cannot load ``model`` (None if it can): the judge of inputs ``onnx.checker`` rejects,
    since what ORT runs is what users run (``model_io.load_model`` asks it through its
    ``runtime_load_error``). ``source`` is the model's file, where ORT reads the weights from; without one the
    serialized ``model`` is loaded, its external data looked for in ``base_dir``. Graph optimizations are
    off: only whether the model is loadable is asked; a model importing the FusedLinearGelu domain is loaded
    with the op library registered. (ORT reads the weights to load a model: this runs only for the rare
    input the checker rejects.)"""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4
    try:
        if any(o.domain == DOMAIN for o in model.opset_import):
            register_library(so)
        if source is None and base_dir is not None:
            so.add_session_config_entry("session.model_external_initializers_file_folder_path", base_dir)
        ort.InferenceSession(model.SerializeToString() if source is None else source, so,
                             providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - every way ORT refuses a model is an answer here
        return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return None


# (a domain ORT does not know: the probe model must import something; an IR version every supported ORT reads)
_PROBE_DOMAIN = "ai.onnxfuse.probe"
_PROBE_IR_VERSION = 8


@functools.lru_cache(maxsize=1)
def ort_implied_opsets() -> dict[str, int]:
    """{domain: version} that the installed ONNX Runtime imports by itself into a model that uses the domain
    without importing it (``implied_opsets`` says why this is asked, not tabled; {} if ORT cannot tell: every
    undeclared domain is then refused). A model with no node is loaded with graph optimizations off and the
    opset imports ORT writes back (``optimized_model_filepath``) are read."""
    graph = helper.make_graph([], "probe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(_PROBE_DOMAIN, 1)])
    model.ir_version = _PROBE_IR_VERSION
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4
    with tempfile.TemporaryDirectory(prefix="onnxfuse-opsets-") as tmp:
        so.optimized_model_filepath = os.path.join(tmp, "probe.onnx")
        try:
            ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
            written = onnx.load_model(so.optimized_model_filepath, load_external_data=False)
        except Exception:  # noqa: BLE001 - an ORT that cannot say: nothing is assumed
            return {}
    return {canonical(o.domain): int(o.version) for o in written.opset_import if o.domain != _PROBE_DOMAIN}


def load_probes() -> dict:
    """What ``model_io.load_model`` / ``validate_model`` ask ONNX Runtime, as their keyword arguments: whether
    ORT loads a model ``onnx.checker`` rejects, and the opset versions ORT assumes for domains a model uses
    without importing them. A model ORT loads is a model onnxfuse takes."""
    return {"runtime_load_error": onnxruntime_load_error, "implied_opsets": ort_implied_opsets}


# --- providers -----------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def cuda_device_count() -> int:
    """CUDA devices visible through the driver; 0 when there is no libcuda or no GPU.

    Asks libcuda directly: ``onnxruntime-gpu`` lists the CUDA provider as available on any machine, and
    a session on a machine without a GPU silently falls back to the CPU."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


def cuda_devices() -> list[dict[str, Any]]:
    """Name, compute capability and memory of each CUDA device, straight from libcuda ([] without one)."""
    if cuda_device_count() == 0:
        return []
    cuda = ctypes.CDLL("libcuda.so.1")
    out = []
    for i in range(cuda_device_count()):
        dev = ctypes.c_int(0)
        if cuda.cuDeviceGet(ctypes.byref(dev), i) != 0:
            continue
        name = ctypes.create_string_buffer(256)
        cuda.cuDeviceGetName(name, 256, dev)
        major, minor = ctypes.c_int(0), ctypes.c_int(0)
        cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, dev)  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
        cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev)  # ..._MINOR
        mem = ctypes.c_size_t(0)
        cuda.cuDeviceTotalMem_v2(ctypes.byref(mem), dev)
        out.append(
            {
                "index": i,
                "name": name.value.decode(errors="replace"),
                "compute_capability": f"{major.value}.{minor.value}",
                "memory_gib": round(mem.value / 2**30, 1),
            }
        )
    return out


def cuda_driver_version() -> str | None:
    """The CUDA version the driver supports, as "major.minor" (libcuda's ``cuDriverGetVersion``); None
    without a driver."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    version = ctypes.c_int(0)
    if cuda.cuDriverGetVersion(ctypes.byref(version)) != 0:
        return None
    return f"{version.value // 1000}.{version.value % 1000 // 10}"


SIGNATURE_SYMBOL = "OnnxfuseCudaDeviceSignature"


def cuda_device_signature(library_path: str | None = None, device: int = 0) -> str:
    """The device signature the op library computes for CUDA device ``device`` — "<GPU name>|sm_<major><minor>|
    cuda <cudart major.minor>|onnxfuse <library version>" — through its exported
    ``OnnxfuseCudaDeviceSignature``: the very string its kernels compare a node's ``tuned_device`` with, so
    Python never re-derives it. ``BadInputError`` when the library predates the symbol, or reports no CUDA
    device (a CPU-only build, or no GPU)."""
    path = library_path or get_library_path()
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise BadInputError(f"cannot load the op library {path}: {one_line(e)}") from e
    try:
        query = getattr(lib, SIGNATURE_SYMBOL)
    except AttributeError:
        raise BadInputError(f"the op library {path} is too old: it has no {SIGNATURE_SYMBOL} (built before "
                            f"per-node CUDA path tuning); rebuild it: {_FIX}") from None
    query.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
    query.restype = ctypes.c_int
    buf = ctypes.create_string_buffer(512)
    if query(int(device), buf, len(buf)) != 0:
        raise BadInputError(f"the op library {path} reports no CUDA device {device} (a CPU-only build, or no "
                            "GPU): tuning needs CUDAExecutionProvider and a GPU")
    return buf.value.decode(errors="replace")


def cuda_usable() -> bool:
    """True when ORT has the CUDA provider and the driver sees a GPU."""
    return CUDA in ort.get_available_providers() and cuda_device_count() > 0


def cuda_not_usable(why: str) -> BadInputError:
    """The one error for "CUDA was asked for and cannot be had": never a quiet fallback to the CPU, which
    would make every number measured on it a lie."""
    return BadInputError(f"the CUDA provider was asked for but is not usable here ({why}); "
                         "use the CPU provider (--provider cpu)")


def cuda_unusable_reason() -> str | None:
    """Why CUDA cannot be used here (for errors and for the GPU tests' skip reasons), or None when it can."""
    if CUDA not in ort.get_available_providers():
        return "this onnxruntime has no CUDA provider (install onnxruntime-gpu)"
    if cuda_device_count() == 0:
        return "no CUDA device found: no GPU or no driver"
    return None


def provider_list(name: str) -> list[str]:
    """``PROVIDERS[name]``, checked: ``BadInputError`` for another name, and for ``cuda`` where CUDA is not
    usable."""
    if name not in PROVIDERS:
        raise BadInputError(f"unknown provider '{name}': use {' or '.join(PROVIDERS)}")
    if CUDA in PROVIDERS[name] and not cuda_usable():
        raise cuda_not_usable(cuda_unusable_reason())
    return list(PROVIDERS[name])


def short_name(provider: str) -> str:
    """CUDAExecutionProvider -> CUDA: how reports name a provider to people."""
    return provider.replace("ExecutionProvider", "")


def _name_of(entry: str | tuple) -> str:
    return entry[0] if isinstance(entry, tuple) else entry


def resolve_providers(spec: ProviderSpec = None) -> list:
    """Turn a provider choice into ORT's providers list.

    ``None``/``"auto"``: CUDA (then CPU) when usable, else CPU. ``"cpu"``/``"cuda"`` (any case):
    ``PROVIDERS`` (see ``provider_list``). A list is passed through after checking the names."""
    if spec is None or (isinstance(spec, str) and spec.lower() == "auto"):
        return list(PROVIDERS["cuda"]) if cuda_usable() else list(PROVIDERS["cpu"])
    if isinstance(spec, str):
        return provider_list(spec.lower())
    available = set(ort.get_available_providers())
    out = []
    for p in spec:
        name = _name_of(p)
        if name not in available:
            raise BadInputError(f"provider {name} is not available in this onnxruntime ({', '.join(sorted(available))})")
        if name == CUDA and cuda_device_count() == 0:
            raise cuda_not_usable(cuda_unusable_reason())
        out.append(p)
    return out


# --- sessions -------------------------------------------------------------------------------------------


def preload_cuda_libraries() -> None:
    """Let ORT find the CUDA/cuDNN libraries that ship as pip packages (e.g. with torch) before a CUDA
    session opens. Quiet: a failure here shows up, more clearly, as the provider missing from the session."""
    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:
        try:
            preload()
        except Exception:
            pass


def _model_source(model: ModelLike) -> str | bytes:
    if isinstance(model, onnx.ModelProto):
        return model.SerializeToString()
    if isinstance(model, (bytes, bytearray)):
        return bytes(model)
    path = Path(model)
    if not path.is_file():
        raise BadInputError(f"model file not found: {path}")
    return str(path)


def _with_cuda_graph(chosen: list) -> list:
    """The providers list with ``enable_cuda_graph=1`` in the CUDA provider's options (capture on the first
    run, replay after: one launch for the whole model)."""
    out = []
    for p in chosen:
        if _name_of(p) == CUDA:
            options = dict(p[1]) if isinstance(p, tuple) else {}
            p = (CUDA, {**options, "enable_cuda_graph": "1"})
        out.append(p)
    return out


def create_session(
    model: ModelLike,
    providers: ProviderSpec = None,
    sess_options: ort.SessionOptions | None = None,
    provider_options: Sequence[dict] | None = None,
    intra_op_num_threads: int | None = None,
    library_path: str | None = None,
    *,
    with_library: bool = True,
    as_written: bool = False,
    quiet: bool = False,
    cuda_graph: bool = False,
    cpu_fallback: bool = True,
    profile_dir: str | os.PathLike | None = None,
    label: str | None = None,
) -> ort.InferenceSession:
    """An ``InferenceSession`` for ``model`` (path, bytes or ``ModelProto``) with the op library registered.

    ``providers``: see ``resolve_providers`` (default: CUDA when usable, else CPU). Asked for by name
    (``"cuda"``), CUDA must really start: a session ORT quietly put on the CPU instead is refused.
    ``sess_options`` given by the caller get the library registered into them (and the options below).

    ``with_library=False``: a plain ONNX model, opened without the op library (so it opens where the
    library is not built). ``as_written``: ORT's graph optimizations off, the model runs as written (the
    accuracy gate's reference). ``quiet``: ORT logs errors only. ``cuda_graph``: capture and replay a CUDA
    graph (needs the CUDA provider). ``cpu_fallback=False``: every node runs on the provider asked for, or
    the session does not open (no node quietly placed on the CPU). ``profile_dir``: ORT's profiler writes its trace there
    (``session.end_profiling()`` returns the file). ``label`` names the model in the error when ORT cannot
    open it (default: its path, or "the model")."""
    source = _model_source(model)
    chosen = resolve_providers(providers)  # what cannot be had here is said before anything is loaded
    wants_cuda = any(_name_of(p) == CUDA for p in chosen)
    so = sess_options if sess_options is not None else ort.SessionOptions()
    if intra_op_num_threads is not None:
        so.intra_op_num_threads = int(intra_op_num_threads)
    if as_written:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if quiet:
        so.log_severity_level = 3
    if not cpu_fallback and _name_of(chosen[0]) != CPU:
        # every node on the provider asked for, or no session (ORT refuses the option with CPU listed)
        chosen = [p for p in chosen if _name_of(p) != CPU]
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    if profile_dir is not None:
        so.enable_profiling = True
        so.profile_file_prefix = str(Path(profile_dir) / "onnxfuse_profile")
    if with_library:
        register_library(so, library_path)
    if cuda_graph:
        if not wants_cuda:
            raise ValueError("cuda_graph needs the CUDA provider")
        chosen = _with_cuda_graph(chosen)
    if wants_cuda:
        preload_cuda_libraries()
    try:
        session = ort.InferenceSession(source, sess_options=so, providers=chosen, provider_options=provider_options)
    except Exception as e:
        what = label or (source if isinstance(source, str) else "the model")
        raise BadInputError(f"ONNX Runtime cannot load {what}: {one_line(e)}") from e
    asked_for_cuda = isinstance(providers, str) and providers.lower() == "cuda"  # "auto" may fall back
    if asked_for_cuda and CUDA not in session.get_providers():
        raise cuda_not_usable("ONNX Runtime could not start it: its CUDA or cuDNN libraries are missing")
    return session


# --- self test ------------------------------------------------------------------------------------------


def probe_model(dtype: int = TensorProto.FLOAT) -> onnx.ModelProto:
    """A one-node model that uses the op: X[2,3] · W[4,3]ᵀ + B[4], erf GELU."""
    node = helper.make_node(OP_TYPE, ["X", "W", "B"], ["Y"], domain=DOMAIN, approximate="none")
    graph = helper.make_graph(
        [node],
        "onnxfuse_probe",
        [
            helper.make_tensor_value_info("X", dtype, [2, 3]),
            helper.make_tensor_value_info("W", dtype, [4, 3]),
            helper.make_tensor_value_info("B", dtype, [4]),
        ],
        [helper.make_tensor_value_info("Y", dtype, [2, 4])],
    )
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", _OPSET), helper.make_opsetid(DOMAIN, DOMAIN_VERSION)],
        ir_version=_IR_VERSION,
    )


_CPU_GEMM_NAMES = {
    "avx512": "AVX-512 packed GEMM, bias + GELU fused per block",
    "avx2": "AVX2 packed GEMM, bias + GELU fused per block",
    "blas": "OpenBLAS per tile, then bias + GELU on the tile (no AVX2 here, or ONNXFUSE_CPU_ISA=scalar)",
}


def cpu_gemm_path(library_path: str | None = None) -> str | None:
    """Which GEMM the library's CPU kernel runs in this process ("avx512", "avx2" or "blas"), as the library
    itself chose it for this CPU (``ONNXFUSE_CPU_ISA`` caps the choice). None when the library cannot be
    loaded or is older than this query."""
    import ctypes

    try:
        lib = ctypes.CDLL(library_path or get_library_path())
        query = lib.OnnxfuseCpuGemm
    except (OSError, AttributeError, BadInputError):
        return None
    query.restype = ctypes.c_char_p
    return query().decode()


def describe_cpu_gemm(path: str | None) -> str:
    """One line for people: what ``cpu_gemm_path`` returned means."""
    return _CPU_GEMM_NAMES.get(path or "", "unknown (library not loadable)")


def probe_library(library_path: str | None = None, providers: ProviderSpec = "cpu") -> dict[str, Any]:
    """Load the library and run the op once on ``providers``; compare with a float64 reference.

    Returns ``{"ok": bool, "providers": [...], "max_abs_error": float, "error": str | None}``; raises
    ``BadInputError`` only for a missing library (the caller decides how to report a failed run)."""
    import math

    path = library_path or get_library_path()
    so = ort.SessionOptions()  # create_session registers the library into it
    so.log_severity_level = 4  # the failure is reported in the result, not also as ORT log lines
    resolve_providers(providers)  # a provider that cannot be had here is the caller's error, not a failed probe
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    try:
        # the op must run where it was asked to: no quiet fallback of the node to the CPU
        sess = create_session(probe_model(), providers=providers, sess_options=so, library_path=path,
                              cpu_fallback=False)
        (y,) = sess.run(None, {"X": x, "W": w, "B": b})
    except BadInputError as e:
        return {"ok": False, "providers": [], "max_abs_error": None, "error": str(e)}
    pre = x.astype(np.float64) @ w.astype(np.float64).T + b
    ref = 0.5 * pre * (1.0 + np.vectorize(math.erf)(pre / math.sqrt(2.0)))
    err = float(np.max(np.abs(y - ref)))
    ok = err < 1e-5
    return {
        "ok": ok,
        "providers": sess.get_providers(),
        "max_abs_error": err,
        "error": None if ok else f"the op ran but its result is off by {err:.3g}",
    }
