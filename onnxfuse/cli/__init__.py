"""Command line: parse, call, render. No logic lives here.

Each command calls one function of the library, which returns a report object (or raises an
``OnnxfuseError``); the command prints it (rich for people, ``--json`` for machines) and exits with the
code the report or the error carries (see ``onnxfuse.errors``). One module per command; ``options`` holds
what several parse alike, ``render`` what several print. This module is the group: ``main`` (the console
script ``onnxfuse``) and the one-line error handling every command gets.

Starting the command line imports click and these modules only: what a command needs (ONNX, numpy, rich, ONNX
Runtime) is imported in its body, so ``--help`` and ``--version`` answer at once, and a Ctrl-C while a command
starts is the one line every interruption gets (``tests/test_cli_startup.py`` holds both).
"""

from __future__ import annotations

import os
import sys

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a process Ctrl-C ended


def _interrupted() -> None:
    sys.stderr.write("onnxfuse: interrupted\n")
    sys.exit(EXIT_INTERRUPTED)


try:  # a Ctrl-C during these imports is no traceback either
    import click

    from ..errors import EXIT_INTERNAL, OnnxfuseError
    from ..version import __version__
    from . import bench, compare, doctor, inspect, optimize, options, tune
except KeyboardInterrupt:
    _interrupted()


def _usage_error(e: click.UsageError) -> None:
    """A usage error (an unknown option, a missing argument, a value click's own types refuse) as every other
    bad input: one line on stderr, exit 2; click's usage block would be four lines and a blank."""
    where = f" See '{e.ctx.command_path} --help'." if e.ctx is not None else ""
    click.echo(f"onnxfuse: error: {e.format_message()}{where}", err=True)
    sys.exit(e.exit_code)


class _Group(click.Group):
    """Turns every failure into one line on stderr and a distinct exit code, never a traceback
    (set ONNXFUSE_DEBUG=1 to see one)."""

    def make_context(self, info_name, args, parent=None, **extra):
        # the group's own options (`onnxfuse --bogus`); a command's are parsed in invoke
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.exceptions.NoArgsIsHelpError:
            raise  # bare `onnxfuse`: the help, as click shows it
        except click.UsageError as e:
            _usage_error(e)
        except KeyboardInterrupt:  # click's own answer would be "Aborted!" and exit 1
            _interrupted()

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except OnnxfuseError as e:
            click.echo(f"onnxfuse: error: {e}", err=True)
            sys.exit(e.exit_code)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as e:
            _usage_error(e)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException, SystemExit):
            raise
        except KeyboardInterrupt:
            _interrupted()
        except Exception as e:  # an internal error: still one line unless debugging
            if os.environ.get("ONNXFUSE_DEBUG"):
                raise
            click.echo(f"onnxfuse: internal error: {type(e).__name__}: {e}", err=True)
            sys.exit(EXIT_INTERNAL)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="onnxfuse")
@options.verbosity_options
def main() -> None:
    """Fuse Linear(+bias)+GELU blocks of ONNX models into one FusedLinearGelu node and run them
    with onnxfuse's CPU and CUDA kernels in ONNX Runtime.

    \b
    Exit codes: 0 ok · 1 internal error · 2 bad input or usage · 3 accuracy gate failed ·
    4 a fused node ran on another execution provider than requested (bench).
    """


for _command in (optimize.optimize_command, inspect.inspect_command, tune.tune_command, compare.compare_command,
                 bench.bench_command, doctor.doctor_command):
    main.add_command(_command)
