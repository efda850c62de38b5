"""Fuzz the model loading and validation path: bytes → model file → ``model_io.load_model`` (parse, opset and
external-data checks, ``onnx.checker``) → ``fuse_model`` → ``model_save.save_model`` (full check, atomic write).

The contract under test: whatever the bytes, the path either succeeds or raises ``BadInputError`` (one line,
exit 2). Any other exception, a crash or a hang is a finding. The input layout and the property are in
``fuzz_property.py`` (shared with the regression tests in ``tests/test_bad_inputs.py``).

    python fuzz/fuzz_load.py fuzz/corpus -max_total_time=600 -timeout=30 -rss_limit_mb=3000

``FUZZ_KEEP_GOING=DIR``: record each distinct finding (exception type + the frame that raised it) as
``DIR/finding-<hash>`` with its traceback in ``DIR/findings.log`` and keep fuzzing, instead of stopping
at the first one (libFuzzer's default). See ``fuzz/README.md``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import traceback

import atheris

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

# An editable install imports onnxfuse through a redirecting finder whose loader atheris cannot
# instrument; import the checkout's sources through the ordinary path finder instead.
sys.meta_path[:] = [f for f in sys.meta_path if "ScikitBuild" not in type(f).__name__]
sys.path[:0] = [REPO, HERE]
with atheris.instrument_imports(include=["onnxfuse"]):
    from fuzz_property import check_one

_WORK = tempfile.mkdtemp(prefix="onnxfuse-fuzz-")
_KEEP_GOING = os.environ.get("FUZZ_KEEP_GOING")
_seen: set[str] = set()


def _signature(exc: BaseException) -> str:
    """Exception type and the innermost frame inside onnxfuse (else the innermost frame)."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if f"{os.sep}onnxfuse{os.sep}" in f.filename] or frames
    f = ours[-1]
    return f"{type(exc).__name__} at {os.path.relpath(f.filename, REPO)}:{f.lineno}"


def test_one_input(data: bytes) -> None:
    shutil.rmtree(_WORK, ignore_errors=True)
    os.makedirs(os.path.join(_WORK, "out"))
    try:
        check_one(data, _WORK)
    except Exception as e:
        if not _KEEP_GOING:
            raise
        sig = _signature(e)
        if sig in _seen:
            return
        _seen.add(sig)
        os.makedirs(_KEEP_GOING, exist_ok=True)
        name = "finding-" + hashlib.sha1(sig.encode()).hexdigest()[:12]
        with open(os.path.join(_KEEP_GOING, name), "wb") as f:
            f.write(data)
        with open(os.path.join(_KEEP_GOING, "findings.log"), "a") as log:
            log.write(f"== {name}: {sig}\n{''.join(traceback.format_exception(e))}\n")
        print(f"\nFINDING {name}: {sig}", file=sys.stderr, flush=True)


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    try:
        atheris.Fuzz()
    finally:
        shutil.rmtree(_WORK, ignore_errors=True)


if __name__ == "__main__":
    main()
