"""One ONNX Runtime session, many threads: 16 threads × 200 runs through the FusedLinearGelu kernel give
results bit-identical to the same inputs run one at a time (no shared scratch, no state carried between
runs). Every thread feeds its own inputs, so a result computed from another thread's data shows up.

The CPU kernel runs here; the CUDA variant runs where ONNX Runtime's CUDA provider starts (skipped with the
reason otherwise — the GPU-only tests of the kernel itself are in ``tests/test_op_cuda.py``).
"""

from __future__ import annotations

import threading

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxfuse.domain import DOMAIN, OP_TYPE, DOMAIN_VERSION

THREADS = 16
RUNS = 200
NP = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16, TensorProto.BFLOAT16: ml_dtypes.bfloat16}


def _model(dtype: int, m_dim, k: int, n: int, approximate: str, trans_b: int, seed: int, **extra) -> onnx.ModelProto:
    """X[batch, M, K] → FusedLinearGelu(W, B) → Y, three nodes chained (Y feeds the next as X); `extra` are more
    attributes of every node."""
    rng = np.random.default_rng(seed)
    nodes, inits, x = [], [], "x"
    dims = [k, n, n, k]
    for i in range(3):
        kk, nn = dims[i], dims[i + 1]
        w = (rng.standard_normal((nn, kk) if trans_b else (kk, nn)) / np.sqrt(kk)).astype(NP[dtype])
        inits += [numpy_helper.from_array(w, f"w{i}"),
                  numpy_helper.from_array((rng.standard_normal(nn) * 0.1).astype(NP[dtype]), f"b{i}")]
        attrs = {"approximate": approximate, "transB": trans_b, **extra}
        nodes.append(helper.make_node(OP_TYPE, [x, f"w{i}", f"b{i}"], [f"y{i}"], name=f"fused{i}", domain=DOMAIN,
                                      **attrs))
        x = f"y{i}"
    graph = helper.make_graph(nodes, "concurrency", [helper.make_tensor_value_info("x", dtype, ["batch", m_dim, k])],
                              [helper.make_tensor_value_info(x, dtype, ["batch", m_dim, dims[3]])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid(DOMAIN, DOMAIN_VERSION)])
    model.ir_version = 10
    return model


