"""The benchmarks under bench/ are scripts, not a package: their tests load them by path."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load_bench_script(name: str) -> ModuleType:
    """bench/<name>.py as the module ``onnxfuse_bench_<name>``. It is registered in sys.modules before it runs
    (dataclasses look their module up while the file runs), and bench/ is put on sys.path, as when the script
    is run, for those that import a sibling (cuda_kernel.py imports cupti.py)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"onnxfuse_bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
