"""A session with its inputs and outputs bound on its device (IO binding): a timed run moves no data
across PCIe, and the buffers' addresses stay fixed, which CUDA-graph replay needs."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from ..errors import BadInputError, one_line
from ..runtime import CUDA


def _device_of(session) -> str:
    """Where the session's inputs and outputs live: the device of the provider it was asked to run on."""
    return "cuda" if session.get_providers()[0] == CUDA else "cpu"


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
        device = _device_of(session)
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
    device = _device_of(session)
    binding = session.io_binding()
    keep = _bind_inputs(binding, feeds, device)  # noqa: F841  (alive until the run is over)
    names = [o.name for o in session.get_outputs()]
    for name in names:
        binding.bind_output(name, device)
    try:
        session.run_with_iobinding(binding)
    except Exception as e:
        raise BadInputError(f"the model does not run on these inputs: {one_line(e)}") from e
    return {name: tuple(v.shape()) for name, v in zip(names, binding.get_outputs())}
