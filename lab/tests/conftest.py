"""Fixtures of the lab's tests. The op library is found exactly as the product tests find it (tests/conftest.py:
ONNXFUSE_LIBRARY or the built package; a skip outside CI where it is not built), so a lab test never runs
against a different library than the suite beside it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "onnxfuse_tests_conftest", Path(__file__).resolve().parents[2] / "tests" / "conftest.py")
_product_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_product_fixtures)

library_path = _product_fixtures.library_path
