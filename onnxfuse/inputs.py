"""Model inputs for comparing and benchmarking: read the input specs of an ONNX model, resolve its dynamic
dimensions, and either generate random inputs or load the user's (``.npz`` or ONNX ``test_data_set_*``
folders of ``.pb`` tensors).

Every sample is a ``dict[input name, numpy array]``. bfloat16 arrays use ``ml_dtypes.bfloat16``.

Defaults, when the user gives no ``--shape`` for an input:

* a dynamic dimension named like a batch (``batch``, ``N``, ``b``…) or in axis 0 becomes ``DEFAULT_BATCH`` (1);
  any other dynamic dimension (sequence, tokens, height, ``M``…) becomes ``DEFAULT_DYNAMIC`` (128).
  Dimensions that share a name share a value: ``--shape input_ids=2,64`` also makes ``attention_mask``
  ``[2, 64]`` when both are declared ``[batch, sequence]``.
* floating inputs: standard normal, drawn in float32 then cast to the input's type.
* integer inputs: masks (the name contains ``mask``) are all ones, or, for a ``padded`` sample of a
  ``[batch, sequence]`` mask, padded on the right as a tokenizer pads a batch: every row keeps a random 1 to
  sequence tokens, row 0 of a batch of several all of them (``compare`` draws its samples after the first so:
  the attention rewrite reproduces the masks, and the gate should see them used); position ids (``position``) count
  ``0, 1, 2…`` along the last axis; ids that feed a ``Gather`` whose table is a constant are drawn
  uniformly in ``[0, table rows)`` (token ids stay inside the vocabulary); other integers in
  ``[0, DEFAULT_INT_HIGH)``.
* bool inputs: masks are all True (or padded, as integer masks), others random.

Where a model does not run at the default sizes, ``compare`` tries others (:func:`size_candidates`): the defaulted
non-batch dims halved down to 1, then the lengths the model itself implies — the fixed dimensions it declares
(inputs, outputs, ``value_info``) and the small integer constants of its graph (a window or chunk a Reshape splits
the sequence into), each as the largest multiple of it up to the default and as itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .errors import BadInputError

DEFAULT_BATCH = 1
DEFAULT_DYNAMIC = 128
DEFAULT_INT_HIGH = 100

_BATCH_NAMES = re.compile(r"^(n|b|bs|batch.*|.*_batch|.*batch_size.*)$", re.IGNORECASE)
_SEQUENCE_NAMES = re.compile(r"seq|len|token|time|step|position", re.IGNORECASE)
# Ops that carry integer ids unchanged on their way to an embedding Gather.
_PASS_THROUGH = {"Cast", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Identity", "Expand"}


Dim = int | str | None
Sample = dict[str, np.ndarray]


@dataclass(frozen=True)
class InputSpec:
    """One graph input as declared in the model."""

    name: str
    elem_type: int  # onnx.TensorProto data type
    shape: tuple[Dim, ...]  # int for a fixed dim, str for a named dynamic dim, None for an anonymous one

    @property
    def dtype(self) -> np.dtype:
        return np_dtype(self.elem_type)

    @property
    def type_name(self) -> str:
        return TensorProto.DataType.Name(self.elem_type).lower()

    def describe(self) -> str:
        dims = ",".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.name}: {self.type_name}[{dims}]"


def np_dtype(elem_type: int) -> np.dtype:
    """numpy dtype for an ONNX element type (bfloat16 through ml_dtypes)."""
    if elem_type == TensorProto.BFLOAT16:
        return np.dtype(ml_dtypes.bfloat16)
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, ValueError) as e:
        raise BadInputError(f"unsupported tensor type {TensorProto.DataType.Name(elem_type)}") from e


def input_specs(model: onnx.ModelProto) -> list[InputSpec]:
    """The inputs a caller must feed: graph inputs that are not initializers (older exporters list
    initializers as inputs too), in graph order."""
    initializers = {t.name for t in model.graph.initializer}
    specs = []
    for vi in model.graph.input:
        if vi.name in initializers:
            continue
        if not vi.type.HasField("tensor_type"):
            raise BadInputError(f"input '{vi.name}' is not a tensor; only tensor inputs are supported")
        tt = vi.type.tensor_type
        shape: tuple[Dim, ...] = ()
        if tt.HasField("shape"):
            shape = tuple(
                d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim
            )
        else:
            raise BadInputError(f"input '{vi.name}' declares no shape (not even its rank); give one in the model")
        specs.append(InputSpec(vi.name, tt.elem_type, shape))
    return specs


def parse_shape_option(text: str) -> tuple[str, tuple[int, ...]]:
    """One ``--shape``: ``input_ids=1,128``, or as onnxsim, onnxslim and polygraphy write it
    ``input_ids:1,128`` (also ``input_ids:[1,128]``); the dims separated by ``,`` or ``x`` (``1x128``) ->
    ``("input_ids", (1, 128))``. A name may hold ``:`` (TensorFlow's ``input:0``) but no dim does: with ``=``
    the name is what comes before the first ``=``, without it what comes before the last ``:``."""
    if "=" in text:
        name, sep, dims = text.partition("=")
    else:
        name, sep, dims = text.rpartition(":")
    name, dims = name.strip(), dims.strip()
    if dims.startswith("[") and dims.endswith("]"):
        dims = dims[1:-1].strip()
    if not sep or not name or not dims:
        raise BadInputError(f"--shape '{text}': expected NAME=DIMS or NAME:DIMS, e.g. input_ids=1,128 or "
                            "input_ids:1x128")
    try:
        values = tuple(int(d) for d in re.split(r"[,x×]", dims))
    except ValueError:
        raise BadInputError(f"--shape '{text}': dimensions must be integers separated by ',' or 'x', e.g. "
                            "input_ids=1,128") from None
    if any(v < 0 for v in values):
        raise BadInputError(f"--shape '{text}': dimensions must not be negative")
    return name, values


def resolve_shapes(specs: list[InputSpec], shapes: dict[str, tuple[int, ...]] | None = None) -> dict[str, tuple[int, ...]]:
    """Concrete shape for every input: the user's ``shapes`` first, then named dims bound by them, then
    the defaults described in the module docstring."""
    shapes = dict(shapes or {})
    by_name = {s.name: s for s in specs}
    unknown = sorted(set(shapes) - set(by_name))
    if unknown:
        raise BadInputError(
            f"--shape names {', '.join(unknown)}, which the model does not take as input "
            f"(inputs: {', '.join(by_name) or 'none'})"
        )
    bound: dict[str, int] = {}
    for name, dims in shapes.items():
        spec = by_name[name]
        if len(dims) != len(spec.shape):
            raise BadInputError(f"--shape {name}: {len(dims)} dims given, the model declares {spec.describe()}")
        for axis, (want, declared) in enumerate(zip(dims, spec.shape)):
            if isinstance(declared, int) and declared != want:
                raise BadInputError(
                    f"--shape {name}: axis {axis} is fixed to {declared} in the model ({spec.describe()}), got {want}"
                )
            if isinstance(declared, str):
                if bound.setdefault(declared, want) != want:
                    raise BadInputError(
                        f"--shape gives dimension '{declared}' two values ({bound[declared]} and {want})"
                    )
    resolved = {}
    for spec in specs:
        if spec.name in shapes:
            resolved[spec.name] = tuple(shapes[spec.name])
            continue
        dims = []
        for axis, d in enumerate(spec.shape):
            if isinstance(d, int):
                dims.append(d)
            elif isinstance(d, str) and d in bound:
                dims.append(bound[d])
            else:
                value = _default_dim(d, axis)
                if isinstance(d, str):
                    bound[d] = value
                dims.append(value)
        resolved[spec.name] = tuple(dims)
    return resolved


def size_candidates(specs: list[InputSpec], shapes: dict[str, tuple[int, ...]] | None = None,
                    model: onnx.ModelProto | None = None) -> list[tuple[dict[str, tuple[int, ...]], str]]:
    """The input shapes to try, in order, when the user leaves dynamic dims to the defaults: the defaults
    first, then every defaulted non-batch dim halved, down to 1 (a model may cap a sequence: a CLIP text
    tower with a 77-row position table does not run at 128 tokens), then, given ``model``, the lengths it
    implies (:func:`implied_lengths`: a model exported with a fixed window may run only at multiples of it).
    Each is (full shapes, a description of the defaulted dims, e.g. ``"sequence=64"``); a model without
    defaulted non-batch dims gets one. :func:`tried_sizes` says which were tried, for an error."""
    user = dict(shapes or {})
    resolved = resolve_shapes(specs, user)
    bound_by_user = {d for s in specs if s.name in user for d in s.shape if isinstance(d, str)}
    sized: list[tuple[str, int, str]] = []  # (input, axis, dim label) of the dims the default sized
    for spec in specs:
        if spec.name in user:
            continue
        for axis, d in enumerate(spec.shape):
            if isinstance(d, int) or (isinstance(d, str) and d in bound_by_user):
                continue
            if resolved[spec.name][axis] == DEFAULT_DYNAMIC:
                sized.append((spec.name, axis, d if isinstance(d, str) else f"{spec.name}[{axis}]"))
    labels = list(dict.fromkeys(label for _, _, label in sized))

    def at(size: int) -> tuple[dict[str, tuple[int, ...]], str]:
        candidate = {name: list(dims) for name, dims in resolved.items()}
        for name, axis, _ in sized:
            candidate[name][axis] = size
        return {k: tuple(v) for k, v in candidate.items()}, ", ".join(f"{label}={size}" for label in labels)

    if not sized:
        return [at(DEFAULT_DYNAMIC)]
    halved = [DEFAULT_DYNAMIC >> k for k in range(_HALVINGS)]
    implied = [n for n in implied_lengths(model) if n not in halved] if model is not None else []
    return [at(size) for size in halved + implied]


_HALVINGS = DEFAULT_DYNAMIC.bit_length()  # DEFAULT_DYNAMIC, its half, ... 1
_MAX_IMPLIED = 1024  # a length a model implies is tried only up to this (one run of the model at batch 1)
_MAX_IMPLIED_TRIED = 12


def implied_lengths(model: onnx.ModelProto) -> list[int]:
    """Sequence lengths a model's own numbers suggest it runs at, longest first: for each fixed dimension it
    declares (inputs, outputs, ``value_info``) and each entry of its small integer constants (up to 8 entries,
    stored inline: reshape targets, window sizes, slice bounds) from 2 to ``_MAX_IMPLIED``, the largest multiple of
    it up to ``DEFAULT_DYNAMIC`` and itself. A guess to try, never an assumption: ``compare`` keeps the first the
    original model runs at."""
    graph = model.graph
    values: set[int] = set()
    for vi in (*graph.input, *graph.output, *graph.value_info):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
            values.update(d.dim_value for d in vi.type.tensor_type.shape.dim if d.HasField("dim_value"))
    stored = list(graph.initializer) + [a.t for n in graph.node if n.op_type == "Constant" for a in n.attribute
                                        if a.name == "value" and a.type == onnx.AttributeProto.TENSOR]
    for t in stored:
        if t.data_type in (TensorProto.INT64, TensorProto.INT32) and len(t.dims) <= 1 and \
                int(np.prod(t.dims, dtype=np.int64)) <= 8 and t.data_location != TensorProto.EXTERNAL:
            values.update(int(v) for v in numpy_helper.to_array(t).reshape(-1))
    lengths: list[int] = []
    for v in sorted((v for v in values if 2 <= v <= _MAX_IMPLIED), reverse=True):
        lengths += [v * (DEFAULT_DYNAMIC // v)] if v <= DEFAULT_DYNAMIC else []
        lengths.append(v)
    return sorted(set(lengths), reverse=True)[:_MAX_IMPLIED_TRIED]


def tried_sizes(candidates: list[tuple[dict[str, tuple[int, ...]], str]]) -> str:
    """The sizes :func:`size_candidates` tried, as an error says them: ``"sequence=128 halved down to 1"``, and
    the lengths the model implies where there were any (``", nor at 126 or 3, lengths the model's dims and
    constants imply"``)."""
    text = f"{candidates[0][1]} halved down to 1"
    implied = [label.rsplit("=", 1)[-1] for _, label in candidates[_HALVINGS:]]  # every sized dim has the one size
    if implied:
        listed = f"{', '.join(implied[:-1])} or {implied[-1]}" if len(implied) > 1 else implied[0]
        text += f", nor at {listed}, lengths the model's dims and constants imply"
    return text


def _default_dim(name: str | None, axis: int) -> int:
    """Batch-like dims get DEFAULT_BATCH, sequence-like ones DEFAULT_DYNAMIC; an unnamed or unclear dim
    counts as a batch in axis 0 and as a sequence elsewhere."""
    if name is not None and _BATCH_NAMES.match(name):
        return DEFAULT_BATCH
    if name is not None and _SEQUENCE_NAMES.search(name):
        return DEFAULT_DYNAMIC
    return DEFAULT_BATCH if axis == 0 else DEFAULT_DYNAMIC


def gather_bounds(model: onnx.ModelProto) -> dict[str, int]:
    """For each graph input that indexes a constant table through ``Gather`` (possibly via Cast, Unsqueeze
    and friends), the number of rows of the smallest such table: ids must stay below it."""
    constant_dims: dict[str, list[int]] = {t.name: list(t.dims) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output:
            for attr in node.attribute:
                if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
                    constant_dims[node.output[0]] = list(attr.t.dims)
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    bounds: dict[str, int] = {}
    for spec in input_specs(model):
        frontier, seen, found = [spec.name], set(), []
        while frontier:
            value = frontier.pop()
            if value in seen:
                continue
            seen.add(value)
            for node in consumers.get(value, []):
                if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == value:
                    table = constant_dims.get(node.input[0])
                    if table:
                        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                        found.append(table[axis % len(table)])
                elif node.op_type in _PASS_THROUGH and node.input[0] == value:
                    frontier.extend(node.output)
        if found:
            bounds[spec.name] = min(found)
    return bounds


def padded_masks(model: onnx.ModelProto) -> list[str]:
    """The inputs a ``padded`` sample pads (``random_inputs``): masks (integer or bool inputs named like one)
    of shape [batch, sequence] whose sequence is not fixed at 1."""
    return [spec.name for spec in input_specs(model)
            if "mask" in spec.name.lower() and len(spec.shape) == 2 and spec.shape[1] != 1
            and (spec.dtype == np.bool_ or np.issubdtype(spec.dtype, np.integer))]


def default_samples(model: onnx.ModelProto) -> int:
    """How many random samples the accuracy gate draws unless told: 2 where the model has a mask to pad (whole
    in the first, padded on the right in the second, so that the gate sees the mask used), else 1."""
    return 2 if padded_masks(model) else 1


def random_inputs(
    model: onnx.ModelProto,
    shapes: dict[str, tuple[int, ...]] | None = None,
    *,
    seed: int = 0,
    padded: bool = False,
) -> Sample:
    """One sample of inputs for ``model``, reproducible from ``seed`` (see the module docstring for the
    value ranges; ``padded``: ``[batch, sequence]`` masks padded on the right). Public so that benchmarks
    feed the same inputs as the accuracy gate."""
    specs = input_specs(model)
    resolved = resolve_shapes(specs, shapes)
    bounds = gather_bounds(model)
    rng = np.random.default_rng(seed)
    # the padding draws from a stream of its own: a padded sample differs from the plain one in its masks only
    padding = np.random.default_rng([seed, 1]) if padded else None
    return {spec.name: _random_array(spec, resolved[spec.name], bounds.get(spec.name), rng, padding)
            for spec in specs}


def _mask(shape: tuple[int, ...], dtype, padding: np.random.Generator | None) -> np.ndarray:
    """All ones; or, with ``padding`` and [batch, sequence], right padding: each row keeps a random 1 to sequence
    tokens (never none: a row with no token is no input a tokenizer makes), except that in a batch of
    several row 0 is whole, as the longest text of a padded batch is."""
    mask = np.ones(shape, dtype=dtype)
    if padding is not None and len(shape) == 2 and shape[1] > 1:
        for row in range(1 if shape[0] > 1 else 0, shape[0]):
            mask[row, int(padding.integers(1, shape[1] + 1)):] = 0
    return mask


def _random_array(spec: InputSpec, shape: tuple[int, ...], gather_rows: int | None, rng: np.random.Generator,
                  padding: np.random.Generator | None = None) -> np.ndarray:
    dtype = spec.dtype
    lowered = spec.name.lower()
    if dtype == np.bool_:
        if "mask" in lowered:
            return _mask(shape, np.bool_, padding)
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if np.issubdtype(dtype, np.integer):
        if "mask" in lowered:
            return _mask(shape, dtype, padding)
        if "position" in lowered and len(shape) >= 1:
            return np.broadcast_to(np.arange(shape[-1], dtype=dtype), shape).copy()
        high = gather_rows if gather_rows is not None else DEFAULT_INT_HIGH
        high = min(high, int(np.iinfo(dtype).max) + 1)
        low = 0
        return rng.integers(low, max(high, 1), size=shape).astype(dtype)
    if dtype.kind == "f" or dtype == np.dtype(ml_dtypes.bfloat16):
        return rng.standard_normal(size=shape, dtype=np.float32).astype(dtype)
    raise BadInputError(f"cannot generate random values for input {spec.describe()}; pass --inputs")


# --- user-provided inputs ----------------------------------------------------------------------------


def load_inputs(path: str | Path, model: onnx.ModelProto) -> list[Sample]:
    """Samples from ``path``: one ``.npz`` file (one sample, keys = input names); a folder of ``.npz``
    files (one sample each, sorted by name); an ONNX ``test_data_set_*`` folder (``input_0.pb``…); or a
    folder holding several ``test_data_set_*`` folders (one sample each). Every sample is checked
    against the model's inputs."""
    path = Path(path)
    specs = input_specs(model)
    if not path.exists():
        raise BadInputError(f"inputs '{path}' do not exist")
    if path.is_file():
        if path.suffix != ".npz":
            raise BadInputError(f"inputs '{path}': expected a .npz file or a folder of test_data_set_* / .npz files")
        samples = [_load_npz(path)]
    elif sorted(path.glob("input_*.pb")):
        samples = [_load_pb_folder(path, specs)]
    elif sorted(p for p in path.glob("test_data_set_*") if p.is_dir()):
        sets = sorted((p for p in path.glob("test_data_set_*") if p.is_dir()), key=_natural_key)
        samples = [_load_pb_folder(p, specs) for p in sets]
    elif sorted(path.glob("*.npz")):
        samples = [_load_npz(p) for p in sorted(path.glob("*.npz"), key=_natural_key)]
    else:
        raise BadInputError(f"inputs folder '{path}' holds no input_*.pb, test_data_set_* or .npz files")
    return [check_sample(s, specs, source=str(src)) for s, src in samples]


def _natural_key(p: Path) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name)]


def _load_npz(path: Path) -> tuple[Sample, Path]:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}, path
    except Exception as e:  # zipfile, pickle or format errors all mean the same to the user
        raise BadInputError(f"cannot read inputs '{path}': {type(e).__name__}: {e}") from e


