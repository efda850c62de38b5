"""What every bench report says about itself: its schema, and where its numbers were made."""

from __future__ import annotations

import platform

import numpy as np
import onnx
import onnxruntime as ort

from ..version import __version__

# The reports' format: a name their readers match on, kept as it was when the package was called bench.
SCHEMA = "onnxfuse.bench/1"


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
