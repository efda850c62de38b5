"""Deferred tensors: new constants the rewrite makes from external weights without reading them, computed
only while the model is saved.

A rule may need a weight in another form (transposed, scaled, converted) or several weights side by side (Q,
K and V packed). For an inline source the new tensor is computed at once. For an external source nothing is
read: the model gets a placeholder whose external location is :data:`PENDING` (so a writer that does not
know about it fails loudly instead of writing the wrong bytes), and the rewrite keeps, by the tensor's name,
the recipe that computes its bytes from the sources' (a :data:`Deferred`: :class:`Derived` or
:class:`Concatenation`). ``model_save.save_model`` reads each recipe's ``sources`` from the input's data
files and writes what the recipe returns, one tensor at a time, so weights are never all in memory.

The rewrite (``fuse``) builds them with :func:`derived` and :func:`concatenated`; saving evaluates them.
Neither needs the other's internals: this module is what they share.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.external_data_helper import ExternalDataInfo

# The external location of a tensor that exists only once the model is saved: any other reader fails on it
# rather than reading the wrong bytes.
PENDING = "onnxfuse-pending-until-saved"

_TILE = 512  # elements per side: a tile pair fits in L2, so neither side is walked with a cache-line stride


def transposed(a: np.ndarray) -> np.ndarray:
    """``a.T`` as a contiguous array, copied tile by tile (about twice as fast as numpy's strided copy on
    the [K, N] weights of large models)."""
    rows, cols = a.shape
    out = np.empty((cols, rows), dtype=a.dtype)
    for i in range(0, rows, _TILE):
        for j in range(0, cols, _TILE):
            out[j:j + _TILE, i:i + _TILE] = a[i:i + _TILE, j:j + _TILE].T
    return out


@dataclass(frozen=True, eq=False)
class Derived:
    """How a new constant's bytes come from its source's: transposed, scaled and/or converted, applied while
    saving for an external source, one tensor at a time. ``source`` is the source tensor's external
    reference (no data)."""

    source: onnx.TensorProto
    source_dims: tuple[int, ...]
    transpose: bool = False
    scale: float | None = None
    data_type: int | None = None  # the new tensor's type, when it differs from the source's

    @property
    def sources(self) -> tuple[onnx.TensorProto, ...]:
        """The external tensors read to compute it, in the order ``__call__`` takes their flat arrays."""
        return (self.source,)

    def __call__(self, flat: np.ndarray) -> np.ndarray:
        a = flat.reshape(self.source_dims)
        to = flat.dtype if self.data_type is None else helper.tensor_dtype_to_np_dtype(self.data_type)
        if self.scale is not None:
            # In float64, rounded once to the tensor's type: the correctly rounded alpha·W.
            a = (a.astype(np.float64) * self.scale).astype(to)
        elif to != flat.dtype:
            a = a.astype(to)  # round to nearest even, once
        return transposed(a) if self.transpose else np.ascontiguousarray(a)


@dataclass(frozen=True, eq=False)
class Concatenation:
    """A new constant made of stored ones side by side along ``axis`` (Q, K and V's weights as one [D_in, 3D]):
    each part is an external source's reference (``onnx.TensorProto``, no data), read while saving, or inline
    values (``np.ndarray``: an inline tensor, the zeros of a missing bias). Every entry is one of the parts':
    nothing is computed, so the values are the stored ones bit for bit."""

    parts: tuple  # of onnx.TensorProto (external) or np.ndarray (inline)
    part_dims: tuple[tuple[int, ...], ...]
    axis: int | None  # None: each part flattened, end to end (numpy's axis=None)

    @property
    def sources(self) -> tuple[onnx.TensorProto, ...]:
        return tuple(p for p in self.parts if isinstance(p, onnx.TensorProto))

    def __call__(self, *flats: np.ndarray) -> np.ndarray:
        read = iter(flats)
        arrays = [next(read).reshape(dims) if isinstance(part, onnx.TensorProto) else part
                  for part, dims in zip(self.parts, self.part_dims)]
        return np.ascontiguousarray(np.concatenate(arrays, axis=self.axis))


# A deferred tensor's recipe: ``sources`` (the external references it reads) and a call on their flat arrays.
Deferred = Derived | Concatenation


def pending(name: str, data_type: int, dims) -> onnx.TensorProto:
    """The placeholder of a tensor computed while saving: external, at :data:`PENDING`."""
    t = onnx.TensorProto(name=name, data_type=data_type, dims=list(dims))
    t.data_location = onnx.TensorProto.EXTERNAL
    t.external_data.add(key="location", value=PENDING)
    return t


def is_pending(t: onnx.TensorProto) -> bool:
    """Whether ``t`` (an external tensor) is a placeholder whose bytes exist only once the model is saved."""
    return ExternalDataInfo(t).location == PENDING


def external_reference(t: onnx.TensorProto) -> onnx.TensorProto:
    """An external tensor's reference without its data: where saving reads it from."""
    ref = onnx.TensorProto(name=t.name, data_type=t.data_type, dims=list(t.dims))
    ref.data_location = onnx.TensorProto.EXTERNAL
    ref.external_data.extend(t.external_data)
    return ref


def derived(source: onnx.TensorProto, name: str, dims, data_type: int, *, transpose: bool = False,
            scale: float | None = None) -> tuple[onnx.TensorProto, Derived | None]:
    """The tensor ``name`` (``dims``, ``data_type``) made from ``source``: computed now for an inline source
    (recipe None); for an external one, a placeholder and the recipe saving applies."""
    if source.data_location == onnx.TensorProto.EXTERNAL:
        return (pending(name, data_type, dims),
                Derived(external_reference(source), tuple(source.dims), transpose, scale, data_type))
    recipe = Derived(onnx.TensorProto(), tuple(source.dims), transpose, scale, data_type)
    value = recipe(numpy_helper.to_array(source).reshape(-1))
    return numpy_helper.from_array(value.reshape(dims), name), None


def concatenated(name: str, parts: list, axis: int | None) -> tuple[onnx.TensorProto, Concatenation | None]:
    """The tensor ``name`` made of ``parts`` (stored tensors, ``onnx.TensorProto``, or values, ``np.ndarray``)
    side by side along ``axis``: computed now when no stored part is external (recipe None); else a
    placeholder and the recipe saving applies, the external parts read while saving."""
    if not any(isinstance(p, onnx.TensorProto) and p.data_location == onnx.TensorProto.EXTERNAL for p in parts):
        values = [p if isinstance(p, np.ndarray) else numpy_helper.to_array(p) for p in parts]
        return numpy_helper.from_array(np.asarray(np.concatenate(values, axis=axis)), name), None
    stored = []
    for p in parts:
        if isinstance(p, np.ndarray):
            stored.append(p)
        elif p.data_location == onnx.TensorProto.EXTERNAL:
            stored.append(external_reference(p))
        else:
            stored.append(numpy_helper.to_array(p))
    part_dims = tuple(tuple(p.shape) if isinstance(p, np.ndarray) else tuple(p.dims) for p in parts)
    if axis is None:
        dims = [sum(int(np.prod(d, dtype=np.int64)) for d in part_dims)]
    else:
        dims = list(part_dims[0])
        dims[axis] = sum(d[axis] for d in part_dims)
    data_type = next(p.data_type for p in parts if isinstance(p, onnx.TensorProto))
    return pending(name, data_type, dims), Concatenation(tuple(stored), part_dims, axis)
