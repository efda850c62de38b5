"""Every model of ONNX's backend test corpus (and, given a local copy, of ONNX Runtime's test models) through
`optimize`, in this process, held to the project's promises:

* a model ONNX Runtime loads is taken (``pipeline.optimize_file``, what the CLI's ``optimize`` calls, raises no
  ``BadInputError``), and no model makes the optimizer fail with an internal error;
* nothing fused: the output is the input byte for byte, or the input as loading normalises it (nodes sorted
  into topological order, the domains ORT imports by itself declared: ``model_io.LoadNotes``; external data
  references, which name the output's own data file, left out);
* fused: ONNX Runtime's CPU provider (graph optimizations off on both) computes what it computed for the
  input, within ``compare``'s tolerance for each output's type, on the model's own ``test_data_set_*``
  inputs, else on random ones (``onnxfuse.inputs``);
* idempotent: optimizing the output again writes the same bytes.

    python scripts/run_corpora.py                               # ONNX's corpus (what CI runs)
    python scripts/run_corpora.py --ort-testdata ~/onnxruntime/onnxruntime/test/testdata

The corpora:

  onnx-node  ONNX's node tests, generated here from the installed onnx's test cases
             (``onnx.backend.test.case.node``): the onnx wheel ships the generators and not the data, and
             its source distribution on PyPI ships neither, so nothing is downloaded
  onnx-data  the model tests the onnx wheel ships (``onnx/backend/test/data``: simple, pytorch-converted,
             pytorch-operator, light); ``real`` names models to download, and is left out
  ort-datasets  the sample models the onnxruntime wheel ships (``onnxruntime/datasets``)
  ort        with ``--ort-testdata DIR`` (repeatable): every ``*.onnx`` under DIR, with the
             ``test_data_set_*`` folders beside it as its inputs where there are some

It prints one line per broken promise and a tally, and exits 1 if any promise was broken (2 on bad usage). A
fused model ONNX Runtime cannot load cannot be held to the input's outputs: it is named (NOTE) and counted as
unchecked, not as a failure. The outputs are written with fsync (``optimize``'s atomic save): the work folder
defaults to a temporary one in memory (/dev/shm) where there is one.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout: the package beside this script
    sys.path.insert(0, str(ROOT))

from onnxfuse import model_io  # noqa: E402
from onnxfuse.domain import DOMAIN  # noqa: E402
from onnxfuse.error_statistics import compute_type, tolerance_for  # noqa: E402
from onnxfuse.errors import BadInputError  # noqa: E402
from onnxfuse.inputs import load_inputs, random_inputs  # noqa: E402
from onnxfuse.pipeline import optimize_file  # noqa: E402
from onnxfuse.runtime import load_probes  # noqa: E402

SHIPPED_KINDS = ("simple", "pytorch-converted", "pytorch-operator", "light")

Samples = Callable[[onnx.ModelProto], list[dict]]


@dataclass
class Item:
    """One model of a corpus: where it is, and where its own inputs come from (None: random ones)."""

    corpus: str
    name: str
    path: Path
    samples: Samples | None = None

    @property
    def label(self) -> str:
        return f"{self.corpus}/{self.name}"


@dataclass
class Outcome:
    item: Item
    loadable: bool = False  # ONNX Runtime's CPU provider creates a session on it
    taken: bool = False
    refused: str | None = None  # the BadInputError onnxfuse gave
    fused: int = 0  # blocks fused (or moved) by the rewrite
    unchanged: str | None = None  # nothing fused: "identical" or "normalized" (sorted, opsets declared)
    checked: bool = False  # fused, and run on ORT against the input
    within: bool = False  # ... every output within tolerance
    idempotent: bool = False
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def fail(self, why: str) -> None:
        self.failures.append(f"{self.item.label}: {why}")


# --- the corpora ---------------------------------------------------------------------------------------
def onnx_node_tests(work: Path) -> Iterator[Item]:
    """ONNX's node tests, generated from the installed onnx's case modules and written under ``work``."""
    import onnx.backend.test.case.node as node_cases

    with warnings.catch_warnings():  # the generators compute expected values with numpy: overflow warnings
        warnings.simplefilter("ignore")
        with np.errstate(all="ignore"):
            cases = node_cases.collect_testcases(None)
    for case in sorted(cases, key=lambda c: c.name):
        folder = work / "onnx-node" / case.name
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "model.onnx"
        path.write_bytes(case.model.SerializeToString())
        yield Item("onnx-node", case.name, path, _case_samples(case.data_sets))


def _case_samples(data_sets) -> Samples:
    def samples(model: onnx.ModelProto) -> list[dict]:
        names = [v.name for v in model.graph.input]
        return [{name: _feed_value(value) for name, value in zip(names, inputs)} for inputs, _ in data_sets]

    return samples


def _feed_value(value):
    """A test case's input as ORT takes it: arrays as they are, TensorProtos as arrays, sequences as lists."""
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, list):
        return [_feed_value(v) for v in value]
    return value if value is None or isinstance(value, (dict, np.ndarray)) else np.asarray(value)


