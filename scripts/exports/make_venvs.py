#!/usr/bin/env python3
"""Create one virtual environment per exporter configuration of the export corpus, each from the pinned
requirements file beside this script (``requirements/<name>.txt``).

    python scripts/exports/make_venvs.py                   # every configuration, under /work/venvs
    python scripts/exports/make_venvs.py tf4_36 tf4_57     # some of them
    python scripts/exports/make_venvs.py --root /tmp/venvs --recreate tf5

Each environment is ``<root>/<name>``, made with this interpreter's ``venv`` module (Python 3.11: the oldest
torch of the corpus, 2.1, has wheels for it) and filled by ``pip install -r``; pip's own configuration (index,
extra indexes, find-links, constraints) is left as the machine has it. torch comes as the CPU build where the
index serves one (``+cpu``), else as the plain wheel with its CUDA libraries, which the exports never load.
An existing environment is kept (and only probed) unless ``--recreate``.

Never run in CI (the environments are several GB): ``scripts/exports/export_corpus.py`` runs inside each one,
``scripts/exports/tally_corpus.py`` reads what they wrote.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE / "requirements"
DEFAULT_ROOT = Path("/work/venvs")
# What each environment must import once installed, and the versions the corpus records.
PROBE = ("import sys, torch, transformers, onnx, onnxruntime; "
         "print(sys.version.split()[0], torch.__version__, transformers.__version__, onnx.__version__, "
         "onnxruntime.__version__)")


def configurations() -> list[str]:
    return sorted(p.stem for p in REQUIREMENTS.glob("*.txt"))


def create(name: str, root: Path, recreate: bool) -> tuple[bool, str]:
    """(ok, one line): the environment made (or found) and what it imports, or pip's last error line."""
    venv = root / name
    python = venv / "bin" / "python"
    if venv.exists() and recreate:
        shutil.rmtree(venv)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
        start = time.monotonic()
        run = subprocess.run([str(python), "-m", "pip", "install", "--progress-bar", "off", "-r",
                              str(REQUIREMENTS / f"{name}.txt")], capture_output=True, text=True)
        if run.returncode != 0:
            errors = [line for line in run.stderr.splitlines() if line.startswith("ERROR")] or run.stderr.splitlines()
            return False, errors[-1] if errors else f"pip exited {run.returncode}"
        print(f"{name}: installed in {time.monotonic() - start:.0f} s", file=sys.stderr)
    probe = subprocess.run([str(python), "-c", PROBE], capture_output=True, text=True)
    if probe.returncode != 0:
        return False, (probe.stderr.strip().splitlines() or ["import failed"])[-1]
    py, torch, transformers, onnx, ort = probe.stdout.split()
    return True, f"python {py}, torch {torch}, transformers {transformers}, onnx {onnx}, onnxruntime {ort}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help=f"configurations (default: all of {', '.join(configurations())})")
    ap.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="where the environments go")
    ap.add_argument("--recreate", action="store_true", help="delete and re-make an existing environment")
    args = ap.parse_args()
    names = args.names or configurations()
    unknown = sorted(set(names) - set(configurations()))
    if unknown:
        ap.error(f"no requirements file for {', '.join(unknown)}")
    failed = 0
    for name in names:
        ok, line = create(name, args.root, args.recreate)
        failed += not ok
        print(f"{name}: {'ok' if ok else 'FAILED'}: {line}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
