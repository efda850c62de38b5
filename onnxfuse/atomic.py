"""Every file onnxfuse writes appears whole or not at all.

A reader of the target — a CI step waiting for a report, a viewer reloading a chart, a runtime opening a
model — sees the old file or the complete new one, never a part, whatever happens while writing (an
exception, a full disk, SIGKILL, power loss). The protocol, shared by every writer:

1. the bytes go to a temporary entry beside the target (same folder, so the rename cannot cross file
   systems), named ``.<target>.<pid>.<random>.tmp``;
2. it is flushed and fsynced, then renamed over the target (``os.replace``, atomic on POSIX), and the folder
   is fsynced so the rename itself survives a crash;
3. on any failure the temporary entry is removed; a process killed before it could do so leaves one
   behind, and the next write to the same target removes it (its pid no longer runs).

``write_atomic`` is that protocol for one file (JSON reports, PNG charts); ``write_json`` renders a report
the one way every command does. ``model_save.save_model`` writes a model and its external-data file as a
pair, checked before either is published, in a temporary *folder* named by the same rule: it uses
``temp_prefix``, ``remove_stale_temps`` and ``fsync_dir`` from here.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, Union

import numpy as np

from .errors import BadInputError

TEMP_SUFFIX = ".tmp"
Content = Union[bytes, Callable[[BinaryIO], None]]


def temp_prefix(target_name: str) -> str:
    """``.<target>.<pid>.``: hidden, tied to its target, and with the pid that lets a later write tell a
    leftover of a dead process from the work of a live one."""
    return f".{target_name}.{os.getpid()}."


def _leftover_pid(entry: str, target_name: str) -> int | None:
    """The pid in ``.<target>.<pid>.<random>.tmp``, or None when ``entry`` is not named so. Exactly two
    dot-free parts between prefix and suffix: the temporaries of a target ``<target>.<digits>`` are not
    mistaken for this target's."""
    prefix = f".{target_name}."
    if not (entry.startswith(prefix) and entry.endswith(TEMP_SUFFIX)):
        return None
    parts = entry[len(prefix):-len(TEMP_SUFFIX)].split(".")
    if len(parts) != 2 or not parts[0].isdigit() or not parts[1]:
        return None
    return int(parts[0])


def remove_stale_temps(folder: str | os.PathLike, target_name: str) -> None:
    """Remove the temporary files and folders that writes of ``target_name`` left in ``folder`` when their
    process died (SIGKILL, the OOM killer, power loss). Those of running processes are left alone."""
    try:
        entries = os.listdir(folder)
    except OSError:
        return
    for entry in entries:
        pid = _leftover_pid(entry, target_name)
        if pid is None:
            continue
        try:
            os.kill(pid, 0)
            continue  # still running (or not ours to judge)
        except ProcessLookupError:
            pass
        except OSError:
            continue
        path = os.path.join(folder, entry)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.unlink(path)
            except OSError:
                pass


def fsync_dir(folder: str | os.PathLike) -> None:
    """Make the renames into ``folder`` durable. Best effort: some file systems cannot fsync a folder."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def create_temp_file(folder: str, target_name: str) -> tuple[int, str]:
    """A new temporary file beside the target, opened for writing. Created with mode 0666 less the umask,
    as ``open(path, "w")`` would create the target (``tempfile.mkstemp`` makes 0600 files, and the rename
    would publish a report that only its writer can read)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        path = os.path.join(folder, f"{temp_prefix(target_name)}{secrets.token_hex(4)}{TEMP_SUFFIX}")
        try:
            return os.open(path, flags, 0o666), path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name for {target_name} in {folder}")


def write_atomic(path: str | os.PathLike, content: Content) -> Path:
    """Write ``content`` to ``path`` by the protocol above and return ``path``.

    ``content`` is the bytes, or a callable that writes them to the binary file it is given (a chart
    renders straight into the temporary file). ``BadInputError`` when the folder does not exist or the
    file cannot be written (its one line names ``path``); any other exception the callable raises goes
    through unchanged. Either way the target is as it was and no temporary file is left."""
    path = Path(path)
    folder = str(path.parent)
    if not path.parent.is_dir():
        raise BadInputError(f"cannot write '{path}': folder '{path.parent}' does not exist")
    remove_stale_temps(folder, path.name)
    try:
        fd, tmp = create_temp_file(folder, path.name)
    except OSError as e:
        raise BadInputError(f"{path}: cannot write: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(content):
                content(f)
            else:
                f.write(content)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise BadInputError(f"{path}: cannot write: {e.strerror or e}") from None
        raise
    fsync_dir(folder)
    return path


def json_text(data: Any) -> str:
    """A report as every command prints and writes it: indented, UTF-8 characters as they are, numpy
    scalars as plain numbers, and strict JSON: a non-finite number (an error ratio against a zero tolerance,
    the statistics of an output that is NaN) is null, as JavaScript writes it, since ``Infinity`` and ``NaN``
    are not JSON and a CI step's parser (jq, JSON.parse) rejects the whole report for them."""
    return json.dumps(_finite(data), indent=2, ensure_ascii=False, default=_jsonable, allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, (float, np.floating)):
        return float(value) if np.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def write_json(path: str | os.PathLike, data: Any) -> Path:
    """``json_text(data)`` and a newline, written atomically to ``path``."""
    return write_atomic(path, (json_text(data) + "\n").encode("utf-8"))


def _jsonable(value):
    if isinstance(value, (np.floating, np.integer, np.bool_)):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