def onnx_shipped_tests() -> Iterator[Item]:
    """The model tests the onnx wheel ships, each with its test_data_set_* inputs (light_*: random ones)."""
    data = Path(onnx.__file__).resolve().parent / "backend" / "test" / "data"
    for kind in SHIPPED_KINDS:
        folder = data / kind
        if not folder.is_dir():
            continue
        for path in sorted(folder.rglob("*.onnx")):
            yield Item("onnx-data", path.relative_to(data).as_posix(), path, _folder_samples(path.parent))


def ort_shipped_models() -> Iterator[Item]:
    """The sample models the onnxruntime wheel ships (random inputs)."""
    import onnxruntime

    folder = Path(onnxruntime.__file__).resolve().parent / "datasets"
    for path in sorted(folder.glob("*.onnx")):
        yield Item("ort-datasets", path.name, path, None)


def ort_test_models(root: Path) -> Iterator[Item]:
    for path in sorted(root.rglob("*.onnx")):
        if path.is_file():
            yield Item("ort", path.relative_to(root).as_posix(), path, _folder_samples(path.parent))


def _folder_samples(folder: Path) -> Samples | None:
    """The test_data_set_* folders beside a model, read by ``onnxfuse.inputs`` (None where there are none)."""
    if not any(p.is_dir() and p.name.startswith("test_data_set_") for p in folder.iterdir()):
        return None
    return lambda model: load_inputs(folder, model)


# --- running ---------------------------------------------------------------------------------------------
def _session(path: Path, *, fused: bool):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4
    if fused:
        from onnxfuse.runtime import register_library

        register_library(so)
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _uses_our_ops(path: Path) -> bool:
    try:
        model = onnx.load_model(str(path), load_external_data=False)
    except Exception:  # noqa: BLE001 - an unreadable file uses nothing
        return False
    return any(o.domain == DOMAIN for o in model.opset_import)


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def _written(path: Path) -> tuple[bytes, bytes]:
    """What one optimize run wrote: the model file's bytes and its data file's. With a data file, the model's
    references to it (its name is the output's) are left out of the comparison, its bytes are not."""
    data = path.with_name(path.name + ".data")
    if not data.exists():
        return path.read_bytes(), b""
    model = onnx.load_model(str(path), load_external_data=False)
    return _without_external_refs(model).SerializeToString(), data.read_bytes()


def _as_loaded(path: Path) -> bytes | None:
    """The input as ``load_model`` returns it (sorted, domains ORT assumes declared), serialized; external
    data references left out, since an output's point at a data file of its own."""
    try:
        model = model_io.load_model(path, **load_probes())
    except BadInputError:
        return None
    return _without_external_refs(model).SerializeToString()


def _without_external_refs(model: onnx.ModelProto) -> onnx.ModelProto:
    for t in model_io.external_tensors(model):
        del t.external_data[:]
    return model


def _samples(item: Item, model: onnx.ModelProto) -> tuple[list[dict], str]:
    if item.samples is not None:
        try:
            found = item.samples(model)
            if found:
                return found, "test_data_set"
        except (BadInputError, OSError, ValueError):
            pass  # inputs that do not fit its declared inputs: random ones below
    return [random_inputs(model, seed=0)], "random"


