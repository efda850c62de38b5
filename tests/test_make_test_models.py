"""scripts/make_test_models.py writes exactly the committed files: re-export one family into a temporary
folder and compare bytes and manifest entries. Needs the ``export`` extra at the versions the manifest
records (skipped otherwise: the other tests load the committed files and need no torch)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "tests" / "models"
SCRIPT = ROOT / "scripts" / "make_test_models.py"
FAMILY = "convnext"  # the quickest family to export: two exports, no ORT post-processing


@pytest.mark.slow
def test_generator_reproduces_the_committed_models(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("onnxscript")  # the dynamo exporter's translator
    manifest = json.loads((MODELS / "manifest.json").read_text())
    made_with = manifest["generator"]
    here = {"torch": torch.__version__, "transformers": transformers.__version__, "onnx": onnx.__version__}
    if any(here[k] != made_with[k] for k in here):
        pytest.skip(f"the committed models were made with {made_with}, this environment has {here}")

    run = subprocess.run([sys.executable, str(SCRIPT), "--only", FAMILY, "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]

    out = tmp_path / "tests" / "models"
    committed = {m["file"]: m for m in manifest["models"] if m["file"].startswith(FAMILY + "_")}
    written = {m["file"]: m for m in json.loads((out / "manifest.json").read_text())["models"]}
    assert committed and set(written) == set(committed)
    for file, entry in committed.items():
        assert written[file] == entry, file
        assert (out / file).read_bytes() == (MODELS / file).read_bytes(), f"{file} differs from its export"
