"""Starting the command line: ``--help`` and ``--version`` import click and the CLI's own modules only (ONNX,
numpy, rich and ONNX Runtime wait for a command that needs them), and a Ctrl-C while the command line or a
command starts is one line and exit 130, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(ROOT, "sample_models", "tiny_bert.onnx")
HEAVY = ("numpy", "onnx", "onnxruntime", "rich", "ml_dtypes")
COMMANDS = ("optimize", "inspect", "tune", "compare", "bench", "doctor")


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("ONNXFUSE_DEBUG", None)
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=120)


# Runs the command line on argv[1:] as the console script does, then says which heavy modules were imported.
_IMPORTED = f"""
import runpy, sys
sys.argv = ["onnxfuse", *sys.argv[1:]]
try:
    runpy.run_module("onnxfuse.cli", run_name="__main__")
except SystemExit as e:
    code = e.code
print("IMPORTED", sorted(m for m in {HEAVY!r} if m in sys.modules), code, file=sys.stderr)
"""


@pytest.mark.parametrize("args", [["--help"], ["--version"], *([c, "--help"] for c in COMMANDS)],
                         ids=lambda a: " ".join(a))
def test_help_and_version_import_nothing_heavy(args):
    r = _python(_IMPORTED, *args)
    assert r.stderr.strip().splitlines()[-1] == "IMPORTED [] 0", r.stderr
    assert ("Usage: onnxfuse" in r.stdout) if "--help" in args else r.stdout.startswith("onnxfuse, version ")


def test_target_help_still_lists_every_target():
    """--target's values and help come from the cost model, read when the help is shown."""
    r = _python(_IMPORTED, "optimize", "--help")
    text = " ".join(r.stdout.split())
    assert "--target cuda|cpu|tensorrt" in text and "[default: cuda]" in text
    assert "tensorrt: ONNX Runtime's TensorRT provider: fuse nothing" in text


# Sends this process a real SIGINT (as Ctrl-C does) the moment module argv[1] is first imported, then runs the
# command line on argv[2:].
_INTERRUPT_AT = """
import os, runpy, signal, sys

module, sys.argv = sys.argv[1], ["onnxfuse", *sys.argv[2:]]

class InterruptAt:
    def find_spec(self, name, path=None, target=None):
        if name == module:
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, InterruptAt())
runpy.run_module("onnxfuse.cli", run_name="__main__")
"""


@pytest.mark.parametrize("module, args", [
    ("click", ["--help"]),                        # the command line's own start-up imports
    ("onnxfuse.cli.optimize", ["--version"]),     # the commands' modules, imported by the group
    ("onnx", ["inspect", SAMPLE]),                # a command's body importing what it needs
])
def test_ctrl_c_during_start_up_is_one_line_and_exit_130(module, args):
    r = _python(_INTERRUPT_AT, module, *args)
    assert r.returncode == 130, (r.stdout, r.stderr)
    assert r.stderr == "onnxfuse: interrupted\n" and "Traceback" not in r.stderr
