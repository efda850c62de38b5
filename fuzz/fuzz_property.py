"""The property the fuzzer checks, without atheris (the regression tests in ``tests/test_bad_inputs.py``
replay crashing inputs through it).

Input layout: the first byte picks an external-data layout, so mutations also reach the external-data
checks: bit 0 set → a ``weights.bin`` of (byte 1 × 64) bytes is written beside the model, and the model is
the rest of the input; otherwise the model is everything after the first byte.
"""

from __future__ import annotations

import os

from onnxfuse.errors import BadInputError
from onnxfuse.pipeline import optimize_file


def check_one(data: bytes, work: str) -> None:
    """bytes → ``work``/model.onnx → ``optimize_file``: load (parse, opsets, external data, checker) →
    fuse → save (checked, atomic) into ``work``/out/. Passes when that succeeds or raises ``BadInputError`` with a one-line
    message; anything else propagates (a finding)."""
    if not data:
        data = b"\0"
    flags, rest = data[0], data[1:]
    if flags & 1 and rest:
        size, rest = rest[0] * 64, rest[1:]
        with open(os.path.join(work, "weights.bin"), "wb") as f:
            f.write(bytes(range(256)) * (size // 256) + bytes(size % 256))
    path = os.path.join(work, "model.onnx")
    with open(path, "wb") as f:
        f.write(rest)
    try:  # what `onnxfuse optimize` runs
        optimize_file(path, os.path.join(work, "out", "fused.onnx"))
    except BadInputError as e:
        message = str(e)
        assert message and "\n" not in message, f"BadInputError message is not one line: {message!r}"
