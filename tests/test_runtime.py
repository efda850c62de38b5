"""onnxfuse.runtime: finding the library, opening sessions, choosing providers, and clear errors."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import onnxruntime as ort
import pytest

import onnxfuse
from onnxfuse import runtime
from onnxfuse.errors import BadInputError

FEEDS = {"X": np.ones((2, 3), np.float32), "W": np.ones((4, 3), np.float32), "B": np.zeros(4, np.float32)}


def test_library_path_is_a_loadable_file(library_path):
    assert os.path.isabs(library_path) and os.path.isfile(library_path)
    assert library_path.endswith("libonnxfuse_ops.so")
    assert onnxfuse.get_library_path() == library_path


def test_env_override(monkeypatch, library_path, tmp_path):
    copy = tmp_path / "libcopy.so"
    copy.write_bytes(open(library_path, "rb").read())
    monkeypatch.setenv(runtime.LIBRARY_ENV, str(copy))
    assert runtime.get_library_path() == str(copy)
    (y,) = runtime.create_session(runtime.probe_model(), providers="cpu").run(None, FEEDS)
    assert y.shape == (2, 4)


def test_env_override_to_missing_file_is_bad_input(monkeypatch, tmp_path):
    monkeypatch.setenv(runtime.LIBRARY_ENV, str(tmp_path / "nope.so"))
    with pytest.raises(BadInputError, match="ONNXFUSE_LIBRARY=.*is not a file"):
        runtime.get_library_path()


def test_unloadable_library_is_bad_input(monkeypatch, tmp_path):
    junk = tmp_path / "libjunk.so"
    junk.write_bytes(b"not an ELF file")
    monkeypatch.setenv(runtime.LIBRARY_ENV, str(junk))
    with pytest.raises(BadInputError, match="cannot load the op library"):
        runtime.session_options()


def test_create_session_from_proto_bytes_and_path(tmp_path):
    model = runtime.probe_model()
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    for source in (model, model.SerializeToString(), str(path), path):
        sess = runtime.create_session(source, providers="cpu", intra_op_num_threads=1)
        assert sess.get_providers() == [runtime.CPU]
        (y,) = sess.run(None, FEEDS)
        np.testing.assert_allclose(y, np.full((2, 4), 3.0 * 0.5 * (1 + np.tanh(0) + 0.9973 * 1)), rtol=1e-3)


def test_create_session_with_caller_options():
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = runtime.create_session(runtime.probe_model(), providers=["CPUExecutionProvider"], sess_options=so)
    assert sess.run(None, FEEDS)[0].shape == (2, 4)


def test_missing_model_is_bad_input(tmp_path):
    with pytest.raises(BadInputError, match="model file not found"):
        runtime.create_session(tmp_path / "absent.onnx")


def test_broken_model_is_bad_input(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00garbage")
    with pytest.raises(BadInputError, match="ONNX Runtime cannot load"):
        runtime.create_session(bad, providers="cpu")


def test_provider_choice():
    assert runtime.resolve_providers("cpu") == [runtime.CPU]
    auto = runtime.resolve_providers(None)
    if runtime.cuda_usable():
        assert auto == [runtime.CUDA, runtime.CPU]
        assert runtime.resolve_providers("cuda") == [runtime.CUDA, runtime.CPU]
    else:
        assert auto == [runtime.CPU]
        with pytest.raises(BadInputError, match="CUDA provider was asked for"):
            runtime.resolve_providers("cuda")
    with pytest.raises(BadInputError, match="unknown provider"):
        runtime.resolve_providers("tpu")
    with pytest.raises(BadInputError, match="not available"):
        runtime.resolve_providers(["NoSuchExecutionProvider"])


def test_cuda_device_queries_agree():
    devices = runtime.cuda_devices()
    assert len(devices) == runtime.cuda_device_count()
    for d in devices:
        assert d["name"] and d["compute_capability"].count(".") == 1


def test_probe_library_runs_the_op():
    result = runtime.probe_library(providers="cpu")
    assert result["ok"], result
    assert result["max_abs_error"] < 1e-6


def test_plain_register_custom_ops_library_works(library_path):
    """A program that only hands the path to ORT (no onnxfuse preloading) loads the library: its RUNPATH
    (installed layout) or build RPATH finds OpenBLAS by itself."""
    code = textwrap.dedent(
        f"""
        import numpy as np, onnxruntime as ort, sys
        sys.path.insert(0, {os.path.dirname(os.path.dirname(onnxfuse.__file__))!r})
        from onnxfuse.domain import DOMAIN  # no runtime import: nothing preloaded
        import onnxfuse.runtime as r  # only for the probe model; get_library_path() is never called
        so = ort.SessionOptions()
        so.register_custom_ops_library({library_path!r})
        s = ort.InferenceSession(r.probe_model().SerializeToString(), so, providers=["CPUExecutionProvider"])
        y = s.run(None, {{"X": np.ones((2, 3), np.float32), "W": np.ones((4, 3), np.float32), "B": np.zeros(4, np.float32)}})[0]
        assert "libscipy_openblas" in open("/proc/self/maps").read()
        print(float(y[0, 0]))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert abs(float(out.stdout.split()[-1]) - 2.99595) < 1e-4


# --- create_session's options: what bench, compare and doctor ask of the one session opener ---------------