def _inputs(dtype: int, k: int, count: int, seed: int, rows: tuple[int, int] = (1, 40)) -> list[np.ndarray]:
    """Inputs of varying batch and M, M in [rows[0], rows[1]) (so threads also differ in shape, not only in
    values)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        batch, m = int(rng.integers(1, 4)), int(rng.integers(*rows))
        out.append(rng.standard_normal((batch, m, k)).astype(NP[dtype]))
    return out


def _run(session, name: str, x: np.ndarray) -> np.ndarray:
    """One run; bfloat16 goes through OrtValues (ORT's numpy bridge has no bfloat16)."""
    if x.dtype == np.dtype(ml_dtypes.bfloat16):
        from onnxfuse.compare import _ort_value, _to_numpy

        out_name = session.get_outputs()[0].name
        (value,) = session.run_with_ort_values([out_name], {name: _ort_value(x)})
        return _to_numpy(value)
    return session.run(None, {name: x})[0]


def _hammer(session, feeds_per_thread: list[list[np.ndarray]], expected: list[list[np.ndarray]]) -> list[str]:
    """THREADS threads, each running its inputs RUNS times in turn on the one session; returns mismatches."""
    errors: list[str] = []
    start = threading.Barrier(len(feeds_per_thread))
    name = session.get_inputs()[0].name

    def work(t: int) -> None:
        try:
            start.wait()
            mine, want = feeds_per_thread[t], expected[t]
            for r in range(RUNS):
                j = r % len(mine)
                got = _run(session, name, mine[j])
                if got.shape != want[j].shape or got.tobytes() != want[j].tobytes():
                    errors.append(f"thread {t} run {r}: result differs from the one-thread result")
                    return
        except Exception as e:  # noqa: BLE001 - reported to the main thread
            errors.append(f"thread {t}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(len(feeds_per_thread))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=600)
    assert not any(th.is_alive() for th in threads), "a thread hung"
    return errors


def _check(session, dtype: int, k: int, seed: int, rows: tuple[int, int] = (1, 40)) -> None:
    per_thread = [_inputs(dtype, k, 5, seed * 100 + t, rows) for t in range(THREADS)]
    name = session.get_inputs()[0].name
    expected = [[_run(session, name, x) for x in mine] for mine in per_thread]  # one at a time
    # the reference itself is stable: a second sequential pass gives the same bytes
    assert all(_run(session, name, x).tobytes() == e.tobytes()
               for x, e in zip(per_thread[0], expected[0]))
    errors = _hammer(session, per_thread, expected)
    assert not errors, errors[:5]


CASES = [
    pytest.param(TensorProto.FLOAT, "none", 1, id="fp32-erf-transB1"),
    pytest.param(TensorProto.FLOAT, "tanh", 0, id="fp32-tanh-transB0"),
    pytest.param(TensorProto.FLOAT16, "sigmoid", 1, id="fp16-sigmoid"),
    pytest.param(TensorProto.BFLOAT16, "none", 1, id="bf16-erf"),
]


@pytest.mark.parametrize("dtype,approximate,trans_b", CASES)
def test_cpu_kernel_16_threads_bit_identical(dtype, approximate, trans_b):
    from onnxfuse.runtime import create_session

    k, n = 48, 80
    model = _model(dtype, "m", k, n, approximate, trans_b, seed=1)
    session = create_session(model, providers="cpu")
    assert session.get_providers()[0] == "CPUExecutionProvider"
    _check(session, dtype, k, seed=2)


def test_cpu_kernel_same_bits_with_one_or_many_intra_op_threads():
    """The kernel's own parallelism does not change results: a session with one intra-op thread and one
    with the default pool agree to the bit."""
    import onnxruntime as ort

    from onnxfuse.runtime import session_options

    k, n = 256, 384
    model = _model(TensorProto.FLOAT, "m", k, n, "none", 1, seed=5).SerializeToString()
    sessions = []
    for threads in (1, 0):
        so = session_options(intra_op_num_threads=threads)
        sessions.append(ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]))
    for x in _inputs(TensorProto.FLOAT, k, 6, 9) + [np.random.default_rng(3).standard_normal((4, 257, k)).astype(np.float32)]:
        a, b = (s.run(None, {"x": x})[0] for s in sessions)
        assert a.tobytes() == b.tobytes()


def _cuda_session(model):
    import onnxruntime as ort

    from onnxfuse.runtime import cuda_device_count, session_options

    if "CUDAExecutionProvider" not in ort.get_available_providers() or cuda_device_count() == 0:
        pytest.skip("no usable CUDA device here (CUDAExecutionProvider or a GPU is missing): the CUDA kernel "
                    "variant runs on the GPU machine")
    so = session_options()
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    session = ort.InferenceSession(model.SerializeToString(), so, providers=["CUDAExecutionProvider"])
    if session.get_providers()[0] != "CUDAExecutionProvider":
        pytest.skip("ONNX Runtime could not start its CUDA provider here")
    return session


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,approximate,trans_b", CASES)
def test_cuda_kernel_16_threads_bit_identical(dtype, approximate, trans_b):
    """The same on the device: concurrent runs on ORT's compute stream give the one-thread bits."""
    k, n = 48, 80
    session = _cuda_session(_model(dtype, "m", k, n, approximate, trans_b, seed=1))
    _check(session, dtype, k, seed=2)


SCRATCH_CASES = [
    # 16-bit on the fallback: cuBLASLt writes a float32 product to scratch, a second kernel reads it into Y
    pytest.param("fallback", 256, 1024, id="fallback-float32-product"),
    # rows that are not 16-byte vectors (K, N not multiples of 8) on the fused path: X and Y staged in scratch
    # as aligned copies (enough rows and work that the fused path pays, see StagedFusedPays)
    pytest.param("fused", 1020, 1036, id="fused-staged-rows"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("cuda_path,k,n", SCRATCH_CASES)
def test_cuda_scratch_stays_with_its_run(cuda_path, k, n):
    """Concurrent runs of one session each get a CUDA stream of their own. A call's scratch must not go to
    another run while this call's kernels still use it, or one thread's result is computed from another's
    product or rows; the one-thread bits show it."""
    session = _cuda_session(_model(TensorProto.FLOAT16, "m", k, n, "none", 1, seed=3, cuda_path=cuda_path))
    _check(session, TensorProto.FLOAT16, k, seed=4, rows=(64, 160))