def _compare(outcome: Outcome, source: Path, optimized: Path) -> None:
    """Run both models on the same inputs and hold every output to compare's tolerance for its type."""
    try:
        original = _session(source, fused=_uses_our_ops(source))
    except Exception as e:  # noqa: BLE001 - ORT cannot run the input: nothing to hold the rewrite to
        outcome.notes.append(f"{outcome.item.label}: fused, not checked: ONNX Runtime cannot load the input "
                             f"({_one_line(e)})")
        return
    try:
        rewritten = _session(optimized, fused=True)
    except Exception as e:  # noqa: BLE001
        outcome.fail(f"ONNX Runtime cannot load the optimized model ({_one_line(e)})")
        return
    model = onnx.load_model(str(source), load_external_data=False)
    try:
        samples, origin = _samples(outcome.item, model)
    except Exception as e:  # noqa: BLE001 - inputs onnxfuse cannot make (sequences, maps)
        outcome.fail(f"fused, but no inputs to check it on ({_one_line(e)})")
        return
    names = [o.name for o in original.get_outputs()]
    if names != [o.name for o in rewritten.get_outputs()]:
        outcome.fail(f"the outputs changed: {names} -> {[o.name for o in rewritten.get_outputs()]}")
        return
    outcome.checked = True
    for k, sample in enumerate(samples):
        try:
            want = original.run(None, sample)
        except Exception as e:  # noqa: BLE001
            outcome.checked = False
            outcome.fail(f"fused, but ONNX Runtime cannot run the input on its {origin} inputs ({_one_line(e)})")
            return
        try:
            got = rewritten.run(None, sample)
        except Exception as e:  # noqa: BLE001
            outcome.fail(f"the optimized model fails on {origin} sample {k} ({_one_line(e)})")
            return
        for name, a, b in zip(names, want, got):
            why = _differs(model, name, np.asarray(a), np.asarray(b))
            if why:
                outcome.fail(f"output '{name}' on {origin} sample {k}: {why}")
                return
    outcome.within = True


def _differs(model: onnx.ModelProto, name: str, want: np.ndarray, got: np.ndarray) -> str | None:
    if want.shape != got.shape or want.dtype != got.dtype:
        return f"{got.dtype}{list(got.shape)} where the input gives {want.dtype}{list(want.shape)}"
    if want.dtype.kind not in "fc" and str(want.dtype) != "bfloat16":
        return None if np.array_equal(want, got) else "differs (exact type)"
    tol = tolerance_for(compute_type(model, name), "cpu")
    a, b = want.astype(np.float64), got.astype(np.float64)
    if np.allclose(b, a, rtol=tol.rtol, atol=tol.atol, equal_nan=True):
        return None
    err = np.nanmax(np.abs(a - b)) if a.size else 0.0
    return f"max abs error {err:.3g} beyond rtol {tol.rtol:g} / atol {tol.atol:g}"


def check(item: Item, out_dir: Path) -> Outcome:
    """Hold one model to every promise; its optimized files go to ``out_dir``."""
    outcome = Outcome(item)
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        _session(item.path, fused=_uses_our_ops(item.path))
        outcome.loadable = True
    except Exception:  # noqa: BLE001 - every way ORT refuses a model is an answer
        pass
    once, twice = out_dir / "once.onnx", out_dir / "twice.onnx"
    try:
        report = optimize_file(item.path, once)
    except BadInputError as e:
        outcome.refused = str(e)
        if outcome.loadable:
            outcome.fail(f"ONNX Runtime loads it, onnxfuse refused it: {_one_line(e)}")
        return outcome
    except Exception as e:  # noqa: BLE001 - an internal error is a broken promise whatever the input
        outcome.fail(f"internal error: {_one_line(e)}")
        return outcome
    outcome.taken = True
    outcome.fused = len(report.fused)
    if not report.fused:
        written = once.read_bytes()
        if written == item.path.read_bytes():
            outcome.unchanged = "identical"
        elif _without_external_refs(onnx.load_model_from_string(written)).SerializeToString() == _as_loaded(
                item.path):
            outcome.unchanged = "normalized"
        else:
            outcome.fail("nothing fused, yet the output is neither the input nor the input as loaded")
    else:
        _compare(outcome, item.path, once)
    try:
        optimize_file(once, twice)
    except Exception as e:  # noqa: BLE001
        outcome.fail(f"optimizing the output again fails: {_one_line(e)}")
        return outcome
    outcome.idempotent = _written(once) == _written(twice)
    if not outcome.idempotent:
        outcome.fail("not idempotent: optimizing the output again changes it")
    return outcome


# --- the tally -----------------------------------------------------------------------------------------
_COLUMNS = (  # (heading, Tally field)
    ("models", "models"), ("ORT loads", "loadable"), ("taken", "taken"), ("refused", "refused"),
    ("fused", "fused"), ("within tol.", "within"), ("unchecked", "unchecked"), ("byte-identical", "identical"),
    ("normalised", "normalized"), ("idempotent", "idempotent"), ("failures", "failed"))


