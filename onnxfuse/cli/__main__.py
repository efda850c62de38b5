"""``python -m onnxfuse.cli``: the console script ``onnxfuse``."""

from . import main

main(prog_name="onnxfuse")  # the name its messages give, as the installed command's