def _load_pb_folder(folder: Path, specs: list[InputSpec]) -> tuple[Sample, Path]:
    """An ONNX test-data folder: ``input_<i>.pb`` TensorProtos. A tensor named after an input feeds that
    input; an unnamed one feeds the input at position ``i`` (the ONNX backend-test convention)."""
    files = sorted(folder.glob("input_*.pb"), key=_natural_key)
    sample: Sample = {}
    for index, file in enumerate(files):
        tensor = TensorProto()
        try:
            tensor.ParseFromString(file.read_bytes())
            array = numpy_helper.to_array(tensor)
        except Exception as e:
            raise BadInputError(f"cannot read tensor '{file}': {type(e).__name__}: {e}") from e
        name = tensor.name
        if not name:
            if index >= len(specs):
                raise BadInputError(f"'{file}' is input #{index}, but the model takes only {len(specs)} inputs")
            name = specs[index].name
        if name in sample:
            raise BadInputError(f"'{folder}' holds input '{name}' twice")
        sample[name] = array
    return sample, folder


def check_sample(sample: Sample, specs: list[InputSpec], *, source: str = "inputs") -> Sample:
    """The sample, checked against the model's inputs: same names, compatible types (a value of the
    same kind is cast: float64 data feeds a float32 input, int32 ids an int64 input), ranks and fixed
    dimensions. Raises ``BadInputError`` naming the first problem."""
    names = {s.name for s in specs}
    missing = [s.name for s in specs if s.name not in sample]
    extra = sorted(set(sample) - names)
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {', '.join(missing)}")
        if extra:
            parts.append(f"not inputs of the model: {', '.join(extra)}")
        raise BadInputError(f"{source}: {'; '.join(parts)} (model inputs: {', '.join(s.name for s in specs)})")
    checked = {}
    for spec in specs:
        array = np.asarray(sample[spec.name])
        want = spec.dtype
        if array.dtype != want:
            if _kind(array.dtype) != _kind(want):
                raise BadInputError(
                    f"{source}: '{spec.name}' holds {array.dtype}, the model takes {spec.type_name}"
                )
            array = array.astype(want)
        if array.ndim != len(spec.shape):
            raise BadInputError(f"{source}: '{spec.name}' has shape {list(array.shape)}, the model takes {spec.describe()}")
        for axis, (got, declared) in enumerate(zip(array.shape, spec.shape)):
            if isinstance(declared, int) and declared != got:
                raise BadInputError(
                    f"{source}: '{spec.name}' has shape {list(array.shape)}, the model takes {spec.describe()}"
                    f" (axis {axis})"
                )
        checked[spec.name] = array
    return checked


def _kind(dtype: np.dtype) -> str:
    """'f' for every floating type (bfloat16 included), 'i' for integers of either sign, else numpy's kind."""
    if dtype == np.dtype(ml_dtypes.bfloat16) or dtype.kind == "f":
        return "f"
    if dtype.kind in "iu":
        return "i"
    return dtype.kind
