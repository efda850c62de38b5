"""Fixtures shared by every test module: keep this small and generic."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="session")
def library_path() -> str:
    """The op library the package would hand to ONNX Runtime (ONNXFUSE_LIBRARY overrides)."""
    from onnxfuse.runtime import get_library_path

    return get_library_path()


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261129)
