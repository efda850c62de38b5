"""The exit-code contract, owned by exception types.

Every command maps its failure to one of these; the CLI turns it into a single line on stderr and the
exit code below. Nothing else in the package calls ``sys.exit``. ``one_line`` is how the message of a
foreign exception (ONNX Runtime's, the OS's) becomes part of such a line.

    0 ok · 1 internal error · 2 bad input or usage · 3 accuracy gate failed ·
    4 a FusedLinearGelu node ran on another execution provider than asked for (bench)
"""

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_BAD_INPUT = 2
EXIT_ACCURACY = 3
EXIT_PROVIDER_PLACEMENT = 4


class OnnxfuseError(Exception):
    """Base class: an expected failure with a one-line message meant for the user."""

    exit_code = EXIT_INTERNAL

    def __str__(self) -> str:
        # Messages quote names taken from models, which may hold newlines or control characters: escape
        # them, so the message stays one line whatever the model says.
        text = super().__str__()
        if text.isprintable():
            return text
        return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class BadInputError(OnnxfuseError):
    """The user gave us something we cannot use (file, model, option, library). Nothing was written."""

    exit_code = EXIT_BAD_INPUT


class AccuracyGateError(OnnxfuseError):
    """The optimized model's outputs drifted outside tolerance."""

    exit_code = EXIT_ACCURACY


class ProviderPlacementError(OnnxfuseError):
    """A FusedLinearGelu node ran on another execution provider than the one asked for (ORT placed it
    on the CPU because the library has no kernel for it on the requested device): timings taken that
    way would not measure what they claim."""

    exit_code = EXIT_PROVIDER_PLACEMENT


_MAX_LINE = 500


def one_line(e: BaseException) -> str:
    """The message of ``e`` (often ONNX Runtime's, spread over several lines) fit for a one-line error:
    whitespace runs, newlines included, collapsed to one space, at most ``_MAX_LINE`` characters; the
    exception's type name when it has no message."""
    text = " ".join(str(e).split())
    if not text:
        return type(e).__name__
    return text[:_MAX_LINE] + ("…" if len(text) > _MAX_LINE else "")
