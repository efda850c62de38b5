"""Input specs, dynamic-dim defaults, random value ranges and loading user inputs (onnxfuse.inputs)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxfuse.errors import BadInputError
from onnxfuse.inputs import (
    DEFAULT_BATCH,
    DEFAULT_DYNAMIC,
    DEFAULT_INT_HIGH,
    check_sample,
    default_samples,
    gather_bounds,
    input_specs,
    load_inputs,
    padded_masks,
    parse_shape_option,
    random_inputs,
    resolve_shapes,
    size_candidates,
    tried_sizes,
)

VOCAB = 1000


def bert_like() -> onnx.ModelProto:
    """Token ids into an embedding table (through a Cast, as some exporters write it), a mask, position
    ids into a second table, a float input with an anonymous leading dim, a bool flag."""
    emb = numpy_helper.from_array(np.zeros((VOCAB, 8), np.float32), "word_embeddings")
    pos = numpy_helper.from_array(np.zeros((512, 8), np.float32), "position_embeddings")
    nodes = [
        helper.make_node("Cast", ["input_ids"], ["ids32"], to=TensorProto.INT32),
        helper.make_node("Gather", ["word_embeddings", "ids32"], ["tok"]),
        helper.make_node("Gather", ["position_embeddings", "position_ids"], ["posv"]),
        helper.make_node("Add", ["tok", "posv"], ["h"]),
        helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["maskf", "axes"], ["mask3"]),
        helper.make_node("Mul", ["h", "mask3"], ["out"]),
        helper.make_node("Identity", ["features"], ["features_out"]),
        helper.make_node("Identity", ["flag"], ["flag_out"]),
    ]
    axes = numpy_helper.from_array(np.array([-1], np.int64), "axes")
    graph = helper.make_graph(
        nodes,
        "bert_like",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"]),
            helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "sequence"]),
            helper.make_tensor_value_info("features", TensorProto.FLOAT16, [None, None, 16]),
            helper.make_tensor_value_info("flag", TensorProto.BOOL, [3]),
        ],
        [
            helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", "sequence", 8]),
            helper.make_tensor_value_info("features_out", TensorProto.FLOAT16, [None, None, 16]),
            helper.make_tensor_value_info("flag_out", TensorProto.BOOL, [3]),
        ],
        [emb, pos, axes],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)


def test_specs_skip_initializers_listed_as_inputs():
    model = bert_like()
    # Older exporters also list initializers as graph inputs; those are not fed.
    model.graph.input.append(helper.make_tensor_value_info("word_embeddings", TensorProto.FLOAT, [VOCAB, 8]))
    names = [s.name for s in input_specs(model)]
    assert names == ["input_ids", "attention_mask", "position_ids", "features", "flag"]
    assert input_specs(model)[0].shape == ("batch", "sequence")
    assert input_specs(model)[3].shape == (None, None, 16)


def test_default_shapes_batch_one_sequence_128():
    shapes = resolve_shapes(input_specs(bert_like()))
    assert shapes["input_ids"] == (DEFAULT_BATCH, DEFAULT_DYNAMIC) == (1, 128)
    assert shapes["features"] == (1, 128, 16)  # anonymous: axis 0 is a batch, the others sequence-like
    assert shapes["flag"] == (3,)


def test_user_shape_binds_named_dims_of_other_inputs():
    shapes = resolve_shapes(input_specs(bert_like()), {"input_ids": (4, 32)})
    assert shapes["input_ids"] == (4, 32)
    assert shapes["attention_mask"] == (4, 32)  # same dim names -> same values
    assert shapes["position_ids"] == (4, 32)
    assert shapes["features"] == (1, 128, 16)  # anonymous dims are not tied to anything


@pytest.mark.parametrize(
    "shapes, message",
    [
        ({"nope": (1, 2)}, "does not take"),
        ({"input_ids": (1, 2, 3)}, "3 dims given"),
        ({"features": (1, 2, 17)}, "fixed to 16"),
        ({"input_ids": (1, 8), "attention_mask": (1, 9)}, "two values"),
    ],
)
def test_bad_shapes_are_bad_input(shapes, message):
    with pytest.raises(BadInputError, match=message):
        resolve_shapes(input_specs(bert_like()), shapes)


@pytest.mark.parametrize(
    "text, expected",
    [("input_ids=1,128", ("input_ids", (1, 128))), ("x=2x3x4", ("x", (2, 3, 4))), (" y = 7 ", ("y", (7,)))],
)
def test_parse_shape_option(text, expected):
    assert parse_shape_option(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("input_ids:1,128", ("input_ids", (1, 128))),      # onnxsim's and onnxslim's NAME:DIMS
    ("input_ids:1x128", ("input_ids", (1, 128))),
    ("input_ids:[1,128]", ("input_ids", (1, 128))),    # polygraphy's
    (" y : 7 ", ("y", (7,))),
    ("input:0:1,128", ("input:0", (1, 128))),          # a TensorFlow name holds ':', a dim never does
    ("input:0=1x128", ("input:0", (1, 128))),          # with '=' the name is everything before it
    ("x=[2,3]", ("x", (2, 3))),
])
def test_parse_shape_option_name_colon_dims(text, expected):
    assert parse_shape_option(text) == expected


@pytest.mark.parametrize("text", ["input_ids", "=1,2", "x=", "x=1,a", "x=-1", ":1,2", "x:", "x:1,,2", "x:[]", "x:1;2"])
def test_parse_shape_option_rejects(text):
    with pytest.raises(BadInputError, match="--shape"):
        parse_shape_option(text)


def test_padded_masks_and_the_default_sample_count():
    """The masks a padded sample pads ([batch, sequence], integer or bool): 2 samples by default where there is
    one (whole, then padded), else 1."""
    assert padded_masks(bert_like()) == ["attention_mask"] and default_samples(bert_like()) == 2

    def model(name, elem_type, shape):
        graph = helper.make_graph([helper.make_node("Identity", [name], ["y"])], "g",
                                  [helper.make_tensor_value_info(name, elem_type, shape)],
                                  [helper.make_tensor_value_info("y", elem_type, shape)])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])

    assert default_samples(model("attention_mask", TensorProto.BOOL, ["b", "s"])) == 2
    for not_padded in (model("x", TensorProto.INT64, ["b", "s"]),                  # not a mask
                       model("attention_mask", TensorProto.INT64, ["b", 1]),        # one token: nothing to pad
                       model("attention_mask", TensorProto.FLOAT, ["b", "s"]),      # an additive float mask
                       model("attention_mask", TensorProto.INT64, ["b", "h", "s"])):  # not [batch, sequence]
        assert padded_masks(not_padded) == [] and default_samples(not_padded) == 1


def test_gather_bound_follows_casts():
    bounds = gather_bounds(bert_like())
    assert bounds == {"input_ids": VOCAB, "position_ids": 512}


def test_random_values_have_sensible_ranges():
    model = bert_like()
    sample = random_inputs(model, {"input_ids": (2, 300)}, seed=3)
    ids = sample["input_ids"]
    assert ids.dtype == np.int64 and ids.shape == (2, 300)
    assert ids.min() >= 0 and ids.max() < VOCAB
    assert ids.max() > DEFAULT_INT_HIGH  # the vocabulary bound was used, not the generic one
    assert np.all(sample["attention_mask"] == 1)
    assert np.array_equal(sample["position_ids"], np.tile(np.arange(300), (2, 1)))
    feats = sample["features"]
    assert feats.dtype == np.float16 and feats.shape == (1, 128, 16)
    assert 0.8 < float(feats.astype(np.float32).std()) < 1.2  # standard normal
    assert sample["flag"].dtype == np.bool_
    # the model really runs on them
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    sess.run(None, sample)


@pytest.mark.parametrize("batch", [1, 4])
def test_padded_samples_pad_masks_on_the_right(batch):
    """compare's samples after the first: each row keeps 1 to sequence tokens, ones then zeros, row 0 of a
    batch of several whole; every other input as in the unpadded sample of the same seed."""
    model = bert_like()
    seen = set()
    for seed in range(20):
        plain = random_inputs(model, {"input_ids": (batch, 16)}, seed=seed)
        sample = random_inputs(model, {"input_ids": (batch, 16)}, seed=seed, padded=True)
        mask = sample["attention_mask"]
        assert mask.shape == (batch, 16) and mask.dtype == np.int64
        kept = mask.sum(axis=1)
        assert np.all(kept >= 1) and all(np.array_equal(mask[r], np.arange(16) < kept[r]) for r in range(batch))
        if batch > 1:
            assert kept[0] == 16
        seen.update(int(k) for k in kept[batch > 1:])
        assert all(np.array_equal(sample[k], plain[k]) for k in plain if k != "attention_mask")
        assert np.all(plain["attention_mask"] == 1)
    assert len(seen) > 5  # the lengths vary


def test_random_inputs_are_reproducible_per_seed():
    model = bert_like()
    a, b, c = (random_inputs(model, seed=s) for s in (0, 0, 1))
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["features"], c["features"])


def test_bfloat16_inputs_use_ml_dtypes():
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, ["n", 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    x = random_inputs(model)["x"]
    assert x.dtype == np.dtype(ml_dtypes.bfloat16) and x.shape == (1, 4)


def _ids_model():
    graph = helper.make_graph(
        [helper.make_node("Identity", ["ids"], ["o1"]), helper.make_node("Identity", ["x"], ["o2"])],
        "g",
        [
            helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", 5]),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 3]),
        ],
        [
            helper.make_tensor_value_info("o1", TensorProto.INT64, ["b", 5]),
            helper.make_tensor_value_info("o2", TensorProto.FLOAT, ["b", 3]),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)


def test_load_npz_casts_within_kind(tmp_path):
    path = tmp_path / "in.npz"
    np.savez(path, ids=np.arange(10, dtype=np.int32).reshape(2, 5), x=np.ones((2, 3), np.float64))
    (sample,) = load_inputs(path, _ids_model())
    assert sample["ids"].dtype == np.int64 and sample["x"].dtype == np.float32


@pytest.mark.parametrize(
    "arrays, message",
    [
        ({"ids": np.zeros((1, 5), np.int64)}, "missing x"),
        ({"ids": np.zeros((1, 5), np.int64), "x": np.zeros((1, 3), np.float32), "z": np.zeros(1)}, "not inputs of the model: z"),
        ({"ids": np.zeros((1, 5), np.float32), "x": np.zeros((1, 3), np.float32)}, "holds float32, the model takes int64"),
        ({"ids": np.zeros((1, 6), np.int64), "x": np.zeros((1, 3), np.float32)}, "axis 1"),
        ({"ids": np.zeros((5,), np.int64), "x": np.zeros((1, 3), np.float32)}, "has shape \\[5\\]"),
    ],
)
def test_load_npz_rejects_what_does_not_fit(tmp_path, arrays, message):
    path = tmp_path / "in.npz"
    np.savez(path, **arrays)
    with pytest.raises(BadInputError, match=message):
        load_inputs(path, _ids_model())


def test_unreadable_inputs_are_bad_input(tmp_path):
    broken = tmp_path / "broken.npz"
    broken.write_bytes(b"not a zip file")
    with pytest.raises(BadInputError, match="cannot read inputs"):
        load_inputs(broken, _ids_model())
    with pytest.raises(BadInputError, match="do not exist"):
        load_inputs(tmp_path / "missing.npz", _ids_model())
    (tmp_path / "a.txt").write_text("x")
    with pytest.raises(BadInputError, match="expected a .npz"):
        load_inputs(tmp_path / "a.txt", _ids_model())
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(BadInputError, match="holds no"):
        load_inputs(empty, _ids_model())
    bad_pb = tmp_path / "test_data_set_0"
    bad_pb.mkdir()
    (bad_pb / "input_0.pb").write_bytes(b"\xff\xff\xff garbage")
    with pytest.raises(BadInputError, match="cannot read tensor"):
        load_inputs(bad_pb, _ids_model())


def _write_test_data_set(folder, ids, x, named: bool):
    folder.mkdir(parents=True)
    for i, (name, array) in enumerate((("ids", ids), ("x", x))):
        tensor = numpy_helper.from_array(array, name if named else "")
        (folder / f"input_{i}.pb").write_bytes(tensor.SerializeToString())


@pytest.mark.parametrize("named", [True, False])
def test_load_onnx_test_data_sets(tmp_path, named):
    rng = np.random.default_rng(0)
    expected = []
    # 11 sets: test_data_set_10 must come after test_data_set_9 (natural order)
    for i in range(11):
        ids = rng.integers(0, 9, (2, 5)).astype(np.int64)
        x = rng.standard_normal((2, 3)).astype(np.float32)
        _write_test_data_set(tmp_path / "model" / f"test_data_set_{i}", ids, x, named)
        expected.append((ids, x))
    samples = load_inputs(tmp_path / "model", _ids_model())
    assert len(samples) == 11
    for sample, (ids, x) in zip(samples, expected):
        assert np.array_equal(sample["ids"], ids) and np.array_equal(sample["x"], x)
    # a single set folder is one sample
    (one,) = load_inputs(tmp_path / "model" / "test_data_set_3", _ids_model())
    assert np.array_equal(one["x"], expected[3][1])


def test_folder_of_npz_files_is_one_sample_each(tmp_path):
    for i in range(3):
        np.savez(tmp_path / f"s{i}.npz", ids=np.full((1, 5), i, np.int64), x=np.zeros((1, 3), np.float32))
    samples = load_inputs(tmp_path, _ids_model())
    assert [int(s["ids"][0, 0]) for s in samples] == [0, 1, 2]


def test_check_sample_keeps_bfloat16():
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [2])],
        [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [2])],
    )
    specs = input_specs(helper.make_model(graph))
    out = check_sample({"x": np.array([1.0, 2.0], np.float32)}, specs)
    assert out["x"].dtype == np.dtype(ml_dtypes.bfloat16)


# --- sizes a model runs at ----------------------------------------------------------------------------
def _windowed(window: int, static_out: int | None = None) -> onnx.ModelProto:
    """x [batch, sequence, 4] split into windows of ``window`` positions by a constant Reshape target (a local
    attention exported with its window fixed): it runs only at multiples of ``window``."""
    target = numpy_helper.from_array(np.array([-1, window, 4], np.int64), "windows")
    nodes = [helper.make_node("Reshape", ["x", "windows"], ["w"]),
             helper.make_node("ReduceSum", ["w", "axis"], ["y"], keepdims=0)]
    axis = numpy_helper.from_array(np.array([1], np.int64), "axis")
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [static_out or "chunks", 4])
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", 4])],
                              [out], [target, axis])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)


def test_size_candidates_add_the_lengths_the_model_implies():
    """After the halvings, the lengths the model's constants and fixed dims imply, longest first: each as the
    largest multiple of it up to the default and as itself (none the halvings tried already)."""
    model = _windowed(3, static_out=5)
    specs = input_specs(model)
    sizes = [c[0]["x"][1] for c in size_candidates(specs, None, model)]
    assert sizes[:8] == [128, 64, 32, 16, 8, 4, 2, 1]
    assert sizes[8:] == [126, 125, 5, 3]  # 3 and 5 (-1 and the Reshape's 4 are no news)
    assert size_candidates(specs) == size_candidates(specs, None, None)[:8]  # without the model: the halvings
    assert size_candidates(specs, {"x": (1, 6, 4)}, model) == [({"x": (1, 6, 4)}, "")]  # the user's sizes only


def test_compare_runs_a_windowed_model_at_a_length_it_implies():
    """A model exported with a fixed window runs at no power of two: compare picks the longest length its
    constants imply, and says so."""
    from onnxfuse.compare import compare_models

    model = _windowed(3)
    report = compare_models(model, model, progress=False)
    assert report.passed and report.input_shapes == {"x": [1, 126, 4]}
    assert "sequence=126 (chosen: the model does not run at sequence=128)" in report.inputs


def test_compare_names_the_lengths_it_tried_and_the_shape_to_give():
    """Where no length the model implies runs either, the one-line error lists what was tried and names the
    --shape to give."""
    from onnxfuse.compare import compare_models

    model = _windowed(3)
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.array([-1, 7, 5], np.int64), "windows"))
    with pytest.raises(BadInputError) as e:
        compare_models(model, model, progress=False)
    line = str(e.value)
    assert "\n" not in line
    assert "nor with sequence=128 halved down to 1, nor at 126, 125, 7 or 5, lengths the model's dims" in line
    assert "--shape NAME=DIMS, inputs x: float[batch,sequence,4]" in line


def test_tried_sizes_without_implied_lengths_names_the_halvings():
    specs = input_specs(_windowed(3))
    assert tried_sizes(size_candidates(specs)) == "sequence=128 halved down to 1"
