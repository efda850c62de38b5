"""Writing models: every output is written atomically, and checked before it takes its place.

Weights are never all in memory. ``save_model`` streams each external tensor into a fresh data file next to
the output — copied by the kernel (``copy_file_range``) when unchanged, computed one tensor at a time when
the rewrite derived it from others (``deferred``: a weight stored ``[N, K]``, Q, K and V packed).
``onnx.save`` cannot do this: it needs every tensor loaded to write external data. Outputs that cannot or
must not be written are refused before any work (:func:`check_output_path`); a written model is held to the
output guarantee (:func:`check_output`) before it is published.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import onnx

from . import domain
from .atomic import create_temp_file, fsync_dir, remove_stale_temps, temp_prefix
from .deferred import Deferred, is_pending
from .errors import BadInputError
from .model_io import (check_file, checker_error, external_span, external_tensors, sorted_checker_error,
                       spells_default_domain_ai_onnx, tensor_nbytes)

# Offsets of tensors in the data file are page-aligned, so runtimes can memory-map them.
ALIGNMENT = 4096
_COPY_CHUNK = 64 << 20


# --- before the work ---------------------------------------------------------------------------------
def check_output_path(input_path, output_path, *, what: str = "output model") -> None:
    """Refuse outputs we cannot or must not write, before any work is done. ``what`` the file is, for the
    message ("output model", "report")."""
    out = os.fspath(output_path)
    if not out:
        raise BadInputError(f"an empty path; give the {what}'s file name")
    if out == "-" and what == "output model":  # '-' is stdout for a report, and a model is no stream
        raise BadInputError("-: a model is written to a file (with its external data beside it), not to stdout; "
                            "give the output model's file name")
    if os.path.isdir(out):
        raise BadInputError(f"{out}: is a directory; give the {what}'s file name")
    if os.path.exists(out) and not os.path.isfile(out):
        # a device, a pipe, a socket: the atomic write renames a new file over the entry, which would
        # replace /dev/null itself for a process allowed to
        raise BadInputError(f"{out}: not a regular file (a device, pipe or socket); give the {what}'s file name"
                            + (" ('-' prints a JSON report on stdout)" if what == "report" else ""))
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise BadInputError(f"{out}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise BadInputError(f"{out}: folder {parent} is not writable")
    if os.path.exists(out) and not os.access(out, os.W_OK):
        raise BadInputError(f"{out}: exists and is not writable")
    if input_path is not None and os.path.exists(out) and os.path.samefile(os.fspath(input_path), out):
        raise BadInputError(f"{out}: is the input model; the input is never overwritten, choose another output")
    # The permission bits do not tell what root may write (a read-only mount, /sys): create the temporary
    # entry the write will create, now, rather than fail once the work is done.
    try:
        fd, probe = create_temp_file(parent, os.path.basename(out))
    except OSError as e:
        raise BadInputError(f"{out}: cannot write in folder {parent}: {e.strerror or e}") from None
    os.close(fd)
    os.unlink(probe)


# --- after the work: the output guarantee --------------------------------------------------------
def check_output(model_path: str, path: str, input_checker_error: str | None = None,
                 model: onnx.ModelProto | None = None) -> None:
    """The output guarantee: it passes ``onnx.checker`` wherever the input does, and adds no checker
    error the input did not have (an input the checker rejects, which ONNX Runtime runs, may keep its
    own error, e.g. graph outputs without a shape). ``model``: the proto written at ``model_path``; one that
    spells the default domain "ai.onnx" is judged in memory as ONNX reads it, as its input was
    (``model_io.sorted_checker_error``)."""
    if model is not None and spells_default_domain_ai_onnx(model):
        error = sorted_checker_error(model)
        if error is None or error == input_checker_error:
            return
        if input_checker_error is None:
            raise onnx.checker.ValidationError(error)  # as check_file raises it: an output the rewrite broke
        raise BadInputError(f"{path}: not written: the output fails onnx.checker with an error the input "
                            f"did not have ({error}; the input's: {input_checker_error})")
    if input_checker_error is not None:
        error = checker_error(model_path)
        if error is not None and error != input_checker_error:
            raise BadInputError(f"{path}: not written: the output fails onnx.checker with an error the input "
                                f"did not have ({error}; the input's: {input_checker_error})")
        return
    try:
        check_file(model_path)
    except onnx.shape_inference.InferenceError as e:
        # The input declared a shape its block does not compute (hidden from onnx by an op it has no
        # schema for, such as com.microsoft.QuickGelu); the fused node's shape inference shows it.
        first = str(e).strip().splitlines()[0]
        if domain.OP_TYPE not in first or "existing" not in first:
            raise
        raise BadInputError(f"{path}: not written: the input declares a type or shape that its "
                            f"computation does not produce ({first})") from None



# --- streaming the model and its external data ----------------------------------------------------
def _copy_range(src: str, offset: int, length: int, dst) -> None:
    """Copy ``length`` bytes of ``src`` from ``offset`` to the end of ``dst``, without holding them in memory
    (the kernel copies, or moves 64 MiB chunks)."""
    dst.flush()  # the kernel writes at the descriptor's position: buffered bytes must be there first
    with open(src, "rb") as s:
        done = 0
        try:
            while done < length:
                n = os.copy_file_range(s.fileno(), dst.fileno(), length - done, offset + done)
                if n == 0:
                    raise OSError(f"unexpected end of {src}")
                done += n
            dst.seek(0, os.SEEK_END)
            return
        except (AttributeError, OSError) as e:
            if done or (isinstance(e, OSError) and "unexpected end" in str(e)):
                raise
        s.seek(offset)
        while done < length:
            chunk = s.read(min(_COPY_CHUNK, length - done))
            if not chunk:
                raise OSError(f"unexpected end of {src}")
            dst.write(chunk)
            done += len(chunk)


def _derive(spans: list[tuple[str, int, int]], t: onnx.TensorProto, how: Deferred) -> np.ndarray:
    """Read the source tensors (one per span, in ``how.sources``' order) and compute the derived tensor's
    bytes (transpose, scale, convert; or the sources side by side)."""
    flats = [np.fromfile(src, dtype=np.uint8, count=length, offset=offset).view(
                 onnx.helper.tensor_dtype_to_np_dtype(source.data_type))
             for (src, offset, length), source in zip(spans, how.sources)]
    data = np.ascontiguousarray(how(*flats)).view(np.uint8)
    if data.nbytes != tensor_nbytes(t):
        raise ValueError(f"derived tensor '{t.name}' has {data.nbytes} bytes, its shape needs {tensor_nbytes(t)}")
    return data


def _write_data_file(out, ext, spans, derived, data_name: str, saved: list) -> None:
    """Append every external tensor to ``out`` (page-aligned) and point the tensor at its new place.

    ``spans[k]``: where tensor k's bytes are read, one span for a copied tensor, one per source for a derived
    one. Unchanged tensors are copied by the kernel; derived ones are computed by one worker thread, one
    tensor ahead of the writer, so transposing overlaps the disk writes while at most two derived tensors
    are in memory. ``saved`` receives the old references so the caller can restore the model."""
    jobs = iter([(k, t, reads) for k, (t, reads) in enumerate(zip(ext, spans)) if t.name in derived])
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="onnxfuse-derive") as pool:
        ahead: dict[int, Future] = {}

        def submit_next() -> None:
            job = next(jobs, None)
            if job is not None:
                k, t, reads = job
                ahead[k] = pool.submit(_derive, reads, t, derived[t.name])

        submit_next()
        for k, (t, reads) in enumerate(zip(ext, spans)):
            out.write(b"\0" * (-out.tell() % ALIGNMENT))
            start = out.tell()
            if k in ahead:
                data = ahead.pop(k).result()
                submit_next()
                out.write(data.data)
                length = data.nbytes
                del data
            else:
                (src, offset, length), = reads
                _copy_range(src, offset, length, out)
            saved.append((t, [(e.key, e.value) for e in t.external_data]))
            del t.external_data[:]
            for key, value in (("location", data_name), ("offset", str(start)), ("length", str(length))):
                t.external_data.add(key=key, value=value)
    out.flush()
    os.fsync(out.fileno())


def save_model(model: onnx.ModelProto, path, *, source_dir=None,
               derived: Mapping[str, Deferred] | None = None,
               check: bool = True, before_publish: Callable[[str], None] | None = None,
               input_checker_error: str | None = None) -> None:
    """Write ``model`` to ``path`` atomically; external tensors go to a fresh ``<name>.data`` beside it.

    ``source_dir`` is where the external data the model points at lives (the input model's folder).
    ``derived`` maps the name of a deferred tensor (a placeholder at ``deferred.PENDING``) to its recipe
    (``deferred.Deferred``: a callable on the flat arrays of its ``sources``, their external references).
    Files are written into a temporary folder beside ``path``, fsynced, checked with ``onnx.checker`` (full
    check), then renamed into place — data file first; on any failure nothing is left behind. ``model`` is
    left as it was. ``before_publish`` is called with the written and checked temporary model (its data file
    beside it) just before the rename: an exception it raises publishes nothing (``optimize --verify`` runs
    the accuracy gate there). ``input_checker_error``: the checker's error on the input
    (``model_io.LoadNotes``), which the output may repeat but not replace by another."""
    path = os.fspath(path)
    derived = dict(derived or {})
    out_dir = os.path.dirname(os.path.abspath(path))
    base = os.path.basename(path)
    ext = external_tensors(model)
    data_name = f"{base}.data"
    if ext:
        if source_dir is None:
            raise ValueError("save_model: the model has external data; pass source_dir")
        spans = []  # per tensor, where its bytes are read: [one span], or one per source of a derived tensor
        for t in ext:
            if t.name in derived:
                spans.append([external_span(source, os.fspath(source_dir)) for source in derived[t.name].sources])
            elif is_pending(t):
                raise ValueError(f"tensor '{t.name}' is computed while saving: pass the FuseResult's derived map")
            else:
                spans.append([external_span(t, os.fspath(source_dir))])
        read_files = {p for reads in spans for p, _, _ in reads}
        if os.path.exists(path) and any(os.path.samefile(path, p) for p in read_files):
            raise BadInputError(f"{path}: is the input's external data file; choose another output name")
        target = os.path.join(out_dir, data_name)
        if os.path.exists(target) and not os.path.isfile(target):
            raise BadInputError(f"{path}: its data file {data_name} would replace {target}, which is not a regular "
                                "file (a directory?); move it or choose another output name")
        if os.path.exists(target) and any(os.path.samefile(target, p) for p in read_files):
            raise BadInputError(f"{path}: its data file {data_name} is the input's external data; choose "
                                "another output name")
    remove_stale_temps(out_dir, base)
    try:  # named as onnxfuse.atomic names its temporaries: a later save removes it if this process is killed
        tmp = tempfile.mkdtemp(prefix=temp_prefix(base), suffix=".tmp", dir=out_dir)
    except OSError as e:
        raise BadInputError(f"{path}: cannot write: {e.strerror}") from None
    saved = []
    try:
        try:
            if ext:
                with open(os.path.join(tmp, data_name), "wb") as out:
                    _write_data_file(out, ext, spans, derived, data_name, saved)
            model_tmp = os.path.join(tmp, base)
            with open(model_tmp, "wb") as f:
                f.write(model.SerializeToString())
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise BadInputError(f"{path}: cannot write: {e.strerror or e}") from None
        if check:
            domain.register_schema()
            check_output(model_tmp, path, input_checker_error, model)
        if before_publish is not None:
            before_publish(model_tmp)
        if ext:
            # Never an old model beside a new data file (its offsets would point into the wrong bytes):
            # the old model goes first (the target is then absent), then the data file, then the model.
            if os.path.lexists(path):
                os.unlink(path)
            os.replace(os.path.join(tmp, data_name), os.path.join(out_dir, data_name))
        os.replace(model_tmp, path)
        fsync_dir(out_dir)
    finally:
        for t, entries in saved:
            del t.external_data[:]
            for key, value in entries:
                t.external_data.add(key=key, value=value)
        shutil.rmtree(tmp, ignore_errors=True)

