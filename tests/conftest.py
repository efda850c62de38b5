"""Fixtures shared by every test module: keep this small and generic."""

from __future__ import annotations

import os

import numpy as np
import pytest


@pytest.fixture(scope="session")
def library_path() -> str:
    """The op library the package would hand to ONNX Runtime (ONNXFUSE_LIBRARY overrides). CI builds it, so
    there its absence fails the test; elsewhere (a Python-only checkout) the test skips and says why."""
    from onnxfuse.errors import BadInputError
    from onnxfuse.runtime import get_library_path

    try:
        return get_library_path()
    except BadInputError as e:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"op library not built here: {e}")


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261129)


@pytest.fixture(autouse=True)
def _tables_as_wide_as_a_log(monkeypatch):
    """The command line's tables take COLUMNS where it is set, and a parent process that imported readline
    (pytest's does) exports COLUMNS=80 to every child: tests read the tables at one width, a log's, whatever the
    caller's shell holds, unless they set their own."""
    monkeypatch.setenv("COLUMNS", "200")
