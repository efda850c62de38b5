"""The report files a command writes (``--json``, ``--plot``), checked before it does any work.

A report is written last, after minutes of timing or a model already published. So its path is refused up
front when it could not be written (``model_save.check_output_path``), and when it names a file the command
reads or writes: an input model or that model's external data, the ``--inputs`` samples, the output model or
the data file written beside it, or the other report. Written over any of those, the report would destroy
what the command was given or had just made, and exit 0.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from .errors import BadInputError
from .model_io import external_data_files
from .model_save import check_output_path


def _same(a: str, b: str) -> bool:
    """Whether two paths name one file: the same entry once links are followed, or one existing file."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b)
    except OSError:
        return False


def check_report_paths(reports: Mapping[str, str | os.PathLike | None], *, models_read: Iterable = (),
                       files_read: Iterable = (), models_written: Iterable = ()) -> None:
    """Refuse, with one ``BadInputError`` line naming the option, a report path that cannot be written or
    that names another file of this command. ``reports`` maps an option to its path (None: not asked;
    ``-``: stdout); ``models_read`` are input models (their external data counts too), ``files_read`` other
    inputs, ``models_written`` output models (``<OUT>.data`` beside each counts too)."""
    given = {option: os.fspath(path) for option, path in reports.items() if path is not None}
    if any(path == "" for path in given.values()):
        raise BadInputError(f"{next(o for o, p in given.items() if p == '')}: an empty path; give the report's file "
                            "name ('-' prints a JSON report on stdout)")
    given = {option: path for option, path in given.items() if path != "-"}
    theirs: list[tuple[str, str]] = []  # (what it is, path)
    for model in models_read:
        if model is None:
            continue
        model = os.fspath(model)
        theirs.append((f"the input model {model}", model))
        # the data files exist, so only a report path that exists can be one of them
        if any(os.path.exists(path) for path in given.values()):
            theirs += [(f"external data of the input model {model}", data) for data in external_data_files(model)]
    theirs += [(f"the input {os.fspath(f)}", os.fspath(f)) for f in files_read if f is not None]
    for model in models_written:
        if model is None:
            continue
        model = os.fspath(model)
        data = os.path.join(os.path.dirname(os.path.abspath(model)), os.path.basename(model) + ".data")
        theirs += [(f"the output model {model}", model), (f"the output model's data file {data}", data)]
    seen: dict[str, str] = {}
    for option, path in given.items():
        try:
            check_output_path(None, path, what="report")
        except BadInputError as e:
            raise BadInputError(f"{option} {e}") from None
        for what, other in theirs:
            if _same(path, other):
                raise BadInputError(f"{option} {path}: is {what}; the report would overwrite it, choose another "
                                    "name")
        for other_option, other in seen.items():
            if _same(path, other):
                raise BadInputError(f"{option} {path}: is also the {other_option} file; give each its own name")
        seen[option] = path
