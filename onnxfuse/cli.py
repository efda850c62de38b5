"""Command line: parse, call, render. No logic lives here.

Each command calls one function of the library, which returns a report object (or raises an
``OnnxfuseError``); this module prints it (rich for people, ``--json`` for machines) and exits with the
code the report or the error carries (see ``onnxfuse.errors``).
"""

from __future__ import annotations

import os
import sys

import click

from . import __version__
from .errors import EXIT_INTERNAL, OnnxfuseError


class _Group(click.Group):
    """Turns every failure into one line on stderr and a distinct exit code, never a traceback
    (set ONNXFUSE_DEBUG=1 to see one)."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except OnnxfuseError as e:
            click.echo(f"onnxfuse: error: {e}", err=True)
            sys.exit(e.exit_code)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException, SystemExit):
            raise
        except KeyboardInterrupt:
            click.echo("onnxfuse: interrupted", err=True)
            sys.exit(130)
        except Exception as e:  # an internal error: still one line unless debugging
            if os.environ.get("ONNXFUSE_DEBUG"):
                raise
            click.echo(f"onnxfuse: internal error: {type(e).__name__}: {e}", err=True)
            sys.exit(EXIT_INTERNAL)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="onnxfuse")
def main() -> None:
    """Fuse Linear(+bias)+GELU blocks of ONNX models into one FusedLinearGelu node and run them
    with onnxfuse's CPU and CUDA kernels in ONNX Runtime.

    \b
    Exit codes: 0 ok · 1 internal error · 2 bad input or usage · 3 accuracy gate failed.
    """


# --- optimize / inspect (rewriter) -----------------------------------------------------------------

# --- compare (accuracy gate) -----------------------------------------------------------------------

# --- bench ------------------------------------------------------------------------------------------

# --- doctor -----------------------------------------------------------------------------------------


if __name__ == "__main__":
    main()
