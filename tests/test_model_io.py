"""Model I/O: every bad input is one BadInputError line and nothing is written; outputs are atomic;
external data stays external, streamed into a fresh file beside the output."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import onnx
import pytest

from onnxfuse import model_io, model_save
from onnxfuse.errors import BadInputError
from onnxfuse.fuse import fuse_model
from onnxfuse.pipeline import optimize_file
from tests.graphs import build, build_mlp
from tests.reference_ops import run
from tests.test_fuse import assert_same_outputs


def sha256(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def save_external(model, path, location=None):
    """Save with every tensor in one external file (onnx.save rewrites the model it is given: save a copy)."""
    model = onnx.load_model_from_string(model.SerializeToString())
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location=location or f"{path.name}.data", size_threshold=0)


def listing(folder):
    return sorted(p.name for p in folder.iterdir())


# --- load_model: one clear line for every bad input ------------------------------------------------
@pytest.fixture
def good(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(build(), str(path))
    return path


def test_load_good_model(good):
    assert model_io.load_model(good).graph.node


@pytest.mark.parametrize("make,message", [
    (lambda p: None, "no such file"),
    (lambda p: p.mkdir(), "is a directory"),
    (lambda p: p.write_bytes(b""), "empty file"),
    (lambda p: p.write_text("hello, this is not a model\n" * 20), "not an ONNX model"),
    (lambda p: p.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 12\n"), "git-LFS"),
])
def test_bad_files(tmp_path, make, message):
    path = tmp_path / "bad.onnx"
    make(path)
    with pytest.raises(BadInputError, match=message) as e:
        model_io.load_model(path)
    assert "\n" not in str(e.value)


def test_truncated_model(tmp_path, good):
    data = good.read_bytes()
    for cut in (len(data) // 3, len(data) - 7):
        path = tmp_path / f"cut{cut}.onnx"
        path.write_bytes(data[:cut])
        with pytest.raises(BadInputError):
            model_io.load_model(path)


def test_missing_and_truncated_external_data(tmp_path):
    path = tmp_path / "ext.onnx"
    save_external(build(), path)
    data = tmp_path / "ext.onnx.data"
    content = data.read_bytes()
    data.write_bytes(content[:-10])
    with pytest.raises(BadInputError, match="is truncated"):
        model_io.load_model(path)
    data.unlink()
    with pytest.raises(BadInputError, match="is missing next to the model"):
        model_io.load_model(path)


def test_external_data_outside_the_model_folder(tmp_path):
    model = onnx.load_model_from_string(build().SerializeToString())
    sub = tmp_path / "sub"
    sub.mkdir()
    save_external(model, sub / "m.onnx")
    m = onnx.load(str(sub / "m.onnx"), load_external_data=False)
    for t in m.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "../elsewhere.data"
    onnx.save(m, str(sub / "escape.onnx"))
    with pytest.raises(BadInputError, match="must be a relative path inside"):
        model_io.load_model(sub / "escape.onnx")


def test_unknown_opset_domain_and_version(tmp_path):
    model = build()
    model.graph.node[0].domain = "ai.unknown"
    onnx.save(model, str(tmp_path / "d.onnx"))
    with pytest.raises(BadInputError, match="unknown opset domain"):
        model_io.load_model(tmp_path / "d.onnx")
    model = build()
    model.opset_import[0].version = 999
    onnx.save(model, str(tmp_path / "v.onnx"))
    with pytest.raises(BadInputError, match="opset 999 is not supported"):
        model_io.load_model(tmp_path / "v.onnx")


def test_invalid_graph(tmp_path):
    model = build()
    model.graph.node[0].input[0] = "does_not_exist"
    onnx.save(model, str(tmp_path / "i.onnx"))
    with pytest.raises(BadInputError, match="not a valid ONNX model"):
        model_io.load_model(tmp_path / "i.onnx")


# --- optimize_file: outputs -------------------------------------------------------------------------
def test_inline_round_trip_input_untouched_and_idempotent(tmp_path):
    src = tmp_path / "in.onnx"
    onnx.save(build_mlp(layers=2), str(src))
    before = sha256(src)
    report = optimize_file(src, tmp_path / "out.onnx")
    assert len(report.fused) == 2 and sha256(src) == before
    assert listing(tmp_path) == ["in.onnx", "out.onnx"]  # no temp files, no data file
    out = onnx.load(str(tmp_path / "out.onnx"))
    onnx.checker.check_model(out, full_check=True)
    assert_same_outputs(onnx.load(str(src)), out)
    again = optimize_file(tmp_path / "out.onnx", tmp_path / "again.onnx")
    assert not again.fused
    assert (tmp_path / "again.onnx").read_bytes() == (tmp_path / "out.onnx").read_bytes()


def test_external_data_round_trip_streams_transposed_weights(tmp_path):
    src = tmp_path / "in.onnx"
    model = build_mlp(layers=2)
    save_external(model, src, "weights.bin")
    hashes = {p: sha256(tmp_path / p) for p in ("in.onnx", "weights.bin")}
    report = optimize_file(src, tmp_path / "out.onnx")
    assert len(report.fused) == 2
    assert {p: sha256(tmp_path / p) for p in hashes} == hashes
    assert listing(tmp_path) == ["in.onnx", "out.onnx", "out.onnx.data", "weights.bin"]
    out = onnx.load(str(tmp_path / "out.onnx"), load_external_data=False)
    assert all(t.data_location == onnx.TensorProto.EXTERNAL for t in out.graph.initializer)
    assert {e.value for t in out.graph.initializer for e in t.external_data if e.key == "location"} == \
        {"out.onnx.data"}
    offsets = [int(e.value) for t in out.graph.initializer for e in t.external_data if e.key == "offset"]
    assert all(o % model_save.ALIGNMENT == 0 for o in offsets)
    onnx.checker.check_model(str(tmp_path / "out.onnx"), full_check=True)
    full = onnx.load(str(tmp_path / "out.onnx"))
    assert_same_outputs(model, full)
    # optimizing the optimized model: the same graph and the same weights, byte for byte
    optimize_file(tmp_path / "out.onnx", tmp_path / "again.onnx")
    assert (tmp_path / "again.onnx.data").read_bytes() == (tmp_path / "out.onnx.data").read_bytes()
    again = onnx.load(str(tmp_path / "again.onnx"), load_external_data=False)
    for t in again.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "out.onnx.data"
    assert again.SerializeToString() == out.SerializeToString()


def test_external_bias_and_alpha_scaled_weight(tmp_path):
    model = build("onnx:none", "gemm:transB0", alpha=0.25, beta=3.0, bias_shape=(1, 24))
    save_external(model, tmp_path / "in.onnx")
    optimize_file(tmp_path / "in.onnx", tmp_path / "out.onnx")
    assert_same_outputs(model, onnx.load(str(tmp_path / "out.onnx")))


def test_stale_data_file_is_replaced_not_appended(tmp_path):
    model = build_mlp(layers=1)
    save_external(model, tmp_path / "in.onnx")
    (tmp_path / "out.onnx.data").write_bytes(b"\xff" * 100_000)
    optimize_file(tmp_path / "in.onnx", tmp_path / "out.onnx")
    assert_same_outputs(model, onnx.load(str(tmp_path / "out.onnx")))
    assert os.path.getsize(tmp_path / "out.onnx.data") < 100_000


@pytest.mark.parametrize("case", ["directory", "missing_folder", "same_file", "data_collision", "read_only",
                                  "over_input_data"])
def test_bad_outputs_write_nothing(tmp_path, case):
    src = tmp_path / "in.onnx"
    model = build_mlp(layers=1)
    if case == "data_collision":  # the input's data file is what OUT.data would be
        save_external(model, src, "out.onnx.data")
    elif case == "over_input_data":  # OUT itself is the input's data file
        save_external(model, src, "out.onnx")
    else:
        onnx.save(model, str(src))
    out = {"directory": tmp_path, "missing_folder": tmp_path / "nope" / "o.onnx", "same_file": src,
           "data_collision": tmp_path / "out.onnx", "read_only": tmp_path / "ro" / "o.onnx",
           "over_input_data": tmp_path / "out.onnx"}[case]
    if case == "read_only":
        (tmp_path / "ro").mkdir()
        os.chmod(tmp_path / "ro", 0o500)
        if os.access(tmp_path / "ro", os.W_OK):  # root writes anywhere, but not into /proc
            out = "/proc/o.onnx"
    before = {p: sha256(tmp_path / p) for p in listing(tmp_path) if (tmp_path / p).is_file()}
    with pytest.raises(BadInputError) as e:
        optimize_file(src, out)
    assert "\n" not in str(e.value)
    after = {p: sha256(tmp_path / p) for p in listing(tmp_path) if (tmp_path / p).is_file()}
    assert after == before


def test_failed_save_leaves_nothing_behind(tmp_path, monkeypatch):
    model = build_mlp(layers=1)
    save_external(model, tmp_path / "in.onnx")
    result = fuse_model(model_io.load_model(tmp_path / "in.onnx"), base_dir=tmp_path)

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    before = result.model.SerializeToString()
    monkeypatch.setattr(model_save, "_copy_range", fail)
    monkeypatch.setattr(model_save, "_derive", fail)
    with pytest.raises(BadInputError, match="No space left"):
        model_save.save_model(result.model, tmp_path / "out.onnx", source_dir=tmp_path, derived=result.derived)
    assert listing(tmp_path) == ["in.onnx", "in.onnx.data"]
    # the model's external references are restored after a failed save
    assert result.model.SerializeToString() == before


def test_pending_tensors_cannot_be_saved_without_their_recipe(tmp_path):
    save_external(build_mlp(layers=1), tmp_path / "in.onnx")
    result = fuse_model(model_io.load_model(tmp_path / "in.onnx"), base_dir=tmp_path)
    assert result.derived  # the transposed weight exists only once written
    with pytest.raises(ValueError, match="computed while saving"):
        model_save.save_model(result.model, tmp_path / "out.onnx", source_dir=tmp_path)
    result.save(tmp_path / "out.onnx")
    assert_same_outputs(build_mlp(layers=1), onnx.load(str(tmp_path / "out.onnx")))


def test_fuse_model_needs_the_folder_of_external_constants(tmp_path):
    save_external(build(), tmp_path / "in.onnx")
    with pytest.raises(ValueError, match="pass base_dir"):
        fuse_model(model_io.load_model(tmp_path / "in.onnx"))


def test_load_external_data_on_request(tmp_path):
    model = build()
    save_external(model, tmp_path / "m.onnx")
    loaded = model_io.load_model(tmp_path / "m.onnx", load_external_data=True)
    feeds = {"x": np.ones((2, 3, 16), np.float32)}
    np.testing.assert_array_equal(run(loaded, feeds)[0], run(model, feeds)[0])


def test_external_bias_converted_to_the_linear_type(tmp_path):
    from tests.test_patterns_casts import _fp16_island

    model = _fp16_island("float32")
    save_external(model, tmp_path / "in.onnx")
    report = optimize_file(tmp_path / "in.onnx", tmp_path / "out.onnx")
    assert len(report.fused) == 1
    assert_same_outputs(model, onnx.load(str(tmp_path / "out.onnx")), "float16")