def test_as_written_and_quiet_sessions():
    sess = runtime.create_session(runtime.probe_model(), providers="cpu", as_written=True, quiet=True)
    options = sess.get_session_options()
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    assert options.log_severity_level == 3
    plain = runtime.create_session(runtime.probe_model(), providers="cpu").get_session_options()
    assert plain.graph_optimization_level != ort.GraphOptimizationLevel.ORT_DISABLE_ALL


def test_a_plain_model_opens_without_the_library(monkeypatch, tmp_path):
    from onnx import TensorProto, helper

    monkeypatch.setenv(runtime.LIBRARY_ENV, str(tmp_path / "nope.so"))
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "plain",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    plain = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    (y,) = runtime.create_session(plain, providers="cpu", with_library=False).run(None, {"x": np.array([-1.0, 2.0], np.float32)})
    assert y.tolist() == [0.0, 2.0]
    with pytest.raises(BadInputError, match="is not a file"):
        runtime.create_session(plain, providers="cpu")


def test_profile_dir_collects_the_trace(tmp_path):
    sess = runtime.create_session(runtime.probe_model(), providers="cpu", profile_dir=tmp_path)
    sess.run(None, FEEDS)
    trace = sess.end_profiling()
    assert os.path.dirname(os.path.abspath(trace)) == str(tmp_path) and os.path.getsize(trace) > 0


class _RecordingSession:
    """Stands in for ORT's InferenceSession: records what create_session hands ORT, so the CUDA options can
    be checked on a machine without a GPU."""

    seen: list = []

    def __init__(self, source, sess_options=None, providers=None, provider_options=None):
        self.options, self.providers = sess_options, providers
        _RecordingSession.seen.append(self)

    def get_providers(self):
        return [p[0] if isinstance(p, tuple) else p for p in self.providers]


@pytest.fixture
def pretend_cuda(monkeypatch):
    monkeypatch.setattr(runtime, "cuda_device_count", lambda: 1)
    monkeypatch.setattr(runtime.ort, "get_available_providers", lambda: [runtime.CUDA, runtime.CPU])
    monkeypatch.setattr(runtime.ort, "InferenceSession", _RecordingSession)
    monkeypatch.setattr(runtime, "preload_cuda_libraries", lambda: None)
    _RecordingSession.seen = []


def _no_cpu_fallback(options: ort.SessionOptions) -> bool:
    try:
        return options.get_session_config_entry("session.disable_cpu_ep_fallback") == "1"
    except RuntimeError:  # ORT's answer for a key never set
        return False


def test_cuda_graph_and_no_cpu_fallback_reach_ort(pretend_cuda):
    sess = runtime.create_session(runtime.probe_model(), providers="cuda", cuda_graph=True)
    assert sess.providers == [(runtime.CUDA, {"enable_cuda_graph": "1"}), runtime.CPU]
    assert not _no_cpu_fallback(sess.options)
    strict = runtime.create_session(runtime.probe_model(), providers="cuda", cpu_fallback=False)
    assert strict.providers == [runtime.CUDA]  # ORT refuses the option while the CPU is listed
    assert _no_cpu_fallback(strict.options)


def test_cuda_asked_for_must_really_start(pretend_cuda, monkeypatch):
    monkeypatch.setattr(_RecordingSession, "get_providers", lambda self: [runtime.CPU])  # ORT's quiet fallback
    with pytest.raises(BadInputError, match="CUDA provider was asked for but is not usable here .*cuDNN"):
        runtime.create_session(runtime.probe_model(), providers="cuda")
    assert runtime.create_session(runtime.probe_model()).providers == [runtime.CUDA, runtime.CPU]  # auto may


def test_cpu_sessions_ignore_the_cuda_only_options():
    sess = runtime.create_session(runtime.probe_model(), providers="cpu", cpu_fallback=False)
    assert sess.get_providers() == [runtime.CPU] and sess.run(None, FEEDS)[0].shape == (2, 4)
    assert not _no_cpu_fallback(sess.get_session_options())
    with pytest.raises(ValueError, match="cuda_graph needs the CUDA provider"):
        runtime.create_session(runtime.probe_model(), providers="cpu", cuda_graph=True)


def test_label_names_the_model_ort_cannot_open():
    broken = runtime.probe_model()
    broken.graph.node[0].op_type = "NoSuchOp"
    with pytest.raises(BadInputError, match=r"^ONNX Runtime cannot load the broken model: .*NoSuchOp"):
        runtime.create_session(broken, providers="cpu", label="the broken model")


def test_one_wording_for_cuda_that_cannot_be_had():
    if runtime.cuda_usable():
        pytest.skip("CUDA is usable here")
    for ask in ("cuda", [runtime.CUDA, runtime.CPU]):
        with pytest.raises(BadInputError, match=r"^the CUDA provider was asked for but is not usable here \(.+\); "
                                                r"use the CPU provider \(--provider cpu\)$"):
            runtime.create_session(runtime.probe_model(), providers=ask)
    assert runtime.create_session(runtime.probe_model()).get_providers() == [runtime.CPU]  # auto: the CPU


def test_one_provider_map():
    assert runtime.provider_list("cpu") == [runtime.CPU]
    if runtime.cuda_usable():
        assert runtime.provider_list("cuda") == [runtime.CUDA, runtime.CPU]
    with pytest.raises(BadInputError, match="unknown provider 'CPU': use cpu or cuda"):
        runtime.provider_list("CPU")  # exact names; resolve_providers accepts any case
    assert runtime.resolve_providers("CPU") == [runtime.CPU]
    assert runtime.short_name(runtime.CUDA) == "CUDA"