@dataclass
class Tally:
    """Counts of models: ``refused`` as bad input; ``within`` tolerance of the fused ones run; ``unchecked``
    fused ones ORT cannot load; of those with nothing fused, ``identical`` byte for byte and ``normalized``
    (equal to the input as loaded: sorted, opsets declared)."""

    models: int = 0
    loadable: int = 0
    taken: int = 0
    refused: int = 0
    fused: int = 0
    within: int = 0
    unchecked: int = 0
    identical: int = 0
    normalized: int = 0
    idempotent: int = 0
    failed: int = 0

    def add(self, o: Outcome) -> None:
        self.models += 1
        self.loadable += o.loadable
        self.taken += o.taken
        self.refused += o.refused is not None
        self.fused += o.fused > 0
        self.within += o.within
        self.unchecked += bool(o.notes)
        self.identical += o.unchanged == "identical"
        self.normalized += o.unchanged == "normalized"
        self.idempotent += o.idempotent
        self.failed += bool(o.failures)

    def merge(self, other: Tally) -> None:
        for _, name in _COLUMNS:
            setattr(self, name, getattr(self, name) + getattr(other, name))


def table(tallies: dict[str, Tally]) -> str:
    rows = [("corpus", *(h for h, _ in _COLUMNS))]
    total = Tally()
    for corpus, tally in tallies.items():
        rows.append((corpus, *(str(getattr(tally, name)) for _, name in _COLUMNS)))
        total.merge(tally)
    rows.append(("all", *(str(getattr(total, name)) for _, name in _COLUMNS)))
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) if k == 0 else c.rjust(w) for k, (c, w) in enumerate(zip(r, widths)))
                     for r in rows)


def run(items: Iterator[Item], work: Path, *, verbose: bool = False, only: str | None = None,
        limit: int | None = None) -> dict[str, Tally]:
    """Check every item (``only``: whose label contains it; at most ``limit``), printing a FAIL line per broken
    promise and a NOTE line per fused model left unchecked as they come; the tally per corpus."""
    tallies: dict[str, Tally] = {}
    done = 0
    for item in items:
        if only and only not in item.label:
            continue
        if limit is not None and done >= limit:
            break
        done += 1
        out_dir = work / "out" / item.corpus / item.name.replace("/", "__")
        outcome = check(item, out_dir)
        shutil.rmtree(out_dir, ignore_errors=True)
        tallies.setdefault(item.corpus, Tally()).add(outcome)
        for line in outcome.failures:
            print(f"FAIL {line}", flush=True)
        for line in outcome.notes:
            print(f"NOTE {line}", flush=True)
        if verbose:
            state = ("fused" if outcome.fused else outcome.unchanged) if outcome.taken else "refused"
            print(f"ok   {item.label}: {state}{'' if outcome.loadable else ' (ORT cannot load it)'}", flush=True)
    return tallies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ort-testdata", action="append", default=[], type=Path, metavar="DIR",
                        help="a local copy of ONNX Runtime's test models (repeatable): every *.onnx under DIR")
    parser.add_argument("--no-onnx", action="store_true", help="leave ONNX's own corpus (and ORT's datasets) out")
    parser.add_argument("--work", type=Path, help="folder for the generated models and outputs (default: a "
                                                  "temporary one, removed at the end)")
    parser.add_argument("--only", help="only models whose corpus/name contains this text")
    parser.add_argument("--limit", type=int, help="at most this many models")
    parser.add_argument("-v", "--verbose", action="store_true", help="one line per model")
    args = parser.parse_args(argv)
    for root in args.ort_testdata:
        if not root.is_dir():
            parser.error(f"--ort-testdata {root}: not a folder")
    if args.no_onnx and not args.ort_testdata:
        parser.error("--no-onnx leaves no corpus: give --ort-testdata DIR")
    start = time.perf_counter()
    memory = Path("/dev/shm")
    work = args.work or Path(tempfile.mkdtemp(prefix="onnxfuse-corpora-", dir=memory if os.access(
        memory, os.W_OK) else None))
    work.mkdir(parents=True, exist_ok=True)

    def items() -> Iterator[Item]:
        if not args.no_onnx:
            yield from onnx_node_tests(work)
            yield from onnx_shipped_tests()
            yield from ort_shipped_models()
        for root in args.ort_testdata:
            yield from ort_test_models(root)

    try:
        tallies = run(items(), work, verbose=args.verbose, only=args.only, limit=args.limit)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(table(tallies))
    print(f"wall time {time.perf_counter() - start:.0f} s")
    models, failed = sum(t.models for t in tallies.values()), sum(t.failed for t in tallies.values())
    if failed:
        print(f"{failed} models broke a promise (FAIL lines above)")
    print(f"corpora: {models - failed} passed, {failed} failed")  # the closing line CI reads
    return 1 if failed or not tallies else 0


if __name__ == "__main__":
    sys.exit(main())
