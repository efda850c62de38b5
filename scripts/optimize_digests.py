"""Digests of what `onnxfuse optimize` writes for every committed model: the check that a refactor changed
no behaviour.

    python scripts/optimize_digests.py --out before.json          # on the commit you start from
    python scripts/optimize_digests.py --check before.json        # after the change: exit 1 on any difference

For each committed model (``tests/models/**.onnx``, ``sample_models/*.onnx``) and each configuration below,
it runs the CLI in process (``onnxfuse optimize MODEL -o OUT --json REPORT`` through click's test runner:
the same parsing, the same code path, no interpreter per model) and records the sha256 of every file written
(the model, its external data) and of the JSON report with its timings and paths removed, plus the exit
code. ``--ort-fusions`` is included: ORT's transformers optimizer is part of what ``optimize`` runs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = {
    "default": [],
    "tanh": ["--approximate", "tanh"],
    "cpu": ["--target", "cpu"],
    "ort-fusions": ["--ort-fusions"],
}
_VOLATILE = {"seconds", "model", "output"}  # wall time and the temporary paths


def _models() -> list[Path]:
    found = sorted((ROOT / "tests" / "models").rglob("*.onnx")) + sorted((ROOT / "sample_models").glob("*.onnx"))
    return [p for p in found if p.stat().st_size > 0]


def _scrub(value):
    if isinstance(value, dict):
        return {k: _scrub(v) for k, v in value.items() if k not in _VOLATILE}
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    return value


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def digests(configs: list[str], only: str | None = None) -> dict:
    from click.testing import CliRunner

    from onnxfuse.cli import main

    runner = CliRunner()
    result: dict = {}
    for model in _models():
        rel = model.relative_to(ROOT).as_posix()
        if only and only not in rel:
            continue
        for config in configs:
            with tempfile.TemporaryDirectory() as tmp:
                out, report = Path(tmp, "out.onnx"), Path(tmp, "report.json")
                args = ["optimize", str(model), "-o", str(out), "--json", str(report), *CONFIGS[config]]
                run = runner.invoke(main, args, catch_exceptions=True)
                entry = {"exit": run.exit_code}
                files = sorted(p for p in Path(tmp).iterdir() if p.name != "report.json")
                entry["files"] = {p.name: _sha(p) for p in files}
                if report.exists():
                    scrubbed = json.dumps(_scrub(json.loads(report.read_text())), sort_keys=True)
                    scrubbed = scrubbed.replace(str(ROOT), "<checkout>")  # load warnings name the model's path
                    entry["report"] = hashlib.sha256(scrubbed.encode()).hexdigest()
                result[f"{rel} [{config}]"] = entry
                print(f"{rel} [{config}]: exit {run.exit_code}", file=sys.stderr, flush=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--out", help="write the digests to this JSON file")
    what.add_argument("--check", help="compare against digests written earlier; exit 1 on any difference")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of {', '.join(CONFIGS)}")
    parser.add_argument("--only", help="only models whose path contains this text")
    args = parser.parse_args()
    configs = [c for c in args.configs.split(",") if c]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        parser.error(f"unknown configuration(s): {', '.join(unknown)}")
    now = digests(configs, args.only)
    if args.out:
        Path(args.out).write_text(json.dumps(now, indent=1, sort_keys=True) + "\n")
        print(f"{len(now)} digests written to {args.out}")
        return 0
    before = json.loads(Path(args.check).read_text())
    differ = [k for k in sorted(now) if k in before and before[k] != now[k]]
    missing = [k for k in sorted(before) if k not in now and (not args.only or args.only in k)
               and k.rsplit(" [", 1)[1].rstrip("]") in configs]
    for k in differ:
        print(f"DIFFERS {k}: {before[k]} -> {now[k]}")
    for k in missing:
        print(f"MISSING {k}")
    print(f"{len(now)} compared: {len(differ)} differ, {len(missing)} missing")
    return 1 if differ or missing else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
